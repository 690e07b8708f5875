"""One multi-head attention module with small extension points for position schemes.

A position scheme (:class:`PositionScheme`) can enter attention in exactly four
places, and each scheme overrides only the hooks it needs:

==================  ==========================================  ===========================
hook                what it does                                used by
==================  ==========================================  ===========================
``embed``           add a code to the token embeddings          sinusoidal, learned
``rotate``          rotate queries and keys                     rope, xpos
``bias``            add a content-free bias to the scores       t5, alibi, fire, kerple
``scores``          add content-dependent score terms           shaw, xlnet, deberta, cope
``values``          add a term to the attention output          shaw
==================  ==========================================  ===========================

Scores are ``(q k^T + scores) / sqrt(head_dim * score_terms) + bias``; DeBERTa
sets ``score_terms = 3`` (its 1/sqrt(3d) scale).  ``prepare`` runs once per
forward pass of a stack and returns a context (relative-index matrices, the T5
bias, RoPE's cos/sin) that every layer of the stack reuses.

Which computation runs is decided in one place, :func:`choose_attention_path`,
from what the scheme declares (``adds_bias``, ``adds_scores``, ``adds_values``;
derived from the hooks it overrides): without score or value terms the module
calls ``torch.nn.functional.scaled_dot_product_attention`` (the fused kernel),
with the bias and masks folded into one float ``attn_mask``; otherwise it
computes the softmax explicitly.  Long inputs run over blocks of queries (:data:`BLOCK_ELEMENTS`),
and on CPU those blocks go back to the fused kernel with the position terms as a float mask
(:data:`CPU_FLASH`, :mod:`posenc_lib.attention.cpu_flash`); a training call too small to need blocks
for memory still takes that fused path where it was measured to pay (:data:`FUSED_MIN_ELEMENTS`).  A causal self-attention with nothing to mask
but the future (no padding, no bias) passes ``is_causal=True`` and *no* mask,
the only form the flash kernels on a GPU accept.

Causal self-attention: the queries are the newest ``q_len`` of the ``k_len``
keys (a decoder cache holds only earlier positions), so the causal mask is
"key position <= query position" read bottom-right: with ``q_len == k_len``
it is SDPA's ``is_causal``; with ``q_len == 1`` (a cached step) it masks nothing.

Position biases are built in float32 whatever the autocast or parameter dtype
(a bf16 distance is already rounded above 256); they are cast to the kernel's
dtype only where they enter it.  Nothing in a forward pass reads a value back
from the device (``.item()``, ``int(tensor)``): checks that must read values run
only on CPU tensors (:func:`on_host`), where reading costs no synchronisation.

Relative positions, one convention: a relative position is ``j - i``, the key's position minus the
query's (:func:`posenc_lib.utils.relative_positions`); negative means the key lies to the left (in the
past).  Shaw (``clip(j - i, k)``), T5 (``bucket(j - i)``), RoPE (``<R_m q, R_n k> = q^T R_{n-m} k``, query at
``m``) and the 2-D offsets use it as written in their papers.  Transformer-XL/XLNet (``R_{i-j}``), DeBERTa
(``delta(i, j)`` from ``i - j``) and URPE (``g(i - j)``) index by the query minus the key, ``-(j - i)``, as
their papers and ``transformers`` do; the library keeps their index so that parity tests read alike.  ALiBi's
``|i - j|`` does not depend on the order, and its causal ``-m (i - j)`` is ``m (j - i)``.  Each scheme's
docstring says which form it uses; notebooks/01_why_position.ipynb states the convention for learners.

Shapes: ``q: (batch, heads, q_len, head_dim)``, ``k, v: (batch, heads, k_len, head_dim)``;
positions ``q_pos: (q_len,)``, ``k_pos: (k_len,)`` are absolute (a cached decoder
step has ``q_pos = [t]`` and ``k_pos = [0..t]``).

Taught across notebooks/05-10 and costed in notebooks/12_cost.ipynb; the module is the common ground of them all.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import cpu_flash
from .step import append_to_cache, cached_len, cross_attention, cross_step, self_attention_step, takes_self_step
from .inputs import check_attention_call, check_positions, merge_masks  # noqa: F401 (the schemes import them here)
from ..checks import check_bool, check_divides, check_float_range, check_positive_int
from ..utils import diagonal_sums, fill_closed_

#: An attention call whose ``(batch, heads, q_len, k_len)`` scores would hold more than this many
#: elements, and that would keep them for the backward pass (score or value terms, or a bias that needs
#: a gradient), runs over blocks of queries instead: each block's scores are built, used and dropped,
#: and with gradients on the block is checkpointed (its scores and weights are recomputed in the
#: backward pass instead of kept).  Memory then holds one block of scores, not all of them.
#: ``None`` turns blocking off.  2**24 elements = 64 MiB of float32 scores per block.
BLOCK_ELEMENTS: int | None = 2**24

#: On CPU (float32, no dropout) an attention call that runs in blocks uses the fused kernel instead of
#: written-out scores: score terms and bias enter it as a float mask whose gradient
#: :mod:`posenc_lib.attention.cpu_flash` computes (Shaw's value term is rebuilt from the kernel's row
#: log-sum-exp).  Same function, same gradients; ``False`` keeps the explicit blocks everywhere.
CPU_FLASH: bool = True

#: A CPU training call (gradients on, float32, no dropout) whose scores hold at least this many elements takes the
#: fused path of :data:`CPU_FLASH` even below :data:`BLOCK_ELEMENTS` (in blocks of :data:`FUSED_BLOCK_ROWS`): there it
#: is as fast as the explicit softmax and keeps no scores for the backward pass; the course's small models stay
#: explicit.  How it was measured: benchmarks/README.md.  ``None``: only blocked calls take the fused path.
FUSED_MIN_ELEMENTS: int | None = 2**21

#: A fused SDPA call on CPU with a bias whose scores hold at least this many elements runs with denormal floats
#: flushed to zero (:func:`cpu_flash.flush_denormals`): ALiBi's distant keys make denormal weights, tens of times
#: slower on x86.  Smaller calls and calls without a bias are left as they were.  ``None`` turns it off.
FLUSH_MIN_ELEMENTS: int | None = 2**20

#: A training call on the fused CPU path runs over query blocks of at most this many rows (fewer where
#: :data:`BLOCK_ELEMENTS` asks), so that a causal block runs against only the keys up to its last query.
FUSED_BLOCK_ROWS: int = 128

#: The same for a scheme whose fused path runs the keys beyond its clipping distance without a mask (Shaw,
#: DeBERTa): longer blocks make the laid-out strip a smaller share of the keys.  ``None``: :data:`FUSED_BLOCK_ROWS`.
SIDED_BLOCK_ROWS: int | None = 256

#: A training call of XLNet, DeBERTa, T5 or Shaw runs its batch rows in chunks whose blocks lay out at most this many
#: scores (:func:`_batch_chunk`; a block's rows counted against one chunk), so that a block's terms and gradients are
#: written and read in smaller pieces.  How it was measured: benchmarks/README.md.  ``None``: the whole batch at once.
BATCH_CHUNK_ELEMENTS: int | None = 2**23


def on_host(t: torch.Tensor) -> bool:
    """True when reading ``t``'s values costs no device synchronisation (a CPU tensor) and breaks no
    compiled graph (not while :func:`torch.compile` traces).

    Checks that must look at values (token ids beyond the vocabulary, positions
    beyond a learned table) run only then; on an accelerator the read would stall
    the device on every call, in a traced function it would split the graph, and the
    model's own positions never need it (a compiled decoding step's caller checks lengths
    with plain ints).
    """
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


class PositionScheme(nn.Module):
    """Base class and the ``none`` scheme: attention sees no position at all.

    One instance serves one stack (the encoder's self-attention or the
    decoder's); per-layer parameters are indexed by ``layer``.
    """

    name = "none"
    #: where the position enters: "input", "q,k", "scores", "scores+values" or "nowhere"
    where = "nowhere"
    #: number of score terms that share the 1/sqrt(head_dim * score_terms) scale
    score_terms = 1
    #: what the scheme adds inside attention, read by :func:`choose_attention_path`; a subclass
    #: gets them from the hooks it overrides (``bias``, ``scores``, ``values``) unless it sets them
    adds_bias = False
    adds_scores = False
    adds_values = False
    #: the number of positions the scheme can code (a learned table's rows), or None for any
    max_positions: int | None = None
    #: ``block_parts(parts, ctx, start, end, n)``, where a scheme defines it: query block ``start:end``'s share (against
    #: keys ``0:n``) of the parts ``score_parts`` made for the whole call (the same parts, or rows of them); the fused
    #: CPU path then makes the parts once per layer and runs all of a layer's blocks in one node
    block_parts = None
    #: ``kernel_queries(q, parts)`` and ``mask_from_parts(q, k, parts, ctx, scale, allowed, work)``, where a scheme
    #: defines them (XLNet): the fused kernel's queries (a term ``u . k_j`` folded in) and a block's mask of the other
    #: terms, its score-sized tensors in the buffers ``work`` kept for a pass (:func:`cpu_flash.flash_blocks`; with ``block_parts``)
    kernel_queries = mask_from_parts = None
    #: ``side_terms(q, parts, edge, scale) -> (row, u)``, where a scheme defines it (with ``block_sides`` and
    #: ``key_range``): for keys that all sit at one clipped relative index ``edge`` from a block's queries ``q``,
    #: their score terms times ``scale`` as ``row_i + scale * u . k_j`` (see :func:`cpu_flash.flash_blocks`)
    side_terms = None
    #: the fused CPU path runs the keys beyond the scheme's clipping distance from a block's queries without a mask
    #: (Shaw's own path, DeBERTa's ``side_terms``), so its blocks are :data:`SIDED_BLOCK_ROWS` long
    clipped_sides = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for flag, hook in (("adds_bias", "bias"), ("adds_scores", "scores"), ("adds_values", "values")):
            if flag not in cls.__dict__:
                setattr(cls, flag, getattr(cls, hook) is not getattr(PositionScheme, hook))

    def __init__(self, d_model: int, n_heads: int, num_layers: int, causal: bool = False):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = check_divides(d_model, n_heads)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.causal = check_bool("causal", causal)

    # -- the hooks --------------------------------------------------------------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        """``(seq, d_model)`` code added to the token embeddings, or ``None``."""
        return None

    def prepare(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict[str, Any]:
        """Per-forward context shared by all layers of the stack."""
        check_positions(q_pos, k_pos)
        return {"q_pos": q_pos, "k_pos": k_pos}

    def prepare_step(self, q_pos: torch.Tensor, k_pos: torch.Tensor, state: dict) -> dict[str, Any]:
        """The context of a decoding step with a cache: :meth:`prepare`'s, plus ``state`` as ``"step_state"``.

        ``state`` lives as long as the cache: what a scheme keeps in it (tables that depend only on its
        parameters and distances) is built at the first step and reused.  A scheme whose one-query step
        needs less than :meth:`prepare` builds overrides this.
        """
        return {**self.prepare(q_pos, k_pos), "step_state": state}

    def rotate(self, q: torch.Tensor, k: torch.Tensor, ctx: dict, layer: int):
        """Rotate ``q`` and the *new* keys ``k`` (both at positions ``ctx['q_pos']``)."""
        return q, k

    def bias(self, ctx: dict, layer: int) -> torch.Tensor | None:
        """Content-free score bias broadcastable to ``(batch, heads, q_len, k_len)``."""
        return None

    def scores(self, q: torch.Tensor, k: torch.Tensor, ctx: dict, layer: int, attn: "MultiHeadAttention"):
        """Extra (unscaled) score terms ``(batch, heads, q_len, k_len)``, or ``None``."""
        return None

    def values(self, probs: torch.Tensor, ctx: dict, layer: int) -> torch.Tensor | None:
        """Extra output term ``(batch, heads, q_len, head_dim)`` from the attention weights."""
        return None

    @property
    def splits_queries(self) -> bool:
        """True when :meth:`query_slice` is defined for this scheme's score and value terms."""
        return not (self.adds_scores or self.adds_values) or (
            type(self).query_slice is not PositionScheme.query_slice
        )

    def query_slice(self, ctx: dict, start: int, end: int) -> dict:
        """The context for query rows ``start:end`` of ``ctx`` (attention over query blocks).

        A bias needs nothing here (the bias tensor itself is sliced); a scheme with score or
        value terms overrides this to slice its relative-index structures (until it does,
        its attention runs in one piece).
        """
        return {**ctx, "q_pos": ctx["q_pos"][start:end]}

    def key_slice(self, ctx: dict, k_end: int) -> dict | None:
        """The context of ``ctx`` (one query block's) for keys ``0:k_end`` only, or ``None`` if the scheme
        cannot drop keys.  A causal block needs no key after its last query: its score terms are built
        for those keys alone (:func:`_last_key`)."""
        return None

    # -- facts for the comparison table ------------------------------------------------------
    @property
    def fused(self) -> bool:
        """True when attention can use the fused ``scaled_dot_product_attention`` kernel."""
        return choose_attention_path(self, q_len=1, k_len=1, causal=False, padded=False).fused

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


@dataclass(frozen=True)
class AttentionPath:
    """How one attention call is computed (see :func:`choose_attention_path`).

    ``fused``: ``scaled_dot_product_attention``, else scores and softmax written out.
    ``is_causal``: fused only; SDPA applies the causal mask itself and gets no ``attn_mask``
    (the one form every kernel, flash included, accepts).
    ``causal_mask``: a causal part must be built into the boolean mask.
    """

    fused: bool
    is_causal: bool
    causal_mask: bool


def choose_attention_path(
    scheme: PositionScheme | None,
    *,
    q_len: int,
    k_len: int,
    causal: bool,
    padded: bool,
    need_weights: bool = False,
) -> AttentionPath:
    """Pick the computation from what ``scheme`` declares and the call's shape (no tensors read).

    * score or value terms (shaw, xlnet, deberta), or weights wanted: explicit softmax;
    * otherwise the fused kernel; a bias (t5, alibi) rides along as a float ``attn_mask``;
    * causal self-attention: queries are the newest ``q_len`` keys, so one query (a cached
      step) needs no causal mask, and ``q_len == k_len`` with no padding and no bias goes to
      SDPA as ``is_causal=True`` with no mask.  SDPA's ``is_causal`` is aligned top-left, so it
      is never used when ``q_len != k_len``.
    """
    adds_scores = scheme is not None and scheme.adds_scores
    adds_values = scheme is not None and scheme.adds_values
    adds_bias = scheme is not None and scheme.adds_bias
    fused = not (adds_scores or adds_values or need_weights)
    needs_causal = causal and q_len > 1
    is_causal = fused and needs_causal and q_len == k_len and not padded and not adds_bias
    return AttentionPath(fused=fused, is_causal=is_causal, causal_mask=needs_causal and not is_causal)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (batch first) with position-scheme hooks and an optional cache."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.head_dim = check_divides(d_model, n_heads)
        dropout = check_float_range("dropout", dropout, 0.0, 1.0, high_open=True)
        bias = check_bool("bias", bias)
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        #: set True to keep the last attention weights in ``last_weights`` (for plots)
        self.keep_weights = False
        self.last_weights: torch.Tensor | None = None

    #: set by :func:`~posenc_lib.models.decoding.packed_weights` for the span of a cached decoding loop: ``x ->`` the
    #: ``(batch, len, 3 * d_model)`` queries, keys and values of self-attention in one product, or ``None`` where ``x``
    #: has too many rows for it (the three projections then run as they are)
    step_qkv = None

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, len, d_model) -> (batch, heads, len, head_dim)``."""
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos: PositionScheme | None = None,
        ctx: dict | None = None,
        layer: int = 0,
        cache: dict | None = None,
        need_weights: bool = False,
    ):
        """Attend from ``x (batch, q_len, d_model)`` to ``kv`` (default: ``x``, self-attention).

        ``cache``: a dict this layer owns during incremental decoding.  For
        self-attention it accumulates keys/values (RoPE keys already rotated) in
        preallocated buffers;
        for cross-attention it stores the projected memory once.
        Returns ``(batch, q_len, d_model)``, and the attention weights if ``need_weights``.
        """
        if cache is None:  # a cached call is a decoding step: its model checked the inputs at the first step
            if pos is not None and not isinstance(pos, PositionScheme):
                raise TypeError(f"pos must be a PositionScheme (make_scheme(...)) or None, got {type(pos).__name__}")
            check_attention_call(self.d_model, x, kv, key_padding_mask, causal, need_weights, layer,
                                 None if pos is None else pos.num_layers)
        b, q_len, _ = x.shape
        want_weights = need_weights or self.keep_weights
        if kv is None and cache is not None and not want_weights and causal and (
                takes_self_step(self, x, key_padding_mask, pos, cache, BLOCK_ELEMENTS)):
            path = choose_attention_path(pos, q_len=1, k_len=cached_len(cache) + 1, causal=True, padded=False)
            return self_attention_step(self, x, pos, ctx, layer, cache, path)  # a decoding step (attention/step.py)
        qkv = self.step_qkv(x) if kv is None and self.step_qkv is not None else None
        if qkv is not None:  # a cached decoding step: q, k and v from one product (models.decoding.packed_weights)
            q, k, v = (self.split(t) for t in qkv.chunk(3, dim=-1))
        else:
            q = self.split(self.q_proj(x))
        if kv is None:  # self-attention
            if qkv is None:
                k, v = self.split(self.k_proj(x)), self.split(self.v_proj(x))
            if pos is not None:
                q, k = pos.rotate(q, k, ctx, layer)
            if cache is not None:
                k, v = append_to_cache(cache, k, v)
        else:  # cross-attention: no positions
            if cache is not None and "k" in cache:
                k, v = cache["k"], cache["v"]
            else:
                k, v = self.split(self.k_proj(kv)), self.split(self.v_proj(kv))
                if cache is not None:
                    cache["k"], cache["v"] = k, v
        k_len = k.shape[2]
        if kv is not None and cache is not None and not want_weights and cross_step(q):
            out = cross_attention(q, cache, key_padding_mask, 1.0 / math.sqrt(self.head_dim))
            return self.out_proj(out.transpose(1, 2).reshape(b, q_len, self.d_model))

        path = choose_attention_path(
            pos, q_len=q_len, k_len=k_len, causal=causal, padded=key_padding_mask is not None,
            need_weights=want_weights,
        )  # fmt: skip
        q_pos = ctx["q_pos"] if ctx is not None else None
        k_pos = ctx["k_pos"] if ctx is not None else None
        if causal and q_pos is None:
            q_pos = torch.arange(k_len - q_len, k_len, device=x.device)
            k_pos = torch.arange(k_len, device=x.device)
        allowed = merge_masks(
            q_len, k_len, causal=path.causal_mask, q_pos=q_pos, k_pos=k_pos, key_padding_mask=key_padding_mask
        )
        p_drop = self.dropout if self.training else 0.0
        offset = None if want_weights else _offset_bias_blocks(pos, ctx, q, k_len, path, p_drop)
        bias = pos.bias(ctx, layer) if pos is not None and offset is None else None
        terms = pos.score_terms if pos is not None else 1
        scale = 1.0 / math.sqrt(self.head_dim * terms)

        def attend(q, allowed, bias, ctx):
            """Attention of the queries ``q`` (all, or one block of them) to every key."""
            return self._attend(q, k, v, allowed, bias, ctx, pos, layer, path, scale, p_drop)

        def attend_flash(q, allowed, bias, ctx, blocks=None):
            """As ``attend``, in the fused CPU kernel: score terms, bias and masks enter as one float mask.
            ``blocks``: query ranges; each runs against the keys up to the last one its rows may see."""
            extra = pos.scores(q, k, ctx, layer, self) if pos.adds_scores else None
            mask = extra.float().mul_(scale) if extra is not None else None
            if bias is not None:
                mask = bias.float() if mask is None else mask.add_(bias)
            if allowed is not None:
                mask = mask.masked_fill(~allowed, float("-inf"))
            if blocks is not None:
                blocks = [(s, e, _block_keys(allowed, s, e, k_len)[1]) for s, e in blocks]
                if all(n == k_len for _, _, n in blocks):
                    blocks = None
            return cpu_flash.flash_attention(q, k, v, mask, scale, blocks)

        blocks = None if want_weights or offset is not None else self._query_blocks(q, k_len, path, pos, ctx, bias, p_drop)
        if offset is not None:  # a bias of one value per offset, laid out block by block in the fused kernel
            runs = pos.offset_runs(ctx) if getattr(pos, "offset_runs", None) is not None else None
            values, blocks, chunk = offset
            by_offset = lambda q, k, v, allowed: _offset_bias_attention(q, k, v, allowed, scale, values, blocks, runs=runs)  # noqa: E731
            out, probs, blocks = _in_batch_chunks(by_offset, chunk, q, k, v, allowed), None, []
        elif _flex_wanted(pos, want_weights, p_drop, q_len):
            from .flex import flex_attend

            out, probs, blocks = flex_attend(pos, q, k, v, ctx, layer, self, scale, allowed), None, []
        elif blocks is not None and _cpu_flash_wanted(pos, q, p_drop):
            probs = None
            shared = not pos.adds_scores and (allowed is None or allowed.shape[0] == 1)
            if pos.adds_values:  # the scheme computes its value term from the kernel's lse itself
                shaw = lambda q, k, v, allowed: pos.fused_cpu_attention(q, k, v, ctx, layer, scale, allowed, blocks)  # noqa: E731
                chunk = _batch_chunk(q, _fused_rows(pos), k_len)
                out, blocks = _in_batch_chunks(shaw, chunk, q, k, v, allowed), []
            elif _shares_parts(pos, bias):
                out, blocks = _shared_parts_attention(pos, q, k, v, ctx, layer, self, scale, allowed, blocks), []
            elif bias is None and getattr(pos, "score_parts", None) is not None:  # rebuilt from parts, no checkpoint
                outs = []
                for start, end in blocks:
                    ctx_b, rows, k_end = _block_context(pos, ctx, allowed, start, end, k_len)
                    build = functools.partial(_mask_from_parts, pos, ctx_b, scale, rows)
                    parts = pos.score_parts(q, ctx_b, layer, self)
                    kb, vb = k[:, :, :k_end], v[:, :, :k_end]
                    outs.append(cpu_flash.flash_scores(q[:, :, start:end], kb, vb, scale, build, *parts))
                out, blocks = torch.cat(outs, dim=2), []
            elif shared and not path.causal_mask and (values := _learned_offsets(pos, ctx, bias)) is not None:
                # a non-causal call with a learned bias per offset (T5's encoder from batch 2): one fused call, the
                # gradient summed per diagonal block by block, never a whole gradient of the bias (benchmarks/README)
                mask = bias.detach() if allowed is None else bias.detach().masked_fill(~allowed, float("-inf"))
                whole = lambda q, k, v, mask: cpu_flash.flash_whole_offsets(q, k, v, mask, values, scale)  # noqa: E731
                chunk = _batch_chunk(q, FUSED_BLOCK_ROWS, k_len)
                out = _in_batch_chunks(whole, chunk, q, k, v, mask)
                blocks = []
            elif shared:  # a bias shared over the batch: one fused call, its gradient summed block by block
                out, blocks = attend_flash(q, allowed, bias, ctx, blocks), []
            else:
                attend = lambda *a: (attend_flash(*a), None)  # noqa: E731 (the blocks below, fused)
        if blocks == []:
            pass
        elif blocks is None:
            out, probs = attend(q, allowed, bias, ctx)
        else:
            probs = None
            remember = torch.is_grad_enabled() and (
                q.requires_grad or k.requires_grad or v.requires_grad
                or any(p.requires_grad for p in (pos.parameters() if pos is not None else ()))
                or (bias is not None and bias.requires_grad)
            )  # fmt: skip
            outs = []
            for start, end in blocks:
                args = (q[:, :, start:end], _rows(allowed, start, end), _rows(bias, start, end),
                        pos.query_slice(ctx, start, end) if pos is not None else ctx)  # fmt: skip
                if remember:
                    outs.append(checkpoint(lambda *a: attend(*a)[0], *args, use_reentrant=False))
                else:
                    outs.append(attend(*args)[0])
            out = torch.cat(outs, dim=2)
        out = self.out_proj(out.transpose(1, 2).reshape(b, q_len, self.d_model))
        if self.keep_weights:
            self.last_weights = probs.detach()
        return (out, probs) if need_weights else out

    def _attend(self, q, k, v, allowed, bias, ctx, pos, layer: int, path: AttentionPath, scale: float, p_drop: float):
        """Attention of the queries ``q`` (all, or one block of them) to every key: the fused kernel with the bias
        and masks as one float mask where ``path`` says so, else the explicit softmax with the scheme's terms.
        Returns ``(out, weights)`` (``None`` from the kernel)."""
        if path.fused:
            mask = allowed
            if bias is not None:
                mask = bias.to(q.dtype)  # built in float32; cast only where it enters the kernel
                if allowed is not None:
                    mask = mask.masked_fill(~allowed, float("-inf"))
            if bias is not None and _flush_pays(q, k.shape[2], p_drop):  # a bias: denormals flushed
                if not torch.is_grad_enabled():  # no backward pass: the kernel itself
                    with cpu_flash.flush_denormals():
                        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale), None
                if not mask.requires_grad:  # the same kernel, flushing in both passes
                    mask = mask.expand(-1 if mask.shape[0] == q.shape[0] else 1, -1, q.shape[2], k.shape[2])
                    return cpu_flash.flash_attention(q, k, v, mask, scale), None
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=path.is_causal, scale=scale
            )
            return out, None
        extra = pos.scores(q, k, ctx, layer, self) if pos is not None else None
        s = q @ k.transpose(-1, -2)  # a fresh tensor: the in-place steps below save allocations
        if extra is not None:
            s.add_(extra)
        s.mul_(scale)
        if bias is not None:
            s = s.float().add_(bias)  # keep the float32 bias exact in a low-precision forward
        if allowed is not None:
            s.masked_fill_(~allowed, float("-inf"))
        probs = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        probs_d = F.dropout(probs, p_drop) if p_drop else probs
        out = probs_d @ v
        if pos is not None and pos.adds_values:
            out = out + pos.values(probs_d, ctx, layer)
        return out, probs

    def _query_blocks(self, q, k_len, path, pos, ctx, bias, p_drop=0.0) -> list[tuple[int, int]] | None:
        """Query ranges for attention in blocks (see :data:`BLOCK_ELEMENTS`), or ``None`` for one piece.

        Blocks only pay where whole scores would otherwise be kept: the explicit path, or a fused call
        whose float mask needs a gradient (SDPA then falls back to its materialising math path).  A training
        call below :data:`BLOCK_ELEMENTS` but at least :data:`FUSED_MIN_ELEMENTS` runs in blocks of
        :data:`FUSED_BLOCK_ROWS` queries, so that it takes the fused CPU path (:func:`_fused_pays`); a blocked
        training call on that path uses blocks of at most that many rows too."""
        b, h, q_len, _ = q.shape
        grad_bias = bias is not None and bias.requires_grad and torch.is_grad_enabled()
        if path.fused and not grad_bias:
            return None
        if pos is not None and (pos.adds_scores or pos.adds_values) and not pos.splits_queries:
            return None
        if BLOCK_ELEMENTS is None or b * h * q_len * k_len <= BLOCK_ELEMENTS:
            if not _fused_pays(pos, q, k_len, p_drop):
                return None
            rows = _fused_rows(pos)
        else:
            rows = max(1, BLOCK_ELEMENTS // (b * h * k_len))
            if rows >= q_len:
                return None
            if torch.is_grad_enabled() and _cpu_flash_wanted(pos, q, p_drop):  # training: causal blocks pay
                if _shares_parts(pos, bias) or pos.adds_values:
                    # its batch rows run in chunks (_shared_parts_attention, Shaw's): a block holds one chunk's rows
                    rows = max(1, BLOCK_ELEMENTS // (_batch_chunk(q, _fused_rows(pos), k_len) * h * k_len))
                rows = min(rows, _fused_rows(pos))
        return [(s, min(s + rows, q_len)) for s in range(0, q_len, rows)]


def _offset_bias_blocks(pos, ctx, q: torch.Tensor, k_len: int, path: AttentionPath, p_drop: float):
    """``(values, blocks)`` for :func:`_offset_bias_attention`, or ``None`` where that path does not apply.

    It applies to a causal training call on the fused CPU path (:func:`_fused_pays`, or a call above
    :data:`BLOCK_ELEMENTS`) whose scheme has one bias value per offset ``j - i`` (``offset_bias``: T5 and ALiBi
    over large windows of consecutive positions), and to a non-causal one of batch 1 with learned values (T5's
    encoder; from batch 2 it takes the whole bias, :func:`cpu_flash.flash_whole_offsets`): each block of
    :data:`FUSED_BLOCK_ROWS` queries lays out its own rows of the bias for the keys it can see, so the whole
    ``(heads, q_len, k_len)`` bias is never written, and a gradient (T5's) reaches the values per block (T5, batch
    1, L = 2048, side by side: peak memory 1.12x of ``none``'s, 1.32x with the whole bias; time 1.22 and 1.25)."""
    offset_bias = getattr(pos, "offset_bias", None)
    if offset_bias is None or ctx is None or not torch.is_grad_enabled():
        return None
    if _flex_wanted(pos, False, p_drop, q.shape[2]) or not _cpu_flash_wanted(pos, q, p_drop):
        return None
    b, h, q_len, _ = q.shape
    above = BLOCK_ELEMENTS is not None and b * h * q_len * k_len > BLOCK_ELEMENTS
    if not above and not _fused_pays(pos, q, k_len, p_drop):
        return None
    values = offset_bias(ctx)
    if values is None or not (path.causal_mask or (b == 1 and values.requires_grad)):  # see above
        return None
    chunk = _batch_chunk(q, FUSED_BLOCK_ROWS, k_len) if values.requires_grad else b
    rows = min(FUSED_BLOCK_ROWS, max(1, BLOCK_ELEMENTS // (chunk * h * k_len))) if above else FUSED_BLOCK_ROWS
    return values, [(s, min(s + rows, q_len)) for s in range(0, q_len, rows)], chunk


def _learned_offsets(pos, ctx, bias) -> torch.Tensor | None:
    """The values per offset ``(heads, q_len + k_len - 1)`` the whole ``bias`` was laid out from, where the scheme's
    context has them and they need a gradient (T5 over a large window of consecutive positions); else ``None``."""
    offset_bias = getattr(pos, "offset_bias", None)
    if offset_bias is None or bias is None or not bias.requires_grad:
        return None
    values = offset_bias(ctx)
    return values if values is not None and values.requires_grad else None


def _offset_bias_attention(q, k, v, allowed, scale: float, values: torch.Tensor, blocks, runs=None) -> torch.Tensor:
    """Attention with ``bias[h, i, j] = values[h, j - i + q_len - 1]`` over query blocks in the fused kernel
    (:func:`cpu_flash.flash_blocks`): each block sees the keys up to its last allowed one, and its mask is laid
    out from the values it needs (again in the backward pass, where its gradient is summed per offset).

    ``runs``: ``(a, z)`` where the values ``0:a`` all come from one learned value and so do the values ``z:`` (T5's
    buckets beyond ``max_distance``, :meth:`~posenc_lib.schemes.t5.T5Bias.offset_runs`): a block's keys
    whose offsets all fall in such a run, for every one of its rows, run in the kernel without a mask, the value
    added to the row's log-sum-exp (its gradient reaches the run's first value, and from it the learned one)."""
    q_len, k_len = q.shape[2], k.shape[2]
    spans, masks, ranges = [], [], []
    least = cpu_flash.SIDE_MIN_KEYS
    for start, end in blocks:
        rows, n = _block_keys(allowed, start, end, k_len)
        s0, s1 = 0, n
        if runs is not None and least is not None:
            a, z = runs
            lo = min(max(a + start - q_len + 1, 0), n)  # keys whose offset is below a for every row of the block
            hi = min(max(z + end - q_len, lo), n)  # keys whose offset is at least z for every row
            s0 = lo if lo >= least and (rows is None or bool(rows[..., :lo].all())) else 0
            s1 = hi if n - hi >= least and (rows is None or bool(rows[..., hi:].all())) else n
            if s1 <= s0:
                s0, s1 = 0, n
        spans.append((start, end, n))
        ranges.append((s0, s1))
        masks.append(rows if (s0, s1) == (0, n) or rows is None else rows[..., s0:s1])

    def build(i, values):
        (start, end, n), (s0, s1) = spans[i], ranges[i]
        return _offset_block(q_len, start, end, n, masks[i], None, None, values, s0, s1)

    def sides(i, values):
        (start, end, n), (s0, s1) = spans[i], ranges[i]
        outer = [(0, 0, s0, 0), (1, s1, n, values.shape[1] - 1)]
        rows = end - start
        return [(slot, a, z, values[None, :, at, None].expand(1, -1, rows), None) for slot, a, z, at in outer if z > a]

    split = any(r != (0, n) for r, (_, _, n) in zip(ranges, spans))
    if not split:
        return cpu_flash.flash_blocks(q, k, v, scale, spans, build, values)
    return cpu_flash.flash_blocks(q, k, v, scale, spans, build, values, ranges=ranges, sides=sides)


def _offset_block(q_len: int, start: int, end: int, n: int, allowed, q, k, values, s0: int = 0, s1=None):
    """Rows ``start:end``, keys ``s0:s1`` (``0:n`` by default) of the bias laid out from ``values (heads, q_len + k_len
    - 1)`` (see :func:`_offset_bias_attention`), ``-inf`` where not allowed: ``(1 or batch, heads, end - start, s1 -
    s0)``; ``allowed`` covers those keys."""
    s1 = n if s1 is None else s1
    return _OffsetRows.apply(values[:, q_len - end + s0 : q_len - start + s1 - 1], s1 - s0, allowed)


class _OffsetRows(torch.autograd.Function):
    """``window (heads, rows + n - 1) -> (1 or batch, heads, rows, n)``, ``out[.., h, i, j] = window[h, j - i + rows - 1]``
    (``-inf`` where ``allowed`` is False): the window's overlapping slices of length ``n``, last row first.  The
    backward pass sums the gradient along each diagonal (:func:`~posenc_lib.utils.diagonal_sums`)."""

    @staticmethod
    def forward(ctx, window, n: int, allowed):
        out = window.unfold(-1, n, 1).flip(-2)[None]
        if allowed is not None:
            out = fill_closed_(out, allowed, float("-inf")) if allowed.shape[0] == 1 else out.masked_fill(~allowed, float("-inf"))
        ctx.save_for_backward(allowed)
        return out

    @staticmethod
    def backward(ctx, grad):
        (allowed,) = ctx.saved_tensors
        if allowed is not None:
            grad = fill_closed_(grad.clone(), allowed, 0.0)
        return diagonal_sums(grad.sum(0) if grad.shape[0] > 1 else grad[0]), None, None


def _block_context(pos, ctx, allowed, start: int, end: int, k_len: int):
    """``(ctx_b, rows, n)`` for query block ``start:end`` of a score-term scheme: its context, its rows of the
    boolean mask and ``n``, one past the last key it may see; the keys after ``n`` are dropped from the context
    where the scheme can (``key_slice``), else the block runs against all ``k_len`` keys."""
    ctx_b, (rows, n) = pos.query_slice(ctx, start, end), _block_keys(allowed, start, end, k_len)
    trimmed = pos.key_slice(ctx_b, n) if n < k_len else None
    if trimmed is not None:
        return trimmed, rows, n
    return ctx_b, _rows(allowed, start, end), k_len  # a scheme that cannot drop keys: all of them


def _shared_parts_attention(pos, q, k, v, ctx, layer: int, attn, scale: float, allowed, blocks) -> torch.Tensor:
    """Attention over query blocks in the fused kernel for a scheme whose score terms are built from ``q``, ``k``
    and parts made once for the whole call (``block_parts``: DeBERTa's projected relative tables, the same for every
    block; XLNet's projected distances, a block's rows of them): the parts are made once per layer and every block
    runs in one autograd node (:func:`cpu_flash.flash_blocks`), its mask built from its rows of ``q``, the keys it
    can see and its share of the parts, again in the backward pass.  Against a node per block with its parts made
    for it (whole step, median of 6-8 interleaved repeats over ``none``'s): DeBERTa at L = 1024 1.96 -> 1.83 and
    2.03 -> 1.90 at batch 1 (two runs), 1.82 -> 1.79 and 1.90 -> 1.88 at batch 2; XLNet 1.92 -> 1.67 at batch 1 and
    1.90 -> 1.79 at batch 2, L = 1024, 2.24 -> 2.07 at batch 1, L = 2048.

    A scheme with ``side_terms`` (DeBERTa) has its keys beyond the clipping distance of every row of a block
    (``block_sides``) run in the kernel without a mask (see :func:`cpu_flash.flash_blocks`); only the strip between
    lays out its terms."""
    k_len = k.shape[2]
    spans, contexts, masks, ranges, edges = [], [], [], [], []
    for start, end in blocks:
        ctx_b, rows, n = _block_context(pos, ctx, allowed, start, end, k_len)
        s0, s1, edge = _side_split(pos, ctx_b, rows, n)
        spans.append((start, end, n))
        ranges.append((s0, s1))
        edges.append(edge)
        if (s0, s1) != (0, n):
            ctx_b, rows = pos.key_range(ctx_b, s0, s1), None if rows is None else rows[..., s0:s1]
        contexts.append(ctx_b)
        masks.append(rows)

    parts = pos.score_parts(q, ctx, layer, attn)
    q_kernel = q if getattr(pos, "kernel_queries", None) is None else pos.kernel_queries(q, parts)  # XLNet's q + u
    split = any(r != (0, n) for r, (_, _, n) in zip(ranges, spans))
    b, h = q.shape[:2]
    rows = max(end - start for start, end, _ in spans)
    per_row = h * max((s1 - s0) * rows for s0, s1 in ranges)  # a block's laid-out scores per batch row
    chunk = b
    if BATCH_CHUNK_ELEMENTS is not None:
        limit = BATCH_CHUNK_ELEMENTS if BLOCK_ELEMENTS is None else min(BATCH_CHUNK_ELEMENTS, BLOCK_ELEMENTS)
        chunk = max(1, min(b, limit // per_row))
    work = {}  # score-sized buffers a scheme's mask_from_parts reuses across one pass's blocks

    def sides(i, q, k, *parts):
        (start, end, n), (s0, s1) = spans[i], ranges[i]
        parts, q_b = pos.block_parts(parts, ctx, start, end, n), q[:, :, start:end]
        outer = [(0, 0, s0, edges[i][0]), (1, s1, n, edges[i][1])]
        return [(slot, a, z, *pos.side_terms(q_b, parts, edge, scale)) for slot, a, z, edge in outer if z > a]

    def chunk_of_rows(qk_c, q_c, k_c, v_c, masks_c):  # one chunk of batch rows (BATCH_CHUNK_ELEMENTS)
        def build(i, q, k, *parts):
            (start, end, n), (s0, s1) = spans[i], ranges[i]
            parts = pos.block_parts(parts, ctx, start, end, n)
            return _mask_from_parts(pos, contexts[i], scale, masks_c[i], q[:, :, start:end], k[:, :, s0:s1], *parts, work=work)

        return cpu_flash.flash_blocks(qk_c, k_c, v_c, scale, spans, build, q_c, k_c, *parts, ranges=ranges if split else None,
                                      sides=sides if split else None, work=work)  # fmt: skip

    return _in_batch_chunks(chunk_of_rows, chunk, q_kernel, q, k, v, masks)


def _batch_chunk(q: torch.Tensor, rows: int, k_len: int) -> int:
    """Batch rows per chunk of a fused training call whose blocks of ``rows`` queries lay out (or, in the backward
    pass, write out) scores for ``k_len`` keys: at most :data:`BATCH_CHUNK_ELEMENTS` scores a block, at least one
    batch row (the whole batch where that is ``None``)."""
    b, h = q.shape[:2]
    if BATCH_CHUNK_ELEMENTS is None:
        return b
    return max(1, min(b, BATCH_CHUNK_ELEMENTS // (h * rows * k_len)))


def _in_batch_chunks(fn, chunk: int, *args):
    """``fn(*args)`` over chunks of ``chunk`` batch rows, joined; the first argument has the whole batch ``b``.  Each
    argument is a tensor of batch ``b`` (sliced), of batch 1 or ``None`` (passed as it is), or a list of those."""
    b = args[0].shape[0]
    if chunk >= b:
        return fn(*args)
    cut = lambda t, c0, c1: t if t is None or t.shape[0] == 1 else t[c0:c1]  # noqa: E731
    outs = []
    for c0 in range(0, b, chunk):
        c1 = min(c0 + chunk, b)
        outs.append(fn(*([cut(t, c0, c1) for t in a] if isinstance(a, list) else cut(a, c0, c1) for a in args)))
    return torch.cat(outs)


def _shares_parts(pos, bias) -> bool:
    """The call runs through :func:`_shared_parts_attention`: score terms built per block from parts made once."""
    return bias is None and getattr(pos, "score_parts", None) is not None and getattr(pos, "block_parts", None) is not None


def _fused_rows(pos) -> int:
    """Query rows per block of a training call on the fused CPU path (:data:`SIDED_BLOCK_ROWS` for a scheme with
    ``clipped_sides``, else :data:`FUSED_BLOCK_ROWS`)."""
    if SIDED_BLOCK_ROWS is not None and pos is not None and pos.clipped_sides:
        return SIDED_BLOCK_ROWS
    return FUSED_BLOCK_ROWS


def _side_split(pos, ctx_b, rows, n: int):
    """``(s0, s1, edges)`` for one query block of a scheme with ``side_terms``: keys ``0:s0`` and ``s1:n`` run without
    a mask (all allowed, each range at one relative index, ``edges``: what ``side_terms`` needs of each range), keys
    ``s0:s1`` with their terms laid out; ``(0, n, None)`` where nothing is split off."""
    least = cpu_flash.SIDE_MIN_KEYS
    if getattr(pos, "side_terms", None) is None or least is None:
        return 0, n, None
    lo, hi, edges = pos.block_sides(ctx_b)
    s0 = lo if lo >= least and (rows is None or bool(rows[..., :lo].all())) else 0
    s1 = hi if n - hi >= least and (rows is None or bool(rows[..., hi:].all())) else n
    if (s0, s1) == (0, n) or s1 <= s0:
        return 0, n, None
    return s0, s1, edges


def _mask_from_parts(pos, ctx, scale: float, allowed, q, k, *parts, work=None) -> torch.Tensor:
    """A block's float mask for :func:`cpu_flash.flash_scores`: the scheme's score terms, scaled, ``-inf`` where not
    allowed (by the scheme's own ``mask_from_parts`` where it has one, its score-sized tensors in ``work``)."""
    if getattr(pos, "mask_from_parts", None) is not None:
        return pos.mask_from_parts(q, k, parts, ctx, scale, allowed, work)
    mask = pos.scores_from_parts(q, k, parts, ctx, scale=scale).float()  # a fresh tensor: filled in place
    return mask if allowed is None else fill_closed_(mask, allowed, float("-inf"))


def _cpu_flash_wanted(pos, q: torch.Tensor, p_drop: float) -> bool:
    """The fused CPU path for a blocked call (see :data:`CPU_FLASH`): a score or bias scheme; one with a
    value term only when it brings its own ``fused_cpu_attention`` (Shaw) and no bias."""
    if not (CPU_FLASH and pos is not None and (pos.adds_scores or pos.adds_bias) and cpu_flash.supported(q, p_drop)):
        return False
    return not pos.adds_values or (getattr(pos, "fused_cpu_attention", None) is not None and not pos.adds_bias)


def _flush_pays(q: torch.Tensor, k_len: int, p_drop: float) -> bool:
    """A fused call that runs with denormals flushed (:data:`FLUSH_MIN_ELEMENTS`): float32 on CPU, no dropout."""
    b, h, q_len, _ = q.shape
    return (
        FLUSH_MIN_ELEMENTS is not None and b * h * q_len * k_len >= FLUSH_MIN_ELEMENTS
        and cpu_flash.supported(q, p_drop)
    )  # fmt: skip


def _fused_pays(pos, q: torch.Tensor, k_len: int, p_drop: float) -> bool:
    """A call below :data:`BLOCK_ELEMENTS` takes the fused CPU path: gradients on, scores of at
    least :data:`FUSED_MIN_ELEMENTS` elements, and a scheme and tensor it serves (:func:`_cpu_flash_wanted`)."""
    b, h, q_len, _ = q.shape
    return (
        FUSED_MIN_ELEMENTS is not None and b * h * q_len * k_len >= FUSED_MIN_ELEMENTS and torch.is_grad_enabled()
        and _cpu_flash_wanted(pos, q, p_drop)
    )  # fmt: skip


def _flex_wanted(pos, want_weights: bool, p_drop: float, q_len: int) -> bool:
    """FlexAttention for a score-modifying scheme, only when switched on (``POSENC_FLEX=1``, see flex.py)."""
    if pos is None or want_weights or p_drop or q_len == 1 or not (pos.adds_scores or pos.adds_bias):
        return False
    from .flex import use_flex

    return use_flex()


def _block_keys(allowed: torch.Tensor | None, start: int, end: int, k_len: int):
    """``(rows, n)``: the boolean mask of query rows ``start:end`` for keys ``0:n`` and ``n``, one past the
    last key any of those rows may see (a causal block needs no key after its last query)."""
    rows = _rows(allowed, start, end)
    n = _last_key(rows, k_len)
    return (rows if n == k_len else rows[..., :n]), n


def _last_key(allowed: torch.Tensor | None, k_len: int) -> int:
    """One past the last key that any row of the boolean ``allowed (..., rows, k_len)`` may see
    (``k_len`` when nothing is masked); read on the host, for the CPU path only."""
    if allowed is None or allowed.shape[-1] != k_len:
        return k_len
    seen = allowed.reshape(-1, k_len).any(0).nonzero()
    return int(seen[-1]) + 1 if seen.numel() else k_len


def _rows(t: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
    """Query rows ``start:end`` of a mask or bias broadcastable to ``(..., q_len, k_len)``."""
    if t is None or t.dim() < 2 or t.shape[-2] == 1:
        return t
    return t[..., start:end, :]
