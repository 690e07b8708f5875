"""Run a command while lesson 13's budget training is stopped, and record the pause.

The budget runs (scripts/extrapolation_budget.sh) record each model's wall-clock training time, and the
README and lesson 13 quote it as the model's cost.  Other work on the same cores would inflate it, so
stop them for it:

    .venv/bin/python scripts/with_budget_paused.py make test

Every training process writing under results/extrapolation_budget is stopped (SIGSTOP), the command
runs, the processes continue (SIGCONT, also if the command fails or is interrupted), and the pause is
appended to results/extrapolation_budget/paused.json with the models that were in training, so that
extrapolation.training_minutes subtracts it.  The exit status is the command's.
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

FOLDER = Path("results/extrapolation_budget")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    os.chdir(ROOT)
    procs = ex.budget_processes(FOLDER)
    start, t0 = utc_now(), time.monotonic()
    stopped = []
    try:
        for p in procs:
            try:
                os.kill(p["pid"], signal.SIGSTOP)
                stopped.append(p)
            except ProcessLookupError:  # it finished meanwhile
                continue
            for worker in p["workers"]:  # the workers of --jobs N
                try:
                    os.kill(worker, signal.SIGSTOP)
                except ProcessLookupError:
                    pass
        rc = subprocess.call(argv)
    finally:
        for p in stopped:
            for pid in (*p["workers"], p["pid"]):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        seconds = time.monotonic() - t0
        models = [m for p in stopped for m in p["models"]]
        if models:
            ex.record_pause(FOLDER, seconds, start, utc_now(), models)
        print(f"budget training stopped for {seconds:.0f} s: {', '.join(models) or 'none was running'}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
