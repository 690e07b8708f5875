"""Benchmark 3: greedy decoding with and without the key/value cache.

For each scheme: encode a random source (``cfg.decode_batch`` x ``cfg.decode_src_len``)
and decode exactly ``cfg.decode_new_tokens`` tokens greedily (the end-of-sequence
id is None, so no run stops early).  Without the
cache the whole prefix goes through the decoder at every step (quadratic in the
output length); with it, one new token per step.  Both must give identical tokens.  With
``cfg.decode_compile`` the cached run is also timed with its step compiled (``greedy_decode(compile=True)``):
the first call per scheme compiles and is timed on its own (``compile_s``); the timed repeats come after it,
and its tokens must be identical too.

``speedup`` is the uncached median over the cached median; ``speedup_fastest`` the fastest uncached call
over the fastest cached one.  Outside load only ever adds time, so on a shared machine the fastest
repeat is the nearer estimate of what a call itself costs; both are kept.
"""
from __future__ import annotations

import torch

from posenc_lib import greedy_decode

from .common import BenchConfig, log, make_model, random_tokens, rotated, summarise, timed

NEVER = None  # no end-of-sequence id: every run decodes exactly decode_new_tokens
COMPILED = "compiled"  # the cached run with its step compiled


def bench_decode(schemes: tuple[str, ...], cfg: BenchConfig, quiet: bool = False) -> dict:
    out: dict = {"what": "greedy decoding of a batch, seconds per call", "schemes": {}}
    src = random_tokens(cfg, cfg.decode_batch, cfg.decode_src_len, seed=3)
    models = {pe: make_model(pe, cfg).eval() for pe in schemes}
    tokens: dict[tuple[str, bool], torch.Tensor] = {}

    variants = (True, False, COMPILED) if cfg.decode_compile else (True, False)

    def run(pe: str, variant):
        ys = greedy_decode(
            models[pe], src, max_new_tokens=cfg.decode_new_tokens, bos_id=1, eos_id=NEVER,
            use_cache=variant is not False, compile=variant == COMPILED,
        )  # fmt: skip
        tokens[pe, variant] = ys

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.equal(a, b)

    times = {(pe, c): [] for pe in schemes for c in variants}
    compile_s = {}
    for pe in schemes:
        if cfg.decode_compile:  # the first compiled call compiles: timed on its own
            compile_s[pe] = timed(lambda: run(pe, COMPILED), cfg.device)
        for _ in range(cfg.warmup):
            for c in variants:
                run(pe, c)
    mismatches = {pe: 0 for pe in schemes}
    compiled_mismatches = {pe: 0 for pe in schemes}
    for r in range(cfg.decode_repeats):
        for pe in rotated(schemes, r):
            for c in (variants if r % 2 == 0 else variants[::-1]):
                times[pe, c].append(timed(lambda: run(pe, c), cfg.device))
            mismatches[pe] += int(not same(tokens[pe, True], tokens[pe, False]))
            if cfg.decode_compile:
                compiled_mismatches[pe] += int(not same(tokens[pe, COMPILED], tokens[pe, False]))
    for pe in schemes:
        ys = tokens[pe, True]
        cached, full = summarise(times[pe, True]), summarise(times[pe, False])
        out["schemes"][pe] = {
            "cached": cached,
            "uncached": full,
            "speedup": full["median_s"] / cached["median_s"],
            "speedup_fastest": full["min_s"] / cached["min_s"],
            "identical": mismatches[pe] == 0 and tuple(ys.shape) == (cfg.decode_batch, cfg.decode_new_tokens + 1),
            "new_tokens": int(ys.shape[1] - 1),
        }
        if cfg.decode_compile:
            comp = summarise(times[pe, COMPILED])
            out["schemes"][pe].update(
                compiled=comp, speedup_compiled=full["median_s"] / comp["median_s"], compile_s=compile_s[pe],
                identical_compiled=compiled_mismatches[pe] == 0,
            )  # fmt: skip
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
    log("fastest against fastest: " + ", ".join(f"{pe} {s['speedup_fastest']:.1f}x" for pe, s in out["schemes"].items()), quiet)
    if cfg.decode_compile:
        log("compiled cached step: " + ", ".join(
            f"{pe} {s['speedup_compiled']:.1f}x{'' if s['identical_compiled'] else ' (TOKENS DIFFER)'}"
            for pe, s in out["schemes"].items()), quiet)
    return out


if __name__ == "__main__":  # a part of the suite, not a command: say so instead of ending silently with nothing run
    import sys

    print("python -m benchmarks.decode measures nothing by itself: run `python -m benchmarks.run --only decode` "
          "(--quick for a trial of seconds; see --help there)", file=sys.stderr)
    sys.exit(2)
