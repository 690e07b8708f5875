"""Long context on a CPU: train a small causal language model at context 64, run it at up to 512.

The experiment behind notebooks/14_long_context.ipynb.  A character-level decoder-only
Transformer is trained on the English side of the shipped Europarl text with a context of
``train_len`` characters, then its perplexity is measured on unseen Europarl text in
non-overlapping windows of 1x .. 8x that length:

* **zero-shot**: the RoPE model read with each scaling of posenc_lib/schemes/rope_scaling.py
  (``none``, ``linear`` = Position Interpolation, ``dynamic`` NTK, ``yarn``, ``llama3``), with
  no further training;
* **fine-tuned**: the same model after a short fine-tune (``finetune_steps`` updates, a few
  percent of pre-training) on windows of the longest length, with that scaling in place --
  Chen et al. 2023's claim is that this short fine-tune is all Position Interpolation needs;
* **references**: ALiBi (Press et al. 2022) and no positional encoding (NoPE, Kazemnejad et al.
  2023), trained and fine-tuned the same way;
* **variants** for the lesson's side sections: RoPE with base 500,000 (Llama 3's base) and
  partial rotary (only half of each head rotates, GPT-NeoX style), zero-shot.

Each (model, seed) and each (fine-tune, seed) writes one JSON file into ``--out`` as soon as it
finishes (temporary file + rename); a rerun skips finished files, so the run can be stopped
and resumed.  Pre-trained weights go to ``--ckpt`` (not committed) for the fine-tunes.

Command line::

    python -m posenc_lib.experiments.long_context --profile smoke --out runs/longctx-smoke
    python -m posenc_lib.experiments.long_context --profile course --seeds 0,1,2 --out results/long_context --jobs 2

Cost of the committed ``course`` run (36 result files: 5 models x 3 seeds, 7 fine-tunes x 3 seeds):
about 53 minutes of wall time with ``--jobs 2`` on 2 CPU cores that were shared with other work (load
average 5-10); pre-training one model took 130-360 s of that, a fine-tune 15-55 s.  ``smoke``: about
15 seconds for everything, one seed.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..models.causal_lm import CausalLM
from ..checks import check_positive_int
from ..cli import CliParser
from ..files import atomic_torch_save, atomic_write_json, load_weights
from ..seeds import set_seed
from . import runner
from .charlm import RECORDS, data, evaluate, load_results, ppl_line, record, summarize, train_at_length, train_steps
from .charlm import SCHEMA, load_text  # noqa: F401 (this experiment's record format and text, read by lesson 10)


# -- configuration --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LongContextConfig:
    """Everything that defines a run; the same for every model and seed."""

    name: str = "course"
    # -- data: characters of the shipped Europarl English side ---------------------------------
    train_lines: int = 40000  # the first lines of train.en (about 3M characters), in document order
    eval_offset: int = 260000  # evaluation text starts at this line of train.en: never trained on
    eval_chars: int = 32768  # characters of evaluation text (the same windows for every model)
    min_char_count: int = 20  # rarer characters map to UNK
    # -- the model -------------------------------------------------------------------------------
    d_model: int = 64
    n_heads: int = 4  # head_dim 16: 8 rotation frequencies
    num_layers: int = 2
    dim_feedforward: int = 256
    # -- pre-training at the short context -------------------------------------------------------
    train_len: int = 64
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 100
    grad_clip: float = 1.0
    # -- evaluation and the fine-tune at the long context --------------------------------------
    eval_lengths: tuple[int, ...] = (64, 128, 256, 512)
    factor: float = 8.0  # the scaling factor s: longest eval length / train_len
    finetune_steps: int = 100
    finetune_batch: int = 4  # windows of the longest eval length: the same tokens per update
    finetune_lr: float = 1e-3
    threads: int = 1

    def __post_init__(self):
        for f in ("train_lines", "eval_offset", "eval_chars", "min_char_count", "d_model", "n_heads", "num_layers",
                  "dim_feedforward", "train_len", "steps", "batch_size", "warmup", "finetune_steps",
                  "finetune_batch", "threads"):  # fmt: skip
            check_positive_int(f, getattr(self, f))
        if not self.eval_lengths or any(check_positive_int("eval length", n) < 2 for n in self.eval_lengths):
            raise ValueError(f"eval_lengths must be lengths >= 2, got {self.eval_lengths}")
        if self.eval_chars < max(self.eval_lengths):
            raise ValueError(f"eval_chars={self.eval_chars} is shorter than the longest eval length")
        if not self.factor >= 1:
            raise ValueError(f"factor must be >= 1, got {self.factor}")

    @property
    def long_len(self) -> int:
        return max(self.eval_lengths)


#: ``course``: the lesson's numbers (its commands and costs: results/README.md)
COURSE = LongContextConfig()
#: ``smoke``: seconds per model, for tests and CI; learns little
SMOKE = LongContextConfig(
    name="smoke", train_lines=3000, eval_chars=1024, d_model=32, n_heads=2, num_layers=1, dim_feedforward=64,
    train_len=16, steps=30, batch_size=8, warmup=5, eval_lengths=(16, 32, 64), factor=4.0, finetune_steps=5,
    finetune_batch=2,
)  # fmt: skip
PROFILES = {"course": COURSE, "smoke": SMOKE}


def scalings(cfg: LongContextConfig) -> dict[str, dict | None]:
    """The zero-shot methods: name -> ``scaling`` dict for ``RotaryScheme`` (None = plain RoPE)."""
    L, s = cfg.train_len, cfg.factor
    return {
        "none": None,
        "linear": {"rope_type": "linear", "factor": s},
        # factor 1: the base grows just enough that the slowest frequency turns, at the current
        # length n, exactly as far as it did at L (alpha = n / L)
        "dynamic": {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L},
        "yarn": {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L,
                 "beta_fast": 32.0, "beta_slow": 1.0},
        "llama3": {"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": L},
    }  # fmt: skip


METHODS = ("none", "linear", "dynamic", "yarn", "llama3")


def models(cfg: LongContextConfig) -> dict[str, tuple[str, dict, tuple[str, ...]]]:
    """Pre-trained models: name -> (scheme, options, zero-shot methods to evaluate)."""
    head_dim = cfg.d_model // cfg.n_heads
    return {
        "rope": ("rope", {"interleaved": False}, METHODS),
        "rope-base500k": ("rope", {"interleaved": False, "base": 500000.0}, METHODS),
        "rope-partial": ("rope", {"interleaved": False, "rotary_dim": head_dim // 2}, METHODS),
        "alibi": ("alibi", {}, ("none",)),
        "nope": ("none", {}, ("none",)),
    }


#: fine-tunes at the long length: (pre-trained model, method)
FINETUNES: tuple[tuple[str, str], ...] = tuple(("rope", m) for m in METHODS) + (("alibi", "none"), ("nope", "none"))


def make_model(name: str, cfg: LongContextConfig, vocab_size: int, method: str = "none") -> CausalLM:
    pe, options, _ = models(cfg)[name]
    scaling = scalings(cfg)[method]
    if scaling is not None:
        options = {**options, "scaling": scaling}
    return CausalLM(vocab_size, pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
                    dim_feedforward=cfg.dim_feedforward, **options)  # fmt: skip


def use_method(model: CausalLM, name: str, cfg: LongContextConfig, method: str) -> CausalLM:
    """Read the trained ``model`` with the zero-shot ``method`` (a scaling of its RoPE)."""
    pe, options, _ = models(cfg)[name]
    scaling = scalings(cfg)[method]
    model.set_scheme(pe, **({**options, "scaling": scaling} if scaling is not None else options))
    return model


# -- the jobs -------------------------------------------------------------------------------------
def result_path(out, name: str, seed: int, method: str | None = None) -> Path:
    stem = name if method is None else f"{name}+ft-{method}"
    return Path(out) / f"{stem}_seed{seed}.json"


def ckpt_path(ckpt, cfg: LongContextConfig, name: str, seed: int) -> Path:
    return Path(ckpt) / cfg.name / f"{name}_seed{seed}.pt"


def weights(name: str, cfg: LongContextConfig, seed: int, ckpt, vocab_size: int) -> tuple[CausalLM, float | None]:
    """The pre-trained model ``name`` of ``seed`` and the seconds it took to train (``None`` if loaded): loaded
    from ``ckpt``, or trained again (same seed, same data: the same weights as :func:`pretrain` makes) and saved
    there for the next reader."""
    path = ckpt_path(ckpt, cfg, name, seed)
    if path.exists():
        model = make_model(name, cfg, vocab_size)
        model.load_state_dict(load_weights(path, advice=f"delete it: the next run trains {name} seed {seed} again"))
        return model, None
    _vocab, _ev, model, _losses, seconds = train_at_length(lambda v: make_model(name, cfg, v), seed, cfg)
    atomic_torch_save(model.state_dict(), path)
    return model, seconds


def pretrain(name: str, seed: int, cfg: LongContextConfig, out, ckpt) -> str:
    """Train one model at ``train_len``, evaluate its zero-shot methods, save weights and results."""
    vocab, eval_ids, model, losses, seconds = train_at_length(lambda v: make_model(name, cfg, v), seed, cfg)
    atomic_torch_save(model.state_dict(), ckpt_path(ckpt, cfg, name, seed))
    evals = {}
    for method in models(cfg)[name][2]:
        evals[method] = evaluate(use_method(model, name, cfg, method), eval_ids, cfg.eval_lengths)
    rec = record("pretrain", name, seed, cfg, model, losses, seconds, evals, vocab_size=len(vocab))
    atomic_write_json(result_path(out, name, seed), rec)
    return f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, " + ppl_line(evals)


def finetune(name: str, method: str, seed: int, cfg: LongContextConfig, out, ckpt) -> str:
    """Fine-tune a pre-trained model at the longest length with ``method`` in place; evaluate it."""
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = data(cfg)
    set_seed(seed)
    model = make_model(name, cfg, len(vocab), method)
    path = ckpt_path(ckpt, cfg, name, seed)
    advice = (f"delete it: the next run of this command trains {name} seed {seed} again (its result file is kept "
              "until then)")
    try:
        model.load_state_dict(load_weights(path, advice=advice))
    except RuntimeError as err:  # the weights of another model (another configuration, an edited file)
        raise ValueError(f"weights file {path} belongs to another model ({str(err).splitlines()[0][:120]}); "
                         f"{advice}") from None
    t0 = time.perf_counter()
    losses = train_steps(model, train_ids, length=cfg.long_len, batch=cfg.finetune_batch, steps=cfg.finetune_steps,
                         lr=cfg.finetune_lr, warmup=max(1, cfg.finetune_steps // 10), grad_clip=cfg.grad_clip,
                         seed=10_000 + seed, log_every=10)  # fmt: skip
    seconds = time.perf_counter() - t0
    evals = {method: evaluate(model, eval_ids, cfg.eval_lengths)}
    rec = record("finetune", name, seed, cfg, model, losses, seconds, evals, method=method, vocab_size=len(vocab))
    atomic_write_json(result_path(out, name, seed, method), rec)
    return f"done {name}+ft-{method} seed {seed}: {seconds:.0f} s, " + ppl_line(evals)


def run_all(cfg: LongContextConfig, seeds: Sequence[int], out, ckpt, *, names: Sequence[str] | None = None,
            finetunes: Sequence[tuple[str, str]] | None = None, jobs: int = 1, log=print) -> None:  # fmt: skip
    """Pre-train every model not yet done, then every fine-tune (:func:`runner.run_grid`: ``out`` and ``ckpt``
    locked, finished files skipped, ``jobs`` worker processes).  A model whose weights are gone is trained again
    before its fine-tunes; its finished result file stays until the new one replaces it."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))  # a model or seed named twice is trained once
    names = list(dict.fromkeys(models(cfg) if names is None else names))
    finetunes = [f for f in FINETUNES if f[0] in names] if finetunes is None else list(dict.fromkeys(finetunes))
    cells = [runner.Cell(result_path(out, n, s), pretrain, (n, s, cfg, out, ckpt)) for n in names for s in seeds]
    cells += [runner.Cell(result_path(out, n, s, m), finetune, (n, m, s, cfg, out, ckpt), phase=1)
              for n, m in finetunes for s in seeds]  # fmt: skip

    def weights_again(todo: list[runner.Cell]) -> list[runner.Cell]:
        """A fine-tune needs its pre-trained weights: the model is trained again if they are gone."""
        again = []
        for n, s in dict.fromkeys((c.args[0], c.args[2]) for c in todo if c.fn is finetune):
            cell = runner.Cell(result_path(out, n, s), pretrain, (n, s, cfg, out, ckpt))
            if cell not in todo and not ckpt_path(ckpt, cfg, n, s).exists():
                log(f"weights of {n} seed {s} missing in {ckpt}: training it again")
                again.append(cell)
        return again

    runner.run_grid(cells, out=out, ckpt=ckpt, schema=RECORDS, config=asdict(cfg), jobs=jobs, log=log,
                    also=weights_again)


# -- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.long_context", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", default="all", help="'all' or comma-separated names from " + ", ".join(models(COURSE)))
    p.add_argument("--no-finetune", action="store_true", help="pre-train and evaluate zero-shot only")
    p.add_argument("--out", default=None, help="folder for the result files (default runs/longctx-PROFILE; the "
                                               "committed results are never the default)")
    p.add_argument("--ckpt", default="runs/longctx", help="where pre-trained weights are kept for the fine-tunes")
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes)")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = runner.parse_selection(p, a, list(models(cfg)))
    out = a.out or f"runs/longctx-{a.profile}"
    return runner.run_command(p, out, a.ckpt, lambda: run_all(cfg, seeds, out, a.ckpt, names=names,
                                                              finetunes=[] if a.no_finetune else None, jobs=a.jobs))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["LongContextConfig", "PROFILES", "METHODS", "scalings", "models", "run_all"]  # records: charlm.load_results
