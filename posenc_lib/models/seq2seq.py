"""One encoder-decoder Transformer that takes any position scheme by name.

Architecture (batch first): token embedding x sqrt(d_model) (+ input-level
position code) -> dropout -> N encoder layers -> N decoder layers (causal
self-attention, cross-attention, feed-forward) -> linear output.  Layers are
**pre-norm** by default (``norm_first=True``: LayerNorm before each sub-layer,
a final LayerNorm after each stack), which trains stably at the small budgets
of this course; ``norm_first=False`` gives the original post-norm layout of
Vaswani et al. and of the seed report's ``nn.Transformer``.

Positions enter the encoder's and decoder's *self*-attention only: the
distance between a target and a source token has no meaning, so
cross-attention is position-free for every scheme (as in T5 and Shaw et al.).
Source and target embeddings and the output layer share one matrix by default
(``tie_embeddings=True``; a joint source/target vocabulary is assumed).

Used by every notebook from 05 on, by the extrapolation experiment and by
``python -m posenc_lib.experiments.wmt14``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.layer import MultiHeadAttention, PositionScheme, on_host
from ..schemes.registry import canonical_pe, make_scheme
from ..utils import renamed_keys_hook
from ..checks import (check_divides, check_float_range, check_int_range, check_padding_mask, check_positive_int,
                      check_token_tensor)


#: the most rows (sequences x new tokens) for which :meth:`Seq2SeqTransformer.logits` puts the vocabulary matrix
#: on the left of the product (CPU only)
FEW_ROWS = 64


def _check_bool(name: str, value) -> bool:
    """``value`` if it is ``True`` or ``False``; anything else (``"no"``, ``1``, ``None``) is a ``TypeError``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, dim_feedforward: int, dropout: float):
        super().__init__(
            nn.Linear(d_model, dim_feedforward), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim_feedforward, d_model)
        )

    def forward(self, x):
        if self.training and self[2].p > 0:
            return super().forward(x)
        return self[3](torch.relu(self[0](x)))  # no dropout to apply: two calls fewer (a decoding step makes many)


def _dropout(drop: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """``drop(x)``, without the call where it changes nothing (evaluation, or a rate of 0)."""
    return drop(x) if drop.training and drop.p > 0 else x


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, dim_feedforward, dropout, norm_first):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, dim_feedforward, dropout)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, pad_mask, scheme, prep, layer):
        def sa(h):
            return self.self_attn(h, key_padding_mask=pad_mask, scheme=scheme, prep=prep, layer=layer)

        if self.norm_first:
            x = x + self.drop(sa(self.norm1(x)))
            return x + self.drop(self.ff(self.norm2(x)))
        x = self.norm1(x + self.drop(sa(x)))
        return self.norm2(x + self.drop(self.ff(x)))


class DecoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, dim_feedforward, dropout, norm_first):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, dim_feedforward, dropout)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, memory, tgt_pad_mask, mem_pad_mask, scheme, prep, layer, cache=None):
        def sa(h):
            c = cache["self"] if cache is not None else None
            return self.self_attn(h, key_padding_mask=tgt_pad_mask, causal=True, scheme=scheme, prep=prep, layer=layer, cache=c)

        def ca(h):
            c = cache["cross"] if cache is not None else None
            return self.cross_attn(h, memory, key_padding_mask=mem_pad_mask, cache=c)

        drop = self.drop
        if self.norm_first:
            x = x + _dropout(drop, sa(self.norm1(x)))
            x = x + _dropout(drop, ca(self.norm2(x)))
            return x + _dropout(drop, self.ff(self.norm3(x)))
        x = self.norm1(x + _dropout(drop, sa(x)))
        x = self.norm2(x + _dropout(drop, ca(x)))
        return self.norm3(x + _dropout(drop, self.ff(x)))

    def step(self, x, memory, mem_pad_mask, scheme, prep, layer, cache):
        """:meth:`forward` of a cached decoding step of a pre-norm layer in evaluation (no dropout, no target
        padding): the same operations, with fewer Python calls between them (a step at batch 8 is made of many
        small operations); hooks on the layer itself are not called (its attention and linear modules run as usual)."""
        n1, n2, n3 = self.norm1, self.norm2, self.norm3
        h = F.layer_norm(x, n1.normalized_shape, n1.weight, n1.bias, n1.eps)
        x = x + self.self_attn(h, causal=True, scheme=scheme, prep=prep, layer=layer, cache=cache["self"])
        h = F.layer_norm(x, n2.normalized_shape, n2.weight, n2.bias, n2.eps)
        x = x + self.cross_attn(h, memory, key_padding_mask=mem_pad_mask, cache=cache["cross"])
        h = F.layer_norm(x, n3.normalized_shape, n3.weight, n3.bias, n3.eps)
        return x + self.ff(h)


class DecoderCache:
    """Keys/values of every decoder layer during incremental decoding, and the next position."""

    def __init__(self, num_layers: int, capacity: int | None = None):
        """``capacity``: the number of positions the cache will hold, if known (a decoding loop's length):
        key/value buffers and a scheme's distance tables are made that long at the first step, so that no
        later step grows them (a compiled step then needs no new graph for a grown buffer).  ``None``: they
        start small and double when full."""
        num_layers = check_positive_int("num_layers", num_layers)
        if capacity is not None:
            capacity = check_positive_int("capacity", capacity)
        self.layers = [{"self": {} if capacity is None else {"capacity": capacity}, "cross": {}} for _ in range(num_layers)]
        self.offset = 0
        #: what a position scheme may keep from one decoding step to the next (projected relative
        #: tables that depend only on its parameters and distances); the same for every batch row.
        #: ``"capacity"``: the cache's, when given
        self.scheme_state: dict = {} if capacity is None else {"capacity": capacity}

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search): a 1-D integer tensor of rows in ``[0, batch)``."""
        if not isinstance(index, torch.Tensor):
            raise TypeError(f"index must hold integer row ids (a 1-D torch.int64 tensor), got {type(index).__name__}")
        if index.dtype not in (torch.int64, torch.int32) or index.dim() != 1:
            raise TypeError(f"index must hold integer row ids (a 1-D torch.int64 tensor), got dtype {index.dtype}, "
                            f"shape {tuple(index.shape)}")  # fmt: skip
        batch = next((v.shape[0] for layer in self.layers for part in layer.values() for v in part.values()
                      if isinstance(v, torch.Tensor)), None)  # fmt: skip
        if batch is not None and index.numel() and on_host(index):  # reading the ids costs no sync on the CPU
            lo, hi = (int(v) for v in index.aminmax())
            if lo < 0 or hi >= batch:
                raise ValueError(f"index holds row {lo if lo < 0 else hi} outside the cache: valid rows 0..{batch - 1}")
        for layer in self.layers:
            for part in layer.values():
                for key, value in part.items():
                    if isinstance(value, torch.Tensor):  # buffers and cross-attention keys; not lengths
                        part[key] = value.index_select(0, index)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer; ``forward(src, tgt) -> logits (B, T, vocab)``."""

    def __init__(
        self,
        pe: str,
        vocab_size: int,
        *,
        d_model: int = 64,
        n_heads: int = 8,
        num_layers: int = 6,
        num_decoder_layers: int | None = None,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        norm_first: bool = True,
        tie_embeddings: bool = True,
        pad_id: int = 0,
        **pe_options,
    ):
        super().__init__()
        self.pe = canonical_pe(pe)
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.d_model = d_model
        check_divides(d_model, n_heads)
        num_layers = check_positive_int("num_layers", num_layers)
        num_decoder_layers = check_positive_int(
            "num_decoder_layers", num_layers if num_decoder_layers is None else num_decoder_layers
        )
        check_positive_int("dim_feedforward", dim_feedforward)
        check_float_range("dropout", dropout, 0.0, 1.0, high_open=True)
        self.pad_id = check_int_range("pad_id", pad_id, 0, self.vocab_size - 1)
        norm_first = _check_bool("norm_first", norm_first)
        tie_embeddings = _check_bool("tie_embeddings", tie_embeddings)
        self.pe_options = dict(pe_options)
        self.enc_scheme: PositionScheme = make_scheme(self.pe, d_model, n_heads, num_layers, causal=False, **pe_options)
        self.dec_scheme: PositionScheme = make_scheme(
            self.pe, d_model, n_heads, num_decoder_layers, causal=True, **pe_options
        )
        # checkpoints saved before the schemes were renamed (enc_pos, dec_pos) load as they are
        self.register_load_state_dict_pre_hook(renamed_keys_hook({"enc_pos": "enc_scheme", "dec_pos": "dec_scheme"}))
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        if tie_embeddings:
            self.tgt_embed, self.out_proj = self.embed, None
        else:
            self.tgt_embed = nn.Embedding(vocab_size, d_model)
            nn.init.normal_(self.tgt_embed.weight, std=d_model**-0.5)
            self.out_proj = nn.Linear(d_model, vocab_size, bias=False)
        self.encoder = nn.ModuleList(
            EncoderLayer(d_model, n_heads, dim_feedforward, dropout, norm_first) for _ in range(num_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(d_model, n_heads, dim_feedforward, dropout, norm_first) for _ in range(num_decoder_layers)
        )
        self.enc_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.drop = nn.Dropout(dropout)
        self.norm_first = norm_first
        self.config = dict(
            pe=self.pe, vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, num_layers=num_layers,
            num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward, dropout=dropout,
            norm_first=norm_first, tie_embeddings=tie_embeddings, pad_id=pad_id, **pe_options,
        )  # fmt: skip

    # -- pieces --------------------------------------------------------------------------------
    def _check_ids(self, name: str, ids: torch.Tensor, what: str = "token id", note: str = "") -> None:
        """``ValueError`` naming the first id outside ``[0, vocab_size)`` in ``ids`` (``note`` ends the message).

        Runs on CPU tensors only: on an accelerator, reading the ids back would stall the
        device at every step (a bad id there trips the embedding's device-side assert instead).
        """
        check_token_tensor(name, ids)
        if not on_host(ids) or ids.numel() == 0:
            return
        bad = (ids < 0) | (ids >= self.vocab_size)
        if bool(bad.any()):
            row, col = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name} holds {what} {int(ids[row, col])} (at row {row}, position {col}) outside the "
                f"vocabulary: vocab_size={self.vocab_size}, valid ids 0..{self.vocab_size - 1}{note}"
            )

    def check_length(self, scheme: PositionScheme, n_positions: int, what: str) -> None:
        """Reject a sequence longer than the scheme's table with plain ints (no device read)."""
        limit = scheme.max_positions
        if limit is not None and n_positions > limit:
            raise ValueError(
                f"position {n_positions - 1} is beyond the {scheme.name} table (max_len={limit}, valid "
                f"positions 0..{limit - 1}) in {what} of {n_positions} tokens; build the model with a larger "
                f"max_len or use a scheme defined at every position (sinusoidal, rope, t5, alibi, ...)"
            )

    def embed_tokens(self, table: nn.Embedding, tokens: torch.Tensor, scheme: PositionScheme, positions: torch.Tensor):
        """``tokens`` through ``table``, scaled by sqrt(d_model), plus ``scheme``'s code of ``positions`` if it adds one."""
        x = table(tokens) * math.sqrt(self.d_model)
        code = scheme.embed(positions)
        if code is not None:
            x = x + code.to(x.dtype)
        return _dropout(self.drop, x)

    def encode(self, src: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``src (B, S)`` int64 -> memory ``(B, S, d_model)``."""
        self._check_ids("src", src)
        self.check_length(self.enc_scheme, src.shape[1], "a source")
        check_padding_mask("src_key_padding_mask", src_key_padding_mask, *src.shape)
        positions = torch.arange(src.shape[1], device=src.device)
        x = self.embed_tokens(self.embed, src, self.enc_scheme, positions)
        prep = self.enc_scheme.prepare(positions, positions)
        for i, layer in enumerate(self.encoder):
            x = layer(x, src_key_padding_mask, self.enc_scheme, prep, i)
        return self.enc_norm(x)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        *,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """``tgt (B, T)`` -> logits ``(B, T, vocab)``.  With ``cache`` only the new tokens are passed."""
        self._check_ids("tgt", tgt)
        if cache is not None and not isinstance(cache, DecoderCache):
            raise TypeError(f"cache must be a DecoderCache (model.new_cache()) or None, got {type(cache).__name__}")
        offset = cache.offset if cache is not None else 0
        t = tgt.shape[1]
        self.check_length(self.dec_scheme, offset + t, "a target")
        check_padding_mask("tgt_key_padding_mask", tgt_key_padding_mask, tgt.shape[0], offset + t)
        self._check_memory(memory, tgt.shape[0])
        check_padding_mask("memory_key_padding_mask", memory_key_padding_mask, *memory.shape[:2])
        return self.decode_unchecked(tgt, memory, memory_key_padding_mask, tgt_key_padding_mask, cache)

    def _check_memory(self, memory, batch: int) -> None:
        """``memory`` is the encoder's output for ``batch`` sequences: ``(batch, src_len, d_model)`` floats."""
        if not isinstance(memory, torch.Tensor):
            raise TypeError(f"memory must be a torch.Tensor (the output of encode(src)), got {type(memory).__name__}")
        if not memory.is_floating_point():
            raise TypeError(f"memory must be a floating-point tensor (the output of encode(src)), got {memory.dtype}")
        if memory.dim() == 3 and memory.shape[0] != batch:
            raise ValueError(f"tgt has batch size {batch} but memory (the encoded src) has shape "
                             f"{tuple(memory.shape)}: src and tgt must hold the same number of sequences")  # fmt: skip
        if memory.dim() != 3 or memory.shape[2] != self.d_model:
            raise ValueError(f"memory must have shape (batch, src_len, d_model) = ({batch}, src_len, {self.d_model}), "
                             f"got {tuple(memory.shape)}")  # fmt: skip
        weight = self.embed.weight
        if memory.dtype != weight.dtype and not torch.is_autocast_enabled(memory.device.type):
            raise TypeError(f"memory has dtype {memory.dtype} but the model's weights {weight.dtype}; pass "
                            "encode(src)'s output, or run both under torch.autocast")  # fmt: skip

    def decode_unchecked(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        memory_key_padding_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """:meth:`decode` without its checks of ids, lengths and masks: for a caller that has made them (a
        decoding loop whose new tokens come from the model's own argmax), so that the step reads no value
        back and :func:`torch.compile` traces it as one graph (:func:`~posenc_lib.models.decoding.greedy_decode`
        with ``compile=True``)."""
        return self.logits(self._decoder_output(tgt, memory, memory_key_padding_mask, tgt_key_padding_mask, cache))

    def _decoder_output(self, tgt, memory, memory_key_padding_mask, tgt_key_padding_mask, cache) -> torch.Tensor:
        """The decoder's normalised outputs ``(B, T, d_model)``; :meth:`decode_unchecked` less the output layer."""
        offset = cache.offset if cache is not None else 0
        t = tgt.shape[1]
        q_pos = torch.arange(offset, offset + t, device=tgt.device)
        k_pos = torch.arange(0, offset + t, device=tgt.device)
        x = self.embed_tokens(self.tgt_embed, tgt, self.dec_scheme, q_pos)
        if cache is not None:
            prep = self.dec_scheme.prepare_step(q_pos, k_pos, cache.scheme_state)
        else:
            prep = self.dec_scheme.prepare(q_pos, k_pos)
        lean = cache is not None and self.norm_first and not self.training and tgt_key_padding_mask is None
        for i, layer in enumerate(self.decoder):
            c = cache.layers[i] if cache is not None else None
            if lean:  # a cached step in evaluation: DecoderLayer.step, the same operations with fewer calls
                x = layer.step(x, memory, memory_key_padding_mask, self.dec_scheme, prep, i, c)
            else:
                x = layer(x, memory, tgt_key_padding_mask, memory_key_padding_mask, self.dec_scheme, prep, i, c)
        if cache is not None:
            cache.offset += t
        return self.dec_norm(x)

    def decoder_states(self, src: torch.Tensor, tgt: torch.Tensor, *, src_key_padding_mask=None,
                       tgt_key_padding_mask=None) -> torch.Tensor:
        """The decoder's normalised outputs ``(B, T, d_model)``, before the output layer: :meth:`forward` without
        :meth:`logits` (the same checks and operations), for a loss that multiplies them by :meth:`output_weight`
        in parts, so that no full logits tensor is made."""
        memory = self.encode(src, src_key_padding_mask)
        self._check_ids("tgt", tgt)
        self.check_length(self.dec_scheme, tgt.shape[1], "a target")
        check_padding_mask("tgt_key_padding_mask", tgt_key_padding_mask, *tgt.shape)
        self._check_memory(memory, tgt.shape[0])
        return self._decoder_output(tgt, memory, src_key_padding_mask, tgt_key_padding_mask, None)

    def output_weight(self) -> torch.Tensor:
        """The ``(vocab_size, d_model)`` matrix :meth:`logits` multiplies by (the tied embedding or ``out_proj``)."""
        return self.embed.weight if self.out_proj is None else self.out_proj.weight

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model)`` decoder outputs -> ``(B, T, vocab_size)`` scores (the tied embedding or ``out_proj``).

        On CPU, a product with few rows (a decoding step: one per sequence, at most :data:`FEW_ROWS`) is
        computed as ``W @ x^T`` and returned transposed, a view.  The sums are the same as ``x @ W^T``'s
        (rounded in another order), but with the tall ``(vocab, d_model)`` matrix on the left this torch's
        CPU matrix library takes well under half the time for 8 rows (benchmarks/README.md, "Cached decoding").
        """
        weight = self.embed.weight if self.out_proj is None else self.out_proj.weight
        rows = x.shape[0] * x.shape[1]
        packed = getattr(self, "packed_logits", None)  # set while a decoding loop runs (decoding.packed_weights)
        if packed is not None and rows <= FEW_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        if rows <= FEW_ROWS and on_host(x):
            return (weight @ x.reshape(rows, x.shape[2]).t()).t().view(x.shape[0], x.shape[1], weight.shape[0])
        return x @ weight.t()

    def new_cache(self, capacity: int | None = None) -> DecoderCache:
        """An empty :class:`DecoderCache` for this model's decoder (``capacity``: see the cache)."""
        return DecoderCache(len(self.decoder), capacity)

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        *,
        src_key_padding_mask: torch.Tensor | None = None,
        tgt_key_padding_mask: torch.Tensor | None = None,
        states: bool = False,
    ) -> torch.Tensor:
        """``src (B, S)``, ``tgt (B, T)`` int64 -> logits ``(B, T, vocab_size)``; padding masks True at pads.
        ``states=True`` returns :meth:`decoder_states` instead (through ``forward``, so DistributedDataParallel
        sees the call)."""
        if _check_bool("states", states):
            return self.decoder_states(src, tgt, src_key_padding_mask=src_key_padding_mask,
                                       tgt_key_padding_mask=tgt_key_padding_mask)
        memory = self.encode(src, src_key_padding_mask)
        return self.decode(
            tgt, memory, memory_key_padding_mask=src_key_padding_mask, tgt_key_padding_mask=tgt_key_padding_mask
        )

    def loss(self, src, tgt_in, tgt_out, *, label_smoothing: float = 0.0, **masks) -> torch.Tensor:
        """Mean cross-entropy over non-pad target tokens.

        A batch whose ``tgt_out`` is nothing but padding has no token to average over (the mean
        would be NaN) and is a ``ValueError``: every target the course builds ends with EOS, so
        such a batch is a bug in the caller.  ``tgt_out`` has ``tgt_in``'s shape and holds ids in
        ``[0, vocab_size)``, ``pad_id`` where a position is ignored.  The checks that read ``tgt_out``
        run on CPU tensors only; on an accelerator they would stall the device at every step.
        """
        label_smoothing = check_float_range("label_smoothing", label_smoothing, 0.0, 1.0)
        check_token_tensor("tgt_in", tgt_in)
        check_token_tensor("tgt_out", tgt_out)
        if tgt_out.shape != tgt_in.shape:
            raise ValueError(f"tgt_out must have the shape of tgt_in, {tuple(tgt_in.shape)}, got "
                             f"{tuple(tgt_out.shape)} (tgt_out[:, t] is the token after tgt_in[:, t])")  # fmt: skip
        self._check_ids("tgt_out", tgt_out, "target id", f" (positions to ignore hold pad_id={self.pad_id}, not -100)")
        if on_host(tgt_out) and not bool((tgt_out != self.pad_id).any()):
            raise ValueError(
                f"no target tokens: every target position is padding (pad_id={self.pad_id}) in tgt_out of shape "
                f"{tuple(tgt_out.shape)}, so the mean loss over its tokens is undefined"
            )
        logits = self(src, tgt_in, **masks)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), tgt_out.reshape(-1),
            ignore_index=self.pad_id, label_smoothing=label_smoothing,
        )  # fmt: skip

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def attention_layers(self):
        """``(name, MultiHeadAttention)`` pairs, e.g. to set ``keep_weights`` for plots."""
        for i, layer in enumerate(self.encoder):
            yield f"encoder.{i}.self", layer.self_attn
        for i, layer in enumerate(self.decoder):
            yield f"decoder.{i}.self", layer.self_attn
            yield f"decoder.{i}.cross", layer.cross_attn


def build_model(
    pe: str,
    vocab_size: int,
    *,
    d_model: int = 64,
    n_heads: int = 8,
    num_layers: int = 6,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    **options,
) -> Seq2SeqTransformer:
    """Build the seq2seq Transformer with positional encoding ``pe``.

    ``pe``: one of :data:`~posenc_lib.ALL_TYPES` (the classics of ``PE_TYPES`` and lesson 11's
    ``SURVEY_TYPES``) or an alias (``nonepe``, ``sinpe``,
    ``rpe`` = shaw, ``rope``).  Defaults follow the seed report (d_model 64,
    8 heads, 6+6 layers, ff 2048).  Other keywords: the model's
    ``num_decoder_layers``, ``norm_first``, ``tie_embeddings``, ``pad_id``, and the
    scheme's own options (see :func:`~posenc_lib.schemes.registry.scheme_options`), e.g.
    ``max_relative_position=16`` for shaw or ``interleaved=False`` for rope.
    """
    return Seq2SeqTransformer(
        pe, vocab_size, d_model=d_model, n_heads=n_heads, num_layers=num_layers,
        dim_feedforward=dim_feedforward, dropout=dropout, **options,
    )  # fmt: skip
