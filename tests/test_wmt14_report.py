"""posenc_lib.experiments.wmt14.report on the committed laptop run: statistics over seeds, per-seed bootstrap,
the sentences within the training length, BLEU by length over seeds."""
import math
import shutil
from pathlib import Path

import pytest

from posenc_lib.experiments.wmt14 import report as R
from posenc_lib.experiments.wmt14 import summarize
from posenc_lib.files import read_json

RUN = Path(__file__).resolve().parents[1] / "results" / "wmt14-laptop"
FOUR = ["none", "sinusoidal", "shaw", "rope"]
NINE = ["none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi"]


def test_interval95_matches_the_t_distribution():
    mean, half = R.interval95([1.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2))
    mean, half = R.interval95([1.0, 2.0, 3.0])
    assert half == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert math.isnan(R.interval95([5.0])[1])
    with pytest.raises(ValueError, match="no values"):
        R.interval95([])
    with pytest.raises(ValueError, match="degrees of freedom"):
        R.t_quantile_975(0)


def test_seed_stats_agree_with_summarize():
    results = read_json(RUN / "results.json")
    stats = R.seed_stats(results, "heldout", "bleu")
    for pe, (mean, std, n) in summarize(results, "heldout", "bleu").items():
        assert stats[pe]["mean"] == pytest.approx(mean) and stats[pe]["n"] == n == len(results["models"][pe])
        assert stats[pe]["min"] <= mean <= stats[pe]["max"]
    with pytest.raises(ValueError, match="valid choices"):
        R.seed_stats(results, "heldout", "bleuu")


def test_bootstrap_runs_for_every_seed_and_is_cached(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("figures", "bootstrap_by_seed.*"))
    by_seed = R.bootstrap_by_seed(run, n_samples=20, schemes=FOUR)
    assert sorted(by_seed) == [0, 1] or sorted(by_seed) == [0, 1, 2]
    for rows in by_seed.values():
        assert {(r["baseline"], r["system"]) for r in rows} >= {("none", "rope"), ("sinusoidal", "shaw")}
        assert all(0 <= r["bleu_p"] <= 1 for r in rows)
    assert (run / "bootstrap_by_seed.heldout.json").is_file()
    assert R.bootstrap_by_seed(run, n_samples=20, schemes=FOUR) == by_seed  # read back, not recomputed
    (run / "rope-seed1" / "hyp.heldout.txt").write_text("x\n" * 2000)  # changed inputs: recomputed
    again = R.bootstrap_by_seed(run, n_samples=20, schemes=FOUR)
    assert again[1] != by_seed[1] and again[0] == by_seed[0]
    # a tagged cache for another set of schemes sits beside the first and leaves it alone
    before = (run / "bootstrap_by_seed.heldout.json").read_bytes()
    two = R.bootstrap_by_seed(run, n_samples=20, schemes=["sinusoidal", "shaw"], tag="pair")
    assert (run / "bootstrap_by_seed.heldout.pair.json").is_file()
    assert (run / "bootstrap_by_seed.heldout.json").read_bytes() == before
    assert all({(r["baseline"], r["system"]) for r in rows} == {("sinusoidal", "shaw")} for rows in two.values())
    with pytest.raises(ValueError, match="tag must be"):
        R.bootstrap_by_seed(run, n_samples=20, schemes=FOUR, tag="../x")


def test_committed_bootstrap_cache_matches_the_committed_hypotheses(monkeypatch, tmp_path):
    """Lesson 17 reads the per-seed bootstrap from its cache: the cache must answer for today's files."""
    results = read_json(RUN / "results.json")
    cached = read_json(RUN / "bootstrap_by_seed.heldout.json")
    assert cached["n_samples"] == results["config"]["profile"]["bootstrap_samples"] == 1000
    seeds = sorted({int(s) for pe in FOUR for s in results["models"][pe]})
    assert sorted(int(s) for s in cached["seeds"]) == seeds
    # the digest covers the resample count, the schemes, every hypothesis and the references: recomputing is not
    # needed when they agree, so reading it back must not call the bootstrap
    run = tmp_path / "run"  # a copy: a stale cache must not be rewritten in the repository by this test
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("figures"))
    calls = []
    monkeypatch.setattr(R, "paired_bootstrap", lambda *a, **k: calls.append(1) or [])
    again = R.bootstrap_by_seed(run, "heldout", schemes=FOUR, cache=True)
    assert calls == [] and sorted(again) == seeds
    # lesson 17's second cache: every pair of the nine schemes in every seed
    again = R.bootstrap_by_seed(run, "heldout", schemes=NINE, cache=True, tag="nine")
    assert calls == [] and sorted(again) == seeds


def test_within_training_length_keeps_the_short_sources():
    w = R.within_training_length(RUN)
    assert w["total"] == 3003 and w["max_tokens"] == 24
    assert 0.2 < w["n"] / w["total"] < 0.35  # most newstest2014 sources are longer than 24 tokens
    results = read_json(RUN / "results.json")
    assert set(w["models"]) == set(results["models"])
    for pe, by_seed in w["models"].items():
        assert set(by_seed) == {int(s) for s in results["models"][pe]}
        for seed, scores in by_seed.items():  # the pipeline scored the same subset when the model finished
            short = results["models"][pe][str(seed)]["tests"]["newstest2014"]["short_sources"]
            assert short["sentences"] == w["n"] and scores["bleu"] == pytest.approx(short["bleu"], abs=0.01)


def test_bleu_by_length_averages_the_seeds():
    by_scheme = R.bleu_by_length_over_seeds(RUN, schemes=["rope"])
    assert list(by_scheme) == ["rope"]
    rows = by_scheme["rope"]
    assert sum(r["sentences"] for r in rows) == 3003
    for r in rows:
        assert r["bleu"] == pytest.approx(sum(r["bleu_by_seed"].values()) / len(r["bleu_by_seed"]))
    assert len(rows[0]["bleu_by_seed"]) == len(read_json(RUN / "results.json")["models"]["rope"])
    with pytest.raises(ValueError, match="no model of 'ropee'; valid choices: .*rope"):
        R.bleu_by_length_over_seeds(RUN, schemes=["ropee"])


def test_degenerate_repetition_is_found_and_ordinary_text_is_not():
    from posenc_lib.experiments.wmt14.evaluate import degenerate, repetition_rate

    # the failures of undertrained models, as they appeared in an early run's samples
    for bad, part in [("than than than than", "than than than than"), ("Mr Titititititit", "itititititit"),
                      ("Accccccccc", "ccccccccc"), ("signs in in in Indonesia", "in in in")]:
        assert degenerate(bad) == part
    for ok in ["in in Indonesia", "I had had a bad day", "Mississippi and banana", "1000000 euros", "Wait.....",
               "The Commission would be able to do so."]:
        assert degenerate(ok) is None, ok
    assert repetition_rate(["a b c", "no no no", "fine", "x x x x"]) == 0.5
    with pytest.raises(TypeError, match="one output string"):
        degenerate(["a list"])
    with pytest.raises(ValueError):
        repetition_rate([])


def test_seed_stats_reads_the_short_sources_and_names_bad_metrics():
    results = read_json(RUN / "results.json")
    short = R.seed_stats(results, "newstest2014", "short_bleu")
    for pe, st in short.items():
        vals = [r["tests"]["newstest2014"]["short_sources"]["bleu"] for r in results["models"][pe].values()]
        assert st["mean"] == pytest.approx(sum(vals) / len(vals))
    assert R.seed_stats(results, "heldout", "short_bleu") == {}  # only newstest2014 has the short subset
    with pytest.raises(ValueError, match="short_chrf"):
        R.seed_stats(results, "heldout", "long_bleu")


def test_plot_seed_bars_draws_mean_interval_and_seeds():
    from matplotlib.figure import Figure

    results = read_json(RUN / "results.json")
    ax = Figure().subplots()
    drawn = R.plot_seed_bars(ax, results, "heldout", "bleu", schemes=["none", "rope"])
    assert list(drawn) == ["none", "rope"]
    means = [y for line in ax.lines if line.get_marker() == "s" for y in line.get_ydata()]
    assert means == pytest.approx([drawn["none"]["mean"], drawn["rope"]["mean"]])
    dots = [y for line in ax.lines for y in line.get_ydata() if line.get_marker() == "."]
    assert sorted(dots) == sorted(v for pe in drawn for v in drawn[pe]["values"].values())
    low = min(dots)
    assert ax.get_ylim()[0] > 0.5 * low  # the axis fits the values: no bars from zero hiding the gaps


def test_paired_differences_plot_draws_every_seed_and_the_rules_verdict():
    from matplotlib.figure import Figure

    results = _fake_results({"a": {0: 20.0, 1: 21.0, 2: 20.5}, "b": {0: 22.0, 1: 23.1, 2: 22.4},
                             "c": {0: 20.1}})
    boot = _fake_boot({("a", "b", s): (20, 22, 0.001) for s in (0, 1, 2)} | {("a", "c", 0): (20.0, 20.1, 0.4)})
    ax = Figure().subplots()
    out = R.plot_paired_differences(ax, results, boot, "a", ["b", "c"])
    assert out["b"]["verdict"] == "b ahead" and out["c"]["verdict"] == "not separated" and out["c"]["n"] == 1
    dots = sorted(x for line in ax.lines if line.get_marker() == "o" for x in line.get_xdata())
    assert dots == pytest.approx(sorted([2.0, 2.1, 1.9, 0.1]))
    with pytest.raises(ValueError, match="no scheme"):
        R.plot_seed_bars(ax, results, "heldout", "bleu", schemes=["xpos"])


def _fake_results(values: dict[str, dict[int, float]]) -> dict:
    return {"models": {pe: {str(s): {"tests": {"heldout": {"bleu": v}}} for s, v in by_seed.items()}
                       for pe, by_seed in values.items()}}


def _fake_boot(pairs: dict[tuple[str, str, int], tuple[float, float, float]]) -> dict:
    out = {}
    for (base, system, seed), (b0, b1, p) in pairs.items():
        out.setdefault(seed, []).append({"baseline": base, "system": system, "bleu_baseline": b0, "bleu_system": b1,
                                         "bleu_p": p})
    return out


def test_paired_differences_are_per_seed_with_a_t_interval():
    from posenc_lib.experiments.wmt14.report import paired_differences
    from posenc_lib.stats import t_quantile_975

    res = _fake_results({"a": {0: 10.0, 1: 11.0, 2: 12.0, 3: 9.0}, "b": {0: 11.0, 1: 13.0, 2: 12.5}})
    d = paired_differences(res, "a", "b")
    assert d["diffs"] == {0: 1.0, 1: 2.0, 2: 0.5} and d["n"] == 3  # seed 3 has no partner
    sd = (((1 - 7 / 6) ** 2 + (2 - 7 / 6) ** 2 + (0.5 - 7 / 6) ** 2) / 2) ** 0.5
    assert d["mean"] == pytest.approx(7 / 6) and d["ci95"] == pytest.approx(t_quantile_975(2) * sd / 3 ** 0.5)
    with pytest.raises(ValueError, match="'c'.*valid choices: a, b"):
        paired_differences(res, "a", "c")


def test_the_decision_rule_needs_the_interval_and_every_seeds_bootstrap():
    from posenc_lib.experiments.wmt14.report import ranking_verdict

    res = _fake_results({"a": {0: 10.0, 1: 11.0, 2: 12.0}, "b": {0: 11.0, 1: 12.2, 2: 13.1}})
    boot = _fake_boot({("a", "b", 0): (10.0, 11.0, 0.001), ("a", "b", 1): (11.0, 12.2, 0.01),
                       ("b", "a", 2): (13.1, 12.0, 0.02)})  # a row may name the pair either way round
    v = ranking_verdict(res, boot, "a", "b")
    assert v["verdict"] == "b ahead" and v["seeds"][2]["delta"] == pytest.approx(1.1)
    assert ranking_verdict(res, boot, "b", "a")["verdict"] == "a ahead"
    boot[1][0]["bleu_p"] = 0.2  # one seed's bootstrap does not separate them: no ranking
    assert ranking_verdict(res, boot, "a", "b")["verdict"] == "not separated"
    one = _fake_results({"a": {0: 10.0}, "b": {0: 15.0}})  # one seed carries no interval
    assert ranking_verdict(one, _fake_boot({("a", "b", 0): (10.0, 15.0, 0.001)}), "a", "b")["verdict"] == "not separated"


def test_the_precision_table_is_the_rendering_of_both_runs():
    """results/wmt14-laptop-precision/precision.md is what report.precision_* make of the two results.json."""
    other = RUN.parent / "wmt14-laptop-precision"
    rows = R.precision_pairs(RUN, other)
    assert {(r["pe"], r["seed"]) for r in rows} >= {("shaw", 2), ("rope", 2)}
    assert all(r["a"] == "bf16" and r["b"] == "fp32" for r in rows)  # the lesson's run in bf16, the reruns in fp32
    for r in rows:
        for a, b, d in r["scores"].values():
            assert d == pytest.approx(b - a, abs=1e-6)
    assert (other / "precision.md").read_text() == R.PRECISION_HEADER + R.precision_markdown(rows)
    with pytest.raises(ValueError, match="no model is in both run folders"):
        R.precision_markdown(R.precision_pairs(RUN, RUN))


def test_the_summary_table_is_the_rendering_of_the_run():
    """results/wmt14-laptop/table.md is what report.summary_markdown makes of results.json; its cells are
    seed_stats' means and intervals, its cost line the sum of every model's training and decoding time."""
    results = R.read_json(RUN / "results.json")
    text = R.summary_markdown(results)
    assert (RUN / "table.md").read_text() == R.SUMMARY_HEADER.format(run=RUN.name, path="results/wmt14-laptop") + text
    rows = {line.split(" | ")[0].strip("|` "): line.split(" | ")[1:] for line in text.splitlines()
            if line.startswith("| `")}
    assert list(rows) == list(results["models"])
    bleu = R.seed_stats(results, "heldout", "bleu")
    for pe, cells in rows.items():
        assert cells[0] == ",".join(sorted(results["models"][pe], key=int))
        want = f"{bleu[pe]['mean']:.1f}" + ("" if bleu[pe]["n"] == 1 else f" ± {bleu[pe]['ci95']:.1f}")
        assert cells[2] == want, pe
    n = sum(len(m) for m in results["models"].values())
    assert f"{n} models, {R.cpu_hours(results):.1f} hours of training and decoding" in text


def test_summary_cli_refuses_a_missing_folder_and_wrong_arity(tmp_path, capsys):
    assert R.main(["summary", str(tmp_path)]) == 2
    assert "results.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        R.main(["summary", str(RUN), str(tmp_path)])
    assert not (tmp_path / "table.md").exists() and not (tmp_path / "precision.md").exists()


def test_length_row_follows_sacrebleus_brevity_penalty():
    """Two sentences, hypothesis lengths 3 and 13 against references 8 and 6 (13a tokens): ratio 16/14, BP 1; the
    first alone stops early (3 < 8/2), the second alone runs on (13 > 2 x 6) with BP 1, and 3 vs 8 gives
    BP = exp(1 - 8/3)."""
    from sacrebleu.metrics import BLEU

    hyps = ["a b c", "a b c d e f g h i j k l m"]
    refs = ["a b c d e f g h", "a b c d e f"]
    stats = BLEU()._extract_corpus_statistics(hyps, [refs])
    both, first, second = R.length_row(stats, [0, 1]), R.length_row(stats, [0]), R.length_row(stats, [1])
    assert (both["hyp_len"], both["ref_len"], both["ratio"], both["bp"]) == (16, 14, round(16 / 14, 3), 1.0)
    assert both["stops_early"] == 0.5 and both["runs_on"] == 0.5
    assert first["bp"] == round(math.exp(1 - 8 / 3), 3) and first["stops_early"] == 1.0 and first["runs_on"] == 0.0
    assert second["bp"] == 1.0 and second["runs_on"] == 1.0
    assert first["bleu_without_bp"] == pytest.approx(first["bleu"] / math.exp(1 - 8 / 3), abs=0.02)


@pytest.mark.parametrize("test", ["heldout", "newstest2014"])
def test_length_story_of_the_committed_run_agrees_with_its_scores(test, monkeypatch):
    """The committed cache answers for today's files, and its figures are those each model's result.json holds:
    whole-set BLEU and brevity penalty, buckets that partition the test set."""
    results = read_json(RUN / "results.json")
    calls = []
    real = R.length_row
    monkeypatch.setattr(R, "length_row", lambda *a: calls.append(1) or real(*a))
    story = R.length_story(RUN, test)
    assert calls == []  # read back from lengths.TEST.json, not recomputed
    assert set(story["models"]) == set(results["models"])
    for pe, by_seed in results["models"].items():
        assert set(story["models"][pe]) == {int(s) for s in by_seed}
        for seed, rec in by_seed.items():
            row = story["models"][pe][int(seed)]
            assert row["all"]["bleu"] == rec["tests"][test]["bleu"] and row["all"]["bp"] == rec["tests"][test]["bleu_bp"]
            assert row["all"]["ratio"] == round(row["all"]["hyp_len"] / row["all"]["ref_len"], 3)
            buckets = row["buckets"]
            assert sum(b["sentences"] for b in buckets) == row["all"]["sentences"] == rec["tests"][test]["sentences"]
            assert sum(b["hyp_len"] for b in buckets) == row["all"]["hyp_len"]


def test_length_story_is_recomputed_when_a_translation_changes(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("figures", "bootstrap_by_seed.*"))
    before = R.length_story(run, "heldout")
    hyp = run / "rope-seed0" / "hyp.heldout.txt"
    hyp.write_text("".join(line + " and more words\n" for line in hyp.read_text().split("\n")[:-1]))
    after = R.length_story(run, "heldout")
    assert after["models"]["rope"][0]["all"]["hyp_len"] > before["models"]["rope"][0]["all"]["hyp_len"]
    assert after["models"]["shaw"] == before["models"]["shaw"]
    with pytest.raises(ValueError, match="strictly increasing"):
        R.length_story(run, "heldout", edges=(1, 1))


def test_long_sample_picks_one_sentence_for_every_scheme():
    sample = R.long_sample(RUN, "newstest2014", tokens=(40, 50))
    results = read_json(RUN / "results.json")
    assert 40 <= sample["tokens"] <= 50 and set(sample["hypotheses"]) == set(results["models"])
    refs = (RUN / "ref.newstest2014.txt").read_text().split("\n")
    assert refs[sample["index"]] == sample["reference"]
    with pytest.raises(ValueError, match="no newstest2014 source"):
        R.long_sample(RUN, "newstest2014", tokens=(100000, 100001))
