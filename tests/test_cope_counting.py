"""The CoPE counting experiment (posenc_lib/experiments/cope_counting.py, lesson 11): the task, a smoke run, resume.

The task generator's labels are checked against an independent reading of each sequence (split the tokens
at the separators, count back from the end); the smoke profile runs end to end in a temporary folder.
"""
import json
from dataclasses import asdict, replace

import pytest
import torch

from posenc_lib.experiments import cope_counting as cc


def _decode(cfg, row):
    """One unpadded row read back by hand: (words as lists of letter indices, k), with no help from the generator."""
    tokens = [int(t) for t in row]
    assert tokens[0] == cc.SEP and cc.PAD not in tokens
    question = tokens[-1]
    k = question - cc.FIRST_QUESTION + 1
    assert 1 <= k <= cfg.max_k
    words, word = [], None
    for t in tokens[:-1]:
        if t == cc.SEP:
            if word is not None:
                words.append(word)
            word = []
        else:
            assert t >= cc.FIRST_QUESTION + cfg.max_k, f"token {t} is neither a separator nor a letter"
            word.append(t)
    words.append(word)
    return words, k


@pytest.mark.parametrize("split", cc.SPLITS)
@pytest.mark.parametrize("cfg", [cc.SMOKE, cc.COURSE, replace(cc.COURSE, max_k=6, max_words=6, max_word_len=1)])
def test_labels_are_the_first_letter_of_the_kth_word_back(cfg, split):
    g = torch.Generator().manual_seed(7)
    tokens, lengths, targets, ks = cc.make_batch(cfg, 300, g, split)
    assert tokens.dtype == torch.long and tokens.shape == (300, int(lengths.max()))
    lo, hi = cfg.word_lengths(split)
    seen_k, seen_n, seen_len = set(), set(), set()
    for row, n_tok, target, k in zip(tokens, lengths, targets, ks):
        assert (row[n_tok:] == cc.PAD).all()  # right padding only, after the question
        words, k_read = _decode(cfg, row[:n_tok])
        assert k_read == int(k)
        assert cfg.max_k <= len(words) <= cfg.max_words and k_read <= len(words)
        assert all(lo <= len(w) <= hi for w in words)
        assert int(target) == words[-k_read][0]  # the first letter of the k-th word counted back from the end
        seen_k.add(k_read), seen_n.add(len(words)), seen_len.update(len(w) for w in words)
    # every k, every number of words and every word length of the split occurs
    assert seen_k == set(range(1, cfg.max_k + 1)) and seen_n == set(range(cfg.max_k, cfg.max_words + 1))
    assert seen_len == set(range(lo, hi + 1))


def test_labels_read_a_second_way():
    """The same rule read with list slicing: the word starts are the tokens after a separator; count k back."""
    cfg = cc.SMOKE
    assert cc.question_id(1) == cc.FIRST_QUESTION and cc.letter_id(cfg, 0) == cc.FIRST_QUESTION + cfg.max_k
    g = torch.Generator().manual_seed(0)
    tokens, lengths, targets, ks = cc.make_batch(cfg, 200, g)
    for row, n, t, k in zip(tokens, lengths, targets, ks):
        body = row[: n - 1].tolist()
        starts = [i + 1 for i, tok in enumerate(body) if tok == cc.SEP]
        assert int(t) == body[starts[-int(k)]]


def test_the_test_sets_are_fixed_and_long_words_are_longer():
    cfg = cc.COURSE
    a, b = cc.eval_set(cfg, "in_range"), cc.eval_set(cfg, "in_range")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    long = cc.eval_set(cfg, "long_words")
    assert long[1].float().mean() > a[1].float().mean() + cfg.max_k  # longer sequences, the same questions
    assert cfg.word_lengths("long_words") == (cfg.max_word_len + 1, 2 * cfg.max_word_len)
    # the course profile was sized for 4 models x 3 seeds in at most 15 CPU minutes (see the module docstring)
    assert (cfg.steps, cfg.batch_size, cfg.d_model, cfg.num_layers) == (4000, 32, 64, 2)


def test_models_are_the_four_schemes_and_the_answer_is_read_at_the_question():
    cfg = cc.SMOKE
    assert list(cc.MODELS) == ["cope", "rope", "alibi", "none"]
    for name in cc.MODELS:
        model = cc.make_model(name, cfg)
        assert model.scheme.name == cc.MODELS[name][0]
    model = cc.make_model("rope", cfg).eval()
    g = torch.Generator().manual_seed(1)
    tokens, lengths, _, _ = cc.make_batch(cfg, 6, g)
    got = cc.answer_logits(model, tokens, lengths)
    for i in range(6):  # each row alone, unpadded: padding after the question changes nothing
        alone = model(tokens[i : i + 1, : lengths[i]])[0, -1]
        torch.testing.assert_close(got[i], alone, atol=1e-5, rtol=1e-5)


def test_smoke_run_end_to_end_resume_and_refusals(tmp_path):
    cfg, logs, out = cc.SMOKE, [], tmp_path / "out"
    summary = cc.run_all(cfg, [0, 1], out, names=["cope", "none"], log=logs.append)
    assert summary == out / "results.json"
    assert sorted(p.name for p in out.glob("*.json")) == ["config.json", "cope_seed0.json", "cope_seed1.json",
                                                          "none_seed0.json", "none_seed1.json", "results.json"]
    assert json.loads((out / "config.json").read_text()) == asdict(cfg)
    data = cc.read_results(summary)
    assert data["profile"] == "smoke" and data["models"] == ["cope", "none"] and data["seeds"] == [0, 1]
    for rec in data["records"]:
        assert rec["config"] == asdict(cfg) and rec["curve"][-1][0] == cfg.steps
        for split in cc.SPLITS:
            ev = rec["eval"][split]
            assert ev["examples"] == cfg.eval_examples and 0 <= ev["accuracy"] <= 1 and len(ev["by_k"]) == cfg.max_k
    row = data["summary"]["cope"]["in_range"]
    accs = [r["eval"]["in_range"]["accuracy"] for r in data["records"] if r["model"] == "cope"]
    assert row["min"] == min(accs) and row["max"] == max(accs) and abs(row["mean"] - sum(accs) / 2) < 1e-4
    # the same call again resumes: finished files are skipped; a new model is added and the summary waits for
    # its second seed
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    logs.clear()
    assert cc.run_all(cfg, [0], out, names=["cope", "rope"], log=logs.append) is None
    assert logs[0] == f"skipping 1 finished result(s) in {out}" and logs[1].startswith("done rope seed 0")
    assert (out / "cope_seed0.json").read_bytes() == before["cope_seed0.json"]
    assert cc.read_results(out / "results.json")["models"] == ["cope", "none"]  # the old summary stays until complete
    assert cc.run_all(cfg, [1], out, names=["rope"], log=logs.append) == out / "results.json"
    assert cc.read_results(out / "results.json")["models"] == ["cope", "none", "rope"]
    # another configuration is refused, with the profile that made the folder, and nothing in it changes
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(ValueError, match=r"another configuration: name 'smoke' \(now 'course'\), .*d_model.*; pass "
                                         r"another --out folder, or --profile smoke to continue it"):
        cc.run_all(cc.COURSE, [0], out, names=["rope"], log=logs.append)
    with pytest.raises(ValueError, match=r"another configuration: steps \d+ \(now 21\); .*--profile smoke"):
        cc.run_all(replace(cfg, steps=21), [0], out, names=["rope"], log=logs.append)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    custom = replace(cfg, name="mine", steps=21)  # settings no profile has: the fix is to restore them
    cc.run_all(custom, [0], tmp_path / "mine", names=["none"], log=logs.append)
    with pytest.raises(ValueError, match=r"name 'mine' \(now 'smoke'\), steps 21 \(now \d+\)"
                                         r".*or the settings it was made with"):
        cc.run_all(cfg, [0], tmp_path / "mine", names=["none"], log=logs.append)


def test_command_line_runs_refuses_and_resumes(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert cc.main(["--profile", "smoke", "--pe", "alibi", "--seeds", "0", "--out", out]) == 0
    assert "summary:" in capsys.readouterr().out
    assert cc.main(["--profile", "smoke", "--pe", "alibi", "--seeds", "0", "--out", out]) == 0
    assert "skipping 1 finished" in capsys.readouterr().out
    assert cc.main(["--profile", "smoke", "--models", "alibi", "--seeds", "0", "--out", out, "--resume"]) == 0
    assert "skipping 1 finished" in capsys.readouterr().out
    assert cc.main(["--profile", "course", "--pe", "alibi", "--seeds", "0", "--out", out, "--resume"]) == 2
    assert "--profile smoke" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--pe", "rope,gpt"], "unknown model(s) ['gpt']; valid choices: cope, rope, alibi, none"),
    (["--models", "xpos"], "unknown model(s) ['xpos']; valid choices: cope, rope, alibi, none"),
    (["--seeds", "0,a"], "--seeds must be comma-separated integers, got '0,a'"),
    (["--jobs", "0"], "--jobs must be a positive integer, got 0"),
    (["--profile", "huge"], "invalid choice: 'huge' (choose from"),
    (["--time-updates", "-1"], "--time-updates must be >= 0, got -1"),
])  # fmt: skip
def test_bad_command_lines_name_the_value_and_the_choices(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cc.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_bad_arguments_name_the_value_and_the_choices(tmp_path):
    with pytest.raises(ValueError, match="unknown model 'nope'; valid choices: cope, rope, alibi, none"):
        cc.make_model("nope", cc.SMOKE)
    with pytest.raises(ValueError, match=r"unknown model\(s\) \['gpt'\]; valid choices: cope, rope, alibi, none"):
        cc.run_all(cc.SMOKE, [0], tmp_path, names=["gpt"])
    with pytest.raises(ValueError, match="unknown test set 'long'; valid choices: in_range, long_words"):
        cc.SMOKE.word_lengths("long")
    with pytest.raises(ValueError, match="max_words=2 must be at least max_k=3"):
        replace(cc.SMOKE, max_k=3, max_words=2)
    with pytest.raises(ValueError, match="steps"):
        replace(cc.SMOKE, steps=0)
    with pytest.raises(ValueError, match="jobs"):
        cc.run_all(cc.SMOKE, [0], tmp_path, jobs=0)
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit):
        cc.main(["--out", str(tmp_path / "f")])


def test_timing_projects_three_seeds():
    timing = cc.time_updates(cc.SMOKE, updates=2, warmup=1, names=["cope", "none"], log=lambda *_: None)
    assert set(timing["per_model"]) == {"cope", "none"} and timing["steps"] == cc.SMOKE.steps
    per = timing["per_model"]
    evals = 1 + -(-cc.SMOKE.steps // cc.SMOKE.curve_every) / 2
    expected = 3 * sum(r["cpu_per_update"] * cc.SMOKE.steps + r["eval_cpu"] * evals for r in per.values())
    assert abs(timing["cpu_seconds_3_seeds"] - expected) < 0.1 + 1e-3 * expected
