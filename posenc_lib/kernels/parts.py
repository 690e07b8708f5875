"""Score terms built from parts in the fused CPU kernel: a scheme whose terms come from ``q``, ``k`` and a few small
tensors (``score_parts``: DeBERTa's projected relative tables, Transformer-XL's projected distances, CoPE's table)
has each query block's float mask built from them when the kernel needs it, in the forward pass and again in the
backward pass, so no whole ``(B, H, Lq, Lk)`` term is kept.

* :func:`shared_parts_attention`: parts made once per layer (``block_parts`` cuts a block's share), every block in
  one autograd node (DeBERTa, Transformer-XL); DeBERTa's keys beyond its clipping distance run without a mask;
* :func:`parts_attention`: parts made per block, a node per block (CoPE).

Registered as the backends ``cpu_shared_parts`` and ``cpu_parts`` of :mod:`posenc_lib.attention.backends`.
"""
from __future__ import annotations

import functools

import torch

from ..attention import backends, cpu_flash
from ..attention.blocks import block_keys, in_batch_chunks, mask_rows
from ..attention.by_class import for_class
from ..utils import fill_closed_


#: a scheme's own block masks for the fused kernel, by scheme class (:func:`register_block_mask`):
#: ``(mask(scheme, q, k, parts, prep, scale, allowed, work), queries(scheme, q, parts) or None)``
BLOCK_MASKS: dict[type, tuple] = {}


def register_block_mask(scheme_class: type, mask, queries=None) -> None:
    """Give ``scheme_class`` its own float mask of a query block (``mask``, its score-sized tensors in the buffers
    ``work`` kept for a pass) and, where a term enters through the kernel's own product instead, the kernel's
    ``queries`` (XLNet's ``q + u``: :mod:`posenc_lib.kernels.xlnet`)."""
    if not isinstance(scheme_class, type) or not callable(mask) or not (queries is None or callable(queries)):
        raise TypeError("register_block_mask(scheme_class: type, mask: callable, queries: callable or None)")
    BLOCK_MASKS[scheme_class] = mask, queries


def shared_parts_attention(scheme, q, k, v, prep, layer: int, attn, scale: float, allowed, blocks,
                           chunk_elements: int | None = None) -> torch.Tensor:
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
    lays out its terms.  ``chunk_elements``: the batch rows run in chunks whose blocks lay out at most this many
    scores (``None``: the whole batch at once)."""
    k_len = k.shape[2]
    spans, preps, masks, ranges, edges = [], [], [], [], []
    for start, end in blocks:
        prep_b, rows, n = block_prep(scheme, prep, allowed, start, end, k_len)
        s0, s1, edge = side_split(scheme, prep_b, rows, n)
        spans.append((start, end, n))
        ranges.append((s0, s1))
        edges.append(edge)
        if (s0, s1) != (0, n):
            prep_b, rows = scheme.key_range(prep_b, s0, s1), None if rows is None else rows[..., s0:s1]
        preps.append(prep_b)
        masks.append(rows)

    parts = scheme.score_parts(q, prep, layer, attn)
    own = for_class(BLOCK_MASKS, scheme)
    q_kernel = q if own is None or own[1] is None else own[1](scheme, q, parts)  # XLNet's q + u
    split = any(r != (0, n) for r, (_, _, n) in zip(ranges, spans))
    b, h = q.shape[:2]
    rows = max(end - start for start, end, _ in spans)
    per_row = h * max((s1 - s0) * rows for s0, s1 in ranges)  # a block's laid-out scores per batch row
    chunk = b
    if chunk_elements is not None:
        chunk = max(1, min(b, chunk_elements // per_row))
    work = {}  # score-sized buffers a scheme's own block mask reuses across one pass's blocks

    def sides(i, q, k, *parts):
        (start, end, n), (s0, s1) = spans[i], ranges[i]
        parts, q_b = scheme.block_parts(parts, prep, start, end, n), q[:, :, start:end]
        outer = [(0, 0, s0, edges[i][0]), (1, s1, n, edges[i][1])]
        return [(slot, a, z, *scheme.side_terms(q_b, parts, edge, scale)) for slot, a, z, edge in outer if z > a]

    def chunk_of_rows(qk_c, q_c, k_c, v_c, masks_c):  # one chunk of batch rows (chunk_elements)
        def build(i, q, k, *parts):
            (start, end, n), (s0, s1) = spans[i], ranges[i]
            parts = scheme.block_parts(parts, prep, start, end, n)
            return mask_from_parts(scheme, preps[i], scale, masks_c[i], q[:, :, start:end], k[:, :, s0:s1], *parts, work=work)

        return cpu_flash.flash_blocks(qk_c, k_c, v_c, scale, spans, build, q_c, k_c, *parts, ranges=ranges if split else None,
                                      sides=sides if split else None, work=work)  # fmt: skip

    return in_batch_chunks(chunk_of_rows, chunk, q_kernel, q, k, v, masks)


def parts_attention(scheme, q, k, v, prep, layer: int, attn, scale: float, allowed, blocks) -> torch.Tensor:
    """Attention over query blocks in the fused kernel for a scheme whose score terms are built from ``q``, ``k`` and
    parts made per block (``score_parts`` without ``block_parts``: CoPE's table): each block's mask is rebuilt from
    them in the backward pass (:func:`cpu_flash.flash_scores`), against the keys up to the last one it may see."""
    outs, k_len = [], k.shape[2]
    for start, end in blocks:
        prep_b, rows, k_end = block_prep(scheme, prep, allowed, start, end, k_len)
        build = functools.partial(mask_from_parts, scheme, prep_b, scale, rows)
        parts = scheme.score_parts(q, prep_b, layer, attn)
        kb, vb = k[:, :, :k_end], v[:, :, :k_end]
        outs.append(cpu_flash.flash_scores(q[:, :, start:end], kb, vb, scale, build, *parts))
    return torch.cat(outs, dim=2)


def block_prep(scheme, prep, allowed, start: int, end: int, k_len: int):
    """``(prep_b, rows, n)`` for query block ``start:end`` of a score-term scheme: its context, its rows of the
    boolean mask and ``n``, one past the last key it may see; the keys after ``n`` are dropped from the context
    where the scheme can (``key_slice``), else the block runs against all ``k_len`` keys."""
    prep_b, (rows, n) = scheme.query_slice(prep, start, end), block_keys(allowed, start, end, k_len)
    trimmed = scheme.key_slice(prep_b, n) if n < k_len else None
    if trimmed is not None:
        return trimmed, rows, n
    return prep_b, mask_rows(allowed, start, end), k_len  # a scheme that cannot drop keys: all of them


def side_split(scheme, prep_b, rows, n: int):
    """``(s0, s1, edges)`` for one query block of a scheme with ``side_terms``: keys ``0:s0`` and ``s1:n`` run without
    a mask (all allowed, each range at one relative index, ``edges``: what ``side_terms`` needs of each range), keys
    ``s0:s1`` with their terms laid out; ``(0, n, None)`` where nothing is split off."""
    least = cpu_flash.SIDE_MIN_KEYS
    if scheme.side_terms is None or least is None:
        return 0, n, None
    lo, hi, edges = scheme.block_sides(prep_b)
    s0 = lo if lo >= least and (rows is None or bool(rows[..., :lo].all())) else 0
    s1 = hi if n - hi >= least and (rows is None or bool(rows[..., hi:].all())) else n
    if (s0, s1) == (0, n) or s1 <= s0:
        return 0, n, None
    return s0, s1, edges


def mask_from_parts(scheme, prep, scale: float, allowed, q, k, *parts, work=None) -> torch.Tensor:
    """A block's float mask for :func:`cpu_flash.flash_scores`: the scheme's score terms, scaled, ``-inf`` where not
    allowed (by the scheme's own block mask where it has one, :data:`BLOCK_MASKS`, its score-sized tensors in
    ``work``)."""
    own = for_class(BLOCK_MASKS, scheme)
    if own is not None:
        return own[0](scheme, q, k, parts, prep, scale, allowed, work)
    mask = scheme.scores_from_parts(q, k, parts, prep, scale=scale).float()  # a fresh tensor: filled in place
    return mask if allowed is None else fill_closed_(mask, allowed, float("-inf"))


def _run_shared_parts(c, s):
    return shared_parts_attention(c.scheme, c.q, c.k, c.v, c.prep, c.layer, c.attn, c.scale, c.allowed, s.blocks,
                                  chunk_elements=s.chunk_elements), None  # fmt: skip


def _run_parts(c, s):
    return parts_attention(c.scheme, c.q, c.k, c.v, c.prep, c.layer, c.attn, c.scale, c.allowed, s.blocks), None


backends.register("cpu_shared_parts", _run_shared_parts)
backends.register("cpu_parts", _run_parts)
