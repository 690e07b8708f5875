"""Lesson 17's statements, checked against the committed results they describe (results/wmt14-laptop,
results/wmt14-laptop-precision, results/wmt14-gpu-500). Each test names the section whose sentences it keeps
true; when a result changes, the failing assert says which sentence to rewrite."""
import math
from pathlib import Path

import numpy as np
import pytest

from posenc_lib.experiments.wmt14 import report as R
from posenc_lib.experiments.wmt14.evaluate import repetition_rate
from posenc_lib.files import read_json

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "results" / "wmt14-laptop"
GPU = ROOT / "results" / "wmt14-gpu-500"
FOUR = ["none", "sinusoidal", "shaw", "rope"]
NINE = ["none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi"]
FIVE = ["learned", "t5", "xlnet", "deberta", "alibi"]


@pytest.fixture(scope="module")
def results():
    return read_json(RUN / "results.json")


@pytest.fixture(scope="module")
def verdicts(results):
    boot = R.bootstrap_by_seed(RUN, "heldout", schemes=NINE, tag="nine", cache=True)
    return {(a, b): R.ranking_verdict(results, boot, a, b) for a in NINE for b in NINE if a != b}


def _bleu(results, pe, seed, test="heldout"):
    return results["models"][pe][str(seed)]["tests"][test]["bleu"]


def test_one_rule_four_way(results, verdicts):
    """'One statistic, one rule': three tiers; Shaw-RoPE not separated with p < 0.05 in one seed of three; all
    twelve in bf16; the reruns in fp32 moved in-domain BLEU by at most 0.28, under a fifth of the smallest ranked gap."""
    assert {len(results["models"][pe]) for pe in FOUR} == {3}
    assert all(r["precision"] == "bf16" for pe in FOUR for r in results["models"][pe].values())
    for a, b in [("none", "sinusoidal"), ("none", "shaw"), ("none", "rope"), ("sinusoidal", "shaw"),
                 ("sinusoidal", "rope")]:
        assert verdicts[a, b]["verdict"] == "b ahead", (a, b)
    sr = verdicts["shaw", "rope"]
    assert sr["verdict"] == "not separated" and sum(x["p"] < 0.05 for x in sr["seeds"].values()) == 1
    prec = R.precision_pairs(RUN, ROOT / "results" / "wmt14-laptop-precision")
    assert len(prec) == 9 and {("shaw", 2), ("rope", 2)} <= {(r["pe"], r["seed"]) for r in prec}
    moved = max(abs(r["scores"]["BLEU in-domain"][2]) for r in prec)
    smallest = min(verdicts[k]["mean"] for k in [("none", "sinusoidal"), ("sinusoidal", "shaw"), ("sinusoidal", "rope")])
    assert round(moved, 2) == 0.28 and moved < smallest / 5
    assert read_json(RUN / "config.json")["profile"]["bootstrap_samples"] == 1000


def test_shuffled_source_and_repetition(results):
    """'Does the model read word order?' and 'What this scale can show': `none` unmoved, sinusoidal/Shaw/RoPE
    lose 14.9-18.0 in every seed; degenerate repetition at most a few percent."""
    assert all(R.shuffle_drop(r) == 0 for r in results["models"]["none"].values())
    drops = [R.shuffle_drop(r) for pe in FOUR[1:] for r in results["models"][pe].values()]
    assert [round(min(drops), 1), round(max(drops), 1)] == [14.9, 18.0]
    rates = [repetition_rate((RUN / f"{pe}-seed{s}" / "hyp.heldout.txt").read_text(encoding="utf-8").splitlines())
             for pe in FOUR for s in results["models"][pe]]
    assert max(rates) < 0.05


def test_what_this_scale_can_and_cannot_show(results):
    """The quality levels, the 1.4-BLEU gap, 73% long newstest sources, single digits on newstest, and the
    parameter counts of the confounds paragraph."""
    bleu = R.seed_stats(results, "heldout", "bleu")
    assert round(max(bleu[pe]["mean"] for pe in NINE)) == 24 and round(bleu["none"]["mean"]) == 14
    for pe in ("shaw", "rope"):
        assert round(R.paired_differences(results, "sinusoidal", pe)["mean"], 1) == 1.4
    within = R.within_training_length(RUN, "newstest2014")
    assert round(1 - within["n"] / within["total"], 2) == 0.73
    assert all(r["tests"]["newstest2014"]["bleu"] < 10 for m in results["models"].values() for r in m.values())
    params = {pe: results["models"][pe]["0"]["params"] for pe in NINE}
    assert max(params[pe] for pe in FOUR) / min(params[pe] for pe in FOUR) - 1 < 0.005
    assert round(params["learned"] / params["none"] - 1, 3) == 0.067
    assert round(params["xlnet"] / params["none"] - 1, 3) == 0.034
    assert round(params["deberta"] / params["none"] - 1, 3) == 0.009
    epochs = {r["epochs"] for m in results["models"].values() for r in m.values()}
    assert {round(e, 1) for e in epochs} == {4.1}  # "about 4 epochs"


def test_the_length_story(results):
    """'How long are the translations?': the in-domain lengths, the early stoppers, T5 running on, `none` and
    ALiBi near the reference length (means over seeds)."""
    story = {test: R.length_story(RUN, test) for test in ("heldout", "newstest2014")}

    def mean(test, pe, key, bucket=None):
        rows = story[test]["models"][pe].values()
        return np.mean([(r["all"] if bucket is None else r["buckets"][bucket])[key] for r in rows])

    ratios = [mean("heldout", pe, "ratio") for pe in NINE]
    assert [round(min(ratios), 2), round(max(ratios), 2)] == [0.97, 1.07]
    assert min(mean("heldout", pe, "bp") for pe in NINE) >= 0.96
    long = story["newstest2014"]["models"]["none"][0]["buckets"][-1]
    assert long["bucket"] == "61+" and long["sentences"] == 484
    early = ["sinusoidal", "learned", "shaw", "rope", "xlnet", "deberta"]
    shares = [mean("newstest2014", pe, "stops_early", -1) for pe in early]
    assert [round(100 * min(shares)), round(100 * max(shares))] == [31, 73]
    bps = [mean("newstest2014", pe, "bp") for pe in early]
    assert [round(min(bps), 2), round(max(bps), 2)] == [0.65, 0.81]
    assert [round(100 * (1 - max(bps))), round(100 * (1 - min(bps)))] == [19, 35]
    others = [pe for pe in NINE if pe not in early]
    assert all(mean("newstest2014", pe, "stops_early", -1) < min(shares) for pe in others)
    assert round(mean("newstest2014", "t5", "ratio"), 1) == 1.6 and mean("newstest2014", "t5", "bp") == 1.0
    assert round(100 * mean("newstest2014", "t5", "runs_on", -1)) == 44
    assert all(abs(mean("newstest2014", pe, "ratio") - 1) < 0.05 for pe in ("none", "alibi"))
    assert all(abs(mean("newstest2014", pe, "ratio") - 1) > 0.15 for pe in early + ["t5"])


def test_nine_encodings_one_rule(results, verdicts):
    """'Nine encodings, one rule': three seeds of each of the five, all bf16; the rule ranks all five ahead of none,
    XLNet and DeBERTa ahead of sinusoidal and of learned, Shaw and RoPE ahead of learned, Shaw ahead of T5, ALiBi
    behind every other position-aware scheme, and nothing else; the descriptive gaps; ALiBi's shuffled-source drops
    against the others'."""
    seeds = {pe: sorted(int(s) for s in results["models"][pe]) for pe in FIVE}
    assert seeds == {pe: [0, 1, 2] for pe in FIVE}
    assert all(r["precision"] == "bf16" for m in results["models"].values() for r in m.values())
    prec = R.precision_pairs(RUN, ROOT / "results" / "wmt14-laptop-precision")
    assert round(max(abs(r["scores"]["BLEU in-domain"][2]) for r in prec), 2) == 0.28

    def gap(a, b):
        return [round(verdicts[a, b]["mean"], 2), round(verdicts[a, b]["ci95"], 2)]

    for pe in FIVE:
        assert verdicts["none", pe]["verdict"] == "b ahead", pe
        assert verdicts["sinusoidal", pe]["verdict"] == \
            {"xlnet": "b ahead", "deberta": "b ahead", "alibi": "a ahead"}.get(pe, "not separated"), pe
    over_none = sorted(FIVE, key=lambda pe: verdicts["none", pe]["mean"])
    assert (over_none[0], over_none[-1]) == ("alibi", "xlnet")
    assert [gap("none", "alibi"), gap("none", "xlnet")] == [[6.64, 1.42], [9.93, 2.49]]
    assert [gap("sinusoidal", "xlnet"), gap("learned", "xlnet"), gap("sinusoidal", "deberta"),
            gap("learned", "deberta")] == [[1.66, 0.72], [1.44, 0.50], [1.43, 0.48], [1.22, 0.33]]
    assert all(x["p"] <= 0.001 for pe in ("xlnet", "deberta") for a in ("sinusoidal", "learned")
               for x in verdicts[a, pe]["seeds"].values())
    for a, b, want in (("learned", "shaw", [1.20, 0.47]), ("learned", "rope", [1.20, 0.57]),
                       ("t5", "shaw", [0.71, 0.51])):
        assert verdicts[a, b]["verdict"] == "b ahead" and gap(a, b) == want, (a, b)
    # ALiBi behind every other position-aware scheme, smallest gap first
    aware = [pe for pe in NINE if pe not in ("none", "alibi")]
    assert all(verdicts["alibi", pe]["verdict"] == "b ahead" for pe in aware)
    behind = sorted(aware, key=lambda pe: verdicts["alibi", pe]["mean"])
    assert behind == ["sinusoidal", "learned", "t5", "shaw", "rope", "deberta", "xlnet"]
    assert [gap("alibi", pe) for pe in behind] == [[1.63, 0.94], [1.85, 1.19], [2.33, 0.28], [3.04, 0.73],
                                                   [3.04, 1.76], [3.07, 1.29], [3.29, 1.55]]
    # nothing else is ranked
    ranked = {(a, b) for a in NINE for b in NINE if a not in ("none", b) and b not in FOUR
              and verdicts[a, b]["verdict"] == "b ahead"}
    assert ranked == {("alibi", pe) for pe in FIVE if pe != "alibi"} | \
        {("sinusoidal", "xlnet"), ("learned", "xlnet"), ("sinusoidal", "deberta"), ("learned", "deberta")}
    assert {(a, b) for a in FIVE for b in FOUR if verdicts[a, b]["verdict"] == "b ahead"} == \
        {("alibi", pe) for pe in ("sinusoidal", "shaw", "rope")} | {("learned", "shaw"), ("learned", "rope"),
                                                                    ("t5", "shaw")}
    close = ["shaw", "rope", "xlnet", "deberta"]
    pairs = [(a, b) for i, a in enumerate(close) for b in close[i + 1:]]
    assert all(verdicts[a, b]["verdict"] == "not separated" for a, b in pairs)
    assert round(max(abs(verdicts[a, b]["mean"]) for a, b in pairs), 2) == 0.25
    xt, dt = verdicts["t5", "xlnet"], verdicts["t5", "deberta"]
    assert xt["verdict"] == dt["verdict"] == "not separated"
    assert [gap("t5", "xlnet"), gap("t5", "deberta")] == [[0.96, 1.35], [0.74, 1.08]]
    ls = verdicts["sinusoidal", "learned"]
    assert ls["verdict"] == "not separated" and gap("sinusoidal", "learned") == [0.21, 0.26]
    assert [round(ls["seeds"][s]["p"], 2) for s in (0, 1, 2)] == [0.09, 0.17, 0.21]
    ts = verdicts["sinusoidal", "t5"]
    assert ts["verdict"] == "not separated" and gap("sinusoidal", "t5") == [0.70, 0.69]
    assert round(ts["seeds"][0]["p"], 2) == 0.09 and all(ts["seeds"][s]["p"] < 0.05 for s in (1, 2))
    alibi_drops = [round(R.shuffle_drop(results["models"]["alibi"][s]), 1) for s in ("0", "1", "2")]
    others = [R.shuffle_drop(r) for pe in NINE if pe not in ("none", "alibi") for r in results["models"][pe].values()]
    assert [min(alibi_drops), max(alibi_drops)] == [10.1, 10.5] and [round(min(others), 1), round(max(others), 1)] == [14.9, 18.0]


def test_alibi_directional(results):
    """'ALiBi, a hypothesis tested': two seeds of the directional variant, both ALiBis in bf16; below symmetric
    ALiBi by 0.85 and 1.07 (bootstrap p <= 0.001 in each seed), paired mean -0.96 +- 1.40, not ranked; below
    sinusoidal by 2.92 and 2.48 (ALiBi: 2.07 and 1.41); smaller shuffled-source drops (8.9 and 9.3 against 10.3
    and 10.5)."""
    models = results["models"]
    assert sorted(models["alibi-directional"]) == ["0", "1"]
    assert [models[pe][s]["precision"] for s in ("0", "1") for pe in ("alibi", "alibi-directional")] == \
        ["bf16"] * 4
    boot = R.bootstrap_by_seed(RUN, "heldout", schemes=["sinusoidal", "alibi", "alibi-directional"], tag="alibi")
    v = R.ranking_verdict(results, boot, "alibi", "alibi-directional")
    assert v["n"] == 2 and v["verdict"] == "not separated"
    assert [round(v["mean"], 2), round(v["ci95"], 2)] == [-0.96, 1.40]
    assert [round(v["seeds"][s]["delta"], 2) for s in (0, 1)] == [-0.85, -1.07]
    assert all(x["p"] <= 0.001 for x in v["seeds"].values())
    assert [round(_bleu(results, "alibi-directional", s), 2) for s in (0, 1)] == [20.05, 20.23]
    assert round(_bleu(results, "alibi", 0), 2) == 20.90
    gaps = [round(_bleu(results, "sinusoidal", s) - _bleu(results, pe, s), 2) for pe in ("alibi-directional", "alibi")
            for s in (0, 1)]
    assert gaps == [2.92, 2.48, 2.07, 1.41]
    drops = [round(R.shuffle_drop(models[pe][s]), 1) for pe in ("alibi-directional", "alibi") for s in ("0", "1")]
    assert drops == [8.9, 9.3, 10.3, 10.5]
    prec = R.precision_pairs(RUN, ROOT / "results" / "wmt14-laptop-precision")
    assert round(max(abs(r["scores"]["BLEU in-domain"][2]) for r in prec), 2) == 0.28


def test_the_gpu_section():
    """'On a GPU': two seeds of 500 updates on an H200; BLEU 13-22 in domain; one order in both seeds with
    p <= 0.001 per step, no step ranked by the rule; the speeds and the calibration's projection."""
    gpu = read_json(GPU / "results.json")
    cal = read_json(GPU / "calibration.json")
    models = {(pe, int(s)): r for pe in FOUR for s, r in gpu["models"][pe].items()}
    assert {s for _, s in models} == {0, 1} and {r["updates"] for r in models.values()} == {500}
    assert cal["hardware"]["gpu"] == "NVIDIA H200"
    bleu = {k: r["tests"]["heldout"]["bleu"] for k, r in models.items()}
    assert [math.floor(min(bleu.values())), math.ceil(max(bleu.values()))] == [13, 22]
    boot = R.bootstrap_by_seed(GPU, "heldout")
    for a, b in [("none", "sinusoidal"), ("sinusoidal", "shaw"), ("shaw", "rope")]:
        v = R.ranking_verdict(gpu, boot, a, b)
        assert v["verdict"] == "not separated" and all(x["p"] <= 0.001 and x["delta"] > 0 for x in v["seeds"].values())
    assert R.t_quantile_975(1) == pytest.approx(12.706, abs=1e-3)  # "with two seeds ... t = 12.71"
    lead = [bleu[("sinusoidal", s)] - bleu[("none", s)] for s in (0, 1)]
    assert [round(min(lead), 1), round(max(lead), 1)] == [1.2, 1.7]
    three = [r["wall_s"] / r["updates"] for (pe, _), r in models.items() if pe != "shaw"]
    assert [round(min(three), 2), round(max(three), 2)] == [0.28, 0.33]
    s_cal = [m["s_per_update"] for m in cal["schemes"].values()]
    assert [round(min(s_cal), 2), round(max(s_cal), 2)] == [0.60, 0.62] and 1.7 < min(s_cal) / max(three) < 2.3
    assert cal["projection"]["max_steps"] == 3200 and 25 <= cal["projection"]["wall_min"] <= 36  # "about half an hour"


def test_where_the_models_look(results):
    """'Where the models look' (first seed of the four): `none` within 0.1 of a uniform row's weight near the
    query; each position-aware model more, and not more on the query token itself."""
    def shares(pe):
        att = results["models"][pe]["0"]["attention"]
        a = np.array(att["weights"])
        n = len(att["tokens"])
        i, j = np.indices(a.shape)
        return a[abs(i - j) <= 1].sum() / n, np.trace(a) / n, n

    near_none, diag_none, n = shares("none")
    uniform = np.mean([(min(k + 1, n - 1) - max(k - 1, 0) + 1) / n for k in range(n)])
    assert abs(near_none - uniform) < 0.1
    for pe in FOUR[1:]:
        near, diag, _ = shares(pe)
        assert near > near_none + 0.05 and diag <= diag_none, pe
