"""RoPE's frequency ladder in today's LLMs: which pairs rotate, how fast, and what a context of n tokens sees.

Lesson 06's RoPE rotates pair ``k`` of a ``d``-dimensional head by ``m * theta_k`` with
``theta_k = base^(-2k/d)``, ``k = 0 .. d/2 - 1`` (fast to slow).  Open models change that ladder in two ways:

* **Which pairs rotate.**  Two different things share the name "partial rotary":

  - *NeoX-style* (Black et al. 2022, "GPT-NeoX-20B", arXiv:2204.06745; also GPT-J, Phi-2, StableLM;
    ``partial_rotary_factor`` of ``transformers``' default rope): rotate the first ``r`` dimensions of each
    head with a ladder spread over those ``r`` dimensions, ``theta_k = base^(-2k/r)``, ``k < r/2`` -- the
    full range of speeds, sampled more coarsely -- and leave the other ``d - r`` dimensions alone.
  - *p-RoPE*, "proportional" (Barbero et al. 2024, "Round and Round We Go! What makes Rotary Positional
    Encodings useful?", arXiv:2410.06205; Gemma 4's global layers; ``rope_type="proportional"``): keep
    the *full* head's ladder ``base^(-2k/d)`` for the fastest ``int(p d // 2)`` pairs and set the slowest
    pairs' frequency to zero -- the slow end is cut, the fast end kept as it was.

  Both rotate the same number of pairs for the same fraction (``rotary_pairs`` below, the rounding of
  ``transformers``' proportional rope); they differ in the speeds those pairs turn at.

* **How fast.**  A pair completes a full turn within ``n`` positions when ``(n - 1) theta_k >= 2 pi``
  (its wavelength ``2 pi / theta_k`` is at most ``n - 1``).  Raising the base (500,000 in Llama 3,
  1,000,000 in Qwen2.5 and Gemma 3's global layers) slows every pair but the first.  Men et al. 2024
  ("Base of RoPE Bounds Context Length", arXiv:2405.14591) argue that the base bounds the context a model
  can use: for a query ``q`` and a key ``k* = q + noise`` that resembles it, the expected score gap over
  an unrelated key at distance ``m`` is proportional to::

      B(m) = sum_k cos(m theta_k)

  and a model can only prefer similar tokens at distance ``m`` while ``B(m) >= 0``.  For a context of
  ``L`` tokens the base must be at least the smallest one with ``B(m) >= 0`` for every ``m <= L``
  (:func:`base_lower_bound`).

Taught in notebooks/15_rope_in_llms.ipynb (sections 1 and 2).
"""
from __future__ import annotations

import math
from numbers import Real

import torch

from .rope_scaling import scaled_rope_frequencies
from ..checks import check_even, check_positive_int

__all__ = ["PARTIAL_KINDS", "rotary_pairs", "partial_rotary_ladder", "full_turn_pairs", "similarity_margin",
           "first_negative_margin", "base_lower_bound"]  # fmt: skip

#: the two meanings of "partial rotary": GPT-NeoX's ("neox") and p-RoPE ("proportional")
PARTIAL_KINDS = ("neox", "proportional")


def _check_fraction(fraction) -> float:
    if isinstance(fraction, bool) or not isinstance(fraction, Real) or not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be a number in [0, 1] (the share of each head that rotates), got {fraction!r}")
    return float(fraction)


def _check_base(base) -> float:
    if isinstance(base, bool) or not isinstance(base, Real) or not base > 1 or not math.isfinite(base):
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    return float(base)


def rotary_pairs(fraction: float, head_dim: int) -> int:
    """Pairs that rotate when ``fraction`` of a ``head_dim`` head does: ``int(fraction * head_dim // 2)``.

    The rounding of ``transformers``' proportional rope; NeoX-style partial rotary then rotates
    ``rotary_dim = 2 * pairs`` dimensions (always even, unlike ``int(head_dim * fraction)``).
    """
    head_dim = check_even("head_dim", head_dim)
    return int(_check_fraction(fraction) * head_dim // 2)


def partial_rotary_ladder(kind: str, fraction: float, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The ``(head_dim // 2,)`` frequencies of a head that rotates ``fraction`` of itself, fast to slow.

    ``kind="neox"``: the rotated pairs turn at ``base^(-2k/r)`` (``r = 2 * pairs``); ``"proportional"``:
    at ``base^(-2k/head_dim)``, the full head's ladder.  Pairs that do not rotate read 0 (an angle of
    zero at every position).  ``fraction`` 1 gives plain RoPE for both kinds, 0 gives no rotation.
    """
    if kind not in PARTIAL_KINDS:
        raise ValueError(f"unknown partial rotary kind {kind!r}; valid kinds: {', '.join(PARTIAL_KINDS)}")
    head_dim, base = check_even("head_dim", head_dim), _check_base(base)
    pairs = rotary_pairs(fraction, head_dim)
    if kind == "proportional":
        return scaled_rope_frequencies(head_dim, base, {"rope_type": "proportional", "partial_rotary_factor": fraction})[0]
    out = torch.zeros(head_dim // 2)
    if pairs:
        out[:pairs] = scaled_rope_frequencies(2 * pairs, base)[0]
    return out


def full_turn_pairs(head_dim: int, base: float, n: int) -> int:
    """How many of the ``head_dim // 2`` pairs complete a full turn within ``n`` positions:
    ``(n - 1) theta_k >= 2 pi`` (the definition of lesson 14)."""
    theta = scaled_rope_frequencies(check_even("head_dim", head_dim), _check_base(base))[0].double()
    return int(((check_positive_int("n", n) - 1) * theta >= 2 * math.pi).sum())


def similarity_margin(distances: torch.Tensor, head_dim: int, base: float, scaling: dict | None = None) -> torch.Tensor:
    """Men et al.'s ``B(m) = sum_k cos(m theta_k)`` for each distance ``m`` in ``distances`` (float64).

    Proportional to how much more a query attends to a similar key than to an unrelated one at
    distance ``m`` (for random queries of equal variance per dimension); ``B(0) = head_dim / 2``.
    ``scaling``: read the spectrum after a rescaling of rope_scaling.py (for example Llama 3.1's).
    """
    theta = scaled_rope_frequencies(check_even("head_dim", head_dim), _check_base(base), scaling)[0].double()
    m = torch.as_tensor(distances, dtype=torch.float64)
    return torch.cos(m[..., None] * theta).sum(-1)


def first_negative_margin(head_dim: int, base: float, max_distance: int, scaling: dict | None = None) -> int | None:
    """The smallest distance ``m <= max_distance`` with ``B(m) < 0``, or ``None`` if there is none.

    Looks in growing chunks (256, 512, ... up to 65,536 distances), so a base that fails early costs little."""
    max_distance = check_positive_int("max_distance", max_distance)
    start, chunk = 0, 256
    while start <= max_distance:
        m = torch.arange(start, min(start + chunk, max_distance + 1), dtype=torch.float64)
        neg = (similarity_margin(m, head_dim, base, scaling) < 0).nonzero()
        if neg.numel():
            return int(m[neg[0, 0]])
        start, chunk = start + chunk, min(2 * chunk, 65536)
    return None


def base_lower_bound(context_len: int, head_dim: int, *, low: float = 10.0, high: float = 1e10,
                     step: float = 0.005) -> float:  # fmt: skip
    """The smallest base with ``B(m) >= 0`` for every ``m <= context_len``, on a grid of ``step`` decades.

    ``B`` does not grow with the base everywhere: just above this bound a band of bases (a few tenths of a
    decade wide) fails again at some distance (the tests show one), so the grid is scanned upwards from ``low``
    rather than bisected.  ``ValueError`` if no base up to ``high`` qualifies.
    """
    context_len, head_dim = check_positive_int("context_len", context_len), check_even("head_dim", head_dim)
    lo, hi = math.log10(_check_base(low)), math.log10(_check_base(high))
    if not (isinstance(step, Real) and step > 0):
        raise ValueError(f"step must be a positive number of decades, got {step!r}")
    for i in range(int(round((hi - lo) / step)) + 1):
        base = 10 ** (lo + i * step)
        if first_negative_margin(head_dim, base, context_len) is None:
            return float(base)
    raise ValueError(f"no base in [{low:g}, {high:g}] keeps B(m) >= 0 up to context_len={context_len} "
                     f"with head_dim={head_dim}; raise high")  # fmt: skip
