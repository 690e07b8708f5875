"""Run a command while lesson 13's budget training is stopped, and record the pause.

The budget runs (scripts/extrapolation_budget.sh) record each model's wall-clock training time, and the
README and lesson 13 quote it as the model's cost.  Other work on the same cores would inflate it, so
stop them for it:

    .venv/bin/python scripts/with_budget_paused.py make test

Every training process writing under one of the budget folders (FOLDERS: results/extrapolation_budget and
results/extrapolation_budget_16000, the decoder-only reversal runs with 16000 updates) is stopped (SIGSTOP),
the command runs, the processes continue (SIGCONT, also if the command fails or is interrupted), and the
pause is appended to FOLDER/paused.json of each folder with the models that were in training there, so
that extrapolation.training_minutes subtracts it.  The exit status is the command's.
"""
from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from posenc_lib.experiments import extrapolation as ex  # noqa: E402

#: the folders of budget runs (each laid out TASK/ARCH/RUN_seedS.json, each with its own paused.json)
FOLDERS = (Path("results/extrapolation_budget"), Path("results/extrapolation_budget_16000"))


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    os.chdir(ROOT)
    procs = [(folder, p) for folder in FOLDERS for p in ex.budget_processes(folder)]
    start, t0 = utc_now(), time.monotonic()
    stopped = []
    try:
        for folder, p in procs:
            try:
                os.kill(p["pid"], signal.SIGSTOP)
                stopped.append((folder, p))
            except ProcessLookupError:  # it finished meanwhile
                continue
            for worker in p["workers"]:  # the workers of --jobs N
                try:
                    os.kill(worker, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
        rc = subprocess.call(argv)
    finally:
        for _, p in stopped:
            for pid in (*p["workers"], p["pid"]):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        seconds = time.monotonic() - t0
        end, named = utc_now(), []
        for folder in FOLDERS:
            models = [m for f, p in stopped if f == folder for m in p["models"]]
            if models:
                ex.record_pause(folder, seconds, start, end, models)
                named += [f"{folder.name}/{m}" for m in models]
        print(f"budget training stopped for {seconds:.0f} s: {', '.join(named) or 'none was running'}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
