"""benchmarks/train_speed.py: its batches follow the pipeline's token budget, a candidate runs end to end, and the
committed table holds every candidate."""
import json
from pathlib import Path

import pytest

from benchmarks import train_speed as ts

ROOT = Path(__file__).resolve().parents[1]


def test_batches_keep_the_token_budget_and_length_limit():
    plan = ts.batches(30, seed=1)
    assert len(plan) == 30
    for src, tgt in plan:
        assert len(src) == len(tgt) >= 1
        assert len(tgt) * max(tgt) <= ts.BATCH_TOKENS or len(tgt) == 1  # padding counted, as the pipeline counts it
        assert max(src) <= ts.MAX_TOKENS + 1 and max(tgt) <= ts.MAX_TOKENS + 1
    assert ts.batches(5, seed=1) == plan[:5]  # seeded


def test_one_candidate_runs_and_reports(tmp_path):
    row = ts.run_candidate(("1 model x 1 thread, fp32", 1, 1, "fp32", "default", False, False), pe="rope", warm=1,
                           updates=2, profile=True)
    assert row["processes"] == 1 and len(row["per_model_tok_per_s"]) == 1 and row["tok_per_s"] > 0
    assert 0 <= row["python_ms_per_update"] < row["ms_per_update_profiled"]


def test_jemalloc_is_used_only_when_present(monkeypatch):
    monkeypatch.setattr(ts, "JEMALLOC", ("/nonexistent/libjemalloc.so.2",))
    row = ts.run_candidate(("x", 2, 1, "fp32", "default", False, True), pe="none", warm=0, updates=1)
    assert "skipped" in row and "libjemalloc2" in row["skipped"]


def test_existing_results_are_not_overwritten(tmp_path, capsys):
    out = tmp_path / "speed.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as err:
        ts.main(["--out", str(out)])
    assert err.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_committed_table_has_every_candidate():
    doc = json.loads((ROOT / "benchmarks" / "results" / "train_speed.json").read_text())
    assert [r["name"] for r in doc["rows"]] == [c[0] for c in ts.CANDIDATES]
    assert all(r["tok_per_s"] > 0 for r in doc["rows"] if "skipped" not in r)
