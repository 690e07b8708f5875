"""Two extra models for lessons 07 and 10, trained exactly like results/long_context (long_context.py).

* ``sinusoidal``: the ALiBi paper's baseline (Press et al. 2022, figure 1), trained at context 64 and
  evaluated at 64-512 characters, beside the committed ALiBi and RoPE runs of results/long_context.
* ``t5``: a causal T5 bias, to show what its per-head table learns (lesson 07); the learned
  ``(num_buckets, heads)`` table is stored in the result file.
* ``t5-ablation``: the same T5 model trained again (its table is compared with the committed one), evaluated
  as trained and again with every bucket that training never reached set to the values of the last bucket it
  did reach (per head): does the perplexity beyond the training length come from the untrained buckets?

Same configuration (``long_context.COURSE``), data, seed, optimiser and evaluation as the committed runs;
one thread per model; one JSON per model (temporary file + rename); finished files are skipped, and a file made
with another configuration is refused.  The default ``--out`` is ``runs/long-context-extra``, never the committed
results (``--out results/long_context_extra`` names them); ``--out`` is locked while the command writes it.

    python -m posenc_lib.experiments.long_context_extra [--out results/long_context_extra] sinusoidal t5 t5-ablation
"""
from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from ..models.causal_lm import CausalLM
from ..cli import CliParser
from ..files import atomic_write_json, read_json
from ..seeds import set_seed
from . import charlm, runner
from . import long_context as longctx

#: the models this module trains
NAMES = ("sinusoidal", "t5", "t5-ablation")
#: where the command line writes without ``--out`` (the committed results are in results/long_context_extra)
DEFAULT_OUT = "runs/long-context-extra"


def result_file(name: str, out: str | Path = DEFAULT_OUT, seed: int = 0) -> Path:
    """Where model ``name`` (of :data:`NAMES`) of ``seed`` is written in ``out``."""
    return Path(out) / (f"t5_ablation_seed{seed}.json" if name == "t5-ablation" else f"{name}_seed{seed}.json")


def finished(path: Path, cfg: longctx.LongContextConfig) -> bool:
    """True when ``path`` holds this configuration's finished record; one of another configuration is refused."""
    return runner.finished(path, charlm.RECORDS, asdict(cfg))


def run(pe: str, seed: int = 0, cfg: longctx.LongContextConfig = longctx.COURSE,
        out: str | Path = DEFAULT_OUT) -> Path:
    """Train and evaluate one model; ``out/PE_seedSEED.json`` (skipped if it exists with this configuration;
    a file made with another one is refused, not taken for this one)."""
    path = result_file(pe, out, seed)
    if finished(path, cfg):
        return path
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = charlm.data(cfg)
    set_seed(seed)
    model = CausalLM(len(vocab), pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
                             dim_feedforward=cfg.dim_feedforward)
    t0 = time.perf_counter()
    losses = charlm.train_steps(model, train_ids, length=cfg.train_len, batch=cfg.batch_size, steps=cfg.steps,
                                 lr=cfg.lr, warmup=cfg.warmup, grad_clip=cfg.grad_clip, seed=seed)
    seconds = time.perf_counter() - t0
    evals = {"none": charlm.evaluate(model, eval_ids, cfg.eval_lengths)}
    extra = {"vocab_size": len(vocab)}
    if pe == "t5":
        extra["t5_bias_table"] = [[round(float(v), 5) for v in row]
                                  for row in model.scheme.relative_attention_bias.weight.detach()]
    rec = charlm.record("pretrain", pe, seed, cfg, model, losses, seconds, evals, **extra)
    atomic_write_json(path, rec)
    print(f"done {pe}: {seconds:.0f} s, " + charlm.ppl_line(evals), flush=True)
    return path


def trained_buckets(cfg: longctx.LongContextConfig, num_buckets: int = 32, max_distance: int = 128) -> list[int]:
    """The causal T5 buckets that distances ``0 .. train_len - 1`` reach, i.e. the rows training updates."""
    from ..schemes.t5 import t5_relative_bucket

    return sorted(set(t5_relative_bucket(-torch.arange(cfg.train_len), False, num_buckets, max_distance).tolist()))


def t5_ablation(seed: int = 0, cfg: longctx.LongContextConfig = longctx.COURSE,
                out: str | Path = DEFAULT_OUT) -> Path:
    """Retrain the ``t5`` model; evaluate it as trained and with its untrained buckets set to the last trained one.

    Writes ``out/t5_ablation_seedSEED.json`` (skipped if it exists with this configuration; a file made with
    another one is refused): the buckets, how far the retrained table is from the ``t5_seedSEED.json`` table in
    ``out`` (0 when training is reproduced exactly; None without that file), and both evaluations.
    """
    path = result_file("t5-ablation", out, seed)
    if finished(path, cfg):
        return path
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = charlm.data(cfg)
    set_seed(seed)
    model = CausalLM(len(vocab), "t5", d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
                     dim_feedforward=cfg.dim_feedforward)
    t0 = time.perf_counter()
    losses = charlm.train_steps(model, train_ids, length=cfg.train_len, batch=cfg.batch_size, steps=cfg.steps,
                                 lr=cfg.lr, warmup=cfg.warmup, grad_clip=cfg.grad_clip, seed=seed)
    seconds = time.perf_counter() - t0
    table = model.scheme.relative_attention_bias.weight                    # (num_buckets, heads)
    seen = trained_buckets(cfg, model.scheme.num_buckets, model.scheme.max_distance)
    unseen = [b for b in range(model.scheme.num_buckets) if b not in seen]
    committed = Path(out) / f"t5_seed{seed}.json"
    diff = None
    if committed.exists():
        ref = torch.tensor(read_json(committed)["t5_bias_table"])
        diff = round(float((table.detach() - ref).abs().max()), 6)
    evals = {"as trained": charlm.evaluate(model, eval_ids, cfg.eval_lengths)}
    with torch.no_grad():
        table[unseen] = table[max(seen)].clone()                          # every unseen bucket = the last trained one
    evals["unseen buckets = last trained bucket"] = charlm.evaluate(model, eval_ids, cfg.eval_lengths)
    rec = charlm.record("ablation", "t5", seed, cfg, model, losses, seconds, evals, vocab_size=len(vocab),
                          trained_buckets=seen, unseen_buckets=unseen, table_max_abs_diff_vs_committed=diff)
    atomic_write_json(path, rec)
    print(f"done t5-ablation: {seconds:.0f} s, table vs committed {diff}; "
          + "; ".join(f"{k}: " + charlm.ppl_line({"none": v}) for k, v in evals.items()), flush=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.long_context_extra", description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", default=list(NAMES), help=f"models to train (default: {' '.join(NAMES)})")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the result files (default {DEFAULT_OUT}; the "
                                                      "committed results, results/long_context_extra, are never the "
                                                      "default)")  # fmt: skip
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    bad = [n for n in a.names if n not in NAMES]
    if bad:
        p.error(f"unknown model(s) {bad}; valid choices: {', '.join(NAMES)}")
    cfg = longctx.COURSE
    cells = [runner.Cell(result_file(name, a.out), make, (name, a.out)) for name in a.names]
    return runner.run_command(p, a.out, None, lambda: runner.run_grid(
        cells, out=a.out, schema=charlm.RECORDS, config=asdict(cfg)))


def make(name: str, out) -> str:
    """Model ``name`` of :data:`NAMES` trained, evaluated and written into ``out``."""
    path = t5_ablation(out=out) if name == "t5-ablation" else run(name, out=out)
    return f"{name}: {path}"


if __name__ == "__main__":
    raise SystemExit(main())
