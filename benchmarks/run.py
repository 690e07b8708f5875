"""Run the cost benchmarks: ``python -m benchmarks.run [--quick] [--only train,memory,decode] ...``.

Writes ``<out>/train.json``, ``memory.json``, ``decode.json`` (machine facts,
configuration, raw times, medians and ratios to ``none``), then ``table.md``
and ``cost.png`` from whatever JSON files ``<out>`` holds.  See benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import time
from pathlib import Path

import torch

from posenc_lib.utils import CliParser, atomic_write_json

from .common import ALL_SCHEMES, DTYPES, BenchConfig, available_cores, check_schemes, log, machine_info
from .decode import bench_decode
from .memory import bench_memory
from .report import write_report
from .train import bench_train

SCHEMA = "posenc-bench/1"
PARTS = ("train", "memory", "decode")
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
QUICK_OUT = Path(__file__).resolve().parent.parent / "runs" / "bench-quick"  # runs/ is not tracked


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return vals


def _parts(text: str) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vals if v not in PARTS]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"unknown part(s) {bad or text!r}; valid choices: {', '.join(PARTS)}")
    return vals


def parser() -> argparse.ArgumentParser:
    p = CliParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model and lengths (seconds; for tests)")
    p.add_argument("--only", type=_parts, default=PARTS, help="comma-separated subset of: train,memory,decode")
    p.add_argument("--schemes", default=",".join(ALL_SCHEMES), help=f"comma-separated subset of {','.join(ALL_SCHEMES)}")
    p.add_argument("--lengths", type=_ints, help="training lengths, e.g. 64,256,1024")
    p.add_argument("--memory-length", type=int, help="length of the memory benchmark")
    p.add_argument("--batch", type=int, help="training batch size")
    p.add_argument("--repeats", type=int, help="timed repeats per figure (median reported)")
    p.add_argument("--decode-repeats", type=int, help="timed repeats per decoding figure")
    p.add_argument("--decode-batch", type=int, help="batch size of the decoding benchmark (default 32)")
    p.add_argument("--warmup", type=int, help="untimed warm-up runs per scheme")
    p.add_argument("--dropout", type=float, help="dropout of the model in the training benchmark")
    p.add_argument("--threads", type=int, default=available_cores(), help="torch threads (default: available cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model dtype")
    p.add_argument(
        "--out", type=Path, help="folder for the JSON, table.md and cost.png (default benchmarks/results; "
        "with --quick, runs/bench-quick)",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    over = {
        "lengths": a.lengths, "memory_length": a.memory_length, "batch": a.batch, "repeats": a.repeats,
        "decode_repeats": a.decode_repeats, "decode_batch": a.decode_batch, "warmup": a.warmup, "dropout": a.dropout,
    }  # fmt: skip
    over = {k: v for k, v in over.items() if v is not None}
    for k in ("memory_length", "batch", "repeats", "decode_repeats", "decode_batch"):
        if k in over and over[k] <= 0:
            raise ValueError(f"--{k.replace('_', '-')} must be a positive integer, got {over[k]}")
    if "warmup" in over and over["warmup"] < 0:
        raise ValueError(f"--warmup must be an integer >= 0, got {over['warmup']}")
    if "dropout" in over and not 0.0 <= over["dropout"] < 1.0:
        raise ValueError(f"--dropout must be a number in [0, 1), got {over['dropout']}")
    if a.device != "cpu" and not a.device.startswith("cuda"):
        raise ValueError(f"unknown --device {a.device!r}; valid choices: cpu, cuda, cuda:N")
    return dataclasses.replace(cfg, device=a.device, dtype=a.dtype, **over)


def main(argv=None) -> dict:
    p = parser()
    a = p.parse_args(argv)
    try:
        schemes = check_schemes(a.schemes.split(","))
    except ValueError as e:
        p.error(f"--schemes: {e}")
    if a.threads <= 0:
        p.error(f"--threads must be a positive integer, got {a.threads}")
    try:
        cfg = config_from_args(a)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda requested but torch.cuda.is_available() is False; valid here: cpu")
    if a.out is None:
        a.out = QUICK_OUT if a.quick else DEFAULT_OUT
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out {a.out} is a file; give a folder for the results")
    torch.set_num_threads(a.threads)
    machine = machine_info(cfg.device)
    a.out.mkdir(parents=True, exist_ok=True)
    written = {}
    for part in PARTS:
        if part not in a.only:
            continue
        t0 = time.perf_counter()
        if part == "train":
            results = bench_train(schemes, cfg, a.quiet)
        elif part == "memory":
            results = bench_memory(schemes, cfg, a.threads, a.quiet)
        else:
            results = bench_decode(schemes, cfg, a.quiet)
        doc = {
            "schema": SCHEMA,
            "part": part,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": a.quick,
            "machine": machine,
            "config": cfg.as_dict(),
            "schemes": list(schemes),
            "wall_s": None,
            "results": results,
        }
        doc["wall_s"] = round(time.perf_counter() - t0, 2)
        atomic_write_json(a.out / f"{part}.json", doc)
        written[part] = doc
        log(f"{part}: {doc['wall_s']:.1f} s -> {a.out / (part + '.json')}", a.quiet)
    write_report(a.out)
    log(f"table: {a.out / 'table.md'}; figure: {a.out / 'cost.png'}", a.quiet)
    return written


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
