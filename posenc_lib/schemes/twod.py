"""Positions on a 2-D grid (image patches): 2-D sinusoidal codes, a T5-style 2-D relative bias, axial RoPE.

A vision Transformer cuts an image into an ``height x width`` grid of patches and reads them as one
sequence of ``height * width`` tokens (row-major).  A 1-D position ``t = row * width + col`` would make
the patch below a neighbour ``width`` tokens away; the schemes here code the row and the column apart:

* **2-D sinusoidal** (Dosovitskiy et al. 2021 use learned codes; the fixed 2-D sin/cos code is the
  one of MAE, He et al. 2022, arXiv:2111.06377): half of the channels code the row with lesson 03's
  code, half the column.  ``sinusoidal_table_2d`` lives in :mod:`posenc_lib.schemes.sinusoidal`.
* **2-D relative bias** (Swin Transformer, Liu et al. 2021, arXiv:2103.14030; the T5 idea of
  lesson 07 on a grid): one learned scalar per head and per offset ``(dy, dx)``, a table of
  ``(2H - 1)(2W - 1)`` rows, added to the logits:
  ``score = q_i . k_j / sqrt(d) + b_h[dy(i, j), dx(i, j)]``.
* **Axial RoPE** (as in today's vision Transformers, e.g. Heo et al. 2024, arXiv:2403.13298):
  rotate the first half of each head by the row, the second half by the column (lesson 06's
  rotation twice), so ``q_i . k_j`` depends on ``(row_j - row_i, col_j - col_i)`` only.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from .rotary import apply_rope
from .sinusoidal import sinusoidal_table_2d
from ..checks import check_even, check_positive_int

__all__ = ["grid_positions", "relative_offsets_2d", "RelativeBias2D", "axial_rope"]


def grid_positions(height: int, width: int) -> torch.Tensor:
    """``(height * width, 2)`` integer (row, col) of every patch, in row-major (reading) order."""
    check_positive_int("height", height)
    check_positive_int("width", width)
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    return torch.stack((rows.flatten(), cols.flatten()), dim=-1)


def relative_offsets_2d(pos: torch.Tensor) -> torch.Tensor:
    """``(N, 2)`` grid positions -> ``(N, N, 2)`` offsets ``pos_j - pos_i`` (key minus query)."""
    if pos.dim() != 2 or pos.shape[-1] != 2:
        raise ValueError(f"pos must be (N, 2) (row, col) positions, got shape {tuple(pos.shape)}")
    return pos[None, :, :] - pos[:, None, :]


class RelativeBias2D(nn.Module):
    """A learned scalar per head and per 2-D offset, for grids of at most ``max_height x max_width``."""

    def __init__(self, n_heads: int, max_height: int, max_width: int):
        super().__init__()
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.max_height = check_positive_int("max_height", max_height)
        self.max_width = check_positive_int("max_width", max_width)
        self.table = nn.Parameter(torch.zeros(2 * max_height - 1, 2 * max_width - 1, n_heads))
        nn.init.normal_(self.table, std=0.02)

    def forward(self, height: int, width: int) -> torch.Tensor:
        """``(1, heads, N, N)`` bias for an ``height x width`` grid (``N = height * width``)."""
        if not (1 <= height <= self.max_height and 1 <= width <= self.max_width):
            raise ValueError(f"grid {height}x{width} is outside the table's {self.max_height}x{self.max_width}")
        off = relative_offsets_2d(grid_positions(height, width))
        bias = self.table[off[..., 0] + self.max_height - 1, off[..., 1] + self.max_width - 1]  # (N, N, heads)
        return bias.permute(2, 0, 1)[None]


def axial_rope(x: torch.Tensor, pos: torch.Tensor, base: float = 100.0) -> torch.Tensor:
    """Rotate ``x (..., N, head_dim)`` by 2-D positions ``pos (N, 2)``: first half by row, second by column.

    ``head_dim`` must be divisible by 4 (each half is rotated in pairs).  The small ``base`` suits
    grids of tens of patches per side.
    """
    if pos.dim() != 2 or pos.shape[-1] != 2 or pos.shape[0] != x.shape[-2]:
        raise ValueError(f"pos must be (N, 2) with N = x.shape[-2] = {x.shape[-2]}, got shape {tuple(pos.shape)}")
    half = check_even("head_dim", x.shape[-1]) // 2
    check_even("head_dim / 2", half)
    return torch.cat((apply_rope(x[..., :half], pos[:, 0], base=base),
                      apply_rope(x[..., half:], pos[:, 1], base=base)), dim=-1)
