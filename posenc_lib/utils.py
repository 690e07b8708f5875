"""Small helpers shared by the library, the tests and the notebooks.

* :func:`set_seed` -- the one place where random, numpy and torch are seeded.
* ``check_*`` -- argument checks that raise a clear ``ValueError``/``TypeError``
  naming the bad value and what would have been valid.
* :class:`CliParser` -- the command lines' argument parser: a bad flag is one line
  on stderr and exit status 2.
* :func:`atomic_write_text` / :func:`atomic_torch_save` -- write to a temporary
  file and rename, so a crash never leaves a half-written result behind.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

#: the repository's root folder (the shipped data lives in ``REPO_ROOT / "data"``)
REPO_ROOT = Path(__file__).resolve().parent.parent


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the platform reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy and PyTorch (CPU and every GPU).

    Every notebook calls this in its first cell, every experiment once per run.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    if not -(2**63) <= seed < 2**64:
        raise ValueError(f"seed must lie in [-2**63, 2**64 - 1] (what torch accepts), got {seed}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


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
    ok = np.isfinite(v) and (v > low if low_open else v >= low)
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


class CliParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line on stderr and exit status 2.

    argparse prints the whole usage block before the error; on a long command line the one line
    that matters scrolls out of view.  Here the error is the only line, with a pointer to ``--help``.
    """

    def error(self, message: str):  # noqa: D102 (argparse's hook)
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):  # noqa: D102
        ns, extras = super().parse_known_args(args, namespace)
        for action in self._actions:  # Python 3.11's argparse turns "--flag=--" into [] instead of an error
            value = getattr(ns, action.dest, None)
            if action.option_strings and action.nargs is None and value == [] and action.default != []:
                self.error(f"argument {action.option_strings[-1]}: expected one value")
        return ns, extras


def _default_file_mode() -> int:
    """The mode ``open()`` would give a new file (0o666 less the umask); ``mkstemp`` alone gives 0o600."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _default_file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON value in ``path``; a damaged file raises ``ValueError`` naming it and saying what to do.

    Result files are written atomically, so a damaged one was edited by hand or copied in part;
    deleting it lets a resumable run make it again.
    """
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                         "delete it (a rerun makes it again) or restore it") from None  # fmt: skip
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}); "
                         "delete it (a rerun makes it again) or restore it") from None  # fmt: skip


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, _default_file_mode())
        finally:
            os.close(fd)
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``rel[i, j] = k_pos[j] - q_pos[i]`` (key minus query), shape ``(q_len, k_len)``."""
    return k_pos[None, :] - q_pos[:, None]


def table_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A score bias read from a table of per-distance values: ``(n, heads)`` ``table`` and ``(q_len, k_len)``
    int64 rows ``index`` -> ``(1, heads, q_len, k_len)`` float32, ``bias[0, h, i, j] = table[index[i, j], h]``.

    One lookup instead of evaluating a function of the distance at every (query, key) pair; the gradient
    sums per table row (as T5's bucket table)."""
    return torch.nn.functional.embedding(index, table.float()).permute(2, 0, 1)[None]
