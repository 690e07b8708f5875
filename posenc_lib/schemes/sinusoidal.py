"""Sinusoidal absolute positions (Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762).

    PE(t, 2i)   = sin(t / base^(2i/d))
    PE(t, 2i+1) = cos(t / base^(2i/d))

with ``base = 10000``. Each (sin, cos) pair is a point on a circle turning at
frequency ``w_i = base^(-2i/d)``, so ``PE(t + D) = T_D PE(t)`` where ``T_D`` is
block-diagonal with 2x2 rotations by ``D*w_i`` (:func:`sinusoidal_shift_matrix`),
and ``PE(t) . PE(t + D) = sum_i cos(D*w_i)`` depends only on ``D``.

The 2-D image variant (as in DETR / ViT-style 2-D sin-cos) codes row and column
separately in half of the channels each.

Taught in notebooks/03_sinusoidal.ipynb.
"""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..checks import check_even, check_float_range, check_position_tensor, check_positive_int


def sinusoidal_frequencies(dim: int, base: float = 10000.0, dtype=torch.float32, device=None) -> torch.Tensor:
    """``(dim // 2,)`` angular frequencies ``w_i = base^(-2i/dim)`` (computed in float64), on ``device``."""
    dim = check_even("dim", dim)
    base = check_float_range("base", base, 1.0, low_open=True)
    return torch.exp(-math.log(base) * torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim).to(dtype)


def sinusoidal_encode(positions: torch.Tensor, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Codes for arbitrary (possibly fractional) positions: ``(..., dim)``, sin even / cos odd.

    Phases are computed in float32 (float64 if ``positions`` is float64).
    """
    check_position_tensor("positions", positions, dim=None)
    dtype = torch.float64 if positions.dtype == torch.float64 else torch.float32
    return _encode(positions, sinusoidal_frequencies(dim, base, dtype, positions.device))


def _encode(positions: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    phase = positions.to(w.dtype)[..., None] * w
    out = torch.stack((phase.sin(), phase.cos()), dim=-1)  # (..., dim/2, 2)
    return out.flatten(-2)


def sinusoidal_table(n_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``(n_positions, dim)`` float32 table: sin in even columns, cos in odd columns."""
    n_positions = check_positive_int("n_positions", n_positions)
    return sinusoidal_encode(torch.arange(n_positions), dim, base)


def sinusoidal_shift_matrix(delta: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``(dim, dim)`` block-diagonal rotation ``T_delta`` with ``PE(t+delta) = T_delta @ PE(t)``."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not math.isfinite(delta):
        raise ValueError(f"delta (the shift in positions) must be a finite number, got {delta!r}")
    w = sinusoidal_frequencies(dim, base, torch.float64) * delta
    c, s = w.cos(), w.sin()
    T = torch.zeros(dim, dim, dtype=torch.float64)
    idx = torch.arange(0, dim, 2)
    # [sin(a+b), cos(a+b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
    T[idx, idx] = c
    T[idx, idx + 1] = s
    T[idx + 1, idx] = -s
    T[idx + 1, idx + 1] = c
    return T.to(torch.float32)


def sinusoidal_table_2d(height: int, width: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """``(height, width, dim)`` 2-D code: first ``dim/2`` channels code the row, the rest the column."""
    check_positive_int("height", height)
    check_positive_int("width", width)
    check_positive_int("dim", dim)
    if dim % 4:
        raise ValueError(f"dim must be divisible by 4 for the 2-D variant (sin/cos for rows and columns), got {dim}")
    rows = sinusoidal_table(height, dim // 2, base)  # (H, dim/2)
    cols = sinusoidal_table(width, dim // 2, base)  # (W, dim/2)
    return torch.cat(
        (rows[:, None, :].expand(height, width, dim // 2), cols[None, :, :].expand(height, width, dim // 2)), dim=-1
    )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds ``PE(t)`` to ``(batch, seq, d_model)`` inputs; no parameters, any length."""

    def __init__(self, d_model: int, base: float = 10000.0):
        super().__init__()
        self.d_model = check_even("d_model", d_model)
        self.base = base
        # float32 frequencies, moved with the module (.to(device)), never rebuilt per forward
        self.register_buffer("freqs", sinusoidal_frequencies(d_model, base), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.freqs.dtype != torch.float32:  # model.to(bfloat16) must not round the frequencies
            self.freqs = sinusoidal_frequencies(self.d_model, self.base, device=self.freqs.device)
        return self

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions: (seq,)`` -> ``(seq, d_model)`` float32 (float64 for float64 positions)."""
        check_position_tensor("positions", positions, dim=None)
        if positions.dtype == torch.float64:
            return sinusoidal_encode(positions, self.d_model, self.base)
        return _encode(positions, self.freqs)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base}"


from ..attention.layer import PositionScheme  # noqa: E402  (kept beside the scheme it serves)
from .registry import register_scheme  # noqa: E402


@register_scheme(kind="absolute", group="classic", year=2017, arxiv="1706.03762", aliases=("sinpe", "sin"),
                 paper="Vaswani et al. 2017, Attention Is All You Need")
class SinusoidalScheme(PositionScheme):
    """Adds the sinusoidal table to the token embeddings (input level)."""

    name = "sinusoidal"
    enters = "input"

    def __init__(self, d_model, n_heads, num_layers, causal=False, base: float = 10000.0):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.encoding = SinusoidalPositionalEncoding(d_model, base)

    def embed(self, positions):
        return self.encoding(positions)
