"""Training profiles and the training loop of the WMT14 experiment.

The recipe is the base Transformer's (Vaswani et al. 2017, arXiv:1706.03762,
section 5), scaled down: batches holding about ``batch_tokens`` target tokens
built from length buckets, label smoothing, Adam (beta2 0.98) with the learning
rate

    lr(step) = peak * min(step / warmup, sqrt(warmup / step))

(linear warmup, then inverse-square-root decay), gradient clipping, and a
validation loss (NLL per target token, no smoothing) on a fixed dev subset.
Checkpoints (model, optimizer, gradient scaler, step, position in the epoch,
CPU and CUDA RNG states) are written atomically (temporary file, then rename),
so ``--resume`` continues a killed run on the same curve, also on another
device: they are always loaded on the CPU first.  Mixed precision follows the
hardware (:func:`resolve_precision`): bf16 autocast on GPUs that support it,
fp16 with a gradient scaler on older GPUs (T4, V100), float32 on the CPU.
The loop never waits for the GPU between updates: losses are summed on the
device and read once per ``log_every`` updates.  The ``gpu`` profile also gathers
its batches from token ids kept on the device, computes the loss in chunks of
rows (:mod:`.fastpath`), makes self-attention's q, k and v in one product, runs the model's forward and
backward as one ``torch.compile`` graph (``compile``; sizes symbolic, so one graph serves every batch shape),
and writes checkpoints after the last update and on
SIGUSR1 (then goes on) or SIGTERM (then ends as SIGTERM would) instead of every
``ckpt_every`` updates; on CUDA, Adam steps with its fused kernel.  Under ``torchrun`` each
process trains on its own share of every epoch's batches and
DistributedDataParallel averages the gradients (gloo on CPU, NCCL on GPUs);
every process starts from the same weights but draws its own dropout masks
(seed + rank).  Used by ``python -m posenc_lib.experiments.wmt14``; notebooks/17_finale_wmt14.ipynb shows it.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .evaluate import pad_batch
from .fastpath import DeviceData, chunked_cross_entropy
from ...models.seq2seq import build_model
from ...schemes.registry import PE_TYPES, canonical_pe
from .tokenizer import TOKENIZERS
from ...checks import check_choice
from ...files import atomic_torch_save, atomic_write_text
from ...seeds import set_seed

#: ``precision`` values: ``auto`` = bf16 where the GPU supports it, else fp16 (+ GradScaler); fp32 on CPU
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
#: ``bucket`` values: batches of pairs sorted by target length (then source), or by both lengths together
BUCKETS = ("target", "both")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used for ``--resume`` (damaged, or made for another model)."""


# field -> (type, lowest, highest, lowest allowed?, highest allowed?, None allowed?)
_RANGES = {
    "d_model": (int, 2, None, True, True, False), "n_heads": (int, 1, None, True, True, False),
    "num_layers": (int, 1, None, True, True, False), "num_decoder_layers": (int, 1, None, True, True, False),
    "dim_feedforward": (int, 1, None, True, True, False), "dropout": (float, 0.0, 1.0, True, False, False),
    "vocab_size": (int, 16, None, True, True, False), "max_tokens": (int, 1, None, True, True, False),
    "max_train_pairs": (int, 1, None, True, True, True), "batch_tokens": (int, 1, None, True, True, False),
    "micro_batch_tokens": (int, 1, None, True, True, True),
    "lr": (float, 0.0, None, False, True, False), "warmup": (int, 1, None, True, True, False),
    "max_steps": (int, 1, None, True, True, False), "label_smoothing": (float, 0.0, 1.0, True, False, False),
    "clip_norm": (float, 0.0, None, False, True, False), "log_every": (int, 1, None, True, True, False),
    "val_every": (int, 1, None, True, True, False), "val_pairs": (int, 1, None, True, True, False),
    "ckpt_every": (int, 0, None, True, True, False), "eval_limit": (int, 1, None, True, True, True),
    "loss_chunk": (int, 1, None, True, True, True),
    "beam": (int, 1, None, True, True, False), "length_penalty": (float, 0.0, None, True, True, False),
    "bootstrap_samples": (int, 1, None, True, True, False),
}  # fmt: skip


def _range_text(kind, lo, hi, lo_ok, hi_ok, none_ok) -> str:
    what = "an integer" if kind is int else "a number"
    parts = [f"{'>=' if lo_ok else '>'} {lo}"] if lo is not None else []
    parts += [f"{'<=' if hi_ok else '<'} {hi}"] if hi is not None else []
    return f"{what} {' and '.join(parts)}" + (" (or None)" if none_ok else "")


def validate_profile(prof: Profile) -> None:
    """Refuse any field outside its range before anything runs (``ValueError`` naming the field and the range)."""
    for name, (kind, lo, hi, lo_ok, hi_ok, none_ok) in _RANGES.items():
        v = getattr(prof, name)
        allowed = _range_text(kind, lo, hi, lo_ok, hi_ok, none_ok)
        if v is None and none_ok:
            continue
        ok_type = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
        if not ok_type or (kind is float and not math.isfinite(v)):
            raise ValueError(f"profile field {name}={v!r} is invalid; allowed: {allowed}")
        if (lo is not None and (v < lo if lo_ok else v <= lo)) or (hi is not None and (v > hi if hi_ok else v >= hi)):
            raise ValueError(f"profile field {name}={v!r} is out of range; allowed: {allowed}")
    for name in ("bertscore", "device_data", "ckpt_on_signal", "fused_qkv", "compile"):
        if not isinstance(getattr(prof, name), bool):
            raise ValueError(f"profile field {name}={getattr(prof, name)!r} is invalid; allowed: true or false")
    if not isinstance(prof.name, str) or not prof.name:
        raise ValueError(f"profile field name={prof.name!r} is invalid; allowed: a non-empty string")
    check_choice("profile field tokenizer", prof.tokenizer, TOKENIZERS)
    check_choice("profile field precision", prof.precision, PRECISIONS)
    check_choice("profile field bucket", prof.bucket, BUCKETS)
    if prof.d_model % prof.n_heads:
        raise ValueError(f"profile field n_heads={prof.n_heads} does not divide d_model={prof.d_model}; allowed: "
                         f"{[h for h in range(1, prof.d_model + 1) if prof.d_model % h == 0]}")
    if prof.d_model % 2 or (prof.d_model // prof.n_heads) % 2:
        raise ValueError(f"profile fields d_model={prof.d_model} and d_model/n_heads={prof.d_model // prof.n_heads} "
                         "must be even (sin/cos and rotation pairs)")
    for name in ("val_every", "ckpt_every"):
        if getattr(prof, name) % prof.log_every:
            raise ValueError(f"profile field {name}={getattr(prof, name)} must be a multiple of "
                             f"log_every={prof.log_every}")


#: runs beside PE_TYPES: name -> (scheme, its options).  The symmetric ALiBi encoder cannot tell left from
#: right without an anchor; the directional variant gives each head its own slope on each side
#: (posenc_lib/schemes/alibi.py) to test that explanation of ALiBi's deficit.
VARIANTS: dict[str, tuple[str, dict]] = {"alibi-directional": ("alibi", {"bidirectional": "directional"})}
#: every name a run accepts, in the order tables list them
RUN_ORDER: tuple[str, ...] = PE_TYPES + tuple(VARIANTS)


def canonical_run_pe(pe: str) -> str:
    """A run's name for ``pe``: a variant of :data:`VARIANTS`, or the registry's canonical scheme name (aliases
    accepted); ``ValueError`` naming every valid choice otherwise."""
    key = pe.strip().lower() if isinstance(pe, str) else pe
    if key in VARIANTS:
        return key
    try:
        return canonical_pe(pe)
    except ValueError as err:
        raise ValueError(f"{err}; variants: {', '.join(VARIANTS)}") from None


def scheme_of(pe: str) -> tuple[str, dict]:
    """The registry scheme and options a run's name builds (``"alibi-directional"`` -> ``("alibi", {...})``)."""
    name = canonical_run_pe(pe)
    scheme, options = VARIANTS.get(name, (name, {}))
    return scheme, dict(options)


@dataclass
class Profile:
    """One experiment size. Every field can be overridden with ``--set name=value``."""

    name: str = "cpu"
    # model (positions enter through the scheme; everything else is shared by all schemes)
    d_model: int = 128
    n_heads: int = 4
    num_layers: int = 2  # encoder layers
    num_decoder_layers: int = 2
    dim_feedforward: int = 512
    dropout: float = 0.1
    # data: pairs with more than max_tokens subword tokens on either side are dropped from
    # training; exact duplicate pairs and pairs sharing a side with the held-out set are dropped
    tokenizer: str = "bpe"  # "bpe" (joint, trained on the training split) or "mbert"
    vocab_size: int = 8000  # BPE only
    max_tokens: int = 24
    max_train_pairs: int | None = None  # read at most this many training pairs (None: all)
    # optimisation
    batch_tokens: int = 1500  # target tokens per update (per process under torchrun)
    # target tokens per forward/backward pass: a batch larger than this is processed in parts whose
    # gradients add up to the same update (less memory, same recipe); None: the whole batch on a GPU,
    # at most CPU_MICRO_TOKENS on the CPU
    micro_batch_tokens: int | None = None
    lr: float = 2e-3  # peak learning rate
    warmup: int = 120  # updates; scale to the run's real number of updates
    max_steps: int = 1200  # updates per model
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    precision: str = "auto"  # auto | bf16 | fp16 | fp32 (see resolve_precision)
    # monitoring
    log_every: int = 50  # metrics line every N updates
    val_every: int = 250  # validation loss every N updates (multiple of log_every)
    val_pairs: int = 300  # fixed random newstest2013 subset (pairs <= max_tokens) for validation loss
    ckpt_every: int = 250  # checkpoint every N updates (multiple of log_every); 0: only after the last update
    # checkpoint on SIGUSR1 and go on; on SIGTERM checkpoint, then end as SIGTERM would (the gpu profile)
    ckpt_on_signal: bool = False
    # speed (the gpu profile; the same recipe): batches gathered from token ids kept on the device
    # (fastpath.DeviceData) instead of collated on the host, and the loss computed loss_chunk rows of
    # logits at a time (fastpath.chunked_cross_entropy; None: the whole logits tensor, upcast to fp32)
    device_data: bool = False
    loss_chunk: int | None = None
    # more speed (the gpu profile): self-attention's q, k and v in one matrix product, and the model's forward and
    # backward as one torch.compile graph on a GPU (sizes symbolic from the first batch; a compile that fails falls
    # back to the eager model with a warning; not used on a CPU device, see COMPILE_BACKENDS). Compiled dropout
    # draws its masks from its own generator: the same recipe, other masks than the eager model at the same seed
    fused_qkv: bool = False
    compile: bool = False
    # batching: "target" sorts each chunk of pairs by target length (then source length); "both" by the
    # longer side in buckets of 4 tokens, then target, then source length: less source padding
    bucket: str = "target"
    # evaluation
    eval_limit: int | None = None  # score only the first N sentences of each test set (None: all)
    beam: int = 1  # 1 = greedy; e.g. 4 for beam search
    length_penalty: float = 0.6  # GNMT alpha, beam search only
    bertscore: bool = True
    bootstrap_samples: int = 1000

    def __post_init__(self):
        validate_profile(self)

    def model_kwargs(self) -> dict:
        keys = ("d_model", "n_heads", "num_layers", "num_decoder_layers", "dim_feedforward", "dropout")
        return {k: getattr(self, k) for k in keys}


PROFILES: dict[str, Profile] = {
    # CI: proves the pipeline end to end (all four schemes in well under 2 minutes), not the science.
    "smoke": Profile(
        name="smoke", d_model=32, n_heads=2, num_layers=1, num_decoder_layers=1, dim_feedforward=64,
        vocab_size=1000, max_tokens=30, max_train_pairs=4000, batch_tokens=500, lr=3e-3, warmup=10,
        max_steps=60, log_every=10, val_every=20, val_pairs=32, ckpt_every=20, eval_limit=40,
        bootstrap_samples=100,
    ),
    # A laptop without a GPU (2 cores): d128, 2+2 layers, <= 24-token pairs, ~1500-token batches,
    # 1200 updates with warmup 120. Measured on 2 cores: 0.33-0.5 s per update without positions,
    # about 1.35x that for Shaw: 7-14 minutes of training per model plus a few minutes of evaluation.
    "cpu": Profile(name="cpu"),
    # Two CPU cores, trained as far as they take the finale in a few hours: the cpu profile's model and
    # recipe, bf16 autocast (benchmarks/results/train_speed.json: 1.4-1.5x fp32 on a CPU with AVX-512 BF16;
    # on a CPU without native bf16 (cpu_bf16_native) pass --set precision=fp32: emulated bf16 is ~2x slower
    # than fp32 there, and a run folder accepts models of either precision, each recording its own),
    # 10,000 updates per model (about 14.8M target tokens, 4.2 epochs of the shipped pairs), warmup 500.
    # Two models at once on one thread each.
    "laptop": Profile(name="laptop", precision="bf16", max_steps=10000, warmup=500, val_every=500, ckpt_every=250),
    # One GPU: the base Transformer's body (d512, 8 heads, 6+6 layers, ff 2048; 52M parameters with a
    # 16k joint BPE), <= 64-token pairs, ~24k target tokens per update, 3200 updates (~77M target
    # tokens, ~4 epochs of 600k pairs). Sized by arithmetic in benchmarks/README.md (four schemes x two
    # seeds in about 20 minutes on one H100); calibrated on one H200 (results/wmt14-gpu-short): about
    # 33 minutes for the four schemes of one seed, four at a time. Since those runs: batches gathered on the
    # device, the loss in chunks, checkpoints only at the end and on a signal, and batches bucketed on both
    # lengths (source padding 26% -> 9.5% on the shipped pairs, benchmarks/results/wmt14_padding.json);
    # the committed GPU runs used bucket=target (--set bucket=target repeats them).
    "gpu": Profile(
        name="gpu", d_model=512, n_heads=8, num_layers=6, num_decoder_layers=6, dim_feedforward=2048,
        vocab_size=16000, max_tokens=64, batch_tokens=24000, lr=8e-4, warmup=800, max_steps=3200,
        log_every=100, val_every=400, val_pairs=500, ckpt_every=0, ckpt_on_signal=True, device_data=True,
        loss_chunk=4096, bucket="both", fused_qkv=True, compile=True,
    ),
}  # fmt: skip


#: the torch.compile backend of ``compile=True`` per device type; None: that device trains uncompiled (inductor's C++
#: build takes minutes per model on a few CPU cores, more than a rehearsal of the gpu profile trains). The CPU tests
#: trace with "aot_eager": the same graphs, no C++ build
COMPILE_BACKENDS = {"cuda": "inductor", "cpu": None}

#: profiles sized for a CUDA GPU: refused on a machine without one unless the device is asked for (a rehearsal)
GPU_PROFILES = ("gpu",)


def get_profile(name: str, overrides: dict | None = None) -> Profile:
    """A profile by name with ``overrides`` (strings are converted to the field's type, then validated)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid choices: {', '.join(map(repr, PROFILES))}")
    types = {f.name: str(f.type) for f in fields(Profile)}
    conv = {}
    for key, value in (overrides or {}).items():
        if key not in types or key == "name":
            raise ValueError(f"unknown profile field {key!r}; valid fields: {', '.join(t for t in types if t != 'name')}")
        if isinstance(value, str):
            value = _parse_field(key, types[key], value.strip())
        conv[key] = value
    return replace(PROFILES[name], **conv)


_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _parse_field(key: str, t: str, text: str):
    """``--set key=text`` converted to the field's type ``t``; ``ValueError`` naming the field if it does not parse."""
    if text.lower() == "none" and "None" in t:
        return None
    try:
        if t.startswith("bool"):
            return _BOOLS[text.lower()]
        if t.startswith("int"):
            return int(text)
        if t.startswith("float"):
            return float(text)
    except (KeyError, ValueError):
        kind = {"bool": "true or false", "int": "an integer", "float": "a number"}[t.split(" ")[0]]
        raise ValueError(f"profile field {key}={text!r} is invalid; allowed: {kind}") from None
    return text


def check_device(device: str | None) -> str:
    """``--device``: ``cpu``, ``cuda`` or ``cuda:N`` that this machine has (None: cuda if present, else cpu)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unknown --device {device!r}; valid choices: cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA device (torch.cuda.is_available() is False); "
                         "valid here: cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s); valid: "
                         + ", ".join(f"cuda:{i}" for i in range(torch.cuda.device_count())))
    return str(dev)


def check_hardware(prof: Profile, device: str | None) -> str:
    """The device a run uses (``--device``, default cuda if present); a profile made for a GPU (:data:`GPU_PROFILES`)
    on a machine without one is refused unless ``--device cpu`` asks for it (a rehearsal)."""
    if prof.name in GPU_PROFILES and device is None and not torch.cuda.is_available():
        raise ValueError(f"profile {prof.name!r} is the recipe for one CUDA GPU and this machine has none "
                         "(torch.cuda.is_available() is False); use --profile laptop, cpu or smoke here, or pass "
                         "--device cpu to rehearse it on the CPU anyway")
    return check_device(device)


# -- precision -------------------------------------------------------------------------------------
def cuda_bf16_native(device=None) -> bool:
    """True on GPUs with bf16 in hardware (Ampere and later); emulated bf16 (T4, V100) counts as no."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch without the keyword
        return torch.cuda.get_device_capability(device)[0] >= 8


def cpu_bf16_native(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """True where the CPU computes bf16 in hardware (x86 ``avx512_bf16`` or ``amx_bf16``; ARM ``bf16``).

    Without it, bf16 autocast on the CPU is emulated and *slower* than fp32: on a 2-core AVX-512 CPU
    without BF16 the finale's model trained at about 1,000 target tokens/s per model in bf16 and 2,050
    in fp32 (two models at once, one thread each), where a CPU with AVX-512 BF16 gave bf16 1.4-1.5x
    fp32 (benchmarks/results/train_speed.json). A run there should pass ``--set precision=fp32``.
    Read from ``/proc/cpuinfo``; where that file is missing (macOS, Windows) the answer is False.
    """
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return False
    flags = set()
    for line in text.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            flags.update(line.split(":", 1)[1].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(requested: str, device: str) -> str:
    """The precision a run uses: ``auto`` -> ``bf16`` on GPUs with bf16, ``fp16`` (+ GradScaler) on older
    GPUs, ``fp32`` on the CPU; an explicit ``bf16``/``fp16``/``fp32`` is kept (bf16 on a GPU without it is refused)."""
    check_choice("precision", requested, PRECISIONS)
    on_cuda = torch.device(device).type == "cuda"
    if requested == "auto":
        return ("bf16" if cuda_bf16_native(device) else "fp16") if on_cuda else "fp32"
    if requested == "bf16" and on_cuda and not cuda_bf16_native(device):
        raise ValueError(f"precision 'bf16' is not supported by this GPU ({torch.cuda.get_device_name(device)}); "
                         "valid choices here: 'auto', 'fp16', 'fp32'")
    return requested


class Precision:
    """Autocast context and (for fp16) a gradient scaler for one resolved precision on one device."""

    def __init__(self, mode: str, device: str):
        check_choice("precision", mode, PRECISIONS[1:])
        self.mode, self.device_type = mode, torch.device(device).type
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        self.scaler = torch.amp.GradScaler(self.device_type) if mode == "fp16" else None

    def autocast(self):
        return torch.autocast(device_type=self.device_type, dtype=self.dtype or torch.float32,
                              enabled=self.dtype is not None)


# -- distributed helpers ---------------------------------------------------------------------------
def dist_info() -> tuple[int, int]:
    """``(rank, world_size)``; (0, 1) when not under torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist_info()[1] > 1:
        torch.distributed.barrier()


# -- batching --------------------------------------------------------------------------------------
#: ``bucket="both"``: pairs whose longer side falls in the same step of this many tokens are batched together
BOTH_STEP = 4


def make_batches(src_lens: list[int], tgt_lens: list[int], batch_tokens: int, seed: int,
                 bucket: str = "target") -> list[list[int]]:
    """Token-count batches from length buckets: shuffle, sort chunks by length, cut, shuffle the batches.

    A batch of ``n`` pairs whose longest target has ``T`` tokens costs ``n * T <= batch_tokens``.
    ``bucket``: ``"target"`` sorts by (target, source) length; ``"both"`` by the longer side in steps of
    :data:`BOTH_STEP` tokens first, so that a batch's sources are about as long as each other too.
    """
    check_choice("bucket", bucket, BUCKETS)
    rng = random.Random(seed)
    idx = list(range(len(src_lens)))
    rng.shuffle(idx)
    batches, chunk = [], 100 * max(1, batch_tokens // 16)
    if bucket == "target":
        def key(i):
            return tgt_lens[i], src_lens[i]
    else:
        def key(i):
            return max(tgt_lens[i], src_lens[i]) // BOTH_STEP, tgt_lens[i], src_lens[i]
    for start in range(0, len(idx), chunk):
        part = sorted(idx[start : start + chunk], key=key)
        cur, width = [], 0
        for i in part:
            w = max(width, tgt_lens[i])
            if cur and (len(cur) + 1) * w > batch_tokens:
                batches.append(cur)
                cur, w = [], tgt_lens[i]
            cur.append(i)
            width = w
        if cur:
            batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(src: list[list[int]], tgt: list[list[int]], pad: int, bos: int, eos: int):
    """``src + </s>``, ``<s> + tgt`` (decoder input), ``tgt + </s>`` (labels), padded."""
    s = pad_batch([r + [eos] for r in src], pad)
    t_in = pad_batch([[bos] + r for r in tgt], pad)
    t_out = pad_batch([r + [eos] for r in tgt], pad)
    return s, t_in, t_out


def lr_at(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to ``peak`` over ``warmup`` updates, then ``peak * sqrt(warmup / step)``."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


@torch.no_grad()
def validation_loss(model, dev: dict, tok, device: str, prec: Precision | None = None, batch: int = 64) -> float:
    """Mean NLL per target token (no label smoothing) on the fixed dev subset (one read from the device)."""
    was = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for i in range(0, len(dev["src"]), batch):
        s, t_in, t_out = collate(dev["src"][i : i + batch], dev["tgt"][i : i + batch], tok.pad_id, tok.bos_id,
                                 tok.eos_id)
        count += sum(len(r) + 1 for r in dev["tgt"][i : i + batch])
        s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
        with prec.autocast() if prec is not None else contextlib.nullcontext():
            logits = model(s, t_in, src_key_padding_mask=s == tok.pad_id)
        total += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t_out.reshape(-1),
                                 ignore_index=tok.pad_id, reduction="sum")
    model.train(was)
    return float(total) / max(count, 1)


def read_metrics(path: Path, upto: int) -> list[dict]:
    """The rows of ``metrics.jsonl`` up to update ``upto`` (the checkpoint's).

    A kill while a row is appended leaves its last line cut off: that row comes after the last
    checkpoint (rows are written before the checkpoint of their update), so it is dropped.  A
    damaged line before the last is a ``ValueError`` naming the file and the line.
    """
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        lines = f.read().split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                raise ValueError("no integer 'step'")
        except ValueError as err:
            if all(not rest.strip() for rest in lines[i + 1:]):
                break  # the last line, cut off by a kill
            raise ValueError(f"{path}, line {i + 1}: not a metrics row ({str(err).splitlines()[0][:80]}); delete that "
                             "line, or the file (the curve then starts at the checkpoint's update)") from None
        rows.append(row)
    return [r for r in rows if r["step"] <= upto]


# -- checkpoints and RNG states --------------------------------------------------------------------
def rng_state() -> dict:
    """This process's RNG states: the CPU generator and, when CUDA is present, every GPU's."""
    st = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return st


def restore_rng_state(st, log=print) -> None:
    """Restore :func:`rng_state` (or an older checkpoint's bare CPU state) on whatever device is here now.

    The CPU state must be a CPU ``ByteTensor`` (a state loaded onto a GPU makes ``torch.set_rng_state``
    raise ``TypeError``); CUDA states are restored when this machine has GPUs and skipped (with a note)
    when the checkpoint was written without them.
    """
    if isinstance(st, torch.Tensor):
        st = {"cpu": st}
    torch.set_rng_state(st["cpu"].detach().to("cpu", torch.uint8))
    if not torch.cuda.is_available():
        return
    cuda = st.get("cuda")
    if not cuda:
        log("note: the checkpoint holds no CUDA RNG state (written without a GPU): dropout masks from here on "
            "differ from an uninterrupted GPU run")
        return
    n = min(len(cuda), torch.cuda.device_count())
    for i in range(n):
        torch.cuda.set_rng_state(cuda[i].detach().to("cpu", torch.uint8), i)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Read a checkpoint on the CPU (whatever device wrote it); ``CheckpointError`` naming it if it is damaged."""
    path = Path(path)
    advice = "delete it to retrain that model from scratch (models already finished are kept)"
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # truncated, overwritten, not a torch file, written by an incompatible version
        why = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0][:160]
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(err).__name__}: {why}); {advice}") from None
    missing = sorted({"model", "optim", "state", "rng"} - set(ck)) if isinstance(ck, dict) else ["everything"]
    if missing:
        raise CheckpointError(f"checkpoint {path} is incomplete (missing {', '.join(missing)}); {advice}")
    return ck


def _remove_stale_temps(ckpt_path: Path) -> None:
    """A run killed between writing a checkpoint's temporary file and the rename leaves the temporary file."""
    for p in ckpt_path.parent.glob(f".{ckpt_path.name}.*.tmp"):
        p.unlink(missing_ok=True)


#: target tokens per forward/backward pass on the CPU when ``micro_batch_tokens`` is None (bounds memory)
CPU_MICRO_TOKENS = 4000


def micro_batch_tokens(prof: Profile, device: str) -> int | None:
    """Target tokens per pass: the profile's ``micro_batch_tokens``, else the whole batch on a GPU
    and at most :data:`CPU_MICRO_TOKENS` on the CPU (the gpu profile's 24k-token batch in one pass
    needs ~20 GB of CPU memory)."""
    if prof.micro_batch_tokens is not None:
        return prof.micro_batch_tokens
    return None if torch.device(device).type == "cuda" else CPU_MICRO_TOKENS


def split_batch(batch: list[int], tgt_lens: list[int], max_tokens: int) -> list[list[int]]:
    """Cut one batch into parts of at most ``max_tokens`` padded target tokens (by target length).

    A batch that fits stays whole (the same list); a single pair longer than ``max_tokens`` is a part of its own.
    """
    if len(batch) * max(tgt_lens[i] for i in batch) <= max_tokens:
        return [batch]
    parts, cur, width = [], [], 0
    for i in sorted(batch, key=lambda i: tgt_lens[i]):
        w = max(width, tgt_lens[i])
        if cur and (len(cur) + 1) * w > max_tokens:
            parts.append(cur)
            cur, w = [], tgt_lens[i]
        cur.append(i)
        width = w
    parts.append(cur)
    return parts


def process_seed(seed: int, rank: int) -> int:
    """The seed of process ``rank``'s dropout stream: every process of a torchrun job draws its own masks."""
    return seed + rank


def train_model(pe: str, seed: int, prof: Profile, data: dict, tok, model_dir: str | os.PathLike, *,
                resume: bool = False, device: str = "cpu", progress: bool = True, stop_after: int | None = None,
                ckpt_dir: str | os.PathLike | None = None, log=print, on_update=None) -> dict:
    """Train one model; returns ``{"model", "params", "updates", "wall_s", "tok_per_s", "epochs", "curve", ...}``
    (and ``peak_mem_gib``, the most GPU memory allocated while this model trained, on a GPU).

    ``data``: ``{"train": {"src", "tgt"}, "dev": {"src", "tgt"}}`` lists of token-id lists.
    ``model_dir`` receives ``metrics.jsonl``; ``ckpt_dir`` (default ``model_dir``) ``checkpoint.pt``.
    ``stop_after``: stop (as if killed) after this many updates, for testing ``resume``.
    ``on_update``: called with the training state (``step``, ``tokens``, ...) after every update
    (the calibration times a window of updates with it).
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    if torch.device(device).type == "cuda":  # a worker process may train several models in turn
        torch.cuda.init()  # a fresh process has no CUDA allocator yet: resetting its statistics would fail
        torch.cuda.reset_peak_memory_stats(device)
    ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else model_dir
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, metrics_path = ckpt_dir / "checkpoint.pt", model_dir / "metrics.jsonl"
    rank, world = dist_info()
    prec = Precision(resolve_precision(prof.precision, device), device)
    micro = micro_batch_tokens(prof, device)
    set_seed(seed)  # the same initial weights in every process
    scheme, options = scheme_of(pe)
    model = build_model(scheme, tok.vocab_size, pad_id=tok.pad_id, **prof.model_kwargs(), **options).to(device)
    if world > 1:
        set_seed(process_seed(seed, rank))  # ... but each process its own dropout masks
    fused = torch.device(device).type == "cuda"  # one kernel for every parameter's update on a GPU
    opt = torch.optim.Adam(model.parameters(), lr=prof.lr, betas=(0.9, 0.98), eps=1e-9, fused=fused or None)
    state = {"step": 0, "epoch": 0, "batch_idx": 0, "wall": 0.0, "tokens": 0}
    if resume:
        _remove_stale_temps(ckpt_path)
    if resume and ckpt_path.is_file():
        ck = load_checkpoint(ckpt_path)
        try:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optim"])  # moves the optimizer state to the parameters' device
            set_fused(opt, fused)  # the saved groups say how the writer stepped; this device decides here
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"checkpoint {ckpt_path} was made for another model or optimizer "
                                  f"({str(err).strip().splitlines()[0][:160]}); delete it to retrain that model "
                                  "from scratch, or use another --out folder") from None
        if ck.get("precision", prec.mode) != prec.mode:  # one model trains in one precision, as its result says
            raise CheckpointError(f"checkpoint {ckpt_path} was trained in {ck['precision']}, this run asks for "
                                  f"{prec.mode}; resume it with --set precision={ck['precision']}, or delete it to "
                                  f"retrain that model from scratch in {prec.mode}")
        if prec.scaler is not None and ck.get("scaler"):
            prec.scaler.load_state_dict(ck["scaler"])
        state = dict(ck["state"])
        window = state.pop("window", None)  # a checkpoint made between two log lines (on a signal)
        restore_rng_state(ck["rng"][rank] if rank < len(ck["rng"]) else ck["rng"][0], log)
        log(f"resumed {model_dir.name} from update {state['step']}")
    elif resume:
        log(f"no checkpoint {ckpt_path}; starting {model_dir.name} from scratch")
    if not (resume and ckpt_path.is_file()):
        window = None
    curve = read_metrics(metrics_path, state["step"])
    if rank == 0:
        atomic_write_text(metrics_path, "".join(json.dumps(r) + "\n" for r in curve))
    for _, attn in model.attention_layers():
        attn.fused_qkv = prof.fused_qkv
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.startswith("cuda") else None)
    # what the updates call; net is kept for no_sync and as the fallback
    backend = COMPILE_BACKENDS.get(torch.device(device).type) if prof.compile else None
    fwd = torch.compile(net, backend=backend) if backend is not None else net
    if prof.compile and backend is None:
        log(f"{model_dir.name}: compile=true is not used on {device} (no compile backend for it): training uncompiled")
    train = data["train"]
    src_lens = [len(r) + 1 for r in train["src"]]
    tgt_lens = [len(r) + 1 for r in train["tgt"]]
    cache_epoch, batches, on_device = None, [], []
    # the gpu profile: every pair's ids on the device once; a batch is one gather there
    store = DeviceData(train["src"], train["tgt"], tok.pad_id, tok.bos_id, tok.eos_id, device) if prof.device_data \
        else None
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=prof.max_steps, initial=state["step"], desc=f"{pe} seed {seed}", unit="upd", leave=False)
    if state["step"] == 0 and rank == 0 and not curve:
        val = validation_loss(model, data["dev"], tok, device, prec)
        curve.append({"step": 0, "wall_s": 0.0, "train_loss": None, "val_loss": round(val, 4), "tok_per_s": None,
                      "lr": 0.0})
        with open(metrics_path, "a") as f:
            f.write(json.dumps(curve[-1]) + "\n")

    def forward_backward(fwd, parts, n_real, at):
        """The update's loss (a device scalar) with its gradients added to the parameters, part by part."""
        loss_sum = None
        for k, part in enumerate(parts):  # one pass per part; the gradients add up to the whole batch's
            if store is None:
                s, t_in, t_out = collate([train["src"][i] for i in part], [train["tgt"][i] for i in part],
                                         tok.pad_id, tok.bos_id, tok.eos_id)
                s = s.to(device, non_blocking=True)
                t_in, t_out = t_in.to(device, non_blocking=True), t_out.to(device, non_blocking=True)
            elif len(parts) == 1:
                s, t_in, t_out = store.gather(*on_device[at])
            else:
                s, t_in, t_out = store.gather(torch.tensor(part).to(device, non_blocking=True), *store.widths(part))
            last = k == len(parts) - 1
            pad_mask = s == tok.pad_id
            if fwd is not net:  # batch and length sizes symbolic from the first batch: one graph for every shape
                for t in (s, t_in, pad_mask):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
                    torch._dynamo.maybe_mark_dynamic(t, 1)
            with net.no_sync() if world > 1 and not last else contextlib.nullcontext():  # DDP: reduce once
                if prof.loss_chunk is None:
                    with prec.autocast():
                        logits = fwd(s, t_in, src_key_padding_mask=pad_mask)
                    flat = logits.float().reshape(-1, logits.shape[-1]), t_out.reshape(-1)
                    del logits
                    if len(parts) == 1:
                        loss = F.cross_entropy(*flat, ignore_index=tok.pad_id, label_smoothing=prof.label_smoothing)
                    else:  # the mean over the whole batch's tokens, in parts
                        loss = F.cross_entropy(*flat, ignore_index=tok.pad_id, label_smoothing=prof.label_smoothing,
                                               reduction="sum") / n_real
                    del flat
                else:  # the output layer and the loss a few thousand rows at a time: no (tokens, vocab) fp32 copy
                    with prec.autocast():
                        states = fwd(s, t_in, src_key_padding_mask=pad_mask, states=True)
                        loss = chunked_cross_entropy(states, model.output_weight(), t_out, ignore_index=tok.pad_id,
                                                     label_smoothing=prof.label_smoothing, reduction="sum",
                                                     chunk=prof.loss_chunk) / n_real
                    del states
                # fp16: scale the loss so that small gradients survive; unscaled again before clipping
                (prec.scaler.scale(loss) if prec.scaler is not None else loss).backward()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            del loss
        return loss_sum

    model.train()
    # the summed loss stays on the device and is read once per log line: no host sync per update
    run_loss, run_tok, run_n, t_log = torch.zeros((), device=device), 0, 0, time.perf_counter()
    if window is not None:  # the log line's window the checkpoint was cut in: the curve goes on as if uncut
        run_loss, run_tok, run_n = torch.tensor(window["loss"], device=device), window["tok"], window["n"]
    t_last = time.perf_counter()
    signals = CheckpointSignals(prof.ckpt_on_signal, log)
    with signals:  # the gpu profile: SIGUSR1 / SIGTERM write a checkpoint after the update under way
        while state["step"] < prof.max_steps:
            if cache_epoch != state["epoch"]:
                batches = make_batches(src_lens, tgt_lens, prof.batch_tokens, seed * 100003 + state["epoch"],
                                       prof.bucket)
                per = len(batches) // world
                batches = batches[rank * per : (rank + 1) * per] if world > 1 else batches
                cache_epoch = state["epoch"]
                if store is not None:  # the epoch's batch indices in one copy
                    on_device = store.upload_batches(batches)
            if state["batch_idx"] >= len(batches):
                state["epoch"] += 1
                state["batch_idx"] = 0
                continue
            b = batches[state["batch_idx"]]
            state["batch_idx"] += 1
            for g in opt.param_groups:
                g["lr"] = lr_at(state["step"] + 1, prof.lr, prof.warmup)
            n_real = sum(tgt_lens[i] for i in b)  # target tokens of the update, counted on the host
            parts = split_batch(b, tgt_lens, micro) if micro is not None else [b]
            opt.zero_grad(set_to_none=True)
            try:
                loss_sum = forward_backward(fwd, parts, n_real, state["batch_idx"] - 1)
            except (torch.OutOfMemoryError, KeyboardInterrupt):
                raise
            except Exception as err:  # noqa: BLE001 (any compiler failure): the same update, eager
                if fwd is net:
                    raise
                why = " ".join(str(err).strip().split("\n\n")[0].split())[:200]  # the message's first paragraph
                log(f"{model_dir.name}: torch.compile failed at update {state['step'] + 1} ({type(err).__name__}: "
                    f"{why}); training on uncompiled")
                fwd = net
                opt.zero_grad(set_to_none=True)
                loss_sum = forward_backward(fwd, parts, n_real, state["batch_idx"] - 1)
            if prec.scaler is not None:  # skips the update when a gradient is inf/nan and lowers the scale
                prec.scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), prof.clip_norm)
                prec.scaler.step(opt)
                prec.scaler.update()
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), prof.clip_norm)
                opt.step()
            state["step"] += 1
            n_tok = n_real * world
            state["tokens"] += n_tok
            run_loss += loss_sum
            run_tok += n_tok
            run_n += 1
            step = state["step"]
            log_now = step % prof.log_every == 0 or step == prof.max_steps
            train_loss = float(run_loss) / run_n if log_now else None  # the one read from the device per log line
            now = time.perf_counter()
            state["wall"] += now - t_last
            t_last = now
            if on_update is not None:
                on_update(state)
            if bar is not None:
                bar.update(1)
            if log_now:
                row = {"step": step, "wall_s": round(state["wall"], 2), "train_loss": round(train_loss, 4),
                       "val_loss": None, "tok_per_s": round(run_tok / max(now - t_log, 1e-9), 1),
                       "lr": round(opt.param_groups[0]["lr"], 7)}
                if step % prof.val_every == 0 or step == prof.max_steps:
                    if rank == 0:
                        row["val_loss"] = round(validation_loss(model, data["dev"], tok, device, prec), 4)
                        if bar is not None:
                            bar.set_postfix(val=row["val_loss"])
                if rank == 0:
                    curve.append(row)
                    with open(metrics_path, "a") as f:
                        f.write(json.dumps(row) + "\n")
                run_loss, run_tok, run_n = torch.zeros((), device=device), 0, 0
                if (prof.ckpt_every and step % prof.ckpt_every == 0) or step == prof.max_steps:
                    _save(model, opt, prec, state, ckpt_path, step == prof.max_steps)
                    signals.saved_at = step
                t_log = t_last = time.perf_counter()
            if signals.pending is not None:  # SIGUSR1 or SIGTERM arrived during this update
                if signals.saved_at != step:
                    window = {"loss": float(run_loss), "tok": run_tok, "n": run_n} if run_n else None
                    _save(model, opt, prec, dict(state, window=window) if window else state, ckpt_path, False)
                    signals.saved_at = step
                if signals.take() == signal.SIGTERM:
                    log(f"{metrics_path.parent.name}: SIGTERM: checkpoint at update {step} written; stopping")
                    break
                log(f"{metrics_path.parent.name}: SIGUSR1: checkpoint at update {step} written; going on")
                t_last = time.perf_counter()  # the checkpoint's time is not training time
            if stop_after is not None and step >= stop_after:
                break
    if signals.received == signal.SIGTERM:  # checkpointed: now end as SIGTERM would have
        signal.raise_signal(signal.SIGTERM)
    if bar is not None:
        bar.close()
    epochs = state["tokens"] / max(sum(tgt_lens), 1)
    out = {"model": model, "params": model.num_parameters(), "updates": state["step"], "wall_s": round(state["wall"], 1),
           "tok_per_s": round(state["tokens"] / max(state["wall"], 1e-9), 1), "epochs": round(epochs, 3),
           "curve": curve, "finished": state["step"] >= prof.max_steps, "precision": prec.mode}
    if prof.compile:  # False when the model trained uncompiled (the compiler failed, or none for this device)
        out["compiled"] = fwd is not net
    if torch.device(device).type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return out


def set_fused(opt: torch.optim.Optimizer, fused: bool) -> None:
    """Make a loaded Adam step with (``fused``) or without the fused kernel, whatever the checkpoint's writer
    used: the fused kernel keeps each parameter's step count on the parameter's device, the other on the CPU."""
    for group in opt.param_groups:
        if bool(group.get("fused")) == fused:
            continue
        group["fused"] = fused or None
        for p in group["params"]:
            st = opt.state.get(p)
            if st and torch.is_tensor(st.get("step")):
                st["step"] = st["step"].to(torch.float32).to(p.device if fused else "cpu")


class CheckpointSignals:
    """While entered (``enabled`` and on the main thread): SIGUSR1 and SIGTERM set :attr:`pending` for the
    training loop, which writes a checkpoint after the update under way; the handlers before are restored on
    exit.  :attr:`received` keeps the SIGTERM, which :func:`train_model` then delivers to the handler before."""

    NAMES = ("SIGTERM", "SIGUSR1")

    def __init__(self, enabled: bool, log=print):
        self.enabled, self.log = enabled, log
        self.pending = self.received = self.saved_at = None
        self.before: dict = {}

    def __enter__(self):
        if self.enabled and threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                sig = getattr(signal, name, None)
                if sig is not None:
                    self.before[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.pending != signal.SIGTERM:  # a SIGTERM is not downgraded by a later SIGUSR1
            self.pending = signum

    def take(self) -> int:
        sig, self.pending = self.pending, None
        if sig == signal.SIGTERM:
            self.received = sig
        return sig

    def __exit__(self, *exc):
        for sig, handler in self.before.items():
            signal.signal(sig, handler)
        self.before = {}
        return False


def _save(model, opt, prec: Precision, state, path: Path, finished: bool) -> None:
    """Atomic checkpoint on rank 0, with every process's RNG states (all ranks must call this)."""
    rank, world = dist_info()
    rngs = [rng_state()]
    if world > 1:
        rngs = [None] * world
        torch.distributed.all_gather_object(rngs, rng_state())
    if rank == 0:
        atomic_torch_save({"model": model.state_dict(), "optim": opt.state_dict(), "state": dict(state), "rng": rngs,
                           "scaler": prec.scaler.state_dict() if prec.scaler is not None else None,
                           "precision": prec.mode, "finished": finished, "config": model.config}, path)
    barrier()


def profile_dict(prof: Profile) -> dict:
    return asdict(prof)
