"""Two extra models for lessons 07 and 10, trained exactly like results/long_context (long_context.py).

* ``sinusoidal``: the ALiBi paper's baseline (Press et al. 2022, figure 1), trained at context 64 and
  evaluated at 64-512 characters, beside the committed ALiBi and RoPE runs of results/long_context.
* ``t5``: a causal T5 bias, to show what its per-head table learns (lesson 07); the learned
  ``(num_buckets, heads)`` table is stored in the result file.

Same configuration (``long_context.COURSE``), data, seed, optimiser and evaluation as the committed runs;
one thread per model; one JSON per model (temporary file + rename); finished files are skipped.

    python -m posenc_lib.experiments.long_context_extra [--out results/long_context_extra] sinusoidal t5
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from ..utils import INTERRUPTED, CliParser, FolderLock, atomic_write_json, interrupted_message, set_seed
from ..models.causal_lm import CausalLM
from . import long_context as longctx

#: the models this module trains
NAMES = ("sinusoidal", "t5")


def run(pe: str, seed: int = 0, cfg: longctx.LongContextConfig = longctx.COURSE,
        out: str | Path = "results/long_context_extra") -> Path:
    """Train and evaluate one model; ``out/PE_seedSEED.json`` (skipped if it exists with this configuration;
    a file made with another one is refused, not taken for this one)."""
    path = Path(out) / f"{pe}_seed{seed}.json"
    if longctx._done(path, cfg):
        return path
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = longctx.data(cfg)
    set_seed(seed)
    model = CausalLM(len(vocab), pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
                             dim_feedforward=cfg.dim_feedforward)
    t0 = time.perf_counter()
    losses = longctx.train_steps(model, train_ids, length=cfg.train_len, batch=cfg.batch_size, steps=cfg.steps,
                                 lr=cfg.lr, warmup=cfg.warmup, grad_clip=cfg.grad_clip, seed=seed)
    seconds = time.perf_counter() - t0
    evals = {"none": longctx.evaluate(model, eval_ids, cfg.eval_lengths)}
    extra = {"vocab_size": len(vocab)}
    if pe == "t5":
        extra["t5_bias_table"] = [[round(float(v), 5) for v in row]
                                  for row in model.pos.relative_attention_bias.weight.detach()]
    rec = longctx._record("pretrain", pe, seed, cfg, model, losses, seconds, evals, **extra)
    atomic_write_json(path, rec)
    print(f"done {pe}: {seconds:.0f} s, " + longctx._ppl_line(evals), flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.long_context_extra", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", default=list(NAMES), help=f"models to train (default: {' '.join(NAMES)})")
    p.add_argument("--out", default="results/long_context_extra")
    a = p.parse_args(argv)
    bad = [n for n in a.names if n not in NAMES]
    if bad:
        p.error(f"unknown model(s) {bad}; valid choices: {', '.join(NAMES)}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file; give a folder")
    try:
        with FolderLock(a.out, what="--out folder"):
            for name in dict.fromkeys(a.names):
                run(name, out=a.out)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"finished models are kept in {a.out}", "run the same command again to train the "
                                  "others (finished ones are skipped)"), file=sys.stderr)
        return INTERRUPTED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
