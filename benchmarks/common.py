"""Shared pieces of the benchmark suite: configuration, machine facts, models, timing.

Every figure is the median of several timed repeats after untimed warm-up runs;
the schemes are visited round-robin (a rotated order on every repeat) so that
background load on a shared machine falls on all schemes alike.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from posenc_lib import PE_TYPES, SURVEY_TYPES, build_model, set_seed
from posenc_lib.schemes import registry
from posenc_lib.pool import available_cores
from posenc_lib.schemes.shaw import ShawRelative
from posenc_lib.checks import check_divides, check_float_range, check_int_range

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: contrast scheme: Shaw et al. with the (L, L, d) tables materialised (not in PE_TYPES)
NAIVE_SHAW = "shaw_naive"
ALL_SCHEMES: tuple[str, ...] = PE_TYPES + (NAIVE_SHAW,)


def valid_schemes() -> tuple[str, ...]:
    """Every name ``--schemes`` accepts, read from the registry when called: the published suite's (the default)
    and the newer schemes (lesson 11's, measured in a run of their own: benchmarks/results/survey)."""
    return registry.PE_TYPES + (NAIVE_SHAW,) + registry.SURVEY_TYPES


#: the names ``--schemes`` accepts when the package is imported (a scheme registered later joins valid_schemes())
VALID_SCHEMES: tuple[str, ...] = valid_schemes()


@dataclass
class BenchConfig:
    """Sizes of the suite; the defaults are the published configuration."""

    d_model: int = 256
    n_heads: int = 8
    num_layers: int = 2  # encoder layers = decoder layers
    dim_feedforward: int = 1024
    vocab_size: int = 8000
    dropout: float = 0.0  # 0: fused SDPA where a scheme allows it; --dropout 0.1 = the course's training setting
    batch: int = 16
    lengths: tuple[int, ...] = (64, 256, 1024)  # source length = target length
    #: ``--batches``: measure train and memory at each of these batch sizes (train_batches.json,
    #: memory_batches.json, memory at every training length); empty: at ``batch`` only (train.json, memory.json)
    batches: tuple[int, ...] = ()
    memory_length: int = 1024
    decode_batch: int = 32
    decode_src_len: int = 64
    decode_new_tokens: int = 64
    warmup: int = 1
    repeats: int = 5
    decode_repeats: int = 3
    #: ``--decode-compile``: also time cached decoding with the compiled step (``greedy_decode(compile=True)``);
    #: its first call per scheme compiles (recorded as ``compile_s``, outside the timed repeats)
    decode_compile: bool = False
    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self):
        """Refuse a bad size, count or rate before anything runs, naming the field and its allowed range."""
        for f in ("d_model", "n_heads", "num_layers", "dim_feedforward", "batch", "memory_length", "decode_batch",
                  "decode_src_len", "decode_new_tokens", "repeats", "decode_repeats"):  # fmt: skip
            check_int_range(f, getattr(self, f), 1)
        check_divides(self.d_model, self.n_heads)
        check_int_range("vocab_size", self.vocab_size, 5)  # ids 0-3 are reserved, random tokens start at 4
        check_int_range("warmup", self.warmup, 0)
        check_float_range("dropout", self.dropout, 0.0, 1.0, high_open=True)
        if isinstance(self.lengths, (str, bytes)) or not hasattr(self.lengths, "__iter__"):
            raise TypeError(f"lengths must be a tuple of integers >= 1, got {self.lengths!r}")
        self.lengths = tuple(self.lengths)
        if not self.lengths:
            raise ValueError("lengths must name at least one training length (integers >= 1)")
        for n in self.lengths:
            check_int_range("lengths: every training length", n, 1)
        if isinstance(self.batches, (str, bytes)) or not hasattr(self.batches, "__iter__"):
            raise TypeError(f"batches must be a tuple of integers >= 1, got {self.batches!r}")
        self.batches = tuple(self.batches)
        for n in self.batches:
            check_int_range("batches: every batch size", n, 1)
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid choices: {', '.join(DTYPES)}")
        if not isinstance(self.device, str) or not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"unknown device {self.device!r}; valid choices: cpu, cuda, cuda:N")

    @classmethod
    def quick(cls) -> "BenchConfig":
        """A tiny configuration that runs in seconds (for tests and for trying the suite)."""
        return cls(
            d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, vocab_size=200, batch=2, lengths=(16, 32),
            memory_length=32, decode_batch=2, decode_src_len=8, decode_new_tokens=6, warmup=1, repeats=2,
            decode_repeats=1,
        )

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lengths"] = list(self.lengths)
        d["batches"] = list(self.batches)
        return d




def check_schemes(names) -> tuple[str, ...]:
    """Validate scheme names against :func:`valid_schemes`; ``none`` is always measured (the reference)."""
    names, valid = tuple(dict.fromkeys(n.strip() for n in names if n.strip())), valid_schemes()
    if not names:  # an empty list is a slip (say, an unset shell variable), not a request to measure none alone
        raise ValueError(f"no scheme named; valid choices: {', '.join(valid)}")
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"unknown scheme(s) {bad}; valid choices: {', '.join(valid)}")
    if "none" not in names:
        names = ("none",) + names
    return names


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str = "cpu") -> dict:
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cores_available": available_cores(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "allocator_preload": os.environ.get("LD_PRELOAD", ""),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def attention_settings() -> dict:
    """The attention module's switches and thresholds at measuring time: they choose how each call is computed
    (fused or explicit, block sizes, the backward pass), so a result records the ones it was measured with."""
    from posenc_lib.attention import backends, cpu_flash
    from posenc_lib.kernels import xlnet
    from posenc_lib.schemes import alibi, t5

    tuning = backends.TUNING  # recorded under the names the results have always used
    return {
        "layer.BLOCK_ELEMENTS": tuning.block_elements,
        "layer.CPU_FLASH": tuning.cpu_flash,
        "layer.FUSED_MIN_ELEMENTS": tuning.fused_min_elements,
        "layer.FLUSH_MIN_ELEMENTS": tuning.flush_min_elements,
        "layer.FUSED_BLOCK_ROWS": tuning.fused_block_rows,
        "layer.SIDED_BLOCK_ROWS": tuning.sided_block_rows,
        "layer.BATCH_CHUNK_ELEMENTS": tuning.batch_chunk_elements,
        "cpu_flash.SIDE_MIN_KEYS": cpu_flash.SIDE_MIN_KEYS,
        "cpu_flash.WORKSPACE_ELEMENTS": cpu_flash.WORKSPACE_ELEMENTS,
        "cpu_flash.WRITTEN_BACKWARD": cpu_flash.WRITTEN_BACKWARD,
        "cpu_flash.BACKWARD_BLOCK_ROWS": cpu_flash.BACKWARD_BLOCK_ROWS,
        "t5.TOEPLITZ_MIN_ELEMENTS": t5.TOEPLITZ_MIN_ELEMENTS,
        "alibi.OFFSET_MIN_ELEMENTS": alibi.OFFSET_MIN_ELEMENTS,
        "xlnet.DISTANCE_PAD": xlnet.DISTANCE_PAD,
    }


class ShawNaive(ShawRelative):
    """Shaw et al. computed the textbook way: gather the tables into ``(L_q, L_k, d)``, then contract.

    Numerically the same scheme as :class:`~posenc_lib.schemes.shaw.ShawRelative`; it exists
    here only to show what the (2k+1)-table formulation saves.
    """

    name = NAIVE_SHAW
    clipped_sides = False

    def scores(self, q, k, prep, layer, attn):
        a_k = self.table_k[layer].to(q.dtype)[prep["index"]]  # (Lq, Lk, d)
        return torch.einsum("bhid,ijd->bhij", q, a_k)

    def values(self, probs, prep, layer):
        a_v = self.table_v[layer].to(probs.dtype)[prep["index"]]
        return torch.einsum("bhij,ijd->bhid", probs, a_v)


def make_model(pe: str, cfg: BenchConfig, seed: int = 0) -> torch.nn.Module:
    """The benchmark model for scheme ``pe`` (``shaw_naive`` swaps in :class:`ShawNaive`)."""
    set_seed(seed)
    base = "shaw" if pe == NAIVE_SHAW else pe
    # a learned table needs a row for every position the suite uses
    longest = max((*cfg.lengths, cfg.memory_length, cfg.decode_src_len, cfg.decode_new_tokens + 1))
    extra = {"max_len": longest} if base == "learned" else {}
    model = build_model(
        base, cfg.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
        dim_feedforward=cfg.dim_feedforward, dropout=cfg.dropout, **extra,
    )  # fmt: skip
    if pe == NAIVE_SHAW:
        for stack in ("enc_scheme", "dec_scheme"):
            old = getattr(model, stack)
            new = ShawNaive(old.d_model, old.n_heads, old.num_layers, old.causal, old.max_relative_position)
            new.load_state_dict(old.state_dict())
            setattr(model, stack, new)
    return model.to(device=cfg.device, dtype=DTYPES[cfg.dtype])


def random_tokens(cfg: BenchConfig, batch: int, length: int, seed: int) -> torch.Tensor:
    """``(batch, length)`` int64 ids in ``[4, vocab)`` (ids 0-3 are left for pad/bos/eos/unk)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, cfg.vocab_size, (batch, length), generator=g).to(cfg.device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str) -> float:
    """Seconds one call of ``fn`` takes (device-synchronised)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def rotated(names: tuple[str, ...], r: int) -> tuple[str, ...]:
    """Round-robin order for repeat ``r``: every scheme takes every slot equally often."""
    s = r % len(names)
    return names[s:] + names[:s]


def summarise(times: list[float]) -> dict:
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "times_s": [round(t, 6) for t in times],
    }


def log(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(msg, flush=True)
