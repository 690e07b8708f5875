"""How fast the finale's model trains on this machine's CPU cores, and what makes it faster.

    python -m benchmarks.train_speed [--updates 40] [--warm 8] [--pe sinusoidal] [--out FILE]

Each candidate trains the finale's ``cpu``-profile model (d128, 4 heads, 2+2 layers, ff 512, an 8k
vocabulary) with the pipeline's own recipe (Adam, label smoothing, gradient clipping) on token-count
batches of ~1,500 target tokens whose lengths follow the pipeline's length bucketing, for ``--warm``
untimed and ``--updates`` timed updates, and reports target tokens per second summed over the models
that train at once.  Candidates (one row each, all in one run so that they share the machine's state):

* one model on all threads, or one model per core on one thread each (processes started together,
  timed over the same window);
* bf16 autocast on the CPU (matrix products in bf16, the loss and Adam in fp32);
* Adam's ``foreach`` and ``fused`` implementations;
* ``torch.compile`` of the model;
* jemalloc through ``LD_PRELOAD`` (Debian's ``libjemalloc2``), only where the library is installed.

The Python time per update is the wall time of an update minus the time its operators report to the
profiler (one model, one thread).  Random token ids: the speed of a step does not depend on them.
Without ``--out`` the results go to a new file ``runs/train-speed-STAMP.json``, never to the published
``benchmarks/results/train_speed.json`` (to publish: ``--out benchmarks/results/train_speed.json
--overwrite``); an existing file is refused unless ``--overwrite`` is given.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

#: the published result (committed): written only when --out names it, and replaced only with --overwrite
PUBLISHED = Path(__file__).resolve().parent / "results" / "train_speed.json"
#: where a run without --out goes, one new file per run (runs/ is not tracked)
RUNS = Path(__file__).resolve().parent.parent / "runs"
JEMALLOC = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
            "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2")
BATCH_TOKENS, MAX_TOKENS, VOCAB = 1500, 24, 8000


def default_out() -> Path:
    """A new file ``runs/train-speed-STAMP.json`` for a run without ``--out``."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out, n = RUNS / f"train-speed-{stamp}.json", 1
    while out.exists():
        n += 1
        out = RUNS / f"train-speed-{stamp}-{n}.json"
    return out


def jemalloc_path() -> str | None:
    """The installed jemalloc shared library, or None."""
    return next((p for p in JEMALLOC if os.path.isfile(p)), None)


def batches(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """``n`` (source lengths, target lengths) batches cut as the pipeline cuts them (sorted chunks, a
    token budget of ``BATCH_TOKENS`` target tokens counting padding)."""
    from posenc_lib.experiments.wmt14.train import make_batches

    rng = random.Random(seed)
    pairs = []
    for _ in range(20000):
        t = rng.randint(3, MAX_TOKENS)
        pairs.append((max(2, min(MAX_TOKENS, t + rng.randint(-3, 4))) + 1, t + 1))
    src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
    out = []
    for b in make_batches(src, tgt, BATCH_TOKENS, seed):
        out.append(([src[i] for i in b], [tgt[i] for i in b]))
        if len(out) == n:
            return out
    raise ValueError("not enough batches")


def worker(args: dict) -> dict:
    """Train one model for ``warm + updates`` updates; wait at the start line between the two."""
    import torch
    import torch.nn.functional as F

    from posenc_lib import build_model, set_seed
    from posenc_lib.experiments.wmt14.train import PROFILES

    torch.set_num_threads(args["threads"])
    set_seed(args["seed"])
    prof = PROFILES["cpu"]
    model = build_model(args["pe"], VOCAB, pad_id=0, **prof.model_kwargs())
    opt_kw = {"foreach": True} if args["optim"] == "foreach" else {"fused": True} if args["optim"] == "fused" else {
        "foreach": False}
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9, **opt_kw)
    net = torch.compile(model, dynamic=True) if args["compile"] else model
    bf16 = args["precision"] == "bf16"
    g = torch.Generator().manual_seed(args["seed"])
    plan = batches(args["warm"] + args["updates"], args["seed"])

    def step(src_lens, tgt_lens):
        s = torch.zeros(len(src_lens), max(src_lens), dtype=torch.long)
        t = torch.zeros(len(tgt_lens), max(tgt_lens) + 1, dtype=torch.long)
        for i, (a, b) in enumerate(zip(src_lens, tgt_lens)):
            s[i, :a] = torch.randint(4, VOCAB, (a,), generator=g)
            t[i, : b + 1] = torch.randint(4, VOCAB, (b + 1,), generator=g)
        t_in, t_out = t[:, :-1], t[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(s, t_in, src_key_padding_mask=s == 0)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t_out.reshape(-1), ignore_index=0,
                               label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return sum(tgt_lens)

    t0 = time.perf_counter()
    for src_lens, tgt_lens in plan[: args["warm"]]:
        step(src_lens, tgt_lens)
    warm_s = time.perf_counter() - t0
    Path(args["ready"]).touch()
    while not os.path.exists(args["go"]):
        time.sleep(0.01)
    tokens, t0 = 0, time.perf_counter()
    for src_lens, tgt_lens in plan[args["warm"]:]:
        tokens += step(src_lens, tgt_lens)
    wall = time.perf_counter() - t0
    out = {"tokens": tokens, "wall_s": wall, "tok_per_s": tokens / wall, "warm_s": warm_s}
    if args.get("profile"):
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof_:
            t1 = time.perf_counter()
            for src_lens, tgt_lens in plan[args["warm"]:]:
                step(src_lens, tgt_lens)
            wall_p = time.perf_counter() - t1
        ops_us = sum(e.self_cpu_time_total for e in prof_.key_averages())
        n = len(plan) - args["warm"]
        out["python_ms_per_update"] = (wall_p * 1e6 - ops_us) / n / 1000
        out["ms_per_update_profiled"] = wall_p * 1000 / n
    return out


CANDIDATES = [
    # name, processes, threads each, precision, optimizer, compile, jemalloc
    ("1 model x 2 threads, fp32", 1, 2, "fp32", "default", False, False),
    ("2 models x 1 thread, fp32", 2, 1, "fp32", "default", False, False),
    ("2 models x 1 thread, fp32, Adam foreach", 2, 1, "fp32", "foreach", False, False),
    ("2 models x 1 thread, fp32, Adam fused", 2, 1, "fp32", "fused", False, False),
    ("2 models x 1 thread, bf16 autocast", 2, 1, "bf16", "default", False, False),
    ("1 model x 2 threads, bf16 autocast", 1, 2, "bf16", "default", False, False),
    ("2 models x 1 thread, fp32, jemalloc", 2, 1, "fp32", "default", False, True),
    ("2 models x 1 thread, bf16, jemalloc", 2, 1, "bf16", "default", False, True),
    ("2 models x 1 thread, bf16, jemalloc, Adam fused", 2, 1, "bf16", "fused", False, True),
    ("2 models x 1 thread, fp32, torch.compile", 2, 1, "fp32", "default", True, False),
]


def run_candidate(cand, *, pe: str, warm: int, updates: int, profile: bool = False) -> dict:
    name, procs, threads, precision, optim, compile_, jemalloc = cand
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    lib = jemalloc_path()
    if jemalloc:
        if lib is None:
            return {"name": name, "skipped": "jemalloc is not installed (Debian: apt-get install libjemalloc2)"}
        env["LD_PRELOAD"] = lib
    else:
        env.pop("LD_PRELOAD", None)
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        jobs = []
        for k in range(procs):
            args = {"threads": threads, "seed": k, "pe": pe, "precision": precision, "optim": optim,
                    "compile": compile_, "warm": warm, "updates": updates, "ready": os.path.join(tmp, f"ready{k}"),
                    "go": go, "profile": profile}
            jobs.append(subprocess.Popen([sys.executable, "-m", "benchmarks.train_speed", "--worker", json.dumps(args)],
                                         env=env, stdout=subprocess.PIPE, text=True,
                                         cwd=Path(__file__).resolve().parents[1]))
        while not all(os.path.exists(os.path.join(tmp, f"ready{k}")) for k in range(procs)):
            if any(j.poll() not in (None, 0) for j in jobs):
                break
            time.sleep(0.05)
        Path(go).touch()
        outs = []
        for j in jobs:
            stdout, _ = j.communicate()
            if j.returncode:
                raise RuntimeError(f"{name}: a worker failed (exit {j.returncode})")
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    row = {"name": name, "processes": procs, "threads": threads, "precision": precision, "optimizer": optim,
           "compile": compile_, "jemalloc": jemalloc, "tok_per_s": round(sum(o["tok_per_s"] for o in outs), 1),
           "per_model_tok_per_s": [round(o["tok_per_s"], 1) for o in outs],
           "warm_s": [round(o["warm_s"], 1) for o in outs]}
    if profile:
        row["python_ms_per_update"] = round(outs[0]["python_ms_per_update"], 1)
        row["ms_per_update_profiled"] = round(outs[0]["ms_per_update_profiled"], 1)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        from posenc_lib.pool import die_with_parent

        die_with_parent(os.getppid())  # a killed benchmark takes its measuring processes with it
        print(json.dumps(worker(json.loads(argv[1]))))
        return 0
    from posenc_lib.cli import INTERRUPTED, CliParser, interrupted_message
    from posenc_lib.files import atomic_write_json, check_file_path
    from posenc_lib.pool import available_cores

    ap = CliParser(prog="python -m benchmarks.train_speed", description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=40, help="timed updates per model (default 40)")
    ap.add_argument("--warm", type=int, default=8, help="untimed updates first (default 8)")
    ap.add_argument("--pe", default="sinusoidal", help="the scheme the model uses (default sinusoidal)")
    ap.add_argument("--only", default=None, help="comma-separated candidate numbers (1-based) to run")
    ap.add_argument("--out", type=Path, default=None, help="the JSON file to write (default: a new file "
                    "runs/train-speed-STAMP.json; --out benchmarks/results/train_speed.json --overwrite publishes a run)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    a = ap.parse_args(argv)
    if a.out is None:
        a.out = default_out()
    if a.updates < 1 or a.warm < 0:
        ap.error(f"--updates must be >= 1 and --warm >= 0, got {a.updates} and {a.warm}")
    try:  # before the measurements (minutes), not after them
        check_file_path(a.out, "--out")
    except ValueError as err:
        ap.error(str(err))
    from posenc_lib.schemes.registry import canonical_pe

    try:  # here, not as a traceback of every worker process
        canonical_pe(a.pe)
    except ValueError as err:
        ap.error(f"--pe: {err}")
    if a.out.exists() and not a.overwrite:
        ap.error(f"{a.out} exists; pass --overwrite to replace it or --out to write elsewhere")
    pick = list(range(len(CANDIDATES)))
    if a.only is not None:  # every number checked; an empty list is refused, not read as "all"
        valid = f"comma-separated numbers 1-{len(CANDIDATES)}"
        items = [x.strip() for x in a.only.split(",") if x.strip()]
        if not items:
            ap.error(f"--only takes at least one of the {valid}, got {a.only!r}")
        pick = []
        for x in items:
            try:
                k = int(x)
            except ValueError:
                ap.error(f"--only takes {valid}, got {x!r}" + (f" in {a.only!r}" if x != a.only.strip() else ""))
            if not 1 <= k <= len(CANDIDATES):
                ap.error(f"--only takes {valid}, got {k}" + (f" in {a.only!r}" if x != a.only.strip() else ""))
            pick.append(k - 1)
        pick = list(dict.fromkeys(pick))
    import torch

    rows = []
    try:
        for k in pick:
            row = run_candidate(CANDIDATES[k], pe=a.pe, warm=a.warm, updates=a.updates)
            rows.append(row)
            print(f"{row['name']:<52} {row.get('tok_per_s', row.get('skipped'))}", flush=True)
        overhead = run_candidate(("1 model x 1 thread, fp32, profiled", 1, 1, "fp32", "default", False, False),
                                 pe=a.pe, warm=a.warm, updates=min(a.updates, 20), profile=True)
    except KeyboardInterrupt:  # the workers got Ctrl-C too; the file is written once, at the end
        print(interrupted_message(f"nothing was written to {a.out}", "run the same command again"), file=sys.stderr)
        return INTERRUPTED
    print(f"python time per update: {overhead['python_ms_per_update']} ms of {overhead['ms_per_update_profiled']} ms",
          flush=True)
    result = {"schema": "posenc-train-speed/1", "torch": torch.__version__, "cores": available_cores(),
              "pe": a.pe, "warm": a.warm, "updates": a.updates, "batch_tokens": BATCH_TOKENS, "max_tokens": MAX_TOKENS,
              "jemalloc": jemalloc_path(), "date": time.strftime("%Y-%m-%d"), "rows": rows, "overhead": overhead}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.out, result)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
