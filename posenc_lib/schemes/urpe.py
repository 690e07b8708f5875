"""Universal relative positional encoding, URPE (Luo, Li, Zheng, Liu, Wang & He 2022,
"Your Transformer May Not be as Powerful as You Expect", arXiv:2205.13401).

With a relative scheme that keeps the values position-free (T5, Transformer-XL, DeBERTa, ALiBi, RoPE),
every row of the attention matrix is a probability distribution, so ``z_i = sum_j alpha_ij v_j`` is an
average of the values: if all tokens are equal, all outputs are equal, whatever the positions.
Functions such as "output the position" or a prefix sum are out of reach (the paper proves such
Transformers are not universal approximators).  URPE multiplies the attention element-wise by a
learned Toeplitz matrix ``C``, ``c_ij = g_h(i - j)`` (one scalar per head and distance):

    z_i = sum_j alpha_ij * c_ij * v_j

Rows of ``alpha * C`` need not sum to 1, only ``i - j`` enters (still relative), and universality is
restored.  The price: ``alpha`` must be materialised, so fused attention kernels are out.

Sign convention: ``g`` is indexed by ``i - j`` (query minus key), as in the paper; in the course's
convention (key minus query, :mod:`posenc_lib.attention.layer`) that is ``g(-(j - i))``.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks import check_positive_int


def toeplitz_from_distances(g: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, max_distance: int) -> torch.Tensor:
    """``g (heads, 2*max_distance + 1)`` indexed by ``clip(i - j, -max_distance, max_distance)`` ->
    ``(heads, q_len, k_len)`` Toeplitz matrices ``C[h, i, j] = g[h, i - j]``."""
    if g.dim() != 2 or g.shape[-1] != 2 * max_distance + 1:
        raise ValueError(f"g must be (heads, 2*max_distance+1) = (heads, {2 * max_distance + 1}), got {tuple(g.shape)}")
    rel = (q_pos[:, None] - k_pos[None, :]).clamp(-max_distance, max_distance) + max_distance
    return g[:, rel]


class URPE(nn.Module):
    """The learned Toeplitz factor of URPE; ``forward(probs, q_pos, k_pos)`` returns ``probs * C``.

    ``probs: (batch, heads, q_len, k_len)`` softmax weights.  ``g`` starts at 1 (plain attention).
    """

    def __init__(self, n_heads: int, max_distance: int):
        super().__init__()
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.max_distance = check_positive_int("max_distance", max_distance)
        self.g = nn.Parameter(torch.ones(n_heads, 2 * max_distance + 1))

    def forward(self, probs: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        if probs.dim() != 4 or probs.shape[1] != self.n_heads:
            raise ValueError(f"probs must be (batch, heads={self.n_heads}, q_len, k_len), got {tuple(probs.shape)}")
        return probs * toeplitz_from_distances(self.g, q_pos, k_pos, self.max_distance)
