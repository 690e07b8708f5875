"""Stretching RoPE past its training length: Position Interpolation, dynamic NTK, YaRN, Llama 3.

A model trained with RoPE (posenc_lib/schemes/rotary.py) on sequences of at most ``L`` tokens has seen
the rotation angle ``m * theta_k`` only for ``m < L``.  Every method here changes the frequency
spectrum ``theta_k = base^(-2k/d)`` (k = 0 .. d/2 - 1) so that positions up to ``s * L`` land on
angles the model has (nearly) seen:

* **linear** -- Position Interpolation (Chen, Wong, Chen & Tian 2023, "Extending Context Window
  of Large Language Models via Positional Interpolation", arXiv:2306.15595): every frequency is
  divided by ``s``, i.e. position ``m`` is read as ``m / s``::

      theta'_k = theta_k / s

* **dynamic** -- dynamic NTK-aware scaling (bloc97 and emozilla, 2023, posts on r/LocalLLaMA;
  ``rope_type="dynamic"`` in ``transformers``): raise the base instead, so the highest frequencies
  barely move and the lowest are interpolated; the amount follows the current length ``n``::

      base' = base * (s * n / L - (s - 1)) ** (d / (d - 2)),   n = max(seq_len, L)

* **ntk** -- static NTK-aware scaling (bloc97, 2023, r/LocalLLaMA; the rule dynamic NTK applies at each
  length, fixed to one factor): raise the base once so that the lowest frequency is divided by ``s``
  while the highest is kept::

      base' = base * s ** (d / (d - 2))

  ``transformers`` has no rope type of its own for it: its ``dynamic`` with ``factor = 1`` read at
  ``seq_len = s * L`` gives the same frequencies (tested).

* **yarn** -- YaRN (Peng, Quesnelle, Fan & Shippole 2023, arXiv:2309.00071): "NTK-by-parts".
  A frequency whose wavelength ``lambda_k = 2 pi / theta_k`` fits many times into ``L``
  (more than ``beta_fast`` turns) is kept; one that turns less than ``beta_slow`` times is
  interpolated like PI; a linear ramp ``gamma_k`` in between::

      theta'_k = (1 - gamma_k) * theta_k / s + gamma_k * theta_k

  and an attention temperature: cos and sin are multiplied by ``0.1 ln s + 1``, so every score
  ``q.k`` is multiplied by its square (softmax gets sharper to offset the longer context).

* **llama3** -- Llama 3.1's rule (Meta 2024, "The Llama 3 Herd of Models", arXiv:2407.21783):
  wavelengths shorter than ``L / high_freq_factor`` are kept, longer than ``L / low_freq_factor``
  are divided by ``s``, with a smooth blend in between (a ramp in ``L / lambda``, the number of
  turns in the original context).  Llama 4 Scout ships both factors equal to 1: a step at ``L``.

* **longrope** -- LongRoPE (Ding, Zhang, Zhang, Xu, Shang, Xu, Yang & Yang 2024, "LongRoPE: Extending
  LLM Context Window Beyond 2 Million Tokens", arXiv:2402.13753; Phi-3, arXiv:2404.14219): one rescale
  factor per frequency, found by search instead of a formula.  Two sets: ``short_factor`` while the
  sequence fits the original length ``L``, ``long_factor`` beyond it (the whole sequence switches)::

      theta'_k = theta_k / lambda_k,   lambda = short_factor if n <= L else long_factor

  and cos and sin are multiplied by ``sqrt(1 + ln s / ln L)`` (unless ``attention_factor`` is given).

* **proportional** -- p-RoPE (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu & Velickovic 2024,
  "Round and Round We Go! What makes Rotary Positional Encodings useful?", arXiv:2410.06205; Gemma 4's
  global layers): not a context extension but a cut.  Keep the full head's ladder
  ``theta_k = base^(-2k/d)`` for the fastest ``int(p * d // 2)`` pairs and set the slowest ones to
  zero (an angle of zero: those pairs carry no position)::

      theta'_k = theta_k / s  if k < int(p * d // 2)  else 0

  Not the same as GPT-NeoX's partial rotary (``RotaryScheme(rotary_dim=...)``), which rotates the
  first ``r`` dimensions with a ladder ``base^(-2k/r)`` spread over those ``r`` dimensions.

The ``scaling`` dictionaries use the ``rope_type`` convention of ``transformers``
(``config.rope_parameters``), and :func:`scaled_rope_frequencies` equals
``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]`` (tested).  It returns the new
``inv_freq`` (the ``theta'_k``) and the ``attention_scale`` by which cos and sin are multiplied.

Partial rotary (GPT-NeoX, Phi): rotate only the first ``rotary_dim`` of the ``head_dim``
dimensions; then ``head_dim`` here is ``rotary_dim``.  ``RotaryScheme(..., scaling=...,
rotary_dim=...)`` in rotary.py uses both, KV cache included.

Taught in notebooks/14_long_context.ipynb (linear, dynamic, yarn, llama3) and
notebooks/15_rope_in_llms.ipynb (longrope, proportional).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

from ..checks import INTEGER_DTYPES, check_bool, check_even, check_float_range, check_position_tensor

#: rope_type -> (required keys, optional keys with their defaults)
ROPE_TYPES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "linear": (("factor",), {}),
    "dynamic": (("factor", "original_max_position_embeddings"), {}),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        {"beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": None, "mscale": None, "mscale_all_dim": None,
         "truncate": True},
    ),  # fmt: skip
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), {}),
    "longrope": (("factor", "original_max_position_embeddings", "short_factor", "long_factor"), {"attention_factor": None}),
    "proportional": ((), {"factor": 1.0, "partial_rotary_factor": 1.0}),
    "ntk": (("factor",), {}),
}

#: the rope types whose frequencies depend on the current length (recomputed per call, not cached)
LENGTH_DEPENDENT = ("dynamic", "longrope")


def _number(rope_type: str, key: str, value: Any, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"scaling[{key!r}] for rope_type {rope_type!r} must be a finite number, got {value!r}")
    if value < minimum or (value == minimum and not inclusive):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"scaling[{key!r}] for rope_type {rope_type!r} must be {bound}, got {value!r}")
    return float(value)


def check_scaling(scaling: dict | None) -> dict | None:
    """Validate a ``scaling`` dict; returns a copy with defaults filled in (``None`` stays ``None``).

    ``ValueError`` names an unknown ``rope_type`` (with the valid ones), a missing or unknown key,
    or a bad value; ``TypeError`` if ``scaling`` is not a dict.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be None or a dict like {{'rope_type': 'linear', 'factor': 4}}, "
                        f"got {type(scaling).__name__}")  # fmt: skip
    if "rope_type" not in scaling:
        raise ValueError(f"scaling is missing 'rope_type'; valid rope types: {', '.join(ROPE_TYPES)}")
    rope_type = scaling["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; valid rope types: {', '.join(ROPE_TYPES)} "
                         f"(or scaling=None for plain RoPE)")  # fmt: skip
    required, optional = ROPE_TYPES[rope_type]
    missing = [k for k in required if k not in scaling]
    if missing:
        raise ValueError(f"scaling for rope_type {rope_type!r} is missing {missing}; it needs {list(required)}"
                         + (f" and accepts {sorted(optional)}" if optional else ""))  # fmt: skip
    unknown = sorted(set(scaling) - set(required) - set(optional) - {"rope_type"})
    if unknown:
        hint = " (pass the base as base=..., not in scaling)" if "rope_theta" in unknown else ""
        raise ValueError(f"unknown key(s) {unknown} in scaling for rope_type {rope_type!r}; valid keys: "
                         f"{['rope_type', *required, *sorted(optional)]}{hint}")  # fmt: skip
    out = {"rope_type": rope_type, **optional}
    out.update(scaling)
    out["factor"] = _number(rope_type, "factor", out["factor"], minimum=1.0, inclusive=True)
    if "original_max_position_embeddings" in required:
        L = out["original_max_position_embeddings"]
        if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
            raise ValueError(f"scaling['original_max_position_embeddings'] must be a positive integer "
                             f"(the training length), got {L!r}")  # fmt: skip
    if rope_type == "yarn":
        out["beta_fast"] = _number(rope_type, "beta_fast", out["beta_fast"])
        out["beta_slow"] = _number(rope_type, "beta_slow", out["beta_slow"])
        if out["beta_slow"] >= out["beta_fast"]:
            raise ValueError(f"scaling for rope_type 'yarn' needs beta_slow < beta_fast, "
                             f"got beta_slow={out['beta_slow']}, beta_fast={out['beta_fast']}")  # fmt: skip
        for k in ("attention_factor", "mscale", "mscale_all_dim"):
            if out[k] is not None:
                out[k] = _number(rope_type, k, out[k])
    if rope_type == "longrope":
        for k in ("short_factor", "long_factor"):
            v = out[k]
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) == 0:
                raise ValueError(f"scaling[{k!r}] for rope_type 'longrope' must be a non-empty list of numbers "
                                 f"(one per rotation pair, head_dim // 2 of them), got {v!r}")  # fmt: skip
            out[k] = tuple(_number(rope_type, f"{k}[{i}]", x) for i, x in enumerate(v))
        if out["attention_factor"] is not None:
            out["attention_factor"] = _number(rope_type, "attention_factor", out["attention_factor"])
    if rope_type == "proportional":
        out["partial_rotary_factor"] = _number(rope_type, "partial_rotary_factor", out["partial_rotary_factor"],
                                               inclusive=True)  # fmt: skip
        if out["partial_rotary_factor"] > 1:
            raise ValueError(f"scaling['partial_rotary_factor'] for rope_type 'proportional' is the fraction of "
                             f"pairs that rotate, in [0, 1]; got {out['partial_rotary_factor']!r}")  # fmt: skip
    if rope_type == "llama3":
        lo = _number(rope_type, "low_freq_factor", out["low_freq_factor"])
        hi = _number(rope_type, "high_freq_factor", out["high_freq_factor"])
        if lo > hi:
            raise ValueError(f"scaling for rope_type 'llama3' needs low_freq_factor < high_freq_factor, or both "
                             f"equal (a step with no blend, as Llama 4 Scout ships); got {lo} and {hi}")  # fmt: skip
    return out


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``); multiplies cos and sin."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_ramp(head_dim: int, base: float, factor_L: int, beta_fast: float, beta_slow: float,
              truncate: bool = True, device=None) -> torch.Tensor:  # fmt: skip
    """YaRN's ``gamma_k`` ``(head_dim // 2,)``: 1 keeps frequency k, 0 interpolates it, linear in between.

    The boundaries are the pair indices where a frequency turns ``beta_fast`` and ``beta_slow``
    times within the original length ``L = factor_L``: ``k(r) = d ln(L / (2 pi r)) / (2 ln base)``.
    """

    def dim_of(turns):
        return head_dim * math.log(factor_L / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if lo == hi:
        hi += 0.001  # as in the reference: avoid dividing by zero
    interpolate = ((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - lo) / (hi - lo)).clamp(0, 1)
    return 1.0 - interpolate


def scaled_rope_frequencies(
    head_dim: int, base: float = 10000.0, scaling: dict | None = None, seq_len: int | torch.Tensor | None = None,
    device=None,
) -> tuple[torch.Tensor, float]:  # fmt: skip
    """RoPE frequencies after context-extension scaling: ``(inv_freq, attention_scale)``.

    ``head_dim``: dimensions that rotate (``rotary_dim`` for partial rotary), even.
    ``scaling``: ``None`` (plain RoPE, ``theta_k = base^(-2k/d)``) or a dict with ``rope_type`` in
    ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``, ``proportional`` and that type's keys
    (see :data:`ROPE_TYPES`).
    ``seq_len``: the current length, used by ``dynamic`` and ``longrope`` only (an int, or a 0-d tensor
    so that no value has to leave the device); ``None`` means the training length, i.e. no scaling yet.
    Returns ``inv_freq (head_dim // 2,)`` float32 and the float ``attention_scale`` that
    multiplies cos and sin (1 except for YaRN and LongRoPE).
    """
    head_dim = check_even("head_dim", head_dim)
    if isinstance(base, bool) or not isinstance(base, Real) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    scaling = check_scaling(scaling)
    if isinstance(seq_len, torch.Tensor):  # a 0-d count on the device: its value is not read
        if seq_len.ndim != 0 or not (seq_len.dtype.is_floating_point or seq_len.dtype in INTEGER_DTYPES):
            raise TypeError(f"seq_len must be a number or a 0-d tensor (the current length), got a tensor of "
                            f"shape {tuple(seq_len.shape)} and dtype {seq_len.dtype}")  # fmt: skip
    elif seq_len is not None:
        check_float_range("seq_len", seq_len, 0.0)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    inv_freq = 1.0 / (base**exponents)
    if scaling is None:
        return inv_freq, 1.0
    rope_type, s = scaling["rope_type"], scaling["factor"]
    if rope_type == "linear":
        return inv_freq / s, 1.0
    if rope_type == "ntk":
        if head_dim < 4:
            raise ValueError(f"rope_type 'ntk' needs head_dim >= 4 (its exponent is d / (d - 2)), got {head_dim}")
        return 1.0 / ((base * s ** (head_dim / (head_dim - 2))) ** exponents), 1.0
    if rope_type == "dynamic":
        if head_dim < 4:
            raise ValueError(f"rope_type 'dynamic' needs head_dim >= 4 (its exponent is d / (d - 2)), got {head_dim}")
        L = scaling["original_max_position_embeddings"]
        if seq_len is None:
            n = L
        elif isinstance(seq_len, torch.Tensor):
            n = torch.clamp(seq_len.to(torch.float32), min=float(L))
        else:
            n = max(int(seq_len), L)
        new_base = base * ((s * n / L) - (s - 1)) ** (head_dim / (head_dim - 2))
        return 1.0 / (new_base**exponents), 1.0
    if rope_type == "yarn":
        L = scaling["original_max_position_embeddings"]
        keep = yarn_ramp(head_dim, base, L, scaling["beta_fast"], scaling["beta_slow"], scaling["truncate"],
                         device=inv_freq.device)
        inv_freq = (inv_freq / s) * (1 - keep) + inv_freq * keep
        if scaling["attention_factor"] is not None:
            scale = scaling["attention_factor"]
        elif scaling["mscale"] and scaling["mscale_all_dim"]:
            scale = yarn_mscale(s, scaling["mscale"]) / yarn_mscale(s, scaling["mscale_all_dim"])
        else:
            scale = yarn_mscale(s)
        return inv_freq, float(scale)
    if rope_type == "proportional":
        rotated = int(scaling["partial_rotary_factor"] * head_dim // 2)  # transformers' rounding, exactly
        return torch.cat((inv_freq[:rotated], torch.zeros_like(inv_freq[rotated:]))) / s, 1.0
    if rope_type == "longrope":
        L = scaling["original_max_position_embeddings"]
        for k in ("short_factor", "long_factor"):
            if len(scaling[k]) != head_dim // 2:
                raise ValueError(f"scaling[{k!r}] for rope_type 'longrope' has {len(scaling[k])} factors; "
                                 f"head_dim={head_dim} has {head_dim // 2} rotation pairs, one factor each")  # fmt: skip
        scale = scaling["attention_factor"]
        if scale is None:
            scale = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
        short = torch.tensor(scaling["short_factor"], dtype=torch.float32, device=inv_freq.device)
        long = torch.tensor(scaling["long_factor"], dtype=torch.float32, device=inv_freq.device)
        if isinstance(seq_len, torch.Tensor):  # pick the set on the device, without reading seq_len back
            ext = torch.where(seq_len > L, long, short)
        else:
            ext = long if seq_len is not None and int(seq_len) > L else short
        return 1.0 / (ext * base**exponents), float(scale)
    # llama3
    L = scaling["original_max_position_embeddings"]
    lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    if lo == hi:  # Llama 4 Scout: no blend band, a step at wavelength L / lo
        return torch.where(wavelen > L / lo, inv_freq / s, inv_freq), 1.0
    smooth = (L / wavelen - lo) / (hi - lo)  # 0 at wavelength L/lo, 1 at L/hi
    blended = (1 - smooth) * inv_freq / s + smooth * inv_freq
    out = torch.where(wavelen > L / lo, inv_freq / s, inv_freq)
    medium = (wavelen >= L / hi) & (wavelen <= L / lo)
    return torch.where(medium, blended, out), 1.0


def scaled_rope_cos_sin(
    positions: torch.Tensor, head_dim: int, base: float = 10000.0, interleaved: bool = True,
    scaling: dict | None = None, seq_len: int | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """cos and sin ``(seq, head_dim)`` float32 for ``positions (seq,)``, scaled, times ``attention_scale``."""
    check_position_tensor("positions", positions)
    check_bool("interleaved", interleaved)
    inv_freq, scale = scaled_rope_frequencies(head_dim, base, scaling, seq_len, device=positions.device)
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    ang = ang.repeat_interleave(2, dim=-1) if interleaved else torch.cat((ang, ang), dim=-1)
    if scale == 1.0:
        return ang.cos(), ang.sin()
    return ang.cos() * scale, ang.sin() * scale


def wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """``2 pi / theta_k``: how many positions one full turn of each frequency takes."""
    return 2 * math.pi / inv_freq
