"""Nothing a user has is destroyed, nothing is silently wrong: the second reliability round.

One test (at least) per example of the issue, each failing on the code before the fix, grouped by
class: data loss, silently wrong results, raw tracebacks and unclear messages; then the pieces of the
write policy they share (folder locks, Ctrl-C in worker pools) and the compatibility of run folders
made before the policy (the WMT14 run in progress must resume with the same command).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc_lib.experiments.wmt14 import main as wmt14_main
from posenc_lib.experiments.wmt14 import default_ckpt_dir, make_data, parse_seeds, run
from posenc_lib.experiments.wmt14.data import read_lines, read_parallel
from posenc_lib.experiments.wmt14.pipeline import read_test_sets
from posenc_lib.experiments.wmt14.train import get_profile
from posenc_lib.files import LOCK_NAME, FolderLock, FolderLocked

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_dir(tmp_path: Path, name: str = "data", n_train: int = 200, edit=None) -> Path:
    """A data folder with the shipped files' first lines; ``edit(split, lang, lines)`` may change them."""
    d = tmp_path / name
    d.mkdir()
    for split, n in (("train", n_train), ("newstest2013", 30), ("newstest2014", 12), ("heldout", 12)):
        fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", split, n)
        for lang, lines in (("fr", fr), ("en", en)):
            lines = edit(split, lang, list(lines)) if edit else lines
            (d / f"{split}.{lang}").write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return d


def tiny(**kw):
    base = dict(vocab_size=200, max_train_pairs=None, max_steps=4, log_every=2, val_every=2, ckpt_every=2,
                val_pairs=6, eval_limit=3, bertscore=False, bootstrap_samples=10, batch_tokens=200)
    return get_profile("smoke", {**base, **kw})


def quiet(msg):
    pass


def run_cli(main, argv):
    """``main(argv)`` in-process: (exit status, stderr lines). An exception other than SystemExit fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except KeyboardInterrupt:  # escaping, it would stop the whole test session
            pytest.fail(f"{argv}: KeyboardInterrupt escaped the command line")
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# == data loss ========================================================================================
def test_book_build_keeps_a_src_and_html_it_did_not_make(tmp_path, monkeypatch):
    """`python -m book.build --out DIR` deleted DIR/src and DIR/html, whatever they held."""
    import book.build as bb

    def fake_sphinx(cmd, **kw):  # the HTML step without Sphinx (seconds instead of minutes)
        Path(cmd[cmd.index("-d") + 3]).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(bb.subprocess, "run", fake_sphinx)
    out = tmp_path / "site"
    (out / "src").mkdir(parents=True)
    (out / "src" / "my_notes.md").write_text("mine\n")
    (out / "html").mkdir()
    (out / "html" / "index.html").write_text("<p>my own page</p>\n")
    before = snapshot(out)
    code, lines = run_cli(bb.main, ["--out", str(out)])
    assert code == 2 and len(lines) == 1 and "--overwrite" in lines[0] and "src" in lines[0], lines
    assert snapshot(out) == before and not (out / LOCK_NAME).exists()
    # a folder an earlier build made is rebuilt; --overwrite takes a foreign one
    fresh = tmp_path / "fresh"
    assert run_cli(bb.main, ["--out", str(fresh)])[0] in (0, None)
    (fresh / "src" / "stale.md").write_text("from the last build\n")
    assert run_cli(bb.main, ["--out", str(fresh)])[0] in (0, None)
    assert not (fresh / "src" / "stale.md").exists() and (fresh / "src" / "index.md").is_file()
    assert run_cli(bb.main, ["--out", str(out), "--overwrite"])[0] in (0, None)
    assert not (out / "src" / "my_notes.md").exists()


def test_wmt14_rerun_without_resume_keeps_the_checkpoint(tmp_path):
    """Re-running a WMT14 command without --resume when a checkpoint exists started from update 0 and
    overwrote the checkpoint, silently."""
    d = tiny_dir(tmp_path)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    prof = tiny(max_steps=8)
    assert run(prof, ["none"], [0], tmp_path / "run", stop_after=4, **kw) is None
    ck = default_ckpt_dir(tmp_path / "run") / "none-seed0" / "checkpoint.pt"
    raw = ck.read_bytes()
    with pytest.raises(ValueError, match=r"checkpoint\.pt.*unfinished model.*--resume.*--overwrite"):
        run(prof, ["none"], [0], tmp_path / "run", **kw)
    assert ck.read_bytes() == raw
    argv = ["--profile", "smoke", "--pe", "none", "--data-dir", str(d), "--out", str(tmp_path / "run"), "--no-progress",
            *[f"--set={k}={v}" for k, v in (("vocab_size", 200), ("max_steps", 8), ("log_every", 2), ("val_every", 2),
                                            ("ckpt_every", 2), ("val_pairs", 6), ("eval_limit", 3),
                                            ("bertscore", "false"), ("bootstrap_samples", 10), ("batch_tokens", 200),
                                            ("max_train_pairs", "none"))]]  # fmt: skip
    code, lines = run_cli(wmt14_main, argv)
    assert code == 2 and len(lines) == 1 and "--resume" in lines[0], lines
    assert ck.read_bytes() == raw
    code, lines = run_cli(wmt14_main, argv + ["--resume", "--overwrite"])
    assert code == 2 and len(lines) == 1 and "pass one of them" in lines[0], lines
    # told to: --overwrite trains it again from update 0
    assert run(prof, ["none"], [0], tmp_path / "run", overwrite=True, stop_after=2, **kw) is None
    assert torch.load(ck, weights_only=False)["state"]["step"] == 2


def test_benchmarks_without_out_never_touch_the_published_results(tmp_path, monkeypatch):
    """`python -m benchmarks.run` with no --out overwrote the committed benchmarks/results/."""
    import benchmarks.run as br

    published = tmp_path / "published"
    published.mkdir()
    for name in ("train.json", "table.md"):
        shutil.copy(ROOT / "benchmarks" / "results" / name, published / name)
    before = snapshot(published)
    monkeypatch.setattr(br, "DEFAULT_OUT", published)
    monkeypatch.setattr(br, "PUBLISHED", published, raising=False)
    monkeypatch.setattr(br, "RUNS", tmp_path / "runs", raising=False)
    monkeypatch.setattr(br, "QUICK_OUT", tmp_path / "runs" / "bench-quick", raising=False)
    monkeypatch.setattr(br, "bench_train", lambda schemes, cfg, quiet: {"lengths": {}})
    monkeypatch.setattr(br, "write_report", lambda out: (Path(out) / "table.md").write_text("a trial\n"))
    argv = ["--only", "train", "--schemes", "none", "--threads", "1", "--quiet"]
    run_cli(br.main, argv)  # a trial without --out
    assert snapshot(published) == before
    trials = list((tmp_path / "runs").glob("bench-*/train.json"))
    assert len(trials) == 1
    code, lines = run_cli(br.main, argv + ["--out", str(published)])  # onto results: only with --overwrite
    assert code == 2 and len(lines) == 1 and "train.json" in lines[0] and "--overwrite" in lines[0], lines
    assert snapshot(published) == before
    run_cli(br.main, argv + ["--out", str(published), "--overwrite"])
    assert json.loads((published / "train.json").read_text())["results"] == {"lengths": {}}
    # a folder holding someone else's table.md is refused too
    other = tmp_path / "other"
    other.mkdir()
    (other / "table.md").write_text("my table\n")
    code, lines = run_cli(br.main, argv + ["--out", str(other)])
    assert code == 2 and "table.md" in lines[0] and (other / "table.md").read_text() == "my table\n"


def test_decode_profile_keeps_an_existing_result(tmp_path):
    from benchmarks.decode_profile import main as profile_main

    (tmp_path / "decode_profile.json").write_text("{}\n")
    code, lines = run_cli(profile_main, ["--quick", "--schemes", "none", "--out", str(tmp_path)])
    assert code == 2 and len(lines) == 1 and "--overwrite" in lines[0]
    assert (tmp_path / "decode_profile.json").read_text() == "{}\n"


def _corpus(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", "train", 40)
    for lang, rows in (("fr", fr), ("en", en)):
        (src / f"train.{lang}").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return src


def test_make_data_onto_a_folder_that_holds_files_keeps_them(tmp_path):
    """`make-data --out` onto an existing folder overwrote what was there."""
    src = _corpus(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train.fr").write_text("my own training data\n")
    (out / "notes.txt").write_text("keep me\n")
    before = snapshot(out)
    code, lines = run_cli(wmt14_main, ["make-data", "--src", str(src), "--out", str(out), "--pairs", "10"])
    assert code == 2 and len(lines) == 1 and "--overwrite" in lines[0] and str(out) in lines[0], lines
    assert snapshot(out) == before
    assert run_cli(wmt14_main, ["make-data", "--src", str(src), "--out", str(out), "--pairs", "10", "--overwrite"])[0] == 0
    assert not (out / "train.fr").exists() and (out / "train.fr.xz").is_file()
    assert (out / "notes.txt").read_text() == "keep me\n" and not (out / LOCK_NAME).exists()


def test_make_data_out_file_is_refused_before_the_corpus_is_read(tmp_path, monkeypatch):
    """`make-data --out FILE` failed only after reading the whole corpus."""
    import posenc_lib.experiments.wmt14.data as data

    src = _corpus(tmp_path)
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder\n")

    def no_reading(*a, **k):
        raise AssertionError("the corpus was read before --out was checked")

    monkeypatch.setattr(data, "read_parallel", no_reading)
    monkeypatch.setattr(data, "read_lines", no_reading)
    code, lines = run_cli(wmt14_main, ["make-data", "--src", str(src), "--out", str(a_file), "--pairs", "10"])
    assert code == 2 and len(lines) == 1 and "--out" in lines[0] and "a_file" in lines[0], lines
    with pytest.raises(ValueError, match="is a file"):
        make_data(src, a_file, pairs=10, log=quiet)
    assert a_file.read_text() == "not a folder\n"


def test_long_context_retrain_keeps_the_finished_result_until_replaced(tmp_path, monkeypatch):
    """A retrain (weights gone, a fine-tune pending) deleted the finished result file first, so an
    interrupt lost it."""
    from dataclasses import asdict

    from posenc_lib.experiments import long_context as lc

    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    rec = {"schema": lc.SCHEMA, "kind": "pretrain", "model": "nope", "seed": 0, "profile": "smoke",
           "config": json.loads(json.dumps(asdict(lc.SMOKE))), "eval": {}}
    path = lc.result_path(out, "nope", 0)
    path.write_text(json.dumps(rec))

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(lc, "pretrain", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lc.run_all(lc.SMOKE, [0], out, ckpt, names=["nope"], finetunes=[("nope", "none")], log=quiet)
    assert json.loads(path.read_text()) == rec  # still there, whole
    assert not (out / LOCK_NAME).exists() and not (ckpt / LOCK_NAME).exists()


# == silently wrong ===================================================================================
def test_wmt14_other_data_dir_on_an_existing_out_is_refused(tmp_path):
    """Changing --data-dir on an existing --out trained on the cached encoding of the old data while the log
    named the new one, and mixed test sets in the run folder."""
    a = tiny_dir(tmp_path, "a")
    b = tiny_dir(tmp_path, "b", edit=lambda split, lang, lines: lines[::-1])  # the same files, other order
    out = tmp_path / "run"
    assert run(tiny(max_steps=8), ["none"], [0], out, data_dir=a, source="files", progress=False, log=quiet,
               stop_after=2) is None
    before = snapshot(out)
    with pytest.raises(ValueError, match=r"was made from other data.*/a\b.*not from.*/b\b.*--out"):
        run(tiny(max_steps=8), ["none"], [0], out, data_dir=b, source="files", progress=False, log=quiet, resume=True)
    assert snapshot(out) == before  # nothing written: no test set of the other data
    cache = default_ckpt_dir(out) / "data-fr-en.pt"
    with pytest.raises(ValueError, match=r"data cache .*data-fr-en\.pt was made from other data"):
        run(tiny(max_steps=8), ["rope"], [0], tmp_path / "run2", data_dir=b, source="files", progress=False,
            log=quiet, ckpt_dir=cache.parent)


def test_wmt14_carriage_return_inside_a_test_line_keeps_sources_aligned(tmp_path):
    """A stray carriage return inside a test-set line shifted sources against references."""
    def stray(split, lang, lines):
        if split == "newstest2014":
            k = 1 if lang == "fr" else 2  # in different lines of the two sides: the counts stay equal
            lines[k] = lines[k].replace(" ", " \r", 1)
        return lines

    d = tiny_dir(tmp_path, edit=stray)
    run(tiny(max_steps=8, eval_limit=5), ["none"], [0], tmp_path / "run", data_dir=d, source="files",
        progress=False, log=quiet, stop_after=1)
    fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", "newstest2014", 5)
    src, ref = read_test_sets(tmp_path / "run")["newstest2014"]
    assert len(src) == len(ref) == 5
    assert [s.split() for s in src] == [s.split() for s in fr] and [s.split() for s in ref] == [s.split() for s in en]
    assert not any("\r" in s for s in src + ref)


def test_read_lines_refuses_a_file_with_old_mac_line_ends(tmp_path):
    (tmp_path / "t.fr").write_bytes(b"un\rdeux\rtrois\r")
    with pytest.raises(ValueError, match=r"t\.fr ends its lines with carriage returns only"):
        read_lines(tmp_path / "t.fr")
    (tmp_path / "t.en").write_bytes(b"one\r\ntw\ro\r\n")  # Windows line ends are fine; a CR inside becomes a space
    assert read_lines(tmp_path / "t.en") == ["one", "tw o"]


def test_wmt14_changing_eval_limit_after_models_finished_is_refused(tmp_path):
    """Changing eval_limit between sittings averaged seeds scored on different test sets.  Also: a scheme
    or seed named twice is trained once."""
    d = tiny_dir(tmp_path)
    kw = dict(data_dir=d, source="files", progress=False)
    logged = []
    run(tiny(max_steps=2, eval_limit=2), ["none", "none"], [0, 0], tmp_path / "run", log=logged.append, **kw)
    assert sum(m.startswith("training none-seed0") for m in logged) == 1
    with pytest.raises(ValueError, match=r"1 finished model\(s\) scored with eval_limit=2 \(now 3\)"):
        run(tiny(max_steps=2, eval_limit=3), ["none"], [1], tmp_path / "run", log=quiet, **kw)
    assert not (tmp_path / "run" / "none-seed1").exists()
    assert len(read_test_sets(tmp_path / "run")["heldout"][0]) == 2  # the test files were not rewritten
    rec = json.loads((tmp_path / "run" / "none-seed0" / "result.json").read_text())
    assert rec["scored_with"] == {"eval_limit": 2, "beam": 1, "length_penalty": 0.6}


def test_duplicate_seeds_and_schemes_count_once(tmp_path, monkeypatch):
    """`--seeds 0,0,00` trained the same model several times into one folder."""
    from posenc_lib.experiments import extrapolation as ex
    from posenc_lib.experiments import long_context as lc

    assert parse_seeds("0,0,00") == [0] and parse_seeds("2,1,2") == [2, 1]
    calls = []
    monkeypatch.setattr(ex, "train_and_write", lambda pe, cfg, seed, out, progress: calls.append((pe, seed)) or "done")
    ex.run_all(ex.SMOKE, ["none", "none", "rope"], [0, 0], tmp_path / "ex", progress=False, log=quiet)
    assert calls == [("none", 0), ("rope", 0)]
    calls.clear()
    monkeypatch.setattr(lc, "pretrain", lambda name, seed, *a: calls.append((name, seed)) or "done")
    lc.run_all(lc.SMOKE, [1, 1], tmp_path / "lc", tmp_path / "ck", names=["nope", "nope"], finetunes=[], log=quiet)
    assert calls == [("nope", 1)]


def _stub_python(tmp_path: Path) -> Path:
    stub = tmp_path / "stub-python"
    stub.write_text("#!/bin/sh\nsleep 4\nexit 1\n")
    stub.chmod(0o755)
    return stub


@pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("nohup") is None, reason="needs setsid and nohup")
def test_gpu_finale_start_twice_is_refused(tmp_path):
    """`scripts/gpu_finale.sh start` twice: no lock, two pipelines in one folder (and a calibration timed
    under contention); the second start also emptied the first one's log."""
    run_dir = tmp_path / "runs" / "wmt14-gpu"
    env = {**ENV, "PYTHON": str(_stub_python(tmp_path)), "RUN_DIR": str(run_dir), "FOLLOW": "0", "REHEARSE_ON_CPU": "1"}
    script = ROOT / "scripts" / "gpu_finale.sh"
    first = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    time.sleep(0.5)
    log_before = Path(f"{run_dir}.log").read_text()
    second = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode != 0 and "already runs" in second.stderr, (second.stdout, second.stderr)
    assert Path(f"{run_dir}.log").read_text().startswith(log_before)  # the first pipeline's log is whole
    for _ in range(100):  # the first pipeline ends (its stub python fails) and releases the lock
        if Path(f"{run_dir}.done").exists() and not Path(f"{run_dir}.pid").exists():
            break
        time.sleep(0.2)
    assert not Path(f"{run_dir}.pid").exists()
    third = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert third.returncode == 0, third.stderr
    for _ in range(100):
        if Path(f"{run_dir}.done").exists() and not Path(f"{run_dir}.pid").exists():
            break
        time.sleep(0.2)
    assert Path(f"{run_dir}.log").read_text().startswith(log_before)  # appended to, not emptied
    Path(f"{run_dir}.pid").write_text("999999999\n")  # left by a pipeline that is gone
    fourth = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert fourth.returncode == 0 and "no longer runs" in fourth.stderr, fourth.stderr
    for _ in range(100):
        if Path(f"{run_dir}.done").exists() and not Path(f"{run_dir}.pid").exists():
            break
        time.sleep(0.2)


def test_ctrl_c_stops_jobs_workers_and_says_how_to_resume(tmp_path):
    """Ctrl-C did not stop `--jobs N` runs (workers went on writing results), then a traceback."""
    d = tiny_dir(tmp_path)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "posenc_lib.experiments.wmt14", "--profile", "smoke", "--pe", "none,rope",
           "--seeds", "0", "--data-dir", str(d), "--out", str(out), "--jobs", "2", "--threads", "1", "--no-progress"]
    for kv in ("vocab_size=200", "max_steps=100000", "log_every=2", "val_every=2", "ckpt_every=2", "val_pairs=6",
               "eval_limit=3", "bertscore=false", "batch_tokens=200"):
        cmd += ["--set", kv]
    # its own process group with Ctrl-C at its default action, as a terminal's foreground job: a Python child keeps
    # an inherited "ignore SIGINT", and a shell without job control starts every background command (`make test &`)
    # with SIGINT ignored, so pytest itself, and every child it starts, may hold it
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        metrics = [out / f"{pe}-seed0" / "metrics.jsonl" for pe in ("none", "rope")]
        deadline = time.time() + 120
        ckpts = [default_ckpt_dir(out) / f"{pe}-seed0" / "checkpoint.pt" for pe in ("none", "rope")]
        while not all(m.is_file() and m.read_text().count("\n") >= 2 for m in metrics) or \
                not all(c.is_file() for c in ckpts):  # a first checkpoint each, however slow the machine
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole group, parent and workers
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted:") and "--resume" in last, err[-2000:]
    sizes = {m: m.stat().st_size for m in metrics}
    time.sleep(2)
    assert {m: m.stat().st_size for m in metrics} == sizes  # no worker goes on writing
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # every process of the group has ended
    assert not (out / LOCK_NAME).exists()
    assert all((default_ckpt_dir(out) / f"{pe}-seed0" / "checkpoint.pt").is_file() for pe in ("none", "rope"))


def test_score_keeps_the_run_order_of_schemes(tmp_path):
    """`score` reordered the schemes (by file name), so bootstrap baselines and figure colours changed.
    The committed results/wmt14-laptop keeps scoring with the library of today."""
    run_dir = tmp_path / "wmt14-laptop"
    # the committed files only: a training run writing into the folder holds its lock and unfinished models
    shutil.copytree(ROOT / "results" / "wmt14-laptop", run_dir, ignore=shutil.ignore_patterns(LOCK_NAME))
    committed = json.loads((run_dir / "results.json").read_text())
    code, lines = run_cli(wmt14_main, ["score", str(run_dir), "--no-bertscore"])
    assert code == 0, lines
    scored = json.loads((run_dir / "results.json").read_text())
    assert list(scored["models"]) == list(committed["models"])
    assert list(committed["models"])[:4] == ["none", "sinusoidal", "shaw", "rope"]  # the run's order, not by name
    pairs = lambda r: [(p["baseline"], p["system"]) for p in r["paired_bootstrap"]["heldout"]]  # noqa: E731
    assert pairs(scored) == pairs(committed) and scored["paired_bootstrap"] == committed["paired_bootstrap"]
    assert not (run_dir / LOCK_NAME).exists()


# == raw tracebacks and unclear messages ==============================================================
def test_entry_points_without_flags_leave_the_committed_results_alone(tmp_path, monkeypatch):
    """Entry points run with no flags against the committed results: `extrapolation` advised deleting them."""
    from posenc_lib.experiments import extrapolation as ex
    from posenc_lib.experiments import long_context as lc

    monkeypatch.chdir(tmp_path)
    for folder, name in (("extrapolation", "none_seed0.json"), ("long_context", "nope_seed0.json")):
        (tmp_path / "results" / folder).mkdir(parents=True)
        shutil.copy(ROOT / "results" / folder / name, tmp_path / "results" / folder / name)
    before = snapshot(tmp_path / "results")
    trained = []
    monkeypatch.setattr(ex, "train_and_write", lambda pe, cfg, seed, out, progress: trained.append(str(out)) or "done")
    monkeypatch.setattr(lc, "pretrain", lambda name, seed, cfg, out, ckpt: trained.append(str(out)) or "done")
    monkeypatch.setattr(lc, "finetune", lambda name, method, seed, cfg, out, ckpt: "done")
    assert run_cli(ex.main, ["--no-progress"]) == (0, [])
    assert run_cli(lc.main, []) == (0, [])
    assert set(trained) == {"runs/extrapolation-smoke", "runs/longctx-smoke"}
    assert snapshot(tmp_path / "results") == before
    # pointed at them on purpose with other settings: one line, and no advice to delete them
    code, lines = run_cli(ex.main, ["--out", "results/extrapolation", "--pe", "none", "--seeds", "0", "--no-progress"])
    assert code == 2 and len(lines) == 1 and "another --out" in lines[0] and "delete" not in lines[0], lines
    code, lines = run_cli(lc.main, ["--out", "results/long_context", "--models", "nope", "--seeds", "0"])
    assert code == 2 and len(lines) == 1 and "another --out" in lines[0] and "delete" not in lines[0], lines
    assert snapshot(tmp_path / "results") == before


def test_damaged_weights_are_named_without_unsafe_advice(tmp_path):
    """Damaged weight files: the advice to pass weights_only=False (which runs the file's code) is unsafe."""
    from posenc_lib.experiments import long_context as lc
    from posenc_lib.files import load_weights

    path = lc.ckpt_path(tmp_path / "ck", lc.SMOKE, "nope", 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"cut off in the middle")
    with pytest.raises(ValueError) as err:
        lc.finetune("nope", "none", 0, lc.SMOKE, tmp_path / "out", tmp_path / "ck")
    assert str(path) in str(err.value) and "weights_only" not in str(err.value) and "delete it" in str(err.value)
    torch.save({"w": torch.zeros(2), "code": print}, path)  # a pickle holding more than tensors
    with pytest.raises(ValueError) as err:
        load_weights(path)
    assert str(path) in str(err.value) and "weights_only" not in str(err.value)


def test_beam_search_takes_the_edge_cases_greedy_decode_takes():
    """`beam_search` edge cases that `greedy_decode` handles: no end token, an empty batch."""
    from posenc_lib import build_model, greedy_decode
    from posenc_lib.models.beam import beam_search

    torch.manual_seed(0)
    m = build_model("rope", 12, d_model=16, n_heads=2, num_layers=1, num_decoder_layers=1, dim_feedforward=32)
    src = torch.randint(4, 12, (3, 5))
    g = greedy_decode(m, src, max_new_tokens=6, bos_id=2, eos_id=None)
    b = beam_search(m, src, max_new_tokens=6, bos_id=2, eos_id=None, beam=1, alpha=0.0)
    assert torch.equal(g, b) and b.shape == (3, 7)
    assert beam_search(m, src, max_new_tokens=6, bos_id=2, eos_id=None, beam=3).shape == (3, 7)
    empty = torch.zeros(0, 5, dtype=torch.long)
    assert beam_search(m, empty, max_new_tokens=4, bos_id=2, eos_id=3).shape[0] == 0
    assert greedy_decode(m, empty, max_new_tokens=4, bos_id=2, eos_id=3).shape[0] == 0


def _small_run_folder(tmp_path: Path) -> Path:
    """Two models of the committed laptop run (a copy), without data.json and results.json."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    committed = ROOT / "results" / "wmt14-laptop"
    for name in ("config.json", "tokenizer.json", "src.heldout.txt", "ref.heldout.txt", "src.newstest2014.txt",
                 "ref.newstest2014.txt"):
        shutil.copy(committed / name, run_dir / name)
    for model in ("none-seed0", "rope-seed0"):
        shutil.copytree(committed / model, run_dir / model)
    return run_dir


def test_score_with_a_bad_device_or_an_old_run_folder_says_one_line(tmp_path):
    """`score` with a bad --device or an old run folder ended in a raw traceback or an unclear message."""
    run_dir = _small_run_folder(tmp_path)
    code, lines = run_cli(wmt14_main, ["score", str(run_dir), "--device", "tpu"])
    assert code == 2 and len(lines) == 1 and "--device 'tpu'" in lines[0] and "cpu, cuda" in lines[0], lines
    if not torch.cuda.is_available():
        code, lines = run_cli(wmt14_main, ["score", str(run_dir), "--device", "cuda"])
        assert code == 2 and len(lines) == 1 and "no CUDA device" in lines[0], lines
    # a folder made before data.json (and without results.json): scored, not "No such file ... data-fr-en.pt"
    code, lines = run_cli(wmt14_main, ["score", str(run_dir), "--no-bertscore"])
    assert code == 0, lines
    assert list(json.loads((run_dir / "results.json").read_text())["models"]) == ["none", "rope"]
    rec = run_dir / "rope-seed0" / "result.json"
    old = json.loads(rec.read_text())
    del old["tests"]
    rec.write_text(json.dumps(old))
    code, lines = run_cli(wmt14_main, ["score", str(run_dir), "--no-bertscore"])
    assert code == 2 and len(lines) == 1 and str(rec) in lines[0] and "tests" in lines[0], lines
    cfg = json.loads((run_dir / "config.json").read_text())
    del cfg["direction"]
    (run_dir / "config.json").write_text(json.dumps(cfg))
    code, lines = run_cli(wmt14_main, ["score", str(run_dir)])
    assert code == 2 and len(lines) == 1 and "direction" in lines[0], lines


def test_bad_vocab_is_one_line_before_the_data_is_read(tmp_path):
    """A bad --vocab ended in a raw traceback from the tokenizers library (or was silently ignored)."""
    binary = tmp_path / "vocab.bin"
    binary.write_bytes(b"\x00\xff\xfe not text")
    tiny_vocab = tmp_path / "vocab.txt"
    tiny_vocab.write_text("a\nb\n")
    base = ["--profile", "smoke", "--pe", "none", "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path / "none")]
    for argv, words in (
        (["--tokenizer", "mbert", "--vocab", str(binary)], [str(binary), "WordPiece"]),
        (["--tokenizer", "mbert", "--vocab", str(tiny_vocab)], [str(tiny_vocab), "WordPiece"]),
        (["--tokenizer", "mbert", "--vocab", str(tmp_path)], [str(tmp_path), "folder"]),
        (["--vocab", str(tiny_vocab)], ["--vocab", "--tokenizer mbert"]),
    ):
        code, lines = run_cli(wmt14_main, base + argv)
        assert code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (argv, lines)
    assert not (tmp_path / "o").exists()


def test_ctrl_c_says_how_to_continue(tmp_path, monkeypatch):
    """Ctrl-C gave a traceback without a "rerun with --resume" hint."""
    import posenc_lib.experiments.wmt14.pipeline as pipeline
    from posenc_lib.experiments import extrapolation as ex

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    d = tiny_dir(tmp_path)
    monkeypatch.setattr(pipeline, "run_model", interrupted)
    code, lines = run_cli(wmt14_main, ["--profile", "smoke", "--pe", "none", "--data-dir", str(d), "--set",
                                       "vocab_size=200", "--out", str(tmp_path / "run"), "--no-progress"])
    assert code == 130 and len(lines) == 1 and "--resume" in lines[0] and str(tmp_path / "run") in lines[0], lines
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    monkeypatch.setattr(ex, "train_and_write", interrupted)
    code, lines = run_cli(ex.main, ["--pe", "none", "--seeds", "0", "--out", str(tmp_path / "ex"), "--no-progress"])
    assert code == 130 and len(lines) == 1 and "same command" in lines[0], lines


def test_cut_off_metrics_line_is_named_or_dropped(tmp_path):
    """A cut-off `metrics.jsonl` line ended in a JSONDecodeError without the file's name."""
    from posenc_lib.experiments.wmt14.train import read_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "val_loss": 1.0} for s in (0, 2, 4)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + '{"step": 6, "val_lo')  # a kill while the last row was appended
    assert read_metrics(path, 4) == rows
    path.write_text(text.replace('{"step": 2', '{"step": 2,,', 1))
    with pytest.raises(ValueError, match=rf"{path}, line 2: not a metrics row.*delete that line"):
        read_metrics(path, 4)


def test_results_file_names_the_command_that_makes_it(tmp_path):
    """Lessons opened before their results/ exist: say what command makes them."""
    from posenc_lib.course.notebook import results_file, results_files

    with pytest.raises(FileNotFoundError) as err:
        results_file(tmp_path / "results" / "long_context_extra" / "t5_seed0.json")
    msg = str(err.value)
    assert "t5_seed0.json does not exist yet" in msg and "python -m posenc_lib.experiments.long_context_extra" in msg
    assert "\n" not in msg
    with pytest.raises(FileNotFoundError, match=r"no sinusoidal_seed\*\.json in .*extrapolation.*--profile pilot"):
        results_files(tmp_path / "results" / "extrapolation", "sinusoidal_seed*.json")
    with pytest.raises(FileNotFoundError, match=r"x\.json does not exist yet: make it with `python -m mine`"):
        results_file(tmp_path / "x.json", "python -m mine")
    assert results_file(ROOT / "results" / "long_context_extra" / "t5_seed0.json").is_file()
    assert len(results_files(ROOT / "results" / "extrapolation", "sinusoidal_seed*.json")) == 3


# == the policy's pieces ==============================================================================
def test_folder_lock_refuses_a_living_holder_and_takes_over_a_dead_ones(tmp_path):
    from posenc_lib.files import process_start

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "start": process_start(holder.pid),
                                                      "since": "now", "command": "python -m something"}))
        with pytest.raises(FolderLocked, match=rf"being written by another process \(pid {holder.pid}.*python -m "
                                               "something.*another --out folder"):
            FolderLock(tmp_path, what="--out folder").acquire()
        with pytest.raises(ValueError, match="being written by another process"):  # a run refuses it too
            run(tiny(), ["none"], [0], tmp_path, source="files", log=quiet, ckpt_dir=tmp_path / "ck")
    finally:
        holder.kill()
        holder.wait()
    notes = []
    with FolderLock(tmp_path, log=notes.append):  # the holder is gone: taken over, with a note
        with FolderLock(tmp_path):  # re-entrant in one process
            pass
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert notes and "no longer runs" in notes[0] and not (tmp_path / LOCK_NAME).exists()


def test_a_run_folder_made_before_these_records_resumes_and_grows(tmp_path):
    """Compatibility: a run folder made by the previous version (config.json without the data record and
    the scheme order, a data cache without the data fingerprint, an unfinished model's checkpoint) resumes
    with the same command, and another scheme with the same profile joins it."""
    d = tiny_dir(tmp_path)
    out = tmp_path / "run"
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    prof = tiny(max_steps=6)
    assert run(prof, ["sinusoidal", "none"], [0], out, stop_after=2, **kw) is None
    cfg_path, cache = out / "config.json", default_ckpt_dir(out) / "data-fr-en.pt"
    cfg = json.loads(cfg_path.read_text())
    assert {"data", "schemes", "seeds"} <= set(cfg)
    for key in ("data", "schemes", "seeds"):  # as the previous version wrote it
        del cfg[key]
    cfg_path.write_text(json.dumps(cfg, indent=2))
    data = torch.load(cache, weights_only=False)
    del data["key"]["data_sha256"]
    torch.save(data, cache)
    res = run(prof, ["sinusoidal", "none"], [0], out, resume=True, **kw)  # the same command, --resume
    assert list(res["models"]) == ["sinusoidal", "none"]
    assert json.loads(cfg_path.read_text())["schemes"] == ["sinusoidal", "none"]
    res = run(prof, ["rope"], [0, 1], out, **kw)  # another scheme and seed, same profile, same folder
    assert list(res["models"]) == ["sinusoidal", "none", "rope"]  # the first sitting's schemes stay first
    assert res["paired_bootstrap"]["heldout"][0]["baseline"] == "sinusoidal"
    assert json.loads(cfg_path.read_text())["seeds"] == [0, 1]


# == the other commands of each class =================================================================
def test_no_entry_point_defaults_to_the_committed_results(tmp_path, monkeypatch):
    """rope_variants and long_context_extra wrote into the committed results when run without --out (the first
    ending in a raw traceback, as their configuration differs from the committed one's)."""
    from posenc_lib.experiments import long_context_extra as extra
    from posenc_lib.experiments import rope_variants as rv

    monkeypatch.chdir(tmp_path)
    for folder, name in (("rope_variants", "nope_seed0.json"), ("long_context_extra", "sinusoidal_seed0.json")):
        (tmp_path / "results" / folder).mkdir(parents=True)
        shutil.copy(ROOT / "results" / folder / name, tmp_path / "results" / folder / name)
    before = snapshot(tmp_path / "results")
    trained = []
    monkeypatch.setattr(rv, "train_one", lambda name, seed, cfg, out: trained.append(str(out)) or "done")
    monkeypatch.setattr(extra, "run", lambda name, out: trained.append(str(out)))
    monkeypatch.setattr(extra, "t5_ablation", lambda out: trained.append(str(out)))
    assert run_cli(rv.main, ["--models", "nope", "--seeds", "0"]) == (0, [])
    assert run_cli(extra.main, []) == (0, [])
    assert set(trained) == {"runs/rope-variants-smoke", "runs/long-context-extra"}
    assert snapshot(tmp_path / "results") == before
    # pointed at them on purpose with other settings: one line naming the file, nothing written
    code, lines = run_cli(rv.main, ["--out", "results/rope_variants", "--models", "nope", "--seeds", "0"])
    assert code == 2 and len(lines) == 1 and "nope_seed0.json" in lines[0] and "another --out" in lines[0], lines
    assert snapshot(tmp_path / "results") == before and not (tmp_path / "results" / "rope_variants" / LOCK_NAME).exists()


def test_rope_variants_locks_its_folder_counts_duplicates_once_and_says_how_to_resume(tmp_path, monkeypatch):
    """The lesson-15 sweep had no folder lock, no Ctrl-C handling (a traceback; a plain process pool) and trained
    a model or seed named twice twice."""
    from posenc_lib.experiments import rope_variants as rv
    from posenc_lib.files import process_start

    calls = []
    monkeypatch.setattr(rv, "train_one", lambda name, seed, cfg, out: calls.append((name, seed)) or "done")
    rv.run_all(rv.SMOKE, [0, 0], tmp_path / "rv", names=["nope", "nope", "rope"], log=quiet)
    assert calls == [("nope", 0), ("rope", 0)] and not (tmp_path / "rv" / LOCK_NAME).exists()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(rv, "train_one", interrupted)
    argv = ["--models", "nope", "--seeds", "1", "--out", str(tmp_path / "rv")]
    code, lines = run_cli(rv.main, argv)
    assert code == 130 and len(lines) == 1 and lines[0].startswith("interrupted:") and "same command again" in lines[0], lines
    assert not (tmp_path / "rv" / LOCK_NAME).exists()
    holder = os.getppid()  # a living process
    (tmp_path / "rv" / LOCK_NAME).write_text(json.dumps({"pid": holder, "start": process_start(holder)}))
    code, lines = run_cli(rv.main, argv)
    assert code == 2 and len(lines) == 1 and "being written by another process" in lines[0], lines


def test_every_worker_pool_stops_on_ctrl_c():
    """Every command that trains in worker processes uses WorkerPool (Ctrl-C stops the workers, none goes on
    writing results): no plain process pool elsewhere."""
    import re

    plain = [str(p.relative_to(ROOT)) for folder in ("posenc_lib", "benchmarks", "book") for p in (ROOT / folder).rglob("*.py")
             if p.name != "pool.py" and re.search(r"ProcessPoolExecutor\(|\bPool\(", p.read_text(encoding="utf-8"))]
    assert plain == []


@pytest.mark.parametrize("module", ["rope_variants", "cope_counting", "inside"])
def test_timing_out_keeps_an_existing_file(tmp_path, monkeypatch, module):
    """--time-updates N --timing-out FILE replaced whatever FILE held (the committed timing.json included)."""
    import importlib

    mod = importlib.import_module(f"posenc_lib.experiments.{module}")
    monkeypatch.setattr(mod, "time_updates", lambda *a, **k: {"timed": True})
    path = tmp_path / "timing.json"
    path.write_text("mine\n")
    code, lines = run_cli(mod.main, ["--time-updates", "2", "--timing-out", str(path)])
    assert code == 2 and len(lines) == 1 and str(path) in lines[0] and "--overwrite" in lines[0], lines
    assert path.read_text() == "mine\n"
    assert run_cli(mod.main, ["--time-updates", "2", "--timing-out", str(path), "--overwrite"])[0] == 0
    assert json.loads(path.read_text())["timed"] is True


def test_calibrate_keeps_a_folder_it_did_not_make(tmp_path, monkeypatch):
    """calibrate deleted CKPT_DIR/calibration, whatever it held, after timing the models there."""
    import posenc_lib.experiments.wmt14.calibrate as cal

    d = tiny_dir(tmp_path)
    out = tmp_path / "run"
    ck = default_ckpt_dir(out)
    (ck / "calibration").mkdir(parents=True)
    (ck / "calibration" / "mine.txt").write_text("keep me\n")
    used = []

    def timed(pe, job, barrier=None, threads=None):  # the measurement without the training
        work = Path(job["work_dir"])
        assert work.is_dir() and work.parent == ck and work.name != "calibration"
        (work / f"{pe}.pt").write_text("a timed model\n")
        used.append(work)
        return {"pe": pe, "s_per_update": 0.01, "tok_per_s": 1000.0, "startup_s": 1.0, "val_s": 0.1,
                "decode_sample_s": 0.1, "ckpt_s": 0.1, "peak_rss_gib": 0.1}  # fmt: skip

    monkeypatch.setattr(cal, "measure_scheme", timed)
    cal.calibrate(tiny(), ["none"], [0], out, data_dir=d, source="files", jobs=1, budget_min=1.0, log=quiet)
    assert (ck / "calibration" / "mine.txt").read_text() == "keep me\n"
    assert used and not used[0].exists() and (out / "calibration.json").is_file()


def test_benchmark_scripts_say_what_ctrl_c_kept(tmp_path, monkeypatch):
    """benchmarks.decode_profile and benchmarks.train_speed ended Ctrl-C in a traceback."""
    import benchmarks.decode_profile as dp
    import benchmarks.train_speed as ts

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dp, "profile_scheme", interrupted)
    code, lines = run_cli(dp.main, ["--quick", "--schemes", "none", "--threads", "1", "--out", str(tmp_path / "dp")])
    assert code == 130 and len(lines) == 1 and lines[0].startswith("interrupted: nothing was written"), lines
    assert not (tmp_path / "dp").exists()
    monkeypatch.setattr(ts, "run_candidate", interrupted)
    code, lines = run_cli(ts.main, ["--out", str(tmp_path / "speed.json")])
    assert code == 130 and len(lines) == 1 and lines[0].startswith("interrupted: nothing was written"), lines
    assert not (tmp_path / "speed.json").exists()


def _lesson_cells():
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for k, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                yield f"{nb.name} cell {k}", "".join(cell["source"])


def test_lessons_read_committed_results_through_results_file():
    """Lessons opened before their results exist: each file is read through results_file (one line naming the
    command that makes it), each folder checked with results_files (or an existence test) before it is read,
    not a raw "No such file or directory"."""
    import re

    raw = []
    for cell, src in _lesson_cells():
        for m in re.finditer(r"\.read_text\(", src):
            before = src[: m.start()]
            if before.endswith(")"):  # (PATH).read_text(): PATH must be results_file's argument
                depth, i = 0, len(before) - 1
                while i >= 0:
                    depth += {")": 1, "(": -1}.get(before[i], 0)
                    if depth == 0:
                        break
                    i -= 1
                ok = before[:i].endswith("results_file")
            else:  # NAME.read_text(): NAME must run over files found by results_files or a glob
                name = re.search(r"(\w+)$", before).group(1)
                ok = re.search(rf"for {name} in (results_files\(|sorted\(\w+\.glob\()", src) is not None
            if not ok:
                raw.append(f"{cell}: {src[max(0, m.start() - 70) : m.end()]!r}")
        for m in re.finditer(r"\w+\.load_results\(([^)]*)\)", src):
            if "tmp" not in m.group(1) and not re.search(r"results_files\(|\.is_dir\(\)|\.glob\(", src):
                raw.append(f"{cell}: {m.group(0)!r}")
    assert raw == []


def test_every_committed_results_file_names_how_it_is_made(tmp_path):
    """Every committed results file (results/, benchmarks/results/) has a command in RESULT_COMMANDS, or is
    marked as a record of an earlier measurement; the lessons' messages name it."""
    from posenc_lib.course.notebook import NO_MATCH, entry_for, results_file, results_files

    listed = subprocess.run(["git", "ls-files", "-z", "results", "benchmarks/results"], cwd=ROOT, capture_output=True)
    if listed.returncode == 0:  # what git tracks: not the ignored checkpoints or a run being written
        committed = [ROOT / name for name in listed.stdout.decode().split("\0") if name]
    else:  # not a git checkout: every file but the ignored checkpoint folders
        committed = [p for folder in ("results", "benchmarks/results") for p in (ROOT / folder).rglob("*")
                     if p.is_file() and not p.name.startswith(".") and not any(q.endswith("-ckpt") for q in p.parts)]
    committed = [p for p in committed if p.name != "README.md"]  # the page that says how each folder is made
    assert len(committed) > 100
    assert [str(p.relative_to(ROOT)) for p in committed if entry_for(p) is NO_MATCH] == []
    with pytest.raises(FileNotFoundError, match=r"timing\.json does not exist yet: make it with `python -m posenc_lib\."
                                                r"experiments\.rope_variants --profile course --time-updates 20"):
        results_file(tmp_path / "results" / "rope_variants" / "timing.json")
    with pytest.raises(FileNotFoundError, match=r"no \*_seed\*\.json in .*rope_variants yet: make them with `python -m "
                                                r"posenc_lib\.experiments\.rope_variants --profile course"):
        results_files(tmp_path / "results" / "rope_variants", "*_seed*.json")
    with pytest.raises(FileNotFoundError) as err:
        results_file(tmp_path / "benchmarks" / "results" / "train_full_keys.json")
    assert "does not exist: it records an earlier measurement" in str(err.value) and "make it with" not in str(err.value)
    with pytest.raises(FileNotFoundError, match=r"make it with `python -m benchmarks\.train_speed"):
        results_file(tmp_path / "benchmarks" / "results" / "train_speed.json")


@pytest.mark.parametrize("cli", ["decode_profile", "train_speed", "rope_variants", "cope_counting", "inside"])
def test_an_output_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch, cli):
    """An output that cannot be written (under a file, or a folder where a file is written) was found only when
    the result was saved, after the measurement (minutes of it), in a raw NotADirectoryError/IsADirectoryError."""
    import importlib

    def measured(*args, **kwargs):
        raise AssertionError("the work started before the output path was checked")

    a_file, a_dir = tmp_path / "afile", tmp_path / "adir"
    a_file.write_text("the user's own file\n")
    a_dir.mkdir()
    if cli == "decode_profile":
        mod = importlib.import_module("benchmarks.decode_profile")
        monkeypatch.setattr(mod, "profile_scheme", measured)
        tries = [(["--quick", "--schemes", "none", "--threads", "1", "--out", str(a_file / "sub")], "lies under")]
    elif cli == "train_speed":
        mod = importlib.import_module("benchmarks.train_speed")
        monkeypatch.setattr(mod, "run_candidate", measured)
        tries = [(["--out", str(a_file / "sub" / "speed.json")], "lies under"),
                 (["--out", str(a_dir), "--overwrite"], "is a folder; give a file name")]
    else:  # --time-updates N --timing-out FILE
        mod = importlib.import_module(f"posenc_lib.experiments.{cli}")
        monkeypatch.setattr(mod, "time_updates", measured)
        tries = [(["--time-updates", "2", "--timing-out", str(a_file / "timing.json")], "lies under"),
                 (["--time-updates", "2", "--timing-out", str(a_dir), "--overwrite"], "is a folder; give a file name")]
    for argv, words in tries:
        code, lines = run_cli(mod.main, argv)
        assert code == 2 and len(lines) == 1 and words in lines[0], (argv, lines)
    assert a_file.read_text() == "the user's own file\n" and list(a_dir.iterdir()) == []


@pytest.mark.parametrize("part", ["decode", "train"])
def test_a_benchmark_part_run_alone_says_what_to_run(part):
    """`python -m benchmarks.decode` (a part of the suite, no command of its own) ended at once with status 0 and
    no output, as if it had measured something."""
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{part}"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and f"python -m benchmarks.run --only {part}" in lines[0], lines


def test_train_speed_names_a_bad_scheme_before_starting_workers(tmp_path, monkeypatch):
    """`benchmarks.train_speed --pe rotery` started the worker processes, each ending in a traceback, then a
    RuntimeError traceback of the parent."""
    import benchmarks.train_speed as ts

    def measured(*args, **kwargs):
        raise AssertionError("workers started with a scheme that does not exist")

    monkeypatch.setattr(ts, "run_candidate", measured)
    code, lines = run_cli(ts.main, ["--pe", "rotery", "--out", str(tmp_path / "speed.json")])
    assert code == 2 and len(lines) == 1 and "--pe" in lines[0] and "'rotery'" in lines[0], lines
    code, lines = run_cli(ts.main, ["--pe", "rotary", "--out", str(tmp_path / "speed.json"), "--only", "99"])
    assert code == 2 and "--only" in lines[0], lines  # an alias gets past --pe, to the next check


@pytest.mark.parametrize("module", ["rope_variants", "cope_counting", "inside"])
def test_ctrl_c_while_timing_updates_is_one_line(tmp_path, monkeypatch, module):
    """Ctrl-C during --time-updates ended in a KeyboardInterrupt traceback."""
    import importlib

    mod = importlib.import_module(f"posenc_lib.experiments.{module}")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mod, "time_updates", interrupted)
    path = tmp_path / "timing.json"
    code, lines = run_cli(mod.main, ["--time-updates", "2", "--timing-out", str(path)])
    assert code == 130 and len(lines) == 1 and lines[0].startswith("interrupted: nothing was written"), lines
    assert str(path) in lines[0] and not path.exists()


def test_decode_profile_and_train_speed_without_out_never_touch_the_published_results(tmp_path, monkeypatch):
    """Without --out, benchmarks.decode_profile and benchmarks.train_speed pointed at the committed
    benchmarks/results (refused only because the file was there, with the advice to pass --overwrite)."""
    import benchmarks.decode_profile as dp
    import benchmarks.train_speed as ts

    published = {name: (ROOT / "benchmarks" / "results" / name).read_bytes()
                 for name in ("decode_profile.json", "train_speed.json")}
    monkeypatch.setattr(dp, "RUNS", tmp_path / "runs", raising=False)
    monkeypatch.setattr(ts, "RUNS", tmp_path / "runs", raising=False)
    monkeypatch.setattr(dp, "profile_scheme", lambda pe, cfg: {"ms_per_step": 1.0, "profiled_wall_s": 0.1,
                                                               "shares": dict.fromkeys(dp.CATEGORIES, 0.2)})
    row = {"name": "a candidate", "tok_per_s": 1.0, "python_ms_per_update": 1.0, "ms_per_update_profiled": 2.0}
    monkeypatch.setattr(ts, "run_candidate", lambda *a, **k: dict(row))
    code, lines = run_cli(dp.main, ["--quick", "--schemes", "none", "--threads", "1"])
    assert isinstance(code, dict) and lines == [], lines  # main returns what it wrote
    code, lines = run_cli(ts.main, ["--only", "1"])
    assert code == 0 and lines == [], lines
    written = sorted(p.relative_to(tmp_path / "runs").as_posix() for p in (tmp_path / "runs").rglob("*.json"))
    assert len(written) == 2 and written[0].startswith("decode-profile-") and written[0].endswith("/decode_profile.json")
    assert written[1].startswith("train-speed-") and written[1].endswith(".json"), written
    assert {name: (ROOT / "benchmarks" / "results" / name).read_bytes() for name in published} == published


def test_benchmarks_do_not_mix_parts_of_other_models_in_one_table(tmp_path, monkeypatch):
    """`benchmarks.run --only decode --out X` beside a train.json of another model (a --quick one, another dtype)
    wrote a table.md whose one header described both parts with the first part's model."""
    import benchmarks.run as br
    from benchmarks.common import BenchConfig

    out = tmp_path / "bench"
    out.mkdir()
    quick = {"schema": br.SCHEMA, "part": "train", "quick": True, "config": BenchConfig.quick().as_dict(),
             "results": {"lengths": {}}}
    (out / "train.json").write_text(json.dumps(quick))
    before = snapshot(out)
    monkeypatch.setattr(br, "bench_decode", lambda schemes, cfg, quiet: {"schemes": {}})
    monkeypatch.setattr(br, "write_report", lambda folder: (Path(folder) / "table.md").write_text("report\n"))
    argv = ["--only", "decode", "--schemes", "none", "--threads", "1", "--quiet", "--out", str(out)]
    code, lines = run_cli(br.main, argv)
    assert code == 2 and len(lines) == 1 and "train.json" in lines[0] and "d_model 32" in lines[0], lines
    assert snapshot(out) == before
    code, lines = run_cli(br.main, [*argv, "--quick"])  # the same model: the part joins the folder
    assert isinstance(code, dict) and (out / "decode.json").is_file(), lines


def test_gpu_finale_refuses_a_bad_number_before_anything_starts(tmp_path):
    """`gpu_finale.sh start abc` launched the pipeline, which failed only in the calibration after the CUDA tests;
    `follow abc` printed "integer expression expected" every 5 s for ever."""
    run_dir = tmp_path / "runs" / "wmt14-gpu"
    env = {**ENV, "PYTHON": str(_stub_python(tmp_path)), "RUN_DIR": str(run_dir), "FOLLOW": "0"}
    script = str(ROOT / "scripts" / "gpu_finale.sh")
    for args, words in ((["start", "abc"], "BUDGET_MIN must be a positive number, got 'abc'"),
                        (["start", "0"], "BUDGET_MIN must be a positive number, got '0'"),
                        (["follow", "abc"], "SECONDS must be an integer, got 'abc'")):
        done = subprocess.run(["bash", script, *args], env=env, capture_output=True, text=True, timeout=30)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and lines == [f"error: {words}"], (args, done.stdout, lines)
    assert not run_dir.parent.exists() or list(run_dir.parent.iterdir()) == []  # no lock, log or run folder


def test_decode_profile_keeps_the_decode_batch_it_is_given(tmp_path, monkeypatch):
    """`benchmarks.decode_profile --quick --decode-batch 4` profiled batches of 2 (the flag was ignored with --quick),
    and its record said 2: a silently different measurement."""
    import benchmarks.decode_profile as dp

    seen = []
    monkeypatch.setattr(dp, "profile_scheme", lambda pe, cfg: seen.append(cfg.decode_batch) or {
        "ms_per_step": 1.0, "profiled_wall_s": 0.1, "shares": dict.fromkeys(dp.CATEGORIES, 0.2)})
    for argv, batch in ((["--quick", "--decode-batch", "4"], 4), (["--quick"], 2), ([], 8), (["--decode-batch", "3"], 3)):
        seen.clear()
        doc = dp.main([*argv, "--schemes", "none", "--threads", "1", "--out", str(tmp_path / f"dp{len(argv)}{batch}")])
        assert seen == [batch] and doc["config"]["decode_batch"] == batch, (argv, seen)
    code, lines = run_cli(dp.main, ["--quick", "--decode-batch", "0", "--out", str(tmp_path / "bad")])
    assert code == 2 and len(lines) == 1 and "decode_batch" in lines[0], lines


def _tag(i, folder):
    Path(folder, f"call{i}").write_text(str(os.getpid()))
    return f"call {i} done"


def test_run_calls_runs_every_call_once_in_this_process_or_in_workers(tmp_path):
    """The run loop every experiment shares: jobs=1 runs in this process, jobs=2 in spawned workers; each call once,
    each return value logged; a bad jobs value refused before anything runs."""
    from posenc_lib.pool import run_calls

    for jobs in (1, 2):
        folder = tmp_path / f"jobs{jobs}"
        folder.mkdir()
        logs = []
        run_calls([(_tag, (i, folder)) for i in range(3)], jobs, logs.append)
        assert sorted(logs) == [f"call {i} done" for i in range(3)]
        pids = {int((folder / f"call{i}").read_text()) for i in range(3)}
        assert (pids == {os.getpid()}) if jobs == 1 else (os.getpid() not in pids)
    with pytest.raises(ValueError, match="jobs"):
        run_calls([(_tag, (0, tmp_path))], 0, logs.append)
    assert not (tmp_path / "call0").exists()


def test_unique_choices_keeps_order_drops_repeats_and_names_the_bad_ones():
    from posenc_lib.checks import unique_choices

    assert unique_choices("model", ["rope", "alibi", "rope"], ("alibi", "rope")) == ["rope", "alibi"]
    with pytest.raises(ValueError, match=r"unknown model\(s\) \['t5', 'gpt'\]; valid choices: alibi, rope"):
        unique_choices("model", ["t5", "rope", "gpt"], ("alibi", "rope"))


_POOL_SCRIPT = '''
import os, sys, time
from pathlib import Path
from posenc_lib.pool import WorkerPool


def work(folder, i):
    Path(folder, f"worker{i}.pid").write_text(str(os.getpid()))
    while True:  # a long training run
        time.sleep(0.1)


if __name__ == "__main__":
    with WorkerPool(2) as pool:
        futures = [pool.submit(work, sys.argv[1], i) for i in range(2)]
        for f in futures:
            f.result()
'''


def test_sigterm_to_the_parent_alone_stops_the_pool_workers(tmp_path):
    """`kill PID` of a `--jobs N` run (SIGTERM to the parent only, not its group) left the spawned workers training."""
    script = tmp_path / "pool.py"
    script.write_text(_POOL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env={**ENV, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pidfiles = [tmp_path / f"worker{i}.pid" for i in range(2)]
        deadline = time.time() + 120
        while not all(p.is_file() and p.read_text() for p in pidfiles):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.2)
        workers = [int(p.read_text()) for p in pidfiles]
        os.kill(proc.pid, signal.SIGTERM)  # the parent only
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143, err[-2000:]
        deadline = time.time() + 30
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (ended, not yet reaped) counts as gone
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True
