"""Long context, read fairly: every RoPE rescaling set to the length it is read at, and a passkey test.

The second experiment of notebooks/14_long_context.ipynb, on the RoPE models of
posenc_lib/experiments/long_context.py (same profile, same seeds, same weights).  That experiment
configures Position Interpolation, YaRN and Llama 3 for the longest length (``s = 8`` for 512
characters) and reads them at every length, while dynamic NTK rescales itself to each length: a
comparison that favours dynamic NTK by construction.  Here every static method is read at each
length ``n`` with its factor matched to it, ``s = n / L`` (``s = 1`` inside the training window:
plain RoPE), and static NTK-aware scaling (bloc97; ``rope_type="ntk"`` in
posenc_lib/schemes/rope_scaling.py) joins them.  On whole windows, dynamic NTK read at ``n`` *is*
static NTK with ``s = n / L``; the run checks that the two agree.

Perplexity of a small character model leans mostly on the last few characters, so a second test
needs the far context: **passkey retrieval** (Mohtashami & Jaggi 2023; used by Chen et al. 2023 for
Position Interpolation and by Peng et al. 2023 for YaRN).  A window of held-out text carries the
sentence `` the pass key is 52817. `` near its start and ends with `` the pass key is `` followed by
the same five digits; the model retrieves the key when its prediction (arg max) of each of the five
digits is right, which is exactly when greedy decoding would write the key.  Inside the training
window the key sits up to ``L`` characters back; at ``n > L`` it sits more than ``L`` back, where
only a model that reads beyond its training length can find it.

Also per reading: the perplexity of the first ``L`` positions of every window (where the model is
on known ground) beside the whole window's.

**Fine-tuning as a curve**: each static method's model (factor 8) is fine-tuned on 512-character
windows and measured before the fine-tune and after ``FT_POINTS`` updates, perplexity and passkey at
every length.

**Two controls** (``--controls``): ``plain-64`` fine-tunes plain RoPE at the training length with the
curves' updates, schedule, learning rate and characters per update (``finetune_batch * long_len / train_len``
windows of ``L``): how much of a curve's gain is just more training.  It is measured like the curves, and
after its last update also read through a sliding window of ``L`` at the longest length (each character
predicted from at most the ``L`` before it; posenc_lib/experiments/sliding_window.py).  ``yarn-t1`` is YaRN
with its attention temperature switched off (``attention_factor`` 1): read zero-shot (``s = n / L`` and
``s = cfg.factor``) and fine-tuned as a curve, beside YaRN, to isolate what the temperature does.

Each seed writes one JSON file into ``--out`` for the readings and one per fine-tune, each as soon
as it finishes (temporary file + rename); a rerun skips finished files.  The pre-trained weights are
read from ``--ckpt`` (the folder ``long_context`` saves them in) and trained again, identically, when
they are missing.

Cost of the committed ``course`` readings (3 seeds, 100 passkey windows per length, no fine-tunes): 36 minutes
on 2 cores shared with a training run, two of the three models trained again on the way (410-510 s each).
The fine-tune curves (linear, ntk, yarn; 3 seeds, 400 updates each, measured at ``FT_POINTS``): 16 minutes more,
75-120 s per curve, one at a time on 2 shared cores.  The controls (3 seeds; ``--jobs 1`` at the lowest priority on
2 cores busy with a training run): 27 minutes, 5.7 CPU minutes (zero-shot readings 42-48 s, curves 170-280 s each),
after 3.6 CPU minutes to train the three models again.

Command line::

    python -m posenc_lib.experiments.long_context_scaled --profile smoke --out runs/longctx-scaled-smoke
    python -m posenc_lib.experiments.long_context_scaled --profile course --seeds 0,1,2 \\
        --out results/long_context_scaled --jobs 2
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from ..checks import unique_choices
from ..cli import CliParser
from ..files import atomic_write_json
from ..seeds import set_seed
from . import charlm, runner
from . import long_context as lc
from . import sliding_window

SCHEMA = "posenc.longctx-scaled/1"
#: what a result file holds (a seed's readings, one fine-tune curve or one control)
RECORDS = runner.Schema(SCHEMA, ("schema", "kind", "seed", "config", "trials"))
#: the static rescalings read with ``s = n / L``; ``dynamic`` (which does that by itself) beside them
STATIC = ("linear", "ntk", "yarn", "llama3")
READINGS = ("none", *STATIC, "dynamic")
#: fine-tunes at the longest length (factor ``cfg.factor``), measured after these many updates
FINETUNED = ("linear", "ntk", "yarn")
FT_POINTS = (0, 25, 100, 400)
#: YaRN without its attention temperature (``attention_factor`` 1: cos and sin left unscaled)
NO_TEMPERATURE = "yarn-t1"
#: the controls: plain RoPE fine-tuned at the training length, YaRN without its temperature
CONTROLS = ("plain-64", NO_TEMPERATURE)


def ft_points(cfg: lc.LongContextConfig) -> tuple[int, ...]:
    """The update counts a fine-tune is measured at: :data:`FT_POINTS` for the course profile, ``(0, the
    profile's finetune_steps)`` for the others (the smoke profile's few updates)."""
    return FT_POINTS if cfg.name == "course" else (0, cfg.finetune_steps)


#: the passkey sentence and its question (lower case: the Europarl text the model read is mostly so)
NEEDLE = " the pass key is {key}. "
QUESTION = " the pass key is "
KEY_DIGITS = 5


def scaling_for(method: str, cfg: lc.LongContextConfig, factor: float) -> dict | None:
    """The ``scaling`` dict of ``method`` with scale factor ``factor`` (``None`` for plain RoPE)."""
    L = cfg.train_len
    if method == "none" or (method in (*STATIC, NO_TEMPERATURE) and factor <= 1):
        return None
    if method == NO_TEMPERATURE:
        return {**scaling_for("yarn", cfg, factor), "attention_factor": 1.0}
    if method == "ntk":
        return {"rope_type": "ntk", "factor": factor}
    if method == "dynamic":
        return {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
    base = dict(lc.scalings(cfg)[method])
    base["factor"] = factor
    return base


def read_with(model, cfg: lc.LongContextConfig, method: str, factor: float):
    """Set the RoPE model's scaling in place and return it."""
    _pe, options, _ = lc.models(cfg)["rope"]
    sc = scaling_for(method, cfg, factor)
    model.set_scheme("rope", **({**options, "scaling": sc} if sc is not None else options))
    return model


# -- the passkey test -----------------------------------------------------------------------------
def passkey_fits(n: int, L: int) -> bool:
    """Whether a window of ``n`` characters holds the needle and the question (with the key more than ``L``
    characters back when ``n > L``)."""
    room = n - len(NEEDLE.format(key="0" * KEY_DIGITS)) - len(QUESTION) - KEY_DIGITS
    return room >= 0 and (n <= L or room >= L)


def passkey_batch(vocab, eval_text: str, n: int, L: int, trials: int,
                  seed: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:  # fmt: skip
    """``trials`` windows of ``n`` characters: held-out text with the needle planted and the question at
    the end, followed by the key.  Returns ``(ids (trials, n), key positions (trials, 5), distances)``:
    the positions at which the key's digits are predicted (the logits one step earlier) and, per window,
    how many characters back the needle's key starts from the question's key."""
    g = torch.Generator().manual_seed(seed)
    tail = len(QUESTION) + KEY_DIGITS
    needle_len = len(NEEDLE.format(key="0" * KEY_DIGITS))
    assert NEEDLE.startswith(QUESTION)
    room = n - needle_len - tail  # filler characters in the window
    if room < 0:
        raise ValueError(f"passkey windows need n >= {needle_len + tail}, got n={n}")
    # inside the window (n <= L) anywhere; beyond it, far enough that the key is more than L back
    last = room if n <= L else room - L
    if last < 0:
        raise ValueError(f"n={n} is too short to plant the key more than L={L} characters back")
    rows, key_at, dist = [], [], []
    for _ in range(trials):
        key = "".join(str(d) for d in torch.randint(0, 10, (KEY_DIGITS,), generator=g).tolist())
        pos = int(torch.randint(0, last + 1, (1,), generator=g))
        start = int(torch.randint(0, len(eval_text) - room - 1, (1,), generator=g))
        filler = eval_text[start : start + room]
        text = filler[:pos] + NEEDLE.format(key=key) + filler[pos:] + QUESTION + key
        assert len(text) == n
        rows.append(vocab.encode(text))
        key_at.append(list(range(n - KEY_DIGITS - 1, n - 1)))
        dist.append((n - KEY_DIGITS) - (pos + len(QUESTION)))  # the needle's key starts after its QUESTION-long prefix
    return torch.stack(rows), torch.tensor(key_at), dist


@torch.no_grad()
def passkey(model, vocab, eval_text: str, lengths: Sequence[int], L: int, trials: int, seed: int) -> list[dict]:
    """Per length: the share of windows whose key the model retrieves (all five digits right) and the share
    of digits right (chance: 0.1)."""
    model.eval()
    out = []
    for n in lengths:
        ids, key_at, dist = passkey_batch(vocab, eval_text, n, L, trials, seed + n)
        hits = []
        for i in range(0, trials, 32):
            logits = model(ids[i : i + 32])
            pred = logits.argmax(-1).gather(1, key_at[i : i + 32])
            hits.append(pred == ids[i : i + 32].gather(1, key_at[i : i + 32] + 1))
        hit = torch.cat(hits)
        out.append({"length": n, "retrieved": round(float(hit.all(1).float().mean()), 4),
                    "digits": round(float(hit.float().mean()), 4), "trials": trials,
                    "distance_min": min(dist), "distance_max": max(dist)})  # fmt: skip
    return out


def measure(model, cfg, vocab, eval_ids, eval_text, trials: int, seed: int, method: str, factor_of) -> dict:
    """Perplexity (whole window and first L positions) and passkey of one reading at every eval length;
    ``factor_of(n)`` is the scale factor used at length ``n``."""
    rows = []
    for n in cfg.eval_lengths:
        read_with(model, cfg, method, factor_of(n))
        ev = charlm.evaluate(model, eval_ids, [n], first=cfg.train_len)[0]
        ev["factor"] = factor_of(n)
        ev["ppl_first_L"] = ev.pop("ppl_first")
        fits = passkey_fits(n, cfg.train_len)  # not in the smoke profile's short windows
        ev["passkey"] = passkey(model, vocab, eval_text, [n], cfg.train_len, trials, seed)[0] if fits else None
        rows.append(ev)
    return {"method": method, "rows": rows}


# -- the jobs -------------------------------------------------------------------------------------
def _eval_text(cfg) -> str:
    return charlm.load_text(cfg)[1]


def _zero_shot(seed: int, cfg: lc.LongContextConfig, ckpt, trials: int, matched_methods, fixed_methods) -> dict:
    """The RoPE model of ``seed`` read zero-shot: each of ``matched_methods`` with ``s = n / L``, each of
    ``fixed_methods`` with ``s = cfg.factor``; the record's shared fields."""
    torch.set_num_threads(cfg.threads)
    vocab, _train_ids, eval_ids = charlm.data(cfg)
    eval_text = _eval_text(cfg)
    model, seconds = lc.weights("rope", cfg, seed, ckpt, len(vocab))
    t0 = time.perf_counter()
    L = cfg.train_len
    matched = {m: measure(model, cfg, vocab, eval_ids, eval_text, trials, seed, m, lambda n: max(1.0, n / L))
               for m in matched_methods}  # fmt: skip
    fixed = {m: measure(model, cfg, vocab, eval_ids, eval_text, trials, seed, m, lambda n: cfg.factor)
             for m in fixed_methods}  # fmt: skip
    return {"seed": seed, "profile": cfg.name, "config": asdict(cfg), "trials": trials, "matched": matched,
            "fixed": fixed, "retrained_seconds": seconds, "eval_seconds": round(time.perf_counter() - t0, 1)}


def readings(seed: int, cfg: lc.LongContextConfig, out, ckpt, trials: int) -> str:
    """Zero-shot: plain RoPE, each static method with ``s = n / L`` and with ``s = cfg.factor``, dynamic NTK."""
    body = _zero_shot(seed, cfg, ckpt, trials, READINGS, STATIC)
    rec = {"schema": SCHEMA, "kind": "readings", **body, "torch": torch.__version__}
    atomic_write_json(result_path(out, "readings", seed), rec)
    return f"done readings seed {seed}: " + _line(rec["matched"])


def _curve(method: str, seed: int, cfg: lc.LongContextConfig, ckpt, trials: int, points, *, length: int,
           batch: int, factor: float, after=None) -> dict:  # fmt: skip
    """Fine-tune the RoPE model read with ``method`` at ``factor`` on ``batch`` windows of ``length``; measure it
    (both perplexities and passkey, every length, read the same way) after each update count in ``points``.
    ``after(model, eval_ids)`` adds fields measured after the last update.  Returns the record's body."""
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, eval_ids = charlm.data(cfg)
    eval_text = _eval_text(cfg)
    model, _ = lc.weights("rope", cfg, seed, ckpt, len(vocab))
    read_with(model, cfg, method, factor)
    set_seed(seed)
    curve = []
    points = ft_points(cfg) if points is None else tuple(points)

    def on_update(u, m):
        row = measure(m, cfg, vocab, eval_ids, eval_text, trials, seed, method, lambda n: factor)
        curve.append({"updates": u, "rows": row["rows"]})
        read_with(m, cfg, method, factor)

    t0 = time.perf_counter()
    steps = max(points)
    losses = charlm.train_steps(model, train_ids, length=length, batch=batch, steps=steps, lr=cfg.finetune_lr,
                                warmup=max(1, steps // 10), grad_clip=cfg.grad_clip, seed=10_000 + seed,
                                log_every=25, at=points, on_update=on_update)  # fmt: skip
    extra = {} if after is None else after(model, eval_ids)
    return {"method": method, "seed": seed, "profile": cfg.name, "config": asdict(cfg), "trials": trials,
            "points": list(points), "train_loss": losses, "curve": curve, **extra,
            "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}  # fmt: skip


def _done(stem: str, seed: int, rec: dict) -> str:
    last = rec["curve"][-1]
    return (f"done {stem} seed {seed}: {rec['seconds']:.0f} s; after {last['updates']} updates ppl "
            + " ".join(f"{r['length']}:{r['ppl']:.2f}" for r in last["rows"]) + "; passkey "
            + " ".join(f"{r['length']}:{_pk(r)}" for r in last["rows"]))


def finetune_curve(method: str, seed: int, cfg: lc.LongContextConfig, out, ckpt, trials: int,
                   points: Sequence[int] | None = None) -> str:  # fmt: skip
    """Fine-tune the RoPE model with ``method`` at factor ``cfg.factor`` on the longest windows; measure it
    (both perplexities and passkey, every length) after each update count in ``points``."""
    body = _curve(method, seed, cfg, ckpt, trials, points, length=cfg.long_len, batch=cfg.finetune_batch,
                  factor=cfg.factor)  # fmt: skip
    rec = {"schema": SCHEMA, "kind": "finetune", **body}
    atomic_write_json(result_path(out, f"ft-{method}", seed), rec)
    return _done(f"ft-{method}", seed, rec)


def control_batch(cfg: lc.LongContextConfig) -> int:
    """Windows of ``train_len`` per update of the ``plain-64`` control: the fine-tunes' characters per update."""
    chars = cfg.finetune_batch * cfg.long_len
    if chars % cfg.train_len:
        raise ValueError(f"finetune_batch * long_len = {chars} is not a multiple of train_len = {cfg.train_len}")
    return chars // cfg.train_len


def control_curve(name: str, seed: int, cfg: lc.LongContextConfig, out, ckpt, trials: int,
                  points: Sequence[int] | None = None) -> str:  # fmt: skip
    """One control as a fine-tune curve (:data:`CONTROLS`): ``plain-64``, plain RoPE fine-tuned at ``train_len``
    with the curves' characters per update (then read through a sliding window of ``train_len`` at the longest
    length), or ``yarn-t1``, YaRN without its temperature fine-tuned like the curves."""
    if name == "plain-64":
        def sliding(model, eval_ids):
            nll = sliding_window.sliding_nll(model, eval_ids, cfg.long_len, cfg.train_len)
            return {"sliding": sliding_window.nll_row(cfg.long_len, nll)}

        body = _curve("none", seed, cfg, ckpt, trials, points, length=cfg.train_len, batch=control_batch(cfg),
                      factor=1.0, after=sliding)  # fmt: skip
        body.update(length=cfg.train_len, batch=control_batch(cfg))
    elif name == NO_TEMPERATURE:
        body = _curve(NO_TEMPERATURE, seed, cfg, ckpt, trials, points, length=cfg.long_len,
                      batch=cfg.finetune_batch, factor=cfg.factor)  # fmt: skip
        body.update(length=cfg.long_len, batch=cfg.finetune_batch)
    else:
        raise ValueError(f"unknown control {name!r}; valid controls: {', '.join(CONTROLS)}")
    rec = {"schema": SCHEMA, "kind": "control", "name": name, **body}
    atomic_write_json(result_path(out, f"ft-{name}", seed), rec)
    line = _done(f"ft-{name}", seed, rec)
    return line + (f"; sliding window at {cfg.long_len}: {rec['sliding']['ppl']:.2f}" if "sliding" in rec else "")


def readings_extra(seed: int, cfg: lc.LongContextConfig, out, ckpt, trials: int) -> str:
    """Zero-shot: YaRN without its temperature, with ``s = n / L`` and with ``s = cfg.factor``."""
    m = NO_TEMPERATURE
    body = _zero_shot(seed, cfg, ckpt, trials, [m], [m])
    del body["retrained_seconds"]
    rec = {"schema": SCHEMA, "kind": "readings-extra", **body, "torch": torch.__version__}
    atomic_write_json(result_path(out, f"readings-{m}", seed), rec)
    return f"done readings-{m} seed {seed}: " + _line({**rec["matched"], **{f"{m} s={cfg.factor:g}": rec["fixed"][m]}})


def _line(block: dict) -> str:
    return "; ".join(f"{m}: " + " ".join(f"{r['length']}:{r['ppl']:.2f}/{_pk(r)}" for r in v["rows"])
                     for m, v in block.items())  # fmt: skip


def _pk(row: dict) -> str:
    return "-" if row["passkey"] is None else f"{row['passkey']['retrieved']:.2f}"


def result_path(out, stem: str, seed: int) -> Path:
    """The record of one seed's readings (``stem`` "readings") or fine-tuning curve ("ft-<method>") in ``out``."""
    return Path(out) / f"{stem}_seed{seed}.json"


def run_all(cfg: lc.LongContextConfig, seeds: Sequence[int], out, ckpt, *, trials: int = 200,
            finetunes: Sequence[str] = FINETUNED, controls: Sequence[str] = (), jobs: int = 1,
            log=print) -> None:  # fmt: skip
    """The readings of every seed, then the fine-tune curves and the ``controls`` (:data:`CONTROLS`; with
    ``yarn-t1``, its zero-shot readings too) (:func:`runner.run_grid`); finished files are skipped.  The readings train a seed's missing weights, one process per seed, so that two jobs never train
    the same model; a seed whose readings are finished but whose weights are gone is trained first."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    finetunes = unique_choices("fine-tune method", finetunes, STATIC)
    controls = unique_choices("control", controls, CONTROLS)
    cells = [runner.Cell(result_path(out, "readings", s), readings, (s, cfg, out, ckpt, trials)) for s in seeds]
    cells += [runner.Cell(result_path(out, f"ft-{m}", s), finetune_curve, (m, s, cfg, out, ckpt, trials), phase=1)
              for m in finetunes for s in seeds]  # fmt: skip
    if NO_TEMPERATURE in controls:
        cells += [runner.Cell(result_path(out, f"readings-{NO_TEMPERATURE}", s), readings_extra, (s, cfg, out, ckpt, trials),
                              phase=1) for s in seeds]  # fmt: skip
    cells += [runner.Cell(result_path(out, f"ft-{c}", s), control_curve, (c, s, cfg, out, ckpt, trials), phase=1)
              for c in controls for s in seeds]  # fmt: skip

    def weights_first(todo: list[runner.Cell]) -> list[runner.Cell]:
        reading = {c.args[0] for c in todo if c.fn is readings}
        return [runner.Cell(lc.ckpt_path(ckpt, cfg, "rope", s), train_only, (s, cfg, ckpt)) for s in seeds
                if s not in reading and not lc.ckpt_path(ckpt, cfg, "rope", s).exists()]  # fmt: skip

    runner.run_grid(cells, out=out, ckpt=ckpt, schema=RECORDS, config=asdict(cfg), settings={"trials": trials},
                    jobs=jobs, log=log, also=weights_first)


def train_only(seed: int, cfg, ckpt) -> str:
    """The RoPE model of ``seed`` in ``ckpt``: trained again if its weights are not there."""
    vocab, _, _ = charlm.data(cfg)
    torch.set_num_threads(cfg.threads)
    _, seconds = lc.weights("rope", cfg, seed, ckpt, len(vocab))
    return f"trained rope seed {seed} again ({seconds:.0f} s)" if seconds else f"rope seed {seed}: weights found"


def load_results(out) -> list[dict]:
    """Every record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.long_context_scaled", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(lc.PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--finetunes", default=",".join(FINETUNED),
                   help="comma-separated methods to fine-tune (of " + ", ".join(STATIC) + "), or 'none'")
    p.add_argument("--controls", default=",".join(CONTROLS),
                   help="comma-separated controls (of " + ", ".join(CONTROLS) + "), or 'none'")
    p.add_argument("--trials", type=int, default=200, help="passkey windows per length")
    p.add_argument("--out", default=None, help="folder for the result files (default runs/longctx-scaled-PROFILE)")
    p.add_argument("--ckpt", default="runs/longctx", help="where long_context keeps the pre-trained weights")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    cfg = lc.PROFILES[a.profile]
    seeds = runner.parse_seeds(p, a.seeds)
    fts = [] if a.finetunes.strip() == "none" else runner.parse_names(
        p, a.finetunes, STATIC, flag="--finetunes", what="fine-tune method", all_word=None, note=", or 'none'")
    ctl = [] if a.controls.strip() == "none" else runner.parse_names(
        p, a.controls, CONTROLS, flag="--controls", what="control", all_word=None, note=", or 'none'")
    if a.trials < 1:
        p.error(f"--trials must be a positive integer, got {a.trials}")
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    out = a.out or f"runs/longctx-scaled-{a.profile}"
    return runner.run_command(p, out, a.ckpt, lambda: run_all(cfg, seeds, out, a.ckpt, trials=a.trials,
                                                              finetunes=fts, controls=ctl, jobs=a.jobs))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["STATIC", "READINGS", "FINETUNED", "FT_POINTS", "CONTROLS", "NO_TEMPERATURE", "scaling_for", "passkey", "passkey_batch",
           "run_all", "load_results"]  # fmt: skip
