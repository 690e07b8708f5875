"""Calibrate a WMT14 run on the machine that will make it: a few timed updates per scheme, then a plan.

    python -m posenc_lib.experiments.wmt14 calibrate --profile gpu --data-dir data-gpu --pe none,sinusoidal,shaw,rope \\
        --seeds 0,1 --jobs auto --budget-min 15 [--out runs/wmt14-gpu]

The profile's sizes (``benchmarks/README.md``, "Sizing the gpu profile") are arithmetic until they
are measured.  This command measures, with the run's own data, model and training loop:

* **time per update** and target tokens/s of every scheme, with as many models training at once as
  the run will train (``--jobs``): ``--warm`` updates first (allocator, kernels), then all processes
  wait for each other and time ``--windows`` windows of ``--updates`` updates each, with a device
  synchronisation at each window's edges only.  The last window is the figure the plan uses: the first
  ones after start-up run slower (on one H200 updates 6-25 took 2-2.5x the steady time), and whether
  the last two windows agree within 10% is recorded (``steady``) and a disagreement is printed;
* **peak memory** per process (GPU: allocated and reserved; CPU: resident set);
* **start-up** (process, data, model, first validation), one **validation** pass, writing a
  checkpoint's worth of tensors (weights and Adam's two moments), and **decoding**
  a sample of newstest2014, scaled by source tokens to the run's three test passes (held-out,
  held-out shuffled, newstest2014).  Greedy decoding is timed with no sentence stopping early (every
  batch decodes 1.5 x its longest source + 10 tokens), the longest it can take whatever the barely
  trained model emits: an upper bound, as a trained model stops where its translation ends.

From these it projects the run's wall time (models in the run's order, ``jobs`` at a time) and the
largest ``max_steps`` that fits ``--budget-min`` for one, two and three seeds, with the warm-up scaled
in proportion, and prints the command to run.  Everything goes to ``OUT/calibration.json``; the
tokenizer and encoded data it prepares are the run's own (``OUT/tokenizer.json``, ``OUT-ckpt/``), so
the run that follows does not prepare them again.  Nothing of the timed models is kept.
"""
from __future__ import annotations

import math
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from .evaluate import MAX_SRC_TOKENS, translate
from ...schemes.registry import canonical_pe
from .tokenizer import get_tokenizer
from .train import PROFILES, canonical_run_pe, Precision, Profile, get_profile, resolve_precision, train_model, validation_loss
from ...checks import check_positive_int
from ...cli import INTERRUPTED, CliParser, interrupted_message
from ...files import (FolderLock, atomic_torch_save, atomic_write_json, check_folder_path, read_json,
                      removed_if_left_empty)
from ...pool import WorkerPool, available_cores
from .data import check_data_dir
from .pipeline import (DIRECTIONS, DEFAULT_PES, check_hardware, default_ckpt_dir, hardware, make_run_folders,
                       parse_pes, parse_seeds, parse_sets, prepare_data, resolve_jobs)

#: how long a process waits for the others before timing alone (s)
BARRIER_TIMEOUT_S = 900.0
#: defaults: untimed updates, timed updates per window, windows, newstest2014 sentences decoded
WARM, UPDATES, WINDOWS, SAMPLE = 5, 20, 3, 300
#: two windows whose times per update differ by at most this share of the last count as steady
STEADY_TOL = 0.10


class SteadyWindows:
    """An ``on_update`` callback timing ``windows`` windows of ``updates`` updates after ``warm`` untimed ones.

    ``sync`` waits for the device at each window edge (and nowhere else); ``at_warm`` runs once at the first
    edge, before its time is taken (the processes' barrier); ``clock`` is the time source.  :meth:`result`
    gives the last window's seconds per update and target tokens/s, every window's seconds per update,
    and ``steady``: whether the last two windows agree within ``tol``.
    """

    def __init__(self, warm: int, updates: int, windows: int, *, sync=lambda: None, at_warm=None,
                 clock=time.perf_counter, tol: float = STEADY_TOL):
        self.updates, self.tol, self.sync, self.at_warm, self.clock = updates, tol, sync, at_warm, clock
        self.edges = [warm + k * updates for k in range(windows + 1)]
        self.marks: list[tuple[float, int]] = []

    @property
    def last_step(self) -> int:
        return self.edges[-1]

    def __call__(self, state: dict) -> None:
        if state["step"] not in self.edges:
            return
        self.sync()
        if state["step"] == self.edges[0] and self.at_warm is not None:
            self.at_warm()
        self.marks.append((self.clock(), state["tokens"]))

    def result(self) -> dict:
        if len(self.marks) < 2:
            raise RuntimeError(f"the timed window never ended: {len(self.marks)} of {len(self.edges)} edges reached")
        spans = [(t1 - t0, k1 - k0) for (t0, k0), (t1, k1) in zip(self.marks, self.marks[1:])]
        per = [dt / self.updates for dt, _ in spans]
        steady = len(per) < 2 or abs(per[-1] - per[-2]) <= self.tol * per[-1]
        return {"s_per_update": round(per[-1], 5), "tok_per_s": round(spans[-1][1] / spans[-1][0], 1),
                "windows_s_per_update": [round(x, 5) for x in per], "steady": steady}


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: str) -> dict:
    if torch.device(device).type == "cuda":
        return {"peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
                "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / 2**30, 2)}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_rss_gib": round(rss_kib / 2**20, 2)}


def timing_profile(prof: Profile, warm: int, updates: int) -> Profile:
    """The profile with logging, validation and checkpoints pushed past the timed updates (same model,
    data, batches and learning rate otherwise), and room for ``warm + updates`` updates (every window's)."""
    span = warm + updates + 1
    return replace(prof, max_steps=max(prof.max_steps, span), log_every=span, val_every=span, ckpt_every=span)


def measure_scheme(pe: str, job: dict, barrier=None, threads: int | None = None) -> dict:
    """Time one scheme's updates, validation and decoding (run in its own process when ``jobs > 1``)."""
    if threads:
        torch.set_num_threads(threads)
    device, warm, updates, windows = job["device"], job["warm"], job["updates"], job.get("windows", 1)
    prof = timing_profile(job["prof"], warm, updates * windows)
    tok, data = job.get("tok"), job.get("data")
    if tok is None:
        tok = get_tokenizer(prof.tokenizer, cache=Path(job["run_dir"]) / "tokenizer.json", vocab=job["vocab"])
        data = torch.load(job["data_cache"], weights_only=False)
    # train_model resets CUDA's peak statistics as it starts: the peak read below is this model's own
    work = Path(job["work_dir"]) / f"{pe}-{os.getpid()}"  # a scheme may be trained twice at once
    marks: dict = {"aligned": True if barrier is None else None}  # None: never reached the barrier

    def at_warm():
        if barrier is not None:
            try:
                barrier.wait(BARRIER_TIMEOUT_S)
                marks["aligned"] = True
            except Exception:  # noqa: BLE001 (threading.BrokenBarrierError through a manager proxy)
                marks["aligned"] = False

    timer = SteadyWindows(warm, updates, windows, sync=lambda: _sync(device), at_warm=at_warm)

    def on_update(state):
        if state["step"] == 1:
            _sync(device)
            marks["first"] = time.time()
        timer(state)

    try:
        tr = train_model(pe, 0, prof, data, tok, work, device=device, progress=False, stop_after=timer.last_step,
                         ckpt_dir=work, log=lambda m: None, on_update=on_update)
        model = tr["model"]
        prec = Precision(tr["precision"], device)
        _sync(device)
        t = time.perf_counter()
        validation_loss(model, data["dev"], tok, device, prec)
        _sync(device)
        val_s = time.perf_counter() - t
        sample = job["sample"]
        t = time.perf_counter()
        # greedy: no sentence stops early, the longest this decoding can take (a barely trained model
        # may stop at once or never); beam search stops as it will in the run
        translate(model, tok, sample, beam=prof.beam, alpha=prof.length_penalty, device=device,
                  stop_at_eos=prof.beam > 1)
        _sync(device)
        decode_s = time.perf_counter() - t
        # a checkpoint holds the weights and Adam's two moments of the same shapes: three copies
        weights = model.state_dict()
        moments = [{k: v.clone() for k, v in weights.items()} for _ in range(2)]  # shared tensors are saved once
        _sync(device)
        t = time.perf_counter()
        atomic_torch_save({"model": weights, "exp_avg": moments[0], "exp_avg_sq": moments[1]}, work / "checkpoint.pt")
        ckpt_s = time.perf_counter() - t
    finally:
        shutil.rmtree(work, ignore_errors=True)
    timed = timer.result()
    return {"pe": pe, **timed,
            # to the end of the first update, less one update's time: process, data, model, first validation
            "startup_s": round(max(0.0, marks["first"] - job["t_submit"] - timed["s_per_update"]), 2),
            "val_s": round(val_s, 3), "ckpt_s": round(ckpt_s, 3), "decode_sample_s": round(decode_s, 3),
            "decode_mode": "beam, stops at </s>" if prof.beam > 1 else "greedy, no early stop (upper bound)",
            "aligned": marks["aligned"], "precision": tr["precision"], **_peak_memory(device)}  # fmt: skip


def run_order(pes: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """The order in which ``wmt14.run`` trains its models: seed by seed, schemes in the given order."""
    return [(pe, seed) for seed in seeds for pe in pes]


def every(n: int, period: int) -> int:
    """How often something done every ``period`` updates and after the last one happens in ``n`` updates."""
    return n // period + (n % period != 0)


def project(schemes: dict[str, dict], pes: list[str], seeds: list[int], jobs: int, prof: Profile, max_steps: int,
            decode_scale: float, overhead_s: float = 0.0) -> dict:
    """Projected wall time of a run with ``max_steps`` updates per model: each model costs its start-up
    (with the validation at update 0), its updates, its validation passes and checkpoints (every
    ``prof.val_every`` / ``prof.ckpt_every`` updates and after the last) and its decoding (the sample's
    time x ``decode_scale``); the models start in the run's order on the first of ``jobs`` free slots;
    ``overhead_s`` comes first (reading the data). Returns ``{"wall_s", "per_model_s": {name: s}, "parts_s"}``,
    ``parts_s`` summing each part over the models (start-up, training, validation, checkpoints, scoring: the
    decoding of the test sets) in model-seconds: with ``jobs`` at a time they overlap in wall time."""
    slots = [overhead_s] * jobs
    per, parts = {}, dict.fromkeys(("startup", "training", "validation", "checkpoints", "scoring"), 0.0)
    n_ckpt = every(max_steps, prof.ckpt_every) if prof.ckpt_every else 1  # 0: after the last update only
    for pe, seed in run_order(pes, seeds):
        m = schemes[pe]
        mine = {"startup": m["startup_s"], "training": max_steps * m["s_per_update"],
                "validation": every(max_steps, prof.val_every) * m["val_s"], "checkpoints": n_ckpt * m["ckpt_s"],
                "scoring": m["decode_sample_s"] * decode_scale}
        cost = (mine["startup"] + mine["training"] + mine["validation"] + mine["checkpoints"] + mine["scoring"])
        for k, v in mine.items():
            parts[k] += v
        i = min(range(jobs), key=slots.__getitem__)
        slots[i] += cost
        per[f"{pe}-seed{seed}"] = round(cost, 1)
    return {"wall_s": round(max(slots), 1), "per_model_s": per, "parts_s": {k: round(v, 1) for k, v in parts.items()}}


def largest_fit(schemes, pes, seeds, jobs, prof: Profile, decode_scale, overhead_s, budget_s) -> int | None:
    """The largest ``max_steps`` (a multiple of the profile's ``log_every``) whose projected run fits
    ``budget_s``; None when even ``log_every`` updates do not."""
    unit = prof.log_every

    def fits(n):
        return project(schemes, pes, seeds, jobs, prof, n * unit, decode_scale, overhead_s)["wall_s"] <= budget_s

    if not fits(1):
        return None
    lo, hi = 1, 2
    while fits(hi) and hi < 10**7:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * unit


def calibrate(prof: Profile, pes: list[str], seeds: list[int], out, *, direction: str = "fr-en", data_dir=None,
              source: str = "auto", vocab=None, device: str | None = None, jobs: int | str = "auto",
              warm: int = WARM, updates: int = UPDATES, sample: int = SAMPLE, budget_min: float = 15.0, ckpt_dir=None,
              threads: int | None = None, windows: int = WINDOWS, log=print) -> dict:
    """Measure every scheme on this machine, project the run and fit ``max_steps`` to ``budget_min``;
    writes and returns ``OUT/calibration.json``'s content."""
    pes = [canonical_run_pe(p) for p in pes]
    for flag, v in (("--warm", warm), ("--updates", updates), ("--sample", sample), ("--windows", windows)):
        check_positive_int(flag, v)
    if not (isinstance(budget_min, (int, float)) and math.isfinite(budget_min) and budget_min > 0):
        raise ValueError(f"--budget-min must be a positive number of minutes, got {budget_min!r}")
    for flag, folder in (("--out", out), ("--ckpt-dir", ckpt_dir)):
        if folder is not None:
            check_folder_path(folder, flag)
    if data_dir is not None and source != "hub":
        check_data_dir(data_dir)
    # a refusal leaves no empty folder behind
    with removed_if_left_empty(out, ckpt_dir if ckpt_dir is not None else default_ckpt_dir(out)):
        run_dir, ckpt_root = make_run_folders(out, ckpt_dir)
        # one writer per run folder: a second calibration (or the run) would also time its updates under contention
        with FolderLock(run_dir, what="--out folder", log=log), FolderLock(ckpt_root, what="--ckpt-dir", log=log):
            return _calibrate_locked(prof, pes, seeds, run_dir, ckpt_root, direction=direction, data_dir=data_dir,
                                     source=source, vocab=vocab, device=device, jobs=jobs, warm=warm, updates=updates,
                                     sample=sample, budget_min=budget_min, ckpt_dir=ckpt_dir, threads=threads,
                                     windows=windows, log=log)


def _calibrate_locked(prof, pes, seeds, run_dir: Path, ckpt_root: Path, *, direction, data_dir, source, vocab, device,
                      jobs, warm, updates, sample, budget_min, ckpt_dir, threads, windows, log) -> dict:
    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    precision = resolve_precision(prof.precision, device)
    jobs = resolve_jobs(jobs, device, len(pes) * len(seeds))
    old = read_json(run_dir / "config.json") if (run_dir / "config.json").is_file() else {}
    kw = dict(direction=direction, data_dir=data_dir, source=source, vocab=vocab, work_dir=ckpt_root,
              expect=old.get("data") if isinstance(old, dict) else None)
    cached = (ckpt_root / f"data-{direction}.pt").is_file()
    t = time.perf_counter()
    tok, data, splits = prepare_data(prof, run_dir, log=log, **kw)
    prep_s = time.perf_counter() - t
    if cached:  # what the run pays to read the data back
        load_s = prep_s
    else:
        t = time.perf_counter()
        tok, data, splits = prepare_data(prof, run_dir, log=lambda m: None, **kw)
        load_s = time.perf_counter() - t
    src_i = 0 if direction.split("-")[0] == "fr" else 1
    tests = {name: splits[name][src_i][: prof.eval_limit] for name in ("heldout", "newstest2014")}
    pool_src = tests["newstest2014"]
    stride = max(1, len(pool_src) // sample)
    picks = pool_src[::stride][:sample]

    def src_tokens(lines):
        return sum(min(len(ids), MAX_SRC_TOKENS - 1) + 1 for ids in tok.encode(lines))  # as translate cuts them

    test_tokens = 2 * src_tokens(tests["heldout"]) + src_tokens(tests["newstest2014"])  # held-out twice: shuffled
    decode_scale = test_tokens / src_tokens(picks)
    # the timed models' checkpoints: a folder made here (never one that was there already), removed at the end
    work_dir = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=".calibration-"))
    job = {"prof": prof, "device": device, "warm": warm, "updates": updates, "windows": windows,
           "run_dir": str(run_dir),
           "vocab": None if vocab is None else str(vocab), "data_cache": str(ckpt_root / f"data-{direction}.pt"),
           "work_dir": str(work_dir), "sample": picks}
    concurrent = min(jobs, len(pes))
    log(f"calibrating on {device} ({precision}): {warm} untimed + {windows} x {updates} timed updates per scheme (the "
        f"last window counts), {concurrent} at a time; "
        f"decoding {len(picks)} newstest2014 sentences")
    schemes: dict[str, dict] = {}
    try:
        for g in range(0, len(pes), concurrent):
            group = pes[g : g + concurrent]
            # a last, smaller group trains beside schemes measured already (their second figures are
            # dropped), so that every scheme is timed with as many models at once as the run will train
            group += pes[: concurrent - len(group)]
            if len(group) == 1:
                res = [measure_scheme(group[0], dict(job, tok=tok, data=data, t_submit=time.time()))]
            else:
                import multiprocessing as mp

                spawn = mp.get_context("spawn")
                per_threads = threads or max(1, available_cores() // len(group))
                # Ctrl-C or an error stops every worker at once (WorkerPool)
                with spawn.Manager() as manager, WorkerPool(len(group)) as pool:
                    barrier = manager.Barrier(len(group))
                    futures = [pool.submit(measure_scheme, pe, dict(job, t_submit=time.time()), barrier, per_threads)
                               for pe in group]
                    res = [f.result() for f in futures]
            for r in res[: len(pes[g : g + concurrent])]:
                r["concurrent"] = len(group)
                schemes[r["pe"]] = r
                log(f"  {r['pe']}: {r['s_per_update'] * 1000:.1f} ms per update ({r['tok_per_s']:,.0f} target tokens/s), "
                    f"start-up {r['startup_s']:.0f} s, decoding sample {r['decode_sample_s']:.1f} s; windows: "
                    + ", ".join(f"{x * 1000:.0f}" for x in r.get("windows_s_per_update", [r["s_per_update"]]))
                    + " ms per update" + ("" if r.get("steady", True) else f" (the last two differ by more than "
                                          f"{STEADY_TOL:.0%}: not yet steady, raise --warm or --windows)"))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    budget_s = 60.0 * budget_min
    plan = project(schemes, pes, seeds, jobs, prof, prof.max_steps, decode_scale, load_s)
    fits = []
    for n in (1, 2, 3):
        s_list = list(range(n))
        steps = largest_fit(schemes, pes, s_list, jobs, prof, decode_scale, load_s, budget_s)
        row = {"seeds": n, "max_steps": steps}
        if steps is not None:
            row["warmup"] = max(1, round(prof.warmup * steps / prof.max_steps))
            fit = project(schemes, pes, s_list, jobs, prof, steps, decode_scale, load_s)
            row["wall_min"] = round(fit["wall_s"] / 60, 2)
            row["parts_s"] = fit["parts_s"]
        fits.append(row)
    mine = largest_fit(schemes, pes, seeds, jobs, prof, decode_scale, load_s, budget_s)
    command = None
    if mine is not None:
        warmup = max(1, round(prof.warmup * mine / prof.max_steps))
        parts = [f"python -m posenc_lib.experiments.wmt14 --profile {prof.name} --pe {','.join(pes)} --seeds {','.join(map(str, seeds))}",
                 f"--direction {direction}" if direction != "fr-en" else "",
                 f"--data-dir {data_dir}" if data_dir else "", f"--source {source}" if source != "auto" else "",
                 f"--out {run_dir}",
                 f"--ckpt-dir {ckpt_dir}" if ckpt_dir else "", f"--jobs {jobs} --resume",
                 *[f"--set {k}={_text(v)}" for k, v in asdict(prof).items()
                   if v != getattr(PROFILES[prof.name], k) and k not in ("max_steps", "warmup")],
                 f"--set max_steps={mine} --set warmup={warmup}"]
        command = " ".join(p for p in parts if p)
    total_gib = None
    if torch.device(device).type == "cuda":
        total_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    need = None if total_gib is None else max(r["peak_reserved_gib"] for r in schemes.values()) * jobs
    result = {
        "hardware": hardware(device, precision), "profile": asdict(prof), "pes": pes, "seeds": seeds, "jobs": jobs,
        "warm": warm, "updates": updates, "windows": windows, "prep_s": round(prep_s, 1), "load_s": round(load_s, 1),
        "decode_sample_sentences": len(picks), "decode_scale": round(decode_scale, 3), "schemes": schemes,
        "budget_min": budget_min,
        "projection": {"max_steps": prof.max_steps, "wall_min": round(plan["wall_s"] / 60, 2),
                       "per_model_s": plan["per_model_s"], "parts_s": plan["parts_s"]},
        "fits": fits, "max_steps_for_seeds": mine, "command": command,
        "memory": {"gpu_gib": None if total_gib is None else round(total_gib, 1),
                   "reserved_gib_all_jobs": None if need is None else round(need, 1),
                   "fits": None if need is None else need <= 0.95 * total_gib},
    }  # fmt: skip
    atomic_write_json(run_dir / "calibration.json", result)
    _report(result, log)
    return result


def _text(value) -> str:
    """A profile value as ``--set`` reads it back."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _report(r: dict, log=print) -> None:
    mem_key = "peak_reserved_gib" if r["memory"]["gpu_gib"] is not None else "peak_rss_gib"
    log(f"{'scheme':<12}{'ms/update':>10}{'tokens/s':>12}{'peak GiB':>10}{'start-up s':>12}{'val s':>8}{'decode s':>10}")
    for pe, m in r["schemes"].items():
        log(f"{pe:<12}{m['s_per_update'] * 1000:>10.1f}{m['tok_per_s']:>12,.0f}{m[mem_key]:>10.2f}{m['startup_s']:>12.1f}"
            f"{m['val_s']:>8.2f}{m['decode_sample_s'] * r['decode_scale']:>10.1f}")
    n = len(r["pes"]) * len(r["seeds"])
    log(f"projected: {n} models, {r['jobs']} at a time, max_steps {r['projection']['max_steps']}: "
        f"{r['projection']['wall_min']:.1f} min of wall time (budget {r['budget_min']:g} min), reading the data "
        f"{r['load_s']:.0f} s first")
    log("  its parts, summed over the models (model-minutes; " + (f"{r['jobs']} at a time overlap): " if r["jobs"] > 1
                                                                  else "one at a time): ")
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in r["projection"]["parts_s"].items())
        + " (scoring: decoding the three test passes, greedy without early stop: an upper bound)")
    log("largest max_steps within the budget: " + " | ".join(
        f"{f['seeds']} seed{'s' if f['seeds'] > 1 else ''}: {f['max_steps'] or 'none fits'}" for f in r["fits"]))
    if r["memory"]["fits"] is False:
        log(f"warning: {r['jobs']} processes would reserve {r['memory']['reserved_gib_all_jobs']} GiB of "
            f"{r['memory']['gpu_gib']} GiB: lower --jobs or set micro_batch_tokens")
    log(f"run: {r['command']}" if r["command"] else "no max_steps fits the budget with these seeds: raise --budget-min "
        "or train fewer models")
    log(f"calibration written to calibration.json ({r['hardware']['device']})")


def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m posenc_lib.experiments.wmt14 calibrate",
                   description="Time a few updates per scheme on this machine, project the run's wall time and "
                               "fit max_steps to a time budget (writes OUT/calibration.json).")
    ap.add_argument("--profile", default="gpu", choices=list(PROFILES))
    ap.add_argument("--pe", default=",".join(DEFAULT_PES), help="comma-separated schemes or 'all'")
    ap.add_argument("--seeds", default="0,1", help="the seeds the run will train (comma-separated integers)")
    ap.add_argument("--direction", default="fr-en", choices=DIRECTIONS)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--source", default="auto", choices=["auto", "hub", "files"])
    ap.add_argument("--vocab", default=None)
    ap.add_argument("--out", default=None, help="the run folder (default runs/wmt14-PROFILE)")
    ap.add_argument("--ckpt-dir", default=None)
    ap.add_argument("--jobs", default="auto", help="models the run will train at once (an integer or 'auto')")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads per process")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present; the gpu profile on a "
                                                  "machine without one needs --device cpu)")
    ap.add_argument("--warm", type=int, default=WARM, help=f"untimed updates first (default {WARM})")
    ap.add_argument("--updates", type=int, default=UPDATES, help=f"timed updates per window (default {UPDATES})")
    ap.add_argument("--windows", type=int, default=WINDOWS, help=f"timed windows per scheme; the last one counts "
                                                                  f"(default {WINDOWS})")
    ap.add_argument("--sample", type=int, default=SAMPLE, help=f"newstest2014 sentences decoded (default {SAMPLE})")
    ap.add_argument("--budget-min", type=float, default=15.0, help="wall-time budget of the run (default 15)")
    args = ap.parse_args(argv)
    try:
        prof = get_profile(args.profile, parse_sets(args.set))
        pes, seeds = parse_pes(args.pe), parse_seeds(args.seeds)
        if args.jobs.strip().lower() != "auto":
            resolve_jobs(args.jobs, "cpu", 1)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be a positive integer, got {args.threads}")
        device = check_hardware(prof, args.device)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        calibrate(prof, pes, seeds, args.out or f"runs/wmt14-{prof.name}", direction=args.direction,
                  data_dir=args.data_dir, source=args.source, vocab=args.vocab, jobs=args.jobs, warm=args.warm,
                  updates=args.updates, sample=args.sample, budget_min=args.budget_min, ckpt_dir=args.ckpt_dir,
                  windows=args.windows, threads=args.threads, device=device)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message("nothing of the timed models is kept (the tokenizer and data cache are)",
                                  "run the same command again to calibrate"), file=sys.stderr)
        return INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
