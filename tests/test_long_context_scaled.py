"""Lesson 14's second experiment: every RoPE rescaling read at s = n / L, static NTK, passkey retrieval."""
import json

import pytest
import torch

from posenc_lib.experiments import long_context as lc
from posenc_lib.experiments import long_context_scaled as lcs
from posenc_lib.schemes.rope_scaling import scaled_rope_frequencies


class _Oracle(torch.nn.Module):
    """Predicts every next character right (one-hot logits of the shifted input): retrieves every key."""

    def __init__(self, vocab_size):
        super().__init__()
        self.v = vocab_size

    def forward(self, x):
        nxt = torch.cat((x[:, 1:], x[:, -1:]), 1)
        return torch.nn.functional.one_hot(nxt, self.v).float()


class _Copy(torch.nn.Module):
    """Predicts the current character again: never right about a digit that follows a space."""

    def __init__(self, vocab_size):
        super().__init__()
        self.v = vocab_size

    def forward(self, x):
        return torch.nn.functional.one_hot(x, self.v).float()


@pytest.fixture(scope="module")
def smoke_data():
    cfg = lc.SMOKE
    vocab, _train, eval_ids = lc.data(cfg)
    return cfg, vocab, lc.load_text(cfg)[1], eval_ids


@pytest.mark.parametrize("n, L", [(64, 64), (128, 64), (512, 64)])
def test_passkey_windows_hold_the_key_once_and_far_enough_back(smoke_data, n, L):
    cfg, vocab, text, _ = smoke_data
    ids, key_at, dist = lcs.passkey_batch(vocab, text, n, L, trials=30, seed=3)
    assert ids.shape == (30, n) and key_at.shape == (30, lcs.KEY_DIGITS)
    for row, w, d in zip(ids, key_at, dist):
        s = vocab.decode(row.tolist())
        key = s[-lcs.KEY_DIGITS:]
        assert key.isdigit() and s.endswith(lcs.QUESTION + key)
        assert s.count(lcs.NEEDLE.format(key=key)) == 1
        # the digits predicted at `key_at` are the key's, and the needle's key is `d` characters back
        assert vocab.decode(row[w + 1].tolist()) == key
        assert s[n - lcs.KEY_DIGITS - d : n - lcs.KEY_DIGITS - d + lcs.KEY_DIGITS] == key
        assert d > L if n > L else d < L
    again, _, _ = lcs.passkey_batch(vocab, text, n, L, trials=30, seed=3)
    assert torch.equal(ids, again)  # seeded: the same windows every time


def test_passkey_scores_an_oracle_one_and_a_copier_zero(smoke_data):
    cfg, vocab, text, _ = smoke_data
    good = lcs.passkey(_Oracle(len(vocab)), vocab, text, [64, 256], 64, trials=40, seed=0)
    bad = lcs.passkey(_Copy(len(vocab)), vocab, text, [64, 256], 64, trials=40, seed=0)
    assert all(r["retrieved"] == 1.0 and r["digits"] == 1.0 for r in good)
    assert all(r["retrieved"] == 0.0 for r in bad)
    assert [r["distance_min"] > 64 for r in good] == [False, True]


def test_windows_too_short_for_the_passkey_are_refused_with_the_minimum(smoke_data):
    cfg, vocab, text, _ = smoke_data
    assert not lcs.passkey_fits(32, 16) and not lcs.passkey_fits(80, 64) and lcs.passkey_fits(64, 64)
    with pytest.raises(ValueError, match=r"n >= 46, got n=16"):
        lcs.passkey_batch(vocab, text, 16, 64, 1, 0)
    with pytest.raises(ValueError, match=r"more than L=64"):
        lcs.passkey_batch(vocab, text, 80, 64, 1, 0)


def test_matched_factor_is_plain_inside_L_and_static_ntk_at_n_over_L_is_dynamic_at_n():
    cfg = lc.COURSE
    assert all(lcs.scaling_for(m, cfg, 1.0) is None for m in lcs.STATIC)
    d = cfg.d_model // cfg.n_heads
    for n in (128, 256, 512):
        ntk, _ = scaled_rope_frequencies(d, 10000.0, lcs.scaling_for("ntk", cfg, n / cfg.train_len))
        dyn, _ = scaled_rope_frequencies(d, 10000.0, lcs.scaling_for("dynamic", cfg, 1.0), seq_len=n)
        torch.testing.assert_close(ntk, dyn, rtol=1e-5, atol=0)
    for m in ("linear", "yarn", "llama3"):
        assert lcs.scaling_for(m, cfg, 4.0)["factor"] == 4.0
        assert lcs.scaling_for(m, cfg, 4.0)["rope_type"] == m


def test_smoke_run_writes_matched_and_fixed_readings_and_a_curve(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    lines = []
    lcs.run_all(lc.SMOKE, [0], out, ck, trials=8, finetunes=["linear"], log=lines.append)
    recs = {(r["kind"], r.get("method")): r for r in lcs.load_results(out)}
    assert set(recs) == {("readings", None), ("finetune", "linear")}
    rd = recs[("readings", None)]
    L, lengths = lc.SMOKE.train_len, list(lc.SMOKE.eval_lengths)
    ppl = {m: [r["ppl"] for r in v["rows"]] for m, v in rd["matched"].items()}
    assert set(ppl) == set(lcs.READINGS) and set(rd["fixed"]) == set(lcs.STATIC)
    for m in lcs.STATIC:  # s = n / L is plain RoPE at n = L, and the factor recorded is n / L
        assert ppl[m][0] == ppl["none"][0]
        assert [r["factor"] for r in rd["matched"][m]["rows"]] == [max(1.0, n / L) for n in lengths]
        assert all(r["factor"] == lc.SMOKE.factor for r in rd["fixed"][m]["rows"])
    assert ppl["ntk"] == pytest.approx(ppl["dynamic"], rel=1e-4)  # whole windows: the same frequencies
    assert rd["fixed"]["linear"]["rows"][0]["ppl"] != ppl["linear"][0]  # s = 4 at n = L is not plain
    for r in rd["matched"]["none"]["rows"]:
        assert (r["passkey"] is None) == (not lcs.passkey_fits(r["length"], L)) and r["ppl_first_L"] > 1
        # a causal model's first L positions see only themselves: plain RoPE scores them as a window of L would
        assert (r["ppl_first_L"] == r["ppl"]) == (r["length"] == L)
    ft = recs[("finetune", "linear")]
    assert [c["updates"] for c in ft["curve"]] == [0, lc.SMOKE.finetune_steps]
    assert [r["ppl"] for r in ft["curve"][0]["rows"]] == [r["ppl"] for r in rd["fixed"]["linear"]["rows"]]
    # the readings used the weights long_context would have trained: the same plain-RoPE numbers
    ref = lc.evaluate(lc.make_model("rope", lc.SMOKE, len(lc.data(lc.SMOKE)[0])), lc.data(lc.SMOKE)[2], [L])
    assert ref[0]["ppl"] != ppl["none"][0]  # (an untrained model differs: the check below is not vacuous)
    model = lc.make_model("rope", lc.SMOKE, len(lc.data(lc.SMOKE)[0]))
    model.load_state_dict(torch.load(lc.ckpt_path(ck, lc.SMOKE, "rope", 0), weights_only=True))
    assert lc.evaluate(model, lc.data(lc.SMOKE)[2], [L])[0]["ppl"] == ppl["none"][0]
    # a rerun skips both; other settings in the same folder are refused with the fix
    again = []
    lcs.run_all(lc.SMOKE, [0], out, ck, trials=8, finetunes=["linear"], log=again.append)
    assert any("skipping 2 finished" in x for x in again) and not any(x.startswith("done") for x in again)
    with pytest.raises(ValueError, match=r"another configuration: trials 8 \(now 9\); pass another --out"):
        lcs.run_all(lc.SMOKE, [0], out, ck, trials=9, finetunes=[], log=again.append)
    assert json.loads((out / "readings_seed0.json").read_text())["trials"] == 8


def test_yarn_without_temperature_is_yarn_with_attention_factor_one_as_transformers_reads_it():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from test_long_context import _hf_config  # one transformers config helper for both files

    cfg, d = lc.COURSE, lc.COURSE.d_model // lc.COURSE.n_heads
    assert lcs.scaling_for(lcs.NO_TEMPERATURE, cfg, 1.0) is None  # s = 1: plain RoPE, as for YaRN
    for s in (2.0, 4.0, 8.0):
        sc = lcs.scaling_for(lcs.NO_TEMPERATURE, cfg, s)
        assert sc == {**lcs.scaling_for("yarn", cfg, s), "attention_factor": 1.0}
        freq, scale = scaled_rope_frequencies(d, 10000.0, sc)
        yarn_freq, yarn_scale = scaled_rope_frequencies(d, 10000.0, lcs.scaling_for("yarn", cfg, s))
        ref, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(d, 10000.0, sc, cfg.train_len), None)
        torch.testing.assert_close(freq, ref.float(), rtol=1e-5, atol=0)
        assert torch.equal(freq, yarn_freq) and scale == ref_scale == 1.0 < yarn_scale


def test_smoke_controls_train_at_L_with_the_curves_characters_and_drop_only_the_temperature(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "ck"
    cfg, L = lc.SMOKE, lc.SMOKE.train_len
    lcs.run_all(cfg, [0], out, ck, trials=8, finetunes=[], controls=lcs.CONTROLS, log=lambda *_: None)
    recs = {(r["kind"], r.get("name")): r for r in lcs.load_results(out)}
    assert set(recs) == {("readings", None), ("readings-extra", None), ("control", "plain-64"),
                         ("control", lcs.NO_TEMPERATURE)}  # fmt: skip
    rd, extra = recs[("readings", None)], recs[("readings-extra", None)]
    plain, t1 = recs[("control", "plain-64")], recs[("control", lcs.NO_TEMPERATURE)]
    # the control: windows of L, the fine-tunes' characters per update, read plain; it starts from the readings' model
    assert (plain["length"], plain["batch"], plain["method"]) == (L, cfg.finetune_batch * cfg.long_len // L, "none")
    assert plain["length"] * plain["batch"] == cfg.long_len * cfg.finetune_batch
    assert [c["updates"] for c in plain["curve"]] == [c["updates"] for c in t1["curve"]] == [0, cfg.finetune_steps]
    assert [r["ppl"] for r in plain["curve"][0]["rows"]] == [r["ppl"] for r in rd["matched"]["none"]["rows"]]
    assert [r["ppl"] for r in plain["curve"][1]["rows"]] != [r["ppl"] for r in plain["curve"][0]["rows"]]
    assert plain["sliding"]["length"] == cfg.long_len and plain["sliding"]["ppl"] > 1 and "sliding" not in t1
    # YaRN without its temperature: plain at n = L (s = 1), YaRN's frequencies elsewhere, other numbers
    m = lcs.NO_TEMPERATURE
    assert extra["matched"][m]["rows"][0]["ppl"] == rd["matched"]["none"]["rows"][0]["ppl"]
    assert [r["factor"] for r in extra["matched"][m]["rows"]] == [max(1.0, n / L) for n in cfg.eval_lengths]
    assert all(a["ppl"] != b["ppl"] for a, b in zip(extra["fixed"][m]["rows"], rd["fixed"]["yarn"]["rows"]))
    assert [r["ppl"] for r in t1["curve"][0]["rows"]] == [r["ppl"] for r in extra["fixed"][m]["rows"]]
    assert (t1["length"], t1["batch"]) == (cfg.long_len, cfg.finetune_batch)
    again = []
    lcs.run_all(cfg, [0], out, ck, trials=8, finetunes=[], controls=lcs.CONTROLS, log=again.append)
    assert any("skipping 4 finished" in x for x in again) and not any(x.startswith("done") for x in again)


@pytest.mark.parametrize("argv, match", [
    (["--finetunes", "pi"], r"unknown fine-tune method\(s\) \['pi'\]; valid choices: linear, ntk, yarn, llama3"),
    (["--controls", "yarn"], r"unknown control\(s\) \['yarn'\]; valid choices: plain-64, yarn-t1, or 'none'"),
    (["--trials", "0"], "--trials must be a positive integer, got 0"),
    (["--seeds", "a"], "--seeds must be comma-separated integers, got 'a'"),
])  # fmt: skip
def test_bad_command_lines_name_the_value_and_the_choices(argv, match, capsys, tmp_path):
    with pytest.raises(SystemExit):
        lcs.main([*argv, "--out", str(tmp_path / "o")])
    import re

    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
