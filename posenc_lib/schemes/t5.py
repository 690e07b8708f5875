"""T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", arXiv:1910.10683, section 2.1).

Each head learns one scalar per *bucket* of relative distance and adds it to
the attention logits:

    score_ij = q_i . k_j / sqrt(d) + b_h[bucket(j - i)]

Buckets (``num_buckets = 32``, ``max_distance = 128`` by default): in the
bidirectional encoder half of the buckets code the sign; of the rest, the first
half are exact distances 0, 1, 2, ... and the second half grow logarithmically
up to ``max_distance``; every distance beyond shares the last bucket.  The
causal decoder uses all buckets for non-positive ``j - i``.  ``j - i`` (memory position minus query
position in T5's code) is the course's convention, key minus query (:mod:`posenc_lib.attention.layer`).

As in T5 the bias is computed once per stack and shared by all its layers; it
enters ``scaled_dot_product_attention`` as a float ``attn_mask``.  (T5 itself
also drops the 1/sqrt(d) scale and folds it into the initialisation; this
library keeps the scale so that every scheme shares one attention.)

Taught in notebooks/07_t5_bias.ipynb.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..attention.step import distance_table
from ..checks import check_bool, check_position_tensor, check_positive_int
from ..utils import consecutive, relative_positions, toeplitz_bias

#: a bias of at least this many elements (heads x queries x keys) over consecutive positions is laid out from one value
#: per offset (see :meth:`T5Bias.compute_bias`), so its gradient sums per diagonal instead of over every (query, key)
#: pair; smaller biases (the course's models) are built as before, bit for bit.
TOEPLITZ_MIN_ELEMENTS: int | None = 2**20


def t5_relative_bucket(
    relative_position: torch.Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """Bucket index in ``[0, num_buckets)`` for ``relative_position = key_pos - query_pos`` (an integer tensor)."""
    check_position_tensor("relative_position", relative_position, integer=True, dim=None)
    check_bool("bidirectional", bidirectional)
    num_buckets = check_positive_int("num_buckets", num_buckets)
    max_distance = check_positive_int("max_distance", max_distance)
    if bidirectional and num_buckets % 2:
        raise ValueError(f"num_buckets must be even for bidirectional buckets, got {num_buckets}")
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2  # distances with a bucket of their own
    if exact < 1 or max_distance <= exact:
        raise ValueError(
            f"need num_buckets >= {4 if bidirectional else 2} and max_distance > {max(exact, 1)} (the exactly "
            f"bucketed distances), got num_buckets={num_buckets}, max_distance={max_distance}"
        )
    rel = relative_position.long()
    bucket = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (rel > 0).long() * num_buckets
        n = rel.abs()
    else:
        n = (-rel).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    # log-spaced buckets for max_exact <= n < max_distance (float32, as in T5)
    log_ratio = torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, n, large)


def t5_distance_index(relative_position: torch.Tensor, max_distance: int) -> torch.Tensor:
    """The un-bucketed variant: index ``min(|j - i|, max_distance - 1)`` into a table of ``max_distance`` rows.

    One learned scalar per exact distance (as in lucidrains' ViT code quoted by the survey), no sign and no
    logarithmic sharing: ``max_distance`` rows instead of ``num_buckets``, and left and right look alike.
    """
    max_distance = check_positive_int("max_distance", max_distance)
    check_position_tensor("relative_position", relative_position, integer=True, dim=None)
    return relative_position.long().abs().clamp(max=max_distance - 1)


@register_scheme(kind="bias", group="classic", year=2020, arxiv="1910.10683",
                 paper="Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)")
class T5Bias(PositionScheme):
    """One learned scalar per (bucket, head), shared by the layers of a stack."""

    name = "t5"
    enters = "scores (bias)"

    def __init__(self, d_model, n_heads, num_layers, causal=False, num_buckets: int = 32, max_distance: int = 128):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.num_buckets = check_positive_int("num_buckets", num_buckets)
        self.max_distance = check_positive_int("max_distance", max_distance)
        zero = torch.zeros(1, dtype=torch.long)
        t5_relative_bucket(zero, not causal, num_buckets, max_distance)  # refuse bad sizes now
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=0.02)

    def buckets(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return t5_relative_bucket(
            relative_positions(q_pos, k_pos), not self.causal, self.num_buckets, self.max_distance
        )

    def _offset_values(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """``(q_len + k_len - 1, heads)``: the bias of each offset ``j - i`` from ``k_pos[0] - q_pos[-1]`` up, for
        large windows of consecutive positions on the host (:data:`TOEPLITZ_MIN_ELEMENTS`); ``None`` otherwise."""
        q_len, k_len = q_pos.numel(), k_pos.numel()
        if (
            TOEPLITZ_MIN_ELEMENTS is None or self.n_heads * q_len * k_len < TOEPLITZ_MIN_ELEMENTS
            or not (on_host(q_pos) and consecutive(q_pos) and consecutive(k_pos))
        ):  # fmt: skip
            return None
        first = int(k_pos[0]) - int(q_pos[-1])  # the offset j - i of row q_len - 1, column 0
        offsets = torch.arange(first, first + q_len + k_len - 1, device=q_pos.device)
        return self.relative_attention_bias(t5_relative_bucket(offsets, not self.causal, self.num_buckets, self.max_distance))

    def compute_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """``(1, heads, q_len, k_len)`` float32 bias (whatever the parameters' dtype).

        Large windows of consecutive positions on the host (at least :data:`TOEPLITZ_MIN_ELEMENTS` bias
        elements) look up one bucket per offset ``j - i`` and lay the values out along the diagonals
        (:func:`~posenc_lib.utils.toeplitz_bias`): the same bias, with a gradient summed per diagonal instead
        of over ``q_len * k_len`` lookups."""
        values = self._offset_values(q_pos, k_pos)
        if values is not None:
            return toeplitz_bias(values, q_pos.numel(), k_pos.numel())
        return self.relative_attention_bias(self.buckets(q_pos, k_pos)).float().permute(2, 0, 1)[None]

    def prepare(self, q_pos, k_pos):
        """The stack's context: the bias, or for a large window of consecutive positions the one value per
        offset (``"offset_values"``), laid out into the bias by the first layer that asks for it (:meth:`bias`).
        A causal training call on the fused CPU path never asks, nor an encoder's call at batch 1: it lays out one
        block of queries at a time (:meth:`offset_bias`)."""
        check_positions(q_pos, k_pos)
        values = self._offset_values(q_pos, k_pos)
        if values is None:
            return {"q_pos": q_pos, "k_pos": k_pos, "bias": self.compute_bias(q_pos, k_pos)}
        return {"q_pos": q_pos, "k_pos": k_pos, "offset_values": values}

    def prepare_step(self, q_pos, k_pos, state):
        """A decoding step of one query: its row of the bias read from a table of each distance's value, kept in
        ``state`` (the values of distances ``0, 1, ...`` back, looked up once and longer when a step needs it):
        the same float32 values as :meth:`compute_bias`, without bucketing the distances at every step."""
        if q_pos.shape[0] != 1 or not self.causal:
            return super().prepare_step(q_pos, k_pos, state)
        # a query d positions after key 0, for d = 0, 1, ...
        build = lambda d: self.relative_attention_bias(self.buckets(d, d[:1])[:, 0]).float()  # noqa: E731
        table = distance_table(state, "t5_bias", k_pos.shape[0], build, q_pos.device)  # (distances, heads)
        bias = table[q_pos - k_pos].t()[None, :, None, :]  # (1, heads, 1, k_len)
        return {"q_pos": q_pos, "k_pos": k_pos, "bias": bias, "step_state": state}

    def bias(self, prep, layer):
        if "bias" not in prep:  # built once, shared by the stack's layers (the context is the stack's)
            prep["bias"] = toeplitz_bias(prep["offset_values"], prep["q_pos"].numel(), prep["k_pos"].numel())
        return prep["bias"]

    def offset_runs(self, prep) -> tuple[int, int] | None:
        """``(a, z)`` for the values per offset of :meth:`offset_bias`: offsets ``0:a`` share the first one's bucket
        and offsets ``z:`` the last one's (every distance from ``max_distance`` on is one bucket), so their keys can
        run without a mask (:func:`~posenc_lib.kernels.offsets.offset_bias_attention`); ``None`` without values per
        offset.  Worked out once per context."""
        if "offset_values" not in prep:
            return None
        if "offset_runs" not in prep:
            q_pos, k_pos = prep["q_pos"], prep["k_pos"]
            first = int(k_pos[0]) - int(q_pos[-1])
            offsets = torch.arange(first, first + q_pos.numel() + k_pos.numel() - 1)
            buckets = t5_relative_bucket(offsets, not self.causal, self.num_buckets, self.max_distance)
            a = int((buckets == buckets[0]).long().cumprod(0).sum())
            z = buckets.numel() - int((buckets == buckets[-1]).flip(0).long().cumprod(0).sum())
            prep["offset_runs"] = a, max(a, z)
        return prep["offset_runs"]

    def offset_bias(self, prep) -> torch.Tensor | None:
        """``(heads, q_len + k_len - 1)`` float32 with ``bias[h, i, j] = offset_bias[h, j - i + q_len - 1]``, where
        the context has one value per offset (see :meth:`prepare`); ``None`` otherwise."""
        values = prep.get("offset_values")
        return None if values is None else values.float().t().contiguous()

    def extra_repr(self):
        return f"causal={self.causal}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"
