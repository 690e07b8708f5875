"""The experiments' one grid loop (posenc_lib/experiments/runner.py): resume, schema checks, phases, timing; and
every committed results folder read through its experiment's schema."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc_lib.experiments import charlm, runner
from posenc_lib.experiments import cope_counting as cc
from posenc_lib.experiments import extrapolation as ex
from posenc_lib.experiments import inside as ins
from posenc_lib.experiments import long_context_scaled as lcs
from posenc_lib.experiments import passkey_long as pkl
from posenc_lib.experiments import passkey_trained as pkt
from posenc_lib.experiments import sliding_window as sw

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"

#: every committed folder of per-model result files, with the schema its experiment reads it through
COMMITTED = {
    "long_context": charlm.RECORDS, "rope_variants": charlm.RECORDS, "long_context_extra": charlm.RECORDS,
    "long_context_scaled": lcs.RECORDS, "sliding_window": sw.RECORDS, "passkey_trained": pkt.RECORDS,
    "passkey_long": pkl.RECORDS,
    "inside": ins.RECORDS, "inside/bands": ins.BAND_RECORDS, "inside/decay": ins.DECAY_RECORDS,
    "inside/cache_controls": ins.CONTROL_RECORDS, "cope_counting": cc.RECORDS,
    **{str(p.parent.relative_to(RESULTS)): ex.RECORDS
       for p in sorted(RESULTS.glob("extrapolation*/**/*_seed*.json"))},
}  # fmt: skip


def test_every_committed_results_folder_is_known_here():
    folders = {str(p.parent.relative_to(RESULTS)) for p in RESULTS.glob("**/*_seed*.json")}
    folders = {f for f in folders if not f.startswith("wmt14")}  # lesson 17's own layout (one folder per model)
    assert folders == set(COMMITTED)


@pytest.mark.parametrize("folder", sorted(COMMITTED))
def test_every_committed_results_folder_loads_and_counts_as_finished(folder):
    schema = COMMITTED[folder]
    records = runner.load_results(RESULTS / folder, schema)
    paths = sorted((RESULTS / folder).glob("*_seed*.json"))
    assert len(records) == len(paths) > 0
    for path, rec in zip(paths, records):
        settings = {k: rec[k] for k in ("trials", "passkey_training") if k in rec}
        assert runner.finished(path, schema, rec["config"], **settings)  # a rerun with its settings skips it


SCHEMA = runner.Schema("test.grid/1", ("schema", "seed", "config", "value"))


def make(path: str, seed: int, config: dict) -> str:
    """A cell's work: its record, written at once (module level: worker processes import it)."""
    Path(path).write_text(json.dumps({"schema": SCHEMA.name, "seed": seed, "config": config, "value": seed * 2}))
    return f"done seed {seed}"


def cells(out: Path, seeds, config: dict, phase: int = 0) -> list[runner.Cell]:
    return [runner.Cell(out / f"m_seed{s}.json", make, (str(out / f"m_seed{s}.json"), s, config), phase) for s in seeds]


def test_a_grid_runs_each_cell_once_writes_at_once_and_resumes(tmp_path):
    config, logs = {"name": "t", "steps": 3}, []
    ran = runner.run_grid(cells(tmp_path, [0, 1, 1], config), out=tmp_path, schema=SCHEMA, config=config,
                          log=logs.append)
    assert len(ran) == 2 and sorted(logs) == ["done seed 0", "done seed 1"]
    recs = runner.load_results(tmp_path, SCHEMA)
    assert [r["value"] for r in recs] == [0, 2]
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    logs.clear()
    ran = runner.run_grid(cells(tmp_path, [0, 1, 2], config), out=tmp_path, schema=SCHEMA, config=config,
                          log=logs.append)
    assert [c.args[1] for c in ran] == [2] and logs == [f"skipping 2 finished result(s) in {tmp_path}", "done seed 2"]
    assert all((tmp_path / name).read_bytes() == data for name, data in before.items())


def test_phases_run_in_order_and_also_adds_what_they_need(tmp_path):
    config, logs = {"name": "t"}, []

    def also(todo):
        assert [c.args[1] for c in todo] == [1, 0]  # every result file checked before
        return cells(tmp_path / "extra", [7], config)

    (tmp_path / "extra").mkdir()
    runner.run_grid(cells(tmp_path, [1], config, phase=1) + cells(tmp_path, [0], config), out=tmp_path, schema=SCHEMA,
                    config=config, log=logs.append, also=also)
    assert logs == ["done seed 0", "done seed 7", "done seed 1"]


def test_a_file_of_another_configuration_or_damaged_is_refused_before_any_work(tmp_path):
    config = {"name": "small", "steps": 3, "lr": 0.1}
    make(str(tmp_path / "m_seed0.json"), 0, {**config, "steps": 5})
    with pytest.raises(ValueError, match=r"m_seed0\.json was made with another configuration: steps 5 \(now 3\); pass "
                                         r"another --out folder, or the settings it was made with"):
        runner.run_grid(cells(tmp_path, [1, 0], config), out=tmp_path, schema=SCHEMA, config=config, log=print)
    assert not (tmp_path / "m_seed1.json").exists()
    with pytest.raises(ValueError, match=r"or --profile small to continue it"):  # a profile's settings: its name
        runner.finished(tmp_path / "m_seed0.json", SCHEMA, config, profiles={"small": {**config, "steps": 5}})
    (tmp_path / "m_seed0.json").write_text(json.dumps({"schema": SCHEMA.name, "config": config}))
    with pytest.raises(ValueError, match=r"m_seed0\.json is not a test\.grid/1 record \(missing keys \['seed', "
                                         r"'value'\]\); delete it"):
        runner.run_grid(cells(tmp_path, [0], config), out=tmp_path, schema=SCHEMA, config=config, log=print)
    with pytest.raises(ValueError, match=r"m_seed0\.json is not a test\.grid/1 record \(missing keys"):
        runner.load_results(tmp_path, SCHEMA)
    (tmp_path / "m_seed0.json").write_text(json.dumps({"schema": "other/1", "seed": 0, "config": config, "value": 0}))
    with pytest.raises(ValueError, match=r"schema 'other/1'"):
        runner.load_results(tmp_path, SCHEMA)
    with pytest.raises(FileNotFoundError, match="no results folder"):
        runner.load_results(tmp_path / "none", SCHEMA)


def test_time_updates_times_each_model_and_projects_three_seeds():
    calls = []
    timing = runner.time_updates(["a", "b"], lambda name: name, lambda model, n, seed: calls.append((model, n, seed)),
                                 lambda name, model: None, updates=4, warmup=2, steps=100, threads=1, profile="p",
                                 measures=2.0, setup_cpu=0.5, log=lambda *_: None)  # fmt: skip
    assert calls == [("a", 2, 0), ("a", 4, 1), ("b", 2, 0), ("b", 4, 1)]
    assert set(timing["per_model"]) == {"a", "b"} and timing["data_cpu"] == 0.5 and timing["steps"] == 100
    assert set(timing["per_model"]["a"]) == {"wall_per_update", "cpu_per_update", "eval_wall", "eval_cpu"}
    per = timing["per_model"].values()
    expected = 3 * sum(r["cpu_per_update"] * 100 + r["eval_cpu"] * 2 + 0.5 for r in per)
    assert timing["cpu_seconds_3_seeds"] == pytest.approx(expected, abs=0.1)
    with pytest.raises(ValueError, match="updates must be a positive integer"):
        runner.time_updates(["a"], str, print, print, updates=0, warmup=1, steps=1, threads=1, profile="p")
