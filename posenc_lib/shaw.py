"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with
Relative Position Representations", arXiv:1803.02155).

Two learned tables per layer, shared by all heads, index the clipped distance
``clip(j - i, k)`` (``k`` = ``max_relative_position``, 2k+1 rows each):

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d)          (eq. 4)
    z_i  = sum_j alpha_ij (v_j + a^V_ij)            (eq. 3)
    a^K_ij = w^K[clip(j - i, -k, k)],  a^V_ij = w^V[clip(j - i, -k, k)]

A naive implementation builds ``a^K`` as an ``(L, L, d)`` tensor
(:func:`shaw_scores_naive`).  Here we never do:

* key term: ``q @ w^K.T`` gives every query's score against the 2k+1 table rows,
  ``(B, H, L, 2k+1)``; a gather with the clipped index matrix picks row
  ``clip(j - i)`` for each key ``j``.
* value term: the attention mass of query ``i`` on each clipped distance
  (a scatter-add of ``alpha_ij`` into 2k+1 slots), times ``w^V``.

Memory is O(B H L (L + 2k+1)) instead of O(L^2 d).

Taught in notebooks/05_relative_shaw.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import PositionScheme
from .utils import check_positive_int, relative_positions


def shaw_index(q_pos: torch.Tensor, k_pos: torch.Tensor, max_relative_position: int) -> torch.Tensor:
    """``(q_len, k_len)`` int64 index ``clip(j - i, -k, k) + k`` into a (2k+1)-row table."""
    k = max_relative_position
    return relative_positions(q_pos, k_pos).clamp(-k, k) + k


def shaw_key_scores(q: torch.Tensor, table_k: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``q . a^K_ij`` without an (L, L, d) tensor.

    ``q: (B, H, Lq, d)``, ``table_k: (2k+1, d)``, ``index: (Lq, Lk)`` -> ``(B, H, Lq, Lk)``.
    """
    s = q @ table_k.t()  # (B, H, Lq, 2k+1)
    b, h, lq, _ = s.shape
    return s.gather(-1, index.expand(b, h, lq, index.shape[-1]))


def shaw_value_term(probs: torch.Tensor, table_v: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``sum_j alpha_ij a^V_ij`` from the attention mass per clipped distance.

    ``probs: (B, H, Lq, Lk)``, ``table_v: (2k+1, d)`` -> ``(B, H, Lq, d)``.
    """
    b, h, lq, lk = probs.shape
    mass = probs.new_zeros(b, h, lq, table_v.shape[0])
    mass.scatter_add_(-1, index.expand(b, h, lq, lk), probs)
    return mass @ table_v.to(probs.dtype)


def shaw_scores_naive(q, k, table_k, index):
    """Reference: materialise ``a^K`` as ``(Lq, Lk, d)`` and compute ``q . (k_j + a^K_ij)`` (unscaled)."""
    a_k = table_k[index]  # (Lq, Lk, d)
    return q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)


def shaw_values_naive(probs, v, table_v, index):
    """Reference: ``sum_j alpha_ij (v_j + a^V_ij)`` with ``a^V`` as ``(Lq, Lk, d)``."""
    a_v = table_v[index]
    return probs @ v + torch.einsum("bhij,ijd->bhid", probs, a_v)


class ShawRelative(PositionScheme):
    """Per-layer ``w^K`` and ``w^V`` tables of shape ``(2k+1, head_dim)``, shared across heads."""

    name = "shaw"
    where = "scores + values"

    def __init__(self, d_model, n_heads, num_layers, causal=False, max_relative_position: int = 16):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.max_relative_position = check_positive_int("max_relative_position", max_relative_position)
        rows = 2 * self.max_relative_position + 1
        self.table_k = nn.Parameter(torch.randn(num_layers, rows, self.head_dim) * self.head_dim**-0.5)
        self.table_v = nn.Parameter(torch.randn(num_layers, rows, self.head_dim) * self.head_dim**-0.5)

    def prepare(self, q_pos, k_pos):
        return {"q_pos": q_pos, "k_pos": k_pos, "index": shaw_index(q_pos, k_pos, self.max_relative_position)}

    def scores(self, q, k, ctx, layer, attn):
        return shaw_key_scores(q, self.table_k[layer].to(q.dtype), ctx["index"])

    def values(self, probs, ctx, layer):
        return shaw_value_term(probs, self.table_v[layer], ctx["index"])

    def extra_repr(self):
        return f"causal={self.causal}, max_relative_position={self.max_relative_position}"
