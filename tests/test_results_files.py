"""A damaged result file is named, with what is wrong and what to do, wherever results are read."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from posenc_lib.experiments import extrapolation as ex
from posenc_lib.experiments import long_context as longctx
from posenc_lib.files import read_json


@pytest.mark.parametrize("content", [b'{"schema": "posenc', b"", b"\xff\xfe not utf-8", b"{1: 2}"])
def test_read_json_names_the_damaged_file(tmp_path, content):
    path = tmp_path / "none_seed0.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=r"none_seed0\.json is not (valid JSON|UTF-8).*delete it"):
        read_json(path)


def test_read_json_reads_valid_files(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"a": [1, 2.5, None]}))
    assert read_json(path) == {"a": [1, 2.5, None]}


def test_extrapolation_load_and_resume_name_a_damaged_result(tmp_path):
    cfg = ex.PROFILES["smoke"]
    (tmp_path / "none_seed0.json").write_text('{"schema": ')
    with pytest.raises(ValueError, match="none_seed0.json is not valid JSON"):
        ex.load_results(tmp_path)
    with pytest.raises(ValueError, match="none_seed0.json is not valid JSON"):
        ex.pending(cfg, ["none"], [0], tmp_path)
    assert ex.pending(cfg, ["rope"], [0], tmp_path) == [("rope", 0)]  # other files are not read


def test_extrapolation_resume_refuses_another_configuration(tmp_path):
    cfg = ex.PROFILES["smoke"]
    other = asdict(cfg) | {"lr": cfg.lr * 2}
    (tmp_path / "none_seed0.json").write_text(json.dumps({"config": other, "profile": "smoke"}))
    with pytest.raises(ValueError, match="another configuration"):
        ex.pending(cfg, ["none"], [0], tmp_path)


def test_long_context_load_names_a_damaged_result(tmp_path):
    (tmp_path / "rope_seed0.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="rope_seed0.json is not valid JSON"):
        longctx.load_results(tmp_path)


def _grid_files(folder, created, ratios):
    """A train_batches.json / memory_batches.json pair: ``ratios`` maps (scheme, length, batch) to (time, memory)."""
    folder.mkdir(parents=True)
    train, memory = {}, {}
    for (pe, length, batch), (t, m) in ratios.items():
        for doc, key, value in ((train, "ratio", t), (memory, "ratio_peak", m)):
            lengths = doc.setdefault(str(batch), {"lengths": {}})["lengths"]
            if doc is train:
                lengths.setdefault(str(length), {"none": {"ratio": 1.0}})[pe] = {key: value}
            else:
                lengths.setdefault(str(length), {"schemes": {"none": {"ratio_peak": 1.0}}})["schemes"][pe] = {key: value}
    (folder / "train_batches.json").write_text(json.dumps({"created": created, "results": {"batches": train}}))
    (folder / "memory_batches.json").write_text(json.dumps({"created": created, "results": {"batches": memory}}))


def test_latest_batch_readings_takes_each_shape_from_the_latest_grid_that_measured_it(tmp_path):
    """The latest grid (by when it was made, whatever the order of the list) replaces a scheme's reading at a shape
    it measured and leaves every other scheme and shape to the earlier grids; a missing grid names its command."""
    from posenc_lib.course.notebook import latest_batch_readings

    _grid_files(tmp_path / "late", "2026-01-02T00:00:00+00:00", {("t5", 1024, 1): (1.2, 1.1)})
    _grid_files(tmp_path / "early", "2026-01-01T00:00:00+00:00",
                {("t5", 1024, 1): (1.5, 1.4), ("shaw", 1024, 1): (1.4, 1.0), ("t5", 512, 2): (1.1, 1.0)})
    got = latest_batch_readings(tmp_path, ("late", "early"))
    assert got == {("t5", 1024, 1): (1.2, 1.1, "late"), ("shaw", 1024, 1): (1.4, 1.0, "early"),
                   ("t5", 512, 2): (1.1, 1.0, "early")}
    with pytest.raises(FileNotFoundError, match="sides_B16_L2048.*does not exist yet: make it with `python -m "
                                                "benchmarks.run --only train,memory --schemes t5,alibi,shaw,deberta"):
        latest_batch_readings(tmp_path / "benchmarks" / "results", ("sides_B16_L2048",))


def test_batch_table_marks_each_ratio_over_its_goal_and_each_shape_not_measured():
    from posenc_lib.course.notebook import batch_table

    readings = {("t5", 1024, 1): (1.31, 1.2, "a"), ("t5", 1024, 2): (1.3, 1.31, "b"), ("shaw", 1024, 2): (1.59, 1.0)}
    lines = batch_table(readings, {"t5": 1.3, "shaw": 1.6}, [1024], [1, 2]).splitlines()
    assert lines[0].split() == ["scheme", "L", "B=1", "B=2", "goal"]
    assert lines[1].split() == ["t5", "1024", "1.31*/1.20", "1.30", "/1.31*", "<=", "1.3"]
    assert lines[2].split() == ["shaw", "1024", "-", "1.59", "/1.00", "<=", "1.6"]
    assert len({len(line) for line in lines}) == 1  # columns line up
