"""RoPE as today's LLMs vary it, on lesson 14's character LM: partial rotary of both kinds, and RoPE:NoPE layers.

The experiment behind section 7 of notebooks/15_rope_in_llms.ipynb.  The same data, training recipe and
evaluation as posenc_lib/experiments/long_context.py (train at 64 characters, perplexity on unseen Europarl
text in windows of 1x, 2x, 4x and 8x that length, zero-shot), with a model of 4 layers and 2 heads of 32
dimensions (16 rotation pairs, so that a tenth of a head is at least one pair, and a 3:1 layer pattern fits):

* **partial rotary**, the fraction ``f`` of each head that rotates in 0, 0.1, 0.25, 0.5, 1, for each kind
  (posenc_lib/schemes/rope_spectrum.py): ``neox`` rotates the first ``2 * pairs`` dimensions with a ladder
  spread over them (``rotary_dim``), ``prope`` keeps the full head's ladder for the fastest ``pairs`` and zeroes
  the rest (``rope_type="proportional"``), ``pairs = int(f * head_dim // 2)``.  ``f = 0`` is NoPE and
  ``f = 1`` plain RoPE for both kinds, so they are trained once (``nope``, ``rope``); at ``f = 0.1`` both
  kinds rotate one pair at the same speed and differ only in which two dimensions carry it;
* **layers**: ``rope3-nope1``, RoPE in layers 0-2 and none in layer 3 (the 3:1 pattern of Llama 4, SmolLM3
  and Cohere's Command R7B/A), beside all-RoPE (``rope``) and all-NoPE (``nope``).

Each (model, seed) writes one JSON file into ``--out`` as soon as it finishes (temporary file + rename; the
record format of long_context.py); a rerun skips finished files, so the run can be stopped and resumed.  The
default ``--out`` is ``runs/rope-variants-PROFILE``, never the committed results; a folder holding results of
another configuration is refused; ``--out`` is locked while the run writes it, and Ctrl-C stops every worker.

Command line::

    python -m posenc_lib.experiments.rope_variants --profile smoke --out runs/rope-variants-smoke
    python -m posenc_lib.experiments.rope_variants --profile course --seeds 0,1,2 --out results/rope_variants --jobs 2
    python -m posenc_lib.experiments.rope_variants --profile course --time-updates 20   # time it first

Cost of the ``course`` profile: 9 models x 3 seeds, 1500 updates each; see the README for the measured
time per update and the total.  ``smoke``: seconds per model.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from typing import Any, Sequence

import torch

from ..models.causal_lm import CausalLM
from ..schemes.rope_spectrum import rotary_pairs
from ..cli import CliParser, timing_command
from ..files import atomic_write_json
from . import charlm, runner
from . import long_context as lc

#: the fractions of each head that rotate, and the two kinds of partial rotary
FRACTIONS = (0.0, 0.1, 0.25, 0.5, 1.0)
KINDS = ("neox", "prope")

#: ``course``: lesson 14's model and recipe with 4 layers of 2 heads (head_dim 32)
COURSE = replace(lc.COURSE, name="rope-variants", n_heads=2, num_layers=4)
#: ``smoke``: seconds per model, for tests and CI; learns little (head_dim 32 too, so the model list is the same)
SMOKE = replace(lc.SMOKE, name="rope-variants-smoke", d_model=32, n_heads=1, num_layers=4)
PROFILES = {"course": COURSE, "smoke": SMOKE}


def model_name(kind: str, fraction: float) -> str:
    """The trained model that stands for (kind, fraction): ``nope`` at 0, ``rope`` at 1, else ``kind-f``."""
    if kind not in KINDS:
        raise ValueError(f"unknown partial rotary kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if fraction not in FRACTIONS:
        raise ValueError(f"fraction {fraction!r} is not in the sweep; valid fractions: {FRACTIONS}")
    return "nope" if fraction == 0 else "rope" if fraction == 1 else f"{kind}-{fraction:g}"


def models(cfg: lc.LongContextConfig) -> dict[str, Any]:
    """Name -> the ``pe`` argument of :class:`CausalLM` (a ``(name, options)`` pair, or a list per layer)."""
    head_dim = cfg.d_model // cfg.n_heads
    rope = ("rope", {"interleaved": False})
    out: dict[str, Any] = {"nope": ("none", {}), "rope": rope}
    for f in FRACTIONS[1:-1]:
        pairs = rotary_pairs(f, head_dim)
        out[f"neox-{f:g}"] = ("rope", {"interleaved": False, "rotary_dim": 2 * pairs}) if pairs else ("none", {})
        out[f"prope-{f:g}"] = ("rope", {"interleaved": False,
                                        "scaling": {"rope_type": "proportional", "partial_rotary_factor": f}})  # fmt: skip
    if cfg.num_layers % 4:
        raise ValueError(f"the 3:1 RoPE:NoPE model needs num_layers divisible by 4, got {cfg.num_layers}")
    out["rope3-nope1"] = [rope if (i + 1) % 4 else ("none", {}) for i in range(cfg.num_layers)]
    return out


def make_model(name: str, cfg: lc.LongContextConfig, vocab_size: int) -> CausalLM:
    spec = models(cfg)[name]
    dims = dict(d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers, dim_feedforward=cfg.dim_feedforward)
    if isinstance(spec, list):
        return CausalLM(vocab_size, spec, **dims)
    pe, options = spec
    return CausalLM(vocab_size, pe, **dims, **options)


def train_one(name: str, seed: int, cfg: lc.LongContextConfig, out) -> str:
    """Train one model at ``train_len`` and evaluate it at every length; write its result file."""
    vocab, eval_ids, model, losses, seconds = charlm.train_at_length(lambda v: make_model(name, cfg, v), seed, cfg)
    t1 = time.perf_counter()
    evals = {"none": charlm.evaluate(model, eval_ids, cfg.eval_lengths)}
    rec = charlm.record("pretrain", name, seed, cfg, model, losses, seconds, evals, vocab_size=len(vocab),
                     eval_seconds=round(time.perf_counter() - t1, 1), pe=repr(models(cfg)[name]))  # fmt: skip
    atomic_write_json(lc.result_path(out, name, seed), rec)
    return f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, " + charlm.ppl_line(evals)


def run_all(cfg: lc.LongContextConfig, seeds: Sequence[int], out, *, names: Sequence[str] | None = None,
            jobs: int = 1, log=print) -> None:  # fmt: skip
    """Train every (model, seed) not yet in ``out`` (:func:`runner.run_grid`); ``jobs`` worker processes.

    ``out`` is locked while this runs; a result file made with another configuration is refused
    (``ValueError``); Ctrl-C stops every worker at once, and what finished is kept (a rerun skips it).
    """
    seeds = list(dict.fromkeys(int(s) for s in seeds))  # a model or seed named twice is trained once
    names = list(dict.fromkeys(models(cfg) if names is None else names))
    cells = [runner.Cell(lc.result_path(out, n, s), train_one, (n, s, cfg, out)) for n in names for s in seeds]
    runner.run_grid(cells, out=out, schema=charlm.RECORDS, config=asdict(cfg), jobs=jobs, log=log)


def time_updates(cfg: lc.LongContextConfig, updates: int = 20, warmup: int = 3, names: Sequence[str] | None = None,
                 log=print) -> dict[str, Any]:  # fmt: skip
    """Time each model's training updates (after ``warmup`` untimed ones; one thread, as in the run) and one
    evaluation pass at every length; project the sweep with 3 seeds (:func:`runner.time_updates`)."""
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = charlm.data(cfg)
    kw = dict(length=cfg.train_len, batch=cfg.batch_size, lr=cfg.lr, warmup=1, grad_clip=cfg.grad_clip)
    return runner.time_updates(
        list(models(cfg)) if names is None else list(names), lambda name: make_model(name, cfg, len(vocab)),
        lambda model, n, seed: charlm.train_steps(model, train_ids, steps=n, seed=seed, **kw),
        lambda name, model: charlm.evaluate(model, eval_ids, cfg.eval_lengths), updates=updates, warmup=warmup,
        steps=cfg.steps, threads=cfg.threads, profile=cfg.name, log=log)  # fmt: skip


# -- reading results ------------------------------------------------------------------------------
def table(records: Sequence[dict]) -> dict[tuple[str, float], dict]:
    """``(kind, fraction)`` -> the seed summary of its model (:func:`long_context.summarize`), every cell of the sweep."""
    summary = charlm.summarize(records)
    return {(k, f): summary[("pretrain", model_name(k, f), "none")] for k in KINDS for f in FRACTIONS
            if ("pretrain", model_name(k, f), "none") in summary}  # fmt: skip


# -- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.rope_variants", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", default="all", help="'all' or comma-separated names from " + ", ".join(models(COURSE)))
    p.add_argument("--out", default=None, help="folder for the result files (default runs/rope-variants-PROFILE; "
                                               "the committed results are never the default)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes)")
    p.add_argument("--time-updates", type=int, default=0, metavar="N",
                   help="time N updates and one evaluation per model, print the projected cost, train nothing")
    p.add_argument("--timing-out", default=None, metavar="FILE", help="with --time-updates: also write the timings here")
    p.add_argument("--overwrite", action="store_true", help="with --timing-out: replace an existing file")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = runner.parse_selection(p, a, list(models(cfg)))
    code = timing_command(p, a, lambda n: time_updates(cfg, n, names=names))
    if code is not None:
        return code
    out = a.out or f"runs/rope-variants-{a.profile}"
    return runner.run_command(p, out, None, lambda: run_all(cfg, seeds, out, names=names, jobs=a.jobs))

if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COURSE", "SMOKE", "PROFILES", "FRACTIONS", "KINDS", "models", "model_name", "make_model", "run_all",
           "time_updates", "table"]  # fmt: skip
