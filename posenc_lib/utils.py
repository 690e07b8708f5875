"""Small helpers shared by the library, the tests and the notebooks.

* :func:`set_seed` -- the one place where random, numpy and torch are seeded.
* ``check_*`` -- argument checks that raise a clear ``ValueError``/``TypeError``
  naming the bad value and what would have been valid.
* :class:`CliParser` -- the command lines' argument parser: a bad flag is one line
  on stderr and exit status 2.
* :func:`atomic_write_text` / :func:`atomic_torch_save` -- write to a temporary
  file and rename, so a crash never leaves a half-written result behind.
* the write policy's other pieces (README, "Contributing"): :class:`FolderLock` (one writer per
  folder), :func:`refuse_overwrite`, :func:`check_folder_path` / :func:`check_file_path` (an output
  path that cannot be written is named before any work), :class:`WorkerPool` (Ctrl-C stops every worker),
  :func:`read_lines_exact` / :func:`one_line` (one item per line, whatever it holds),
  :func:`load_weights` (weights read safely, a damaged file named).
* :func:`interval95` / :func:`t_quantile_975` -- the 95% t-interval of a mean over a few seeds.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

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
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:  # exactly these characters, no \r added
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


# -- statistics over seeds ---------------------------------------------------------------------------
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


def relative_positions(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``rel[i, j] = k_pos[j] - q_pos[i]`` (key minus query), shape ``(q_len, k_len)``."""
    return k_pos[None, :] - q_pos[:, None]


def table_bias(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A score bias read from a table of per-distance values: ``(n, heads)`` ``table`` and ``(q_len, k_len)``
    int64 rows ``index`` -> ``(1, heads, q_len, k_len)`` float32, ``bias[0, h, i, j] = table[index[i, j], h]``.

    One lookup instead of evaluating a function of the distance at every (query, key) pair; the gradient
    sums per table row (as T5's bucket table)."""
    return torch.nn.functional.embedding(index, table.float()).permute(2, 0, 1)[None]


def toeplitz_bias(values: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """A score bias that depends only on ``j - i``, from one row per offset: ``(q_len + k_len - 1, heads)``
    ``values`` -> ``(1, heads, q_len, k_len)`` float32, ``bias[0, h, i, j] = values[j - i + q_len - 1, h]``.

    Same values as :func:`table_bias` with ``index[i, j] = j - i + q_len - 1``, built as overlapping windows
    of one vector (``unfold``); the gradient is summed along each diagonal (:func:`diagonal_sums`) instead of
    through an index of ``q_len * k_len`` rows (the embedding backward of :func:`table_bias` sorts them)."""
    if values.shape[0] != q_len + k_len - 1:
        raise ValueError(f"values must have q_len + k_len - 1 = {q_len + k_len - 1} rows, got {values.shape[0]}")
    return _Toeplitz.apply(values.float().t().contiguous(), k_len)


#: :func:`diagonal_sums` of a tall gradient works through blocks of at most this many rows (a few MB of buffer)
DIAGONAL_ROWS = 128


def open_keys(allowed: torch.Tensor) -> int:
    """How many leading keys every row of the boolean ``allowed (..., rows, n)`` may see (read on the host): a
    causal block of queries sees every key before its first query, so only the keys after need a mask."""
    seen = allowed.reshape(-1, allowed.shape[-1]).view(torch.uint8).amin(0)  # 1 where every row sees the key
    return int(seen.argmin()) if int(seen.min()) == 0 else seen.numel()  # argmin: the first of the minima


def fill_closed_(t: torch.Tensor, allowed: torch.Tensor, value: float) -> torch.Tensor:
    """``t.masked_fill_(~allowed, value)`` that reads and writes only the keys from the first one some row may not
    see (:func:`open_keys`): a causal block of 128 queries fills 128 of its keys, not all of them.  One layer's 16
    ALiBi blocks at L = 2048, batch 1 were laid out in 2-3 ms instead of 3-16 ms; the whole training step, side by
    side with the library before (``benchmarks.side_by_side``, 3 rounds of 3 repeats): t5 1.37 -> 1.36, alibi 1.24
    -> 1.21, t5's rounds between 1.34 and 1.47, so the change is within the spread between runs."""
    c0 = open_keys(allowed) if allowed.shape[-1] == t.shape[-1] and allowed.device.type == "cpu" else 0  # no device read
    if c0 < t.shape[-1]:
        t[..., c0:].masked_fill_(~allowed[..., c0:], value)
    return t


def diagonal_sums(grad: torch.Tensor) -> torch.Tensor:
    """``(heads, rows, n) -> (heads, rows + n - 1)``: ``out[h, j - i + rows - 1] = sum of grad[h, i, j]`` along
    each diagonal (the gradient of a bias laid out from one value per offset ``j - i``).

    Each block of rows is copied into a zeroed ``(heads, block, block + n - 1)`` buffer through a view whose row
    stride is one less than the buffer's, which puts each diagonal in one column; a sum over rows finishes it."""
    h, rows, n = grad.shape
    out = grad.new_zeros(h, rows + n - 1)
    for start in range(0, rows, DIAGONAL_ROWS):
        end = min(start + DIAGONAL_ROWS, rows)
        r = end - start
        width = r + n - 1
        buf = grad.new_zeros(h, r, width)
        buf.as_strided((h, r, n), (r * width, width - 1, 1), r - 1).copy_(grad[:, start:end])
        out[:, rows - end : rows - end + width] += buf.sum(1)  # block rows start:end sit at offsets from rows - end
    return out


class _Toeplitz(torch.autograd.Function):
    """``window (heads, q_len + n - 1) -> (1, heads, q_len, n)``, ``out[0, h, i, j] = window[h, j - i + q_len - 1]``."""

    @staticmethod
    def forward(ctx, window, n: int):
        return window.unfold(-1, n, 1).flip(-2).contiguous()[None]

    @staticmethod
    def backward(ctx, grad):
        return diagonal_sums(grad[0]), None


def consecutive(pos: torch.Tensor) -> bool:
    """True when the 1-d host tensor ``pos`` is ``start, start + 1, ...`` (positions of one unbroken window)."""
    n = pos.numel()
    return n > 0 and int(pos[-1]) - int(pos[0]) == n - 1 and (n == 1 or bool((pos.diff() == 1).all()))


# -- the write policy: nothing a user has is destroyed ----------------------------------------------
#: the lock file a command keeps in a folder while it writes there (see :class:`FolderLock`)
LOCK_NAME = ".posenc-lock"
#: the exit status of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it
INTERRUPTED = 130


class FolderLocked(ValueError):
    """Another living process writes the folder (see :class:`FolderLock`)."""


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, Linux's ``/proc``), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the command name in (...) may hold spaces


def _process_alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    except OSError:
        return False
    now = _process_start(pid)
    return start is None or now is None or now == start  # a recycled PID started at another time


def _age_s(path: Path) -> float:
    import time as _time

    try:
        return _time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


_HELD: dict[Path, int] = {}  # lock files this process holds -> how many times (re-entrant)


class FolderLock:
    """``with FolderLock(folder):`` -- the one process that writes ``folder`` until the block ends.

    The lock is a file ``folder/.posenc-lock`` holding the PID, the host, the start time and the
    command line of its holder, created atomically (``O_EXCL``).  A second process is refused with
    :class:`FolderLocked` (a ``ValueError``) naming the holder; a lock left by a process that no
    longer runs (``kill -9``, a power cut) is taken over with a note.  The lock is removed when the
    block ends, also on an error or Ctrl-C.  It is re-entrant within one process, so a function that
    locks its folder may call another that locks it too.  Under ``--jobs N`` the parent holds it, under
    torchrun rank 0 (the other ranks do not write shared files).
    """

    def __init__(self, folder: str | os.PathLike, *, what: str = "folder", log=print):
        self.folder = Path(folder)
        self.path = (self.folder / LOCK_NAME).absolute()
        self.what, self.log = what, log

    def _holder(self) -> dict | None:
        try:
            info = json.loads(self.path.read_text(encoding="utf-8"))
            return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # empty or damaged: its writer died while writing it

    def acquire(self) -> "FolderLock":
        if _HELD.get(self.path):
            _HELD[self.path] += 1
            return self
        check_folder_path(self.folder, self.what)  # a ValueError naming the flag, not a raw NotADirectoryError
        self.folder.mkdir(parents=True, exist_ok=True)
        import socket
        import sys as _sys
        import time as _time

        me = {"pid": os.getpid(), "host": socket.gethostname(), "start": _process_start(os.getpid()),
              "since": _time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(_sys.argv)[:300]}
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = self._holder()
                if info is None:
                    continue  # released meanwhile: try again
                pid = info.get("pid")
                if pid is None and _age_s(self.path) < 5:  # just created: its holder is writing it
                    _time.sleep(0.1)
                    continue
                here = info.get("host") in (None, me["host"])
                workers = [w for w in info.get("workers") or [] if isinstance(w, dict) and isinstance(w.get("pid"), int)]
                living = [w["pid"] for w in workers if here and _process_alive(w["pid"], w.get("start"))]
                if pid is not None and here and living and not _process_alive(pid, info.get("start")):
                    raise FolderLocked(
                        f"{self.folder} is still being written by worker process(es) {', '.join(map(str, living))} of "
                        f"pid {pid}, which no longer runs ({info.get('command') or '?'}); wait for them to end or stop "
                        f"them (kill {' '.join(map(str, living))}), then run again") from None
                if pid is not None and (not here or _process_alive(pid, info.get("start"))):
                    where = "" if here else f" on host {info.get('host')}"
                    raise FolderLocked(
                        f"{self.folder} is being written by another process (pid {pid}{where}, since "
                        f"{info.get('since', '?')}: {info.get('command') or '?'}); wait for it to finish or stop it, "
                        f"or use another {self.what}; if that process is gone, delete {self.path}") from None
                self.log(f"note: {self.path} was left by pid {pid if pid is not None else '?'}, which no longer "
                         "runs; taking it over")
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(me) + "\n")
            _HELD[self.path] = 1
            return self
        raise FolderLocked(f"could not lock {self.folder}: {self.path} keeps reappearing; is another process "
                           "starting in the same folder?")

    @staticmethod
    def add_workers(pids: Iterable[int]) -> None:
        """Record worker processes in every lock this process holds: a later run does not take the lock over
        while one of them still runs, even if this process was killed."""
        entries = [{"pid": int(p), "start": _process_start(int(p))} for p in pids]
        for path in list(_HELD):
            try:
                info = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(info, dict) or info.get("pid") != os.getpid():
                continue
            known = {w.get("pid") for w in info.get("workers") or []}
            info["workers"] = [*(info.get("workers") or []), *(e for e in entries if e["pid"] not in known)]
            atomic_write_text(path, json.dumps(info) + "\n")

    def release(self) -> None:
        n = _HELD.get(self.path, 0)
        if n > 1:
            _HELD[self.path] = n - 1
            return
        _HELD.pop(self.path, None)
        if n and (self._holder() or {}).get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _file_above(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` if it is not a folder (then nothing can be made at ``path``)."""
    for parent in path.parents:
        if os.path.lexists(parent):
            return None if parent.is_dir() else parent
    return None


def check_folder_path(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a ``Path`` if it is a folder or one can be made there; else ``ValueError`` naming it and the fix.

    Checked before any work: a path that is a file, or lies under one (``afile/sub``), would otherwise fail
    in ``mkdir`` with a raw ``NotADirectoryError``, for some commands only after the work was done.
    """
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise ValueError(f"{what} {path} is a file; give a folder")
    above = _file_above(path)
    if above is not None:
        raise ValueError(f"{what} {path} lies under {above}, which is a file; give another {what}")
    return path


def check_file_path(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a ``Path`` if a file can be written there (it is not a folder and lies under none that is a
    file); else ``ValueError`` naming it and the fix.  Whether an existing file may be replaced is
    :func:`refuse_overwrite`'s question."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder; give a file name")
    above = _file_above(path)
    if above is not None:
        raise ValueError(f"{what} {path} lies under {above}, which is a file; give another {what}")
    return path


def refuse_overwrite(paths: Iterable[str | os.PathLike], *, flag: str = "--overwrite", advice: str = "") -> None:
    """Raise ``FileExistsError`` naming the first existing path of ``paths`` (and how many more) and the
    flag that allows replacing them: a command never replaces what it did not make unless told to."""
    existing = [Path(p) for p in paths if os.path.lexists(p)]
    if existing:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise FileExistsError(f"{existing[0]} exists{more} and would be replaced; pass {flag} to replace "
                              f"{'it' if len(existing) == 1 else 'them'}{', ' + advice if advice else ''}")


class _Stopped(BaseException):
    """Raised in a pool worker by SIGTERM while it runs a call (see :class:`WorkerPool`)."""


_IN_CALL = False  # a pool worker: is it running a call (or waiting for the next)?


def _on_sigterm(*_) -> None:
    if _IN_CALL:
        raise _Stopped  # unwinds the call: its finally blocks remove temporary files
    os._exit(143)


def die_with_parent(parent: int) -> None:
    """End this process with SIGTERM as soon as process ``parent`` (its parent) ends, also by ``kill -9``.

    Linux's ``PR_SET_PDEATHSIG``; elsewhere a daemon thread that checks the parent every 0.2 s.  Called
    first thing in a worker: a parent that is already gone ends it at once.
    """
    import signal
    import threading

    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            armed = ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0) == 0  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:  # the parent ended before the signal was armed
        os._exit(143)
    if not armed:
        def watch() -> None:
            import time as _time

            while os.getppid() == parent:
                _time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def _pool_worker_init(parent: int | None = None) -> None:
    """A pool worker leaves Ctrl-C to its parent (which stops it), cleans up when stopped (SIGTERM), and is
    stopped the same way when its parent ends without stopping it (``kill -9``)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    if parent is not None:
        die_with_parent(parent)


def _pool_call(fn, args, kwargs):
    """Run one call in a pool worker; a stop (SIGTERM) ends the worker once the call has unwound."""
    global _IN_CALL
    _IN_CALL = True
    try:
        return fn(*args, **kwargs)
    except _Stopped:
        os._exit(143)  # no traceback, no result: the parent stopped this worker
    finally:
        _IN_CALL = False


class WorkerPool:
    """``ProcessPoolExecutor`` (spawned processes) that stops at once on Ctrl-C or on an error.

    ``with WorkerPool(jobs) as pool: futures = [pool.submit(fn, *args) ...]``.  Workers ignore SIGINT
    (a terminal sends it to the whole process group): the parent gets ``KeyboardInterrupt``, and
    leaving the block with any exception cancels the calls not started and stops the running workers
    (SIGTERM), so none goes on writing results after the command has returned.  What finished is kept
    (results are written atomically, one file per call).  A normal exit waits for every call.  A SIGTERM
    sent to the parent alone (``kill PID``) stops the workers the same way and ends the command with status
    143.  A parent killed outright (``kill -9``) takes its workers with it (:func:`die_with_parent`), and the
    workers are recorded in the folder locks the parent holds, so no later run writes a folder while one lives.
    """

    def __init__(self, jobs: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"),
                                        initializer=_pool_worker_init, initargs=(os.getpid(),))
        self._recorded: set[int] = set()

    def submit(self, fn, *args, **kwargs):
        future = self.pool.submit(_pool_call, fn, args, kwargs)
        pids = set((getattr(self.pool, "_processes", None) or {}).keys()) - self._recorded
        if pids:  # the folders this process locks name their writers
            FolderLock.add_workers(sorted(pids))
            self._recorded |= pids
        return future

    def stop(self) -> None:
        """Cancel what has not started and end the running workers now."""
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> "WorkerPool":
        import signal
        import threading

        self._old_sigterm = None
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
            self._old_sigterm = signal.signal(signal.SIGTERM, _parent_sigterm)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        import signal

        try:
            if exc_type is None:
                self.pool.shutdown(wait=True)
            else:
                self.stop()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)


def _parent_sigterm(signum, _frame) -> None:
    """SIGTERM to a :class:`WorkerPool`'s parent: leave the ``with`` block (which stops the workers), exit 143."""
    raise SystemExit(128 + signum)


def unique_choices(what: str, names: Iterable[str], valid: Sequence[str]) -> list[str]:
    """``names`` in order without repeats (one named twice runs once); any not in ``valid`` is refused with a
    ``ValueError`` that names it and the valid choices."""
    names = list(dict.fromkeys(names))
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; valid choices: {', '.join(valid)}")
    return names


#: the seeds a command line accepts: NumPy's and torch's common range (``set_seed`` refuses larger ones)
MAX_SEED = 2**32 - 1


def parse_seed_list(text: str, flag: str = "--seeds") -> list[int]:
    """``--seeds``: comma-separated integers in ``[0, MAX_SEED]``, at least one, in order without repeats.

    Every item is checked before any work; a ``ValueError`` names the bad item (and the whole list when
    there are more) and the valid range.
    """
    seeds = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            seed = int(item)
        except ValueError:
            raise ValueError(f"{flag} must be comma-separated integers, got {text!r}"
                             + (f" ({item.strip()!r} is not an integer" if item.strip() != text else " (not an integer")
                             + f"; valid seeds: 0 to {MAX_SEED})") from None  # fmt: skip
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"{flag} must be integers from 0 to {MAX_SEED}, got {seed}")
        seeds.append(seed)
    if not seeds:
        raise ValueError(f"{flag} must name at least one integer seed from 0 to {MAX_SEED}, got {text!r}")
    return list(dict.fromkeys(seeds))


_MISSING = object()  # a field one of two records lacks


def _flat_settings(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat_settings(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_diff(old: Any, new: dict[str, Any], *, limit: int = 6) -> str:
    """The settings that differ between ``old`` (as a results file recorded them) and ``new`` (this run's), each
    as ``field OLD (now NEW)``: nested records by dotted name (``passkey_training.trials``), ``name`` first,
    at most ``limit`` of them then how many more; ``""`` when none differ.  A refusal to resume quotes it,
    so the user sees which flag or profile to change back."""
    def show(v: Any) -> str:
        text = "<none>" if v is _MISSING else repr(v)
        return text if len(text) <= 60 else text[:57] + "..."

    if not isinstance(old, dict):
        return f"no settings recorded (found {show(old)})"

    was, now = _flat_settings(old), _flat_settings(new)
    keys = list(dict.fromkeys([*now, *was]))
    diff = [k for k in keys if was.get(k, _MISSING) != now.get(k, _MISSING)]
    diff.sort(key=lambda k: k.rsplit(".", 1)[-1] != "name")  # the profile's name first: often the whole story
    shown = [f"{k} {show(was.get(k, _MISSING))} (now {show(now.get(k, _MISSING))})" for k in diff[:limit]]
    more = f" and {len(diff) - limit} more" if len(diff) > limit else ""
    return ", ".join(shown) + more


@contextmanager
def removed_if_left_empty(*folders: str | os.PathLike):
    """Around the work on ``folders`` (``--out``, ``--ckpt``): when the block fails, each of them, and each of
    their parents, that did not exist before it and is empty now is removed again.  A command refused after
    its first folder was made (say, another process holds the second) leaves nothing behind; a folder
    holding anything is kept."""
    made: list[Path] = []
    for folder in folders:
        path = Path(folder).absolute()
        for p in (path, *path.parents):
            if os.path.lexists(p):
                break
            made.append(p)
    try:
        yield
    except BaseException:
        for p in sorted(dict.fromkeys(made), key=lambda p: len(p.parts), reverse=True):  # the deepest first
            try:
                p.rmdir()
            except OSError:  # not empty, not there, or not ours to remove
                pass
        raise


def run_calls(calls: Sequence[tuple[Callable, tuple]], jobs: int = 1, log: Callable[[str], Any] = print, *,
              progress: bool = False, desc: str = "models") -> None:
    """Run ``calls`` (``(fn, args)`` pairs) and ``log`` what each returns as it finishes.

    ``jobs == 1`` runs them one after the other in this process; more runs them in a :class:`WorkerPool` of
    ``jobs`` spawned workers (Ctrl-C or an error stops every worker at once; calls that finished keep what they
    wrote), with a bar over the calls if ``progress``.
    """
    jobs = check_positive_int("jobs", jobs)
    if jobs == 1:
        for fn, args in calls:
            log(fn(*args))
    elif calls:
        from concurrent.futures import as_completed

        from tqdm.auto import tqdm

        with WorkerPool(jobs) as pool:
            futures = [pool.submit(fn, *args) for fn, args in calls]
            for f in tqdm(as_completed(futures), total=len(futures), desc=desc, disable=not progress):
                log(f.result())


def read_lines_exact(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 file written one item per line, split at ``\\n`` only (a ``\\r\\n`` end counts as one).

    ``Path.read_text`` turns a carriage return inside a line into a line break (universal
    newlines), which shifts every later line against a file read the other way.
    """
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]  # a file given Windows line ends


#: characters some readers take for a line break (``str.splitlines``, universal newlines)
LINE_BREAKS = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE_BREAK_TABLE = {ord(c): " " for c in LINE_BREAKS}


def one_line(text: str) -> str:
    """``text`` with every character that some reader takes for a line break replaced by a space."""
    return text.translate(_LINE_BREAK_TABLE)


def load_weights(path: str | os.PathLike, *, advice: str = "delete it: the next run trains that model again"):
    """A ``state_dict`` saved with ``torch.save``, read safely (``weights_only=True``) onto the CPU.

    A missing file raises ``FileNotFoundError``, a damaged or foreign one ``ValueError`` naming it and
    ``advice``; neither suggests ``weights_only=False`` (which would run whatever code the file holds).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {path} not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (truncated, not a torch file, or holding more than tensors)
        text = str(err).strip()
        if "weights only" in text.lower() or "weights_only" in text:  # torch's advice is not passed on
            why = f"{type(err).__name__}: it holds objects other than tensors, which are not loaded"
        else:
            why = f"{type(err).__name__}: {(text.splitlines() or [''])[0].split('. ')[0][:120]}"
        raise ValueError(f"weights file {path} is damaged or not a weights file ({why}); {advice}") from None


def interrupted_message(what_kept: str, how_to_continue: str) -> str:
    """The one line a command prints when Ctrl-C stops it."""
    return f"interrupted: {what_kept}; {how_to_continue}"


def timing_command(p: argparse.ArgumentParser, a: argparse.Namespace, measure, *, record_load: bool = True) -> int | None:
    """``--time-updates N [--timing-out FILE] [--overwrite]`` of the character-model experiments, in one place.

    Checks the flags and the output file before any timing (one line naming the value via ``p.error``);
    returns ``None`` when no timing was asked for (the command goes on), else the exit code: 0 after
    ``measure(N)`` ran (its dict written atomically to ``--timing-out``, with the load average before the
    timing when ``record_load``), :data:`INTERRUPTED` after Ctrl-C, with nothing written.
    """
    if a.time_updates < 0:
        p.error(f"--time-updates must be >= 0, got {a.time_updates}")
    if a.timing_out and not a.time_updates:
        p.error("--timing-out needs --time-updates N")
    if a.timing_out:  # checked before the timing, not after
        try:
            check_file_path(a.timing_out, "--timing-out")
            if not a.overwrite:
                refuse_overwrite([a.timing_out], advice="or give another --timing-out")
        except (FileExistsError, ValueError) as err:
            p.error(str(err))
    if not a.time_updates:
        return None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    try:
        timing = measure(a.time_updates)
    except KeyboardInterrupt:  # the timings are written once, at the end
        import sys

        print(interrupted_message("nothing was written" + (f" to {a.timing_out}" if a.timing_out else ""),
                                  "run the same command again"), file=sys.stderr)
        return INTERRUPTED
    if a.timing_out:
        if record_load:
            timing["load_average_before"] = None if load is None else round(load, 2)
        atomic_write_json(a.timing_out, timing)
    return 0
