"""Training profiles and the training loop of the WMT14 experiment.

The recipe is the base Transformer's (Vaswani et al. 2017, arXiv:1706.03762,
section 5), scaled down: batches holding about ``batch_tokens`` target tokens
built from length buckets, label smoothing, Adam (beta2 0.98) with the learning
rate

    lr(step) = peak * min(step / warmup, sqrt(warmup / step))

(linear warmup, then inverse-square-root decay), gradient clipping, and a
validation loss (NLL per target token, no smoothing) on a fixed dev subset.
Checkpoints (model, optimizer, step, position in the epoch, RNG state) are
written atomically, so ``--resume`` continues a killed run on the same curve.
Under ``torchrun`` each process trains on its own share of every epoch's
batches and DistributedDataParallel averages the gradients (gloo on CPU,
NCCL on GPUs).  Used by ``python -m posenc_lib.wmt14``; notebooks/12 shows it.
"""
from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .evaluate import pad_batch
from .model import build_model
from .utils import atomic_torch_save, set_seed


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
    lr: float = 2e-3  # peak learning rate
    warmup: int = 120  # updates; scale to the run's real number of updates
    max_steps: int = 1200  # updates per model
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    bf16: bool = False  # bf16 autocast (GPU only)
    # monitoring
    log_every: int = 50  # metrics line every N updates
    val_every: int = 250  # validation loss every N updates (multiple of log_every)
    val_pairs: int = 300  # fixed random newstest2013 subset (pairs <= max_tokens) for validation loss
    ckpt_every: int = 250  # checkpoint every N updates (multiple of log_every)
    # evaluation
    eval_limit: int | None = None  # score only the first N sentences of each test set (None: all)
    beam: int = 1  # 1 = greedy; e.g. 4 for beam search
    length_penalty: float = 0.6  # GNMT alpha, beam search only
    bertscore: bool = True
    bootstrap_samples: int = 1000

    def __post_init__(self):
        for name in ("val_every", "ckpt_every"):
            if getattr(self, name) % self.log_every:
                raise ValueError(f"{name}={getattr(self, name)} must be a multiple of log_every={self.log_every}")

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
    # One GPU (H100 class), bf16: larger model, longer sentences; four models + evaluation in ~20 min.
    "gpu": Profile(
        name="gpu", d_model=256, n_heads=8, num_layers=4, num_decoder_layers=4, dim_feedforward=1024,
        vocab_size=16000, max_tokens=64, batch_tokens=12000, lr=1e-3, warmup=600, max_steps=4000, bf16=True,
        log_every=100, val_every=500, val_pairs=500, ckpt_every=500,
    ),
}  # fmt: skip


def get_profile(name: str, overrides: dict | None = None) -> Profile:
    """A profile by name with ``overrides`` (strings are converted to the field's type)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid choices: {', '.join(map(repr, PROFILES))}")
    types = {f.name: f.type for f in fields(Profile)}
    conv = {}
    for key, value in (overrides or {}).items():
        if key not in types or key == "name":
            raise ValueError(f"unknown profile field {key!r}; valid fields: {', '.join(t for t in types if t != 'name')}")
        if isinstance(value, str):
            t = str(types[key])
            if value.lower() == "none" and "None" in t:
                value = None
            elif t.startswith("bool"):
                value = value.lower() in ("1", "true", "yes")
            elif t.startswith("int"):
                value = int(value)
            elif t.startswith("float"):
                value = float(value)
        conv[key] = value
    return replace(PROFILES[name], **conv)


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
def make_batches(src_lens: list[int], tgt_lens: list[int], batch_tokens: int, seed: int) -> list[list[int]]:
    """Token-count batches from length buckets: shuffle, sort chunks by length, cut, shuffle the batches.

    A batch of ``n`` pairs whose longest target has ``T`` tokens costs ``n * T <= batch_tokens``.
    """
    rng = random.Random(seed)
    idx = list(range(len(src_lens)))
    rng.shuffle(idx)
    batches, chunk = [], 100 * max(1, batch_tokens // 16)
    for start in range(0, len(idx), chunk):
        part = sorted(idx[start : start + chunk], key=lambda i: (tgt_lens[i], src_lens[i]))
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
def validation_loss(model, dev: dict, tok, device: str, bf16: bool = False, batch: int = 64) -> float:
    """Mean NLL per target token (no label smoothing) on the fixed dev subset."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(dev["src"]), batch):
        s, t_in, t_out = collate(dev["src"][i : i + batch], dev["tgt"][i : i + batch], tok.pad_id, tok.bos_id,
                                 tok.eos_id)
        s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16 and device.startswith("cuda")):
            logits = model(s, t_in, src_key_padding_mask=s == tok.pad_id)
        nll = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t_out.reshape(-1),
                              ignore_index=tok.pad_id, reduction="sum")
        total += float(nll)
        count += int((t_out != tok.pad_id).sum())
    model.train(was)
    return total / max(count, 1)


def _read_metrics(path: Path, upto: int) -> list[dict]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["step"] <= upto]


def train_model(pe: str, seed: int, prof: Profile, data: dict, tok, model_dir: str | os.PathLike, *,
                resume: bool = False, device: str = "cpu", progress: bool = True, stop_after: int | None = None,
                log=print) -> dict:
    """Train one model; returns ``{"model", "params", "updates", "wall_s", "tok_per_s", "epochs", "curve"}``.

    ``data``: ``{"train": {"src", "tgt"}, "dev": {"src", "tgt"}}`` lists of token-id lists.
    ``stop_after``: stop (as if killed) after this many updates, for testing ``resume``.
    """
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, metrics_path = model_dir / "checkpoint.pt", model_dir / "metrics.jsonl"
    rank, world = dist_info()
    set_seed(seed)
    model = build_model(pe, tok.vocab_size, pad_id=tok.pad_id, **prof.model_kwargs()).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=prof.lr, betas=(0.9, 0.98), eps=1e-9)
    state = {"step": 0, "epoch": 0, "batch_idx": 0, "wall": 0.0, "tokens": 0}
    if resume and ckpt_path.is_file():
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        state = ck["state"]
        torch.set_rng_state(ck["rng"][rank] if rank < len(ck["rng"]) else ck["rng"][0])
        log(f"resumed {model_dir.name} from update {state['step']}")
    elif resume:
        log(f"no checkpoint in {model_dir}; starting {model_dir.name} from scratch")
    curve = _read_metrics(metrics_path, state["step"])
    if rank == 0:
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in curve))
    net = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.startswith("cuda") else None)
    train = data["train"]
    src_lens = [len(r) + 1 for r in train["src"]]
    tgt_lens = [len(r) + 1 for r in train["tgt"]]
    cache_epoch, batches = None, []
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=prof.max_steps, initial=state["step"], desc=f"{pe} seed {seed}", unit="upd", leave=False)
    if state["step"] == 0 and rank == 0 and not curve:
        val = validation_loss(model, data["dev"], tok, device, prof.bf16)
        curve.append({"step": 0, "wall_s": 0.0, "train_loss": None, "val_loss": round(val, 4), "tok_per_s": None,
                      "lr": 0.0})
        with open(metrics_path, "a") as f:
            f.write(json.dumps(curve[-1]) + "\n")
    model.train()
    run_loss, run_tok, run_n, t_log = 0.0, 0, 0, time.perf_counter()
    t_last = time.perf_counter()
    while state["step"] < prof.max_steps:
        if cache_epoch != state["epoch"]:
            batches = make_batches(src_lens, tgt_lens, prof.batch_tokens, seed * 100003 + state["epoch"])
            per = len(batches) // world
            batches = batches[rank * per : (rank + 1) * per] if world > 1 else batches
            cache_epoch = state["epoch"]
        if state["batch_idx"] >= len(batches):
            state["epoch"] += 1
            state["batch_idx"] = 0
            continue
        b = batches[state["batch_idx"]]
        state["batch_idx"] += 1
        s, t_in, t_out = collate([train["src"][i] for i in b], [train["tgt"][i] for i in b], tok.pad_id, tok.bos_id,
                                 tok.eos_id)
        s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(state["step"] + 1, prof.lr, prof.warmup)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=prof.bf16 and device.startswith("cuda")):
            logits = net(s, t_in, src_key_padding_mask=s == tok.pad_id)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), t_out.reshape(-1),
                               ignore_index=tok.pad_id, label_smoothing=prof.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), prof.clip_norm)
        opt.step()
        state["step"] += 1
        n_tok = int((t_out != tok.pad_id).sum()) * world
        state["tokens"] += n_tok
        run_loss += loss.item()
        run_tok += n_tok
        run_n += 1
        now = time.perf_counter()
        state["wall"] += now - t_last
        t_last = now
        if bar is not None:
            bar.update(1)
        step = state["step"]
        if step % prof.log_every == 0 or step == prof.max_steps:
            row = {"step": step, "wall_s": round(state["wall"], 2), "train_loss": round(run_loss / run_n, 4),
                   "val_loss": None, "tok_per_s": round(run_tok / max(now - t_log, 1e-9), 1),
                   "lr": round(opt.param_groups[0]["lr"], 7)}
            if step % prof.val_every == 0 or step == prof.max_steps:
                if rank == 0:
                    row["val_loss"] = round(validation_loss(model, data["dev"], tok, device, prof.bf16), 4)
                    if bar is not None:
                        bar.set_postfix(val=row["val_loss"])
            if rank == 0:
                curve.append(row)
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            run_loss, run_tok, run_n = 0.0, 0, 0
            if step % prof.ckpt_every == 0 or step == prof.max_steps:
                _save(model, opt, state, ckpt_path, step == prof.max_steps)
            t_log = t_last = time.perf_counter()
        if stop_after is not None and step >= stop_after:
            break
    if bar is not None:
        bar.close()
    epochs = state["tokens"] / max(sum(tgt_lens), 1)
    return {"model": model, "params": model.num_parameters(), "updates": state["step"], "wall_s": round(state["wall"], 1),
            "tok_per_s": round(state["tokens"] / max(state["wall"], 1e-9), 1), "epochs": round(epochs, 3),
            "curve": curve, "finished": state["step"] >= prof.max_steps}


def _save(model, opt, state, path: Path, finished: bool) -> None:
    """Atomic checkpoint on rank 0, with every process's RNG state (all ranks must call this)."""
    rank, world = dist_info()
    rng = torch.get_rng_state()
    rngs = [rng]
    if world > 1:
        dev = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"  # NCCL gathers GPU tensors only
        rngs = [torch.empty_like(rng, device=dev) for _ in range(world)]
        torch.distributed.all_gather(rngs, rng.to(dev))
        rngs = [r.cpu() for r in rngs]
    if rank == 0:
        atomic_torch_save({"model": model.state_dict(), "optim": opt.state_dict(), "state": dict(state), "rng": rngs,
                           "finished": finished, "config": model.config}, path)
    barrier()


def profile_dict(prof: Profile) -> dict:
    return asdict(prof)
