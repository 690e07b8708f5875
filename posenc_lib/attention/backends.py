"""How an attention call is computed: the backends, the one function that picks among them, and the thresholds it
reads.

:class:`~posenc_lib.attention.layer.MultiHeadAttention` projects, rotates and caches, then hands the call
(:class:`AttentionCall`) to :func:`select_backend`, which returns a :class:`Selection`: the name of a backend in
:data:`BACKENDS` and what it needs (query blocks, batch chunks, a bias's values per offset).  Every backend computes
the same function as ``explicit`` (``varlen`` at every token: a padding query's row, which nothing reads, sees the
row's pads); which one runs is a question of speed and memory alone.

* ``sdpa``: ``scaled_dot_product_attention``, the bias and masks as one float ``attn_mask`` (no score or value
  terms); a large call with a bias flushes denormal floats (``flush_min_elements``);
* ``explicit``: the scores, the scheme's terms and the softmax written out (weights wanted, or score/value terms
  and nothing faster applies);
* ``blocks``: ``sdpa`` or ``explicit`` over blocks of queries, each checkpointed when gradients flow
  (``block_elements``): memory holds one block of scores;
* ``flex``: FlexAttention (:mod:`posenc_lib.attention.flex`), only with ``POSENC_FLEX=1``;
* ``varlen``: a padded call of a scheme that adds nothing to the scores, its rows' tokens and pads as sequences of
  their own, so that a GPU runs flash's variable-length kernel without a mask (:mod:`posenc_lib.attention.varlen`),
  only with ``tune(varlen=True)``;
* ``cpu_mask``: the fused CPU kernel with the bias and masks as one float mask whose gradient it computes
  (:mod:`posenc_lib.attention.cpu_flash`), over query blocks; ``cpu_mask_blocks``: the same, one kernel call per
  block (score terms written out per block, or a padded batch's mask);
* ``cpu_whole_offsets``: a learned bias per offset on the whole mask, its gradient summed per diagonal;
* ``cpu_values``: a scheme's own fused CPU kernel for its score and value terms (:func:`register_value_kernel`);
* ``cpu_offsets``, ``cpu_shared_parts``, ``cpu_parts``: registered by :mod:`posenc_lib.kernels` (a bias of one value
  per offset laid out block by block; score terms built per block from parts made once per layer, or per block).

The ``cpu_*`` backends run only for float32 CPU tensors without dropout (:func:`cpu_flash.supported`), in training
calls large enough to pay (:class:`AttentionTuning`) or too large to keep whole scores; decoding steps of one query
take their own short paths (:mod:`posenc_lib.attention.step`) before any of this.  How the thresholds were measured:
benchmarks/README.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import cpu_flash, varlen
from .blocks import block_keys, in_batch_chunks, mask_rows
from .by_class import for_class
from ..checks import check_bool, check_positive_int


@dataclass(frozen=True)
class AttentionTuning:
    """Every size threshold :func:`select_backend` reads (elements counted as ``batch * heads * q_len * k_len``)."""

    #: a call whose scores would exceed this and be kept for the backward pass runs over query blocks; each block's
    #: scores are built, used and dropped (checkpointed with gradients on).  ``None``: never.  2**24 = 64 MiB float32
    block_elements: int | None = 2**24
    #: a blocked CPU call (float32, no dropout) runs in the fused kernel with the position terms as a float mask whose
    #: gradient :mod:`~posenc_lib.attention.cpu_flash` computes; ``False`` keeps the written-out blocks everywhere
    cpu_flash: bool = True
    #: a CPU training call from this size takes the fused path even below ``block_elements`` (there it is as fast as
    #: the explicit softmax and keeps no scores); the course's small models stay explicit.  ``None``: only blocked calls
    fused_min_elements: int | None = 2**21
    #: a fused SDPA call on CPU with a bias from this size runs with denormals flushed (ALiBi's distant keys make
    #: denormal weights, tens of times slower on x86).  ``None``: never
    flush_min_elements: int | None = 2**20
    #: query rows per block of a training call on the fused CPU path (fewer where ``block_elements`` asks), so that a
    #: causal block runs against only the keys up to its last query
    fused_block_rows: int = 128
    #: the same for a scheme whose fused path runs the keys beyond its clipping distance without a mask (Shaw,
    #: DeBERTa: ``clipped_sides``), where longer blocks make the laid-out strip a smaller share.  ``None``: the above
    sided_block_rows: int | None = 256
    #: a fused training call of a scheme whose blocks lay out terms from parts (XLNet, DeBERTa), offsets (T5) or tables
    #: (Shaw) runs its batch rows in chunks whose blocks lay out at most this many scores.  ``None``: the whole batch
    batch_chunk_elements: int | None = 2**23
    #: a padded call of a scheme without a bias, score or value term runs as variable-length sequences
    #: (:mod:`~posenc_lib.attention.varlen`): on a GPU in flash's variable-length kernel (float16/bfloat16), on CPU
    #: through its reference (for tests).  ``False`` (the default): the padded call with its boolean mask
    varlen: bool = False

    def __post_init__(self):
        check_bool("cpu_flash", self.cpu_flash)
        check_bool("varlen", self.varlen)
        check_positive_int("fused_block_rows", self.fused_block_rows)
        for f in fields(self):
            if f.name not in ("cpu_flash", "varlen", "fused_block_rows") and getattr(self, f.name) is not None:
                check_positive_int(f.name, getattr(self, f.name))


#: the thresholds in force; :func:`tune` replaces it (tests and benchmarks set single fields through it)
TUNING = AttentionTuning()


def tune(**changes) -> AttentionTuning:
    """Set fields of :data:`TUNING` (``tune(block_elements=None)``); returns the new one.  An unknown field is named
    with the valid ones."""
    global TUNING
    known = [f.name for f in fields(AttentionTuning)]
    for name in changes:
        if name not in known:
            raise ValueError(f"unknown attention tuning field {name!r}; valid choices: {', '.join(known)}")
    TUNING = replace(TUNING, **changes)
    return TUNING


@dataclass
class AttentionCall:
    """One attention call after projection, rotation and the cache: ``q (batch, heads, q_len, head_dim)``, ``k, v
    (batch, heads, k_len, head_dim)``, the boolean ``allowed`` mask, the scheme and its context, the path
    (:func:`~posenc_lib.attention.layer.choose_attention_path`), scale and dropout.  ``bias``: the scheme's bias,
    set by :func:`select_backend` unless the selected backend lays it out itself.  ``key_padding_mask (batch, k_len)``:
    the call's padding (True at pads), also part of ``allowed``; ``self_attention``: the keys are the queries' own
    tokens (else the memory of cross-attention)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    allowed: torch.Tensor | None
    scheme: Any
    prep: dict | None
    layer: int
    attn: Any
    path: Any
    scale: float
    p_drop: float
    want_weights: bool
    bias: torch.Tensor | None = None
    key_padding_mask: torch.Tensor | None = None
    self_attention: bool = True


@dataclass(frozen=True, eq=False)
class Selection:
    """What :func:`select_backend` chose: the ``backend`` (a key of :data:`BACKENDS`), its query ``blocks`` (ranges),
    batch rows per ``chunk`` (``cpu_shared_parts``: at most ``chunk_elements`` laid-out scores a block instead) and a
    bias's ``values`` per offset, where the backend uses them."""

    backend: str
    blocks: list | None = None
    chunk: int | None = None
    values: torch.Tensor | None = None
    chunk_elements: int | None = None


# -- the choice ---------------------------------------------------------------------------------------------------
def select_backend(call: AttentionCall, tuning: AttentionTuning | None = None) -> Selection:
    """The backend for ``call`` under ``tuning`` (default :data:`TUNING`), from what the scheme declares, the call's
    shape, device, dtype, dropout and whether gradients flow.  Sets ``call.bias`` (the scheme's bias) unless the
    selected backend lays the bias out itself (``cpu_offsets``)."""
    t = TUNING if tuning is None else tuning
    scheme, q, k_len, p_drop = call.scheme, call.q, call.k.shape[2], call.p_drop
    if not call.want_weights and (chosen := offset_selection(call, t)) is not None:
        return chosen
    call.bias = bias = scheme.bias(call.prep, call.layer) if scheme is not None else None
    if varlen_wanted(call, t):
        return Selection("varlen")
    if flex_wanted(scheme, call.want_weights, p_drop, q.shape[2]):
        return Selection("flex")
    blocks = None if call.want_weights else query_blocks(scheme, q, k_len, call.path, bias, p_drop, t)
    if blocks is None:
        return Selection("sdpa" if call.path.fused else "explicit")
    if not cpu_flash_wanted(scheme, q, p_drop, t):
        return Selection("blocks", blocks)
    if scheme.adds_values:  # the scheme's own kernel computes its value term from the kernel's lse
        return Selection("cpu_values", blocks, batch_chunk(q, fused_rows(scheme, t), k_len, t))
    if shares_parts(scheme, bias):
        limit = t.batch_chunk_elements
        if limit is not None and t.block_elements is not None:
            limit = min(limit, t.block_elements)
        return Selection("cpu_shared_parts", blocks, chunk_elements=limit)
    if bias is None and scheme.score_parts is not None:
        return Selection("cpu_parts", blocks)
    shared = not scheme.adds_scores and (call.allowed is None or call.allowed.shape[0] == 1)
    if shared and not call.path.causal_mask and (values := learned_offsets(scheme, call.prep, bias)) is not None:
        # a non-causal call with a learned bias per offset (T5's encoder from batch 2): one fused call, the gradient
        # summed per diagonal block by block, never a whole gradient of the bias
        return Selection("cpu_whole_offsets", None, batch_chunk(q, t.fused_block_rows, k_len, t), values)
    return Selection("cpu_mask" if shared else "cpu_mask_blocks", blocks)


def shares_parts(scheme, bias) -> bool:
    """Score terms built per block from parts made once per layer (``score_parts`` and ``block_parts``: DeBERTa,
    XLNet), where the call has no bias: the ``cpu_shared_parts`` backend."""
    return bias is None and scheme.score_parts is not None and scheme.block_parts is not None


#: a scheme's own fused CPU kernel for its score and value terms, by scheme class (:func:`register_value_kernel`):
#: ``kernel(scheme, q, k, v, prep, layer, scale, allowed, blocks) -> out``
VALUE_KERNELS: dict[type, Callable] = {}


def register_value_kernel(scheme_class: type, kernel: Callable) -> None:
    """Give ``scheme_class`` (and its subclasses that keep its terms) a fused CPU kernel for its score and value terms,
    run by the ``cpu_values`` backend (Shaw's: :mod:`posenc_lib.kernels.shaw`)."""
    if not isinstance(scheme_class, type) or not callable(kernel):
        raise TypeError(f"register_value_kernel(scheme_class: type, kernel: callable), got "
                        f"{type(scheme_class).__name__}, {type(kernel).__name__}")  # fmt: skip
    VALUE_KERNELS[scheme_class] = kernel


def cpu_flash_wanted(scheme, q: torch.Tensor, p_drop: float, tuning: AttentionTuning | None = None) -> bool:
    """The fused CPU path for a blocked call: a score or bias scheme on a float32 CPU tensor without dropout; one with
    a value term only when it has its own kernel (:data:`VALUE_KERNELS`: Shaw's) and no bias."""
    t = TUNING if tuning is None else tuning
    if not (t.cpu_flash and scheme is not None and (scheme.adds_scores or scheme.adds_bias) and cpu_flash.supported(q, p_drop)):
        return False
    return not scheme.adds_values or (for_class(VALUE_KERNELS, scheme) is not None and not scheme.adds_bias)


def fused_pays(scheme, q: torch.Tensor, k_len: int, p_drop: float, t: AttentionTuning) -> bool:
    """A call below ``block_elements`` takes the fused CPU path: gradients on, scores of at least
    ``fused_min_elements``, and a scheme and tensor it serves (:func:`cpu_flash_wanted`)."""
    b, h, q_len, _ = q.shape
    return (
        t.fused_min_elements is not None and b * h * q_len * k_len >= t.fused_min_elements and torch.is_grad_enabled()
        and cpu_flash_wanted(scheme, q, p_drop, t)
    )  # fmt: skip


def flush_pays(q: torch.Tensor, k_len: int, p_drop: float, t: AttentionTuning) -> bool:
    """A fused call that runs with denormals flushed (``flush_min_elements``): float32 on CPU, no dropout."""
    b, h, q_len, _ = q.shape
    return (
        t.flush_min_elements is not None and b * h * q_len * k_len >= t.flush_min_elements
        and cpu_flash.supported(q, p_drop)
    )  # fmt: skip


def flex_wanted(scheme, want_weights: bool, p_drop: float, q_len: int) -> bool:
    """FlexAttention for a score-modifying scheme, only when switched on (``POSENC_FLEX=1``, see flex.py)."""
    if scheme is None or want_weights or p_drop or q_len == 1 or not (scheme.adds_scores or scheme.adds_bias):
        return False
    from .flex import use_flex

    return use_flex()


def varlen_wanted(call: AttentionCall, t: AttentionTuning) -> bool:
    """The ``varlen`` backend: switched on (``varlen``), a padded call without weights wanted, of a scheme that adds
    nothing to the scores, self-attention over its own ``q_len == k_len`` tokens or cross-attention, on a device and
    dtype it serves (:func:`~posenc_lib.attention.varlen.supported`)."""
    scheme = call.scheme
    if not t.varlen or call.key_padding_mask is None or call.want_weights:
        return False
    if scheme is not None and (scheme.adds_bias or scheme.adds_scores or scheme.adds_values):
        return False
    if (call.q.shape[2] != call.k.shape[2]) if call.self_attention else call.path.causal_mask:
        return False  # self-attention with cached keys; a causal cross-attention
    return varlen.supported(call.q, call.k, call.key_padding_mask)


def fused_rows(scheme, t: AttentionTuning) -> int:
    """Query rows per block of a training call on the fused CPU path (``sided_block_rows`` for a scheme with
    ``clipped_sides``, else ``fused_block_rows``)."""
    if t.sided_block_rows is not None and scheme is not None and scheme.clipped_sides:
        return t.sided_block_rows
    return t.fused_block_rows


def batch_chunk(q: torch.Tensor, rows: int, k_len: int, t: AttentionTuning) -> int:
    """Batch rows per chunk of a fused training call whose blocks of ``rows`` queries lay out (or, in the backward
    pass, write out) scores for ``k_len`` keys: at most ``batch_chunk_elements`` scores a block, at least one batch
    row (the whole batch where that is ``None``)."""
    b, h = q.shape[:2]
    if t.batch_chunk_elements is None:
        return b
    return max(1, min(b, t.batch_chunk_elements // (h * rows * k_len)))


def query_blocks(scheme, q, k_len: int, path, bias, p_drop: float = 0.0, tuning: AttentionTuning | None = None):
    """Query ranges for attention in blocks, or ``None`` for one piece.

    Blocks only pay where whole scores would otherwise be kept: the explicit path, or a fused call whose float mask
    needs a gradient (SDPA then falls back to its materialising math path).  A training call below
    ``block_elements`` but at least ``fused_min_elements`` runs in blocks of :func:`fused_rows` queries, so that it
    takes the fused CPU path; a blocked training call on that path uses blocks of at most that many rows too."""
    t = TUNING if tuning is None else tuning
    b, h, q_len, _ = q.shape
    grad_bias = bias is not None and bias.requires_grad and torch.is_grad_enabled()
    if path.fused and not grad_bias:
        return None
    if scheme is not None and (scheme.adds_scores or scheme.adds_values) and not scheme.splits_queries:
        return None
    if t.block_elements is None or b * h * q_len * k_len <= t.block_elements:
        if not fused_pays(scheme, q, k_len, p_drop, t):
            return None
        rows = fused_rows(scheme, t)
    else:
        rows = max(1, t.block_elements // (b * h * k_len))
        if rows >= q_len:
            return None
        if torch.is_grad_enabled() and cpu_flash_wanted(scheme, q, p_drop, t):  # training: causal blocks pay
            if shares_parts(scheme, bias) or scheme.adds_values:
                # its batch rows run in chunks (shared parts, Shaw's): a block holds one chunk's rows
                rows = max(1, t.block_elements // (batch_chunk(q, fused_rows(scheme, t), k_len, t) * h * k_len))
            rows = min(rows, fused_rows(scheme, t))
    return [(s, min(s + rows, q_len)) for s in range(0, q_len, rows)]


def offset_selection(call: AttentionCall, t: AttentionTuning) -> Selection | None:
    """``cpu_offsets`` where it applies, else ``None``: a causal training call on the fused CPU path (one that pays,
    :func:`fused_pays`, or one above ``block_elements``) whose scheme has one bias value per offset ``j - i``
    (``offset_bias``: T5 and ALiBi over large windows of consecutive positions), or a non-causal one of batch 1 with
    learned values (T5's encoder; from batch 2 it takes ``cpu_whole_offsets``).  Each block of ``fused_block_rows``
    queries lays out its own rows of the bias for the keys it can see."""
    scheme, prep, q, k_len, p_drop = call.scheme, call.prep, call.q, call.k.shape[2], call.p_drop
    offset_bias = None if scheme is None else scheme.offset_bias
    if offset_bias is None or prep is None or not torch.is_grad_enabled():
        return None
    if flex_wanted(scheme, False, p_drop, q.shape[2]) or not cpu_flash_wanted(scheme, q, p_drop, t):
        return None
    b, h, q_len, _ = q.shape
    above = t.block_elements is not None and b * h * q_len * k_len > t.block_elements
    if not above and not fused_pays(scheme, q, k_len, p_drop, t):
        return None
    values = offset_bias(prep)
    if values is None or not (call.path.causal_mask or (b == 1 and values.requires_grad)):  # see above
        return None
    chunk = batch_chunk(q, t.fused_block_rows, k_len, t) if values.requires_grad else b
    rows = min(t.fused_block_rows, max(1, t.block_elements // (chunk * h * k_len))) if above else t.fused_block_rows
    return Selection("cpu_offsets", [(s, min(s + rows, q_len)) for s in range(0, q_len, rows)], chunk, values)


def learned_offsets(scheme, prep, bias) -> torch.Tensor | None:
    """The values per offset ``(heads, q_len + k_len - 1)`` the whole ``bias`` was laid out from, where the scheme's
    context has them and they need a gradient (T5 over a large window of consecutive positions); else ``None``."""
    offset_bias = scheme.offset_bias
    if offset_bias is None or bias is None or not bias.requires_grad:
        return None
    values = offset_bias(prep)
    return values if values is not None and values.requires_grad else None


# -- the backends -------------------------------------------------------------------------------------------------
def sdpa(q, k, v, allowed, bias, path, scale: float, p_drop: float, tuning: AttentionTuning | None = None):
    """``scaled_dot_product_attention`` with the bias and masks as one float mask (``is_causal`` where ``path`` says
    so); a large call with a bias on CPU flushes denormals (``flush_min_elements``)."""
    t = TUNING if tuning is None else tuning
    mask = allowed
    if bias is not None:
        mask = bias.to(q.dtype)  # built in float32; cast only where it enters the kernel
        if allowed is not None:
            mask = mask.masked_fill(~allowed, float("-inf"))
    if bias is not None and flush_pays(q, k.shape[2], p_drop, t):  # a bias: denormals flushed
        if not torch.is_grad_enabled():  # no backward pass: the kernel itself
            with cpu_flash.flush_denormals():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        if not mask.requires_grad:  # the same kernel, flushing in both passes
            mask = mask.expand(-1 if mask.shape[0] == q.shape[0] else 1, -1, q.shape[2], k.shape[2])
            return cpu_flash.flash_attention(q, k, v, mask, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=path.is_causal,
                                          scale=scale)  # fmt: skip


def explicit(q, k, v, allowed, bias, prep, scheme, layer: int, attn, scale: float, p_drop: float):
    """The scores ``(q k^T + scores) * scale + bias``, masked, the softmax and the scheme's value term written out:
    ``(out, weights)``."""
    extra = scheme.scores(q, k, prep, layer, attn) if scheme is not None else None
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
    if scheme is not None and scheme.adds_values:
        out = out + scheme.values(probs_d, prep, layer)
    return out, probs


def dense(q, k, v, allowed, bias, prep, scheme, layer: int, attn, path, scale: float, p_drop: float):
    """:func:`sdpa` where ``path`` is fused, else :func:`explicit`: ``(out, weights or None)``."""
    if path.fused:
        return sdpa(q, k, v, allowed, bias, path, scale, p_drop), None
    return explicit(q, k, v, allowed, bias, prep, scheme, layer, attn, scale, p_drop)


def _flash_mask(c: AttentionCall, q, allowed, bias, prep, blocks=None):
    """The fused CPU kernel with the score terms, bias and masks of ``q`` (all queries, or a block) as one float mask.
    ``blocks``: query ranges; each runs against the keys up to the last one its rows may see."""
    k_len = c.k.shape[2]
    extra = c.scheme.scores(q, c.k, prep, c.layer, c.attn) if c.scheme.adds_scores else None
    mask = extra.float().mul_(c.scale) if extra is not None else None
    if bias is not None:
        mask = bias.float() if mask is None else mask.add_(bias)
    if allowed is not None:
        mask = mask.masked_fill(~allowed, float("-inf"))
    if blocks is not None:
        blocks = [(s, e, block_keys(allowed, s, e, k_len)[1]) for s, e in blocks]
        if all(n == k_len for _, _, n in blocks):
            blocks = None
    return cpu_flash.flash_attention(q, c.k, c.v, mask, c.scale, blocks)


def _over_blocks(c: AttentionCall, blocks, attend) -> torch.Tensor:
    """``attend(q_block, allowed_rows, bias_rows, prep_block)`` over query ``blocks``, joined; each block checkpointed
    (its scores recomputed in the backward pass, not kept) where a gradient flows."""
    scheme = c.scheme
    remember = torch.is_grad_enabled() and (
        c.q.requires_grad or c.k.requires_grad or c.v.requires_grad
        or any(p.requires_grad for p in (scheme.parameters() if scheme is not None else ()))
        or (c.bias is not None and c.bias.requires_grad)
    )  # fmt: skip
    outs = []
    for start, end in blocks:
        args = (c.q[:, :, start:end], mask_rows(c.allowed, start, end), mask_rows(c.bias, start, end),
                scheme.query_slice(c.prep, start, end) if scheme is not None else c.prep)  # fmt: skip
        outs.append(checkpoint(attend, *args, use_reentrant=False) if remember else attend(*args))
    return torch.cat(outs, dim=2)


def _run_dense(c: AttentionCall, s: Selection):
    return dense(c.q, c.k, c.v, c.allowed, c.bias, c.prep, c.scheme, c.layer, c.attn, c.path, c.scale, c.p_drop)


def _run_blocks(c: AttentionCall, s: Selection):
    def attend(q, allowed, bias, prep):
        return dense(q, c.k, c.v, allowed, bias, prep, c.scheme, c.layer, c.attn, c.path, c.scale, c.p_drop)[0]

    return _over_blocks(c, s.blocks, attend), None


def _run_flex(c: AttentionCall, s: Selection):
    from . import flex

    return flex.flex_attend(c.scheme, c.q, c.k, c.v, c.prep, c.layer, c.attn, c.scale, c.allowed), None


def _run_varlen(c: AttentionCall, s: Selection):
    return varlen.attend(c.q, c.k, c.v, c.key_padding_mask, self_attention=c.self_attention,
                         causal=c.path.causal_mask, scale=c.scale, p_drop=c.p_drop), None


def _run_cpu_mask(c: AttentionCall, s: Selection):
    return _flash_mask(c, c.q, c.allowed, c.bias, c.prep, s.blocks), None


def _run_cpu_mask_blocks(c: AttentionCall, s: Selection):
    return _over_blocks(c, s.blocks, lambda q, allowed, bias, prep: _flash_mask(c, q, allowed, bias, prep)), None


def _run_cpu_values(c: AttentionCall, s: Selection):
    kernel = for_class(VALUE_KERNELS, c.scheme)

    def own(q, k, v, allowed):
        return kernel(c.scheme, q, k, v, c.prep, c.layer, c.scale, allowed, s.blocks)

    return in_batch_chunks(own, s.chunk, c.q, c.k, c.v, c.allowed), None


def _run_cpu_whole_offsets(c: AttentionCall, s: Selection):
    bias, allowed = c.bias.detach(), c.allowed
    mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
    whole = lambda q, k, v, mask: cpu_flash.flash_whole_offsets(q, k, v, mask, s.values, c.scale)  # noqa: E731
    return in_batch_chunks(whole, s.chunk, c.q, c.k, c.v, mask), None


#: every backend by name: ``fn(call, selection) -> (out (batch, heads, q_len, head_dim), weights or None)``; the
#: scheme kernels add theirs (:func:`register`)
BACKENDS: dict[str, Callable[[AttentionCall, Selection], tuple]] = {
    "sdpa": _run_dense,
    "explicit": _run_dense,
    "blocks": _run_blocks,
    "flex": _run_flex,
    "varlen": _run_varlen,
    "cpu_mask": _run_cpu_mask,
    "cpu_mask_blocks": _run_cpu_mask_blocks,
    "cpu_values": _run_cpu_values,
    "cpu_whole_offsets": _run_cpu_whole_offsets,
}


def register(name: str, backend: Callable[[AttentionCall, Selection], tuple]) -> None:
    """Add ``backend`` to :data:`BACKENDS` under ``name``: the scheme kernels (:mod:`posenc_lib.kernels`) register
    theirs (``cpu_offsets``, ``cpu_shared_parts``, ``cpu_parts``), as the attention package imports no kernel."""
    if not isinstance(name, str) or not callable(backend):
        raise TypeError(f"register(name: str, backend: callable), got {type(name).__name__}, {type(backend).__name__}")
    BACKENDS[name] = backend


def attend(call: AttentionCall, tuning: AttentionTuning | None = None):
    """``(out, weights or None)`` of ``call`` through the backend :func:`select_backend` picks."""
    selection = select_backend(call, tuning)
    return BACKENDS[selection.backend](call, selection)


def scale_of(head_dim: int, scheme) -> float:
    """The scores' scale ``1 / sqrt(head_dim * score_terms)``."""
    return 1.0 / math.sqrt(head_dim * (scheme.score_terms if scheme is not None else 1))
