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


def __getattr__(name: str):
    """``ex``, the extrapolation module, imported when first used: usage, refusals and nesting answer without torch."""
    if name == "ex":
        from posenc_lib.experiments import extrapolation

        return extrapolation
    raise AttributeError(name)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stat(pid: int) -> list[str]:
    """Fields 3.. of /proc/PID/stat (state, ppid, ...); [] where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _instances() -> list[int]:
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
    others = _instances()
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
    from posenc_lib.experiments import extrapolation as ex

    procs = [(folder, p) for folder in FOLDERS for p in ex.budget_processes(folder)]
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
                    ex.record_pause(folder, seconds, start, end, models)
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
