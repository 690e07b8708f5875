"""Two versions of the library side by side: each scheme's training step, ratio to ``none``, in alternating processes.

``python -m benchmarks.side_by_side --before ../before --after . --schemes xlnet --batch 2 --length 2048``

A grid measures the library after a change against ``none`` in the same run, and two runs of an unchanged path
can differ by up to about 0.2 on a 2-core machine.  To tell a change from that spread, this runs the two source
trees in turn (``--before`` first in even rounds, ``--after`` first in odd ones), each round one fresh process
per tree that imports that tree's ``posenc_lib`` and ``benchmarks`` and times ``none`` and the schemes
interleaved (the suite's model and training step, one warm-up step each, then ``--repeats`` timed steps; its
ratio: median over ``none``'s median).  It prints every round's ratios and, per tree and scheme, the median over
the rounds; it writes nothing.  The other tree is any checkout, e.g. ``git worktree add ../before <commit>``.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from posenc_lib.cli import CliParser

from .common import available_cores, check_schemes

#: what each process runs, inside the tree it measures (so it uses only what every version of the suite has)
_WORKER = """
import json, statistics, sys, torch
from benchmarks.common import BenchConfig, make_model, random_tokens, rotated, timed
from benchmarks.train import clear_grads, train_step
batch, length, repeats, threads, quick = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[6] == "1"
schemes = tuple(sys.argv[5].split(","))
torch.set_num_threads(threads)
cfg = BenchConfig.quick() if quick else BenchConfig()
cfg.batch, cfg.lengths = batch, (length,)
models = {pe: make_model(pe, cfg).train() for pe in schemes}
src, tgt = random_tokens(cfg, batch, length, 1), random_tokens(cfg, batch, length + 1, 2)
for pe in schemes:
    train_step(models[pe], src, tgt)
    clear_grads(models[pe])
times = {pe: [] for pe in schemes}
for r in range(repeats):
    for pe in rotated(schemes, r):
        times[pe].append(timed(lambda: train_step(models[pe], src, tgt), "cpu"))
        clear_grads(models[pe])
print(json.dumps({pe: statistics.median(t) for pe, t in times.items()}))
"""


def _tree(path: Path, flag: str) -> Path:
    path = Path(path).resolve()
    if not (path / "posenc_lib").is_dir() or not (path / "benchmarks" / "train.py").is_file():
        raise ValueError(f"{flag} {path} is not a source tree of this project (no posenc_lib/ and benchmarks/train.py "
                         "in it); make one with `git worktree add <folder> <commit>`")
    return path


def _measure(tree: Path, schemes, batch: int, length: int, repeats: int, threads: int, quick: bool) -> dict:
    """``{scheme: median step seconds}`` from one process running inside ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", _WORKER, str(batch), str(length), str(repeats), str(threads), ",".join(schemes),
            "1" if quick else "0"]  # fmt: skip
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process in {tree} failed:\n{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    """Run the rounds; returns ``{"rounds": [{tree: {scheme: ratio}}], "medians": {tree: {scheme: ratio}}}``."""
    p = CliParser(prog="python -m benchmarks.side_by_side", description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="the source tree before the change")
    p.add_argument("--after", type=Path, default=Path("."), help="the source tree after it (default: this one)")
    p.add_argument("--schemes", required=True, help="comma-separated; none is always measured (the reference)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=2048, help="source = target length")
    p.add_argument("--rounds", type=int, default=4, help="processes per tree, alternating")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per scheme in each process")
    p.add_argument("--threads", type=int, default=available_cores())
    p.add_argument("--quick", action="store_true", help="the suite's tiny model (seconds; for trying it)")
    a = p.parse_args(argv)
    for flag in ("batch", "length", "rounds", "repeats", "threads"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag} must be a positive integer, got {getattr(a, flag)}")
    try:
        trees = {"before": _tree(a.before, "--before"), "after": _tree(a.after, "--after")}
    except ValueError as err:
        p.error(str(err))
    try:
        schemes = check_schemes(a.schemes.split(","))
    except ValueError as err:
        p.error(f"--schemes: {err}")
    measured = [pe for pe in schemes if pe != "none"]
    if not measured:
        p.error("--schemes must name at least one scheme besides none")
    rounds = []
    for r in range(a.rounds):
        row = {}
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            t = _measure(trees[name], schemes, a.batch, a.length, a.repeats, a.threads, a.quick)
            row[name] = {pe: t[pe] / t["none"] for pe in measured}
            print(f"round {r}, {name}: " + ", ".join(f"{pe} {x:.2f}" for pe, x in row[name].items())
                  + f" (none {t['none']:.3f} s)", flush=True)
        rounds.append(row)
    medians = {name: {pe: statistics.median(row[name][pe] for row in rounds) for pe in measured} for name in trees}
    for name in trees:
        print(f"{name}, median of {a.rounds} rounds: " + ", ".join(f"{pe} {x:.2f}" for pe, x in medians[name].items()))
    return {"rounds": rounds, "medians": medians}


if __name__ == "__main__":
    main()
