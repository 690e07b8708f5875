"""xPos, RoPE with an exponential decay (Sun, Dong, Patra, Ma, Huang, Benhaim, Chaudhary, Song & Wei 2023,
"A Length-Extrapolatable Transformer", ACL 2023, arXiv:2212.10554).

RoPE (posenc_lib/schemes/rotary.py) rotates dimension pair ``k`` by ``n * theta_k``; xPos also scales the
pair, queries up and keys down, so that a score decays with distance at a rate of its own per pair:

    q~_n = zeta^(n / B) * R_n q_n,    k~_m = zeta^(-m / B) * R_m k_m
    q~_n . k~_m = sum_k zeta_k^((n - m) / B) * (pair k of q_n^T R_{m-n} k_m)
    zeta_k = (2k / d + gamma) / (1 + gamma),   k = 0 .. d/2 - 1,   gamma = 0.4,  B = scale_base = 512

Every ``zeta_k < 1``: a key ``n - m`` tokens back is damped by ``zeta_k^((n - m)/B)``, most in the
high-frequency pairs (small ``k``), whose rotation is the least stable over long distances; the
low-frequency pairs, which carry long-range information, barely decay.  The score still depends on
``n - m`` only.  (The library's sign convention is ``j - i``, key minus query; the paper's ``n - m`` is
query minus key, ``>= 0`` in causal attention.)

**Causal only.**  In causal attention ``n >= m`` and the factor is a decay.  In a bidirectional stack
a key to the right of the query would be *amplified* by ``zeta^(-(m - n)/B)``; the paper defines xPos
for causal language models (and ``x-transformers`` refuses ``rotary_xpos`` without ``causal``).  This
library's bidirectional form, used by the encoder of ``build_model("xpos", ...)``, is the rotation
without the decay -- RoPE with xPos's pairing and frequencies -- and is *not* the paper's.

Numerics: the factors are computed in float32 from absolute positions (``zeta^(n/B)`` for the query
and ``zeta^(-m/B)`` for the key, no per-call centring, so a key cached at one step keeps its scale at
every later step and cached decoding is exact).  ``x-transformers`` centres the exponents on half the
current length instead; the product, and so every score, is the same.  The price of fixed centring is
range: ``zeta_0^(+-m/B)`` must stay inside float32 (and bfloat16), which holds for positions below about
``70 * B`` (35,700 for ``B = 512``); :class:`XPos` refuses positions beyond ``64 * B`` (32,695 for ``B = 512``:
``MAX_LOG_SCALE`` keeps a margin) on CPU with a clear error.
(float16 would overflow from about ``8.8 * B``.)  The paper's blockwise causal attention at inference
is a separate trick and is not part of the encoding.

Checked against ``x-transformers`` (``rotary_xpos=True``, ``rotary_xpos_scale_base``) in
tests/test_survey_positions.py.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import math

import torch

from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..checks import check_even, check_float_range, check_positive_int
from .rotary import RotaryCache, apply_rope_cos_sin_unchecked

#: the largest ``|log(factor)|`` allowed (float32 and bfloat16 hold ``exp(+-88)``; a margin for the product)
MAX_LOG_SCALE = 80.0


def xpos_zeta(rotary_dim: int, gamma: float = 0.4) -> torch.Tensor:
    """``(rotary_dim // 2,)`` float32 decay bases ``zeta_k = (2k / d + gamma) / (1 + gamma)``."""
    rotary_dim = check_even("rotary_dim", rotary_dim)
    gamma = check_float_range("gamma", gamma, 0.0, low_open=True)
    return (torch.arange(0, rotary_dim, 2, dtype=torch.float32) + gamma * rotary_dim) / ((1 + gamma) * rotary_dim)


def xpos_scales(positions: torch.Tensor, zeta: torch.Tensor, scale_base: float, interleaved: bool = True) -> torch.Tensor:
    """``(seq, 2 * len(zeta))`` float32 factors ``zeta_k^(position / scale_base)``, laid out like RoPE's cos/sin.

    The query takes these factors, the key their inverses (pass ``-positions``).
    """
    power = positions.to(torch.float32)[:, None] / scale_base
    scale = torch.exp(power * zeta.to(positions.device).log()[None, :])
    return scale.repeat_interleave(2, dim=-1) if interleaved else torch.cat((scale, scale), dim=-1)


@register_scheme(kind="rotary", group="survey", year=2023, arxiv="2212.10554",
                 paper="Sun et al. 2023, A Length-Extrapolatable Transformer (xPos)")
class XPos(PositionScheme):
    """RoPE plus xPos's per-pair decay in causal stacks; plain rotation (no decay) in bidirectional ones.

    Options: ``scale_base`` (``B``, 512 as in the paper and ``x-transformers``), ``gamma`` (0.4),
    ``base`` (RoPE's 10000), ``interleaved`` (pairs ``(x0, x1), ...`` as ``x-transformers``; ``False`` for
    the half-split pairing) and ``rotary_dim`` (rotate and scale only the first ``rotary_dim`` dimensions of
    each head; default all).  Keys are cached already rotated and scaled.
    """

    name = "xpos"
    enters = "q,k"

    def __init__(self, d_model, n_heads, num_layers, causal=False, scale_base: float = 512.0, gamma: float = 0.4,
                 base: float = 10000.0, interleaved: bool = True, rotary_dim: int | None = None):  # fmt: skip
        super().__init__(d_model, n_heads, num_layers, causal)
        self.scale_base = check_float_range("scale_base", scale_base, 0.0, low_open=True)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be True or False, got {interleaved!r}")
        if rotary_dim is None:  # every dimension: rotation pairs need an even head_dim
            self.rotary_dim = check_even("head_dim", self.head_dim)
        else:
            self.rotary_dim = check_positive_int("rotary_dim", rotary_dim)
            if self.rotary_dim > self.head_dim or self.rotary_dim % 2:
                raise ValueError(f"rotary_dim must be an even number in [2, head_dim={self.head_dim}], got {rotary_dim}")
        self.gamma = gamma
        self.register_buffer("zeta", xpos_zeta(self.rotary_dim, gamma), persistent=False)
        self.cache = RotaryCache(self.rotary_dim, base, interleaved)
        self.interleaved = interleaved
        #: the last position whose factors stay inside float32 (see the module docstring)
        self.max_position = int(MAX_LOG_SCALE * self.scale_base / -math.log(float(self.zeta[0])))

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.zeta.dtype != torch.float32:  # model.to(bfloat16) must not round the decay bases
            self.zeta = xpos_zeta(self.rotary_dim, self.gamma).to(self.zeta.device)
        return self

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        cos, sin = self.cache.cos_sin(q_pos)
        prep = {"q_pos": q_pos, "k_pos": k_pos, "cos": cos, "sin": sin}
        if not self.causal:  # the library's bidirectional form: rotation only (not the paper's)
            return prep
        if on_host(q_pos) and q_pos.numel() and int(q_pos.abs().max()) > self.max_position:
            raise ValueError(
                f"xpos: position {int(q_pos.abs().max())} is beyond position {self.max_position}, the last whose decay "
                f"factors zeta^(+-n/scale_base) float32 can hold with scale_base={self.scale_base:g}; "
                f"use a larger scale_base (the range grows in proportion)"
            )
        up = xpos_scales(q_pos, self.zeta, self.scale_base, self.interleaved)
        down = xpos_scales(-q_pos, self.zeta, self.scale_base, self.interleaved)
        return {**prep, "cos_q": cos * up, "sin_q": sin * up, "cos_k": cos * down, "sin_k": sin * down}

    def rotate(self, q, k, prep, layer):
        if self.causal:
            tables_q, tables_k = (prep["cos_q"], prep["sin_q"]), (prep["cos_k"], prep["sin_k"])
        else:
            tables_q = tables_k = (prep["cos"], prep["sin"])
        r = self.rotary_dim
        if r == self.head_dim:
            q_rot = apply_rope_cos_sin_unchecked(q, *tables_q, self.interleaved)
            return q_rot, apply_rope_cos_sin_unchecked(k, *tables_k, self.interleaved)
        q = torch.cat((apply_rope_cos_sin_unchecked(q[..., :r], *tables_q, self.interleaved), q[..., r:]), dim=-1)
        k = torch.cat((apply_rope_cos_sin_unchecked(k[..., :r], *tables_k, self.interleaved), k[..., r:]), dim=-1)
        return q, k

    def extra_repr(self):
        extra = f", rotary_dim={self.rotary_dim}" if self.rotary_dim != self.head_dim else ""
        form = "" if self.causal else " (bidirectional: rotation only, no decay)"
        return (f"causal={self.causal}{form}, scale_base={self.scale_base:g}, gamma={self.gamma}, "
                f"interleaved={self.interleaved}, base={self.cache.base}{extra}")  # fmt: skip
