"""Does a model use the text beyond its training length?  Read it through a sliding window and compare.

The experiment behind the critique in notebooks/10_alibi.ipynb ("flat is not the same as using the
context").  The character models of posenc_lib/experiments/long_context.py (same profile, seeds and
weights) are read on the same held-out windows of 1x .. 8x the training length ``L`` twice:

* **whole window**: every character is predicted from everything before it in the window (the
  reading of long_context's ``evaluate``);
* **sliding window of ``L``**: every character is predicted from at most the ``L`` characters before
  it (the character at position ``t`` of a window is read by running the model on positions
  ``t - L + 1 .. t`` alone), so nothing beyond the training length can reach it.

If a model's whole-window perplexity at ``n > L`` is no better than its sliding-window perplexity,
the longer context did not help it: what a flat extrapolation curve shows is then that longer inputs
do not hurt, not that they are used.  Per length, the record has both perplexities and both NLLs in
8 position bins (the bins past ``L`` are where the two readings differ).

Each (model, seed) writes one JSON file into ``--out`` as soon as it finishes (temporary file +
rename); a rerun skips finished files.  The pre-trained weights are read from ``--ckpt`` (the folder
``long_context`` saves them in) and trained again, identically, when they are missing.

Cost of the committed ``course`` run (alibi, rope and nope, 3 seeds): 19 minutes on 2 cores shared with a
training run, six of the nine models trained again on the way (60-145 s each), reading 30-85 s per model.

Command line::

    python -m posenc_lib.experiments.sliding_window --profile smoke --out runs/sliding-window-smoke
    python -m posenc_lib.experiments.sliding_window --profile course --seeds 0,1,2 --out results/sliding_window
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..checks import unique_choices
from ..cli import CliParser
from ..files import atomic_write_json
from . import charlm, runner
from . import long_context as lc

SCHEMA = "posenc.sliding-window/1"
#: what a result file holds
RECORDS = runner.Schema(SCHEMA, ("schema", "model", "seed", "config", "whole", "sliding"))
#: the models read (names of long_context.models); NoPE, the variants and the fine-tunes are left out
MODELS = ("alibi", "rope", "nope")


@torch.no_grad()
def sliding_nll(model, ids: torch.Tensor, n: int, window: int, *, batch: int = 256) -> torch.Tensor:
    """Per-position NLL (nats) of the non-overlapping length-``n`` windows of ``ids`` (the windows of
    ``long_context.evaluate``), each character predicted from at most the ``window`` characters before it;
    the mean over windows, shape ``(n,)``."""
    model.eval()
    k = (ids.numel() - 1) // n
    x = ids[: k * n].view(k, n)
    y = ids[1 : k * n + 1].view(k, n)
    nll = torch.zeros(n)
    w = min(window, n)
    # positions 0 .. w-1 see at most w characters anyway: one pass over the first w of each window
    for i in range(0, k, 16):
        logits = model(x[i : i + 16, :w])
        nll[:w] += F.cross_entropy(logits.transpose(1, 2), y[i : i + 16, :w], reduction="none").sum(0)
    if n > w:
        # position t >= w: the w characters t-w+1 .. t, read alone; only the last prediction counts
        starts = torch.arange(1, n - w + 1)  # context start for t = w .. n-1
        cols = starts[:, None] + torch.arange(w)[None]  # (n - w, w)
        for r in range(k):
            windows = x[r][cols]  # (n - w, w)
            tgt = y[r][starts + w - 1]  # (n - w,)
            for j in range(0, len(windows), batch):
                logits = model(windows[j : j + batch])
                nll[w + j : w + j + len(logits)] += F.cross_entropy(logits[:, -1], tgt[j : j + batch], reduction="none")
    return nll / k


def nll_row(n: int, nll: torch.Tensor, bins: int = 8) -> dict:
    """A result row for length ``n`` from per-position NLLs: mean NLL, perplexity and the mean over ``bins`` bins."""
    mean = float(nll.mean())
    return {"length": n, "nll": round(mean, 5), "ppl": round(math.exp(mean), 4),
            "nll_by_position": [round(float(v), 4) for v in nll.view(bins, -1).mean(1)] if n % bins == 0 else None}


def read_model(name: str, seed: int, cfg: lc.LongContextConfig, out, ckpt) -> str:
    """Both readings of one pre-trained model at every eval length; writes its record."""
    torch.set_num_threads(cfg.threads)
    vocab, _train_ids, eval_ids = charlm.data(cfg)
    model, seconds = lc.weights(name, cfg, seed, ckpt, len(vocab))
    t0 = time.perf_counter()
    whole = charlm.evaluate(model, eval_ids, cfg.eval_lengths)
    sliding = [nll_row(n, sliding_nll(model, eval_ids, n, cfg.train_len)) for n in cfg.eval_lengths]
    rec = {"schema": SCHEMA, "model": name, "seed": seed, "profile": cfg.name, "config": asdict(cfg),
           "window": cfg.train_len, "whole": [{k: r[k] for k in ("length", "nll", "ppl", "nll_by_position")}
                                              for r in whole],
           "sliding": sliding, "retrained_seconds": None if seconds is None else round(seconds, 1),
           "eval_seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}  # fmt: skip
    atomic_write_json(result_path(out, name, seed), rec)
    return (f"done {name} seed {seed}: whole / sliding ppl "
            + " ".join(f"{a['length']}:{a['ppl']:.2f}/{b['ppl']:.2f}" for a, b in zip(rec["whole"], sliding)))


def result_path(out, name: str, seed: int) -> Path:
    """The record of model ``name``, seed ``seed``, in ``out``."""
    return Path(out) / f"{name}_seed{seed}.json"


def run_all(cfg: lc.LongContextConfig, seeds: Sequence[int], out, ckpt, *, names: Sequence[str] = MODELS,
            log=print) -> None:  # fmt: skip
    """Every (model, seed) not yet in ``out``, one after the other (:func:`runner.run_grid`); ``out`` and ``ckpt``
    locked meanwhile."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    names = unique_choices("model", names, MODELS)
    cells = [runner.Cell(result_path(out, m, s), read_model, (m, s, cfg, out, ckpt)) for m in names for s in seeds]
    runner.run_grid(cells, out=out, ckpt=ckpt, schema=RECORDS, config=asdict(cfg), log=log)


def load_results(out) -> list[dict]:
    """Every record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.sliding_window", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(lc.PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated names from " + ", ".join(MODELS))
    p.add_argument("--out", default=None, help="folder for the result files (default runs/sliding-window-PROFILE)")
    p.add_argument("--ckpt", default="runs/longctx", help="where long_context keeps the pre-trained weights")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    cfg = lc.PROFILES[a.profile]
    seeds = runner.parse_seeds(p, a.seeds)
    names = runner.parse_names(p, a.models, MODELS, all_word=None)
    out = a.out or f"runs/sliding-window-{a.profile}"
    return runner.run_command(p, out, a.ckpt, lambda: run_all(cfg, seeds, out, a.ckpt, names=names))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MODELS", "sliding_nll", "read_model", "run_all", "load_results"]
