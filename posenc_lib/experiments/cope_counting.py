"""Counting words instead of tokens: CoPE against RoPE, ALiBi and no positions on a small recall task.

The experiment behind the last section of notebooks/11_beyond_the_classics.ipynb, a scaled-down task in
the spirit of Golovneva, Wang, Weston & Sukhbaatar 2024 ("Contextual Position Encoding: Learning to Count
What's Important", arXiv:2405.18719), whose selective-copy and counting tasks need positions counted in
units other than tokens.

**The task.**  A sequence is words of random letters, each word preceded by a separator, and ends with a
question token ``Q_k``: "what was the first letter of the k-th word back?"::

    | c a | f | h b d | e e Q2    ->  h      (words back: "e e" is 1, "h b d" is 2)

Words have 1 to ``max_word_len`` letters, so the k-th word back starts anywhere from ``2k - 1`` to
``k * (max_word_len + 1) - 1`` tokens before the question: a scheme that measures distance in tokens has to
count the separators in between some other way, while CoPE's gates can fire on separators only and make the
position of every key "the number of words back" (its ``p_ij``, lesson 11).  Two test sets: words of the
training lengths (``in_range``) and words longer than any seen in training (``long_words``,
``max_word_len + 1 .. 2 * max_word_len`` letters), where the token distances are new but the word counts
are not.  The model is :class:`~posenc_lib.models.causal_lm.CausalLM`; only the answer token is trained
(cross-entropy at the question), and the score is exact-match accuracy of the answer, per ``k``.

Each (model, seed) writes one JSON file into ``--out`` as soon as it finishes (temporary file + rename);
``config.json`` records the configuration; once the folder holds every model it has for every seed it has,
``results.json`` gathers the records and a per-model summary (what the lesson reads).  The same command
run again resumes (posenc_lib/experiments/runner.py): finished files are skipped, and a folder made with
another configuration is refused with the profile that made it.

Command line::

    python -m posenc_lib.experiments.cope_counting --profile smoke --out runs/cope-counting-smoke
    python -m posenc_lib.experiments.cope_counting --profile course --time-updates 20   # time it first
    python -m posenc_lib.experiments.cope_counting --profile course --seeds 0,1,2 --out results/cope_counting --jobs 2

Cost of the ``course`` profile (4 models x 3 seeds, 4000 updates each), timed with ``--time-updates 50`` under
``nice`` on 2 cores that a training run kept busy (one thread per model): 14.5-18.9 ms of CPU per update for CoPE,
11.9-15.1 for RoPE, 10.0-13.7 for ALiBi, 10.5-13.5 without positions (the higher figures at a load average near
5), 0.3-1.4 s per evaluation: 10-13 CPU minutes for the 12 runs, about 5-6 minutes of wall time with ``--jobs 2``
on two free cores.  The committed course run took 12.2 CPU minutes of training (74-77 s per CoPE model, 60 s for
RoPE, 54-56 s for ALiBi and none; ``train_cpu_seconds`` in each result file).  ``smoke``: about a second per model.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..models.causal_lm import CausalLM
from ..checks import check_positive_int, unique_choices
from ..cli import CliParser, timing_command
from ..files import atomic_write_json, read_json
from ..seeds import set_seed
from . import runner
from .charlm import lr_at

SCHEMA = "posenc.cope_counting/1"
#: what a per-model result file holds
RECORDS = runner.Schema(SCHEMA, ("schema", "model", "seed", "config", "eval"))
#: token ids: padding, the separator, then the questions Q_1 .. Q_max_k, then the letters
PAD, SEP, FIRST_QUESTION = 0, 1, 2
#: the models: name -> (registry name, options for CausalLM)
MODELS: dict[str, tuple[str, dict]] = {
    "cope": ("cope", {"max_pos": 16}),
    "rope": ("rope", {"interleaved": False}),
    "alibi": ("alibi", {}),
    "none": ("none", {}),
}
#: the two test sets
SPLITS = ("in_range", "long_words")


# -- configuration --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopeCountingConfig:
    """Everything that defines a run; the same for every model and seed."""

    name: str = "course"
    # -- the task ----------------------------------------------------------------------------------
    letters: int = 16  # alphabet size (chance level 1 / letters)
    max_k: int = 4  # questions "the k-th word back" for k = 1 .. max_k
    max_words: int = 8  # words per sequence: max_k .. max_words
    max_word_len: int = 4  # letters per word in training: 1 .. max_word_len
    # -- the model -------------------------------------------------------------------------------
    d_model: int = 64
    n_heads: int = 4
    num_layers: int = 2
    dim_feedforward: int = 128
    # -- training ---------------------------------------------------------------------------------
    steps: int = 4000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 100
    grad_clip: float = 1.0
    # -- evaluation -------------------------------------------------------------------------------
    eval_examples: int = 1000  # per test set, the same for every model
    curve_every: int = 500  # in-range accuracy every this many updates (the learning curve; part of train time)
    eval_seed: int = 12345
    threads: int = 1

    def __post_init__(self):
        for f in fields(self):
            if f.name not in ("name", "lr", "grad_clip", "eval_seed"):
                check_positive_int(f.name, getattr(self, f.name))
        if self.max_words < self.max_k:
            raise ValueError(f"max_words={self.max_words} must be at least max_k={self.max_k} (the k-th word back "
                             "must exist)")  # fmt: skip
        if self.letters < 2:
            raise ValueError(f"letters must be at least 2, got {self.letters}")

    @property
    def vocab_size(self) -> int:
        return FIRST_QUESTION + self.max_k + self.letters

    def word_lengths(self, split: str) -> tuple[int, int]:
        """The smallest and largest word length of ``split`` (training uses ``in_range``)."""
        if split not in SPLITS:
            raise ValueError(f"unknown test set {split!r}; valid choices: {', '.join(SPLITS)}")
        return (1, self.max_word_len) if split == "in_range" else (self.max_word_len + 1, 2 * self.max_word_len)


#: ``course``: the lesson's numbers (sized for 4 models x 3 seeds on 2 CPU cores; see results/README.md)
COURSE = CopeCountingConfig()
#: ``smoke``: seconds per model, for tests and CI; learns little
SMOKE = CopeCountingConfig(name="smoke", letters=6, max_k=2, max_words=3, max_word_len=2, d_model=16, n_heads=2,
                           num_layers=1, dim_feedforward=32, steps=20, batch_size=8, warmup=5,
                           eval_examples=64, curve_every=10)  # fmt: skip
PROFILES = {"course": COURSE, "smoke": SMOKE}


# -- the task -------------------------------------------------------------------------------------
def letter_id(cfg: CopeCountingConfig, i: int) -> int:
    """The token id of letter ``i`` (``0 .. letters - 1``)."""
    return FIRST_QUESTION + cfg.max_k + i


def question_id(k: int) -> int:
    """The token id of the question "the k-th word back" (``k >= 1``)."""
    return FIRST_QUESTION + k - 1


def make_batch(cfg: CopeCountingConfig, batch: int, g: torch.Generator, split: str = "in_range"):
    """``(tokens, lengths, targets, ks)``: ``batch`` examples of the task.

    ``tokens (batch, T)`` long, right-padded with ``PAD``; each row is ``SEP w_1 SEP w_2 ... SEP w_n Q_k``
    with ``n`` in ``max_k .. max_words`` words, ``k`` in ``1 .. max_k`` and word lengths from
    :meth:`CopeCountingConfig.word_lengths`; ``lengths (batch,)`` the unpadded lengths (the question is at
    ``lengths - 1``); ``targets (batch,)`` the first letter of word ``n - k + 1``; ``ks (batch,)``.
    """
    lo, hi = cfg.word_lengths(split)
    ks = torch.randint(1, cfg.max_k + 1, (batch,), generator=g)
    rows, targets = [], []
    for k in ks.tolist():
        n = int(torch.randint(cfg.max_k, cfg.max_words + 1, (1,), generator=g))
        sizes = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
        letters = (torch.randint(0, cfg.letters, (sum(sizes),), generator=g) + letter_id(cfg, 0)).tolist()
        row, at = [], 0
        for size in sizes:
            row += [SEP] + letters[at : at + size]
            at += size
        targets.append(row[len(row) - sum(sizes[n - k :]) - (k - 1)])  # first letter of word n - k + 1
        rows.append(row + [question_id(k)])
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.full((batch, int(lengths.max())), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return tokens, lengths, torch.tensor(targets), ks


def answer_logits(model: CausalLM, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(batch, vocab)`` logits at each row's question token (padding is after it: a causal model never sees it)."""
    logits = model(tokens)
    return logits[torch.arange(tokens.shape[0]), lengths - 1]


def make_model(name: str, cfg: CopeCountingConfig) -> CausalLM:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid choices: {', '.join(MODELS)}")
    pe, options = MODELS[name]
    return CausalLM(cfg.vocab_size, pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
                    dim_feedforward=cfg.dim_feedforward, **options)  # fmt: skip


# -- training and evaluation ----------------------------------------------------------------------
def train_steps(model: CausalLM, cfg: CopeCountingConfig, steps: int, seed: int, log_every: int = 100,
                warmup: int | None = None, curve_every: int = 0) -> tuple[list[float], list[list]]:  # fmt: skip
    """Train on fresh batches (a generator seeded with ``seed``).  Returns the mean loss of every ``log_every``
    updates, and with ``curve_every`` the learning curve: ``[update, in_range accuracy]`` every ``curve_every``
    updates (the in-range test set; training resumes in train mode)."""
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    warmup = cfg.warmup if warmup is None else warmup
    model.train()
    losses, curve, window = [], [], torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, cfg.lr, warmup)
        tokens, lengths, targets, _ = make_batch(cfg, cfg.batch_size, g)
        loss = F.cross_entropy(answer_logits(model, tokens, lengths), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window = window + loss.detach()
        if (step + 1) % log_every == 0 or step == steps - 1:
            losses.append(round(float(window) / ((step % log_every) + 1), 5))  # read only where it is logged
            window = torch.zeros(())
        if curve_every and ((step + 1) % curve_every == 0 or step == steps - 1):
            curve.append([step + 1, evaluate(model, cfg, splits=("in_range",))["in_range"]["accuracy"]])
            model.train()
    model.eval()
    return losses, curve


def eval_set(cfg: CopeCountingConfig, split: str):
    """The fixed test set of ``split`` (seeded by ``eval_seed``; the same for every model and seed)."""
    g = torch.Generator().manual_seed(cfg.eval_seed + SPLITS.index(split))
    return make_batch(cfg, cfg.eval_examples, g, split)


@torch.no_grad()
def evaluate(model: CausalLM, cfg: CopeCountingConfig, chunk: int = 250,
             splits: Sequence[str] = SPLITS) -> dict[str, dict]:  # fmt: skip
    """Per test set: exact-match accuracy of the answer, overall and per ``k`` (``by_k[k - 1]``)."""
    model.eval()
    out = {}
    for split in splits:
        tokens, lengths, targets, ks = eval_set(cfg, split)
        right = torch.cat([answer_logits(model, tokens[i : i + chunk], lengths[i : i + chunk]).argmax(-1)
                           == targets[i : i + chunk] for i in range(0, len(targets), chunk)])  # fmt: skip
        by_k = [round(float(right[ks == k].float().mean()), 4) if (ks == k).any() else None
                for k in range(1, cfg.max_k + 1)]  # fmt: skip
        out[split] = {"accuracy": round(float(right.float().mean()), 4), "by_k": by_k, "examples": len(targets)}
    return out


# -- the jobs -------------------------------------------------------------------------------------
def result_path(out, name: str, seed: int) -> Path:
    return Path(out) / f"{name}_seed{seed}.json"


def config_record(cfg: CopeCountingConfig) -> dict:
    return json.loads(json.dumps(asdict(cfg)))


def train_one(name: str, seed: int, cfg: CopeCountingConfig, out) -> str:
    """Train one model, evaluate it, write its result file (atomically)."""
    torch.set_num_threads(cfg.threads)
    set_seed(seed)
    model = make_model(name, cfg)
    w0, c0 = time.perf_counter(), time.process_time()
    losses, curve = train_steps(model, cfg, cfg.steps, seed, curve_every=cfg.curve_every)
    seconds, cpu = time.perf_counter() - w0, time.process_time() - c0
    evals = evaluate(model, cfg)
    rec = {"schema": SCHEMA, "model": name, "pe": MODELS[name][0], "options": MODELS[name][1], "seed": seed,
           "profile": cfg.name, "config": config_record(cfg),
           "num_parameters": sum(p.numel() for p in model.parameters()),
           "train_loss": losses, "curve": curve, "train_seconds": round(seconds, 1),
           "train_cpu_seconds": round(cpu, 1), "eval": evals, "torch": torch.__version__}  # fmt: skip
    atomic_write_json(result_path(out, name, seed), rec)
    return (f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, accuracy "
            + ", ".join(f"{s} {evals[s]['accuracy']:.3f}" for s in SPLITS))  # fmt: skip


def run_all(cfg: CopeCountingConfig, seeds: Sequence[int], out, *, names: Sequence[str] | None = None, jobs: int = 1,
            log=print) -> Path | None:  # fmt: skip
    """Train every (model, seed) not yet in ``out`` (:func:`runner.run_grid`); ``jobs`` worker processes.  ``out``
    is locked while this runs; a folder whose ``config.json`` or result files were made with another configuration
    is refused; Ctrl-C stops every worker at once (finished files are kept).  Returns the path of
    ``results.json``, written once the folder holds every model it has for every seed it has (None, and no
    summary, while some are missing)."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    names = unique_choices("model", MODELS if names is None else names, MODELS)
    cells = [runner.Cell(result_path(out, n, s), train_one, (n, s, cfg, out)) for n in names for s in seeds]
    profiles = {n: asdict(c) for n, c in PROFILES.items()}

    def record_config(todo: list[runner.Cell]) -> list[runner.Cell]:  # every result file checked first
        path = Path(out) / "config.json"
        if path.exists():
            runner.same_configuration(path, read_json(path), asdict(cfg), profiles=profiles)
        atomic_write_json(path, config_record(cfg))
        return []

    runner.run_grid(cells, out=out, schema=RECORDS, config=asdict(cfg), profiles=profiles, jobs=jobs, log=log,
                    also=record_config)
    return write_summary(out)


# -- reading results ------------------------------------------------------------------------------
def load_results(out) -> list[dict]:
    """Every per-model result record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def summarize(records: Sequence[dict]) -> dict[str, dict]:
    """Model -> seeds, and per test set the mean, min and max accuracy over seeds, and the mean per ``k``."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["model"] for r in records):
        recs = sorted((r for r in records if r["model"] == name), key=lambda r: r["seed"])
        row: dict[str, Any] = {"seeds": [r["seed"] for r in recs]}
        for split in SPLITS:
            acc = [r["eval"][split]["accuracy"] for r in recs]
            by_k = [[r["eval"][split]["by_k"][i] for r in recs] for i in range(len(recs[0]["eval"][split]["by_k"]))]
            row[split] = {"mean": round(sum(acc) / len(acc), 4), "min": min(acc), "max": max(acc),
                          "by_k": [round(sum(v) / len(v), 4) if None not in v else None for v in by_k]}  # fmt: skip
        out[name] = row
    return out


def write_summary(out) -> Path | None:
    """``out/results.json`` (every record, their config and :func:`summarize`) when every model that has a
    file has one per seed that any model has; None (and nothing written) while some are missing."""
    records = load_results(out)
    if not records:
        return None
    names = sorted({r["model"] for r in records})
    seeds = sorted({r["seed"] for r in records})
    if len(records) != len(names) * len(seeds):
        return None
    path = Path(out) / "results.json"
    atomic_write_json(path, {"schema": SCHEMA, "profile": records[0]["profile"], "config": records[0]["config"],
                             "models": names, "seeds": seeds, "summary": summarize(records),
                             "records": records})  # fmt: skip
    return path


def read_results(path) -> dict:
    """``results.json`` as written by :func:`write_summary`, checked."""
    data = read_json(path)
    missing = {"schema", "profile", "config", "summary", "records"} - set(data)
    if missing or data["schema"] != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} summary (missing {sorted(missing)})")
    return data


# -- timing ---------------------------------------------------------------------------------------
def time_updates(cfg: CopeCountingConfig, updates: int = 20, warmup: int = 3, names: Sequence[str] | None = None,
                 log=print) -> dict[str, Any]:  # fmt: skip
    """CPU and wall seconds per training update of each model (one thread, as in the run) and of one
    evaluation; the projected cost of ``names`` x 3 seeds: updates, the final evaluation and the learning
    curve's (the in-range test set only, half an evaluation each) (:func:`runner.time_updates`)."""
    torch.set_num_threads(cfg.threads)
    return runner.time_updates(
        list(MODELS if names is None else names), lambda name: make_model(name, cfg),
        lambda model, n, seed: train_steps(model, cfg, n, seed=seed, warmup=1),
        lambda name, model: evaluate(model, cfg), updates=updates, warmup=warmup, steps=cfg.steps,
        threads=cfg.threads, profile=cfg.name, measures=1 + math.ceil(cfg.steps / cfg.curve_every) / len(SPLITS),
        log=log)  # fmt: skip


# -- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.cope_counting", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", "--pe", dest="models", default="all",
                   help="'all' or comma-separated names from " + ", ".join(MODELS))  # fmt: skip
    p.add_argument("--out", default=None, help="folder for the result files (default runs/cope-counting-PROFILE; "
                                               "the committed results are never the default)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes)")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    p.add_argument("--time-updates", type=int, default=0, metavar="N",
                   help="time N updates and one evaluation per model, print the projected cost, train nothing")
    p.add_argument("--timing-out", default=None, metavar="FILE",
                   help="with --time-updates: also write the timings here")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="with --timing-out: replace an existing file")
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = runner.parse_selection(p, a, list(MODELS))
    code = timing_command(p, a, lambda n: time_updates(cfg, n, names=names), record_load=False)
    if code is not None:
        return code
    out = a.out or f"runs/cope-counting-{a.profile}"
    return runner.run_command(p, out, None, lambda: run_all(cfg, seeds, out, names=names, jobs=a.jobs),
                              done=lambda summary: f" (summary: {summary})" if summary else "")

if __name__ == "__main__":
    sys.exit(main())


__all__ = ["CopeCountingConfig", "COURSE", "SMOKE", "PROFILES", "MODELS", "SPLITS", "make_batch", "make_model",
           "train_steps", "evaluate", "run_all", "load_results", "summarize", "write_summary", "read_results",
           "time_updates"]  # fmt: skip
