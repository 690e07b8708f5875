"""Kerple, kernelized relative positional embedding (Chi, Fan, Ramadge & Rudnicky 2022, "KERPLE: Kernelized
Relative Positional Embedding for Length Extrapolation", NeurIPS 2022, arXiv:2205.09921).

ALiBi's penalty ``-m |i - j|`` is one conditionally positive definite (CPD) kernel of the distance; Kerple
learns the shape of the penalty within two CPD families, per head (and per layer), and adds it to the
scores like ALiBi's:

    log kernel:    b_h(i, j) = -r1_h * log(1 + r2_h * |i - j|),     r1_h, r2_h > 0
    power kernel:  b_h(i, j) = -r1_h * |i - j| ** r2_h,             r1_h > 0, 0 < r2_h <= 2

The log kernel decays fast over the first tokens and then flattens (a long tail of still-visible keys);
the power kernel with ``r2 = 1`` is ALiBi with a learned slope.  Only ``|i - j|`` enters, so the same
formula serves a bidirectional stack (symmetric, like ALiBi's; it cannot tell left from right).  The
paper trains causal language models.

Parameters follow the authors' code (a GPT-NeoX fork): ``r1 ~ 2 * U(0, 1)``, ``r2 ~ U(0, 1)`` at the
start, kept ``>= 0.01``; the power exponent is also kept ``<= 2``, the paper's condition for a CPD power
kernel.  That code clamps the parameters in place before every forward pass and differentiates with
respect to the clamped values; here the clamp is straight-through (same forward values and gradients) so
that no parameter is changed in place during a forward pass.

Like T5's bias, the bias is content-free and learned: it enters the fused kernel as a float mask at
inference, and on CPU at long lengths in training the fused kernel with the bias's gradient
(posenc_lib/attention/cpu_flash.py).  On CPU it is read from a table of per-distance values (one
evaluation per distance, not per pair).  Checked against the formulas above written out naively in
tests/test_survey_positions.py.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention.layer import PositionScheme, on_host
from .registry import register_scheme
from ..checks import check_choice
from ..utils import relative_positions, table_bias

KERNELS = ("log", "power")
#: the smallest value of ``r1`` and ``r2`` (the authors' code)
EPS = 1e-2


def straight_through_clamp(x: torch.Tensor, low: float, high: float | None = None) -> torch.Tensor:
    """``x`` clamped to ``[low, high]`` in the forward pass, with the gradient of the identity."""
    return x + (x.clamp(low, high) - x).detach()


def kerple_kernel(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, kernel: str) -> torch.Tensor:
    """``(..., heads)`` bias values for float ``distance (...)`` (``|i - j|``) and ``r1, r2 (heads,)``."""
    d = distance.float()[..., None]
    if kernel == "log":
        return -r1 * torch.log1p(r2 * d)
    return -r1 * d.pow(r2)


@register_scheme(kind="bias", group="survey", year=2022, arxiv="2205.09921",
                 paper="Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation")
class Kerple(PositionScheme):
    """Per layer and head ``r1``, ``r2`` of the chosen ``kernel`` ("log", the paper's best, or "power")."""

    name = "kerple"
    enters = "scores (bias)"

    def __init__(self, d_model, n_heads, num_layers, causal=False, kernel: str = "log"):
        super().__init__(d_model, n_heads, num_layers, causal)
        check_choice("kernel", kernel, KERNELS)
        self.kernel = kernel
        self.r1 = nn.Parameter(torch.rand(num_layers, n_heads) * 2)
        self.r2 = nn.Parameter(torch.rand(num_layers, n_heads))

    def coefficients(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``r1, r2`` of ``layer`` as used (clamped), float32 ``(heads,)`` each."""
        r1 = straight_through_clamp(self.r1[layer].float(), EPS)
        r2 = straight_through_clamp(self.r2[layer].float(), EPS, 2.0 if self.kernel == "power" else None)
        return r1, r2

    def compute_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """``(1, heads, q_len, k_len)`` float32 bias of ``layer``."""
        dist = relative_positions(q_pos, k_pos).abs()
        r1, r2 = self.coefficients(layer)
        if on_host(dist) and dist.numel():  # one value per distance, then a lookup
            distances = torch.arange(int(dist.max()) + 1, device=dist.device)
            return table_bias(kerple_kernel(distances, r1, r2, self.kernel), dist)
        return kerple_kernel(dist, r1, r2, self.kernel).permute(2, 0, 1)[None]

    def bias(self, prep, layer):
        return self.compute_bias(prep["q_pos"], prep["k_pos"], layer)

    def extra_repr(self):
        return f"causal={self.causal}, kernel={self.kernel!r}"
