"""Two extra models for lessons 07 and 10, trained exactly like results/long_context (posenc_lib/longctx.py).

* ``sinusoidal``: the ALiBi paper's baseline (Press et al. 2022, figure 1), trained at context 64 and
  evaluated at 64-512 characters, beside the committed ALiBi and RoPE runs of results/long_context.
* ``t5``: a causal T5 bias, to show what its per-head table learns (lesson 07); the learned
  ``(num_buckets, heads)`` table is stored in the result file.

Same configuration (``longctx.COURSE``), data, seed, optimiser and evaluation as the committed runs;
one thread per model; one JSON per model (temporary file + rename); finished files are skipped.

    python results/long_context_extra/run.py sinusoidal t5
"""
import sys
import time
from pathlib import Path

import torch

from posenc_lib import longctx
from posenc_lib.utils import atomic_write_json, set_seed

OUT = Path(__file__).resolve().parent


def run(pe: str, seed: int = 0, cfg: longctx.LongContextConfig = longctx.COURSE) -> Path:
    path = OUT / f"{pe}_seed{seed}.json"
    if path.exists():
        return path
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = longctx.data(cfg)
    set_seed(seed)
    model = longctx.CausalLM(len(vocab), pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
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


if __name__ == "__main__":
    for name in sys.argv[1:] or ["sinusoidal", "t5"]:
        run(name)
