"""Statistics over a few seeds: the 95% t-interval of a mean (:func:`interval95`, :func:`t_quantile_975`)."""
from __future__ import annotations

import math


#: two-sided 95% quantiles of Student's t for 1..10 degrees of freedom (then the normal's 1.96 is within 2.3%)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_quantile_975(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (``dof >= 1``)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def interval95(values: list[float]) -> tuple[float, float]:
    """``(mean, half-width)`` of the 95% t-interval of the mean; the half-width is ``nan`` for one value."""
    if not values:
        raise ValueError("no values to summarise")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile_975(n - 1) * sd / math.sqrt(n)
