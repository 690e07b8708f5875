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
  ``L`` tokens the base must be at least the smallest one with ``B(m) >= 0`` for every ``m <= L``.
  ``B`` is not monotone in the base: the bases that pass form windows, some narrow, so a search reports
  a failing and a passing base within a tolerance (:func:`base_bound_interval`) found on a stated grid,
  and the bases above that fail again (:func:`failing_base_windows`).

Taught in notebooks/15_rope_in_llms.ipynb (sections 1 and 2).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from numbers import Real
from typing import NamedTuple

import torch

from .rope_scaling import scaled_rope_frequencies
from ..checks import check_even, check_float_range, check_positive_int

__all__ = ["PARTIAL_KINDS", "rotary_pairs", "partial_rotary_ladder", "full_turn_pairs", "similarity_margin",
           "first_negative_margin", "BaseBracket", "base_bound_interval", "base_lower_bound",
           "failing_base_windows"]  # fmt: skip

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


@contextmanager
def _one_thread():
    """Run torch on one thread inside the block: the margin's matrix products are small, and on busy cores
    several threads spend their time waiting for each other (tens of times slower), not sharing the work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _margin_run(theta: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``B(m)`` for ``m = start .. start + count - 1`` (float64), with about ``2 sqrt(count)`` cosines per pair.

    ``cos((a + j) theta) = Re(e^{i a theta} e^{i j theta})``: the distances are cut into blocks of ``K`` and
    one complex matrix product sums the pairs, so a long run costs a product instead of ``count * d/2`` cosines."""
    K = max(1, math.isqrt(count))
    blocks = -(-count // K)
    j = torch.arange(K, dtype=torch.float64)[:, None] * theta                  # (K, pairs): j theta
    a = theta[:, None] * (start + K * torch.arange(blocks, dtype=torch.float64))  # (pairs, blocks): a theta
    steps, heads = torch.polar(torch.ones_like(j), j), torch.polar(torch.ones_like(a), a)
    return (steps @ heads).real.T.reshape(-1)[:count]


def first_negative_margin(head_dim: int, base: float, max_distance: int, scaling: dict | None = None) -> int | None:
    """The smallest distance ``m <= max_distance`` with ``B(m) < 0``, or ``None`` if there is none.

    Looks in growing chunks (256, 512, ... up to 65,536 distances), so a base that fails early costs little;
    runs on one torch thread and restores the thread count after."""
    max_distance = check_positive_int("max_distance", max_distance)
    theta = scaled_rope_frequencies(check_even("head_dim", head_dim), _check_base(base), scaling)[0].double()
    start, chunk = 0, 256
    with _one_thread():
        while start <= max_distance:
            count = min(chunk, max_distance + 1 - start)
            neg = (_margin_run(theta, start, count) < 0).nonzero()
            if neg.numel():
                return start + int(neg[0, 0])
            start, chunk = start + count, min(2 * chunk, 65536)
    return None


class BaseBracket(NamedTuple):
    """Two bases within a relative tolerance of each other: ``lower`` fails, ``upper`` passes.

    ``lower``: some distance ``m <= context_len`` has ``B(m) < 0`` (the first one is ``fails_at``);
    ``upper``: ``B(m) >= 0`` for every ``m <= context_len``; ``upper / lower <= 1 + rtol``."""
    lower: float
    upper: float
    fails_at: int


def _grid(names: tuple[str, str], low, high, step) -> tuple[float, float, float]:
    """``log10`` of the ends of a base range and its grid step in decades, checked."""
    lo = math.log10(check_float_range(names[0], low, 1.0, low_open=True))
    hi = math.log10(check_float_range(names[1], high, 1.0, low_open=True))
    if not lo < hi:
        raise ValueError(f"{names[0]} must be smaller than {names[1]}, got {names[0]}={low!r}, {names[1]}={high!r}")
    step = check_float_range("step", step, 0.0, hi - lo, low_open=True)
    return lo, hi, step


def base_bound_interval(context_len: int, head_dim: int, *, low: float = 10.0, high: float = 1e10,
                        step: float = 0.01, rtol: float = 1e-3) -> BaseBracket:  # fmt: skip
    """Where the base first keeps ``B(m) >= 0`` for every ``m <= context_len``, to a relative tolerance ``rtol``.

    Scans bases upwards from ``low`` on a grid of ``step`` decades; the first grid base that passes and the
    grid base before it (which fails) bracket a change from failing to passing, and bisection on the log of
    the base, keeping a failing lower end and a passing upper end, narrows it until ``upper / lower <= 1 +
    rtol`` (``rtol`` in ``[1e-12, 1)``).  ``B`` is not monotone in the base, so this is a bracket, not a proof
    of minimality: the passing bases form windows, every grid base from ``low`` to ``lower`` fails, but a
    window narrower than ``step`` can hide below, and bases above ``upper`` can fail again
    (:func:`failing_base_windows`).  ``low`` must itself fail (else ``ValueError``: lower it); ``ValueError``
    too if no grid base up to ``high`` passes.
    """
    context_len, head_dim = check_positive_int("context_len", context_len), check_even("head_dim", head_dim)
    lo, hi, step = _grid(("low", "high"), low, high, step)
    rtol = check_float_range("rtol", rtol, 1e-12, 1.0, high_open=True)
    first = first_negative_margin(head_dim, 10**lo, context_len)
    if first is None:
        raise ValueError(f"low={low!r} already keeps B(m) >= 0 up to context_len={context_len} with "
                         f"head_dim={head_dim}; choose a smaller low so that the scan starts below the bound")
    for i in range(1, int((hi - lo) / step + 1e-9) + 1):
        upper = 10 ** (lo + i * step)
        neg = first_negative_margin(head_dim, upper, context_len)
        if neg is None:
            break
        first = neg
    else:
        raise ValueError(f"no base in [{low:g}, {high:g}] keeps B(m) >= 0 up to context_len={context_len} "
                         f"with head_dim={head_dim}; raise high")  # fmt: skip
    a, b = math.log10(upper) - step, math.log10(upper)   # 10**a fails (first negative at `first`), 10**b passes
    while 10 ** (b - a) > 1 + rtol:
        mid = (a + b) / 2
        neg = first_negative_margin(head_dim, 10**mid, context_len)
        if neg is None:
            b = mid
        else:
            a, first = mid, neg
    return BaseBracket(float(10**a), float(10**b), first)


def base_lower_bound(context_len: int, head_dim: int, *, low: float = 10.0, high: float = 1e10,
                     step: float = 0.01, rtol: float = 1e-3) -> float:  # fmt: skip
    """The smallest base found with ``B(m) >= 0`` for every ``m <= context_len``: the ``upper`` end of
    :func:`base_bound_interval` (same arguments), a passing base within ``rtol`` of a failing one."""
    return base_bound_interval(context_len, head_dim, low=low, high=high, step=step, rtol=rtol).upper


def failing_base_windows(context_len: int, head_dim: int, start: float, stop: float, *,
                         step: float = 0.005) -> list[tuple[float, float]]:  # fmt: skip
    """Runs of failing bases on a grid of ``step`` decades from ``start`` to ``stop``: ``(first, last)`` of each.

    A base fails when some ``m <= context_len`` has ``B(m) < 0``.  Started at a bound from
    :func:`base_bound_interval`, the runs are the bases above it that fail again (``B`` is not monotone in
    the base).  Between grid points nothing is known: a run can hide passing windows narrower than ``step``,
    and each failing stretch ends less than one step beyond its run (the next grid base passes).
    """
    context_len, head_dim = check_positive_int("context_len", context_len), check_even("head_dim", head_dim)
    lo, hi, step = _grid(("start", "stop"), start, stop, step)
    windows, run = [], None
    for i in range(int((hi - lo) / step + 1e-9) + 1):
        base = float(10 ** (lo + i * step))
        if first_negative_margin(head_dim, base, context_len) is None:
            if run:
                windows.append(tuple(run))
            run = None
        else:
            run = [base, base] if run is None else [run[0], base]
    if run:
        windows.append(tuple(run))
    return windows
