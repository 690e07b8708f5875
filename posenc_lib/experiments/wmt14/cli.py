"""The WMT14 command line: ``python -m posenc_lib.experiments.wmt14 [score|make-data|calibrate] ...``.

    python -m posenc_lib.experiments.wmt14 --profile {smoke,cpu,gpu} --pe none,sinusoidal,shaw,rope \\
        [--seeds 0,1] [--direction fr-en|en-fr] [--data-dir D] [--out runs/NAME] [--resume|--overwrite] [--jobs N]
    python -m posenc_lib.experiments.wmt14 score runs/NAME       # BERTScore, paired bootstrap, figures, later
    python -m posenc_lib.experiments.wmt14 make-data --src DIR --out data-gpu --pairs 600000
    python -m posenc_lib.experiments.wmt14 calibrate --profile gpu --data-dir data-gpu --jobs auto --budget-min 15

Training a run is :func:`posenc_lib.experiments.wmt14.pipeline.run`; ``score`` and ``make-data`` are
:func:`~posenc_lib.experiments.wmt14.pipeline.score` and :func:`~posenc_lib.experiments.wmt14.data.make_data`;
``calibrate`` is :mod:`posenc_lib.experiments.wmt14.calibrate`.  This module only parses the command line and
dispatches, so the pipeline and the calibration never import each other's entry points.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from ...cli import INTERRUPTED, CliParser, interrupted_message
from ...files import check_folder_path
from . import calibrate, pipeline
from .data import check_data_dir
from .pipeline import (DEFAULT_PES, DIRECTIONS, check_device, check_hardware, make_data, parse_pes, parse_seeds, parse_sets,
                       resolve_jobs, run, score)
from .train import PROFILES, get_profile


class _Parser(CliParser):
    """Bad flags exit with status 2 and one line (no usage block, no traceback; ``--flag=--`` included)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _dist_timeout():
    """How long a torchrun process waits at a collective: evaluation on rank 0 (BERTScore, bootstrap) can
    outlast NCCL's default of 10 minutes; ``POSENC_DIST_TIMEOUT_MIN`` (default 180) sets it."""
    from datetime import timedelta

    return timedelta(minutes=float(os.environ.get("POSENC_DIST_TIMEOUT_MIN", "180")))


def _score_main(argv) -> int:
    ap = _Parser(prog="python -m posenc_lib.experiments.wmt14 score",
                 description="Add BERTScore, paired bootstrap and figures to a finished run folder.")
    ap.add_argument("run_dir")
    ap.add_argument("--no-bertscore", action="store_true", help="only the paired bootstrap and the figures")
    ap.add_argument("--device", default=None, help="device for BERTScore (default: cuda if present, else cpu)")
    args = ap.parse_args(argv)
    try:
        check_device(args.device)
    except ValueError as err:
        ap.error(str(err))
    try:
        score(args.run_dir, bertscore=not args.no_bertscore, device=args.device)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"every file of {args.run_dir} is whole (each is replaced in one step)",
                                  "run the same command again to finish scoring"), file=sys.stderr)
        return INTERRUPTED
    return 0


def _make_data_main(argv) -> int:
    ap = _Parser(prog="python -m posenc_lib.experiments.wmt14 make-data",
                 description="Write a --data-dir folder with more Europarl training pairs (for a GPU run).")
    ap.add_argument("--src", required=True, help="folder with train.fr.xz/train.en.xz (e.g. ../shared/data/wmt14-fr-en)")
    ap.add_argument("--out", default="data-gpu", help="folder to write (default data-gpu, ignored by git)")
    ap.add_argument("--pairs", type=int, default=600_000, help="training pairs to draw (default 600000)")
    ap.add_argument("--max-words", type=int, default=50, help="longest side in words (default 50)")
    ap.add_argument("--seed", type=int, default=2014)
    ap.add_argument("--extra", action="store_true", help="also train on the newsdev 2008-2012 pairs in SRC/extra")
    ap.add_argument("--overwrite", action="store_true", help="replace the data files of an --out folder that holds some")
    args = ap.parse_args(argv)
    if Path(args.out).exists() and not Path(args.out).is_dir():  # before the corpus is read, not after
        ap.error(f"--out {args.out} is a file; give a new folder")
    try:
        make_data(args.src, args.out, pairs=args.pairs, max_words=args.max_words, seed=args.seed, extra=args.extra,
                  overwrite=args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"no file of {args.out} is half-written", "run the same command with --overwrite "
                                  "to make the folder again"), file=sys.stderr)
        return INTERRUPTED
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "score":
        return _score_main(argv[1:])
    if argv and argv[0] == "make-data":
        return _make_data_main(argv[1:])
    if argv and argv[0] == "calibrate":
        return calibrate.main(argv[1:])
    ap = _Parser(prog="python -m posenc_lib.experiments.wmt14", description=pipeline.__doc__.split("\n\n")[0],
                 epilog="Other commands: 'score RUN_DIR' (BERTScore, bootstrap, figures for a finished run), "
                        "'make-data --src D --out D' (a larger --data-dir), 'calibrate' (time a few updates "
                        "per scheme on this machine and fit max_steps to a time budget); each has --help.")
    ap.add_argument("--profile", default="cpu", choices=list(PROFILES))
    ap.add_argument("--pe", default=",".join(DEFAULT_PES), help="comma-separated schemes or 'all'")
    ap.add_argument("--seeds", default="0", help="comma-separated integers")
    ap.add_argument("--direction", default="fr-en", choices=DIRECTIONS)
    ap.add_argument("--data-dir", default=None, help="folder with train/newstest2013/newstest2014[/heldout].{fr,en}")
    ap.add_argument("--source", default="auto", choices=["auto", "hub", "files"])
    ap.add_argument("--tokenizer", default=None, choices=["bpe", "mbert"])
    ap.add_argument("--vocab", default=None, help="mBERT vocab.txt (default: data/vocab/)")
    ap.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy)")
    ap.add_argument("--out", default=None, help="run folder (default runs/wmt14-PROFILE)")
    ap.add_argument("--ckpt-dir", default=None, help="checkpoints and data cache (default: OUT-ckpt next to OUT)")
    ap.add_argument("--resume", action="store_true", help="continue unfinished models from their checkpoints")
    ap.add_argument("--overwrite", action="store_true", help="train unfinished models again from update 0, replacing "
                                                             "their checkpoints (finished models are kept)")
    ap.add_argument("--jobs", default="1", help="models trained at once as separate processes on one device "
                                                "(an integer or 'auto': one per 38 GiB of GPU memory, at most 4)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (per job)")
    ap.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present, else cpu; "
                                                  "the gpu profile on a machine without one needs --device cpu)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--stop-after", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        overrides = parse_sets(args.set)
        if args.tokenizer:
            overrides["tokenizer"] = args.tokenizer
        if args.beam is not None:
            overrides["beam"] = str(args.beam)
        prof = get_profile(args.profile, overrides)
        pes = parse_pes(args.pe)
        seeds = parse_seeds(args.seeds)
        for flag, v in (("--threads", args.threads), ("--stop-after", args.stop_after)):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be a positive integer, got {v}")
        if args.jobs.strip().lower() != "auto":
            resolve_jobs(args.jobs, "cpu", 1)
        for flag, folder in (("--out", args.out), ("--ckpt-dir", args.ckpt_dir)):
            if folder:
                check_folder_path(folder, flag)
        if args.resume and args.overwrite:
            raise ValueError("--resume continues unfinished models and --overwrite starts them again: pass one of them")
        device = check_hardware(prof, args.device)
        if args.vocab is not None:
            if prof.tokenizer != "mbert":
                raise ValueError(f"--vocab is read only by the mbert tokenizer (this run uses {prof.tokenizer!r}); "
                                 "add --tokenizer mbert, or leave --vocab out")
            from .tokenizer import load_mbert

            load_mbert(args.vocab)  # a bad vocabulary is named now, not after the data is read
        if args.data_dir is not None and args.source != "hub":  # every file read from it, before any work
            check_data_dir(args.data_dir)
    except (ValueError, FileNotFoundError) as err:
        ap.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=_dist_timeout())
    out = args.out or f"runs/wmt14-{prof.name}"
    try:
        run(prof, pes, seeds, out, direction=args.direction,
            data_dir=args.data_dir, source=args.source, vocab=args.vocab, resume=args.resume, overwrite=args.overwrite,
            progress=not args.no_progress and sys.stderr.isatty(), stop_after=args.stop_after,
            ckpt_dir=args.ckpt_dir, jobs=args.jobs, threads=args.threads, device=device)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if int(os.environ.get("RANK", "0")) == 0:
            print(interrupted_message(f"finished models are kept in {out} and unfinished ones continue from their last "
                                      "checkpoint", "rerun the same command with --resume"), file=sys.stderr)
        return INTERRUPTED
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
