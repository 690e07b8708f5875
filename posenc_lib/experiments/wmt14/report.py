"""Reading a finished WMT14 run folder the way a careful reader needs it: over every seed.

* :func:`seed_stats`: a metric's per-seed values, mean and 95% t-interval per scheme;
* :func:`bootstrap_by_seed`: sacreBLEU's paired bootstrap between schemes, for every seed (not only the first);
* :func:`paired_differences`, :func:`ranking_verdict`: scheme B - scheme A seed by seed, and the one decision rule;
  :func:`plot_paired_differences` draws them against one baseline;
* :func:`within_training_length`: BLEU and chrF on the test sentences whose source fits the training length;
* :func:`bleu_by_length_over_seeds`: BLEU per source-length bucket, averaged over the seeds;
* :func:`length_story`: output/reference length, brevity penalty and BLEU without it, per model and per
  source-length bucket, with the share of outputs that stop early or run on; :func:`long_sample`: one long
  test sentence and every scheme's translation of it.

Each reads only the run folder (``results.json``, ``src``/``ref`` files, each model's ``hyp`` files and the
run's ``tokenizer.json``).  Taught in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

from ...checks import check_choice  # noqa: F401 (re-exported)
from ...files import atomic_write_json, read_json
from ...stats import interval95, t_quantile_975  # noqa: F401 (re-exported)
from .evaluate import bleu_chrf, paired_bootstrap
from .pipeline import TESTS, bleu_by_length, run_schemes
from .tokenizer import get_tokenizer

#: the metrics :func:`seed_stats` reads from each model's results (``short_*``: sources within the training length)
METRICS = ("bleu", "chrf", "bertscore_f1", "shuffled", "short_bleu", "short_chrf")
METRIC_LABELS = {"bleu": "BLEU", "chrf": "chrF", "bertscore_f1": "BERTScore F1 (MiniLM)", "shuffled": "BLEU, shuffled source",
                 "short_bleu": "BLEU, sources within training length", "short_chrf": "chrF, sources within training length"}


def _metric(res: dict, metric: str):
    if metric == "shuffled":
        return res.get("shuffled_source", {}).get("bleu")
    if metric.startswith("short_"):
        return res.get("short_sources", {}).get(metric[len("short_"):])
    return res.get(metric)


def shuffle_drop(result: dict, test: str = "heldout") -> float:
    """BLEU lost when the source words are shuffled: one model's ``result`` (``results["models"][pe][seed]``)."""
    t = result["tests"][test]
    return t["bleu"] - t["shuffled_source"]["bleu"]


def seed_stats(results: dict, test: str = "heldout", metric: str = "bleu") -> dict[str, dict]:
    """``{scheme: {"values": {seed: v}, "mean", "ci95", "n", "min", "max"}}`` of one metric (:data:`METRICS`:
    ``bleu``, ``chrf``, ``bertscore_f1``, ``shuffled`` or, on newstest2014, ``short_bleu``/``short_chrf`` for the
    sources within the training length) over the seeds each scheme has; ``ci95`` is the half-width of the 95%
    t-interval of the mean (nan for one seed).  Schemes without the metric are left out."""
    check_choice("test", test, TESTS)
    check_choice("metric", metric, METRICS)
    out = {}
    for pe, by_seed in results["models"].items():
        vals = {int(s): _metric(r["tests"][test], metric) for s, r in by_seed.items()}
        vals = {s: v for s, v in sorted(vals.items()) if v is not None}
        if vals:
            mean, half = interval95(list(vals.values()))
            out[pe] = {"values": vals, "mean": mean, "ci95": half, "n": len(vals), "min": min(vals.values()),
                       "max": max(vals.values())}
    return out


def paired_differences(results: dict, a: str, b: str, test: str = "heldout", metric: str = "bleu") -> dict:
    """Scheme ``b`` minus scheme ``a`` seed by seed (the design is paired: within a seed both share the data, the
    batch order and the initial weights of every shared part): ``{"diffs": {seed: b - a}, "mean", "ci95", "n"}``
    over the seeds both have; ``ci95`` is the half-width of the 95% t-interval of the mean difference (nan for one
    seed), so the interval is ``mean ± ci95``."""
    stats = seed_stats(results, test, metric)
    for pe in (a, b):
        if pe not in stats:
            raise ValueError(f"scheme {pe!r} has no {metric!r} on {test!r}; valid choices: {', '.join(stats)}")
    seeds = sorted(set(stats[a]["values"]) & set(stats[b]["values"]))
    if not seeds:
        raise ValueError(f"{a!r} and {b!r} share no seed: a paired difference needs the same seeds")
    diffs = {s: stats[b]["values"][s] - stats[a]["values"][s] for s in seeds}
    mean, half = interval95(list(diffs.values()))
    return {"diffs": diffs, "mean": mean, "ci95": half, "n": len(seeds)}


#: the lesson's one decision rule: B is ranked ahead of A only if the paired 95% interval of B - A (over at least
#: MIN_SEEDS seeds) lies above 0 and sacreBLEU's paired bootstrap gives p < ALPHA for B over A in every one of them
ALPHA, MIN_SEEDS = 0.05, 2


def ranking_verdict(results: dict, boot: dict[int, list[dict]], a: str, b: str, test: str = "heldout") -> dict:
    """:data:`the decision rule <ALPHA>` applied to BLEU of ``b`` against ``a``: the paired difference (as
    :func:`paired_differences`), each shared seed's bootstrap ``p`` and ``delta`` (b - a), and ``verdict``:
    ``"b ahead"``, ``"a ahead"`` or ``"not separated"``.  ``boot``: :func:`bootstrap_by_seed`'s answer."""
    d = paired_differences(results, a, b, test, "bleu")
    per_seed = {}
    for seed in d["diffs"]:
        rows = [r for r in boot.get(seed, []) if {r["baseline"], r["system"]} == {a, b}]
        if not rows:
            raise ValueError(f"the bootstrap has no row for {a!r} and {b!r} in seed {seed}")
        r = rows[0]
        delta = r["bleu_system"] - r["bleu_baseline"]
        per_seed[seed] = {"p": r["bleu_p"], "delta": delta if r["system"] == b else -delta}
    lo, hi = d["mean"] - d["ci95"], d["mean"] + d["ci95"]
    enough = d["n"] >= MIN_SEEDS and not math.isnan(d["ci95"])
    verdict = "not separated"
    if enough and lo > 0 and all(v["p"] < ALPHA and v["delta"] > 0 for v in per_seed.values()):
        verdict = "b ahead"
    elif enough and hi < 0 and all(v["p"] < ALPHA and v["delta"] < 0 for v in per_seed.values()):
        verdict = "a ahead"
    return {**d, "seeds": per_seed, "verdict": verdict}


def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (written by python -m posenc_lib.experiments.wmt14)")
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def bootstrap_by_seed(run_dir, test: str = "heldout", n_samples: int | None = None,
                      schemes: list[str] | None = None, cache: bool = True,
                      tag: str | None = None) -> dict[int, list[dict]]:
    """sacreBLEU's paired bootstrap between every two schemes (``schemes``, default all), separately for each seed
    that at least two of them have: ``{seed: rows}`` (rows as :func:`~.evaluate.paired_bootstrap`).

    ``n_samples`` defaults to the run's ``bootstrap_samples``.  With 1000 resamples the smallest p-value sacreBLEU
    can report is about 0.001: read ``p = 0.001`` as "p <= 0.001", never as "p < 0.001".  ``cache``: keep the
    answer in ``run_dir/bootstrap_by_seed.TEST.json`` with a digest of its inputs (the resample count, the
    schemes, every hypothesis and reference file) and reuse it while they are unchanged; ``tag`` names a second
    cache (``bootstrap_by_seed.TEST.TAG.json``) for another set of schemes, so the two do not replace each other.
    """
    check_choice("test", test, TESTS)
    run_dir = Path(run_dir)
    results = read_json(run_dir / "results.json")
    n = n_samples or results["config"]["profile"]["bootstrap_samples"]
    refs = _lines(run_dir / f"ref.{test}.txt")
    names = [pe for pe in results["models"] if schemes is None or pe in schemes]
    seeds = sorted({int(s) for pe in names for s in results["models"][pe]})
    digest = hashlib.sha256(f"{n} {test} {names}".encode())
    digest.update((run_dir / f"ref.{test}.txt").read_bytes())
    for pe in names:
        for s in sorted(results["models"][pe], key=int):
            digest.update((run_dir / f"{pe}-seed{s}" / f"hyp.{test}.txt").read_bytes())
    if tag is not None and (not isinstance(tag, str) or not tag.replace("-", "").replace("_", "").isalnum()):
        raise ValueError(f"tag must be letters, digits, '-' or '_' (a file name part), got {tag!r}")
    path = run_dir / f"bootstrap_by_seed.{test}{'' if tag is None else '.' + tag}.json"

    def compute():
        out = {}
        for seed in seeds:
            have = [pe for pe in names if str(seed) in results["models"][pe]]
            if len(have) < 2:
                continue
            hyps = {pe: _lines(run_dir / f"{pe}-seed{seed}" / f"hyp.{test}.txt") for pe in have}
            out[seed] = paired_bootstrap(hyps, refs[: len(next(iter(hyps.values())))], n_samples=n)
        return out

    return _digest_cached(path, digest.hexdigest(), cache, compute,
                          save=lambda out: {"n_samples": n, "test": test, "seeds": {str(s): r for s, r in out.items()}},
                          load=lambda old: {int(s): rows for s, rows in old["seeds"].items()})


def _digest_cached(path: Path, inputs: str, cache: bool, compute, *, save, load):
    """``compute()``, kept in the JSON file ``path`` under the digest ``inputs`` of what it was made from: reused
    while the digest matches, made again (and the file replaced) when it does not.  ``save``/``load`` turn the
    answer into the file's other fields and back."""
    if cache and path.is_file():
        old = read_json(path)
        if old.get("inputs") == inputs:
            return load(old)
    out = compute()
    if cache:
        atomic_write_json(path, {"inputs": inputs, **save(out)})
    return out


def _tokenizer(run_dir: Path, results: dict):
    kind, tok_source = results["config"]["profile"]["tokenizer"], results["config"]["tokenizer_source"]
    return get_tokenizer(kind, cache=run_dir / "tokenizer.json", vocab=None if tok_source == kind else tok_source)


def within_training_length(run_dir, test: str = "newstest2014") -> dict:
    """BLEU and chrF of each model on the test sentences whose source has at most the run's ``max_tokens``
    subword tokens: ``{"n": kept, "total": all, "max_tokens", "models": {scheme: {seed: {"bleu", "chrf"}}}}``."""
    check_choice("test", test, TESTS)
    run_dir = Path(run_dir)
    results = read_json(run_dir / "results.json")
    src, ref = _lines(run_dir / f"src.{test}.txt"), _lines(run_dir / f"ref.{test}.txt")
    max_tokens = results["config"]["profile"]["max_tokens"]
    keep = [i for i, ids in enumerate(_tokenizer(run_dir, results).encode(src)) if len(ids) <= max_tokens]
    models = {}
    for pe, by_seed in results["models"].items():
        for seed in by_seed:
            hyp = _lines(run_dir / f"{pe}-seed{seed}" / f"hyp.{test}.txt")
            scores = bleu_chrf([hyp[i] for i in keep], [ref[i] for i in keep])
            models.setdefault(pe, {})[int(seed)] = {"bleu": scores["bleu"], "chrf": scores["chrf"]}
    return {"n": len(keep), "total": len(src), "max_tokens": max_tokens, "models": models}


def bleu_by_length_over_seeds(run_dir, test: str = "newstest2014", edges=(1, 11, 25, 41, 61),
                              schemes: list[str] | None = None) -> dict[str, list[dict]]:  # fmt: skip
    """BLEU per bucket of source length for every seed, then averaged: ``{scheme: [{"bucket", "min_len", "max_len",
    "sentences", "beyond_training", "bleu" (mean over the seeds), "bleu_by_seed"}]}``; ``schemes``: some of the
    run's schemes (default all)."""
    run_dir = Path(run_dir)
    results = read_json(run_dir / "results.json")
    names = run_schemes(results, schemes)
    seeds = sorted({int(s) for pe in names for s in results["models"][pe]})
    per_seed = {seed: bleu_by_length(run_dir, test, edges, seed=seed, schemes=names) for seed in seeds}
    out = {}
    for pe in names:
        have = [int(s) for s in results["models"][pe]]
        rows = []
        for k, bucket in enumerate(per_seed[have[0]][pe]):
            vals = {s: per_seed[s][pe][k]["bleu"] for s in have}
            rows.append({**{key: bucket[key] for key in bucket if key not in ("bleu", "chrf")},
                         "bleu": sum(vals.values()) / len(vals), "bleu_by_seed": vals})
        out[pe] = rows
    return out


#: a translation shorter than this fraction of its reference "stops early", longer than its inverse "runs on"
EARLY_STOP = 0.5


def length_row(stats: list[list[int]], idx: list[int]) -> dict:
    """Length figures of the sentences ``idx`` from sacreBLEU's per-sentence BLEU statistics (``[hyp_len, ref_len,
    4 matches, 4 totals]``): lengths in sacreBLEU's 13a tokens, as its brevity penalty counts them."""
    from sacrebleu.metrics import BLEU

    score = BLEU()._aggregate_and_compute([stats[i] for i in idx])
    hyp, ref = sum(stats[i][0] for i in idx), sum(stats[i][1] for i in idx)
    early = sum(stats[i][0] < EARLY_STOP * stats[i][1] for i in idx)
    runs_on = sum(stats[i][0] > stats[i][1] / EARLY_STOP for i in idx)
    return {"sentences": len(idx), "hyp_len": hyp, "ref_len": ref, "ratio": round(hyp / ref, 3),
            "bp": round(score.bp, 3), "bleu": round(score.score, 2),
            "bleu_without_bp": round(score.score / score.bp, 2) if score.bp > 0 else 0.0,
            "stops_early": round(early / len(idx), 3), "runs_on": round(runs_on / len(idx), 3)}


def length_story(run_dir, test: str = "newstest2014", edges=(1, 25, 41, 61), cache: bool = True) -> dict:
    """How long each model's translations are: ``{"edges", "max_tokens", "models": {scheme: {seed: {"all": row,
    "buckets": [row per source-length bucket]}}}}``; a row has the output and reference lengths and their
    ``ratio``, the brevity penalty ``bp``, ``bleu`` and ``bleu_without_bp`` (= BLEU / BP: the n-gram precisions
    alone), and the shares of translations shorter than half their reference (``stops_early``) or longer than
    twice it (``runs_on``).  Buckets are ``[edges[k], edges[k+1])`` source subword tokens, the last open-ended.
    ``cache``: keep the answer in ``run_dir/lengths.TEST.json`` with a digest of its inputs and reuse it while they
    are unchanged."""
    from sacrebleu.metrics import BLEU

    check_choice("test", test, TESTS)
    run_dir = Path(run_dir)
    results = read_json(run_dir / "results.json")
    edges = [int(e) for e in edges]
    if not edges or edges[0] < 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be non-negative and strictly increasing, got {edges}")
    digest = hashlib.sha256(f"{test} {edges} {EARLY_STOP}".encode())
    for f in (f"src.{test}.txt", f"ref.{test}.txt", "tokenizer.json"):
        digest.update((run_dir / f).read_bytes() if (run_dir / f).is_file() else b"")
    for pe, by_seed in results["models"].items():
        for seed in sorted(by_seed, key=int):
            digest.update(f"{pe} {seed}".encode() + (run_dir / f"{pe}-seed{seed}" / f"hyp.{test}.txt").read_bytes())
    path = run_dir / f"lengths.{test}.json"

    def compute():
        src, ref = _lines(run_dir / f"src.{test}.txt"), _lines(run_dir / f"ref.{test}.txt")
        lengths = [len(ids) for ids in _tokenizer(run_dir, results).encode(src)]
        buckets = []
        for k, lo in enumerate(edges):
            hi = edges[k + 1] if k + 1 < len(edges) else None
            idx = [i for i, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
            if idx:
                buckets.append((f"{lo}-{hi - 1}" if hi is not None else f"{lo}+", idx))
        models: dict = {}
        for pe, by_seed in results["models"].items():
            for seed in sorted(by_seed, key=int):
                hyp = _lines(run_dir / f"{pe}-seed{seed}" / f"hyp.{test}.txt")
                if len(hyp) != len(ref):
                    raise ValueError(f"{run_dir / f'{pe}-seed{seed}' / f'hyp.{test}.txt'} has {len(hyp)} lines, "
                                     f"ref.{test}.txt {len(ref)}: that model was scored on other sentences")
                stats = BLEU()._extract_corpus_statistics(hyp, [ref])
                models.setdefault(pe, {})[int(seed)] = {
                    "all": length_row(stats, list(range(len(ref)))),
                    "buckets": [{"bucket": name, **length_row(stats, idx)} for name, idx in buckets],
                }
        return {"test": test, "edges": edges, "max_tokens": results["config"]["profile"]["max_tokens"],
                "models": models}

    return _digest_cached(path, digest.hexdigest(), cache, compute, save=lambda out: {"lengths": out},
                          load=lambda old: {**old["lengths"], "models": {
                              pe: {int(s): r for s, r in by_seed.items()}
                              for pe, by_seed in old["lengths"]["models"].items()}})


def long_sample(run_dir, test: str = "newstest2014", tokens: tuple[int, int] = (40, 50), seed: int | None = None) -> dict:
    """The first ``test`` sentence whose source has ``tokens[0]``..``tokens[1]`` subword tokens, with each scheme's
    translation (``seed``, default each scheme's first): ``{"index", "source", "reference", "tokens",
    "hypotheses": {scheme: text}}``."""
    check_choice("test", test, TESTS)
    run_dir = Path(run_dir)
    results = read_json(run_dir / "results.json")
    src, ref = _lines(run_dir / f"src.{test}.txt"), _lines(run_dir / f"ref.{test}.txt")
    lengths = [len(ids) for ids in _tokenizer(run_dir, results).encode(src)]
    lo, hi = tokens
    pick = next((i for i, n in enumerate(lengths) if lo <= n <= hi), None)
    if pick is None:
        raise ValueError(f"no {test} source has {lo} to {hi} tokens (lengths run {min(lengths)}..{max(lengths)})")
    hyps = {}
    for pe, by_seed in results["models"].items():
        key = str(seed) if seed is not None else sorted(by_seed, key=int)[0]
        if key in by_seed:
            hyps[pe] = _lines(run_dir / f"{pe}-seed{key}" / f"hyp.{test}.txt")[pick]
    return {"index": pick, "source": src[pick], "reference": ref[pick], "tokens": lengths[pick], "hypotheses": hyps}


def plot_seed_bars(ax, results: dict, test: str = "heldout", metric: str = "bleu", schemes: list[str] | None = None) -> dict:
    """The mean over seeds (a square) with its 95% t-interval (none for one seed) and a dot per seed, on an axis
    that fits the values (no bars from 0, which would hide gaps of a point); returns :func:`seed_stats`' answer
    for the schemes drawn (``schemes``, default all that have the metric)."""
    from .pipeline import scheme_color

    stats = seed_stats(results, test, metric)
    pes = [pe for pe in (schemes or list(stats)) if pe in stats]
    if not pes:
        raise ValueError(f"no scheme of {schemes or list(results['models'])} has {metric!r} on {test!r}")
    for k, pe in enumerate(pes):
        st = stats[pe]
        ax.errorbar(k, st["mean"], yerr=None if math.isnan(st["ci95"]) else st["ci95"], fmt="s",
                    color=scheme_color(k, len(pes)), ms=7, capsize=5, lw=2)
        vals = list(st["values"].values())
        ax.plot([k + 0.22 + 0.08 * j for j in range(len(vals))], vals, "k.", ms=5)
    ax.set_xticks(range(len(pes)), pes)
    ax.set_ylabel(METRIC_LABELS[metric])
    ax.set_title(f"{METRIC_LABELS[metric]}\non {test}", fontsize=10)
    return {pe: stats[pe] for pe in pes}


def plot_paired_differences(ax, results: dict, boot: dict[int, list[dict]], base: str, schemes: list[str],
                            test: str = "heldout") -> dict[str, dict]:
    """One row per scheme of ``schemes``: its in-domain BLEU minus ``base``'s, a dot per seed and the paired 95%
    interval of the mean (none for one seed), coloured by :func:`ranking_verdict` (ahead, behind, not separated);
    returns ``{scheme: verdict}`` as :func:`ranking_verdict` gives it for ``a = base``, ``b = scheme``."""
    colors = {"b ahead": "C2", "a ahead": "C3", "not separated": "0.45"}
    out = {}
    for k, pe in enumerate(schemes):
        v = out[pe] = ranking_verdict(results, boot, base, pe, test)
        color = colors[v["verdict"]]
        if not math.isnan(v["ci95"]):
            ax.plot([v["mean"] - v["ci95"], v["mean"] + v["ci95"]], [k, k], "-", color=color, lw=2.5, alpha=0.6)
        ax.plot([v["mean"]], [k], "|", color=color, ms=14, mew=2)
        ax.plot(list(v["diffs"].values()), [k] * v["n"], "o", color=color, ms=5, mfc="white")
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(schemes)), [f"{pe} ({out[pe]['n']} seed{'s' if out[pe]['n'] > 1 else ''})"
                                        for pe in schemes])
    ax.invert_yaxis()
    ax.set_xlabel(f"BLEU on {test}: scheme minus {base}, same seed")
    ax.set_title(f"Paired differences against {base}: dots = seeds, bar = 95% interval of the mean\n"
                 "green: ahead by the rule, red: behind, grey: not separated", fontsize=9)
    return out


#: the scores :func:`precision_pairs` compares, as (test, key in the model's tests, label)
PRECISION_SCORES = (("heldout", "bleu", "BLEU in-domain"), ("heldout", "chrf", "chrF in-domain"),
                    ("newstest2014", "bleu", "BLEU newstest2014"), ("newstest2014", "bleu_bp", "BP newstest2014"))


def precision_pairs(run_a, run_b) -> list[dict]:
    """The models two run folders share (same scheme and seed, hence the same data, batch order and initial
    weights) trained in different precisions: ``[{"pe", "seed", "a": precision, "b": precision, "scores":
    {label: (score_a, score_b, b - a)}}]`` in ``run_a``'s order.  The difference is the precision's effect on
    one model, seed noise of training included (the two diverge from the first rounding on)."""
    ra, rb = read_json(Path(run_a) / "results.json"), read_json(Path(run_b) / "results.json")
    rows = []
    for pe, by_seed in ra["models"].items():
        for seed, ma in by_seed.items():
            mb = rb["models"].get(pe, {}).get(seed)
            if mb is None or mb["precision"] == ma["precision"]:
                continue
            scores = {}
            for test, key, label in PRECISION_SCORES:
                x, y = ma["tests"][test][key], mb["tests"][test][key]
                scores[label] = (x, y, round(y - x, 3))
            rows.append({"pe": pe, "seed": int(seed), "a": ma["precision"], "b": mb["precision"], "scores": scores})
    return rows


def precision_markdown(rows: list[dict]) -> str:
    """:func:`precision_pairs` as a Markdown table: each score in both precisions and the difference."""
    if not rows:
        raise ValueError("no model is in both run folders in different precisions")
    labels = [label for _, _, label in PRECISION_SCORES]
    head = "| scheme | seed | " + " | ".join(f"{lab}: {rows[0]['a']} → {rows[0]['b']} (Δ)" for lab in labels) + " |"
    lines = [head, "|" + "---|" * (2 + len(labels))]
    for r in rows:
        nd = {lab: 3 if lab.startswith("BP") else 2 for lab in labels}
        cells = [f"{a:.{nd[lab]}f} → {b:.{nd[lab]}f} ({d:+.{nd[lab]}f})"
                 for lab, (a, b, d) in ((lab, r["scores"][lab]) for lab in labels)]
        lines.append(f"| {r['pe']} | {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PRECISION_HEADER = """# The precision of the finale's laptop recipe, measured

The models of this folder repeat models of `results/wmt14-laptop` with the same scheme, seed, data, batch
order and initial weights, in another precision (`precision` in each `result.json`). The table gives each
score in both and the difference; it is written from the two `results.json` by
`python -m posenc_lib.experiments.wmt14.report precision results/wmt14-laptop results/wmt14-laptop-precision`.
A difference holds the precision's effect and the training noise it sets off (the two runs part at the first
rounding), so it is the size of change a precision switch can cause, not a bias of one precision.

"""


SUMMARY_COLUMNS = (("heldout", "bleu", 1, "in-domain BLEU"), ("heldout", "shuffled", 1, "in-domain BLEU, shuffled source"),
                   ("heldout", "chrf", 1, "in-domain chrF"), ("heldout", "bertscore_f1", 3, "in-domain BERTScore F1"),
                   ("newstest2014", "bleu", 1, "newstest2014 BLEU"), ("newstest2014", "short_bleu", 1, "newstest2014 BLEU, ≤ 24"))


def cpu_hours(results: dict) -> float:
    """Training and decoding wall time of every model of a run, summed, in hours (each model ran on one thread)."""
    return sum(r["wall_s"] + sum(t["decode_s"] for t in r["tests"].values())
               for by_seed in results["models"].values() for r in by_seed.values()) / 3600


def summary_markdown(results: dict) -> str:
    """A run's table: per scheme its seeds, their precisions and each score of :data:`SUMMARY_COLUMNS` as the mean
    over seeds ± the half-width of its 95% t-interval (no interval for one seed), then the run's size and cost."""
    stats = {key: seed_stats(results, test, metric) for test, metric, _, _ in SUMMARY_COLUMNS
             for key in [(test, metric)]}
    lines = ["| scheme | seeds | precision | " + " | ".join(c[3] for c in SUMMARY_COLUMNS) + " |",
             "|" + "---|" * (3 + len(SUMMARY_COLUMNS))]
    for pe, by_seed in results["models"].items():
        seeds = sorted(by_seed, key=int)
        precisions = {}
        for s in seeds:
            precisions.setdefault(by_seed[s]["precision"], []).append(s)
        prec = precisions and "; ".join(p if len(precisions) == 1 else f"{p} (seed {','.join(ss)})"
                                        for p, ss in precisions.items())
        cells = []
        for test, metric, nd, _ in SUMMARY_COLUMNS:
            st = stats[test, metric].get(pe)
            cells.append("–" if st is None else f"{st['mean']:.{nd}f}" + ("" if st["n"] == 1 else f" ± {st['ci95']:.{nd}f}"))
        lines.append(f"| `{pe}` | {','.join(seeds)} | {prec} | " + " | ".join(cells) + " |")
    n = sum(len(m) for m in results["models"].values())
    lines += ["", f"{n} models, {cpu_hours(results):.1f} hours of training and decoding summed over the models, each on "
                  "one thread (wall time: other work on the machine slows it too)."]
    return "\n".join(lines) + "\n"


SUMMARY_HEADER = """# {run}: the scores over seeds

Written from `results.json` by `python -m posenc_lib.experiments.wmt14.report summary {path}`.
"In-domain" is the held-out Europarl test, newstest2014 the official news test set and "≤ 24" its sentences whose
source fits the training length. Mean over the seeds listed ± the half-width of the 95% t-interval of that mean
(no interval for one seed). BERTScore uses all-MiniLM-L6-v2 and is not comparable with published BERTScores.

"""


def main(argv: list[str] | None = None) -> int:
    """``python -m posenc_lib.experiments.wmt14.report summary RUN`` writes ``RUN/table.md``;
    ``... precision RUN_A RUN_B`` writes ``RUN_B/precision.md``."""
    import sys

    from ...cli import CliParser
    from ...files import atomic_write_text

    ap = CliParser(prog="python -m posenc_lib.experiments.wmt14.report",
                   description="Tables generated from finished WMT14 run folders.")
    ap.add_argument("table", choices=["summary", "precision"],
                    help="summary: RUN_A/table.md, the scores over seeds; precision: RUN_B/precision.md, "
                         "the models both folders hold in different precisions")
    ap.add_argument("run_a", help="the run folder (for precision: the reference models, e.g. results/wmt14-laptop)")
    ap.add_argument("run_b", nargs="?", help="precision only: the folder of the same models in another precision")
    args = ap.parse_args(argv)
    if (args.table == "precision") != (args.run_b is not None):
        ap.error("precision takes two run folders, summary one")
    try:
        if args.table == "summary":
            target = Path(args.run_a) / "table.md"
            results = read_json(Path(args.run_a) / "results.json")
            text = SUMMARY_HEADER.format(run=Path(args.run_a).name, path=args.run_a) + summary_markdown(results)
        else:
            target = Path(args.run_b) / "precision.md"
            text = PRECISION_HEADER + precision_markdown(precision_pairs(args.run_a, args.run_b))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    atomic_write_text(target, text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
