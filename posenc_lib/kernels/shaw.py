"""Shaw's scheme in the fused CPU kernel (:func:`~posenc_lib.attention.cpu_flash.shaw_attention`): both terms over
blocks of queries, the key term in the kernel's mask and the value term from its row log-sum-exp; the keys beyond the
clipping distance of every row of a block (all at the table's first or last row) run without a mask.

Registered as Shaw's own kernel for the ``cpu_values`` backend of :mod:`posenc_lib.attention.backends`.
"""
from __future__ import annotations

from ..attention import backends, cpu_flash
from ..attention.blocks import block_keys
from ..attention.layer import on_host
from ..schemes.shaw import ShawPlan, ShawRelative, shaw_plan


def shaw_sides(plan: ShawPlan) -> tuple[int, int]:
    """``(lo, hi)``: keys ``0:lo`` are at the table's first row in every query row of ``plan``, keys ``hi:Lk`` at its
    last (``(0, Lk)`` off the CPU: no host read); worked out once per plan."""
    if "sides" not in plan.subs:
        index, lk = plan.index, plan.index.shape[1]
        lo, hi = 0, lk
        if on_host(index) and index.numel():
            lo = int((index == 0).all(0).cumprod(0).sum())
            hi = max(lo, lk - int((index == plan.rows - 1).all(0).flip(0).cumprod(0).sum()))
        plan.subs["sides"] = lo, hi
    return plan.subs["sides"]


def shaw_sub_plan(plan: ShawPlan, start: int, end: int) -> ShawPlan:
    """The plan of keys ``start:end`` of ``plan``'s index (built once per plan and key range)."""
    if (start, end) == (0, plan.index.shape[1]):
        return plan
    if (start, end) not in plan.subs:
        plan.subs[start, end] = shaw_plan(plan.index[:, start:end], plan.rows)
    return plan.subs[start, end]


def shaw_split(plan: ShawPlan, allowed):
    """``(s0, s1, strip, allowed)`` of a block for :func:`~posenc_lib.attention.cpu_flash.shaw_attention`: the keys
    ``s0:s1`` whose mask and weights are laid out (the strip: its plan and rows of the boolean mask); keys ``0:s0``
    and ``s1:n`` are all at the table's first and last row (:func:`shaw_sides`) and allowed for every row, so they run
    in the kernel without a mask.  A range shorter than :data:`~posenc_lib.attention.cpu_flash.SIDE_MIN_KEYS` or
    holding a masked key stays in the strip."""
    n, (lo, hi) = plan.index.shape[1], shaw_sides(plan)
    least = n + 1 if cpu_flash.SIDE_MIN_KEYS is None else cpu_flash.SIDE_MIN_KEYS
    s0 = lo if lo >= least and (allowed is None or bool(allowed[..., :lo].all())) else 0
    s1 = hi if n - hi >= least and (allowed is None or bool(allowed[..., hi:].all())) else n
    if (s0, s1) == (0, n) or s1 <= s0:  # nothing split off, or no strip left
        return 0, n, plan, allowed
    return s0, s1, shaw_sub_plan(plan, s0, s1), None if allowed is None else allowed[..., s0:s1]


def shaw_fused_attention(scheme: ShawRelative, q, k, v, prep, layer: int, scale: float, allowed, blocks):
    """Attention over query ``blocks`` with both of Shaw's terms in the fused CPU kernel."""
    parts = []
    for start, end in blocks:
        rows, k_end = block_keys(allowed, start, end, k.shape[2])  # a causal block: keys up to its last query
        plan = scheme.block_plan(prep, start, end, k_end)
        parts.append((start, end, plan, rows, shaw_split(plan, rows)))
    return cpu_flash.shaw_attention(q, k, v, scheme.table_k[layer], scheme.table_v[layer], scale, parts)


backends.register_value_kernel(ShawRelative, shaw_fused_attention)
