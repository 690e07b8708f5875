"""The length-extrapolation experiment: task, training, scoring, results files, resume, errors."""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc_lib import PE_TYPES
from posenc_lib.experiments import extrapolation as ex

ROOT = Path(__file__).resolve().parent.parent

TINY = ex.ExtrapolationConfig(
    name="tiny", train_min_len=2, train_max_len=6, test_lengths=(4, 6, 12), d_model=16, n_heads=2, num_layers=1,
    dim_feedforward=32, steps=4, batch_size=8, lr=3e-3, warmup=2, eval_examples=6, eval_batch_size=4,
)  # fmt: skip


def test_profiles_cover_the_brief():
    course = ex.PROFILES["course"]
    assert max(course.test_lengths) >= 4 * course.train_max_len
    assert course.learned_max_len == course.train_max_len + 1
    smoke = ex.PROFILES["smoke"]
    assert max(smoke.test_lengths) >= 4 * smoke.train_max_len
    assert smoke.steps * smoke.batch_size < course.steps * course.batch_size


@pytest.mark.parametrize("task", ex.TASKS)
@pytest.mark.parametrize("anchored", [True, False])
def test_batch_structure(task, anchored):
    cfg = replace(TINY, task=task, anchored=anchored)
    g = torch.Generator().manual_seed(0)
    lengths = [2, 5, 3]
    b = ex.make_batch(cfg, lengths, g)
    assert b["src"].shape == (3, 5 + anchored) and b["tgt_in"].shape == b["tgt_out"].shape == (3, 6)
    for i, n in enumerate(lengths):
        x = b["src"][i, :n]
        assert ((x >= ex.FIRST_SYMBOL) & (x < cfg.vocab_size)).all()
        if anchored:  # the end-of-source token sits right after the symbols
            assert b["src"][i, n] == ex.EOS
        assert (b["src"][i, n + anchored :] == ex.PAD).all() and b["src_pad"][i].sum() == 5 - n
        y = x.flip(0) if task == "reverse" else x
        assert torch.equal(b["tgt_out"][i, :n], y) and b["tgt_out"][i, n] == ex.EOS
        assert b["tgt_in"][i, 0] == ex.BOS and torch.equal(b["tgt_in"][i, 1 : n + 1], y)
        assert (b["tgt_out"][i, n + 1 :] == ex.PAD).all()
        # the target is a permutation of the source: only positions distinguish the tasks
        assert torch.equal(y.sort().values, x.sort().values)


def test_decoder_only_sequences_put_the_loss_on_the_target():
    cfg = replace(TINY, arch="decoder")
    b = ex.make_batch(cfg, [2, 4], torch.Generator().manual_seed(3))
    tokens, labels = ex.lm_batch(cfg, b)
    assert tokens.shape == labels.shape == (2, 4 + 1 + 4 + 1)  # source, </s>, <bos>, target
    for i, n in enumerate([2, 4]):
        src, y = b["src"][i, : n + 1], b["tgt_out"][i, :n]
        assert torch.equal(tokens[i, : n + 1], src) and tokens[i, n + 1] == ex.BOS
        assert torch.equal(tokens[i, n + 2 : 2 * n + 2], y)
        # after reading <bos> the LM must say y_0; after y_{n-1}, </s>; nothing is asked of the source
        assert (labels[i, : n + 1] == -100).all()
        assert torch.equal(labels[i, n + 1 : 2 * n + 1], y) and labels[i, 2 * n + 1] == ex.EOS
        assert (labels[i, 2 * n + 2 :] == -100).all()
    assert cfg.max_sequence_length(4) == 4 + 1 + 4 + 1 == cfg.learned_max_len - 2 * (TINY.train_max_len - 4)


@pytest.mark.parametrize("arch", ex.ARCHS)
def test_teacher_forced_exact_match_equals_greedy(arch):
    """The shortcut used for the mastery check and the decoder-only scores is exact."""
    cfg = replace(TINY, arch=arch, task="copy", steps=120 if arch == "encdec" else 200, batch_size=16, lr=1e-2, warmup=5, eval_examples=40,
                  eval_batch_size=40)  # fmt: skip
    model, _, _ = ex.train("learned", cfg, seed=0, progress=False)
    b = ex.test_batch(cfg, 5)
    if arch == "decoder":
        pred = ex.greedy_decode_lm(model, torch.cat((b["src"], torch.full_like(b["src"][:, :1], ex.BOS)), 1), 6)
    else:
        pred = ex.greedy_decode(model, b["src"], max_new_tokens=6, bos_id=ex.BOS, eos_id=ex.EOS)
    greedy_exact, greedy_token = ex.score(pred, b)
    tf_exact, tf_token = ex.teacher_forced(model, cfg, b)
    assert 0.0 < greedy_exact < 1.0  # partly trained: the comparison is not between two zeros
    assert tf_exact == pytest.approx(greedy_exact) and tf_token >= greedy_token - 1e-6


def test_training_stops_at_mastery_or_at_the_cap():
    easy = replace(TINY, task="copy", train_min_len=1, train_max_len=3, test_lengths=(3,), steps=400, batch_size=16,
                   lr=1e-2, warmup=5, mastery=0.6, check_every=20, eval_examples=40, eval_batch_size=40)  # fmt: skip
    _, _, info = ex.train("learned", easy, seed=0, progress=False)
    assert info["mastered"] and info["steps"] < easy.steps and info["steps"] % easy.check_every == 0
    assert info["mastery_curve"][-1] == [info["steps"], pytest.approx(info["mastery_curve"][-1][1])]
    assert info["mastery_curve"][-1][1] >= 0.6 > max(v for _, v in info["mastery_curve"][:-1])
    _, _, capped = ex.train("learned", replace(easy, steps=20, mastery=1.0), seed=0, progress=False)
    assert capped["steps"] == 20 and capped["mastered"] is False
    _, _, fixed = ex.train("learned", replace(easy, steps=20, mastery=0.0), seed=0, progress=False)
    assert fixed["mastered"] is None and fixed["mastery_curve"] == []


def test_scaled_tables_are_reached_in_training():
    """With table_sizes="scaled" every learned relative entry is used at the training lengths."""
    from posenc_lib import deberta_log_bucket, t5_relative_bucket

    cfg = ex.PROFILES["course"]
    assert cfg.anchored and cfg.table_sizes == "scaled" and cfg.mastery == 0.99 and cfg.bias_lr_scale > 1
    assert cfg.table_options("shaw") == {"max_relative_position": 8}  # k = 8 at training length 16
    opts_t5, opts_deb = cfg.table_options("t5"), cfg.table_options("deberta")
    s = cfg.max_sequence_length(cfg.train_max_len)
    rel = torch.arange(s)[None, :] - torch.arange(s)[:, None]
    far = torch.arange(256)[None, :] - torch.arange(256)[:, None]
    for causal in (False, True):
        seen = set(t5_relative_bucket(rel if not causal else rel.clamp(max=0), not causal, **opts_t5).flatten().tolist())
        later = set(t5_relative_bucket(far if not causal else far.clamp(max=0), not causal, **opts_t5).flatten().tolist())
        assert later <= seen
    bucket = lambda r: deberta_log_bucket(r, opts_deb["position_buckets"], opts_deb["max_relative_positions"])
    span = opts_deb["position_buckets"]
    assert set(bucket(far).clamp(-span, span - 1).flatten().tolist()) <= set(bucket(rel).clamp(-span, span - 1).flatten().tolist())
    # the library defaults leave entries that training never reaches
    lib = ex.PROFILES["pilot"]
    assert lib.table_options("t5") == {} and not lib.anchored
    assert len(set(t5_relative_bucket(far).flatten().tolist()) - set(t5_relative_bucket(rel).flatten().tolist())) > 0


def test_bias_tables_learn_faster():
    cfg = ex.PROFILES["course"]
    groups = ex.param_groups(ex.make_model("t5", cfg), cfg)
    assert [g["lr_scale"] for g in groups] == [1.0, cfg.bias_lr_scale]
    model = ex.make_model("t5", cfg)
    fast = {id(p) for p in ex.param_groups(model, cfg)[1]["params"]}
    assert fast == {id(p) for p in list(model.enc_scheme.parameters()) + list(model.dec_scheme.parameters())}
    assert [g["lr_scale"] for g in ex.param_groups(ex.make_model("rope", cfg), cfg)] == [1.0]
    assert ex.lr_at(cfg.warmup, cfg) == pytest.approx(cfg.lr) and ex.lr_at(cfg.steps, cfg) == pytest.approx(0.1 * cfg.lr)


def test_randomized_positions():
    cfg = replace(TINY, random_positions_max=40)
    model = ex.make_model("learned-rand", cfg)
    assert model.enc_scheme.table.max_len == 40 and ex.randomized_schemes(model) == [model.enc_scheme, model.dec_scheme]
    assert ex.randomized_schemes(ex.make_model("learned", cfg)) == []
    g = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(20):
        ex.sample_positions(model, cfg, 7, g)
        pos = model.enc_scheme.position_map
        assert pos.shape == (7,) and (pos.diff() > 0).all() and 0 <= pos.min() and pos.max() < 40
        assert model.dec_scheme.position_map is pos
        seen.append(pos.max().item())
        # the scheme reads the sampled positions: its code for 0..6 is the table's rows at pos
        assert torch.equal(model.enc_scheme.embed(torch.arange(7)), model.enc_scheme.table.weight[pos])
    assert max(seen) > 20  # positions far beyond the training length get trained
    rope = ex.make_model("rope-rand", cfg)
    ex.sample_positions(rope, cfg, 5, g)
    prep = rope.enc_scheme.prepare(torch.arange(5), torch.arange(5))
    assert torch.equal(prep["q_pos"], rope.enc_scheme.position_map)
    # after training the map is cleared; evaluation samples its own, and a learned-rand
    # model represents test lengths beyond the training range
    trained, _, _ = ex.train("learned-rand", replace(cfg, steps=3), seed=0, progress=False)
    assert trained.enc_scheme.position_map is None
    rows = {r["length"]: r for r in ex.evaluate(trained, cfg)}
    assert rows[12]["representable"] and trained.enc_scheme.position_map is None
    with pytest.raises(ValueError, match="random_positions_max"):
        ex.ExtrapolationConfig(test_lengths=(4, 200), random_positions_max=100)


def test_decoder_only_runs_every_scheme(tmp_path):
    cfg = replace(TINY, arch="decoder", steps=2, eval_examples=4)
    assert "alibi-split" not in ex.all_runs("decoder") and "alibi-split" in ex.all_runs("encdec")
    assert {"sinusoidal-rand", "learned-rand", "rope-rand"} <= set(ex.all_runs("decoder"))
    paths = ex.run_all(cfg, ex.all_runs("decoder"), [0], tmp_path, progress=False, log=lambda *_: None)
    recs = ex.load_results(tmp_path)
    assert len(recs) == len(paths) == len(ex.all_runs("decoder"))
    for r in recs:
        assert r["config"]["arch"] == "decoder" and r["token_accuracy_method"] == "teacher-forced"
    learned = next(r for r in recs if r["pe"] == "learned")
    assert [row["representable"] for row in learned["eval"]] == [True, True, False]


def test_training_lengths_stay_in_range_and_test_sets_are_fixed():
    g = torch.Generator().manual_seed(1)
    lens = ex.train_lengths(TINY, 500, g)
    assert min(lens) == TINY.train_min_len and max(lens) == TINY.train_max_len
    a, b = ex.test_batch(TINY, 12), ex.test_batch(TINY, 12)
    assert torch.equal(a["src"], b["src"]) and a["src"].shape == (TINY.eval_examples, 12 + TINY.anchored)
    assert not torch.equal(ex.test_batch(replace(TINY, eval_seed=7), 12)["src"], a["src"])


def test_score_counts_exact_and_token_accuracy():
    b = ex.make_batch(TINY, [3, 3], torch.Generator().manual_seed(0))
    perfect = torch.cat((torch.full((2, 1), ex.BOS), b["tgt_out"]), dim=1)
    assert ex.score(perfect, b) == (1.0, 1.0)
    wrong = perfect.clone()
    wrong[0, 1] = ex.FIRST_SYMBOL + (wrong[0, 1] - ex.FIRST_SYMBOL + 1) % TINY.n_symbols  # one symbol off
    exact, token = ex.score(wrong, b)
    assert exact == 0.5 and token == pytest.approx((2 / 3 + 1) / 2)
    no_eos = perfect.clone()
    no_eos[:, -1] = ex.FIRST_SYMBOL  # all symbols right, but no end token: not an exact match
    assert ex.score(no_eos, b) == (0.0, 1.0)
    short = perfect[:, :2]  # stopped after one token: the missing ones count as wrong
    assert ex.score(short, b) == (0.0, pytest.approx(1 / 3))


def test_tiny_training_run_loss_falls():
    cfg = replace(TINY, steps=60, batch_size=16, lr=1e-2, warmup=5)
    _, losses, info = ex.train("sinusoidal", cfg, seed=0, progress=False, log_every=10)
    assert info["steps"] == 60 and info["mastered"] is None
    assert len(losses) == 6
    assert losses[-1] < 0.8 * losses[0]


def test_learned_table_beyond_training_length_is_recorded_not_hidden():
    model = ex.make_model("learned", TINY)
    assert model.enc_scheme.table.max_len == TINY.train_max_len + 1
    rows = {r["length"]: r for r in ex.evaluate(model, TINY)}
    assert rows[6]["representable"] and rows[6]["in_training_range"]
    assert not rows[12]["representable"] and not rows[12]["in_training_range"]
    assert rows[12]["exact_match"] == rows[12]["token_accuracy"] == 0.0
    # other schemes represent every length
    assert all(r["representable"] for r in ex.evaluate(ex.make_model("rope", TINY), TINY))


def test_results_json_schema_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "res"
    logs = []
    paths = ex.run_all(TINY, ["learned", "alibi"], [0], out, progress=False, log=logs.append)
    assert [p.name for p in paths] == ["learned_seed0.json", "alibi_seed0.json"]
    rec = json.loads(paths[0].read_text())
    ex.check_record(rec)
    assert rec["schema"] == ex.SCHEMA and rec["pe"] == "learned" and rec["seed"] == 0
    assert rec["config"]["train_max_len"] == 6 and rec["train"]["steps"] == TINY.steps
    assert rec["train"]["cpu_seconds"] >= 0 and rec["eval_cpu_seconds"] >= 0  # the cost, whatever else ran (0.1 s steps)
    assert [r["length"] for r in rec["eval"]] == list(TINY.test_lengths)
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary files

    # a rerun trains nothing: it must not call run_one, and files stay untouched
    mtimes = [p.stat().st_mtime_ns for p in paths]
    monkeypatch.setattr(ex, "run_one", lambda *a, **k: pytest.fail("a finished model was trained again"))
    ex.run_all(TINY, ["learned", "alibi"], [0], out, progress=False, log=logs.append)
    assert [p.stat().st_mtime_ns for p in paths] == mtimes
    assert ex.pending(TINY, ["learned", "alibi", "rope"], [0, 1], out) == [
        ("learned", 1), ("alibi", 1), ("rope", 0), ("rope", 1)]  # fmt: skip

    # results from another configuration are not silently mixed in
    with pytest.raises(ValueError, match="another configuration"):
        ex.pending(replace(TINY, steps=5), ["alibi"], [0], out)

    recs = ex.load_results(out)
    assert [r["pe"] for r in recs] == ["learned", "alibi"]  # course order
    s = ex.summarize(recs, "token_accuracy")
    assert s["learned"]["representable"] == [True, True, False]
    assert s["alibi"]["lengths"] == [4, 6, 12]
    for v in s.values():
        assert all(lo <= m <= hi for lo, m, hi in zip(v["min"], v["mean"], v["max"]))
    tf = ex.summarize(recs, "tf_token_accuracy")  # the teacher-forced metric lesson 13 plots
    by_len = {row["length"]: row["tf_token_accuracy"] for row in recs[1]["eval"]}
    assert tf["alibi"]["mean"] == [by_len[n] for n in tf["alibi"]["lengths"]]  # one seed: mean = the record


def test_check_record_rejects_broken_records():
    rec = {"schema": ex.SCHEMA, "pe": "rope", "seed": 0, "profile": "x", "config": {}, "num_parameters": 1,
           "train": {}, "eval": [{"length": 4, "exact_match": 1.5, "token_accuracy": 1.0, "representable": True}]}
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ex.check_record(rec)
    with pytest.raises(ValueError, match="missing keys"):
        ex.check_record({"schema": ex.SCHEMA})
    with pytest.raises(ValueError, match="schema"):
        ex.check_record({**rec, "schema": "other"})


def test_bad_inputs_give_clear_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="valid choices"):
        ex.ExtrapolationConfig(task="sort")
    with pytest.raises(ValueError, match="train_min_len"):
        ex.ExtrapolationConfig(train_min_len=10, train_max_len=5)
    with pytest.raises(ValueError, match="test length"):
        ex.ExtrapolationConfig(test_lengths=(8, 0))
    with pytest.raises(ValueError, match="valid choices"):
        ex.summarize([], metric="bleu")
    with pytest.raises(ValueError, match="valid choices: none, sinusoidal"):
        ex.run_all(TINY, ["nonsense"], [0], tmp_path, progress=False)
    with pytest.raises(FileNotFoundError, match="no results folder"):
        ex.load_results(tmp_path / "missing")
    for argv, msg in ((["--pe", "sinusoidal,bogus"], "bogus"), (["--seeds", "0,x"], "integers"),
                      (["--profile", "huge"], "invalid choice"), (["--jobs", "0"], "--jobs"),
                      (["--lr", "0"], "lr must be"), (["--lr", "nan"], "lr must be"),
                      (["--bias-lr-scale", "0"], "bias_lr_scale must be"), (["--steps", "0"], "steps must be"),
                      (["--steps", "1.5"], "invalid int")):  # fmt: skip
        with pytest.raises(SystemExit):
            ex.main(argv + ["--out", str(tmp_path)])
        assert msg in capsys.readouterr().err


def test_lr_option_overrides_the_profile_and_keeps_the_rest(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(ex, "run_all", lambda cfg, *a, **k: seen.setdefault("cfg", cfg))
    assert ex.main(["--profile", "course", "--lr", "4e-3", "--pe", "none", "--out", str(tmp_path)]) == 0
    assert seen["cfg"] == replace(ex.PROFILES["course"], lr=4e-3)
    seen.clear()
    ex.main(["--profile", "course", "--pe", "none", "--out", str(tmp_path)])
    assert seen["cfg"] == ex.PROFILES["course"]
    seen.clear()
    ex.main(["--profile", "budget", "--bias-lr-scale", "10", "--pe", "t5", "--out", str(tmp_path)])
    assert seen["cfg"] == replace(ex.PROFILES["budget"], bias_lr_scale=10.0)
    seen.clear()
    ex.main(["--profile", "budget", "--steps", "12000", "--arch", "decoder", "--pe", "none", "--out", str(tmp_path)])
    assert seen["cfg"] == replace(ex.PROFILES["budget"], steps=12000, arch="decoder")


def test_every_scheme_builds_for_the_course_profile():
    cfg = ex.PROFILES["course"]
    for pe in PE_TYPES:
        m = ex.make_model(pe, cfg)
        assert m.pe == pe and m.vocab_size == cfg.vocab_size


def test_alibi_split_variant_is_a_run_of_its_own():
    from posenc_lib.experiments import extrapolation as ex

    assert ex.run_name("alibi-split") == "alibi-split" and ex.run_name("sinpe") == "sinusoidal"
    cfg = ex.PROFILES["smoke"]
    model = ex.make_model("alibi-split", cfg)
    assert model.enc_scheme.bidirectional == "split" and model.pe == "alibi"
    assert ex.RUN_ORDER[len(PE_TYPES)] == "alibi-split" and ex.result_path("o", "alibi-split", 1).name == "alibi-split_seed1.json"


def test_heatmap_writes_every_cell_and_marks_unrepresentable_lengths():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = []
    for seed, shift in ((0, 0.0), (1, 0.2)):
        rows = [{"length": n, "exact_match": v + shift, "token_accuracy": 1.0, "representable": ok}
                for n, v, ok in ((4, 0.5, True), (8, 0.25, True), (12, 0.0, False))]  # fmt: skip
        recs.append({"pe": "learned", "seed": seed, "eval": rows})
    fig, ax = plt.subplots()
    ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=8, title="t")
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts == ["0.60", ".50-.70", "0.35", ".25-.45", "--"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["learned (2)"]


def test_heatmap_band_ci95_writes_the_interval_of_the_mean_where_seeds_differ():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [{"pe": "rope", "seed": seed, "eval": [{"length": 4, "exact_match": 1.0, "token_accuracy": 1.0, "representable": True},
                                                   {"length": 8, "exact_match": v, "token_accuracy": 1.0, "representable": True}]}
            for seed, v in enumerate((0.2, 0.3, 0.4))]  # fmt: skip
    fig, ax = plt.subplots()
    ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=4, band="ci95")
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts == ["1.00", "0.30", "±.25"]  # t(0.975, 2) x sd / sqrt(3) = 4.303 x 0.1 / 1.732; equal seeds: no line
    ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=4, marked=["rope"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rope (3) †"]
    with pytest.raises(ValueError, match=r"marked names runs the summary does not have: \['t5'\]"):
        ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=4, marked=["t5"])
    with pytest.raises(ValueError, match="band"):
        ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=4, band="sd")


def test_accuracy_plot_band_ci95_is_the_interval_of_the_mean_clipped_to_0_1():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [{"pe": "rope", "seed": seed, "eval": [{"length": 4, "exact_match": a, "token_accuracy": 1.0, "representable": True},
                                                   {"length": 8, "exact_match": b, "token_accuracy": 1.0, "representable": True}]}
            for seed, (a, b) in enumerate(((0.9, 0.0), (1.0, 0.0), (1.0, 0.3)))]  # fmt: skip
    drawn = {}
    for band in ("range", "ci95"):
        fig, ax = plt.subplots()
        ax.fill_between = lambda x, low, high, **kw: drawn.setdefault(band, (list(low), list(high)))
        ex.plot_accuracy_vs_length(ax, ex.summarize(recs, "exact_match"), train_max_len=4, metric="exact_match", band=band)
        plt.close(fig)
    assert drawn["range"] == (pytest.approx([0.9, 0.0]), pytest.approx([1.0, 0.3]))
    t = 4.303  # t(0.975, 2); sd 0.0577 at n = 4, 0.1732 at n = 8
    assert drawn["ci95"] == (pytest.approx([0.9667 - t * 0.0577 / 3**0.5, 0.0], abs=2e-3), pytest.approx([1.0, 0.1 + t * 0.1732 / 3**0.5], abs=2e-3))
    with pytest.raises(ValueError, match="band"):
        ex.plot_accuracy_vs_length(ax, ex.summarize(recs, "exact_match"), train_max_len=4, metric="exact_match", band="sd")


def test_whole_seeds_keeps_only_seeds_with_every_run():
    recs = [{"pe": pe, "seed": s} for pe, s in (("rope", 0), ("t5", 0), ("rope", 1), ("t5", 2), ("rope", 2), ("none", 0))]
    kept, seeds = ex.whole_seeds(recs, ("rope", "t5"))
    assert seeds == [0, 2] and [(r["pe"], r["seed"]) for r in kept] == [("rope", 0), ("t5", 0), ("t5", 2), ("rope", 2)]
    assert ex.whole_seeds(recs, ("rope", "alibi")) == ([], [])


def test_budget_runs_are_the_scripts_runs():
    import re

    script = (Path(__file__).resolve().parents[1] / "scripts" / "extrapolation_budget.sh").read_text()
    for arch, runs in ex.BUDGET_RUNS.items():
        assert tuple(re.search(rf"^{arch.upper()}=(.*)$", script, re.M).group(1).split(",")) == runs
        assert all(ex.run_name(r) == r for r in runs)


def test_paired_difference_pairs_seeds_and_refuses_unpaired_ones():
    def rec(pe, seed, v):
        return {"pe": pe, "seed": seed, "eval": [{"length": 20, "exact_match": v, "token_accuracy": v}]}

    recs = [rec("t5", 0, 0.5), rec("t5", 1, 0.1), rec("t5-wide", 0, 0.6), rec("t5-wide", 1, 0.4)]
    d = ex.paired_difference(recs, "t5-wide", "t5", 20)
    assert d["seeds"] == [0, 1] and d["diffs"] == pytest.approx([0.1, 0.3]) and d["wins"] == 2
    assert d["mean"] == pytest.approx(0.2) and d["ci95"] == pytest.approx(12.706 * 0.1, rel=1e-4)  # t(0.975, 1) x sd / sqrt(2)
    with pytest.raises(ValueError, match="different seeds"):
        ex.paired_difference(recs + [rec("t5", 2, 0.0)], "t5-wide", "t5", 20)
    with pytest.raises(ValueError, match="'rope'"):
        ex.paired_difference(recs, "rope", "t5", 20)
    with pytest.raises(ValueError, match="length 24 was not tested"):
        ex.paired_difference(recs, "t5-wide", "t5", 24)


def test_heatmap_labels_do_not_overlap_at_the_lessons_size():
    """Lesson 13 draws 13 runs x 9 lengths, 3 seeds, in a 6.2 x 4.6 inch panel: no two cell labels may overlap
    (the earlier "0.06-0.09" second lines ran into their neighbours); seeds that agree get no range line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [4, 8, 12, 16, 20, 24, 32, 48, 64]
    def record(pe, seed):  # every run's seeds differ, except the last run's, which all score 0
        same = pe == ex.RUN_ORDER[12]
        return {"pe": pe, "seed": seed, "eval": [{"length": n, "representable": True, "token_accuracy": 1.0,
                                                  "exact_match": 0.0 if same else 0.06 + 0.03 * seed + 0.01 * j}
                                                 for j, n in enumerate(lengths)]}

    recs = [record(pe, seed) for pe in ex.RUN_ORDER[:13] for seed in range(3)]
    fig, ax = plt.subplots(figsize=(6.2, 4.6))
    ex.plot_heatmap(ax, ex.summarize(recs, "exact_match"), train_max_len=16, title="t")
    fig.tight_layout()
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.texts]
    texts = [t.get_text() for t in ax.texts]
    plt.close(fig)
    assert texts[:2] == ["0.09", ".06-.12"] and "0.00" in texts and texts.count("0.00") == len(lengths)
    clash = [(texts[a], texts[b]) for a in range(len(boxes)) for b in range(a + 1, len(boxes))
             if boxes[a].overlaps(boxes[b])]
    assert not clash, clash[:5]


def test_per_length_mastery_judges_every_training_length_and_does_not_stop():
    """The budget profile: each training length on its own set; the run goes on to its last update."""
    easy = replace(TINY, task="copy", train_min_len=1, train_max_len=3, test_lengths=(3,), steps=160, batch_size=16,
                   lr=1e-2, warmup=5, mastery=0.9, mastery_examples=30, stop_at_mastery=False, check_every=40,
                   eval_examples=30, eval_batch_size=16)  # fmt: skip
    model, _, info = ex.train("learned", easy, seed=0, progress=False)
    assert info["steps"] == easy.steps  # never stops early
    assert [s for s, _ in info["mastery_curve"]] == [40, 80, 120, 160]
    by_len = info["mastery_by_length"]
    assert set(by_len) == {"1", "2", "3"}
    assert info["mastery_curve"][-1][1] == min(by_len.values())  # the curve follows the weakest length
    # the same numbers, recomputed from the fixed per-length sets
    batches = ex.mastery_batches(easy)
    assert {n: b["lengths"].tolist() for n, b in batches.items()} == {n: [n] * 30 for n in (1, 2, 3)}
    assert ex.mastery_by_length(model, easy, batches) == {int(k): v for k, v in by_len.items()}
    assert info["mastered"] == (min(by_len.values()) >= 0.9)
    first = info["first_mastered"]
    assert first is None or next(s for s, v in info["mastery_curve"] if v >= 0.9) == first
    # the per-length sets never overlap the test sets of the same length
    assert not torch.equal(batches[3]["src"], ex.test_batch(easy, 3)["src"][:30])


def test_budget_profile_treats_every_scheme_alike():
    b = ex.PROFILES["budget"]
    assert b.bias_lr_scale == 1.0 and not b.stop_at_mastery and b.mastery == 0.99 and b.mastery_examples >= 200
    assert b.steps % b.check_every == 0  # the last update is a check
    assert ex.param_groups(ex.make_model("t5", b), b)[1]["lr_scale"] == 1.0
    assert ex.lr_at(b.steps - 1, b) == pytest.approx(0.01 * b.lr, rel=1e-3)  # annealed, so runs end converged
    assert ex.lr_at(ex.PROFILES["course"].steps, ex.PROFILES["course"]) == pytest.approx(0.1 * ex.PROFILES["course"].lr)


def test_position_accuracy_adds_up_to_token_accuracy():
    """Per-position accuracy: n symbols then EOS; its mean over the symbols is the per-token accuracy."""
    b = ex.make_batch(TINY, [3, 3], torch.Generator().manual_seed(0))
    pred = torch.cat((torch.full((2, 1), ex.BOS), b["tgt_out"]), dim=1)
    pred[0, 2] = ex.FIRST_SYMBOL + (pred[0, 2] - ex.FIRST_SYMBOL + 1) % TINY.n_symbols  # row 0 wrong at position 1
    exact, token, right = ex.score(pred, b, positions=True)
    assert right.tolist() == [2.0, 1.0, 2.0, 2.0] and token == pytest.approx(right[:3].sum().item() / 6)
    with pytest.raises(ValueError, match="one length per batch"):
        ex.score(pred, ex.make_batch(TINY, [2, 3], torch.Generator().manual_seed(0)), positions=True)
    for arch in ex.ARCHS:
        cfg = replace(TINY, arch=arch, steps=30)
        model, _, _ = ex.train("rope", cfg, seed=0, progress=False)
        for row in ex.evaluate(model, cfg):
            n = row["length"]
            assert len(row["position_accuracy"]) == len(row["tf_position_accuracy"]) == n + 1
            assert sum(row["position_accuracy"][:n]) / n == pytest.approx(row["token_accuracy"], abs=1e-3)
            assert sum(row["tf_position_accuracy"][:n]) / n == pytest.approx(row["tf_token_accuracy"], abs=1e-3)


def test_records_made_before_a_field_existed_still_resume(tmp_path):
    """A committed record without the later fields counts as made with their old defaults."""
    out = tmp_path / "res"
    ex.run_all(TINY, ["alibi"], [0], out, progress=False, log=lambda *_: None)
    path = out / "alibi_seed0.json"
    rec = json.loads(path.read_text())
    for k in ex.ADDED_DEFAULTS:
        del rec["config"][k]
    path.write_text(json.dumps(rec))
    assert ex.pending(TINY, ["alibi"], [0], out) == []
    with pytest.raises(ValueError, match="another configuration"):
        ex.pending(replace(TINY, stop_at_mastery=False), ["alibi"], [0], out)


def test_mastery_summary_and_position_profile_read_the_records(tmp_path):
    cfg = replace(TINY, steps=20, mastery=0.9, mastery_examples=10, stop_at_mastery=False, check_every=10)
    ex.run_all(cfg, ["rope", "alibi"], [0, 1], tmp_path, progress=False, log=lambda *_: None)
    recs = ex.load_results(tmp_path)
    m = ex.mastery_summary(recs)
    assert set(m) == {"rope", "alibi"} and all(v["runs"] == 2 for v in m.values())
    for pe, v in m.items():
        mine = [r for r in recs if r["pe"] == pe]
        assert v["mastered"] == sum(r["train"]["mastered"] for r in mine)
        assert [w[1] for w in v["weakest"]] == [min(r["train"]["mastery_by_length"].values()) for r in mine]
    prof = ex.position_profile(recs, 6)
    rows = [next(row for row in r["eval"] if row["length"] == 6) for r in recs if r["pe"] == "rope"]
    assert prof["rope"] == pytest.approx([(a + b) / 2 for a, b in zip(*(row["tf_position_accuracy"] for row in rows))])
    assert len(prof["alibi"]) == 7
    with pytest.raises(ValueError, match="was not tested"):
        ex.position_profile(recs, 5)
    s = ex.summarize(recs)
    from posenc_lib.stats import interval95
    vals = [next(row["exact_match"] for row in r["eval"] if row["length"] == 4) for r in recs if r["pe"] == "rope"]
    assert s["rope"]["ci95"][0] == pytest.approx(interval95(vals)[1], nan_ok=True)
    old = ex.load_results(tmp_path)
    for r in old:
        r["train"]["mastery_by_length"] = None
    with pytest.raises(ValueError, match="not judged per training length"):
        ex.mastery_summary(old)


def test_t5_wide_keeps_the_papers_table_and_is_not_in_all():
    cfg = ex.PROFILES["budget"]
    for arch in ex.ARCHS:
        c = replace(cfg, arch=arch)
        wide, scaled = ex.make_model("t5-wide", c), ex.make_model("t5", c)
        scheme_of = (lambda m: m.scheme) if arch == "decoder" else (lambda m: m.enc_scheme)
        assert (scheme_of(wide).num_buckets, scheme_of(wide).max_distance) == (32, 128)
        table = c.table_options("t5")
        assert (scheme_of(scaled).num_buckets, scheme_of(scaled).max_distance) == (table["num_buckets"],
                                                                                   table["max_distance"])
        assert ex.run_table_options("t5-wide", c) == {} and "t5-wide" not in ex.all_runs(arch)


def test_position_plot_draws_one_line_per_run_and_refuses_a_wrong_length():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prof = {"rope": [1.0] * 13, "alibi": [0.5] * 13}
    fig, ax = plt.subplots()
    ex.plot_position_accuracy(ax, prof, length=12, train_max_len=6)
    assert [line.get_label() for line in ax.get_lines()] == ["rope", "alibi"]
    assert list(ax.get_lines()[0].get_xdata()) == list(range(13))
    with pytest.raises(ValueError, match="expected 13"):
        ex.plot_position_accuracy(ax, {"rope": [1.0] * 12}, length=12, train_max_len=6)
    plt.close(fig)


def test_training_minutes_subtract_every_recorded_pause(tmp_path):
    import json

    def record(rel, seconds):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"train": {"seconds": seconds}}))

    record("reverse/encdec/rope_seed0.json", 600.0)
    record("reverse/decoder/rope_seed0.json", 300.0)
    record("copy/encdec/t5_seed1.json", 900.0)
    assert ex.pauses(tmp_path) == {} and ex.training_minutes(tmp_path)["copy/encdec/t5_seed1.json"] == 15.0
    # two pauses, one model in both; the older single-pause layout reads the same
    (tmp_path / "paused.json").write_text(json.dumps({"pauses": [
        {"paused_seconds": 120, "from": "a", "to": "b", "models": ["reverse/encdec/rope_seed0.json"]},
        {"paused_seconds": 60, "from": "c", "to": "d",
         "models": ["reverse/encdec/rope_seed0.json", "copy/encdec/t5_seed1.json"]}]}))
    assert ex.training_minutes(tmp_path) == {"copy/encdec/t5_seed1.json": 14.0, "reverse/decoder/rope_seed0.json": 5.0,
                                             "reverse/encdec/rope_seed0.json": 7.0}
    (tmp_path / "paused.json").write_text(json.dumps({"paused_seconds": 60, "from": "c", "to": "d",
                                                      "models": ["reverse/decoder/rope_seed0.json"]}))
    assert ex.pauses(tmp_path) == {"reverse/decoder/rope_seed0.json": 60.0}
    assert ex.training_minutes(tmp_path)["reverse/decoder/rope_seed0.json"] == 4.0
    # a record with the training's CPU time: that, whatever the wall clock and the pauses say
    path = tmp_path / "reverse/decoder/rope_seed0.json"
    path.write_text(json.dumps({"train": {"seconds": 900.0, "cpu_seconds": 240.0}}))
    assert ex.training_minutes(tmp_path)["reverse/decoder/rope_seed0.json"] == 4.0
    # records at any depth, not only TASK/ARCH/; other files are not records
    record("lr_sweep/encdec_lr1e-3/rope_seed0.json", 120.0)
    record("encdec/none_seed2.json", 60.0)
    (tmp_path / "encdec" / "notes.json").write_text("{}")
    minutes = ex.training_minutes(tmp_path)
    assert (minutes["lr_sweep/encdec_lr1e-3/rope_seed0.json"], minutes["encdec/none_seed2.json"]) == (2.0, 1.0)
    assert len(minutes) == 5


def _pause_script():
    """scripts/with_budget_paused.py as a module: the tooling that pauses lesson 13's budget runs."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("with_budget_paused", ROOT / "scripts" / "with_budget_paused.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_record_pause_appends_and_training_minutes_read_it(tmp_path):
    import json

    paused = _pause_script()

    rec = tmp_path / "reverse" / "decoder" / "none_seed3.json"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"train": {"seconds": 400.0}}))
    data = paused.record_pause(tmp_path, 100.4, "a", "b", ["reverse/decoder/none_seed3.json"])
    assert data["pauses"] == [{"paused_seconds": 100, "from": "a", "to": "b", "models": ["reverse/decoder/none_seed3.json"]}]
    paused.record_pause(tmp_path, 20, "c", "d", ["reverse/decoder/none_seed3.json"])
    assert ex.training_minutes(tmp_path) == {"reverse/decoder/none_seed3.json": 280.0 / 60}
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["paused.json"]   # no temporary file left
    # the older single-pause layout becomes a list, its pause kept
    (tmp_path / "paused.json").write_text(json.dumps({"what": "w", "paused_seconds": 60, "from": "e", "to": "f",
                                                      "models": ["reverse/decoder/none_seed3.json"]}))
    data = paused.record_pause(tmp_path, 30, "g", "h", ["reverse/decoder/none_seed3.json"])
    assert data["what"] == "w" and [p["paused_seconds"] for p in data["pauses"]] == [60, 30]
    for bad_seconds in (-1, "5", True):
        with pytest.raises(ValueError, match="seconds"):
            paused.record_pause(tmp_path, bad_seconds, "a", "b", ["reverse/decoder/none_seed3.json"])
    with pytest.raises(ValueError, match="none_seed3"):
        paused.record_pause(tmp_path, 1, "a", "b", ["none_seed3"])
    assert [p["paused_seconds"] for p in json.loads((tmp_path / "paused.json").read_text())["pauses"]] == [60, 30]


def test_budget_processes_find_the_models_each_run_is_training(tmp_path):
    proc, folder, paused = tmp_path / "proc", tmp_path / "budget", _pause_script()

    def process(pid, ppid, *args):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes("\0".join(args).encode() + b"\0")
        (proc / str(pid) / "stat").write_text(f"{pid} (py (x) y) S {ppid} 1 1 0 -1\n")

    mod = "posenc_lib.experiments.extrapolation"
    out = folder / "reverse" / "decoder"
    out.mkdir(parents=True)
    (out / "none_seed3.json").write_text("{}")   # finished: the next model of that run is in training
    process(11, 1, "python", "-m", mod, "--profile", "budget", "--arch", "decoder", "--pe", "none,rope", "--seeds", "3",
            "--out", str(out), "--jobs", "1")
    process(12, 1, "python", "-m", mod, "--arch", "encdec", "--pe", "all", "--seeds", "4", "--out", str(folder / "copy" / "encdec"))
    process(13, 1, "python", "-m", mod, "--pe", "rope", "--out", str(tmp_path / "elsewhere"))   # writes elsewhere
    process(14, 1, "bash", "scripts/extrapolation_budget.sh")
    # two workers: the first two records not written, scheme by scheme as the run takes them; its workers found
    process(20, 1, "python", "-m", mod, "--arch", "decoder", "--pe", "none,rope,t5", "--seeds", "3,4", "--out", str(out),
            "--jobs", "2")
    process(21, 20, "python", "-c", "spawn_main")
    process(22, 20, "python", "-c", "spawn_main")
    process(23, 22, "python", "-c", "grandchild")
    (proc / "self").mkdir()
    found = paused.budget_processes(folder, proc)
    assert found == [
        {"pid": 11, "out": out.as_posix(), "models": ["reverse/decoder/rope_seed3.json"], "workers": []},
        {"pid": 12, "out": (folder / "copy" / "encdec").as_posix(),
         "models": [f"copy/encdec/{ex.all_runs('encdec')[0]}_seed4.json"], "workers": []},
        {"pid": 20, "out": out.as_posix(), "models": ["reverse/decoder/none_seed4.json", "reverse/decoder/rope_seed3.json"],
         "workers": [21, 22, 23]}]
    # a relative --out is read from the training process's working folder (/proc/PID/cwd)
    process(30, 1, "python", "-m", mod, "--arch", "decoder", "--pe", "t5", "--seeds", "0", "--out", "budget/reverse/decoder")
    (proc / "30" / "cwd").symlink_to(tmp_path)
    process(31, 1, "python", "-m", mod, "--arch", "decoder", "--pe", "t5", "--seeds", "0", "--out", "budget/reverse/decoder")
    (proc / "31" / "cwd").symlink_to(tmp_path / "elsewhere")
    relative = paused.budget_processes(folder, proc)[3:]
    assert relative == [{"pid": 30, "out": "budget/reverse/decoder", "models": ["reverse/decoder/t5_seed0.json"],
                         "workers": []}]
    (out / "rope_seed3.json").write_text("{}")
    assert paused.budget_processes(folder, proc)[0]["models"] == []   # all its models written
    assert paused.budget_processes(folder, tmp_path / "no-proc") == []


def test_with_budget_paused_returns_the_commands_status_and_records_nothing_without_training():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    paused = root / "results" / "extrapolation_budget" / "paused.json"
    before = paused.read_bytes() if paused.exists() else None
    import importlib.util

    spec = importlib.util.spec_from_file_location("with_budget_paused", root / "scripts" / "with_budget_paused.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert Path("results/extrapolation_budget") in script.FOLDERS
    if any(script.budget_processes(root / folder) for folder in script.FOLDERS):
        pytest.skip("budget training is running on this machine")
    run = subprocess.run([sys.executable, str(root / "scripts" / "with_budget_paused.py"), sys.executable, "-c",
                          "raise SystemExit(3)"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 3 and "none was running" in run.stderr
    assert (paused.read_bytes() if paused.exists() else None) == before
    usage = subprocess.run([sys.executable, str(root / "scripts" / "with_budget_paused.py")], capture_output=True,
                           text=True, timeout=120)
    assert usage.returncode == 2 and "with_budget_paused.py make test" in usage.stdout
