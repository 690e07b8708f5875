"""Benchmark 3: greedy decoding with and without the key/value cache.

For each scheme: encode a random source (``cfg.decode_batch`` x ``cfg.decode_src_len``)
and decode exactly ``cfg.decode_new_tokens`` tokens greedily (the end-of-sequence
id is None, so no run stops early).  Without the
cache the whole prefix goes through the decoder at every step (quadratic in the
output length); with it, one new token per step.  Both must give identical tokens.
"""
from __future__ import annotations

import torch

from posenc_lib import greedy_decode

from .common import BenchConfig, log, make_model, random_tokens, rotated, summarise, timed

NEVER = None  # no end-of-sequence id: every run decodes exactly decode_new_tokens


def bench_decode(schemes: tuple[str, ...], cfg: BenchConfig, quiet: bool = False) -> dict:
    out: dict = {"what": "greedy decoding of a batch, seconds per call", "schemes": {}}
    src = random_tokens(cfg, cfg.decode_batch, cfg.decode_src_len, seed=3)
    models = {pe: make_model(pe, cfg).eval() for pe in schemes}
    tokens: dict[tuple[str, bool], torch.Tensor] = {}

    def run(pe: str, use_cache: bool):
        ys = greedy_decode(
            models[pe], src, max_new_tokens=cfg.decode_new_tokens, bos_id=1, eos_id=NEVER, use_cache=use_cache
        )
        tokens[pe, use_cache] = ys

    times = {(pe, c): [] for pe in schemes for c in (True, False)}
    for pe in schemes:
        for _ in range(cfg.warmup):
            run(pe, True)
            run(pe, False)
    mismatches = {pe: 0 for pe in schemes}
    for r in range(cfg.decode_repeats):
        for pe in rotated(schemes, r):
            for c in ((True, False) if r % 2 == 0 else (False, True)):
                times[pe, c].append(timed(lambda: run(pe, c), cfg.device))
            a, b = tokens[pe, True], tokens[pe, False]
            mismatches[pe] += int(a.shape != b.shape or not torch.equal(a, b))
    for pe in schemes:
        ys = tokens[pe, True]
        cached, full = summarise(times[pe, True]), summarise(times[pe, False])
        out["schemes"][pe] = {
            "cached": cached,
            "uncached": full,
            "speedup": full["median_s"] / cached["median_s"],
            "identical": mismatches[pe] == 0 and tuple(ys.shape) == (cfg.decode_batch, cfg.decode_new_tokens + 1),
            "new_tokens": int(ys.shape[1] - 1),
        }
    ref_c, ref_u = out["schemes"]["none"]["cached"]["median_s"], out["schemes"]["none"]["uncached"]["median_s"]
    for pe in schemes:
        s = out["schemes"][pe]
        s["ratio_cached"] = s["cached"]["median_s"] / ref_c
        s["ratio_uncached"] = s["uncached"]["median_s"] / ref_u
    log(
        "decode speed-up with cache: "
        + ", ".join(f"{pe} {s['speedup']:.1f}x{'' if s['identical'] else ' (TOKENS DIFFER)'}" for pe, s in out["schemes"].items()),
        quiet,
    )
    return out


if __name__ == "__main__":  # a part of the suite, not a command: say so instead of ending silently with nothing run
    import sys

    print("python -m benchmarks.decode measures nothing by itself: run `python -m benchmarks.run --only decode` "
          "(--quick for a trial of seconds; see --help there)", file=sys.stderr)
    sys.exit(2)
