"""Argument checks: each returns the value (as the type asked for) or raises a clear ``ValueError`` or
``TypeError`` naming the argument, the bad value and what would have been valid."""
from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np
import torch


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(map(repr, choices))}")


def check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_int_range(name: str, value: Any, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in ``[low, high]`` (no upper bound if ``high`` is None).

    A non-integer (a float, a string, a bool) is a ``TypeError``, an integer outside the range a
    ``ValueError``; both messages name the argument and the allowed range.
    """
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def check_float_range(
    name: str, value: Any, low: float, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> float:
    """Return ``value`` as a float if it is a finite number in the interval from ``low`` to ``high``.

    ``low_open``/``high_open`` exclude the end points: ``check_float_range("lr", x, 0, low_open=True)``
    accepts ``x > 0``.  NaN and infinities are refused; messages name the argument and the interval.
    """
    left, right = "(" if low_open else "[", ")" if high_open or high is None else "]"
    allowed = f"a finite number in {left}{low}, {'inf' if high is None else high}{right}"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low)
    if high is not None:
        ok = ok and (v < high if high_open else v <= high)
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return v


def check_even(name: str, value: int) -> int:
    value = check_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even (dimensions are used in sin/cos or rotation pairs), got {value}")
    return value


def check_divides(d_model: int, n_heads: int) -> int:
    """Return ``head_dim = d_model // n_heads`` or raise if it does not divide."""
    d_model = check_positive_int("d_model", d_model)
    n_heads = check_positive_int("n_heads", n_heads)
    if d_model % n_heads:
        valid = [h for h in range(1, d_model + 1) if d_model % h == 0]
        raise ValueError(
            f"n_heads={n_heads} does not divide d_model={d_model}; "
            f"valid n_heads for d_model={d_model}: {valid}"
        )
    return d_model // n_heads


def check_float_tensor(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not torch.is_floating_point(x):
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_token_tensor(name: str, x: Any) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(x).__name__}")
    if x.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (torch.int64), got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got shape {tuple(x.shape)}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token per row (length >= 1), got shape {tuple(x.shape)}")


def check_padding_mask(name: str, mask: Any, batch: int, length: int) -> None:
    """``None`` or a bool tensor of shape ``(batch, length)``, True at padding (the PyTorch convention)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor (True at padding) or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor (True at padding), got dtype {mask.dtype}")
    if tuple(mask.shape) != (batch, length):
        raise ValueError(f"{name} must have shape (batch, length) = {(batch, length)}, got {tuple(mask.shape)}")


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``; anything else (``"no"``, ``1``, ``None``) is a ``TypeError``."""
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


#: integer dtypes a tensor of positions or ids may have (bool is not one: True would be read as position 1)
INTEGER_DTYPES = frozenset(
    getattr(torch, name) for name in ("int8", "uint8", "int16", "int32", "int64", "uint16", "uint32", "uint64")
    if hasattr(torch, name)
)


def check_position_tensor(name: str, x: Any, *, integer: bool = False, dim: int | None = 1) -> None:
    """A tensor of positions: integer dtype (``integer=True``) or any real dtype (fractional positions, as RoPE's
    interpolation uses), never bool or complex; ``dim`` dimensions (``None``: any).

    Floating positions must be finite; that check reads the values, so it runs on CPU tensors only (no device
    synchronisation) and not while :func:`torch.compile` traces.  Dtype and shape checks run everywhere.
    """
    if not isinstance(x, torch.Tensor):
        kind = "integer" if integer else "real"
        raise TypeError(f"{name} must be a torch.Tensor of {kind} positions, got {type(x).__name__}")
    dtype = x.dtype  # read once: the check runs at every forward pass and decoding step
    floating = dtype.is_floating_point
    if dtype not in INTEGER_DTYPES and (integer or not floating):
        if integer:
            raise TypeError(f"{name} must hold integer positions (an integer dtype such as torch.int64), got dtype {dtype}")
        raise TypeError(f"{name} must hold real positions (an integer or floating-point dtype), got dtype {dtype}")
    if dim is not None and x.ndim != dim:
        what = "1-D (one position per token)" if dim == 1 else f"{dim}-D"
        raise ValueError(f"{name} must be {what}, got shape {tuple(x.shape)}")
    if floating and x.numel() and x.device.type == "cpu" and not torch.compiler.is_compiling():
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            i = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(f"{name} must hold finite positions, got {float(x.reshape(-1)[i])} at index {i}")


def unique_choices(what: str, names: Iterable[str], valid: Sequence[str]) -> list[str]:
    """``names`` in order without repeats (one named twice runs once); any not in ``valid`` is refused with a
    ``ValueError`` that names it and the valid choices."""
    names = list(dict.fromkeys(names))
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; valid choices: {', '.join(valid)}")
    return names
