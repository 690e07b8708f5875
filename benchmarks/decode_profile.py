"""Where a cached greedy-decoding step spends its time.

``python -m benchmarks.decode_profile [--schemes none,shaw] [--threads N] [--out DIR] [--quick]``

For each scheme: one untimed cached greedy decode, then one under ``torch.profiler`` (the decoding
benchmark's sizes: ``decode_batch`` sources of ``decode_src_len`` tokens, ``decode_new_tokens`` new tokens,
no end token).  The operators' own time is sorted into

* ``output projection``: the product with the vocabulary matrix (the tied embedding);
* ``linear layers``: every other ``nn.Linear`` (q, k, v, output and feed-forward projections);
* ``attention``: the fused kernel, or the explicit products, softmax and position terms;
* ``other operators``: layer norms, the cache writes, argmax, concatenation, masks, ...;
* ``outside operators``: what is left of the wall time (Python, module calls, dispatch).

Shares are of the profiled call; ``ms_per_step`` is the median of three unprofiled calls divided by the
number of new tokens.  Writes ``<out>/decode_profile.json``: without ``--out`` in a new folder
``runs/decode-profile-STAMP``, never in the published ``benchmarks/results`` (to publish: ``--out
benchmarks/results --overwrite``).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import statistics
import sys
import time
from pathlib import Path

import torch

from posenc_lib import PE_TYPES, greedy_decode
from posenc_lib.cli import INTERRUPTED, CliParser, interrupted_message
from posenc_lib.files import atomic_write_json, check_folder_path

from .common import BenchConfig, available_cores, check_schemes, log, machine_info, make_model, random_tokens

SCHEMA = "posenc-bench/1"
CATEGORIES = ("output projection", "linear layers", "attention", "other operators", "outside operators")
_ATTENTION = ("scaled_dot_product", "softmax", "bmm", "baddbmm", "gather", "einsum")
#: where a run without --out goes, one new folder per run (runs/ is not tracked); benchmarks/results is
#: written only when --out names it (and --overwrite replaces its decode_profile.json)
RUNS = Path(__file__).resolve().parent.parent / "runs"


def default_out() -> Path:
    """A new folder ``runs/decode-profile-STAMP`` for a run without ``--out``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out, n = RUNS / f"decode-profile-{stamp}", 1
    while out.exists():
        n += 1
        out = RUNS / f"decode-profile-{stamp}-{n}"
    return out


#: profiler records of torch.compile's machinery around a compiled step (guards, the region, the bytecode before the
#: graph): not operators, so their own time counts as outside operators
_COMPILE_MACHINERY = ("TorchDynamo Cache Lookup", "Torch-Compiled Region", "Pregraph bytecode", "CompiledFunction")


def operator_category(name: str, shapes, vocab: int) -> str | None:
    """The category of one operator's own time; ``None`` for a wrapper whose time is its callees' or for
    torch.compile's machinery (then it stays in "outside operators").  A compiled graph's own time (its generated
    kernels: the fused layer norms, residual sums, activations) counts as other operators."""
    if name in ("aten::linear", "aten::matmul") or any(name.startswith(m) for m in _COMPILE_MACHINERY):
        return None  # their work is the addmm / mm / bmm they call, counted there
    if name in ("aten::mm", "aten::addmm", "mkldnn::_linear_pointwise"):  # the last: a packed weight (decoding)
        if any(s and vocab in (s[0], s[-1]) for s in shapes if isinstance(s, list)):  # x W^T or W x^T
            return "output projection"
        return "attention" if name == "aten::mm" else "linear layers"
    if any(key in name for key in _ATTENTION):
        return "attention"
    return "other operators"


def profile_scheme(pe: str, cfg: BenchConfig) -> dict:
    model = make_model(pe, cfg).eval()
    src = random_tokens(cfg, cfg.decode_batch, cfg.decode_src_len, seed=3)

    def run():
        return greedy_decode(model, src, max_new_tokens=cfg.decode_new_tokens, bos_id=1, eos_id=None,
                             compile=cfg.decode_compile)

    run()  # warm-up (with --compile: compiling)
    run()
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        run()
        walls.append(time.perf_counter() - t0)
    with torch.profiler.profile(record_shapes=True) as prof:
        t0 = time.perf_counter()
        run()
        wall = time.perf_counter() - t0
    spent = dict.fromkeys(CATEGORIES, 0.0)
    for e in prof.key_averages(group_by_input_shape=True):
        cat = operator_category(e.key, e.input_shapes, cfg.vocab_size)
        if cat is not None:
            spent[cat] += e.self_cpu_time_total / 1e6
    spent["outside operators"] = max(0.0, wall - sum(spent.values()))
    total = sum(spent.values())
    return {
        "ms_per_step": 1e3 * statistics.median(walls) / cfg.decode_new_tokens,
        "profiled_wall_s": wall,
        "shares": {c: spent[c] / total for c in CATEGORIES},
    }


def main(argv=None) -> dict:
    p = CliParser(prog="python -m benchmarks.decode_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default=",".join(PE_TYPES), help="comma-separated; none is always profiled")
    p.add_argument("--threads", type=int, default=available_cores())
    p.add_argument("--decode-batch", type=int, default=None, help="sources decoded at once (default 8; with --quick "
                   "the quick configuration's 2)")
    p.add_argument("--out", type=Path, default=None, help="folder for decode_profile.json (default: a new folder "
                   "runs/decode-profile-STAMP; --out benchmarks/results --overwrite publishes a run)")
    p.add_argument("--compile", action="store_true", help="profile the compiled step (greedy_decode(compile=True)), "
                   "compiled before the timed and profiled runs")
    p.add_argument("--quick", action="store_true", help="the suite's tiny configuration (seconds)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out/decode_profile.json")
    a = p.parse_args(argv)
    if a.out is None:
        a.out = default_out()
    try:  # before the profiling, not after it
        check_folder_path(a.out, "--out")
    except ValueError as err:
        p.error(str(err))
    if not a.overwrite and (a.out / "decode_profile.json").exists():
        p.error(f"{a.out / 'decode_profile.json'} exists; pass --overwrite to replace it or --out to write elsewhere")
    if a.threads <= 0:
        p.error(f"--threads must be a positive integer, got {a.threads}")
    try:
        schemes = check_schemes(a.schemes.split(","))
    except ValueError as e:
        p.error(f"--schemes: {e}")
    try:
        cfg = BenchConfig.quick() if a.quick else BenchConfig(decode_batch=8)
        if a.decode_batch is not None:  # with --quick too (it was ignored there)
            cfg = dataclasses.replace(cfg, decode_batch=a.decode_batch)
        cfg = dataclasses.replace(cfg, decode_compile=a.compile)
    except (TypeError, ValueError) as e:
        p.error(str(e))
    torch.set_num_threads(a.threads)
    doc = {
        "schema": SCHEMA,
        "part": "decode_profile",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": a.quick,
        "machine": machine_info(cfg.device),
        "config": cfg.as_dict(),
        "results": {},
    }
    try:
        for pe in schemes:
            doc["results"][pe] = r = profile_scheme(pe, cfg)
            log(f"{pe}: {r['ms_per_step']:.2f} ms per step; "
                + ", ".join(f"{c} {100 * s:.0f}%" for c, s in r["shares"].items()))  # fmt: skip
    except KeyboardInterrupt:  # the file is written once, at the end: nothing of this run is there
        print(interrupted_message(f"nothing was written to {a.out}", "run the same command again"), file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    a.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.out / "decode_profile.json", doc)
    return doc


if __name__ == "__main__":
    main()
