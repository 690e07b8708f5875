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

import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..models.causal_lm import CausalLM
from ..utils import (INTERRUPTED, CliParser, FolderLock, atomic_torch_save, atomic_write_json, check_folder_path,
                     check_positive_int, interrupted_message, load_weights, parse_seed_list, read_json,
                     removed_if_left_empty, run_calls, set_seed, settings_diff)
from .wmt14.data import SHIPPED_DIR, find_file, read_lines

SCHEMA = "posenc.longctx/1"
UNK = 0  # id of characters outside the vocabulary


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


# -- data -----------------------------------------------------------------------------------------
def load_text(cfg: LongContextConfig, data_dir: str | Path = SHIPPED_DIR) -> tuple[str, str]:
    """``(train_text, eval_text)``: Europarl English lines joined by newlines (document order)."""
    lines = read_lines(find_file(data_dir, "train.en"))
    if len(lines) < cfg.eval_offset + 10:
        raise ValueError(f"train.en has {len(lines)} lines; eval_offset={cfg.eval_offset} needs more")
    train = "\n".join(lines[: min(cfg.train_lines, cfg.eval_offset)])
    ev = ""
    i = cfg.eval_offset
    while len(ev) < cfg.eval_chars and i < len(lines):
        ev += lines[i] + "\n"
        i += 1
    if len(ev) < cfg.eval_chars:
        raise ValueError(f"not enough text after line {cfg.eval_offset} for eval_chars={cfg.eval_chars}")
    return train, ev[: cfg.eval_chars]


class CharVocab:
    """Characters seen at least ``min_count`` times; id 0 is UNK."""

    def __init__(self, text: str, min_count: int):
        counts = Counter(text)
        self.chars = ["\0"] + sorted(c for c, n in counts.items() if n >= min_count)
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index.get(c, UNK) for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


def random_windows(ids: torch.Tensor, length: int, batch: int, g: torch.Generator) -> torch.Tensor:
    """``(batch, length + 1)`` random windows of the token stream (inputs and next-token targets)."""
    start = torch.randint(0, ids.numel() - length - 1, (batch,), generator=g)
    return torch.stack([ids[s : s + length + 1] for s in start.tolist()])


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


# -- training and evaluation ----------------------------------------------------------------------
def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def train_steps(model: CausalLM, ids: torch.Tensor, *, length: int, batch: int, steps: int, lr: float, warmup: int,
                grad_clip: float, seed: int, log_every: int = 50, at: Sequence[int] = (),
                on_update=None, windows=None) -> list[float]:  # fmt: skip
    """Train on random windows; returns the mean loss of every ``log_every`` updates.

    ``windows(step, g)``, when given, makes each update's ``(batch, length + 1)`` windows instead of
    :func:`random_windows` (``g``: the run's generator, seeded with ``seed``).

    ``on_update(u, model)`` is called in eval mode (no gradients) before training if ``0`` is in ``at`` and
    after update ``u`` for every other ``u`` in ``at``: a way to measure the model during training.  It must not
    draw from torch's global random generator; the training itself is then the same as without it."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    g = torch.Generator().manual_seed(seed)
    at = set(at)
    if at and on_update is None:
        raise ValueError("at= needs on_update=, the function to call at those updates")
    bad = sorted(u for u in at if not 0 <= u <= steps)
    if bad:
        raise ValueError(f"at= holds updates {bad} outside 0..{steps}")

    def visit(u: int) -> None:
        if u in at:
            model.eval()
            with torch.no_grad():
                on_update(u, model)
            model.train()

    model.train()
    visit(0)
    losses, window = [], torch.zeros(())
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, lr, warmup)
        loss = model.loss(random_windows(ids, length, batch, g) if windows is None else windows(step, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        window = window + loss.detach()
        if (step + 1) % log_every == 0 or step == steps - 1:
            n = (step % log_every) + 1
            losses.append(round(float(window) / n, 5))  # read from the device only here
            window = torch.zeros(())
        if step + 1 < steps:
            visit(step + 1)
    model.eval()
    if steps in at and steps:
        with torch.no_grad():
            on_update(steps, model)
    return losses


@torch.no_grad()
def evaluate(model: CausalLM, ids: torch.Tensor, lengths: Sequence[int], *, bins: int = 8,
             first: int | None = None) -> list[dict]:  # fmt: skip
    """Per length: mean NLL (nats/char) and perplexity over non-overlapping windows of ``ids``;
    the NLL in ``bins`` equal position bins; the mean attention entropy (nats) of every query row; with
    ``first``, also ``ppl_first``: the perplexity of the first ``first`` positions of the same windows."""
    model.eval()
    rows = []
    for n in lengths:
        k = (ids.numel() - 1) // n
        x = ids[: k * n].view(k, n)
        y = ids[1 : k * n + 1].view(k, n)
        nll = torch.zeros(n)
        ent = torch.zeros(())
        for i in range(0, k, 16):
            logits, weights = model(x[i : i + 16], need_weights=True)
            nll += F.cross_entropy(logits.transpose(1, 2), y[i : i + 16], reduction="none").sum(0)
            for w in weights:  # (batch, heads, n, n), rows sum to 1
                ent += -(w * w.clamp_min(1e-12).log()).sum(-1).mean(dim=(1, 2)).sum() / len(weights)
        nll, ent = nll / k, ent / k
        mean = float(nll.mean())
        rows.append({
            "length": n, "nll": round(mean, 5), "ppl": round(math.exp(mean), 4), "windows": k,
            "nll_by_position": [round(float(v), 4) for v in nll.view(bins, -1).mean(1)] if n % bins == 0 else None,
            "attention_entropy": round(float(ent), 4),
        })  # fmt: skip
        if first is not None:
            rows[-1]["ppl_first"] = round(math.exp(float(nll[:first].mean())), 4)
    return rows


# -- the jobs -------------------------------------------------------------------------------------
def result_path(out, name: str, seed: int, method: str | None = None) -> Path:
    stem = name if method is None else f"{name}+ft-{method}"
    return Path(out) / f"{stem}_seed{seed}.json"


def ckpt_path(ckpt, cfg: LongContextConfig, name: str, seed: int) -> Path:
    return Path(ckpt) / cfg.name / f"{name}_seed{seed}.pt"


_DATA: dict[tuple, Any] = {}


def data(cfg: LongContextConfig, data_dir=SHIPPED_DIR):
    """``(vocab, train_ids, eval_ids)``, cached per process."""
    key = (cfg.train_lines, cfg.eval_offset, cfg.eval_chars, cfg.min_char_count, str(data_dir))
    if key not in _DATA:
        train, ev = load_text(cfg, data_dir)
        vocab = CharVocab(train, cfg.min_char_count)
        _DATA[key] = (vocab, vocab.encode(train), vocab.encode(ev))
    return _DATA[key]


def _record(kind, name, seed, cfg, model, losses, seconds, evals, **extra) -> dict:
    return {"schema": SCHEMA, "kind": kind, "model": name, "seed": seed, "profile": cfg.name, "config": asdict(cfg),
            "num_parameters": sum(p.numel() for p in model.parameters()), "train_loss": losses,
            "train_seconds": round(seconds, 1), "eval": evals, "torch": torch.__version__, **extra}  # fmt: skip


def train_at_length(build, seed: int, cfg, *, at: Sequence[int] = (), on_update=None,
                    windows=None) -> tuple[list[str], torch.Tensor, torch.nn.Module, list[float], float]:
    """The pre-training every character-LM experiment shares: read the data of ``cfg``, seed, build the model
    (``build(vocab_size)``) and train it at ``cfg.train_len`` on ``cfg.threads`` threads.  Returns the vocabulary,
    the held-out ids, the model, the training losses and the training wall time (s, measurements at ``at``
    included; see :func:`train_steps` for ``at``, ``on_update`` and ``windows``)."""
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = data(cfg)
    set_seed(seed)
    model = build(len(vocab))
    t0 = time.perf_counter()
    losses = train_steps(model, train_ids, length=cfg.train_len, batch=cfg.batch_size, steps=cfg.steps, lr=cfg.lr,
                         warmup=cfg.warmup, grad_clip=cfg.grad_clip, seed=seed, at=at, on_update=on_update,
                         windows=windows)  # fmt: skip
    return vocab, eval_ids, model, losses, time.perf_counter() - t0


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
    rec = _record("pretrain", name, seed, cfg, model, losses, seconds, evals, vocab_size=len(vocab))
    atomic_write_json(result_path(out, name, seed), rec)
    return f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, " + _ppl_line(evals)


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
    rec = _record("finetune", name, seed, cfg, model, losses, seconds, evals, method=method, vocab_size=len(vocab))
    atomic_write_json(result_path(out, name, seed, method), rec)
    return f"done {name}+ft-{method} seed {seed}: {seconds:.0f} s, " + _ppl_line(evals)


def _ppl_line(evals: dict) -> str:
    return "; ".join(f"{m}: " + " ".join(f"{r['length']}:{r['ppl']:.2f}" for r in rows) for m, rows in evals.items())


def finished(path: Path, cfg: LongContextConfig, **settings) -> bool:
    """True when ``path`` holds a finished record made with ``cfg`` (and the record fields ``settings``, e.g.
    ``trials=200``), False when it does not exist; a record made with other settings is a ``ValueError`` naming
    them, never taken for this run's.  Shared by long_context, long_context_scaled and sliding_window."""
    if not path.exists():
        return False
    rec = read_json(path)
    want = json.loads(json.dumps({**asdict(cfg), **settings}))  # the record's fields beside its config
    made = rec.get("config") if isinstance(rec, dict) else None
    made = {**made, **{k: rec.get(k) for k in settings}} if isinstance(made, dict) else made
    if made != want:
        raise ValueError(f"{path} was made with another configuration: {settings_diff(made, want)}; pass another "
                         "--out folder, or the settings it was made with")  # fmt: skip
    return True


def load_records(out, schema: str, fields: Sequence[str] = ()) -> list[dict]:
    """Every ``*_seed*.json`` record in the folder ``out``; one not of ``schema`` or without ``fields`` is a
    ``ValueError`` (a missing folder a ``FileNotFoundError``)."""
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"no results folder {out}")
    recs = [read_json(p) for p in sorted(out.glob("*_seed*.json"))]
    for path, r in zip(sorted(out.glob("*_seed*.json")), recs):
        missing = sorted(set(fields) - set(r))
        if missing or r.get("schema") != schema:
            raise ValueError(f"{path} is not a {schema} record (schema {r.get('schema')!r}, missing {missing})")
    return recs



def run_all(cfg: LongContextConfig, seeds: Sequence[int], out, ckpt, *, names: Sequence[str] | None = None,
            finetunes: Sequence[tuple[str, str]] | None = None, jobs: int = 1, log=print) -> None:  # fmt: skip
    """Pre-train every model not yet done, then every fine-tune; ``jobs`` worker processes.

    ``out`` and ``ckpt`` are locked while this runs; Ctrl-C stops every worker at once, and what
    finished is kept (a rerun skips it).  A model whose weights are gone is trained again before its
    fine-tunes; its finished result file stays until the new one replaces it.
    """
    jobs = check_positive_int("jobs", jobs)
    seeds = list(dict.fromkeys(int(s) for s in seeds))  # a model or seed named twice is trained once
    names = list(dict.fromkeys(models(cfg) if names is None else names))
    finetunes = [f for f in FINETUNES if f[0] in names] if finetunes is None else list(dict.fromkeys(finetunes))
    with FolderLock(out, what="--out folder", log=log), FolderLock(ckpt, what="--ckpt folder", log=log):
        _run_locked(cfg, seeds, out, ckpt, names=names, finetunes=finetunes, jobs=jobs, log=log)


def _run_locked(cfg: LongContextConfig, seeds, out, ckpt, *, names, finetunes, jobs, log) -> None:
    phase1 = [(pretrain, (n, s, cfg, out, ckpt)) for n in names for s in seeds if not finished(result_path(out, n, s), cfg)]
    phase2 = [(finetune, (n, m, s, cfg, out, ckpt)) for n, m in finetunes for s in seeds
              if not finished(result_path(out, n, s, m), cfg)]  # fmt: skip
    for n, _m in finetunes:  # a fine-tune needs its pre-trained weights: redo the model if they are gone
        for s in seeds:
            if finished(result_path(out, n, s), cfg) and not ckpt_path(ckpt, cfg, n, s).exists() and any(
                    a[:3] == (n, _m, s) for _, a in phase2):  # fmt: skip
                log(f"weights of {n} seed {s} missing in {ckpt}: training it again")
                # its result file stays until the new one replaces it (an interrupt keeps it)
                if (pretrain, (n, s, cfg, out, ckpt)) not in phase1:
                    phase1.append((pretrain, (n, s, cfg, out, ckpt)))
    skipped = len(names) * len(seeds) + len(finetunes) * len(seeds) - len(phase1) - len(phase2)
    if skipped:
        log(f"skipping {skipped} finished result(s) in {out}")
    for phase in (phase1, phase2):  # every pre-training before the fine-tunes that read its weights
        run_calls(phase, jobs, log)


# -- reading results ------------------------------------------------------------------------------
def load_results(out) -> list[dict]:
    """Every result record in ``out``, checked."""
    return load_records(out, SCHEMA, ("schema", "kind", "model", "seed", "config", "eval"))


def summarize(records: Sequence[dict], metric: str = "ppl") -> dict[tuple[str, str, str], dict]:
    """``(kind, model, method)`` -> lengths, mean, min, max over seeds, seeds."""
    groups: dict[tuple[str, str, str], list[list[float]]] = {}
    lengths: dict[tuple[str, str, str], list[int]] = {}
    seeds: dict[tuple[str, str, str], list[int]] = {}
    for r in records:
        for method, rows in r["eval"].items():
            key = (r["kind"], r["model"], method)
            groups.setdefault(key, []).append([row[metric] for row in rows])
            lengths[key] = [row["length"] for row in rows]
            seeds.setdefault(key, []).append(r["seed"])
    out = {}
    for key, vals in groups.items():
        t = torch.tensor(vals, dtype=torch.float64)
        out[key] = {"lengths": lengths[key], "mean": t.mean(0).tolist(), "min": t.min(0).values.tolist(),
                    "max": t.max(0).values.tolist(), "seeds": sorted(seeds[key])}  # fmt: skip
    return out


# -- command line ---------------------------------------------------------------------------------
def parse_seeds(p, text: str) -> list[int]:
    """``--seeds``, checked: a bad value ends the command through ``p.error`` with one line naming it."""
    try:
        return parse_seed_list(text)
    except ValueError as err:
        p.error(str(err))


def run_command(p, out, ckpt, work, again: str) -> int:
    """The end of a character-LM command line: refuse an ``--out`` or ``--ckpt`` that is a file, run ``work()``,
    and turn its errors and Ctrl-C into one line (exit 2, or the interrupted code saying ``again``)."""
    for flag, folder in (("--out", out), ("--ckpt", ckpt)):
        if Path(folder).exists() and not Path(folder).is_dir():
            p.error(f"{flag} {folder} is a file; give a folder")
        try:  # both before the first is made: a --ckpt under a file must not leave an empty --out behind
            check_folder_path(folder, flag)
        except ValueError as err:
            p.error(str(err))
    t0 = time.perf_counter()
    try:
        with removed_if_left_empty(out, ckpt):  # refused in the lock (another writer, other settings): none stays
            work()
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_message(f"finished results are kept in {out}", again), file=sys.stderr)
        return INTERRUPTED
    print(f"all done in {time.perf_counter() - t0:.0f} s; results in {out}")
    return 0


def parse_names(p, text: str, valid: Sequence[str], *, flag: str = "--models", what: str = "model",
                all_word: str | None = "all", note: str | None = None) -> list[str]:
    """A comma-separated list of names from ``valid`` (``all_word`` alone: every one), checked: an unknown name or
    an empty list ends the command through ``p.error`` with one line naming it and the valid choices (then
    ``note``, by default ``, or 'all'``)."""
    if all_word is not None and text.strip() == all_word:
        return list(valid)
    names = [m.strip() for m in text.split(",") if m.strip()]
    choices = ", ".join(valid) + (note if note is not None else f", or {all_word!r}" if all_word else "")
    if not names:
        p.error(f"{flag} is empty ({text!r}); valid choices: {choices}")
    bad = [m for m in names if m not in valid]
    if bad:
        p.error(f"unknown {what}(s) {bad}; valid choices: {choices}")
    return list(dict.fromkeys(names))


def parse_selection(p, a, valid: list[str]) -> tuple[list[int], list[str]]:
    """``--seeds``, ``--models`` and ``--jobs`` of a character-LM command line, checked: bad values end the
    command through ``p.error`` with one line naming the value and the valid choices."""
    seeds = parse_seeds(p, a.seeds)
    names = parse_names(p, a.models, valid, flag=next(x for x in p._actions if x.dest == "models").option_strings[0])
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    return seeds, names


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
    p.add_argument("--resume", action="store_true",
                   help="accepted for clarity: finished result files are always skipped")  # fmt: skip
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = parse_selection(p, a, list(models(cfg)))
    out = a.out or f"runs/longctx-{a.profile}"
    return run_command(p, out, a.ckpt, lambda: run_all(cfg, seeds, out, a.ckpt, names=names, finetunes=[] if
                                                       a.no_finetune else None, jobs=a.jobs),
                       "rerun the same command (with --resume) to train the others (finished ones are skipped)")


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["LongContextConfig", "PROFILES", "METHODS", "scalings", "models", "run_all", "load_results",
           "summarize", "evaluate"]  # fmt: skip
