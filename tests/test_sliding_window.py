"""Lesson 10's sliding-window reading: every character predicted from at most L characters before it."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from posenc_lib.experiments import long_context as lc
from posenc_lib.experiments import sliding_window as sw
from posenc_lib.seeds import set_seed

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "sliding_window"


@pytest.fixture(scope="module")
def smoke():
    cfg = lc.SMOKE
    vocab, _train, eval_ids = lc.data(cfg)
    set_seed(0)
    model = lc.make_model("alibi", cfg, len(vocab)).eval()
    return cfg, eval_ids, model


def test_a_window_as_long_as_the_input_is_the_whole_window_reading(smoke):
    cfg, ids, model = smoke
    for n in cfg.eval_lengths:
        whole = lc.evaluate(model, ids, [n])[0]["nll"]
        assert sw.sliding_nll(model, ids, n, n).mean().item() == pytest.approx(whole, abs=1e-5)
        assert sw.sliding_nll(model, ids, n, 10 * n).mean().item() == pytest.approx(whole, abs=1e-5)


@pytest.mark.parametrize("model_name", ["alibi", "rope", "nope"])
def test_each_position_is_read_from_exactly_the_last_w_characters(model_name):
    """Brute force: position t of window r, predicted by the model run on x[r, t-w+1 .. t] alone."""
    cfg = lc.SMOKE
    vocab, _train, ids = lc.data(cfg)
    set_seed(1)
    model = lc.make_model(model_name, cfg, len(vocab)).eval()
    n, w = 32, 8
    got = sw.sliding_nll(model, ids, n, w, batch=5)  # a batch that does not divide the rows
    k = (ids.numel() - 1) // n
    x, y = ids[: k * n].view(k, n), ids[1 : k * n + 1].view(k, n)
    want = torch.zeros(n)
    with torch.no_grad():
        for r in range(k):
            for t in range(n):
                lo = max(0, t - w + 1)
                logits = model(x[r : r + 1, lo : t + 1])[0, -1]
                want[t] += F.cross_entropy(logits[None], y[r, t : t + 1])
    assert torch.allclose(got, want / k, atol=1e-5)
    # and the whole-window reading differs past w for a model that sees further back (not a no-op)
    whole = lc.evaluate(model, ids, [n], bins=1)[0]["nll"]
    assert abs(got.mean().item() - whole) > 1e-4


def test_run_writes_one_record_per_model_and_skips_it_after(tmp_path):
    out, ckpt = tmp_path / "out", tmp_path / "ck"
    lines = []
    sw.run_all(lc.SMOKE, [0], out, ckpt, names=["alibi"], log=lines.append)
    rec = json.loads((out / "alibi_seed0.json").read_text())
    assert rec["schema"] == sw.SCHEMA and rec["window"] == lc.SMOKE.train_len and rec["retrained_seconds"] > 0
    assert [r["length"] for r in rec["whole"]] == [r["length"] for r in rec["sliding"]] == list(lc.SMOKE.eval_lengths)
    assert rec["whole"][0]["ppl"] == pytest.approx(rec["sliding"][0]["ppl"], rel=1e-4)  # n = L: the same reading
    assert (ckpt / "smoke" / "alibi_seed0.pt").exists()
    before = (out / "alibi_seed0.json").read_bytes()
    sw.run_all(lc.SMOKE, [0], out, ckpt, names=["alibi"], log=lines.append)
    assert (out / "alibi_seed0.json").read_bytes() == before and "skipping 1 finished" in lines[-1]
    with pytest.raises(ValueError, match="valid choices: alibi, rope, nope"):
        sw.run_all(lc.SMOKE, [0], out, ckpt, names=["t5"])


def test_a_record_made_with_other_settings_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "alibi_seed0.json").write_text(json.dumps({"schema": sw.SCHEMA, "profile": "course", "config": {}}))
    with pytest.raises(ValueError, match="another configuration"):
        sw.run_all(lc.SMOKE, [0], out, tmp_path / "ck", names=["alibi"])


def test_command_line_refuses_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as e:
        sw.main(["--models", "alibi,xpos"])
    assert e.value.code == 2 and "valid choices: alibi, rope, nope" in capsys.readouterr().err


@pytest.mark.skipif(not COMMITTED.exists(), reason="results/sliding_window not committed")
def test_committed_records_read_the_same_weights_as_long_context():
    """The sliding-window run reads (or retrains, identically) long_context's models: its whole-window perplexity
    is the committed long_context result's, model by model and seed by seed."""
    recs = sw.load_results(COMMITTED)
    assert recs
    for r in recs:
        stem = {"alibi": "alibi", "rope": "rope", "nope": "nope"}[r["model"]]
        ref = json.loads((ROOT / "results" / "long_context" / f"{stem}_seed{r['seed']}.json").read_text())
        ref_ppl = [row["ppl"] for row in ref["eval"]["none"]]
        assert [row["ppl"] for row in r["whole"]] == pytest.approx(ref_ppl, rel=1e-3), (r["model"], r["seed"])
        assert r["whole"][0]["ppl"] == pytest.approx(r["sliding"][0]["ppl"], rel=1e-4)
