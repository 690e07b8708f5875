"""Files and folders, written so that nothing a user has is destroyed (README, "Contributing").

* :func:`atomic_write_text` / :func:`atomic_write_json` / :func:`atomic_torch_save` -- write to a temporary file
  and rename, so a crash never leaves a half-written file behind; :func:`read_json` names a damaged file.
* :class:`FolderLock` -- one writer per folder; :func:`check_folder_path` / :func:`check_file_path` (an output path
  that cannot be written is named before any work), :func:`refuse_overwrite`, :func:`removed_if_left_empty`.
* :func:`read_lines_exact` / :func:`one_line` (one item per line, whatever it holds), :func:`load_weights`
  (weights read safely, a damaged file named).
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import torch


#: the repository's root folder (the shipped data lives in ``REPO_ROOT / "data"``)
REPO_ROOT = Path(__file__).resolve().parent.parent


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


#: the lock file a command keeps in a folder while it writes there (see :class:`FolderLock`)
LOCK_NAME = ".posenc-lock"


class FolderLocked(ValueError):
    """Another living process writes the folder (see :class:`FolderLock`)."""


def process_start(pid: int) -> str | None:
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
    now = process_start(pid)
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

        me = {"pid": os.getpid(), "host": socket.gethostname(), "start": process_start(os.getpid()),
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
                    on_host = "" if here else f" on host {info.get('host')}"
                    raise FolderLocked(
                        f"{self.folder} is being written by another process (pid {pid}{on_host}, since "
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
        entries = [{"pid": int(p), "start": process_start(int(p))} for p in pids]
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
