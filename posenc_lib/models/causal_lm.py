"""A small decoder-only (causal) language model whose positions come from any course scheme.

Pre-norm blocks of causal self-attention (the course's one :class:`~posenc_lib.attention.layer.MultiHeadAttention`)
and a feed-forward layer, with a tied output layer.  The scheme is any name of the registry
(:func:`~posenc_lib.schemes.registry.make_scheme` with ``causal=True``) and can be swapped on a trained model
(:meth:`CausalLM.set_scheme`), which is how a RoPE model is read with another ``scaling``.

Layers may also differ in their positions, as in today's open models (Gemma 3's local and global bases,
Cohere's and Llama 4's RoPE layers beside NoPE layers): pass ``pe`` as a list with one entry per layer,
each a scheme name, a ``(name, options)`` pair, or a ``(PositionScheme subclass, options)`` pair (see
posenc_lib/schemes/rope_layers.py, which reads such a list from a ``transformers`` config).  Layers with
equal entries share one scheme, built for their number of layers; a single name keeps the one scheme of
every layer, with exactly the computation it always had.

Used by the long-context experiment (posenc_lib/experiments/long_context.py, taught in
notebooks/14_long_context.ipynb), by the RoPE variants of notebooks/15_rope_in_llms.ipynb
(posenc_lib/experiments/rope_variants.py), by the decoder-only runs of the length-extrapolation experiment
(notebooks/13_length_extrapolation.ipynb) and by lesson 10's ALiBi comparison.

:class:`MaskedLM` is the same stack with no causal mask, trained to fill in masked characters (BERT's
objective; Devlin, Chang, Lee & Toutanova 2019, arXiv:1810.04805): the bidirectional model of
notebooks/16_inside_a_trained_model.ipynb (posenc_lib/experiments/inside.py).
"""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.layer import MultiHeadAttention, PositionScheme, on_host
from ..schemes.registry import canonical_pe, make_scheme
from ..utils import renamed_keys_hook
from ..checks import check_bool, check_divides, check_positive_int, check_token_tensor


def _check_vocab_ids(name: str, ids: torch.Tensor, vocab: int, note: str = "") -> None:
    """``ValueError`` naming an id of ``ids`` outside ``[0, vocab)``; reads the ids, so on CPU tensors only."""
    if on_host(ids) and ids.numel():
        lo, hi = (int(v) for v in ids.aminmax())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name} holds id {lo if lo < 0 else hi} outside the vocabulary: vocab_size={vocab}, "
                             f"valid ids 0..{vocab - 1}{note}")  # fmt: skip


def _check_windows(windows) -> None:
    """``windows (batch >= 1, T + 1 >= 2)`` integer token ids (inputs and next-character targets)."""
    if not isinstance(windows, torch.Tensor):
        raise TypeError(f"windows must be a torch.Tensor of token ids (batch, T + 1), got {type(windows).__name__}")
    if windows.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"windows must hold integer token ids (torch.int64), got dtype {windows.dtype}")
    if windows.dim() != 2 or windows.shape[0] < 1 or windows.shape[1] < 2:
        raise ValueError(
            f"windows must be (batch >= 1, T + 1 >= 2) token ids, got shape {tuple(windows.shape)}: "
            "with no window or no next character the mean loss is undefined"
        )


class Block(nn.Module):
    """Pre-norm block: self-attention (causal unless ``causal=False``), then a feed-forward layer."""

    def __init__(self, d_model: int, n_heads: int, dim_feedforward: int, causal: bool = True):
        super().__init__()
        self.causal = causal
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ff = nn.Sequential(nn.Linear(d_model, dim_feedforward), nn.GELU(), nn.Linear(dim_feedforward, d_model))

    def forward(self, x, scheme, prep, layer, need_weights=False):
        a = self.attn(self.norm1(x), causal=self.causal, scheme=scheme, prep=prep, layer=layer, need_weights=need_weights)
        a, w = a if need_weights else (a, None)
        x = x + a
        return x + self.ff(self.norm2(x)), w


class CausalLM(nn.Module):
    """A small decoder-only language model whose positions come from any course scheme.

    ``pe`` and ``options`` go to :func:`~posenc_lib.schemes.registry.make_scheme` with ``causal=True``;
    :meth:`set_scheme` swaps the scheme of a trained model (RoPE schemes hold no weights), which is
    how a RoPE model is read with a different ``scaling``.

    ``pe`` as a list: one entry per layer (a name, ``(name, options)`` or ``(PositionScheme subclass,
    options)``), for models whose layers differ in their positions; ``options`` must then be empty.
    ``self.scheme`` is the one scheme of a single-scheme model (``None`` otherwise); ``self.scheme_per_layer`` holds
    each layer's ``(scheme, index of the layer among that scheme's layers)``.
    """

    #: every block masks the future (:class:`MaskedLM` sets it False)
    causal = True

    def __init__(self, vocab_size: int, pe: str, *, d_model: int, n_heads: int, num_layers: int,
                 dim_feedforward: int, **options):  # fmt: skip
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("num_layers", num_layers), ("dim_feedforward", dim_feedforward)):
            check_positive_int(name, v)
        check_divides(d_model, n_heads)
        self.dims = (d_model, n_heads, num_layers)
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)  # tied output: logits start near 0
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dim_feedforward, self.causal) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.set_scheme(pe, **options)
        # checkpoints saved before the scheme was renamed (pos) load as they are
        self.register_load_state_dict_pre_hook(renamed_keys_hook({"pos": "scheme"}))

    def set_scheme(self, pe, **options) -> None:
        """One scheme for every layer (``pe`` a name), or one per layer (``pe`` a list; see the class)."""
        if isinstance(pe, str):
            self.scheme = make_scheme(pe, *self.dims, causal=self.causal, **options)
            self.layer_schemes = None
            self.scheme_per_layer = [(self.scheme, i) for i in range(self.dims[2])]
            return
        if options:
            raise ValueError(f"with one position entry per layer, give each layer's options in its entry "
                             f"('rope', {{...}}), not as keyword arguments; got {sorted(options)}")  # fmt: skip
        self.scheme = None
        self.layer_schemes, self.scheme_per_layer = _per_layer_schemes(pe, *self.dims, causal=self.causal)

    def forward(self, tokens: torch.Tensor, need_weights: bool = False):
        """``tokens (batch, T)`` -> logits ``(batch, T, vocab)`` (and per-layer attention weights)."""
        check_token_tensor("tokens", tokens)
        check_bool("need_weights", need_weights)
        _check_vocab_ids("tokens", tokens, self.embed.num_embeddings)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) * math.sqrt(self.dims[0])
        weights = []
        if self.scheme is not None:  # one scheme for every layer
            code = self.scheme.embed(positions)
            if code is not None:
                x = x + code
            prep = self.scheme.prepare(positions, positions)
            for i, block in enumerate(self.blocks):
                x, w = block(x, self.scheme, prep, i, need_weights)
                weights.append(w)
        else:  # a scheme per layer: each distinct scheme prepares its context once
            preps = {id(s): s.prepare(positions, positions) for s in self.layer_schemes}
            for block, (scheme, index) in zip(self.blocks, self.scheme_per_layer):
                x, w = block(x, scheme, preps[id(scheme)], index, need_weights)
                weights.append(w)
        logits = self.norm(x) @ self.embed.weight.t()
        return (logits, weights) if need_weights else logits

    def loss(self, windows: torch.Tensor) -> torch.Tensor:
        """Mean next-character cross-entropy (nats) of ``windows (batch, T + 1)``."""
        _check_windows(windows)
        _check_vocab_ids("windows", windows, self.embed.num_embeddings)  # the last column is a target only
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


class MaskedLM(CausalLM):
    """:class:`CausalLM`'s stack with no causal mask, trained to fill in masked characters.

    Every token sees every other one, so with ``pe="none"`` the model is permutation-equivariant: permuting
    the input permutes the hidden states and nothing else (lesson 01), and no layer can know where a token is.
    The embedding has ``vocab_size + 1`` rows; the last id, :attr:`mask_id`, is the ``[MASK]`` character.
    """

    causal = False

    def __init__(self, vocab_size: int, pe: str, *, mask_prob: float = 0.15, **kwargs):
        check_positive_int("vocab_size", vocab_size)
        if isinstance(mask_prob, bool) or not isinstance(mask_prob, numbers.Real):
            raise TypeError(f"mask_prob must lie in (0, 1), got {mask_prob!r} ({type(mask_prob).__name__})")
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob must lie in (0, 1), got {mask_prob!r}")
        super().__init__(vocab_size + 1, pe, **kwargs)
        self.mask_id = vocab_size
        self.mask_prob = mask_prob

    def loss(self, windows: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy (nats) of the masked characters of ``windows (batch, T + 1)``.

        The first ``T`` characters of each window are the input (the interface of :meth:`CausalLM.loss`, so the
        same training loop serves both); ``max(1, round(mask_prob * T))`` of them, drawn anew each call from
        torch's generator, are replaced by :attr:`mask_id` and predicted.
        """
        _check_windows(windows)
        # the data's characters are ids below mask_id: a mask id in the data would read as a [MASK]
        _check_vocab_ids("windows", windows, self.mask_id, f" (mask_id={self.mask_id} is the model's [MASK])")
        x = windows[:, :-1]
        b, t = x.shape
        n = max(1, round(self.mask_prob * t))
        masked = torch.rand(b, t, device=x.device).argsort(dim=1)[:, :n]  # (batch, n) distinct positions per row
        logits = self(x.scatter(1, masked, self.mask_id))
        picked = logits.gather(1, masked[..., None].expand(-1, -1, logits.shape[-1]))
        return F.cross_entropy(picked.reshape(-1, logits.shape[-1]), x.gather(1, masked).reshape(-1))


def _per_layer_schemes(entries, d_model: int, n_heads: int, num_layers: int, causal: bool = True):
    """``(schemes, scheme_per_layer)`` for one position entry per layer (see :class:`CausalLM`).

    Equal entries share one scheme built for as many layers as they cover; a scheme that adds to the
    token embeddings (sinusoidal, learned) belongs to the whole model, not to a layer, and is refused.
    """
    if isinstance(entries, (bytes, dict)) or not hasattr(entries, "__len__"):
        raise TypeError(f"pe must be a scheme name or a list with one entry per layer, got {type(entries).__name__}")
    if len(entries) != num_layers:
        raise ValueError(f"pe lists {len(entries)} layer entries; the model has num_layers={num_layers}")
    keys = []
    for i, entry in enumerate(entries):
        if isinstance(entry, (str, type)):
            name, options = entry, {}
        elif isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], dict):
            name, options = entry
        else:
            raise TypeError(f"layer {i}: an entry is a name, (name, options) or (PositionScheme subclass, options); "
                            f"got {entry!r}")  # fmt: skip
        if isinstance(name, type):
            if not issubclass(name, PositionScheme):
                raise TypeError(f"layer {i}: {name.__name__} is not a PositionScheme subclass")
        else:
            name = canonical_pe(name)
        keys.append((name, repr(sorted(options.items())), options))
    groups: dict[tuple, list[int]] = {}
    for i, (name, frozen, _) in enumerate(keys):
        groups.setdefault((name, frozen), []).append(i)
    schemes, scheme_per_layer = nn.ModuleList(), [None] * num_layers
    for (name, _), layers in groups.items():
        options = keys[layers[0]][2]
        if isinstance(name, type):
            scheme = name(d_model, n_heads, len(layers), causal, **options)
        else:
            scheme = make_scheme(name, d_model, n_heads, len(layers), causal=causal, **options)
        if scheme.enters == "input":
            raise ValueError(f"layer {layers[0]}: {scheme.name!r} adds to the token embeddings, which every layer "
                             f"reads; give it as pe={scheme.name!r} for the whole model, not per layer")  # fmt: skip
        schemes.append(scheme)
        for j, i in enumerate(layers):
            scheme_per_layer[i] = (scheme, j)
    return schemes, scheme_per_layer
