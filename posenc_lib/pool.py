"""Worker processes: :class:`WorkerPool` (Ctrl-C or an error stops every worker at once, a parent that dies takes its
workers with it) and :func:`run_calls`, which runs calls in this process or in such a pool."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

from .checks import check_positive_int
from .files import FolderLock


def available_cores() -> int:
    """CPU cores this process may run on (its affinity where the platform reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


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
