"""Time and profile one update per scheme with the run's own data, model and training loop.

    python -m posenc_lib.experiments.wmt14.gpucheck --profile gpu --pe none,sinusoidal,shaw,rope \\
        --out results/wmt14-gpu-full [--data-dir D | --source files] [--device cuda] [--set FIELD=VALUE]

For each scheme: ``--warm`` untimed updates, ``--updates`` timed ones (a device synchronisation at the two
ends only), then one update under ``torch.profiler``.  It writes ``OUT/profile.json`` (per scheme: seconds per
update, target tokens/s, the matrix-multiply FLOPs per target token written out by part and the TFLOP/s they
make) and ``OUT/profile.PE.txt`` (the profiler's table of the busiest kernels, sorted by device time on a GPU).
The tokenizer and encoded data it prepares are the run's own (``OUT/tokenizer.json``, ``OUT-ckpt/``), so a run
into the same folder does not prepare them again.  Nothing of the timed models is kept.
``scripts/gpu_check.sh`` runs it between the CUDA tests and the run.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from ...cli import CliParser
from ...files import atomic_write_json, atomic_write_text
from .calibrate import SteadyWindows, timing_profile
from .fastpath import matmul_flops_per_token
from .pipeline import make_run_folders, parse_pes, parse_sets, prepare_data
from .train import PROFILES, Profile, check_hardware, get_profile, resolve_precision, train_model

#: bf16 matrix throughput one H200 reaches in practice (TFLOP/s), the yardstick of ``share_of_h200``
H200_BF16_TFLOPS = 790.0
WARM, UPDATES = 10, 10


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def profile_schemes(prof: Profile, pes: list[str], out, *, data_dir=None, source: str = "auto", device: str = "cpu",
                    warm: int = WARM, updates: int = UPDATES, rows: int = 15, log=print) -> dict:
    """Time ``updates`` updates after ``warm`` and profile the next one, for every scheme; writes and returns
    ``OUT/profile.json`` (see the module's docstring)."""
    run_dir, ckpt_root = make_run_folders(out)
    tok, data, _ = prepare_data(prof, run_dir, data_dir=data_dir, source=source, work_dir=ckpt_root, log=log)
    train = data["train"]
    src_per_tgt = sum(len(r) + 1 for r in train["src"]) / sum(len(r) + 1 for r in train["tgt"])
    flops = matmul_flops_per_token(prof.d_model, prof.dim_feedforward, prof.num_layers, prof.num_decoder_layers,
                                   tok.vocab_size, src_per_tgt=src_per_tgt)
    on_cuda = torch.device(device).type == "cuda"
    result = {"device": device, "gpu": torch.cuda.get_device_name(device) if on_cuda else None,
              "precision": resolve_precision(prof.precision, device), "warm": warm, "updates": updates,
              "source_tokens_per_target_token": round(src_per_tgt, 4),
              "matmul_flops_per_target_token": {k: round(v) for k, v in flops.items()},
              "flops_note": "weights only, per target token of a training update (3 x forward): decoder layers "
                            "6 d^2 + 2 d ff, output layer V d, per source token encoder 4 d^2 + 2 d ff and the "
                            "decoder's cross-attention keys/values 2 d^2; 2 FLOPs per multiply-add; attention scores "
                            "not counted", "schemes": {}}
    log(f"matrix work per target token of an update: {flops['total'] / 1e6:.4g} MFLOP (decoder "
        f"{flops['decoder'] / 1e6:.4g}, output layer {flops['output_layer'] / 1e6:.4g}, encoder and cross keys/values "
        f"{flops['encoder_and_cross_kv'] / 1e6:.4g} at {src_per_tgt:.2f} source tokens per target token)")
    timed_prof = timing_profile(prof, warm, updates + 1)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if on_cuda else [])
    for pe in pes:
        timer = SteadyWindows(warm, updates, 1, sync=lambda: _sync(device))
        profiler = torch.profiler.profile(activities=activities)
        last = warm + updates

        def on_update(state, timer=timer, profiler=profiler, last=last):
            timer(state)
            if state["step"] == last:  # the next update is the profiled one
                profiler.__enter__()
            elif state["step"] == last + 1:
                _sync(device)
                profiler.__exit__(None, None, None)

        work = Path(tempfile.mkdtemp(dir=ckpt_root, prefix=".profile-"))
        t0 = time.perf_counter()
        try:
            trained = train_model(pe, 0, timed_prof, data, tok, work, device=device, progress=False,
                                  stop_after=last + 1, ckpt_dir=work, log=log, on_update=on_update)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        r = timer.result()
        tflops = flops["total"] * r["tok_per_s"] / 1e12
        sort = "cuda_time_total" if on_cuda else "cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=rows)
        atomic_write_text(run_dir / f"profile.{pe}.txt", f"{pe}: one update of the {prof.name} profile on {device}\n"
                                                          f"{table}\n")
        row = {"s_per_update": r["s_per_update"], "tok_per_s": r["tok_per_s"], "tflop_per_s": float(f"{tflops:.4g}"),
               "wall_s": round(time.perf_counter() - t0, 1)}
        if prof.compile:  # the warm-up updates include the compile; False: it failed and the model ran uncompiled
            row["compiled"] = trained["compiled"]
        if on_cuda:
            row["share_of_h200_bf16"] = round(tflops / H200_BF16_TFLOPS, 4)
            row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        row["projected_training_min"] = round(prof.max_steps * r["s_per_update"] / 60, 2)  # alone, max_steps updates
        result["schemes"][pe] = row
        log(f"  {pe}: {r['s_per_update'] * 1000:.1f} ms per update, {r['tok_per_s']:,.0f} target tokens/s, "
            f"{tflops:.4g} TFLOP/s of matrix work" + (f" ({row['share_of_h200_bf16']:.1%} of {H200_BF16_TFLOPS:.0f})"
                                                     if on_cuda else "") + f"; {prof.max_steps} updates alone: "
            f"{row['projected_training_min']:.1f} min; kernels in profile.{pe}.txt")
        atomic_write_json(run_dir / "profile.json", result)  # each scheme's figures as soon as they exist
    return result


def main(argv: list[str] | None = None) -> int:
    ap = CliParser(prog="python -m posenc_lib.experiments.wmt14.gpucheck",
                   description="Time and profile one update per scheme (writes OUT/profile.json, OUT/profile.PE.txt).")
    ap.add_argument("--profile", default="gpu", choices=list(PROFILES))
    ap.add_argument("--pe", default="none,sinusoidal,shaw,rope", help="comma-separated schemes or 'all'")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--source", default="auto", choices=["auto", "hub", "files"])
    ap.add_argument("--out", required=True, help="the run folder the run will use")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    ap.add_argument("--warm", type=int, default=WARM, help=f"untimed updates first (default {WARM})")
    ap.add_argument("--updates", type=int, default=UPDATES, help=f"timed updates (default {UPDATES})")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    try:
        prof = get_profile(args.profile, parse_sets(args.set))
        pes = parse_pes(args.pe)
        for flag, v in (("--warm", args.warm), ("--updates", args.updates), ("--threads", args.threads or 1)):
            if v < 1:
                raise ValueError(f"{flag} must be a positive integer, got {v}")
        device = check_hardware(prof, args.device)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        profile_schemes(prof, pes, args.out, data_dir=args.data_dir, source=args.source, device=device,
                        warm=args.warm, updates=args.updates)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
