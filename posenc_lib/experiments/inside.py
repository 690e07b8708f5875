"""Inside a trained model: what small character LMs do with positions (RoPE, ALiBi, none; causal and not).

The experiment behind notebooks/16_inside_a_trained_model.ipynb.  Lesson 14's data and recipe (Europarl
English as characters, random windows of ``train_len`` = 64 characters, AdamW, 1500 updates) train four
models of lesson 15's shape (4 layers, 2 heads of 32 dimensions: 16 rotation pairs per head):

* ``rope``, ``alibi``, ``nope``: causal language models (:class:`~posenc_lib.models.causal_lm.CausalLM`) with
  RoPE (half-split), ALiBi, or no positional encoding;
* ``nope-bidir``: the same stack with no causal mask and no positions, trained to fill in 15% masked
  characters (:class:`~posenc_lib.models.causal_lm.MaskedLM`).

Then, on held-out text, with the tools of posenc_lib/experiments/inside_tools.py:

* every model: a linear probe for the absolute position on every layer's hidden states (Haviv et al. 2022,
  arXiv:2203.16634), trained on ``probe_windows`` windows and scored on as many others;
* the causal models: perplexity at ``band_lengths``; the attention weight on the first token of a window
  per layer and head (Xiao et al. 2024, arXiv:2309.17453; Gu et al. 2025, arXiv:2410.10781); ``streams``
  streams of ``stream_len`` characters read through a rolling cache of ``cache`` tokens with and without
  the first ``sinks`` kept (StreamingLLM), beside dense attention and the sliding window recomputed;
* ``rope``: the norm of each rotation pair of q and k per layer (Barbero et al. 2024, arXiv:2410.06205), the
  mean score at each distance, and the perplexity with the ``band_pairs`` slowest or fastest pairs frozen
  (frequency 0, as p-RoPE does) or dropped (q and k components zeroed).

With ``--bands``, the RoPE model of each seed is trained again (the same configuration and seed: the same
model, update for update) and read with a *norm-matched middle band* ablated as well: the ``band_pairs``
contiguous pairs, overlapping neither end band, whose q.k norm weight (:func:`pair_weight`) is closest to
that of the fastest band (:func:`matched_band`); the file records the end bands again beside it.

With ``--decay``, the RoPE model of each seed is trained again in the same way and its mean score by distance is
split (:func:`inside_tools.decay_parts`): the unrotated pair products ``E[conj(q_j) k_j]`` at each distance, which
must give back the rotated score to float tolerance, into the rotation of their distance-averaged value, their
change with distance, and the two together (Barbero et al.'s argument, measured).

With ``--cache-controls``, the causal models of ``--models`` are trained again in the same way and their rolling
cache read with controls that separate place from content in the first tokens it keeps (:data:`CACHE_CONTROLS`:
spaces or another stream's first characters in their place; the first-place head, the other heads of its layer,
layer 1 or the layers above blocked from them; half the cache), beside the training windows read with that head,
or every head, blocked from the first token (which, without positions, deletes it).  Each file records the CPU
time of its cell (``cpu_seconds``).

Each (model, seed) writes one JSON file into ``--out`` when it finishes (temporary file + rename).  The same
command run again resumes (posenc_lib/experiments/runner.py): finished files made with this configuration are
kept and only the missing ones are made; a folder made with another configuration is refused.

Command line::

    python -m posenc_lib.experiments.inside --profile smoke --out runs/inside-smoke
    python -m posenc_lib.experiments.inside --profile course --seeds 0,1,2 --out results/inside --jobs 2
    python -m posenc_lib.experiments.inside --profile course --time-updates 20   # time it first
    python -m posenc_lib.experiments.inside --profile course --bands --seeds 0,1,2 --out results/inside/bands
    python -m posenc_lib.experiments.inside --profile course --decay --seeds 0,1,2 --out results/inside/decay
    python -m posenc_lib.experiments.inside --profile course --cache-controls --models nope --out results/inside/cache_controls

Cost of the ``course`` profile (4 models x 3 seeds): see the README, which quotes the timing made with
``--time-updates``.  ``smoke``: a few seconds per model; it learns nothing.
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..models.causal_lm import CausalLM, MaskedLM
from ..checks import check_positive_int, unique_choices
from ..cli import CliParser, timing_command
from ..files import atomic_write_json
from . import charlm, runner
from . import inside_tools as tools

SCHEMA = "posenc.inside/1"
#: what a result file holds
RECORDS = runner.Schema(SCHEMA, ("schema", "model", "seed", "config", "probe"))
BANDS_SCHEMA = "posenc.inside-bands/1"
DECAY_SCHEMA = "posenc.inside-decay/1"
CONTROLS_SCHEMA = "posenc.inside-cache-controls/1"


@dataclass(frozen=True)
class InsideConfig:
    """Everything that defines a run; the same for every model and seed."""

    name: str = "course"
    # -- data: lesson 14's characters of the shipped Europarl English side --------------------------
    train_lines: int = 40000  # training text: the first lines of train.en
    eval_offset: int = 260000  # held-out text starts at this line: every measurement reads it
    eval_chars: int = 32768
    min_char_count: int = 20
    # -- the models: lesson 15's shape, head_dim 32 (16 rotation pairs) ---------------------------
    d_model: int = 64
    n_heads: int = 2
    num_layers: int = 4
    dim_feedforward: int = 256
    # -- training: lesson 14's recipe -------------------------------------------------------------
    train_len: int = 64
    steps: int = 1500
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 100
    grad_clip: float = 1.0
    mask_prob: float = 0.15  # share of characters the masked LM fills in
    # -- measurements ----------------------------------------------------------------------------
    probe_windows: int = 256  # held-out windows of train_len to fit each probe; as many others to score it
    probe_steps: int = 100  # L-BFGS iterations of the logistic probe
    band_pairs: int = 4  # rotation pairs frozen or dropped at each end of the ladder
    band_lengths: tuple[int, ...] = (64, 256)  # perplexity at these window lengths
    sink_windows: int = 64  # windows of train_len for the attention weight on the first token
    sink_updates: tuple[int, ...] = (0, 100, 250, 500, 1000, 1500)  # ... measured after these updates
    cache: int = 64  # rolling cache size, in tokens
    sinks: int = 4  # first tokens kept in the cache
    streams: int = 8
    stream_len: int = 512
    threads: int = 1

    def __post_init__(self):
        for f in ("train_lines", "eval_offset", "eval_chars", "min_char_count", "d_model", "n_heads", "num_layers",
                  "dim_feedforward", "train_len", "steps", "batch_size", "warmup", "probe_windows", "probe_steps",
                  "band_pairs", "sink_windows", "cache", "streams", "stream_len", "threads"):  # fmt: skip
            check_positive_int(f, getattr(self, f))
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model={self.d_model} must split into n_heads={self.n_heads} heads of even size")
        if 2 * self.band_pairs > self.d_model // self.n_heads // 2:
            raise ValueError(f"band_pairs={self.band_pairs}: two bands must fit in the "
                             f"{self.d_model // self.n_heads // 2} pairs of a head")  # fmt: skip
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must lie in (0, 1), got {self.mask_prob}")
        if not 0 <= self.sinks < self.cache < self.stream_len:
            raise ValueError(f"need 0 <= sinks < cache < stream_len, got {self.sinks}, {self.cache}, {self.stream_len}")
        for what, need in (("the probe's windows", 2 * self.probe_windows * self.train_len),
                           ("the attention windows", self.sink_windows * self.train_len),
                           ("the streams", self.streams * self.stream_len),
                           ("the longest band length", max(self.band_lengths, default=0) + 1)):  # fmt: skip
            if need > self.eval_chars:
                raise ValueError(f"eval_chars={self.eval_chars} is too short for {what} ({need} characters)")
        if not self.band_lengths or any(check_positive_int("band length", n) < 2 for n in self.band_lengths):
            raise ValueError(f"band_lengths must be lengths >= 2, got {self.band_lengths}")
        if not self.sink_updates or any(not isinstance(u, int) or not 0 <= u <= self.steps for u in self.sink_updates):
            raise ValueError(f"sink_updates must be updates in 0..steps={self.steps}, got {self.sink_updates}")
        if self.train_len < 3:
            raise ValueError(f"train_len={self.train_len}: the first-token measurements need windows of >= 3")


#: ``course``: the lesson's numbers (timed with ``--time-updates``; see results/README.md)
COURSE = InsideConfig()
#: ``smoke``: seconds per model, for tests and the lesson before the course run exists; learns nothing
SMOKE = replace(COURSE, name="smoke", train_lines=3000, eval_chars=4096, d_model=32, n_heads=2, num_layers=2,
                dim_feedforward=64, train_len=16, steps=30, batch_size=8, warmup=5, probe_windows=32, probe_steps=30,
                band_pairs=2, band_lengths=(16, 64), sink_windows=16, sink_updates=(0, 10, 30), cache=16, sinks=2, streams=2, stream_len=64)  # fmt: skip
PROFILES = {"course": COURSE, "smoke": SMOKE}

#: name -> (scheme, options, model class)
MODELS: dict[str, tuple[str, dict, type]] = {
    "rope": ("rope", {"interleaved": False}, CausalLM),
    "alibi": ("alibi", {}, CausalLM),
    "nope": ("none", {}, CausalLM),
    "nope-bidir": ("none", {}, MaskedLM),
}
#: the ablations of the RoPE model's pairs: name -> (mode, which end of the ladder)
BANDS = {f"{mode}-{end}": (mode, end) for mode in tools.BAND_MODES for end in ("low", "high")}
#: the norm-matched middle band (``--bands``): name -> mode
MID_BANDS = {f"{mode}-mid": mode for mode in tools.BAND_MODES}


def make_model(name: str, cfg: InsideConfig, vocab_size: int) -> CausalLM:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid choices: {', '.join(MODELS)}")
    pe, options, cls = MODELS[name]
    extra = {"mask_prob": cfg.mask_prob} if cls is MaskedLM else {}
    return cls(vocab_size, pe, d_model=cfg.d_model, n_heads=cfg.n_heads, num_layers=cfg.num_layers,
               dim_feedforward=cfg.dim_feedforward, **options, **extra)  # fmt: skip


def band_pairs(cfg: InsideConfig, end: str) -> list[int]:
    """The ``band_pairs`` fastest (``"high"``, pair 0 up) or slowest (``"low"``) pairs of a head."""
    half = cfg.d_model // cfg.n_heads // 2
    if end not in ("low", "high"):
        raise ValueError(f"unknown end {end!r} of the frequency ladder; valid choices: low, high")
    return list(range(cfg.band_pairs)) if end == "high" else list(range(half - cfg.band_pairs, half))


def with_band(model: CausalLM, cfg: InsideConfig, band: str | None, pairs: Sequence[int] | None = None) -> CausalLM:
    """Read the trained RoPE ``model`` with one of :data:`BANDS` ablated (``None``: plain RoPE again), or one of
    :data:`MID_BANDS` on the given ``pairs`` (:func:`matched_band`)."""
    if band is None:
        model.set_scheme("rope", **MODELS["rope"][1])
        return model
    if band in MID_BANDS:
        if pairs is None:
            raise ValueError(f"band {band!r} needs its pairs (see matched_band)")
        mode = MID_BANDS[band]
    elif band in BANDS:
        mode, end = BANDS[band]
        pairs = band_pairs(cfg, end)
    else:
        raise ValueError(f"unknown band ablation {band!r}; valid choices: {', '.join([*BANDS, *MID_BANDS])}")
    entry = (tools.BandRoPE, {"pairs": list(pairs), "mode": mode, **MODELS["rope"][1]})
    model.set_scheme([entry] * cfg.num_layers)
    return model


def pair_weight(norms: dict[str, list]) -> np.ndarray:
    """How much of the score each rotation pair can carry: the mean query norm times the mean key norm of the
    pair (``norms`` as :func:`inside_tools.qk_pair_norms` gives them), summed over layers and heads: ``(pairs,)``."""
    q, k = np.asarray(norms["q"], dtype=np.float64), np.asarray(norms["k"], dtype=np.float64)
    if q.shape != k.shape or q.ndim != 3:
        raise ValueError(f"pair norms must be (layers, heads, pairs) for q and k alike, got {q.shape} and {k.shape}")
    return (q * k).sum(axis=(0, 1))


def matched_band(weight: Sequence[float], width: int) -> list[int]:
    """The ``width`` contiguous pairs that overlap neither end band (the ``width`` fastest, the ``width``
    slowest) whose summed ``weight`` is closest to the fastest band's; the faster band on a tie."""
    w = np.asarray(weight, dtype=np.float64)
    width = check_positive_int("width", width)
    if w.ndim != 1 or len(w) < 3 * width:
        raise ValueError(f"a middle band of {width} pairs needs at least {3 * width} pairs, got weights of shape {w.shape}")
    target = w[:width].sum()
    starts = range(width, len(w) - 2 * width + 1)
    best = min(starts, key=lambda s: (abs(w[s : s + width].sum() - target), s))
    return list(range(best, best + width))


# -- the measurements of one trained model --------------------------------------------------------
def measure(name: str, model: CausalLM, cfg: InsideConfig, eval_ids: torch.Tensor) -> dict[str, Any]:
    """Every measurement of the module docstring that applies to ``name``; JSON-ready."""
    L = cfg.train_len
    windows = eval_ids[: 2 * cfg.probe_windows * L].view(2 * cfg.probe_windows, L)
    rec: dict[str, Any] = {"probe": tools.probe_layers(model, windows[: cfg.probe_windows],
                                                       windows[cfg.probe_windows :], steps=cfg.probe_steps)}  # fmt: skip
    if not model.causal:
        return rec
    few = windows[: cfg.sink_windows]
    lengths = list(cfg.band_lengths)
    rec["nll"] = {"lengths": lengths, "none": [round(tools.mean_nll(model, eval_ids, n), 5) for n in lengths]}
    rec["sinks"] = tools.first_token_mass(model, few)
    filler = int(torch.bincount(few.flatten()).argmax())  # the commonest character (a space)
    rec["first_token"] = tools.first_token_swaps(model, few, filler)
    streams = eval_ids[: cfg.streams * cfg.stream_len].view(cfg.streams, cfg.stream_len)
    curves = {"dense": tools.stream_nll(model, streams, cache=None),
              "window": tools.stream_nll(model, streams, cache=cfg.cache, sinks=0),
              "sinks": tools.stream_nll(model, streams, cache=cfg.cache, sinks=cfg.sinks),
              "recompute": tools.recompute_nll(model, streams, cfg.cache)}  # fmt: skip
    bins = 8 if (cfg.stream_len - 1) >= 8 else 1
    rec["stream"] = {
        "cache": cfg.cache, "sinks": cfg.sinks, "stream_len": cfg.stream_len, "streams": cfg.streams,
        "past_window": {m: round(float(c[cfg.cache :].mean()), 5) for m, c in curves.items()},
        "by_bin": {m: [round(float(b.mean()), 5) for b in c.tensor_split(bins)] for m, c in curves.items()},
    }  # fmt: skip
    if name == "rope":
        rec["pair_norms"] = tools.qk_pair_norms(model, few, interleaved=MODELS["rope"][1]["interleaved"])
        rec["score_by_distance"] = tools.score_by_distance(model, few)
        for band in BANDS:
            with_band(model, cfg, band)
            rec["nll"][band] = [round(tools.mean_nll(model, eval_ids, n), 5) for n in lengths]
        with_band(model, cfg, None)
        rec["bands"] = {band: band_pairs(cfg, end) for band, (_, end) in BANDS.items()}
    return rec


# -- the jobs -------------------------------------------------------------------------------------
def result_path(out, name: str, seed: int) -> Path:
    return Path(out) / f"{name}_seed{seed}.json"


def train(name: str, seed: int, cfg: InsideConfig):
    """Train one model as the run does (the first-token weight read at ``cfg.sink_updates`` on the way):
    ``(vocab, eval_ids, model, losses, training seconds, first-token weight over training or None)``."""
    causal = MODELS[name][2] is CausalLM
    few: list[torch.Tensor] = []  # the held-out windows, read once the data is loaded
    over_training: dict[str, list] = {"updates": [], "mass": []}
    spent = [0.0]

    def sinks_now(u: int, model) -> None:
        t = time.perf_counter()
        if not few:
            few.append(charlm.data(cfg)[2][: cfg.sink_windows * cfg.train_len].view(cfg.sink_windows, cfg.train_len))
        over_training["updates"].append(u)
        over_training["mass"].append(tools.first_token_mass(model, few[0])["mass"])
        spent[0] += time.perf_counter() - t

    at = cfg.sink_updates if causal else ()
    vocab, eval_ids, model, losses, seconds = charlm.train_at_length(lambda v: make_model(name, cfg, v), seed, cfg, at=at,
                                                                 on_update=sinks_now if causal else None)  # fmt: skip
    return vocab, eval_ids, model, losses, seconds - spent[0], over_training if causal else None


def train_one(name: str, seed: int, cfg: InsideConfig, out) -> str:
    """Train one model, measure it, write its result file."""
    vocab, eval_ids, model, losses, seconds, over_training = train(name, seed, cfg)
    t1 = time.perf_counter()
    found = measure(name, model, cfg, eval_ids)
    if over_training is not None:
        found["sinks_over_training"] = over_training
    rec = {"schema": SCHEMA, "model": name, "seed": seed, "profile": cfg.name, "config": asdict(cfg),
           "num_parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(vocab),
           "train_loss": losses, "train_seconds": round(seconds, 1),
           "measure_seconds": round(time.perf_counter() - t1, 1), "torch": torch.__version__, **found}  # fmt: skip
    atomic_write_json(result_path(out, name, seed), rec)
    acc = found["probe"]["accuracy"]
    return f"done {name} seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, probe accuracy by layer " + \
        " ".join(f"{a:.2f}" for a in acc)


def _check_bands(rec: dict) -> None:
    pairs = rec["bands"].get("freeze-mid") if isinstance(rec.get("bands"), dict) else None
    if not isinstance(pairs, list) or not pairs or pairs[0] < len(pairs) or pairs != list(range(pairs[0], pairs[0] + len(pairs))):
        raise ValueError(f"its middle band {pairs!r} is not a run of contiguous pairs clear of the fastest band")


#: what a ``--bands`` result file holds
BAND_RECORDS = runner.Schema(BANDS_SCHEMA, ("schema", "model", "seed", "config", "train_loss", "pair_weight", "bands",
                                            "band_weight", "nll"), check=_check_bands)  # fmt: skip


def bands_path(out, seed: int) -> Path:
    return Path(out) / f"rope_seed{seed}.json"


def bands_one(seed: int, cfg: InsideConfig, out) -> str:
    """Train the RoPE model of ``seed`` again, read it with every end band and the norm-matched middle band
    ablated, write its ``--bands`` result file."""
    vocab, eval_ids, model, losses, seconds, _ = train("rope", seed, cfg)
    t1 = time.perf_counter()
    few = eval_ids[: cfg.sink_windows * cfg.train_len].view(cfg.sink_windows, cfg.train_len)
    weight = pair_weight(tools.qk_pair_norms(model, few, interleaved=MODELS["rope"][1]["interleaved"]))
    mid = matched_band(weight, cfg.band_pairs)
    bands = {**{band: band_pairs(cfg, end) for band, (_, end) in BANDS.items()}, **{band: mid for band in MID_BANDS}}
    lengths = list(cfg.band_lengths)
    nll = {"lengths": lengths, "none": [round(tools.mean_nll(model, eval_ids, n), 5) for n in lengths]}
    for band, pairs in bands.items():
        with_band(model, cfg, band, pairs)
        nll[band] = [round(tools.mean_nll(model, eval_ids, n), 5) for n in lengths]
    with_band(model, cfg, None)
    ends = {"high": band_pairs(cfg, "high"), "low": band_pairs(cfg, "low"), "mid": mid}
    rec = {"schema": BANDS_SCHEMA, "model": "rope", "seed": seed, "profile": cfg.name, "config": asdict(cfg),
           "train_loss": losses, "train_seconds": round(seconds, 1), "measure_seconds": round(time.perf_counter() - t1, 1),
           "torch": torch.__version__, "pair_weight": [round(float(v), 5) for v in weight],
           "band_weight": {e: round(float(weight[p].sum()), 5) for e, p in ends.items()}, "bands": bands, "nll": nll}  # fmt: skip
    atomic_write_json(bands_path(out, seed), rec)
    return (f"done rope bands seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, middle band {mid[0]}-{mid[-1]} "
            f"(weight {rec['band_weight']['mid']:.1f} against the fastest band's {rec['band_weight']['high']:.1f})")


def _run_rope_seeds(one, path, schema, cfg: InsideConfig, seeds: Sequence[int], out, jobs: int, log) -> None:
    """One retrained RoPE model per seed, ``one(seed, cfg, out)`` writing ``path(out, seed)`` (:func:`runner.run_grid`)."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    cells = [runner.Cell(path(out, s), one, (s, cfg, out)) for s in seeds]
    runner.run_grid(cells, out=out, schema=schema, config=asdict(cfg), jobs=jobs, log=log,
                    profiles={n: asdict(c) for n, c in PROFILES.items()})


def run_bands(cfg: InsideConfig, seeds: Sequence[int], out, *, jobs: int = 1, log=print) -> None:
    """Make every ``--bands`` result not yet in ``out`` (:func:`runner.run_grid`)."""
    _run_rope_seeds(bands_one, bands_path, BAND_RECORDS, cfg, seeds, out, jobs, log)


def load_bands(out) -> list[dict]:
    """Every ``--bands`` record in ``out``, checked."""
    return runner.load_results(out, BAND_RECORDS)


def _check_decay(rec: dict) -> None:
    err = rec["reconstruction_error"] if isinstance(rec.get("reconstruction_error"), dict) else {}
    if not isinstance(err.get("rope_sign"), (int, float)) or not err["rope_sign"] <= DECAY_TOLERANCE:
        raise ValueError(f"its pair products do not give back the model's rotated score (error {err.get('rope_sign')!r}, "
                         f"tolerance {DECAY_TOLERANCE})")  # fmt: skip


#: the largest difference allowed between the model's rotated mean score and the one made from the pair products
DECAY_TOLERANCE = 1e-4
#: the near distances of the fall (0 .. DECAY_NEAR - 1); the far ones are the far half of the window
DECAY_NEAR = 4
#: what a ``--decay`` result file holds
DECAY_RECORDS = runner.Schema(DECAY_SCHEMA, ("schema", "model", "seed", "config", "train_loss", "cpu_seconds",
                                             "pair_products", "score_by_distance", "reconstruction_error", "fall"),
                              check=_check_decay)  # fmt: skip


def decay_path(out, seed: int) -> Path:
    return Path(out) / f"rope_seed{seed}.json"


def decay_one(seed: int, cfg: InsideConfig, out) -> str:
    """Train the RoPE model of ``seed`` again, measure its unrotated pair products by distance on the windows of
    :func:`measure`'s mean score, check that they give back the rotated score, split its fall
    (:func:`inside_tools.decay_parts`) and write its ``--decay`` result file."""
    c0 = time.process_time()
    vocab, eval_ids, model, losses, seconds, _ = train("rope", seed, cfg)
    t1 = time.perf_counter()
    few = eval_ids[: cfg.sink_windows * cfg.train_len].view(cfg.sink_windows, cfg.train_len)
    p = tools.pair_products_by_distance(model, few, interleaved=MODELS["rope"][1]["interleaved"])
    thetas = tools.rope_thetas(cfg.d_model // cfg.n_heads, model.scheme.cache.base)
    actual = np.asarray(tools.score_by_distance(model, few, digits=None))
    err = {s: float(np.abs(tools.score_from_pair_products(p, thetas, s) - actual).max()) for s in (-1, 1)}
    parts = tools.decay_parts(p, thetas, near=DECAY_NEAR)

    def rounded(x: np.ndarray, digits: int = 5) -> list:
        return np.round(np.asarray(x, dtype=np.float64), digits).tolist()

    rec = {"schema": DECAY_SCHEMA, "model": "rope", "seed": seed, "profile": cfg.name, "config": asdict(cfg),
           "train_loss": losses, "train_seconds": round(seconds, 1), "measure_seconds": round(time.perf_counter() - t1, 1),
           "cpu_seconds": round(time.process_time() - c0, 1), "torch": torch.__version__, "windows": cfg.sink_windows,
           "near": DECAY_NEAR, "far_from": cfg.train_len // 2,
           "thetas": rounded(thetas, 8), "score_by_distance": rounded(actual),
           "reconstruction_error": {"rope_sign": err[-1], "other_sign": err[1]},
           "pair_products": {"re": rounded(p.real, 6), "im": rounded(p.imag, 6)},
           "fall": {n: rounded(v["fall"]) for n, v in parts.items()},
           "fall_by_pair": {n: rounded(v["fall_by_pair"]) for n, v in parts.items()}}  # fmt: skip
    atomic_write_json(decay_path(out, seed), rec)
    share = parts["rotation"]["fall"] / parts["actual"]["fall"]
    return (f"done rope decay seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, reconstruction error {err[-1]:.1e}, "
            f"rotation-only share of the fall by layer " + " ".join(f"{v:.2f}" for v in share))


def run_decay(cfg: InsideConfig, seeds: Sequence[int], out, *, jobs: int = 1, log=print) -> None:
    """Make every ``--decay`` result not yet in ``out`` (:func:`runner.run_grid`)."""
    _run_rope_seeds(decay_one, decay_path, DECAY_RECORDS, cfg, seeds, out, jobs, log)


def load_decay(out) -> list[dict]:
    """Every ``--decay`` record in ``out``, checked."""
    return runner.load_results(out, DECAY_RECORDS)


def decay_from_record(rec: dict) -> dict[str, dict[str, np.ndarray]]:
    """:func:`inside_tools.decay_parts` of a ``--decay`` record's stored pair products: ``(layers, ...)`` arrays."""
    p = np.asarray(rec["pair_products"]["re"]) + 1j * np.asarray(rec["pair_products"]["im"])
    return tools.decay_parts(p, np.asarray(rec["thetas"]), near=rec["near"], far_from=rec["far_from"])


#: the causal models ``--cache-controls`` can read
CAUSAL = tuple(n for n, (_, _, cls) in MODELS.items() if cls is CausalLM)
#: what a ``--cache-controls`` result file holds
CONTROL_RECORDS = runner.Schema(CONTROLS_SCHEMA, ("schema", "model", "seed", "config", "train_loss", "cpu_seconds",
                                                  "head", "stream", "dense"))  # fmt: skip
#: the rolling-cache readings of ``--cache-controls`` at the run's cache size: name -> what changes from ``sinks``
CACHE_CONTROLS = {
    "window": "no first tokens kept",
    "sinks": "the first tokens kept (the main run's reading)",
    "recompute": "the window recomputed at every step",
    "filler": "the kept first tokens are spaces put in front of the stream (same place, other content)",
    "other_first": "they are another stream's first tokens, put in front (same place, other text)",
    "blocked_head": "the first-place head may not attend to the kept first tokens",
    "blocked_other": "the other heads of its layer may not",
    "blocked_layer1": "no head of layer 1 may attend to them (where their keys and values are their characters alone)",
    "blocked_upper": "no head of layers 2 and up may attend to them (where their states were computed at places 0..)",
}


def controls_path(out, name: str, seed: int) -> Path:
    return Path(out) / f"{name}_seed{seed}.json"


def first_place_head(mass: Sequence[Sequence[float]]) -> tuple[int, int]:
    """``(layer, head)``, from 0, of the largest first-token weight ``mass (layers, heads)``."""
    m = np.asarray(mass, dtype=np.float64)
    if m.ndim != 2 or not m.size:
        raise ValueError(f"first-token weights must be (layers, heads), got shape {m.shape}")
    layer, head = np.unravel_index(int(m.argmax()), m.shape)
    return int(layer), int(head)


def cache_readings(model: CausalLM, cfg: InsideConfig, eval_ids: torch.Tensor, head: tuple[int, int], filler: int,
                   ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:  # fmt: skip
    """The readings of ``--cache-controls``: past-window NLL (steps ``cfg.cache`` on) of :data:`CACHE_CONTROLS` at
    ``cfg.cache`` and of window, sinks and recompute at half of it; and the NLL of windows of ``cfg.train_len``
    read densely, as they are, with the first-place ``head`` blocked from key 0, and with every head blocked from it."""
    c, s, L = cfg.cache, cfg.sinks, cfg.train_len
    if cfg.n_heads < 2 or s < 1:
        raise ValueError(f"the cache controls compare heads and need kept first tokens: n_heads={cfg.n_heads} and "
                         f"sinks={s} must be >= 2 and >= 1")  # fmt: skip
    streams = eval_ids[: cfg.streams * cfg.stream_len].view(cfg.streams, cfg.stream_len)
    upper = {layer: list(range(cfg.n_heads)) for layer in range(1, cfg.num_layers)}
    others = [h for h in range(cfg.n_heads) if h != head[1]]
    pad = torch.full((cfg.streams, s), filler, dtype=streams.dtype)

    def past(curve: torch.Tensor) -> float:
        return round(float(curve[c:].mean()), 5)

    at_c = {"window": tools.stream_nll(model, streams, cache=c, sinks=0),
            "sinks": tools.stream_nll(model, streams, cache=c, sinks=s),
            "recompute": tools.recompute_nll(model, streams, c),
            "filler": tools.stream_nll(model, torch.cat([pad, streams], 1), cache=c, sinks=s)[s:],
            "other_first": tools.stream_nll(model, torch.cat([streams.roll(1, 0)[:, :s], streams], 1), cache=c, sinks=s)[s:],
            "blocked_head": tools.stream_nll(model, streams, cache=c, sinks=s, blocked={head[0]: [head[1]]}),
            "blocked_other": tools.stream_nll(model, streams, cache=c, sinks=s, blocked={head[0]: others}),
            "blocked_layer1": tools.stream_nll(model, streams, cache=c, sinks=s, blocked={0: list(range(cfg.n_heads))}),
            "blocked_upper": tools.stream_nll(model, streams, cache=c, sinks=s, blocked=upper)}  # fmt: skip
    half = c // 2
    at_half = {"window": tools.stream_nll(model, streams, cache=half, sinks=0),
               "sinks": tools.stream_nll(model, streams, cache=half, sinks=s),
               "recompute": tools.recompute_nll(model, streams, half)}  # fmt: skip
    n = (eval_ids.numel() - 1) // L
    windows = torch.stack([eval_ids[i * L : i * L + L + 1] for i in range(n)])
    every = {layer: list(range(cfg.n_heads)) for layer in range(cfg.num_layers)}
    dense = {"none": tools.stream_nll(model, windows, cache=None),
             "blocked_head": tools.stream_nll(model, windows, cache=None, blocked={head[0]: [head[1]]}, first=1),
             "blocked_all": tools.stream_nll(model, windows, cache=None, blocked=every, first=1)}  # fmt: skip
    stream = {str(c): {k: past(v) for k, v in at_c.items()}, str(half): {k: past(v) for k, v in at_half.items()}}
    return stream, {k: round(float(v.mean()), 5) for k, v in dense.items()}


def controls_one(name: str, seed: int, cfg: InsideConfig, out) -> str:
    """Train the causal model ``name`` of ``seed`` again, read the controls of its rolling cache, write its
    ``--cache-controls`` result file."""
    if name not in CAUSAL:
        raise ValueError(f"--cache-controls reads causal models; valid choices: {', '.join(CAUSAL)}; got {name!r}")
    c0 = time.process_time()
    vocab, eval_ids, model, losses, seconds, _ = train(name, seed, cfg)
    t1 = time.perf_counter()
    few = eval_ids[: cfg.sink_windows * cfg.train_len].view(cfg.sink_windows, cfg.train_len)
    sinks = tools.first_token_mass(model, few)
    head = first_place_head(sinks["mass"])
    filler = int(torch.bincount(few.flatten()).argmax())  # the commonest character (a space), as in measure()
    stream, dense = cache_readings(model, cfg, eval_ids, head, filler)
    rec = {"schema": CONTROLS_SCHEMA, "model": name, "seed": seed, "profile": cfg.name, "config": asdict(cfg),
           "train_loss": losses, "train_seconds": round(seconds, 1), "measure_seconds": round(time.perf_counter() - t1, 1),
           "cpu_seconds": round(time.process_time() - c0, 1), "torch": torch.__version__, "sinks": sinks,
           "head": list(head), "filler": filler, "from_step": cfg.cache,
           "stream": stream, "dense": dense}  # fmt: skip
    atomic_write_json(controls_path(out, name, seed), rec)
    at = stream[str(cfg.cache)]
    return (f"done {name} cache controls seed {seed}: {seconds:.0f} s, loss {losses[-1]:.3f}, first-place head "
            f"{head}, past the window: " + ", ".join(f"{k} {v:.3f}" for k, v in at.items()))


def run_controls(cfg: InsideConfig, seeds: Sequence[int], out, *, names: Sequence[str] = ("nope",), jobs: int = 1,
                 log=print) -> None:  # fmt: skip
    """Make every ``--cache-controls`` result not yet in ``out`` (:func:`runner.run_grid`)."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    names = unique_choices("model", names, CAUSAL)
    cells = [runner.Cell(controls_path(out, n, s), controls_one, (n, s, cfg, out)) for n in names for s in seeds]
    runner.run_grid(cells, out=out, schema=CONTROL_RECORDS, config=asdict(cfg), jobs=jobs, log=log,
                    profiles={n: asdict(c) for n, c in PROFILES.items()})


def load_controls(out) -> list[dict]:
    """Every ``--cache-controls`` record in ``out``, checked."""
    return runner.load_results(out, CONTROL_RECORDS)


def pending(cfg: InsideConfig, names: Sequence[str], seeds: Sequence[int], out) -> list[tuple[str, int]]:
    """The (model, seed) pairs still to make in ``out``; a result file made with another configuration, or
    damaged, is a ``ValueError`` saying what to do (:func:`runner.finished`)."""
    profiles = {n: asdict(c) for n, c in PROFILES.items()}
    return [(n, s) for n in names for s in seeds
            if not runner.finished(result_path(out, n, s), RECORDS, asdict(cfg), profiles=profiles)]


def run_all(cfg: InsideConfig, seeds: Sequence[int], out, *, names: Sequence[str] | None = None, jobs: int = 1,
            log=print) -> None:  # fmt: skip
    """Make every (model, seed) result not yet in ``out`` (:func:`runner.run_grid`); ``jobs`` worker processes;
    ``out`` is locked meanwhile."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    names = unique_choices("model", MODELS if names is None else names, MODELS)
    cells = [runner.Cell(result_path(out, n, s), train_one, (n, s, cfg, out)) for n in names for s in seeds]
    runner.run_grid(cells, out=out, schema=RECORDS, config=asdict(cfg), jobs=jobs, log=log,
                    profiles={n: asdict(c) for n, c in PROFILES.items()})


def time_updates(cfg: InsideConfig, updates: int = 20, warmup: int = 3, names: Sequence[str] | None = None,
                 log=print) -> dict[str, Any]:  # fmt: skip
    """Time each model's training updates (after ``warmup`` untimed ones; ``cfg.threads`` threads, as in the
    run) and its measurements once; project the run with 3 seeds, reading the data once per model
    (:func:`runner.time_updates`)."""
    updates, warmup = check_positive_int("updates", updates), check_positive_int("warmup", warmup)
    torch.set_num_threads(cfg.threads)
    c0 = time.process_time()
    vocab, train_ids, eval_ids = charlm.data(cfg)
    data_cpu = time.process_time() - c0
    kw = dict(length=cfg.train_len, batch=cfg.batch_size, lr=cfg.lr, warmup=1, grad_clip=cfg.grad_clip)
    return runner.time_updates(
        list(MODELS) if names is None else list(names), lambda name: make_model(name, cfg, len(vocab)),
        lambda model, n, seed: charlm.train_steps(model, train_ids, steps=n, seed=seed, **kw),
        lambda name, model: measure(name, model, cfg, eval_ids), updates=updates, warmup=warmup, steps=cfg.steps,
        threads=cfg.threads, profile=cfg.name, what="measure", setup_cpu=data_cpu, log=log)  # fmt: skip


# -- reading results ------------------------------------------------------------------------------
def load_results(out) -> list[dict]:
    """Every result record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def collect(records: Sequence[dict], model: str, path: str) -> tuple[np.ndarray, list[int]]:
    """The value at the dotted ``path`` (``"probe.accuracy"``, ``"stream.past_window.sinks"``) of every seed of
    ``model``, stacked: ``(seeds, ...)`` float64, and the seeds in that order."""
    rows, seeds = [], []
    for r in sorted((r for r in records if r["model"] == model), key=lambda r: r["seed"]):
        value: Any = r
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise KeyError(f"{model} seed {r['seed']} has no {path!r} (no {key!r})")
            value = value[key]
        rows.append(value)
        seeds.append(r["seed"])
    if not rows:
        raise KeyError(f"no results for model {model!r}; models present: {sorted({r['model'] for r in records})}")
    return np.asarray(rows, dtype=np.float64), seeds


# -- command line ---------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.inside", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", default="all", help="'all' or comma-separated names from " + ", ".join(MODELS))
    p.add_argument("--out", default=None, help="folder for the result files (default runs/inside-PROFILE; the "
                                               "committed results are never the default)")
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes)")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    p.add_argument("--bands", action="store_true", help="train the RoPE model of each seed again and ablate the "
                   "norm-matched middle band beside the end bands (files in --out, default runs/inside-bands-PROFILE)")
    p.add_argument("--decay", action="store_true", help="train the RoPE model of each seed again and split the fall "
                   "of its mean score with distance into rotation and content (files in --out, default "
                   "runs/inside-decay-PROFILE)")
    p.add_argument("--cache-controls", action="store_true", help="train the causal models of --models again ('all': "
                   "the causal ones) and read controls of the rolling cache: other content in the kept first tokens, "
                   "heads blocked from them, half the cache (files in --out, default runs/inside-cache-controls-PROFILE)")
    p.add_argument("--time-updates", type=int, default=0, metavar="N",
                   help="time N updates and the measurements of each model, print the projected cost, train nothing")
    p.add_argument("--timing-out", default=None, metavar="FILE", help="with --time-updates: also write the timings here")
    p.add_argument("--overwrite", action="store_true", help="with --timing-out: replace an existing file")
    a = p.parse_args(argv)
    cfg = PROFILES[a.profile]
    seeds, names = runner.parse_selection(p, a, list(MODELS))
    again = [f for f, on in (("--bands", a.bands), ("--decay", a.decay), ("--cache-controls", a.cache_controls)) if on]
    if len(again) > 1:
        p.error(f"{' and '.join(again)} are separate runs into separate folders: give one of them")
    if a.cache_controls:
        causal = list(CAUSAL) if a.models.strip() == "all" else names
        if a.time_updates or any(n not in CAUSAL for n in causal):
            p.error(f"--cache-controls reads causal models ({', '.join(CAUSAL)}) and takes no --time-updates, got "
                    f"--models {a.models}")  # fmt: skip
        out = a.out or f"runs/inside-cache-controls-{a.profile}"
        return runner.run_command(p, out, None, lambda: run_controls(cfg, seeds, out, names=causal, jobs=a.jobs))
    if again and (a.time_updates or a.models.strip() not in ("all", "rope")):
        p.error(f"{again[0]} trains the rope model only: it takes neither --models nor --time-updates "
                "(time it with --models rope --time-updates N)")
    code = timing_command(p, a, lambda n: time_updates(cfg, n, names=names))
    if code is not None:
        return code
    if a.bands:
        out = a.out or f"runs/inside-bands-{a.profile}"
        return runner.run_command(p, out, None, lambda: run_bands(cfg, seeds, out, jobs=a.jobs))
    if a.decay:
        out = a.out or f"runs/inside-decay-{a.profile}"
        return runner.run_command(p, out, None, lambda: run_decay(cfg, seeds, out, jobs=a.jobs))
    out = a.out or f"runs/inside-{a.profile}"
    return runner.run_command(p, out, None, lambda: run_all(cfg, seeds, out, names=names, jobs=a.jobs))

if __name__ == "__main__":
    sys.exit(main())


__all__ = ["InsideConfig", "COURSE", "SMOKE", "PROFILES", "MODELS", "BANDS", "MID_BANDS", "make_model", "band_pairs",
           "with_band", "pair_weight", "matched_band", "measure", "train", "run_all", "run_bands", "pending",
           "time_updates", "load_results", "load_bands", "collect", "DECAY_TOLERANCE", "DECAY_NEAR", "run_decay",
           "load_decay", "decay_from_record", "DECAY_RECORDS", "CONTROL_RECORDS", "CAUSAL", "CACHE_CONTROLS",
           "first_place_head", "cache_readings", "run_controls", "load_controls"]  # fmt: skip
