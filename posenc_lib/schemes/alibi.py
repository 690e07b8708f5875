"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long:
Attention with Linear Biases Enables Input Length Extrapolation", arXiv:2108.12409).

No position embeddings at all: each head ``h`` subtracts a fixed penalty
proportional to distance from its logits,

    score_ij = q_i . k_j / sqrt(d) - m_h * |i - j|

with slopes ``m_h`` a geometric sequence: for ``n`` heads (a power of two)
``m_h = 2^(-8h/n)``, h = 1..n.  For other head counts the paper takes the
slopes of the closest smaller power of two ``c`` and adds every other slope of
``2c``.  The causal (paper) form only ever sees ``i >= j``; for a bidirectional
encoder we use the symmetric distance ``|i - j|`` (as Press suggests for
encoders, and as data2vec 2.0 and MosaicBERT do).  The symmetric form does not depend on the sign
convention; the causal ``-m_h (i - j)`` is ``m_h (j - i)`` in the course's (key minus query, ``j <= i``).

A caveat the course measures: the symmetric bias cannot tell left from right unless some token marks
one end (an end-of-source anchor; lesson 13 measures one).  Reversing a source sentence without such a
token keeps every ``|i - j|``, so a symmetric-ALiBi
encoder maps a sentence and its reversal to reversed copies of the same
vectors, and a position-free cross-attention cannot tell them apart.  The
option ``bidirectional="split"`` (a variant, not from the paper) restores
direction: even heads attend only to keys at or left of the query, odd heads
only to keys at or right of it, each with its usual slope.

Taught in notebooks/10_alibi.ipynb.
"""
from __future__ import annotations

import math

import torch

from ..attention.layer import PositionScheme
from ..utils import check_choice, check_positive_int, relative_positions


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


BIDIRECTIONAL = ("symmetric", "split")


def alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, split: bool = False) -> torch.Tensor:
    """``(1, heads, q_len, k_len)`` float32 bias ``-m_h * |k_pos - q_pos|``.

    Always float32, whatever the dtype of ``slopes``: a bf16 distance is already rounded
    above 256 (8 significant bits), before the multiply.
    ``split=True``: even heads get ``-inf`` for keys right of the query, odd heads for keys left of it.
    """
    rel = relative_positions(q_pos, k_pos)
    bias = -(slopes.float()[:, None, None] * rel.abs().float()[None])
    if split:
        heads = torch.arange(slopes.shape[0], device=slopes.device)[:, None, None]
        hidden = torch.where(heads % 2 == 0, rel[None] > 0, rel[None] < 0)
        bias = bias.masked_fill(hidden, float("-inf"))
    return bias[None]


class ALiBi(PositionScheme):
    name = "alibi"
    where = "scores (bias)"

    def __init__(self, d_model, n_heads, num_layers, causal=False, bidirectional: str = "symmetric"):
        super().__init__(d_model, n_heads, num_layers, causal)
        check_choice("bidirectional", bidirectional, BIDIRECTIONAL)
        if bidirectional == "split" and n_heads < 2:
            raise ValueError(f"bidirectional='split' needs at least 2 heads, got n_heads={n_heads}")
        self.bidirectional = bidirectional
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.slopes.dtype != torch.float32:  # model.to(bfloat16) must not round the slopes
            self.slopes = alibi_slopes(self.n_heads).to(self.slopes.device)
        return self

    def prepare(self, q_pos, k_pos):
        split = self.bidirectional == "split" and not self.causal
        return {"q_pos": q_pos, "k_pos": k_pos, "bias": alibi_bias(q_pos, k_pos, self.slopes, split)}

    def extra_repr(self):
        return f"causal={self.causal}, bidirectional={self.bidirectional!r}"

    def bias(self, ctx, layer):
        return ctx["bias"]
