"""Run the cost benchmarks: ``python -m benchmarks.run [--quick] [--only train,memory,decode] ...``.

Writes ``<out>/train.json``, ``memory.json``, ``decode.json`` (machine facts,
configuration, raw times, medians and ratios to ``none``), then ``table.md``
and ``cost.png`` from whatever JSON files ``<out>`` holds.  See benchmarks/README.md.

Without ``--out`` a run goes to a new folder ``runs/bench-STAMP`` (``runs/bench-quick-STAMP`` with
``--quick``), never to the published ``benchmarks/results``; a part's JSON already in ``--out`` is
replaced only with ``--overwrite`` (to publish: ``--out benchmarks/results --overwrite``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import datetime as _dt
import os
import time
from pathlib import Path

import torch

from posenc_lib.cli import INTERRUPTED, CliParser, interrupted_message
from posenc_lib.files import FolderLock, atomic_write_json, refuse_overwrite, removed_if_left_empty

from .common import (
    ALL_SCHEMES, DTYPES, BenchConfig, attention_settings, available_cores, check_schemes, log, machine_info,
    valid_schemes,
)
from .decode import bench_decode
from .memory import bench_memory, bench_memory_batches
from .report import write_report
from .train import bench_train, bench_train_batches

SCHEMA = "posenc-bench/1"
PARTS = ("train", "memory", "decode")
#: the parts ``--batches`` measures per batch size, written as ``<part>_batches.json`` beside the single-batch files
BATCH_PARTS = ("train", "memory")


def part_file(part: str, cfg: BenchConfig) -> str:
    """The JSON file of ``part`` in a run made with ``cfg``: ``train_batches.json`` / ``memory_batches.json``
    with ``--batches``, else ``<part>.json``."""
    return f"{part}_batches.json" if cfg.batches and part in BATCH_PARTS else f"{part}.json"


#: every JSON file a run of the suite may write into its folder
PART_FILES = tuple(f"{p}.json" for p in PARTS) + tuple(f"{p}_batches.json" for p in BATCH_PARTS)
#: the published results (committed; lessons and the README read them): written only with --out and --overwrite
DEFAULT_OUT = PUBLISHED = Path(__file__).resolve().parent / "results"
#: where a run without --out goes, one new folder per run (runs/ is not tracked)
RUNS = Path(__file__).resolve().parent.parent / "runs"


def default_out(quick: bool) -> Path:
    """A new folder for a run without ``--out``: ``runs/bench-STAMP`` or ``runs/bench-quick-STAMP``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = RUNS / f"bench{'-quick' if quick else ''}-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = RUNS / f"bench{'-quick' if quick else ''}-{stamp}-{n}"
    return out


def _made_by_suite(folder: Path) -> bool:
    """Whether ``folder`` holds a JSON file of this suite (its table.md and cost.png are then reports of it)."""
    import json

    for name in PART_FILES:
        try:
            if json.loads((folder / name).read_text(encoding="utf-8")).get("schema") == SCHEMA:
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


#: what table.md's header states once for every part: parts measured on other models or devices are not mixed
SHARED = ("d_model", "n_heads", "num_layers", "dim_feedforward", "vocab_size", "device", "dtype")


def other_model(folder: Path, kept: list[str], cfg: BenchConfig) -> str | None:
    """A one-line refusal if a part this run keeps in ``folder`` was measured on another model, device or dtype
    (table.md, made from every part there, would describe them all with one model); None if none was."""
    import json

    now = cfg.as_dict()
    for name in kept:  # a part ("train") or the file of one ("train_batches.json")
        name = name if name.endswith(".json") else f"{name}.json"
        part = name.removesuffix(".json").removesuffix("_batches")
        try:
            doc = json.loads((folder / name).read_text(encoding="utf-8"))
            old = doc["config"] if doc.get("schema") == SCHEMA else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        diff = [k for k in SHARED if isinstance(old, dict) and old.get(k) != now[k]]
        if diff:
            was = ", ".join(f"{k} {old.get(k)}" for k in diff)
            return (f"--out {folder} holds {name} measured with {was} (this run: "
                    f"{', '.join(f'{k} {now[k]}' for k in diff)}), and table.md would describe both parts with one "
                    f"model; give another --out, or measure {part} again too (--only {','.join(PARTS)} --overwrite)")
    return None


def _ints(text: str) -> tuple[int, ...]:
    vals = []
    for item in (v for v in text.split(",") if v.strip()):  # every item, naming the first bad one
        try:
            vals.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {item.strip()!r} in "
                                             f"{text!r}") from None  # fmt: skip
        if vals[-1] <= 0:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {vals[-1]} in {text!r}")
    if not vals:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return tuple(vals)


def _parts(text: str) -> tuple[str, ...]:
    vals = tuple(v.strip() for v in text.split(",") if v.strip())
    if not vals:
        raise argparse.ArgumentTypeError(f"no part named ({text!r}); valid choices: {', '.join(PARTS)}")
    bad = [v for v in vals if v not in PARTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown part(s) {bad}; valid choices: {', '.join(PARTS)}")
    return vals


def parser() -> argparse.ArgumentParser:
    p = CliParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model and lengths (seconds; for tests)")
    p.add_argument("--only", type=_parts, default=PARTS, help="comma-separated subset of: train,memory,decode")
    p.add_argument("--schemes", default=",".join(ALL_SCHEMES),
                   help=f"comma-separated subset of {','.join(valid_schemes())} "
                   f"(default: {','.join(ALL_SCHEMES)})")
    p.add_argument("--lengths", type=_ints, help="training lengths, e.g. 64,256,1024")
    p.add_argument("--memory-length", type=int, help="length of the memory benchmark")
    p.add_argument("--batch", type=int, help="training batch size")
    p.add_argument("--batches", type=_ints, help="measure train and memory at each of these batch sizes, e.g. 1,2,8,16 "
                   "(memory at every --lengths); written as train_batches.json, memory_batches.json")
    p.add_argument("--repeats", type=int, help="timed repeats per figure (median reported)")
    p.add_argument("--decode-repeats", type=int, help="timed repeats per decoding figure")
    p.add_argument("--decode-batch", type=int, help="batch size of the decoding benchmark (default 32)")
    p.add_argument("--decode-compile", action="store_true", help="also time cached decoding with the compiled step "
                   "(greedy_decode(compile=True); compiling takes tens of seconds per scheme, outside the timings)")
    p.add_argument("--warmup", type=int, help="untimed warm-up runs per scheme")
    p.add_argument("--dropout", type=float, help="dropout of the model in the training benchmark")
    p.add_argument("--threads", type=int, default=available_cores(), help="torch threads (default: available cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="model dtype")
    p.add_argument(
        "--out", type=Path, help="folder for the JSON, table.md and cost.png (default: a new folder "
        "runs/bench-STAMP, or runs/bench-quick-STAMP with --quick)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the parts' JSON files already in --out "
                   "(e.g. --out benchmarks/results --overwrite to publish a run)")
    p.add_argument("--quiet", action="store_true")
    return p


def config_from_args(a: argparse.Namespace) -> BenchConfig:
    cfg = BenchConfig.quick() if a.quick else BenchConfig()
    over = {
        "lengths": a.lengths, "memory_length": a.memory_length, "batch": a.batch, "batches": a.batches,
        "repeats": a.repeats,
        "decode_repeats": a.decode_repeats, "decode_batch": a.decode_batch, "warmup": a.warmup, "dropout": a.dropout,
        "decode_compile": a.decode_compile or None,
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
        a.out = default_out(a.quick)
    if a.out.exists() and not a.out.is_dir():
        p.error(f"--out {a.out} is a file; give a folder for the results")
    if not a.overwrite:  # checked before anything runs: no part is measured only to be refused
        try:
            refuse_overwrite([a.out / part_file(part, cfg) for part in PARTS if part in a.only],
                             advice="or give another --out")
            if a.out.is_dir() and not _made_by_suite(a.out):  # a table.md of something else
                refuse_overwrite([a.out / "table.md", a.out / "cost.png"], advice="or give another --out")
        except FileExistsError as err:
            p.error(str(err))
    mixed = other_model(a.out, [f for f in PART_FILES if f not in {part_file(p, cfg) for p in a.only}], cfg)
    if mixed:
        p.error(mixed)
    torch.set_num_threads(a.threads)
    try:
        with removed_if_left_empty(a.out), FolderLock(a.out, what="--out folder", log=lambda m: log(m, a.quiet)):
            return run_parts(a, schemes, cfg)
    except ValueError as err:  # the folder is locked by another run
        p.error(str(err))
    except KeyboardInterrupt:
        print(interrupted_message(f"the parts finished are kept in {a.out}", "run the parts that are missing again "
                                  "with --only"), file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None


def run_parts(a: argparse.Namespace, schemes, cfg: BenchConfig) -> dict:
    """Measure the parts of ``a.only`` for ``schemes`` and write each part's file in ``a.out``."""
    machine = machine_info(cfg.device)
    written = {}
    for part in PARTS:
        if part not in a.only:
            continue
        t0 = time.perf_counter()
        if part == "train":
            results = (bench_train_batches if cfg.batches else bench_train)(schemes, cfg, a.quiet)
        elif part == "memory":
            if cfg.batches:
                results = bench_memory_batches(schemes, cfg, a.threads, a.quiet)
            else:
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
            "attention_settings": attention_settings(),
            "schemes": list(schemes),
            "wall_s": None,
            "results": results,
        }
        doc["wall_s"] = round(time.perf_counter() - t0, 2)
        atomic_write_json(a.out / part_file(part, cfg), doc)
        written[part] = doc
        log(f"{part}: {doc['wall_s']:.1f} s -> {a.out / part_file(part, cfg)}", a.quiet)
    write_report(a.out)
    figure = f"figure: {a.out / 'cost.png'}" if (a.out / "cost.png").exists() else "no figure (no scheme to draw)"
    log(f"table: {a.out / 'table.md'}; {figure}", a.quiet)
    return written


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
