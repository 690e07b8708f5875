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
option ``bidirectional="directional"`` (a variant, not from the paper) restores direction with
different slopes on the two sides: head ``h`` keeps ``m_h`` for keys right of the query and takes the
slope of head ``n + 1 - h`` for keys left of it, so every head with ``m_h != m_{n+1-h}`` is steeper on
one side.  ``bidirectional="split"`` is the extreme case: even heads attend only to keys at or left of
the query, odd heads only to keys at or right of it, each with its usual slope.

Taught in notebooks/10_alibi.ipynb.
"""
from __future__ import annotations

import math

import torch

from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..checks import check_bool, check_choice, check_position_tensor, check_positive_int
from ..utils import consecutive, relative_positions, toeplitz_bias

#: a bias of at least this many elements (heads x queries x keys) over consecutive positions is kept as one value per
#: offset ``j - i`` (the same values as :func:`alibi_bias`), laid out whole only where a call needs it and block by
#: block in causal training calls on the fused CPU path; smaller biases (the course's models) are built as before.
OFFSET_MIN_ELEMENTS: int | None = 2**20


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


BIDIRECTIONAL = ("symmetric", "split", "directional")


def alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, split: bool = False,
               left_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """``(1, heads, q_len, k_len)`` float32 bias ``-m_h * |k_pos - q_pos|``.

    Always float32, whatever the dtype of ``slopes``: a bf16 distance is already rounded
    above 256 (8 significant bits), before the multiply.
    ``split=True``: even heads get ``-inf`` for keys right of the query, odd heads for keys left of it.
    ``left_slopes``: ``(heads,)`` slopes for keys left of the query (``k_pos < q_pos``) in place of ``slopes``.
    ``q_pos``, ``k_pos``: 1-D integer or (for fractional positions) floating tensors; ``slopes``: ``(heads,)``.
    """
    check_position_tensor("q_pos", q_pos)
    check_position_tensor("k_pos", k_pos)
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"slopes must be a torch.Tensor of shape (heads,) (alibi_slopes(n_heads)), got "
                        f"{type(slopes).__name__}")  # fmt: skip
    if slopes.dtype == torch.bool or slopes.is_complex():
        raise TypeError(f"slopes must hold real numbers (alibi_slopes(n_heads) is float32), got dtype {slopes.dtype}")
    if slopes.dim() != 1:
        raise ValueError(f"slopes must have shape (heads,), got {tuple(slopes.shape)}")
    if left_slopes is not None:
        if not isinstance(left_slopes, torch.Tensor) or left_slopes.shape != slopes.shape:
            raise ValueError(f"left_slopes must be a tensor of the shape of slopes {tuple(slopes.shape)}, got "
                             f"{tuple(left_slopes.shape) if isinstance(left_slopes, torch.Tensor) else left_slopes!r}")
        if left_slopes.dtype == torch.bool or left_slopes.is_complex():
            raise TypeError(f"left_slopes must hold real numbers, got dtype {left_slopes.dtype}")
    return _alibi_bias(q_pos, k_pos, slopes, check_bool("split", split), left_slopes)


def directional_left_slopes(slopes: torch.Tensor) -> torch.Tensor:
    """The left-side slopes of ``bidirectional="directional"``: head ``h`` takes the slope of head ``n + 1 - h``."""
    return slopes.flip(0)


def _alibi_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, split: bool,
                left_slopes: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`alibi_bias` without its checks (the scheme's positions are checked by :meth:`ALiBi.prepare`)."""
    rel = relative_positions(q_pos, k_pos)
    per_key = slopes.float()[:, None, None]
    if left_slopes is not None:
        per_key = torch.where(rel[None] < 0, left_slopes.float()[:, None, None], per_key)
    bias = -(per_key * rel.abs().float()[None])
    if split:
        heads = torch.arange(slopes.shape[0], device=slopes.device)[:, None, None]
        hidden = torch.where(heads % 2 == 0, rel[None] > 0, rel[None] < 0)
        bias = bias.masked_fill(hidden, float("-inf"))
    return bias[None]


@register_scheme(kind="bias", group="classic", year=2022, arxiv="2108.12409",
                 paper="Press et al. 2022, Train Short, Test Long (ALiBi)")
class ALiBi(PositionScheme):
    name = "alibi"
    enters = "scores (bias)"

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

    def _offset_values(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """``(q_len + k_len - 1, heads)``: the bias ``-m_h |j - i|`` of each offset ``j - i`` from
        ``k_pos[0] - q_pos[-1]`` up, for large windows of consecutive positions on the host
        (:data:`OFFSET_MIN_ELEMENTS`) and a bias that depends on the offset alone (not ``split``); ``None`` otherwise."""
        q_len, k_len = q_pos.numel(), k_pos.numel()
        if (
            OFFSET_MIN_ELEMENTS is None or self.n_heads * q_len * k_len < OFFSET_MIN_ELEMENTS
            or (self.bidirectional == "split" and not self.causal)
            or not (on_host(q_pos) and consecutive(q_pos) and consecutive(k_pos))
        ):  # fmt: skip
            return None
        first = int(k_pos[0]) - int(q_pos[-1])  # the offset j - i of row q_len - 1, column 0
        offsets = torch.arange(first, first + q_len + k_len - 1, device=self.slopes.device)
        slopes = self.slopes.float()[None]
        left = self.left_slopes()
        if left is not None:
            slopes = torch.where(offsets[:, None] < 0, left.float()[None], slopes)
        return -(offsets.abs().float()[:, None] * slopes)

    def left_slopes(self) -> torch.Tensor | None:
        """The slopes for keys left of the query where they differ from :attr:`slopes` (the directional encoder)."""
        if self.bidirectional == "directional" and not self.causal:
            return directional_left_slopes(self.slopes)
        return None

    def prepare(self, q_pos, k_pos):
        """The stack's context: the bias, or for a large window of consecutive positions the one value per
        offset (``"offset_values"``), laid out into the whole bias by the first layer that asks for it
        (:meth:`bias`); a causal training call on the fused CPU path lays out one block of queries at a time
        (:meth:`offset_bias`)."""
        check_positions(q_pos, k_pos)
        values = self._offset_values(q_pos, k_pos)
        if values is not None:
            return {"q_pos": q_pos, "k_pos": k_pos, "offset_values": values}
        split = self.bidirectional == "split" and not self.causal
        bias = _alibi_bias(q_pos, k_pos, self.slopes, split, self.left_slopes())
        return {"q_pos": q_pos, "k_pos": k_pos, "bias": bias}

    def offset_bias(self, prep) -> torch.Tensor | None:
        """``(heads, q_len + k_len - 1)`` float32 with ``bias[h, i, j] = offset_bias[h, j - i + q_len - 1]``, where
        the context has one value per offset (see :meth:`prepare`); ``None`` otherwise."""
        values = prep.get("offset_values")
        return None if values is None else values.t().contiguous()

    def extra_repr(self):
        return f"causal={self.causal}, bidirectional={self.bidirectional!r}"

    def bias(self, prep, layer):
        if "bias" not in prep:  # built once, shared by the stack's layers (the context is the stack's)
            prep["bias"] = toeplitz_bias(prep["offset_values"], prep["q_pos"].numel(), prep["k_pos"].numel())
        return prep["bias"]
