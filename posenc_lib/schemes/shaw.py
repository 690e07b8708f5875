"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with
Relative Position Representations", arXiv:1803.02155).

Two learned tables per layer, shared by all heads (the paper's section 3.3 memory option,
used by its big model; its base model has one pair per layer and head), index the clipped distance
``clip(j - i, k)`` (``k`` = ``max_relative_position``, 2k+1 rows each; ``j - i``, key minus query, is
the paper's convention and the course's):

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d)          (eq. 4)
    z_i  = sum_j alpha_ij (v_j + a^V_ij)            (eq. 3)
    a^K_ij = w^K[clip(j - i, -k, k)],  a^V_ij = w^V[clip(j - i, -k, k)]

The paper's own implementation (section 3.3) builds ``a^K`` as an ``(L, L, d)`` tensor shared by
heads and batch (here the reference :func:`shaw_scores_naive`).  Here we never do:

* key term: ``q @ w^K.T`` gives every query's score against the 2k+1 table rows,
  ``S: (B, H, L, 2k+1)``; a gather with the clipped index matrix picks row
  ``clip(j - i)`` for each key ``j``.
* value term: the attention mass of query ``i`` on each clipped distance,
  ``M: (B, H, L, 2k+1)``, times ``w^V``.

The two operations are adjoint to each other (the gradient of the gather is a
"sum per distance" and vice versa), so both run through one pair of autograd
functions.  The sum per distance avoids a scatter-add: for a row ``i`` every
distance strictly inside ``(-k, k)`` is hit by at most one key, a small gather of
``(L, 2k-1)`` elements; only the two clipped ends collect many keys, and both
are masked row sums, done as one batched matrix product against a fixed
``(L_q, L_k, 2)`` 0/1 mask.  On CPU (one thread) the sum per distance alone is
about 2x faster than ``scatter_add_``; both terms, forward and backward together,
take about 2.1-2.4x the time of ``q @ k^T`` forward and backward, against about
6x for the naive ``(L, L, d)`` form (L = 256 and 1024, k = 16).  A skew in the
manner of the Music Transformer (Huang et al. 2018, arXiv:1809.04281) was measured
too: with clipping it first has to expand ``S`` to all ``2L - 1`` distances and is
several times slower than the gather.  Memory is O(B H L (L + 2k+1)) instead of O(L^2 d).

Taught in notebooks/05_relative_shaw.ipynb.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..attention.cpu_flash import sum_per_row
from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..checks import check_positive_int
from ..utils import relative_positions


def shaw_index(q_pos: torch.Tensor, k_pos: torch.Tensor, max_relative_position: int) -> torch.Tensor:
    """``(q_len, k_len)`` int64 index ``clip(j - i, -k, k) + k`` into a (2k+1)-row table."""
    k = max_relative_position
    return relative_positions(q_pos, k_pos).clamp(-k, k) + k


@dataclass
class ShawPlan:
    """Index structures for one ``(q_len, k_len)`` index, built once per forward and shared by layers.

    ``index: (Lq, Lk)`` table rows; ``band_j: (Lq, R-2)`` the key holding each inner row
    (clamped to a valid key), ``band_ok: (Lq, R-2)`` 1.0 where that key exists;
    ``ends: (Lq, Lk, 2)`` float 0/1 masks of the keys in the first and last row;
    ``fast``: False if an inner row is hit twice in some query row (then scatter-add is used);
    checked on CPU only, assumed for an index on an accelerator (distinct key positions).
    ``subs``: what is worked out from the plan once (the fused CPU path's, :mod:`posenc_lib.kernels.shaw`).
    """

    index: torch.Tensor
    rows: int
    band_j: torch.Tensor
    band_ok: torch.Tensor
    ends: torch.Tensor
    fast: bool
    subs: dict = field(default_factory=dict, repr=False, compare=False)


def shaw_plan(index: torch.Tensor, rows: int) -> ShawPlan:
    """Build the :class:`ShawPlan` of ``index (Lq, Lk)`` with values in ``[0, rows)``."""
    if index.dim() != 2:
        raise ValueError(f"index must be (q_len, k_len), got shape {tuple(index.shape)}")
    lq, lk = index.shape
    keys = torch.arange(lk, device=index.device).expand(lq, lk)
    if rows < 3:
        fast = False
    elif on_host(index):
        counts = torch.zeros(lq, rows, dtype=torch.long).scatter_add_(1, index, torch.ones_like(index))
        fast = bool((counts[:, 1:-1] <= 1).all())
    else:
        # reading the counts back would stall an accelerator on every forward; an index of
        # distinct key positions (the model's aranges always are) hits each inner row at most once
        fast = True
    band_j = torch.full((lq, rows), -1, dtype=torch.long, device=index.device).scatter_(1, index, keys)[:, 1:-1]
    band_ok = (band_j >= 0).float()
    ends = torch.stack((index == 0, index == rows - 1), dim=-1).float()
    return ShawPlan(index, rows, band_j.clamp(min=0), band_ok, ends, fast)


def _gather_rows(s: torch.Tensor, plan: ShawPlan) -> torch.Tensor:
    """``out[..., i, j] = s[..., i, index_ij]``: ``(B, H, Lq, R) -> (B, H, Lq, Lk)``."""
    b, h, lq, _ = s.shape
    return s.gather(-1, plan.index.expand(b, h, lq, plan.index.shape[1]))


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, plan):
        ctx.plan = plan
        return _gather_rows(s, plan)

    @staticmethod
    def backward(ctx, grad):
        return sum_per_row(grad, ctx.plan), None


class _SumPerRow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, plan):
        ctx.plan = plan
        return sum_per_row(p, plan)

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.plan), None


def _plan_for(index: torch.Tensor, rows: int, plan: ShawPlan | None) -> ShawPlan:
    if plan is None:
        return shaw_plan(index, rows)
    if plan.index is not index and not torch.equal(plan.index, index):
        raise ValueError("plan was built for a different index; build it with shaw_plan(index, rows)")
    return plan


def shaw_key_scores(
    q: torch.Tensor, table_k: torch.Tensor, index: torch.Tensor, plan: ShawPlan | None = None
) -> torch.Tensor:
    """``q . a^K_ij`` without an (L, L, d) tensor.

    ``q: (B, H, Lq, d)``, ``table_k: (2k+1, d)``, ``index: (Lq, Lk)`` -> ``(B, H, Lq, Lk)``.
    ``plan``: :func:`shaw_plan` of ``index`` (built here when omitted).
    """
    plan = _plan_for(index, table_k.shape[0], plan)
    return _GatherRows.apply(q @ table_k.t(), plan)  # (B, H, Lq, 2k+1) -> (B, H, Lq, Lk)


def shaw_value_term(
    probs: torch.Tensor, table_v: torch.Tensor, index: torch.Tensor, plan: ShawPlan | None = None
) -> torch.Tensor:
    """``sum_j alpha_ij a^V_ij`` from the attention mass per clipped distance.

    ``probs: (B, H, Lq, Lk)``, ``table_v: (2k+1, d)`` -> ``(B, H, Lq, d)``.
    """
    plan = _plan_for(index, table_v.shape[0], plan)
    return _SumPerRow.apply(probs, plan) @ table_v.to(probs.dtype)


def shaw_scores_naive(q, k, table_k, index):
    """Reference: materialise ``a^K`` as ``(Lq, Lk, d)`` and compute ``q . (k_j + a^K_ij)`` (unscaled)."""
    a_k = table_k[index]  # (Lq, Lk, d)
    return q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)


def shaw_values_naive(probs, v, table_v, index):
    """Reference: ``sum_j alpha_ij (v_j + a^V_ij)`` with ``a^V`` as ``(Lq, Lk, d)``."""
    a_v = table_v[index]
    return probs @ v + torch.einsum("bhij,ijd->bhid", probs, a_v)


@register_scheme(kind="relative", group="classic", year=2018, arxiv="1803.02155", aliases=("rpe", "relative"),
                 paper="Shaw et al. 2018, Self-Attention with Relative Position Representations")
class ShawRelative(PositionScheme):
    """Per-layer ``w^K`` and ``w^V`` tables of shape ``(2k+1, head_dim)``, shared across heads."""

    name = "shaw"
    clipped_sides = True
    enters = "scores + values"

    def __init__(self, d_model, n_heads, num_layers, causal=False, max_relative_position: int = 16):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.max_relative_position = check_positive_int("max_relative_position", max_relative_position)
        rows = 2 * self.max_relative_position + 1
        self.table_k = nn.Parameter(torch.randn(num_layers, rows, self.head_dim) * self.head_dim**-0.5)
        self.table_v = nn.Parameter(torch.randn(num_layers, rows, self.head_dim) * self.head_dim**-0.5)

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        index = shaw_index(q_pos, k_pos, self.max_relative_position)
        plan = shaw_plan(index, 2 * self.max_relative_position + 1)
        return {"q_pos": q_pos, "k_pos": k_pos, "index": index, "plan": plan}

    def query_slice(self, prep, start, end):
        plan = self.block_plan(prep, start, end, prep["index"].shape[1])
        return {"q_pos": prep["q_pos"][start:end], "k_pos": prep["k_pos"], "index": plan.index, "plan": plan}

    def block_plan(self, prep, start, end, k_end):
        """The plan of query rows ``start:end`` and keys ``0:k_end``, built once per forward pass and
        shared by the layers of the stack."""
        plans = prep.setdefault("block_plans", {})
        if (start, end, k_end) not in plans:
            index = prep["index"][start:end, :k_end]
            plans[start, end, k_end] = shaw_plan(index, 2 * self.max_relative_position + 1)
        return plans[start, end, k_end]

    def prepare_step(self, q_pos, k_pos, state):
        """A decoding step of one query needs only its row of the index (:meth:`scores` and :meth:`values` read one
        bucket per key), not the plan :meth:`prepare` builds for many rows."""
        if q_pos.shape[0] != 1:
            return super().prepare_step(q_pos, k_pos, state)
        index = shaw_index(q_pos, k_pos, self.max_relative_position)
        return {"q_pos": q_pos, "k_pos": k_pos, "index": index, "step_state": state}

    def scores(self, q, k, prep, layer, attn):
        if "plan" not in prep and q.shape[2] == 1:  # one query row: q . a^K of each key's bucket
            return (q @ self.table_k[layer].to(q.dtype).t()).index_select(-1, prep["index"][0])
        return shaw_key_scores(q, self.table_k[layer].to(q.dtype), prep["index"], prep.get("plan"))

    def values(self, probs, prep, layer):
        if "plan" not in prep and probs.shape[2] == 1:  # one query row: its attention mass per bucket, times a^V
            b, h, _, _ = probs.shape
            mass = probs.new_zeros(b, h, 1, self.table_v.shape[1]).index_add_(-1, prep["index"][0], probs)
            return mass @ self.table_v[layer].to(probs.dtype)
        return shaw_value_term(probs, self.table_v[layer], prep["index"], prep.get("plan"))

    def extra_repr(self):
        return f"causal={self.causal}, max_relative_position={self.max_relative_position}"
