"""Benchmark 1: one training step (forward + backward) per scheme and length.

The step is ``model.loss(src, tgt_in, tgt_out).backward()`` on random tokens
(batch ``cfg.batch``, source length = target length = L), dropout ``cfg.dropout``
(0 by default, see benchmarks/README.md).  Gradients are cleared outside the timed region; no optimizer step
(it costs the same for every scheme and would only dilute the ratios).
"""
from __future__ import annotations

from .common import BenchConfig, log, make_model, random_tokens, rotated, summarise, timed


def train_step(model, src, tgt):
    loss = model.loss(src, tgt[:, :-1], tgt[:, 1:])
    loss.backward()
    return loss


def clear_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


def bench_train(schemes: tuple[str, ...], cfg: BenchConfig, quiet: bool = False) -> dict:
    """``{"lengths": {L: {scheme: {median_s, ..., ratio}}}}``; ratio = median / median of ``none``."""
    out: dict = {"what": "forward + backward of one training step (seconds)", "lengths": {}}
    models = {pe: make_model(pe, cfg) for pe in schemes}
    for m in models.values():
        m.train()
    for length in cfg.lengths:
        src = random_tokens(cfg, cfg.batch, length, seed=1)
        tgt = random_tokens(cfg, cfg.batch, length + 1, seed=2)  # +1: shifted input/output of length L
        times: dict[str, list[float]] = {pe: [] for pe in schemes}
        for pe in schemes:  # warm-up (allocator, kernels, RoPE tables)
            for _ in range(cfg.warmup):
                train_step(models[pe], src, tgt)
                clear_grads(models[pe])
        for r in range(cfg.repeats):
            for pe in rotated(schemes, r):
                times[pe].append(timed(lambda: train_step(models[pe], src, tgt), cfg.device))
                clear_grads(models[pe])
        res = {pe: summarise(t) for pe, t in times.items()}
        ref = res["none"]["median_s"]
        for pe in schemes:
            res[pe]["ratio"] = res[pe]["median_s"] / ref
        out["lengths"][str(length)] = res
        log(f"train L={length}: " + ", ".join(f"{pe} {res[pe]['ratio']:.2f}" for pe in schemes), quiet)
    return out


def bench_train_batches(schemes: tuple[str, ...], cfg: BenchConfig, quiet: bool = False) -> dict:
    """:func:`bench_train` at every batch size of ``cfg.batches``: ``{"batches": {B: {"lengths": ...}}}``."""
    import dataclasses

    out: dict = {"what": "forward + backward of one training step (seconds), per batch size", "batches": {}}
    for batch in cfg.batches:
        log(f"train batch {batch}:", quiet)
        out["batches"][str(batch)] = bench_train(schemes, dataclasses.replace(cfg, batch=batch, batches=()), quiet)
    return out


if __name__ == "__main__":  # a part of the suite, not a command: say so instead of ending silently with nothing run
    import sys

    print("python -m benchmarks.train measures nothing by itself: run `python -m benchmarks.run --only train` "
          "(--quick for a trial of seconds; see --help there)", file=sys.stderr)
    sys.exit(2)
