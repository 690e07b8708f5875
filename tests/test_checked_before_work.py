"""Every command line (but WMT14's) checks everything before any work, and a refusal says what differs.

* Each value of a list option (every seed, model, scheme, length, candidate) is checked before a folder
  is made, data is read or a model is trained; the refusal is one line naming the bad value and what is
  valid, and the folder it ran in holds nothing new afterwards.
* A folder made with other settings is refused with the field and both values (``steps 7 (now 30)``).

The commands run in-process through ``main(argv)`` with their work replaced by :class:`WorkStarted`:
a check that comes too late fails the test at once, without training anything.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

import benchmarks.decode_profile as dp
import benchmarks.memory as bm
import benchmarks.run as br
import benchmarks.train_speed as ts
from posenc_lib.experiments import charlm, runner
from posenc_lib.experiments import cope_counting as cc
from posenc_lib.experiments import extrapolation as ex
from posenc_lib.experiments import inside as ins
from posenc_lib.experiments import long_context as lc
from posenc_lib.experiments import long_context_extra as extra
from posenc_lib.experiments import long_context_scaled as lcs
from posenc_lib.experiments import passkey_long as pkl
from posenc_lib.experiments import passkey_trained as pkt
from posenc_lib.experiments import rope_variants as rv
from posenc_lib.experiments import sliding_window as sw
from posenc_lib.files import LOCK_NAME, process_start

ROOT = Path(__file__).resolve().parent.parent
TOP_SEED = 2**32 - 1


class WorkStarted(Exception):
    """Raised by every stubbed piece of work: a refusal must come before it."""


def _work(*args, **kwargs):
    raise WorkStarted(f"work started with {args!r}")


@pytest.fixture(autouse=True)
def no_work(monkeypatch, tmp_path):
    """Stub out training, data reading and measuring; run in tmp_path (relative --out land there)."""
    monkeypatch.setattr(runner, "run_calls", _work)
    for mod in (lc, charlm):
        monkeypatch.setattr(mod, "data", _work)
        monkeypatch.setattr(mod, "load_text", _work)
    monkeypatch.setattr(sw, "read_model", _work)
    monkeypatch.setattr(br, "run_parts", _work)
    monkeypatch.setattr(dp, "profile_scheme", _work)
    monkeypatch.setattr(ts, "run_candidate", _work)
    monkeypatch.setattr(bm, "worker", _work)
    monkeypatch.chdir(tmp_path)
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(main, argv, root: Path) -> str:
    """Run ``main(argv)``; assert a one-line refusal (exit 1 or 2, no traceback) that left nothing new under
    ``root``; return the line."""
    before = _tree(root)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code in (1, 2), (argv, code, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0], (argv, lines)
    assert _tree(root) == before, (argv, "left behind", sorted(set(_tree(root)) - set(before)))
    return lines[0]


#: the experiments that take --seeds, with the flags that keep the rest of their command line valid
SEEDED = {
    "extrapolation": (ex.main, ["--pe", "none", "--out", "o", "--no-progress"]),
    "cope_counting": (cc.main, ["--models", "rope", "--out", "o"]),
    "inside": (ins.main, ["--models", "rope", "--out", "o"]),
    "long_context": (lc.main, ["--models", "rope", "--out", "o", "--ckpt", "ck"]),
    "long_context_scaled": (lcs.main, ["--finetunes", "none", "--out", "o", "--ckpt", "ck"]),
    "passkey_trained": (pkt.main, ["--models", "rope", "--out", "o"]),
    "passkey_long": (pkl.main, ["--methods", "yarn", "--out", "o", "--ckpt", "ck"]),
    "rope_variants": (rv.main, ["--models", "rope", "--out", "o"]),
    "sliding_window": (sw.main, ["--models", "rope", "--out", "o", "--ckpt", "ck"]),
}


@pytest.mark.parametrize("seeds, named", [("0,-1", "-1"), ("0,4294967296", "4294967296"), ("0,x", "'x'"),
                                          ("1.5", "'1.5'"), ("", "at least one"), (" , ", "at least one")])
@pytest.mark.parametrize("cli", sorted(SEEDED))
def test_every_seed_is_checked_before_any_work(cli, seeds, named, tmp_path):
    """A negative or too large seed was accepted by the character-model commands (the folders made, the data
    read, training started; set_seed failed on 2**32 only then); a non-integer was named with the whole list
    and no range."""
    main, argv = SEEDED[cli]
    line = refused(main, [*argv, "--seeds", seeds], tmp_path)
    assert "--seeds" in line and named in line and str(TOP_SEED) in line, line


MODELS_FLAG = {
    "cope_counting": (cc.main, "--models", ["--out", "o"], "cope, rope, alibi, none"),
    "inside": (ins.main, "--models", ["--out", "o"], "rope, alibi, nope, nope-bidir"),
    "long_context": (lc.main, "--models", ["--out", "o", "--ckpt", "ck"], "rope, rope-base500k"),
    "passkey_trained": (pkt.main, "--models", ["--out", "o"], "alibi, nope, rope"),
    "passkey_long": (pkl.main, "--methods", ["--out", "o", "--ckpt", "ck"], "none, linear, yarn, ntk"),
    "rope_variants": (rv.main, "--models", ["--out", "o"], "nope, rope, neox-0.1"),
    "sliding_window": (sw.main, "--models", ["--out", "o", "--ckpt", "ck"], "alibi, rope, nope"),
    "long_context_scaled": (lcs.main, "--finetunes", ["--out", "o", "--ckpt", "ck"], "linear, ntk, yarn, llama3"),
    "extrapolation": (ex.main, "--pe", ["--out", "o", "--no-progress"], "alibi-split, sinusoidal-rand"),
}


@pytest.mark.parametrize("value", ["", ","])
@pytest.mark.parametrize("cli", sorted(MODELS_FLAG))
def test_an_empty_list_of_models_is_refused_with_the_choices(cli, value, tmp_path):
    """`--models ''` said "unknown model(s) []"; `--finetunes ''` ran the readings without a fine-tune."""
    main, flag, argv, choices = MODELS_FLAG[cli]
    line = refused(main, [*argv, "--seeds", "0", flag, value], tmp_path)
    assert flag in line and "empty" in line and choices in line, line


def test_extrapolation_names_every_run_it_accepts(tmp_path):
    """An unknown --pe listed the library's schemes but not the runs only this experiment has (alibi-split,
    the -rand runs, t5-wide), which it accepts."""
    line = refused(ex.main, ["--pe", "rope,bogus", "--seeds", "0", "--out", "o", "--no-progress"], tmp_path)
    assert "'bogus'" in line and all(name in line for name in ex.RUN_ORDER), line


CKPT_CLIS = {"long_context": lc.main, "long_context_scaled": lcs.main, "sliding_window": sw.main,
             "passkey_long": pkl.main}


@pytest.mark.parametrize("cli", sorted(CKPT_CLIS))
def test_a_ckpt_under_a_file_leaves_no_out_folder(cli, tmp_path):
    """`--ckpt afile/sub` was refused only once --out had been made (an empty folder left behind)."""
    (tmp_path / "afile").write_text("the user's own file\n")
    line = refused(CKPT_CLIS[cli], ["--seeds", "0", "--out", "new/o", "--ckpt", "afile/sub"], tmp_path)
    assert "--ckpt" in line and "afile/sub" in line and "lies under afile, which is a file" in line, line


@pytest.mark.parametrize("cli", sorted(CKPT_CLIS))
def test_a_locked_ckpt_leaves_no_out_folder(cli, tmp_path):
    """A --ckpt folder that another living process writes is refused; the --out folder this run made for it
    (and its parent) must not remain, empty."""
    ck = tmp_path / "ck"
    ck.mkdir()
    pid = os.getppid()  # a living process that is not this one
    (ck / LOCK_NAME).write_text(json.dumps({"pid": pid, "start": process_start(pid), "since": "earlier",
                                            "command": "another command"}))
    line = refused(CKPT_CLIS[cli], ["--seeds", "0", "--out", "new/o", "--ckpt", "ck"], tmp_path)
    assert "being written by another process" in line, line


# -- a refusal names what differs -------------------------------------------------------------------
def _config(cfg) -> dict:
    return json.loads(json.dumps(asdict(cfg)))


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _lc_record(cfg, **more) -> dict:
    return {"schema": lc.SCHEMA, "profile": cfg.name, "config": _config(cfg), **more}


def test_extrapolation_names_the_field_that_differs(tmp_path):
    """The refusal said "(profile 'smoke', now 'smoke')" for a folder made with another --steps."""
    cfg = ex.SMOKE
    _write(ex.result_path(tmp_path / "o", "none", 0),
           {"profile": "smoke", "config": _config(replace(cfg, steps=cfg.steps + 7))})
    line = refused(ex.main, ["--pe", "none", "--seeds", "0", "--out", "o", "--no-progress"], tmp_path)
    assert f"steps {cfg.steps + 7} (now {cfg.steps})" in line and "none_seed0.json" in line, line


def test_cope_counting_names_both_values(tmp_path):
    """The refusal named the fields ("differing in steps") but not their values."""
    cfg = cc.SMOKE
    _write(cc.result_path(tmp_path / "o", "rope", 0), {"config": cc.config_record(replace(cfg, steps=cfg.steps + 7))})
    line = refused(cc.main, ["--models", "rope", "--seeds", "0", "--out", "o", "--resume"], tmp_path)
    assert f"steps {cfg.steps + 7} (now {cfg.steps})" in line, line


def test_inside_names_the_field_that_differs(tmp_path):
    cfg = ins.SMOKE
    _write(ins.result_path(tmp_path / "o", "rope", 0),
           {"profile": cfg.name, "config": _config(replace(cfg, lr=cfg.lr * 2))})
    line = refused(ins.main, ["--models", "rope", "--seeds", "0", "--out", "o", "--resume"], tmp_path)
    assert f"lr {cfg.lr * 2!r} (now {cfg.lr!r})" in line, line


@pytest.mark.parametrize("cli", ["long_context", "rope_variants", "sliding_window"])
def test_character_models_name_the_field_that_differs(cli, tmp_path):
    """The configuration check, shared by these, said "(profile 'smoke', now 'smoke')"; long_context and sliding_window also
    left the new --ckpt folder behind, empty."""
    main, cfg, path = {
        "long_context": (lc.main, lc.SMOKE, lc.result_path(tmp_path / "o", "rope", 0)),
        "rope_variants": (rv.main, rv.SMOKE, lc.result_path(tmp_path / "o", "rope", 0)),
        "sliding_window": (sw.main, lc.SMOKE, sw.result_path(tmp_path / "o", "rope", 0)),
    }[cli]
    _write(path, _lc_record(replace(cfg, steps=cfg.steps + 7)))
    ckpt = ["--ckpt", "ck"] if cli != "rope_variants" else []
    line = refused(main, ["--models", "rope", "--seeds", "0", "--out", "o", *ckpt], tmp_path)
    assert f"steps {cfg.steps + 7} (now {cfg.steps})" in line, line


def test_long_context_scaled_names_the_setting_that_differs(tmp_path):
    _write(lcs.result_path(tmp_path / "o", "readings", 0), _lc_record(lc.SMOKE, trials=200))
    line = refused(lcs.main, ["--finetunes", "none", "--seeds", "0", "--trials", "5", "--out", "o", "--ckpt", "ck"],
                   tmp_path)
    assert "trials 200 (now 5)" in line, line


def test_passkey_trained_names_the_nested_field(tmp_path):
    """The refusal printed both whole passkey_training records, leaving the reader to find the difference."""
    pk = pkt.PROFILES["smoke"]
    _write(pkt.result_path(tmp_path / "o", "rope", 0),
           _lc_record(pk.lm(), passkey_training=_config(replace(pk, trials=pk.trials + 3))))
    line = refused(pkt.main, ["--models", "rope", "--seeds", "0", "--out", "o"], tmp_path)
    assert f"passkey_training.trials {pk.trials + 3} (now {pk.trials})" in line, line
    assert "base_overrides" not in line, line


def test_long_context_extra_checks_every_model_before_training_one(tmp_path):
    """`sinusoidal t5` trained sinusoidal (minutes) before finding that t5's file was made with other settings."""
    cfg = lc.COURSE
    _write(tmp_path / "o" / "t5_seed0.json", _lc_record(replace(cfg, steps=cfg.steps + 7)))
    line = refused(extra.main, ["sinusoidal", "t5", "--out", "o"], tmp_path)
    assert "t5_seed0.json" in line and f"steps {cfg.steps + 7} (now {cfg.steps})" in line, line


# -- benchmarks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("main, argv", [
    (br.main, ["--quick", "--quiet", "--out", "o", "--schemes"]),
    (dp.main, ["--quick", "--out", "o", "--schemes"]),
], ids=["run", "decode_profile"])  # fmt: skip
@pytest.mark.parametrize("value", ["", ","])
def test_benchmarks_refuse_an_empty_scheme_list(main, argv, value, tmp_path):
    """`--schemes ''` measured the reference none alone, as if asked to."""
    line = refused(main, [*argv, value], tmp_path)
    assert "--schemes" in line and "rope" in line and "shaw_naive" in line, line


def test_memory_worker_refuses_an_empty_scheme(tmp_path):
    line = refused(bm.main, ["--worker", "", "--config", "{}"], tmp_path)
    assert "--worker" in line and "rope" in line, line


@pytest.mark.parametrize("flag", ["--lengths", "--batches"])
@pytest.mark.parametrize("value, bad", [("64,0", "0"), ("64,-1", "-1"), ("64,x", "'x'")])
def test_benchmark_lists_name_the_bad_item(flag, value, bad, tmp_path):
    line = refused(br.main, ["--quick", "--quiet", "--out", "o", flag, value], tmp_path)
    assert flag in line and f"got {bad} in '{value}'" in line, line


@pytest.mark.parametrize("value, named", [("", "at least one"), (",", "at least one"), ("1,x", "'x'"),
                                          ("1,0", "0"), ("1,99", "99")])
def test_train_speed_checks_every_candidate(value, named, tmp_path):
    """`--only ''` ran every candidate (minutes) as if --only had not been given."""
    line = refused(ts.main, ["--out", "o.json", "--only", value], tmp_path)
    assert "--only" in line and named in line and f"1-{len(ts.CANDIDATES)}" in line, line


# -- the process -----------------------------------------------------------------------------------
def test_the_process_refuses_in_one_line_and_leaves_nothing(tmp_path):
    """The same refusal from `python -m`: exit status 2, one line on stderr, no folder made."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "posenc_lib.experiments.sliding_window", "--seeds", "0,-1",
                           "--out", "o", "--ckpt", "ck"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "-1" in lines[0] and str(TOP_SEED) in lines[0], lines
    assert _tree(tmp_path) == []
