"""A damaged result file is named, with what is wrong and what to do, wherever results are read."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from posenc_lib.experiments import extrapolation as ex
from posenc_lib.experiments import long_context as longctx
from posenc_lib.utils import read_json


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
    with pytest.raises(ValueError, match="different configuration"):
        ex.pending(cfg, ["none"], [0], tmp_path)


def test_long_context_load_names_a_damaged_result(tmp_path):
    (tmp_path / "rope_seed0.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="rope_seed0.json is not valid JSON"):
        longctx.load_results(tmp_path)
