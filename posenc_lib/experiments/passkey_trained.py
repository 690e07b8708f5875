"""Passkey retrieval learned inside the window, asked for beyond it: ALiBi, NoPE and RoPE (plain, PI, NTK, YaRN).

The experiment behind the passkey sections of notebooks/10_alibi.ipynb and 14_long_context.ipynb.
The character models of posenc_lib/experiments/long_context.py never retrieve a passkey, not even
inside their window: nothing in plain text asks them to copy a string from far back.  Here the same
models (same data, size and training length ``L``) learn it: a share of every training batch
(``share``) is passkey windows of ``L`` characters: text with the sentence ``the pass key is 52817.``
somewhere and ``the pass key is`` plus the key at the end (``NEEDLE`` and ``QUESTION`` of
posenc_lib/experiments/long_context_scaled.py, which builds them; here from the training text).  The model
is trained on the whole window (the plain language-model loss); a key counts as retrieved when its
top prediction for each of the five digits is right.

Then each model is asked, on held-out text, at ``L`` (the key at most ``L`` back) and at ``2L .. 8L``
with the key planted **more than** ``L`` characters back, where no training window reached:

* ALiBi, read as trained: its bias grows with distance, so a key beyond the window has to win
  against a penalty it never met in training -- the "sliding window" critique of lesson 10 asks
  whether it can;
* NoPE, read as trained;
* RoPE, read plain and with each static rescaling at ``s = n / L`` (PI, static NTK, YaRN; lesson 14).

Also recorded: the in-range retrieval every ``check_every`` updates (when the skill appears) and
the plain perplexity at every length (what the passkey share costs the language model).

Each (model, seed) writes one JSON file into ``--out`` as soon as it finishes (temporary file +
rename); a rerun skips finished files, and a file made with other settings is refused.

Cost of the committed ``course`` run (3 models x 5 seeds, 6000 updates each): 66 CPU minutes of training and
testing, 36 minutes of wall time two at a time on 2 cores.  Retrieval in range appeared in 5 of 5 ALiBi seeds,
3 of 5 RoPE seeds and 1 of 5 without positions.

Command line::

    python -m posenc_lib.experiments.passkey_trained --profile smoke --out runs/passkey-trained-smoke
    python -m posenc_lib.experiments.passkey_trained --profile course --seeds 0,1,2,3,4 --out results/passkey_trained --jobs 2
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
from ..files import atomic_write_json
from . import charlm, runner
from . import long_context as lc
from . import long_context_scaled as ls

SCHEMA = "posenc.passkey-trained/1"
#: what a result file holds
RECORDS = runner.Schema(SCHEMA, ("schema", "model", "seed", "config", "passkey_training", "readings",
                                 "in_range_curve", "ppl"))
#: the models trained (names of long_context.models) and the readings each is asked with
READINGS: dict[str, tuple[str, ...]] = {"alibi": ("none",), "nope": ("none",), "rope": ("none", "linear", "ntk", "yarn")}
MODELS = tuple(READINGS)
#: the passkey test windows depend on this and the length only: the same for every model and seed
TEST_SEED = 1000


@dataclass(frozen=True)
class PasskeyTraining:
    """What this experiment adds to a long_context profile (``base``)."""

    name: str = "course"
    steps: int = 6000  # updates (the long_context profile's own 1500 are too few for retrieval to appear)
    share: float = 0.5  # fraction of every batch that is passkey windows
    check_every: int = 500  # updates between in-range retrieval checks
    trials: int = 100  # passkey windows per length and reading
    base_overrides: tuple[tuple[str, object], ...] = ()  # long_context fields changed for this profile

    def __post_init__(self):
        for f in ("steps", "check_every", "trials"):
            check_positive_int(f, getattr(self, f))
        check_float_range("share", self.share, 0.0, 1.0, low_open=True, high_open=True)

    def lm(self) -> lc.LongContextConfig:
        """The long_context configuration the models are built and trained with."""
        return replace(lc.PROFILES[self.name], steps=self.steps, **dict(self.base_overrides))


#: ``course``: long_context's course models, 6000 updates, half of every batch passkey windows.
#: ``smoke``: seconds per model; windows of 48 (a passkey window needs 46 characters), learns little.
PROFILES = {
    "course": PasskeyTraining(),
    "smoke": PasskeyTraining(name="smoke", steps=30, check_every=15, trials=8,
                             base_overrides=(("train_len", 48), ("eval_lengths", (48, 96, 192)))),
}  # fmt: skip


def training_windows(vocab, train_text: str, train_ids: torch.Tensor, cfg: lc.LongContextConfig,
                     pk: PasskeyTraining, seed: int):  # fmt: skip
    """``windows(step, g)`` for :func:`long_context.train_steps`: each batch is ``round(share * batch)`` passkey
    windows of ``L + 1`` characters from the training text (their own generator, seeded by ``seed`` and the
    step) after the plain random windows."""
    k = round(pk.share * cfg.batch_size)
    n = cfg.train_len + 1
    if not ls.passkey_fits(n, n):
        raise ValueError(f"train_len={cfg.train_len} is too short for a passkey window (needs >= 45)")

    def windows(step: int, g: torch.Generator) -> torch.Tensor:
        plain = charlm.random_windows(train_ids, cfg.train_len, cfg.batch_size - k, g)
        keys, _, _ = ls.passkey_batch(vocab, train_text, n, n, k, seed * 1_000_003 + step)
        return torch.cat((plain, keys)) if k else plain

    return windows


def asked(model, name: str, cfg: lc.LongContextConfig, vocab, eval_text: str, trials: int, seed: int) -> dict:
    """Every reading of ``name`` at every eval length: ``{reading: [passkey rows]}`` (rescalings at s = n / L)."""
    L = cfg.train_len
    out = {}
    for method in READINGS[name]:
        rows = []
        for n in cfg.eval_lengths:
            if name == "rope":
                ls.read_with(model, cfg, method, max(1.0, n / L))
            rows.append(ls.passkey(model, vocab, eval_text, [n], L, trials, seed)[0])
        out[method] = rows
    if name == "rope":
        ls.read_with(model, cfg, "none", 1.0)
    return out


def train_one(name: str, seed: int, pk: PasskeyTraining, out) -> str:
    """Train one model with passkey windows mixed in, ask it at every length and reading, write its record."""
    cfg = pk.lm()
    torch.set_num_threads(cfg.threads)
    train_text, eval_text = charlm.load_text(cfg)
    vocab, train_ids, eval_ids = charlm.data(cfg)
    curve: list[list] = []
    test_seed = TEST_SEED

    def check(u: int, model) -> None:
        r = ls.passkey(model, vocab, eval_text, [cfg.train_len], cfg.train_len, pk.trials, test_seed)[0]
        curve.append([u, r["retrieved"], r["digits"]])

    points = list(range(pk.check_every, pk.steps + 1, pk.check_every))
    _, _, model, losses, seconds = charlm.train_at_length(
        lambda v: lc.make_model(name, cfg, v), seed, cfg, at=points, on_update=check,
        windows=training_windows(vocab, train_text, train_ids, cfg, pk, seed))  # fmt: skip
    t0 = time.perf_counter()
    readings = asked(model, name, cfg, vocab, eval_text, pk.trials, test_seed)
    ppl = [{"length": r["length"], "ppl": r["ppl"]} for r in charlm.evaluate(model, eval_ids, cfg.eval_lengths)]
    rec = {"schema": SCHEMA, "model": name, "seed": seed, "profile": pk.name, "config": asdict(cfg),
           "passkey_training": asdict(pk), "num_parameters": sum(p.numel() for p in model.parameters()),
           "train_loss": losses, "train_seconds": round(seconds, 1), "in_range_curve": curve,
           "readings": readings, "ppl": ppl, "eval_seconds": round(time.perf_counter() - t0, 1),
           "torch": torch.__version__}  # fmt: skip
    atomic_write_json(result_path(out, name, seed), rec)
    return (f"done {name} seed {seed}: in range {curve[-1][1]:.2f} after {pk.steps} updates; retrieved "
            + "; ".join(f"{m} " + " ".join(f"{r['length']}:{r['retrieved']:.2f}" for r in rows)
                        for m, rows in readings.items()))  # fmt: skip


def result_path(out, name: str, seed: int) -> Path:
    return Path(out) / f"{name}_seed{seed}.json"


def finished(path: Path, pk: PasskeyTraining) -> bool:
    """A finished record of this profile (and these passkey settings); another one is a ``ValueError``."""
    return runner.finished(path, RECORDS, asdict(pk.lm()), passkey_training=asdict(pk))


def run_all(pk: PasskeyTraining, seeds: Sequence[int], out, *, names: Sequence[str] = MODELS, jobs: int = 1,
            log=print) -> None:  # fmt: skip
    """Every (model, seed) not yet in ``out`` (:func:`runner.run_grid`); ``jobs`` worker processes; ``out``
    locked meanwhile."""
    seeds = list(dict.fromkeys(int(s) for s in seeds))
    names = unique_choices("model", names, MODELS)
    cells = [runner.Cell(result_path(out, m, s), train_one, (m, s, pk, out)) for s in seeds for m in names]
    runner.run_grid(cells, out=out, schema=RECORDS, config=asdict(pk.lm()), settings={"passkey_training": asdict(pk)},
                    jobs=jobs, log=log)


def load_results(out) -> list[dict]:
    """Every record in ``out``, checked."""
    return runner.load_results(out, RECORDS)


def summarize(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
    """``{(model, reading): {"lengths", "retrieved": [per length, mean over seeds], "min", "max", "digits",
    "seeds"}}``."""
    groups: dict[tuple[str, str], list[list[dict]]] = {}
    for r in records:
        for method, rows in r["readings"].items():
            groups.setdefault((r["model"], method), []).append(rows)
    out = {}
    for key, runs in groups.items():
        ret = torch.tensor([[row["retrieved"] for row in rows] for rows in runs], dtype=torch.float64)
        dig = torch.tensor([[row["digits"] for row in rows] for rows in runs], dtype=torch.float64)
        out[key] = {"lengths": [row["length"] for row in runs[0]], "retrieved": ret.mean(0).tolist(),
                    "min": ret.min(0).values.tolist(), "max": ret.max(0).values.tolist(),
                    "digits": dig.mean(0).tolist(), "seeds": len(runs)}  # fmt: skip
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = CliParser(prog="python -m posenc_lib.experiments.passkey_trained", description=__doc__.split("\n")[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    p.add_argument("--models", default="all", help="'all' or comma-separated names from " + ", ".join(MODELS))
    p.add_argument("--jobs", type=int, default=1, help="models trained at once (worker processes); default 1")
    p.add_argument("--out", default=None, help="folder for the result files (default runs/passkey-trained-PROFILE)")
    p.add_argument("--resume", action="store_true", help=runner.RESUME_HELP)
    a = p.parse_args(argv)
    pk = PROFILES[a.profile]
    seeds, names = runner.parse_selection(p, a, list(MODELS))
    out = a.out or f"runs/passkey-trained-{a.profile}"
    return runner.run_command(p, out, None, lambda: run_all(pk, seeds, out, names=names, jobs=a.jobs))


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MODELS", "READINGS", "PROFILES", "PasskeyTraining", "training_windows", "asked", "train_one", "run_all",
           "load_results", "summarize"]
