"""Absolute positions: integers, normalised positions, binary vectors, a learned table.

The first attempts a learner makes at telling a Transformer "where" a token is.
Each one is a function ``positions -> code`` that is *added* to the token
embedding before the first layer.

* integer positions ``p_t = t`` -- unique but unbounded: at t = 500 the code
  swamps an embedding whose entries are around 1.
* normalised positions ``p_t = t / (L - 1)`` -- bounded, but the same step
  means different distances in sequences of different lengths.
* binary vectors ``p_t = bits(t)`` -- bounded and unique, but neighbours can
  differ in many bits (7 -> 8 flips four), so distance is hard to read.
* learned table ``p_t = P[t]`` (Gehring et al. 2017, "Convolutional Sequence
  to Sequence Learning", arXiv:1705.03122; BERT, GPT) -- flexible, but there is
  no row for a position beyond the table.
* hierarchical extension (Su, 2020, "层次分解位置编码"): from ``n`` learned
  vectors ``u`` build ``q_{i*n + j} = alpha*u_i + (1 - alpha)*u_j`` for
  ``n**2`` positions; the first ``n`` codes are the original ones when the table
  is re-centred as in the paper (see :func:`hierarchical_positions`).

Taught in notebooks/02_integer_and_binary.ipynb and
notebooks/04_learned_positions.ipynb.
"""
from __future__ import annotations

import numbers

import torch
from torch import nn

from ..checks import check_float_range, check_float_tensor, check_position_tensor, check_positive_int


def _check_dtype(dtype, floating: bool = False) -> None:
    """``dtype`` is a torch dtype (a floating one where the positions are fractions)."""
    if not isinstance(dtype, torch.dtype) or (floating and not dtype.is_floating_point):
        kind = "a floating-point torch.dtype (e.g. torch.float32)" if floating else "a torch.dtype (e.g. torch.float32)"
        raise TypeError(f"dtype must be {kind}, got {dtype!r}")


def integer_positions(length: int, dtype=torch.float32) -> torch.Tensor:
    """``(length,)`` tensor ``[0, 1, ..., length-1]``."""
    length = check_positive_int("length", length)
    _check_dtype(dtype)
    return torch.arange(length, dtype=dtype)


def normalized_positions(length: int, dtype=torch.float32) -> torch.Tensor:
    """``(length,)`` positions scaled to ``[0, 1]``: ``t / (length - 1)`` (``[0.]`` for one token)."""
    length = check_positive_int("length", length)
    _check_dtype(dtype, floating=True)  # an integer dtype cannot hold the fractions
    if length == 1:
        return torch.zeros(1, dtype=dtype)
    return torch.arange(length, dtype=dtype) / (length - 1)


def binary_positions(length: int, n_bits: int | None = None, dtype=torch.float32) -> torch.Tensor:
    """``(length, n_bits)`` binary codes, least significant bit first.

    ``n_bits`` defaults to the fewest bits that give every position a unique code.
    """
    length = check_positive_int("length", length)
    _check_dtype(dtype)
    needed = max(1, (length - 1).bit_length())
    if n_bits is None:
        n_bits = needed
    n_bits = check_positive_int("n_bits", n_bits)
    if n_bits < needed:
        raise ValueError(f"n_bits={n_bits} is too few for {length} positions; need at least {needed}")
    t = torch.arange(length)[:, None]
    bits = (t >> torch.arange(n_bits)[None, :]) & 1
    return bits.to(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trainable table ``P`` of shape ``(max_len, d_model)``; ``forward(positions) = P[positions]``.

    Positions at or beyond ``max_len`` raise a ``ValueError``: a learned table
    has no row for them (lesson 04 shows what that costs beyond the training length).
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02):
        super().__init__()
        self.max_len = check_positive_int("max_len", max_len)
        self.d_model = check_positive_int("d_model", d_model)
        self.weight = nn.Parameter(torch.randn(self.max_len, self.d_model) * check_float_range("init_std", init_std, 0.0))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """``positions: (seq,)`` int64 -> ``(seq, d_model)``.

        The range check reads the positions, so it runs on CPU tensors only (on an
        accelerator it would stall the device; the model checks lengths with plain ints).
        """
        check_position_tensor("positions", positions, integer=True, dim=None)
        if positions.numel() and on_host(positions) and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"position {int(positions.max())} is beyond the learned table (max_len={self.max_len}, "
                f"valid positions 0..{self.max_len - 1}); build the model with a larger max_len "
                f"or use a scheme defined at every position (sinusoidal, rope, t5, alibi, ...)"
            )
        if positions.numel() and on_host(positions) and int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
        return self.weight[positions]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


def hierarchical_positions(table: torch.Tensor, alpha: float = 0.4) -> torch.Tensor:
    """Extend ``n`` learned position vectors to ``n**2`` (Su 2020, hierarchical decomposition).

    ``table: (n, d)``. With ``u_i = (p_i - alpha * p_0) / (1 - alpha)`` the code of
    position ``i * n + j`` is ``q = alpha * u_i + (1 - alpha) * u_j``, so that
    ``q_j = p_j`` for ``j < n``: the extended table reproduces the original one.
    Returns ``(n**2, d)``.
    """
    check_float_tensor("table", table)
    if table.dim() != 2:
        raise ValueError(f"table must have shape (n, d), got shape {tuple(table.shape)}")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0.0 < alpha < 1.0 or alpha == 0.5:
        raise ValueError(f"alpha must be in (0, 1) and not 0.5 (else q_(i,j) = q_(j,i)), got {alpha}")
    n = table.shape[0]
    u = (table - alpha * table[:1]) / (1.0 - alpha)
    q = alpha * u[:, None, :] + (1.0 - alpha) * u[None, :, :]
    return q.reshape(n * n, table.shape[1])


from ..attention.layer import PositionScheme, on_host  # noqa: E402
from .registry import register_scheme  # noqa: E402


@register_scheme(kind="absolute", group="classic", year=2017, arxiv="1705.03122", aliases=("learnedpe",),
                 paper="Gehring et al. 2017, Convolutional Sequence to Sequence Learning")
class LearnedScheme(PositionScheme):
    """Adds a learned absolute table (``max_len`` rows) to the token embeddings."""

    name = "learned"
    enters = "input"

    def __init__(self, d_model, n_heads, num_layers, causal=False, max_len: int = 512, init_std: float = 1.0):
        super().__init__(d_model, n_heads, num_layers, causal)
        # std 1 matches the scale of the model's token embeddings (std d^-1/2 times sqrt(d)),
        # so the code is not drowned at the start of a short training run
        self.table = LearnedPositionalEmbedding(max_len, d_model, init_std=init_std)

    @property
    def max_positions(self) -> int:
        return self.table.max_len

    def embed(self, positions):
        return self.table(positions)
