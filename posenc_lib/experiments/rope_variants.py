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
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch

from ..models.causal_lm import CausalLM
from ..schemes.rope_spectrum import rotary_pairs
from ..utils import (INTERRUPTED, CliParser, FolderLock, atomic_write_json, check_positive_int, interrupted_message,
                     removed_if_left_empty, run_calls, set_seed, timing_command)
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
    vocab, eval_ids, model, losses, seconds = lc.train_at_length(lambda v: make_model(name, cfg, v), seed, cfg)
    t1 = time.perf_counter()
    evals = {"none": lc.evaluate(model, eval_ids, cfg.eval_lengths)}
    rec = lc._record("pretrain", name, seed, cfg, model, losses, seconds, evals, vocab_size=len(vocab),
                     eval_seconds=round(time.perf_counter() - t1, 1), pe=repr(models(cfg)[name]))  # fmt: skip
    atomic_write_json(lc.result_path(out, name, seed), rec)
    return f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, " + lc._ppl_line(evals)


def run_all(cfg: lc.LongContextConfig, seeds: Sequence[int], out, *, names: Sequence[str] | None = None,
            jobs: int = 1, log=print) -> None:  # fmt: skip
    """Train every (model, seed) not yet in ``out``; ``jobs`` worker processes.

    ``out`` is locked while this runs; a result file made with another configuration is refused
    (``ValueError``); Ctrl-C stops every worker at once, and what finished is kept (a rerun skips it).
    """
    jobs = check_positive_int("jobs", jobs)
    seeds = list(dict.fromkeys(int(s) for s in seeds))  # a model or seed named twice is trained once
    names = list(dict.fromkeys(models(cfg) if names is None else names))
    with FolderLock(out, what="--out folder", log=log):
        todo = [(n, s) for n in names for s in seeds if not lc.finished(lc.result_path(out, n, s), cfg)]
        if len(todo) < len(names) * len(seeds):
            log(f"skipping {len(names) * len(seeds) - len(todo)} finished result(s) in {out}")
        run_calls([(train_one, (n, s, cfg, out)) for n, s in todo], jobs, log)


def time_updates(cfg: lc.LongContextConfig, updates: int = 20, warmup: int = 3, names: Sequence[str] | None = None,
                 log=print) -> dict[str, Any]:  # fmt: skip
    """Time each model's training updates (after ``warmup`` untimed ones; one thread, as in the run) and one
    evaluation pass at every length; project the sweep with 3 seeds.

    Both wall time and the process's CPU time are kept: on cores shared with other work the wall time is
    longer than the CPU time the run needs.  Returns per-model seconds and the projected totals.
    """
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = lc.data(cfg)
    names = list(models(cfg)) if names is None else list(names)
    rows: dict[str, dict[str, float]] = {}
    for name in names:
        set_seed(0)
        model = make_model(name, cfg, len(vocab))
        kw = dict(length=cfg.train_len, batch=cfg.batch_size, lr=cfg.lr, warmup=1, grad_clip=cfg.grad_clip)
        lc.train_steps(model, train_ids, steps=warmup, seed=0, **kw)
        w0, c0 = time.perf_counter(), time.process_time()
        lc.train_steps(model, train_ids, steps=updates, seed=1, **kw)
        w1, c1 = time.perf_counter(), time.process_time()
        lc.evaluate(model, eval_ids, cfg.eval_lengths)
        w2, c2 = time.perf_counter(), time.process_time()
        rows[name] = {"wall_per_update": (w1 - w0) / updates, "cpu_per_update": (c1 - c0) / updates,
                      "eval_wall": w2 - w1, "eval_cpu": c2 - c1}  # fmt: skip
        r = rows[name]
        log(f"{name}: {r['cpu_per_update'] * 1000:.0f} ms CPU per update ({r['wall_per_update'] * 1000:.0f} ms wall), "
            f"evaluation {r['eval_cpu']:.1f} s CPU ({r['eval_wall']:.1f} s wall)")  # fmt: skip
    cpu = 3 * sum(r["cpu_per_update"] * cfg.steps + r["eval_cpu"] for r in rows.values())
    wall = 3 * sum(r["wall_per_update"] * cfg.steps + r["eval_wall"] for r in rows.values())
    rows = {n: {k: round(v, 4) for k, v in r.items()} for n, r in rows.items()}
    log(f"projected for {len(names)} models x 3 seeds ({cfg.steps} updates each): {cpu / 60:.0f} CPU minutes "
        f"({wall / 60:.0f} minutes at the wall-clock rate measured here); with --jobs 2 on 2 free cores about "
        f"{cpu / 120:.0f} minutes of wall time")  # fmt: skip
    return {"profile": cfg.name, "updates_timed": updates, "steps": cfg.steps, "threads": cfg.threads,
            "per_model": rows, "cpu_seconds_3_seeds": round(cpu, 1), "wall_seconds_3_seeds": round(wall, 1),
            "torch": torch.__version__}  # fmt: skip


# -- reading results ------------------------------------------------------------------------------
def table(records: Sequence[dict]) -> dict[tuple[str, float], dict]:
    """``(kind, fraction)`` -> the seed summary of its model (:func:`long_context.summarize`), every cell of the sweep."""
    summary = lc.summarize(records)
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
    p.add_argument("--resume", action="store_true",
                   help="accepted for clarity: finished result files are always skipped")  # fmt: skip
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = lc.parse_selection(p, a, list(models(cfg)))
    code = timing_command(p, a, lambda n: time_updates(cfg, n, names=names))
    if code is not None:
        return code
    out = a.out or f"runs/rope-variants-{a.profile}"
    if Path(out).exists() and not Path(out).is_dir():
        p.error(f"--out {out} is a file; give a folder")
    t0 = time.perf_counter()
    try:
        with removed_if_left_empty(out):  # a refusal in the lock (another writer) leaves no folder it made
            run_all(cfg, seeds, out, names=names, jobs=a.jobs)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"finished results are kept in {out}", "rerun the same command (with --resume) to "
                                  "train the others (finished ones are skipped)"), file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    print(f"all done in {time.perf_counter() - t0:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COURSE", "SMOKE", "PROFILES", "FRACTIONS", "KINDS", "models", "model_name", "make_model", "run_all",
           "time_updates", "table"]  # fmt: skip
