"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long:
Attention with Linear Biases Enables Input Length Extrapolation", arXiv:2108.12409).

No position embeddings at all: each head ``h`` subtracts a fixed penalty
proportional to distance from its logits,

    score_ij = q_i . k_j / sqrt(d) - m_h * |i - j|

with slopes ``m_h`` a geometric sequence: for ``n`` heads (a power of two)
``m_h = 2^(-8h/n)``, h = 1..n.  For other head counts the paper takes the
slopes of the closest smaller power of two ``c`` and adds every other slope of
``2c``.  The causal (paper) form only ever sees ``i >= j``; for a bidirectional
encoder we use the symmetric distance ``|i - j|``.

Taught in notebooks/10_alibi.ipynb.
"""
from __future__ import annotations

import math

import torch

from .attention import PositionScheme
from .utils import check_positive_int, relative_positions


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """``(n_heads,)`` float32 slopes, including the non-power-of-two rule."""
    n_heads = check_positive_int("n_heads", n_heads)
    if math.log2(n_heads).is_integer():
        slopes = _power_of_two_slopes(n_heads)
    else:
        c = 2 ** math.floor(math.log2(n_heads))
        slopes = _power_of_two_slopes(c) + _power_of_two_slopes(2 * c)[0::2][: n_heads - c]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor) -> torch.Tensor:
    """``(1, heads, q_len, k_len)`` bias ``-m_h * |k_pos - q_pos|``."""
    dist = relative_positions(q_pos, k_pos).abs().to(slopes.dtype)
    return -(slopes[:, None, None] * dist[None])[None]


class ALiBi(PositionScheme):
    name = "alibi"
    where = "scores (bias)"

    def __init__(self, d_model, n_heads, num_layers, causal=False):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def prepare(self, q_pos, k_pos):
        return {"q_pos": q_pos, "k_pos": k_pos, "bias": alibi_bias(q_pos, k_pos, self.slopes)}

    def bias(self, ctx, layer):
        return ctx["bias"]
