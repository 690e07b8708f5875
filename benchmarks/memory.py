"""Benchmark 2: peak memory of one training step per scheme, each in its own process.

A fresh Python process per scheme (``python -m benchmarks.memory --worker``)
builds the model, makes the batch at length ``cfg.memory_length``, records its
resident memory, runs two training steps (forward + backward) and reports the
peak resident set size (Linux ``VmHWM``; on CUDA, ``torch.cuda.max_memory_allocated``).

Two figures per scheme:

* ``peak_mb`` -- the process's peak, including Python, torch and the weights;
* ``step_mb`` -- peak minus the memory held just before the first step: what
  the step itself needs (activations kept for backward, gradients, temporaries).

``shaw_naive`` (the (L, L, d) tables materialised) is measured for contrast.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from posenc_lib.cli import CliParser

from .common import BenchConfig, check_schemes, log


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="utf-8") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    """Peak resident set of this process's own address space (Linux ``VmHWM``).

    Not ``getrusage(...).ru_maxrss``: Linux keeps that figure across ``fork`` and
    ``execve``, so a worker started by a large parent would report the parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # other systems: kilobytes


def worker(pe: str, cfg: BenchConfig, threads: int) -> dict:
    import torch

    from .common import make_model, random_tokens
    from .train import clear_grads, train_step

    torch.set_num_threads(threads)
    model = make_model(pe, cfg).train()
    length = cfg.memory_length
    src = random_tokens(cfg, cfg.batch, length, seed=1)
    tgt = random_tokens(cfg, cfg.batch, length + 1, seed=2)
    cuda = cfg.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
    else:
        before = _rss_mb()
    for _ in range(2):
        train_step(model, src, tgt)
        clear_grads(model)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = _peak_rss_mb()
    return {"peak_mb": peak, "before_step_mb": before, "step_mb": max(peak - before, 0.0)}


def bench_memory(schemes: tuple[str, ...], cfg: BenchConfig, threads: int, quiet: bool = False) -> dict:
    """Run :func:`worker` for every scheme in a subprocess; ratios to ``none``."""
    out: dict = {
        "what": "peak memory of two training steps (MiB), one process per scheme",
        "length": cfg.memory_length,
        "measure": "torch.cuda.max_memory_allocated" if cfg.device.startswith("cuda") else "VmHWM",
        "schemes": {},
    }
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for pe in schemes:
        cmd = [sys.executable, "-m", "benchmarks.memory", "--worker", pe, "--threads", str(threads),
               "--config", json.dumps(cfg.as_dict())]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
        if proc.returncode != 0:
            out["schemes"][pe] = {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
            log(f"memory {pe}: FAILED ({out['schemes'][pe]['error']})", quiet)
            continue
        out["schemes"][pe] = json.loads(proc.stdout.strip().splitlines()[-1])
    ref = out["schemes"].get("none", {})
    for pe, res in out["schemes"].items():
        if "error" not in res and "error" not in ref:
            res["ratio_peak"] = res["peak_mb"] / ref["peak_mb"]
            res["ratio_step"] = res["step_mb"] / ref["step_mb"] if ref["step_mb"] > 0 else None
    log(
        f"memory L={cfg.memory_length} (peak ratio): "
        + ", ".join(f"{pe} {r.get('ratio_peak', float('nan')):.2f}" for pe, r in out["schemes"].items()),
        quiet,
    )
    return out


def bench_memory_batches(schemes: tuple[str, ...], cfg: BenchConfig, threads: int, quiet: bool = False) -> dict:
    """:func:`bench_memory` at every batch size of ``cfg.batches`` and every training length of ``cfg.lengths``:
    ``{"batches": {B: {"lengths": {L: ...}}}}``."""
    import dataclasses

    out: dict = {"what": "peak memory of two training steps (MiB), one process per scheme, per batch size and length",
                 "measure": "torch.cuda.max_memory_allocated" if cfg.device.startswith("cuda") else "VmHWM",
                 "batches": {}}  # fmt: skip
    for batch in cfg.batches:
        per_length = {}
        for length in cfg.lengths:
            log(f"memory batch {batch}, L={length}:", quiet)
            one = dataclasses.replace(cfg, batch=batch, batches=(), memory_length=length)
            per_length[str(length)] = bench_memory(schemes, one, threads, quiet)
        out["batches"][str(batch)] = {"lengths": per_length}
    return out


def main(argv=None) -> None:
    """The worker's command line: measure one scheme's memory in this process and print it as JSON."""
    p = CliParser(prog="python -m benchmarks.memory", description="one memory measurement (used by benchmarks.run)")
    p.add_argument("--worker", required=True, help="scheme name")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--config", required=True, help="BenchConfig as JSON")
    a = p.parse_args(argv)
    try:
        pe = check_schemes([a.worker])[-1]  # the list always starts with the reference "none"
        d = json.loads(a.config)
        if not isinstance(d, dict):
            raise ValueError("expected a JSON object of BenchConfig fields")
        cfg = BenchConfig(**d)
    except json.JSONDecodeError as e:
        p.error(f"--config is not valid JSON: {e}")
    except (TypeError, ValueError) as e:
        p.error(f"--worker/--config: {e}")
    if a.threads <= 0:
        p.error(f"--threads must be a positive integer, got {a.threads}")
    from posenc_lib.pool import die_with_parent

    die_with_parent(os.getppid())  # a killed benchmark takes its measuring process with it
    print(json.dumps(worker(pe, cfg, a.threads)))


if __name__ == "__main__":
    main()
