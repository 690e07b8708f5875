"""Passkey retrieval learned in the window: the training batches, the readings, the records and the command line."""
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc_lib.experiments import charlm
from posenc_lib.experiments import long_context as lc
from posenc_lib.experiments import long_context_scaled as ls
from posenc_lib.experiments import passkey_trained as pt
from posenc_lib.seeds import set_seed

ROOT = Path(__file__).resolve().parents[1]
SMOKE = pt.PROFILES["smoke"]


def test_training_batches_mix_plain_windows_and_passkey_windows():
    cfg = SMOKE.lm()
    train_text, _ = lc.load_text(cfg)
    vocab, train_ids, _ = lc.data(cfg)
    windows = pt.training_windows(vocab, train_text, train_ids, cfg, SMOKE, seed=3)
    b = windows(7, torch.Generator().manual_seed(0))
    assert b.shape == (cfg.batch_size, cfg.train_len + 1)
    k = round(SMOKE.share * cfg.batch_size)
    tail = ls.QUESTION + "00000"
    for row in b[cfg.batch_size - k :]:  # passkey windows: the needle once, the question and its key at the end
        text = vocab.decode(row.tolist())
        key = text[-ls.KEY_DIGITS :]
        assert key.isdigit() and text.endswith(ls.QUESTION + key) and text.count(ls.NEEDLE.format(key=key)) == 1
    for row in b[: cfg.batch_size - k]:  # plain windows: a stretch of the training stream
        text = vocab.decode(row.tolist())
        assert len(text) == cfg.train_len + 1 and not text.endswith(tail[: len(ls.QUESTION)])
    # the passkey part depends on the seed and the step only; the plain part on the run's generator
    again = windows(7, torch.Generator().manual_seed(1))
    assert torch.equal(again[cfg.batch_size - k :], b[cfg.batch_size - k :])
    assert not torch.equal(windows(8, torch.Generator().manual_seed(0))[cfg.batch_size - k :], b[cfg.batch_size - k :])
    with pytest.raises(ValueError, match="too short for a passkey window"):
        pt.training_windows(vocab, train_text, train_ids, lc.SMOKE, SMOKE, seed=0)


def test_default_windows_train_exactly_as_before():
    """train_steps with windows= giving random_windows is the same training as without it, bit for bit."""
    cfg = lc.SMOKE
    vocab, train_ids, _ = lc.data(cfg)
    runs = []
    for windows in (None, lambda step, g: charlm.random_windows(train_ids, cfg.train_len, cfg.batch_size, g)):
        set_seed(0)
        model = lc.make_model("rope", cfg, len(vocab))
        losses = lc.train_steps(model, train_ids, length=cfg.train_len, batch=cfg.batch_size, steps=6, lr=cfg.lr,
                                warmup=2, grad_clip=1.0, seed=0, log_every=2, windows=windows)  # fmt: skip
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_rope_is_asked_with_every_rescaling_at_s_n_over_L_and_left_plain():
    cfg = SMOKE.lm()
    train_text, eval_text = lc.load_text(cfg)
    vocab, _, _ = lc.data(cfg)
    set_seed(0)
    model = lc.make_model("rope", cfg, len(vocab)).eval()
    seen = []
    original = ls.read_with

    def spy(m, c, method, factor):
        seen.append((method, factor))
        return original(m, c, method, factor)

    try:
        ls.read_with = spy
        out = pt.asked(model, "rope", cfg, vocab, eval_text, trials=4, seed=0)
    finally:
        ls.read_with = original
    assert list(out) == list(pt.READINGS["rope"]) and all(len(rows) == len(cfg.eval_lengths) for rows in out.values())
    L = cfg.train_len
    assert seen[:-1] == [(m, max(1.0, n / L)) for m in pt.READINGS["rope"] for n in cfg.eval_lengths]
    assert seen[-1] == ("none", 1.0)  # the model is left as trained
    beyond = [row for rows in out.values() for row in rows if row["length"] > L]
    assert beyond and all(row["distance_min"] > L for row in beyond)  # the key sits farther back than any window


def test_smoke_run_writes_records_resumes_and_refuses_other_settings(tmp_path):
    out = tmp_path / "pk"
    logs = []
    pt.run_all(SMOKE, [0], out, names=["alibi"], log=logs.append)
    rec = json.loads((out / "alibi_seed0.json").read_text())
    assert rec["schema"] == pt.SCHEMA and rec["config"]["steps"] == SMOKE.steps and rec["config"]["train_len"] == 48
    assert [u for u, _, _ in rec["in_range_curve"]] == [15, 30]
    assert list(rec["readings"]) == ["none"] and [r["length"] for r in rec["readings"]["none"]] == [48, 96, 192]
    assert [r["length"] for r in rec["ppl"]] == [48, 96, 192]
    s = pt.summarize(pt.load_results(out))
    assert s[("alibi", "none")]["seeds"] == 1 and s[("alibi", "none")]["lengths"] == [48, 96, 192]
    logs.clear()
    pt.run_all(SMOKE, [0], out, names=["alibi"], log=logs.append)
    assert logs == [f"skipping 1 finished result(s) in {out}"]
    with pytest.raises(ValueError, match="another configuration"):
        pt.run_all(replace(SMOKE, share=0.25), [0], out, names=["alibi"], log=logs.append)
    with pytest.raises(ValueError, match="unknown model"):
        pt.run_all(SMOKE, [0], out, names=["rope-partial"], log=logs.append)


@pytest.mark.parametrize("argv, match", [
    (["--models", "t5"], r"unknown model\(s\) \['t5'\]; valid choices: alibi, nope, rope"),
    (["--seeds", "x"], "--seeds must be comma-separated integers, got 'x'"),
    (["--jobs", "0"], "--jobs must be a positive integer, got 0"),
    (["--profile", "huge"], "invalid choice"),
])  # fmt: skip
def test_bad_command_lines_name_the_value_and_the_choices(argv, match, capsys, tmp_path):
    with pytest.raises(SystemExit):
        pt.main([*argv, "--out", str(tmp_path / "o")])
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_bad_profile_fields_are_refused():
    with pytest.raises(ValueError, match="share"):
        pt.PasskeyTraining(share=1.0)
    with pytest.raises(ValueError, match="steps"):
        pt.PasskeyTraining(steps=0)
