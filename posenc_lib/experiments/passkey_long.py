"""A passkey test that can succeed: the RoPE passkey models fine-tuned at a longer length, keys across the window.

The positive control of the passkey sections of notebooks/14_long_context.ipynb.  The RoPE models of
posenc_lib/experiments/passkey_trained.py learn to retrieve a key inside their window of ``L = 64``
characters, and read zero-shot with any rescaling they retrieve almost none planted further back.  Here
those models (trained again, identically, when their weights are missing; the run checks that the
retrained models repeat the committed readings of results/passkey_trained) are **fine-tuned at**
``length`` (256: ``s = 4``) on the same mix as their pre-training (a share ``share`` of every batch is
passkey windows, now of ``length`` characters with the needle anywhere in them, the rest plain text), read
plain or with a rescaling at ``s = length / L`` (PI, YaRN, static NTK; lesson 14), the same number of
updates, learning rate and schedule for each, and the same characters per update as pre-training
(``batch`` windows of ``length``).

The test: ``trials`` held-out windows of ``length`` with the key anywhere in them, the same windows for
every model; retrieval (all five digits the top prediction) overall and by depth bucket (how far back the
needle's key sits, in buckets of ``L`` characters: ``1-64``, ``65-128``, ...), measured before the
fine-tune and after each of ``points`` updates, with retrieval at ``L`` (lesson 10's test) and the
perplexity at ``L`` and ``length`` beside it.  A fine-tuned model *masters* the window when it retrieves at
least ``mastery`` of the keys in every depth bucket.

Files in ``--out``: ``base_seed<s>.json`` (the pre-trained model: whether it was trained again and whether it
repeats the committed readings and training losses) and ``ft-<method>_seed<s>.json`` (one fine-tune),
each written when finished (temporary file + rename); a rerun skips finished files.  Weights go to
``--ckpt``.

Cost of the ``course`` run (seeds 0, 1, 4: the three RoPE seeds that retrieve at 64; plain, PI, YaRN and NTK,
1000 updates each), projected from a few timed updates on one thread: about 15 CPU minutes to train the three
models again (about 300 s each) and 16 for the twelve fine-tunes (about 67 ms an update of 8 windows of 256,
plus four measurements).  Each record holds its own ``cpu_seconds``.

Command line::

    python -m posenc_lib.experiments.passkey_long --profile smoke --out runs/passkey-long-smoke
    python -m posenc_lib.experiments.passkey_long --profile course --seeds 0,1,4 --out results/passkey_long \\
        --ckpt runs/passkey-long --reference results/passkey_trained --jobs 2
"""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch

from ..checks import check_float_range, check_positive_int, unique_choices
from ..cli import CliParser
from ..files import atomic_torch_save, atomic_write_json, load_weights, read_json
from ..seeds import set_seed
from . import charlm, runner
from . import long_context as lc
from . import long_context_scaled as ls
from . import passkey_trained as pt

SCHEMA = "posenc.passkey-long/1"
#: what a result file holds (``kind`` "base" or "finetune")
RECORDS = runner.Schema(SCHEMA, ("schema", "kind", "seed", "config"))
#: plain RoPE and the rescalings fine-tuned, in the order they run
METHODS = ("none", "linear", "yarn", "ntk")


@dataclass(frozen=True)
class LongPasskey:
    """The fine-tune at ``length`` of the passkey_trained profile ``base``."""

    name: str = "course"
    base: str = "course"  # the passkey_trained profile whose RoPE models are fine-tuned
    length: int = 256  # fine-tuning and test length (s = length / L)
    steps: int = 1000  # updates, the same for every method
    batch: int = 8  # windows of ``length`` per update: 2048 characters, as in pre-training (32 x 64)
    share: float = 0.5  # fraction of every batch that is passkey windows (as in pre-training)
    lr: float = 1e-3  # peak learning rate (lesson 14's fine-tunes); warm-up over steps // 10, cosine decay
    points: tuple[int, ...] = (0, 250, 500, 1000)  # updates after which the model is measured
    trials: int = 240  # test windows at ``length``
    mastery: float = 0.95  # retrieval needed in every depth bucket

    def __post_init__(self):
        for f in ("length", "steps", "batch", "trials"):
            check_positive_int(f, getattr(self, f))
        check_float_range("share", self.share, 0.0, 1.0, low_open=True, high_open=True)
        check_float_range("mastery", self.mastery, 0.0, 1.0)
        if max(self.points) != self.steps or min(self.points) < 0:
            raise ValueError(f"points must lie in 0..steps and end at steps={self.steps}, got {self.points}")
        if self.length % self.pretraining().lm().train_len:
            raise ValueError(f"length={self.length} is not a multiple of the training length")

    def pretraining(self) -> pt.PasskeyTraining:
        return pt.PROFILES[self.base]

    def factor(self) -> float:
        return self.length / self.pretraining().lm().train_len


#: ``course``: 256 characters (s = 4), 1000 updates of 8 windows.  ``smoke``: seconds.
PROFILES = {
    "course": LongPasskey(),
    "smoke": LongPasskey(name="smoke", base="smoke", length=96, steps=6, batch=4, points=(0, 6), trials=12),
}  # fmt: skip


def config(lp: LongPasskey) -> dict:
    """What a result file's ``config`` holds: this run's settings and the pre-training's."""
    return {**asdict(lp), "pretraining": asdict(lp.pretraining()), "pretrained": asdict(lp.pretraining().lm())}


def ckpt_path(ckpt, lp: LongPasskey, seed: int) -> Path:
    return Path(ckpt) / lp.base / f"rope_seed{seed}.pt"


def result_path(out, stem: str, seed: int) -> Path:
    return Path(out) / f"{stem}_seed{seed}.json"


# -- the pre-trained model ------------------------------------------------------------------------
def pretrained(seed: int, lp: LongPasskey, ckpt) -> tuple[torch.nn.Module, dict]:
    """The RoPE passkey model of ``seed``: loaded from ``ckpt``, or trained again exactly as passkey_trained
    trains it (same seed, windows and updates) and saved there.  Returns it and how it was made."""
    pk = lp.pretraining()
    cfg = pk.lm()
    torch.set_num_threads(cfg.threads)
    vocab, train_ids, _ = charlm.data(cfg)
    path = ckpt_path(ckpt, lp, seed)
    if path.exists():
        model = lc.make_model("rope", cfg, len(vocab))
        model.load_state_dict(load_weights(path, advice=f"delete it: the next run trains rope seed {seed} again"))
        return model, {"retrained": False}
    train_text, _ = charlm.load_text(cfg)
    c0 = time.process_time()
    _, _, model, losses, seconds = charlm.train_at_length(
        lambda v: lc.make_model("rope", cfg, v), seed, cfg,
        windows=pt.training_windows(vocab, train_text, train_ids, cfg, pk, seed))  # fmt: skip
    atomic_torch_save(model.state_dict(), path)
    return model, {"retrained": True, "train_loss": losses, "train_seconds": round(seconds, 1),
                   "train_cpu_seconds": round(time.process_time() - c0, 1)}  # fmt: skip


def base(seed: int, lp: LongPasskey, out, ckpt, reference) -> str:
    """The pre-trained model of ``seed`` (trained again if missing), read as passkey_trained reads it; compared
    with its committed record in ``reference`` (a folder, or None)."""
    pk = lp.pretraining()
    cfg = pk.lm()
    c0 = time.process_time()
    model, made = pretrained(seed, lp, ckpt)
    vocab, _, _ = charlm.data(cfg)
    eval_text = charlm.load_text(cfg)[1]
    readings = pt.asked(model, "rope", cfg, vocab, eval_text, pk.trials, pt.TEST_SEED)
    ref_path = None if reference is None else pt.result_path(reference, "rope", seed)
    same, gap = {}, {}
    if ref_path is not None and ref_path.exists():
        ref = read_json(ref_path)
        same["readings"] = ref["readings"] == readings
        # how far a model trained again lands from the committed one when not bit-identical
        gap["retrieved"] = max(abs(a["retrieved"] - b["retrieved"]) for m in readings
                               for a, b in zip(readings[m], ref["readings"][m]))  # fmt: skip
        if "train_loss" in made:
            same["train_loss"] = ref["train_loss"] == made["train_loss"]
            gap["train_loss"] = max(abs(a - b) for a, b in zip(made["train_loss"], ref["train_loss"]))
            gap["first_different_window"] = next(
                (i for i, (a, b) in enumerate(zip(made["train_loss"], ref["train_loss"])) if a != b), None)
    rec = {"schema": SCHEMA, "kind": "base", "seed": seed, "profile": lp.name, "config": config(lp), **made,
           "readings": readings, "reference": None if ref_path is None else str(ref_path), "same_as_reference": same,
           "gap_to_reference": gap,
           "cpu_seconds": round(time.process_time() - c0, 1), "torch": torch.__version__}  # fmt: skip
    atomic_write_json(result_path(out, "base", seed), rec)
    return (f"done base seed {seed}: {'trained again' if made['retrained'] else 'weights loaded'}; at "
            f"{cfg.train_len}: {readings['none'][0]['retrieved']:.2f}; same as the committed record: {same or 'no record'}"
            + (f" (largest gaps: {gap})" if gap else ""))


# -- the test -------------------------------------------------------------------------------------
def buckets(lp: LongPasskey) -> list[tuple[int, int]]:
    """The depth buckets: ``(first, last)`` distances, ``L`` characters each, up to ``length``."""
    L = lp.pretraining().lm().train_len
    return [(b * L + 1, (b + 1) * L) for b in range(lp.length // L)]


@torch.no_grad()
def passkey_by_depth(model, vocab, eval_text: str, lp: LongPasskey) -> dict:
    """``lp.trials`` windows of ``lp.length`` with the key anywhere (the same windows for every model): the
    share retrieved overall, of digits right, and per depth bucket (``trials`` and ``retrieved``)."""
    n = lp.length
    ids, key_at, dist = ls.passkey_batch(vocab, eval_text, n, n, lp.trials, pt.TEST_SEED + n)
    model.eval()
    hits = []
    for i in range(0, lp.trials, 32):
        pred = model(ids[i : i + 32]).argmax(-1).gather(1, key_at[i : i + 32])
        hits.append(pred == ids[i : i + 32].gather(1, key_at[i : i + 32] + 1))
    hit = torch.cat(hits)
    got = hit.all(1)
    d = torch.tensor(dist)
    rows = []
    for lo, hi in buckets(lp):
        inside = (d >= lo) & (d <= hi)
        k = int(inside.sum())
        rows.append({"from": lo, "to": hi, "trials": k,
                     "retrieved": round(float(got[inside].float().mean()), 4) if k else None})  # fmt: skip
    return {"length": n, "trials": lp.trials, "retrieved": round(float(got.float().mean()), 4),
            "digits": round(float(hit.float().mean()), 4), "by_depth": rows}  # fmt: skip


def mastered(row: dict, lp: LongPasskey) -> bool:
    """Whether a test row retrieves at least ``lp.mastery`` of the keys in every depth bucket."""
    return all(b["retrieved"] is not None and b["retrieved"] >= lp.mastery for b in row["by_depth"])


# -- the fine-tune --------------------------------------------------------------------------------
def windows_at(vocab, train_text: str, train_ids: torch.Tensor, lp: LongPasskey, seed: int):
    """``windows(step, g)`` of the fine-tune: ``round(share * batch)`` passkey windows of ``length + 1``
    characters with the needle anywhere (their own generator, seeded by the seed and the step, apart from
    pre-training's) after the plain random windows."""
    k = round(lp.share * lp.batch)
    n = lp.length + 1

    def windows(step: int, g: torch.Generator) -> torch.Tensor:
        plain = charlm.random_windows(train_ids, lp.length, lp.batch - k, g)
        keys, _, _ = ls.passkey_batch(vocab, train_text, n, n, k, seed * 1_000_003 + 500_000 + step)
        return torch.cat((plain, keys)) if k else plain

    return windows


def finetune(method: str, seed: int, lp: LongPasskey, out, ckpt) -> str:
    """Fine-tune the pre-trained model of ``seed`` read with ``method`` at ``s = length / L``; measure it (passkey
    by depth at ``length``, passkey at ``L``, perplexity at both) after each of ``lp.points`` updates."""
    pk = lp.pretraining()
    cfg = pk.lm()
    torch.set_num_threads(cfg.threads)
    c0, t0 = time.process_time(), time.perf_counter()
    vocab, train_ids, eval_ids = charlm.data(cfg)
    train_text, eval_text = charlm.load_text(cfg)
    model, _ = pretrained(seed, lp, ckpt)
    s = lp.factor()
    ls.read_with(model, cfg, method, s)
    curve = []

    def measure(u: int, m) -> None:
        ev = charlm.evaluate(m, eval_ids, [cfg.train_len, lp.length])
        at_L = ls.passkey(m, vocab, eval_text, [cfg.train_len], cfg.train_len, pk.trials, pt.TEST_SEED)[0]
        curve.append({"updates": u, "passkey": passkey_by_depth(m, vocab, eval_text, lp),
                      "passkey_at_L": {k: at_L[k] for k in ("length", "retrieved", "digits", "trials")},
                      "ppl": [{"length": r["length"], "ppl": r["ppl"]} for r in ev]})  # fmt: skip

    set_seed(seed)
    losses = charlm.train_steps(model, train_ids, length=lp.length, batch=lp.batch, steps=lp.steps, lr=lp.lr,
                                warmup=max(1, lp.steps // 10), grad_clip=cfg.grad_clip, seed=20_000 + seed,
                                log_every=50, at=lp.points, on_update=measure,
                                windows=windows_at(vocab, train_text, train_ids, lp, seed))  # fmt: skip
    last = curve[-1]
    rec = {"schema": SCHEMA, "kind": "finetune", "method": method, "seed": seed, "profile": lp.name,
           "config": config(lp), "factor": s, "scaling": ls.scaling_for(method, cfg, s), "train_loss": losses,
           "curve": curve, "mastered": mastered(last["passkey"], lp), "seconds": round(time.perf_counter() - t0, 1),
           "cpu_seconds": round(time.process_time() - c0, 1), "torch": torch.__version__}  # fmt: skip
    atomic_write_json(result_path(out, f"ft-{method}", seed), rec)
    return (f"done ft-{method} seed {seed}: {rec['cpu_seconds']:.0f} CPU s; at {lp.length} retrieved "
            + " -> ".join(f"{c['passkey']['retrieved']:.2f}" for c in curve) + "; by depth "
            + " ".join(f"{b['retrieved']}" for b in last["passkey"]["by_depth"])
            + f"; at {cfg.train_len} {last['passkey_at_L']['retrieved']:.2f}; mastered {rec['mastered']}")


def train_only(seed: int, lp: LongPasskey, ckpt) -> str:
    """The pre-trained weights of ``seed`` in ``ckpt``, trained again if missing."""
    _, made = pretrained(seed, lp, ckpt)
    return f"rope seed {seed}: " + ("trained again" if made["retrained"] else "weights found")


def run_all(lp: LongPasskey, seeds: Sequence[int], out, ckpt, *, methods: Sequence[str] = METHODS,
            reference=None, jobs: int = 1, log=print) -> None:  # fmt: skip
    """The base record of every seed (phase 0: trains the weights), then every fine-tune (methods in the order
    given, each over the seeds); finished files are skipped; a seed whose base is finished but whose weights
    are gone is trained again first."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    methods = unique_choices("method", methods, METHODS)
    cells = [runner.Cell(result_path(out, "base", s), base, (s, lp, out, ckpt, reference)) for s in seeds]
    cells += [runner.Cell(result_path(out, f"ft-{m}", s), finetune, (m, s, lp, out, ckpt), phase=1)
              for m in methods for s in seeds]  # fmt: skip

    def weights_first(todo: list[runner.Cell]) -> list[runner.Cell]:
        based = {c.args[0] for c in todo if c.fn is base}
        need = dict.fromkeys(c.args[1] for c in todo if c.fn is finetune)
        return [runner.Cell(ckpt_path(ckpt, lp, s), train_only, (s, lp, ckpt)) for s in need
                if s not in based and not ckpt_path(ckpt, lp, s).exists()]  # fmt: skip

    runner.run_grid(cells, out=out, ckpt=ckpt, schema=RECORDS, config=config(lp), jobs=jobs, log=log,
                    also=weights_first)


def load_results(out) -> list[dict]:
    """Every record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def outcomes(records: Sequence[dict]) -> dict[str, dict[int, dict]]:
    """The fine-tunes of ``records`` as ``{method: {seed: row}}`` (methods in :data:`METHODS` order, seeds sorted);
    a row holds ``points`` (updates measured), ``retrieved`` (share at ``length`` after each), ``by_depth``
    (per depth bucket after each: ``[[share per bucket] per point]``), ``buckets``, ``mastered`` (after the last
    update), ``first_mastered`` (the first point at which every bucket reaches mastery, or None), ``at_L``
    (retrieval at ``L`` after each point) and ``ppl`` (``{length: [after each point]}``)."""
    out: dict[str, dict[int, dict]] = {}
    tunes = sorted((r for r in records if r["kind"] == "finetune"), key=lambda r: (METHODS.index(r["method"]), r["seed"]))
    for r in tunes:
        lp = LongPasskey(**{k: tuple(v) if k == "points" else v for k, v in r["config"].items()
                            if k in LongPasskey.__dataclass_fields__})  # fmt: skip
        curve = r["curve"]
        first = next((c["updates"] for c in curve if mastered(c["passkey"], lp)), None)
        out.setdefault(r["method"], {})[r["seed"]] = {
            "points": [c["updates"] for c in curve], "retrieved": [c["passkey"]["retrieved"] for c in curve],
            "by_depth": [[b["retrieved"] for b in c["passkey"]["by_depth"]] for c in curve],
            "buckets": [(b["from"], b["to"]) for b in curve[-1]["passkey"]["by_depth"]],
            "mastered": r["mastered"], "first_mastered": first,
            "at_L": [c["passkey_at_L"]["retrieved"] for c in curve],
            "ppl": {row["length"]: [c["ppl"][i]["ppl"] for c in curve] for i, row in enumerate(curve[0]["ppl"])},
        }  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.passkey_long", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,4", help="comma-separated integer seeds")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods of " + ", ".join(METHODS))
    p.add_argument("--out", default=None, help="folder for the result files (default runs/passkey-long-PROFILE)")
    p.add_argument("--ckpt", default="runs/passkey-long", help="where the pre-trained weights are kept")
    p.add_argument("--reference", default=None,
                   help="passkey_trained results folder the retrained models are compared with (default: none)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    lp = PROFILES[a.profile]
    seeds = runner.parse_seeds(p, a.seeds)
    methods = runner.parse_names(p, a.methods, METHODS, flag="--methods", what="method", all_word=None)
    if a.jobs < 1:
        p.error(f"--jobs must be a positive integer, got {a.jobs}")
    out = a.out or f"runs/passkey-long-{a.profile}"
    return runner.run_command(p, out, a.ckpt, lambda: run_all(lp, seeds, out, a.ckpt, methods=methods,
                                                              reference=a.reference, jobs=a.jobs))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["SCHEMA", "RECORDS", "METHODS", "PROFILES", "LongPasskey", "config", "buckets", "passkey_by_depth",
           "mastered", "windows_at", "base", "finetune", "run_all", "load_results", "outcomes"]
