"""Length extrapolation: train on short sequences, test on long ones, for every scheme.

The experiment behind notebooks/11_length_extrapolation.ipynb.  The question
comes from Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with
Linear Biases Enables Input Length Extrapolation" (ALiBi, arXiv:2108.12409)
and Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length
Generalization in Transformers" (arXiv:2305.19466): does a model trained on
sequences of at most ``L`` tokens still work at ``2L``, ``4L``?

The task (``reverse``, default; ``copy`` is the easier variant)::

    source  a7 a2 a2 a9 a0            (n random symbols, n in [train_min_len, train_max_len])
    target  a0 a9 a2 a2 a7 <eos>      (the same symbols, reversed, then end-of-sequence)

Why it isolates position: the output is a permutation of the input, and the
permutation depends on nothing but positions (target token ``t`` is source
token ``n - 1 - t``).  Symbols are uniform and independent, so there is no
language prior to lean on; the vocabulary and the mapping are trivial.  What
has to generalise to unseen lengths is exactly the model's sense of "where":
which source position to read at output step ``t``, and when to stop.

Metrics per test length: *exact match* (the whole output, end token included,
is right) and *per-token accuracy* (fraction of the ``n`` target positions
predicted right; a short output counts its missing tokens as wrong).  A learned
absolute table sized to the training length has no row for later positions:
the model raises ``ValueError`` there, which is recorded as accuracy 0 with
``representable: false`` -- a failure shown, not hidden.

Results: one JSON file per (scheme, seed), written atomically as soon as that
model finishes; a rerun skips finished files, so a long run can resume.

Command line::

    python -m posenc_lib.extrapolation --profile smoke
    python -m posenc_lib.extrapolation --profile course --pe all --seeds 0,1,2 --out results/extrapolation --jobs 2
"""
from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from .decoding import greedy_decode
from .model import Seq2SeqTransformer, build_model
from .schemes import PE_TYPES, canonical_pe
from .utils import (
    CliParser, atomic_write_json, check_choice, check_divides, check_float_range, check_int_range,
    check_positive_int, set_seed,
)

PAD, BOS, EOS = 0, 1, 2
#: extra runs beside PE_TYPES: name -> (scheme, options).  A symmetric ALiBi encoder cannot tell a
#: sequence from its reversal (see posenc_lib/alibi.py), which decides the reversal task by itself;
#: the split variant shows what ALiBi does once it knows left from right.
VARIANTS: dict[str, tuple[str, dict]] = {"alibi-split": ("alibi", {"bidirectional": "split"})}
RUN_ORDER: tuple[str, ...] = PE_TYPES + tuple(VARIANTS)


def run_name(pe: str) -> str:
    """A canonical scheme name, or a name from :data:`VARIANTS`."""
    if isinstance(pe, str) and pe.strip().lower() in VARIANTS:
        return pe.strip().lower()
    return canonical_pe(pe)
#: id of the first symbol; symbols are ``FIRST_SYMBOL .. FIRST_SYMBOL + n_symbols - 1``
FIRST_SYMBOL = 3
TASKS = ("reverse", "copy")
SCHEMA = "posenc.extrapolation/1"


@dataclass(frozen=True)
class ExtrapolationConfig:
    """Everything that defines one run; the same for every scheme and seed."""

    name: str = "course"
    # -- the task -----------------------------------------------------------------------------
    task: str = "reverse"  # "reverse" or "copy"
    n_symbols: int = 16  # alphabet size (plus PAD, BOS, EOS)
    train_min_len: int = 2  # training lengths are drawn uniformly from [train_min_len, train_max_len]
    train_max_len: int = 16
    test_lengths: tuple[int, ...] = (4, 8, 12, 16, 20, 24, 32, 48, 64)  # up to 4x train_max_len
    # -- the model (small: every scheme x seed must fit a CPU budget) -------------------------
    d_model: int = 64
    n_heads: int = 4
    num_layers: int = 2  # encoder layers; the decoder has as many
    dim_feedforward: int = 256
    dropout: float = 0.0  # fresh data every step: nothing to regularise against
    # -- training: the same budget (updates x batch) for every scheme -------------------------
    steps: int = 1200
    batch_size: int = 32  # sequences per update (many small updates learn faster on a CPU)
    lr: float = 2e-3  # Adam peak learning rate; linear warm-up, then cosine decay to 10%
    warmup: int = 100
    grad_clip: float = 1.0
    # -- evaluation ---------------------------------------------------------------------------
    eval_examples: int = 200  # test sequences per length (fixed, the same for every model)
    eval_batch_size: int = 200
    eval_seed: int = 12345  # the test sets depend on this only, never on the training seed
    threads: int = 1  # torch threads per model while it trains (see run_one); use --jobs for more cores

    def __post_init__(self):
        """Refuse a bad field before anything runs, naming the field and its allowed range."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        check_choice("task", self.task, TASKS)
        for f in ("n_symbols", "train_min_len", "train_max_len", "d_model", "n_heads", "num_layers",
                  "dim_feedforward", "steps", "batch_size", "eval_examples", "eval_batch_size", "threads"):  # fmt: skip
            check_positive_int(f, getattr(self, f))
        if self.train_min_len > self.train_max_len:
            raise ValueError(
                f"train_min_len={self.train_min_len} > train_max_len={self.train_max_len}: "
                f"train_min_len must lie in [1, train_max_len]"
            )
        if isinstance(self.test_lengths, (str, bytes)) or not isinstance(self.test_lengths, Iterable):
            raise TypeError(f"test_lengths must be a tuple of positive integers, got {self.test_lengths!r}")
        lengths = tuple(self.test_lengths)
        if not lengths:
            raise ValueError("test_lengths must name at least one length")
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"test_lengths: every test length must be a positive integer, got {n!r}")
        object.__setattr__(self, "test_lengths", lengths)  # a list given by hand becomes the tuple stored
        head_dim = check_divides(self.d_model, self.n_heads)
        if self.d_model % 2 or head_dim % 2:  # sinusoidal pairs d_model, rope pairs each head's dimensions
            raise ValueError(
                f"d_model={self.d_model} and d_model / n_heads={head_dim} must both be even "
                "(sin/cos and rotation pairs), e.g. d_model=64 with n_heads=4"
            )
        check_float_range("dropout", self.dropout, 0.0, 1.0, high_open=True)
        check_float_range("lr", self.lr, 0.0, low_open=True)
        check_int_range("warmup", self.warmup, 0)
        check_float_range("grad_clip", self.grad_clip, 0.0, low_open=True)
        check_int_range("eval_seed", self.eval_seed, 0, 2**53)

    @property
    def vocab_size(self) -> int:
        return FIRST_SYMBOL + self.n_symbols

    @property
    def learned_max_len(self) -> int:
        """Rows of the learned table: the decoder sees BOS + ``train_max_len`` tokens."""
        return self.train_max_len + 1


#: ``smoke``: a few seconds of CPU per model, for CI and for the notebook when no results are committed.
#: Lengths 2..6, tested to 24; one small layer each side; learns the task only partly.
SMOKE = ExtrapolationConfig(
    name="smoke", train_max_len=6, test_lengths=(3, 6, 9, 12, 18, 24), d_model=32, n_heads=4, num_layers=1,
    dim_feedforward=64, steps=300, batch_size=32, lr=5e-3, warmup=20, eval_examples=50, eval_batch_size=50,
)  # fmt: skip
#: ``course``: all 9 schemes x 3 seeds on 2 CPU cores (``--jobs 2``); the lesson's numbers come from it.
#: Sized by measurement: a rope model at these settings reached loss 0.05 after 1000 updates
#: (exact match 0.96 at length 8, 0.70 at 16), at about 55 ms of CPU time per update on one
#: thread; 1200 updates + evaluation ~ 70 s per model, 27 models / 2 jobs ~ 16 minutes.
COURSE = ExtrapolationConfig(name="course")
PROFILES: dict[str, ExtrapolationConfig] = {"smoke": SMOKE, "course": COURSE}


# -- the task -------------------------------------------------------------------------------------
def target_of(task: str, symbols: torch.Tensor) -> torch.Tensor:
    """The target symbols for one source ``symbols (n,)``: reversed or copied."""
    check_choice("task", task, TASKS)
    return symbols.flip(0) if task == "reverse" else symbols.clone()


def make_batch(cfg: ExtrapolationConfig, lengths: Sequence[int], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A padded batch with one example per entry of ``lengths``.

    Returns ``src (B, S)``, ``tgt_in (B, T)`` = BOS + target, ``tgt_out (B, T)`` =
    target + EOS, the padding masks ``src_pad (B, S)``, ``tgt_pad (B, T)`` (True at PAD)
    and ``lengths (B,)``; ``S = max(lengths)``, ``T = S + 1``.
    """
    lengths = [check_positive_int("length", n) for n in lengths]
    if not lengths:
        raise ValueError("lengths must not be empty")
    b, s = len(lengths), max(lengths)
    src = torch.full((b, s), PAD, dtype=torch.long)
    tgt_in = torch.full((b, s + 1), PAD, dtype=torch.long)
    tgt_out = torch.full((b, s + 1), PAD, dtype=torch.long)
    sym = torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + cfg.n_symbols, (b, s), generator=generator)
    for i, n in enumerate(lengths):
        x = sym[i, :n]
        y = target_of(cfg.task, x)
        src[i, :n] = x
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : n + 1] = y
        tgt_out[i, :n] = y
        tgt_out[i, n] = EOS
    return {
        "src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "src_pad": src == PAD,
        "tgt_pad": tgt_in == PAD, "lengths": torch.tensor(lengths),
    }  # fmt: skip


def train_lengths(cfg: ExtrapolationConfig, batch_size: int, generator: torch.Generator) -> list[int]:
    return torch.randint(cfg.train_min_len, cfg.train_max_len + 1, (batch_size,), generator=generator).tolist()


def test_batch(cfg: ExtrapolationConfig, length: int) -> dict[str, torch.Tensor]:
    """The fixed test set for one length (depends on ``cfg.eval_seed`` and ``length`` only)."""
    g = torch.Generator().manual_seed(cfg.eval_seed * 1000 + length)
    return make_batch(cfg, [length] * cfg.eval_examples, g)


# -- model, training, evaluation ------------------------------------------------------------------
@contextmanager
def num_threads(n: int):
    """Run the block with ``n`` torch threads, then restore the previous number.

    Models this small run best on one thread: on a busy 2-core machine two intra-op
    threads made the same training run (identical losses) about 12x slower in CPU time.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_model(pe: str, cfg: ExtrapolationConfig) -> Seq2SeqTransformer:
    """The model for scheme ``pe``; a learned table gets exactly ``cfg.learned_max_len`` rows."""
    name = run_name(pe)
    pe, extra = VARIANTS.get(name, (name, {}))
    extra = dict(extra)
    if pe == "learned":
        extra["max_len"] = cfg.learned_max_len
    return build_model(
        pe, cfg.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
        dim_feedforward=cfg.dim_feedforward, dropout=cfg.dropout, pad_id=PAD, **extra,
    )  # fmt: skip


def lr_at(step: int, cfg: ExtrapolationConfig) -> float:
    """Linear warm-up to ``cfg.lr``, then cosine decay to ``0.1 * cfg.lr`` at the last step."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train(pe: str, cfg: ExtrapolationConfig, seed: int, *, progress: bool = True, log_every: int = 50):
    """Train one model; returns ``(model, losses)`` with the mean loss of every ``log_every`` steps."""
    from tqdm.auto import tqdm

    set_seed(seed)
    model = make_model(pe, cfg)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(seed)
    model.train()
    losses: list[float] = []
    bar = tqdm(range(cfg.steps), desc=f"{run_name(pe)} seed {seed}", disable=not progress, leave=False)
    with num_threads(cfg.threads):
        _train_loop(model, opt, cfg, g, bar, losses, log_every)
    model.eval()
    return model, losses


def _train_loop(model, opt, cfg, g, bar, losses, log_every):
    window = []
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        b = make_batch(cfg, train_lengths(cfg, cfg.batch_size, g), g)
        loss = model.loss(b["src"], b["tgt_in"], b["tgt_out"], src_key_padding_mask=b["src_pad"],
                          tgt_key_padding_mask=b["tgt_pad"])  # fmt: skip
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        window.append(loss.item())
        if len(window) == log_every or step == cfg.steps - 1:
            losses.append(sum(window) / len(window))
            window = []
            bar.set_postfix(loss=f"{losses[-1]:.3f}")


def score(pred: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[float, float]:
    """Exact match and per-token accuracy of greedy outputs ``pred (B, <= T+1)`` (BOS first)."""
    out = pred[:, 1:]
    want = batch["tgt_out"]
    t = want.shape[1]
    if out.shape[1] < t:  # decoding stopped early: pad so missing tokens count as wrong
        out = torch.cat((out, torch.full((out.shape[0], t - out.shape[1]), PAD, dtype=out.dtype)), dim=1)
    out = out[:, :t]
    real = want != PAD  # the n symbols and the EOS
    symbols = real & (want != EOS)
    correct = out == want
    exact = (correct | ~real).all(dim=1).float().mean().item()
    token = ((correct & symbols).sum(1).float() / symbols.sum(1).clamp(min=1)).mean().item()
    return exact, token


@torch.no_grad()
def evaluate(model: Seq2SeqTransformer, cfg: ExtrapolationConfig, lengths: Iterable[int] | None = None) -> list[dict]:
    """Greedy-decode the fixed test set of every length; one row per length.

    A ``ValueError`` from a learned table (a position beyond its rows) is
    recorded as ``representable: False`` with both accuracies 0.
    """
    with num_threads(cfg.threads):
        return [_evaluate_length(model, cfg, n) for n in (lengths if lengths is not None else cfg.test_lengths)]


def _evaluate_length(model: Seq2SeqTransformer, cfg: ExtrapolationConfig, n: int) -> dict:
    batch = test_batch(cfg, n)
    exact = token = 0.0
    representable = True
    try:
        for i in range(0, cfg.eval_examples, cfg.eval_batch_size):
            part = {k: v[i : i + cfg.eval_batch_size] for k, v in batch.items()}
            pred = greedy_decode(model, part["src"], max_new_tokens=n + 1, bos_id=BOS, eos_id=EOS, use_cache=True)
            e, t = score(pred, part)
            k = part["src"].shape[0]
            exact += e * k
            token += t * k
        exact, token = exact / cfg.eval_examples, token / cfg.eval_examples
    except ValueError as err:
        if "beyond the learned table" not in str(err):
            raise
        exact = token = 0.0
        representable = False
    return {"length": n, "exact_match": round(exact, 6), "token_accuracy": round(token, 6),
            "representable": representable, "in_training_range": n <= cfg.train_max_len}  # fmt: skip


# -- results on disk ------------------------------------------------------------------------------
def result_path(out: str | Path, pe: str, seed: int) -> Path:
    return Path(out) / f"{run_name(pe)}_seed{seed}.json"


def run_one(pe: str, cfg: ExtrapolationConfig, seed: int, *, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate one (scheme, seed); returns the result record (see :data:`SCHEMA`)."""
    t0 = time.perf_counter()
    model, losses = train(pe, cfg, seed, progress=progress)
    t1 = time.perf_counter()
    rows = evaluate(model, cfg)
    t2 = time.perf_counter()
    return {
        "schema": SCHEMA,
        "pe": run_name(pe),
        "seed": seed,
        "profile": cfg.name,
        "config": asdict(cfg),
        "num_parameters": model.num_parameters(),
        "train": {"steps": cfg.steps, "loss_every_50_steps": [round(x, 5) for x in losses],
                  "final_loss": round(losses[-1], 5), "seconds": round(t1 - t0, 1)},  # fmt: skip
        "eval": rows,
        "eval_seconds": round(t2 - t1, 1),
        "torch": torch.__version__,
    }


def check_record(rec: dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``rec`` is a complete result record."""
    keys = {"schema", "pe", "seed", "profile", "config", "num_parameters", "train", "eval"}
    missing = sorted(keys - set(rec))
    if missing:
        raise ValueError(f"result record is missing keys {missing}")
    if rec["schema"] != SCHEMA:
        raise ValueError(f"unknown result schema {rec['schema']!r}; expected {SCHEMA!r}")
    for row in rec["eval"]:
        for k in ("length", "exact_match", "token_accuracy", "representable"):
            if k not in row:
                raise ValueError(f"eval row {row} is missing {k!r}")
        if not (0.0 <= row["exact_match"] <= 1.0 and 0.0 <= row["token_accuracy"] <= 1.0):
            raise ValueError(f"accuracies must lie in [0, 1], got {row}")


def _finish(pe: str, cfg: ExtrapolationConfig, seed: int, out: str | Path, progress: bool) -> str:
    """Train, evaluate and write one result file; returns a one-line report (also the worker of ``--jobs``)."""
    rec = run_one(pe, cfg, seed, progress=progress)
    check_record(rec)
    atomic_write_json(result_path(out, pe, seed), rec)
    acc = " ".join(f"{r['length']}:{r['exact_match']:.2f}" for r in rec["eval"])
    return (f"done {pe} seed {seed}: train {rec['train']['seconds']} s, eval {rec['eval_seconds']} s, "
            f"final loss {rec['train']['final_loss']:.3f}, exact match by length {acc}")  # fmt: skip


def pending(cfg: ExtrapolationConfig, pes: Sequence[str], seeds: Sequence[int], out: str | Path) -> list[tuple[str, int]]:
    """The (scheme, seed) pairs without a finished result in ``out``.

    A finished file counts only if it was made with the same configuration; a
    file from another configuration raises ``ValueError`` (use another ``out``).
    """
    todo = []
    want = json.loads(json.dumps(asdict(cfg)))
    for pe in (run_name(p) for p in pes):
        for seed in seeds:
            path = result_path(out, pe, seed)
            if path.exists():
                rec = json.loads(path.read_text())
                if rec.get("config") != want:
                    raise ValueError(
                        f"{path} was made with a different configuration (profile {rec.get('profile')!r}); "
                        f"delete it or pass another --out"
                    )
                continue
            todo.append((pe, seed))
    return todo


def run_all(cfg: ExtrapolationConfig, pes: Sequence[str], seeds: Sequence[int], out: str | Path, *,
            progress: bool = True, jobs: int = 1, log=print) -> list[Path]:  # fmt: skip
    """Run every (scheme, seed) not already finished in ``out``; returns the paths of all results.

    ``jobs > 1`` trains that many models at once in worker processes (each with
    ``cfg.threads`` torch threads: tiny models use one core per process better than
    two threads in one process); each worker writes its own file as it finishes.
    """
    jobs = check_positive_int("jobs", jobs)
    seeds = [int(s) for s in seeds]
    todo = pending(cfg, pes, seeds, out)
    done = len(pes) * len(seeds) - len(todo)
    if done:
        log(f"skipping {done} finished model(s) in {out}")
    if jobs == 1:
        for pe, seed in todo:
            log(_finish(pe, cfg, seed, out, progress))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from tqdm.auto import tqdm

        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_finish, pe, cfg, seed, out, False) for pe, seed in todo]
            for f in tqdm(as_completed(futures), total=len(futures), desc="models", disable=not progress):
                log(f.result())
    return [result_path(out, pe, s) for pe in (run_name(p) for p in pes) for s in seeds]


def load_results(out: str | Path) -> list[dict[str, Any]]:
    """Every result record in ``out`` (checked), sorted by the course's scheme order, then seed."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no results folder {out}")
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("*_seed*.json"))]
    for r in recs:
        check_record(r)
    return sorted(recs, key=lambda r: (RUN_ORDER.index(r["pe"]), r["seed"]))


def summarize(records: Sequence[dict[str, Any]], metric: str = "exact_match") -> dict[str, dict[str, list]]:
    """Per scheme: ``lengths``, ``mean``, ``min``, ``max`` over seeds, ``seeds`` and ``representable``."""
    check_choice("metric", metric, ("exact_match", "token_accuracy"))
    by_pe: dict[str, list] = {}
    for r in records:
        by_pe.setdefault(r["pe"], []).append(r)
    summary = {}
    for pe, recs in by_pe.items():
        lengths = [row["length"] for row in recs[0]["eval"]]
        vals = torch.tensor([[row[metric] for row in r["eval"]] for r in recs], dtype=torch.float64)
        summary[pe] = {
            "lengths": lengths, "mean": vals.mean(0).tolist(), "min": vals.min(0).values.tolist(),
            "max": vals.max(0).values.tolist(), "seeds": sorted(r["seed"] for r in recs),
            "representable": [all(r["eval"][i]["representable"] for r in recs) for i in range(len(lengths))],
        }  # fmt: skip
    return summary


def plot_accuracy_vs_length(ax, summary: dict[str, dict[str, list]], *, train_max_len: int, metric: str) -> None:
    """Mean over seeds (line) and min-max over seeds (band) for every scheme; the training range shaded."""
    import matplotlib.pyplot as plt

    colors = plt.get_cmap("viridis")(torch.linspace(0, 0.95, len(summary)).numpy())
    markers = "osD^vP*Xh<>"
    for k, ((pe, s), c) in enumerate(zip(summary.items(), colors)):
        ax.plot(s["lengths"], s["mean"], marker=markers[k % len(markers)], ms=4, color=c, label=pe,
                ls="-" if k % 2 == 0 else "--")  # fmt: skip
        ax.fill_between(s["lengths"], s["min"], s["max"], color=c, alpha=0.15, lw=0)
        cannot = [n for n, ok in zip(s["lengths"], s["representable"]) if not ok]
        if cannot:
            ax.scatter(cannot, [0.0] * len(cannot), marker="x", s=40, color="crimson", zorder=5,
                       label=f"{pe}: cannot represent")  # fmt: skip
    ax.axvspan(0, train_max_len, color="0.85", zorder=0, label="training lengths")
    ax.set_xlabel("test sequence length (symbols)")
    ax.set_ylabel(metric.replace("_", " ") + " (fraction)")
    ax.set_ylim(-0.03, 1.03)


# -- translation: BLEU by source length -----------------------------------------------------------
def bleu_by_source_length(hyps: Sequence[str], refs: Sequence[str], src_lengths: Sequence[int],
                          edges: Sequence[int], *, train_max_len: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Corpus BLEU and chrF per bucket of source length (tokens), e.g. for WMT14 test sets.

    Buckets are ``[edges[k], edges[k+1])``; the last is open-ended (``edges[-1]`` and
    above).  ``train_max_len`` (the longest source seen in training) marks which
    buckets lie wholly beyond the training lengths.  Empty buckets are left out.
    """
    from .evaluate import bleu_chrf

    if not len(hyps) == len(refs) == len(src_lengths):
        raise ValueError(f"hyps, refs and src_lengths differ in length: {len(hyps)}, {len(refs)}, {len(src_lengths)}")
    edges = [int(e) for e in edges]
    if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 0:
        raise ValueError(f"edges must be non-negative and strictly increasing, got {edges}")
    rows = []
    for k, lo in enumerate(edges):
        hi = edges[k + 1] if k + 1 < len(edges) else None
        idx = [i for i, n in enumerate(src_lengths) if n >= lo and (hi is None or n < hi)]
        if not idx:
            continue
        res = bleu_chrf([hyps[i] for i in idx], [refs[i] for i in idx])
        rows.append({
            "bucket": f"{lo}-{hi - 1}" if hi is not None else f"{lo}+", "min_len": lo, "max_len": hi - 1 if hi else None,
            "sentences": len(idx), "bleu": res["bleu"], "chrf": res["chrf"],
            "beyond_training": None if train_max_len is None else lo > train_max_len,
        })  # fmt: skip
    return rows


# -- command line ---------------------------------------------------------------------------------
def parse_list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list {text!r}")
    return items


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.extrapolation", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--pe", default="all", help="'all' or comma-separated names from " + ", ".join(RUN_ORDER))
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--out", default="results/extrapolation")
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes); default 1")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    try:
        pes = list(RUN_ORDER) if a.pe.strip().lower() == "all" else [run_name(x) for x in parse_list(a.pe, "--pe")]
    except (TypeError, ValueError) as err:
        p.error(f"--pe: {err}")
    try:
        seeds = []
        for s in parse_list(a.seeds, "--seeds"):
            try:
                seeds.append(int(s))
            except ValueError:
                raise ValueError(f"--seeds must be comma-separated integers, got {s!r}") from None
            if not 0 <= seeds[-1] < 2**32:
                raise ValueError(f"--seeds must lie in [0, 2**32 - 1], got {seeds[-1]}")
    except ValueError as err:
        p.error(str(err))
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file; give a folder for the result files")
    t0 = time.perf_counter()
    run_all(cfg, pes, seeds, a.out, progress=not a.no_progress, jobs=a.jobs)
    print(f"all done in {time.perf_counter() - t0:.0f} s; results in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
