"""Run a command while lesson 13's budget training is stopped, and record the pause.

The budget runs (scripts/extrapolation_budget.sh) record each model's wall-clock training time, and the
README and lesson 13 quote it as the model's cost.  Other work on the same cores would inflate it, so
stop them for it:

    .venv/bin/python scripts/with_budget_paused.py make test

Every training process writing under one of the budget folders (FOLDERS: results/extrapolation_budget and
results/extrapolation_budget_16000, the decoder-only reversal runs with 16000 updates) is stopped (SIGSTOP),
the command runs, the processes continue (SIGCONT, also if the command fails or is interrupted), and the
pause is appended to FOLDER/paused.json of each folder with the models that were in training there, so
that extrapolation.training_minutes subtracts it.  The exit status is the command's (127 when it is not found,
which is checked before anything is stopped).

Stopped itself (Ctrl-C, SIGTERM, SIGHUP), it stops the command, resumes the training, records the pause and exits
with 128 + the signal.  Inside another one (`make test` whose tests call it) it only runs the command: the outer
one pauses the training.  Beside another one it is refused, as each would resume the training under the other's
command.  Training found already stopped (left so by one killed with SIGKILL) is resumed after the command.  It
ends with one line on stderr saying what was paused and where the pause is recorded.
"""
from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the folders of budget runs (each laid out TASK/ARCH/RUN_seedS.json, each with its own paused.json)
FOLDERS = (Path("results/extrapolation_budget"), Path("results/extrapolation_budget_16000"))


USAGE = ("usage: .venv/bin/python scripts/with_budget_paused.py COMMAND [ARG...], e.g. "
         ".venv/bin/python scripts/with_budget_paused.py make test (--help: what it does)")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A signal (SIGTERM, SIGHUP) that stops this script while the command runs."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, _frame):
    raise Stopped(signum)


def budget_processes(folder: str | Path = "results/extrapolation_budget", proc: str | Path = "/proc") -> list[dict]:
    """This machine's running training processes (the extrapolation command line) that write under ``folder`` (as
    given to ``--out``), each as ``{"pid", "out", "models", "workers"}``: ``models`` are the records in training,
    relative to ``folder`` (the first ``--jobs`` of those not yet written, in the order the run takes them),
    ``workers`` the pids of its descendants (the worker processes of ``--jobs N``).  A relative ``--out`` is read
    from the training process's working folder (``/proc/PID/cwd``; this process's where that cannot be read), a
    relative ``folder`` from this process's.  Reads Linux's ``/proc``; elsewhere it finds none."""
    from posenc_lib.experiments.extrapolation import all_runs, parse_list, run_name

    proc, found = Path(proc), []
    folder = (Path.cwd() / folder).resolve()  # an absolute folder stays itself
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat") if proc.is_dir() else []:
        try:  # "pid (name) state ppid ...": the name may hold spaces and parentheses
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue

    def descendants(pid: int) -> list[int]:
        return [d for c in sorted(children.get(pid, [])) for d in (c, *descendants(c))]

    for entry in sorted(proc.iterdir(), key=lambda e: e.name) if proc.is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if "posenc_lib.experiments.extrapolation" not in args or not any(a == "--out" for a in args):
            continue
        opts = dict(zip(args, args[1:]))
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            cwd = Path.cwd()
        out = (cwd / opts["--out"]).resolve()
        if not (out == folder or folder in out.parents):
            continue
        pe_arg = opts.get("--pe", "all")
        try:
            pes = all_runs(opts.get("--arch", "encdec")) if pe_arg.strip().lower() == "all" else \
                [run_name(x) for x in parse_list(pe_arg, "--pe")]
        except (TypeError, ValueError):
            pes = []
        seeds = [seed.strip() for seed in opts.get("--seeds", "0,1,2").split(",")]
        todo = [path.relative_to(folder).as_posix() for pe in pes for seed in seeds   # run_all's order
                for path in [out / f"{pe}_seed{seed}.json"] if not path.exists()]
        jobs = int(opts["--jobs"]) if opts.get("--jobs", "").isdigit() else 1
        found.append({"pid": int(entry.name), "out": opts["--out"], "models": todo[:max(jobs, 1)],
                      "workers": descendants(int(entry.name))})
    return found


def record_pause(folder: str | Path, seconds: float, start: str, end: str, models: Sequence[str]) -> dict:
    """Append one pause to ``folder/paused.json`` (made if missing, written atomically) and return the file's content.

    ``models`` are the records in training during the pause, relative to ``folder`` (``TASK/ARCH/RUN_seedS.json``),
    ``start`` and ``end`` its UTC times.  A file in the older single-pause layout is rewritten as a list."""
    from posenc_lib.experiments.extrapolation import PAUSE_NOTE
    from posenc_lib.files import atomic_write_json, read_json

    folder = Path(folder)
    if not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0):
        raise ValueError(f"seconds must be a number >= 0, got {seconds!r}")
    bad = [m for m in models if not (isinstance(m, str) and m.endswith(".json") and m.count("/") == 2)]
    if bad:
        raise ValueError(f"models must be records relative to {folder} (TASK/ARCH/RUN_seedS.json), got {bad!r}")
    path = folder / "paused.json"
    data = read_json(path) if path.is_file() else {"what": PAUSE_NOTE, "pauses": []}
    if "pauses" not in data:  # the older layout: one pause at the top level
        data = {"what": data.get("what", PAUSE_NOTE),
                "pauses": [{k: data[k] for k in ("paused_seconds", "from", "to", "models")}]}
    data["pauses"].append({"paused_seconds": round(seconds), "from": start, "to": end, "models": list(models)})
    atomic_write_json(path, data)
    return data


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stat(pid: int) -> list[str]:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...); [] where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def other_instances() -> list[int]:
    """The other processes running this script (python [OPTIONS] .../with_budget_paused.py ...)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = entry.read_bytes().decode("utf-8", "replace").split("\0")
            pid = int(entry.parent.name)
        except (OSError, ValueError):
            continue
        if pid == os.getpid() or not Path(args[0]).name.startswith("python"):
            continue
        script = next((a for a in args[1:] if not a.startswith("-")), "")
        if Path(script).name == Path(__file__).name:
            found.append(pid)
    return sorted(found)


def _ancestors() -> set[int]:
    pids, pid = set(), os.getppid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        fields = _stat(pid)
        pid = int(fields[1]) if len(fields) > 1 else 0
    return pids


def _command_error(argv: list[str]) -> tuple[int, str] | None:
    """Why the command cannot run (exit status, message), checked before any training is stopped."""
    exe = argv[0]
    if shutil.which(exe):
        return None
    if os.sep in exe and os.path.isfile(exe):
        return 126, f"error: {exe} is not executable"
    return 127, f"error: command not found: {exe}"


def _run(argv: list[str]) -> tuple[int, str]:
    """Run the command; on Ctrl-C, SIGTERM or SIGHUP stop it too.  Returns its exit status and what the final line
    says first ("" when it ran to its end)."""
    try:
        child = subprocess.Popen(argv)
    except OSError as err:  # found, yet not runnable (a script without #!, say)
        return 126, f"error: cannot run {argv[0]} ({err.strerror}); "
    try:
        return child.wait(), ""
    except (KeyboardInterrupt, Stopped) as err:
        signum = getattr(err, "signum", signal.SIGINT)
        for s in SIGNALS:  # a second Ctrl-C does not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        try:  # Ctrl-C at a terminal reached the command too: a moment to end on its own
            child.wait(5 if signum == signal.SIGINT else 0.1)
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return 128 + signum, f"stopped by {signal.Signals(signum).name}: the command ended with it; "


def _wait_stopped(pids, timeout_s: float = 5.0) -> None:
    """Wait (at most ``timeout_s``) until each process shows as stopped: SIGSTOP arrives asynchronously, and the
    command's time must not overlap the training's."""
    import time

    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break  # gone, or no /proc: nothing to wait for
            if state in ("T", "t", "Z", "X"):
                break
            time.sleep(0.01)


def main(argv: list[str]) -> int:
    if not argv:
        print(USAGE)
        return 2
    if argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    os.chdir(ROOT)
    bad = _command_error(argv)
    if bad:
        print(bad[1], file=sys.stderr)
        return bad[0]
    others = other_instances()
    outer = [pid for pid in others if pid in _ancestors()]
    if not outer and others:
        print(f"error: another with_budget_paused.py runs (pid {others[0]}): wait for it to end; two at once would "
              "resume the training under each other's command", file=sys.stderr)
        return 1
    old = {s: signal.getsignal(s) for s in SIGNALS}
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        if outer:
            rc, first = _run(argv)
            print(f"{first}budget training: left to the outer with_budget_paused.py (pid {outer[0]}), which pauses "
                  "it; this one only ran the command", file=sys.stderr)
            return rc
        return _paused(argv)
    except (KeyboardInterrupt, Stopped) as err:  # before any training was stopped
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"stopped by {signal.Signals(signum).name} before the command ran; nothing was paused", file=sys.stderr)
        return 128 + signum
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _paused(argv: list[str]) -> int:
    procs = [(folder, p) for folder in FOLDERS for p in budget_processes(folder)]
    left = [p["pid"] for _, p in procs if _stat(p["pid"])[:1] == ["T"]]
    if left:
        print(f"note: budget training pid {', '.join(map(str, left))} was already stopped (left so by a "
              "with_budget_paused.py killed before it resumed it?); it is resumed after this command, and that "
              "earlier pause is not recorded", file=sys.stderr)
    start, t0 = utc_now(), time.monotonic()
    stopped, first, rc = [], "", 1
    try:
        for folder, p in procs:
            try:
                os.kill(p["pid"], signal.SIGSTOP)
                stopped.append((folder, p))
            except OSError:  # it finished meanwhile (or is not ours)
                continue
            for worker in p["workers"]:  # the workers of --jobs N
                try:
                    os.kill(worker, signal.SIGSTOP)
                except OSError:
                    pass
        _wait_stopped([p["pid"] for _, p in stopped] + [w for _, p in stopped for w in p["workers"]])
        rc, first = _run(argv)
    except (KeyboardInterrupt, Stopped) as err:  # while the training was being stopped: the command never ran
        signum = getattr(err, "signum", signal.SIGINT)
        rc, first = 128 + signum, f"stopped by {signal.Signals(signum).name} before the command ran; "
    finally:
        for s in SIGNALS:  # the training is resumed and the pause recorded whatever arrives now
            signal.signal(s, signal.SIG_IGN)
        for _, p in stopped:
            for pid in (*p["workers"], p["pid"]):
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
        seconds = time.monotonic() - t0
        end, named, recorded, errors = utc_now(), [], [], []
        for folder in FOLDERS:
            models = [m for f, p in stopped if f == folder for m in p["models"]]
            if models:
                try:
                    record_pause(folder, seconds, start, end, models)
                    named += [f"{folder.name}/{m}" for m in models]
                    recorded.append(str(folder / "paused.json"))
                except (OSError, ValueError) as err:  # the command ran: say what to add rather than a traceback
                    why = " ".join(str(err).split(";")[0].split())  # the reason, not the library's advice
                    errors.append(f"{folder / 'paused.json'} ({why}): mend it and add {seconds:.0f} s for "
                                  f"{', '.join(models)} by hand")
        if errors:
            line = (f"error: budget training stopped for {seconds:.0f} s and resumed, but the pause could not be "
                    f"recorded in {'; '.join(errors)}")
            rc = rc or 1
        elif named:
            line = (f"budget training stopped for {seconds:.0f} s and resumed: {', '.join(named)}; the pause is "
                    f"recorded in {', '.join(recorded)}")
        else:
            line = "no budget training was paused: none was running"
        print(first + line, file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
