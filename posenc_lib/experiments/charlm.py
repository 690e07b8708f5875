"""The character language model the long-context experiments share: data, training, evaluation, records.

Lesson 14's recipe, used by long_context.py and by the experiments that train or read models like it
(long_context_scaled, long_context_extra, sliding_window, passkey_trained, rope_variants, inside): the
English side of the shipped Europarl text as characters (:func:`load_text`, :class:`CharVocab`, :func:`data`),
training on random windows (:func:`train_steps`, :func:`train_at_length`), perplexity at several lengths
(:func:`evaluate`), and the result record they write (:func:`record`, schema :data:`SCHEMA`), read back by
:func:`load_results` and summarised over seeds by :func:`summarize`.  ``cfg`` is a
:class:`~posenc_lib.experiments.long_context.LongContextConfig` or any configuration with its fields.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..models.causal_lm import CausalLM
from ..seeds import set_seed
from . import runner
from .wmt14.data import SHIPPED_DIR, find_file, read_lines

#: the record format of every character-LM result file (pre-training, fine-tune, ablation)
SCHEMA = "posenc.longctx/1"
#: what :func:`load_results` checks
RECORDS = runner.Schema(SCHEMA, ("schema", "kind", "model", "seed", "config", "eval"))
UNK = 0  # id of characters outside the vocabulary


# -- data -----------------------------------------------------------------------------------------
def load_text(cfg, data_dir: str | Path = SHIPPED_DIR) -> tuple[str, str]:
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


_DATA: dict[tuple, Any] = {}


def data(cfg, data_dir=SHIPPED_DIR):
    """``(vocab, train_ids, eval_ids)``, cached per process."""
    key = (cfg.train_lines, cfg.eval_offset, cfg.eval_chars, cfg.min_char_count, str(data_dir))
    if key not in _DATA:
        train, ev = load_text(cfg, data_dir)
        vocab = CharVocab(train, cfg.min_char_count)
        _DATA[key] = (vocab, vocab.encode(train), vocab.encode(ev))
    return _DATA[key]


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


# -- records --------------------------------------------------------------------------------------
def record(kind, name, seed, cfg, model, losses, seconds, evals, **extra) -> dict:
    """The result record of one trained model: ``kind`` (pretrain, finetune, ablation), its training and ``evals``
    (method -> :func:`evaluate` rows), with ``extra`` fields beside them."""
    return {"schema": SCHEMA, "kind": kind, "model": name, "seed": seed, "profile": cfg.name, "config": asdict(cfg),
            "num_parameters": sum(p.numel() for p in model.parameters()), "train_loss": losses,
            "train_seconds": round(seconds, 1), "eval": evals, "torch": torch.__version__, **extra}  # fmt: skip


def ppl_line(evals: dict) -> str:
    """One log line: the perplexity at every length of each method of ``evals``."""
    return "; ".join(f"{m}: " + " ".join(f"{r['length']}:{r['ppl']:.2f}" for r in rows) for m, rows in evals.items())


def load_results(out) -> list[dict]:
    """Every character-LM record in the folder ``out``, checked (:data:`RECORDS`)."""
    return runner.load_results(out, RECORDS)


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


__all__ = ["SCHEMA", "RECORDS", "UNK", "load_text", "CharVocab", "random_windows", "data", "lr_at", "train_steps",
           "evaluate", "train_at_length", "record", "ppl_line", "load_results", "summarize"]  # fmt: skip
