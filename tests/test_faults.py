"""Faults and bad input, third round: a killed parent takes its workers with it, and every WMT14 command
checks everything (list options, data files, hardware) before it creates a folder or does any work.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posenc_lib.experiments.wmt14 import main as wmt14_main
from posenc_lib.experiments.wmt14.data import SHIPPED_DIR
from posenc_lib.files import LOCK_NAME, FolderLock, FolderLocked

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (ended, not yet reaped) counts as gone
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in folder.rglob("*") if p.is_file()}


# -- a parent that dies takes its workers with it -----------------------------------------------------
def test_kill_9_of_a_jobs_2_run_leaves_no_worker_and_no_later_write(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "posenc_lib.experiments.wmt14", "--profile", "smoke", "--pe", "none,rope",
           "--seeds", "0", "--jobs", "2", "--threads", "1", "--source", "files", "--out", str(out), "--no-progress",
           "--set", "max_steps=100000", "--set", "ckpt_every=10"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lock = out / LOCK_NAME
    workers: list[int] = []
    try:
        deadline = time.time() + 240
        # both workers training: each has written a checkpoint, and the lock names them
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "the workers did not start training in time"
            ckpts = list((tmp_path / "run-ckpt").glob("*-seed0/checkpoint.pt"))
            with contextlib.suppress(OSError, ValueError):
                workers = [w["pid"] for w in json.loads(lock.read_text()).get("workers", [])]
            if len(ckpts) == 2 and len(workers) == 2:
                break
            time.sleep(0.2)
        assert all(_alive(w) for w in workers)
        os.kill(proc.pid, signal.SIGKILL)  # the parent alone
        proc.wait(timeout=30)
        killed_at = time.time()
        deadline = killed_at + 20
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.05)
        assert not any(_alive(w) for w in workers), "a worker outlived its killed parent"
        before = _files(tmp_path)
        time.sleep(2)
        assert _files(tmp_path) == before, "a file was written after the workers ended"
        late = [k for k, (mtime, _) in before.items() if mtime / 1e9 > killed_at + 1]
        assert not late, f"written more than a second after the kill: {late}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)


def test_a_dead_holders_living_worker_keeps_the_folder_locked(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        import socket

        (folder / LOCK_NAME).write_text(json.dumps({
            "pid": int(dead.stdout), "host": socket.gethostname(), "start": None, "since": "then",
            "command": "python -m posenc_lib.experiments.wmt14 --jobs 2",
            "workers": [{"pid": worker.pid, "start": None}]}) + "\n")
        with pytest.raises(FolderLocked, match=rf"worker process\(es\) {worker.pid}"):
            FolderLock(folder).acquire()
        assert (folder / LOCK_NAME).is_file()  # not taken over
    finally:
        worker.kill()
        worker.wait()
    notes = []
    with FolderLock(folder, log=notes.append):  # its last worker gone: taken over with a note
        pass
    assert notes and "no longer runs" in notes[0]
    assert not (folder / LOCK_NAME).exists()


# -- everything is checked before any work --------------------------------------------------------------
def _refused(capsys, argv: list[str]) -> str:
    """Run the WMT14 command; it must exit with status 2 and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exc:
        code = wmt14_main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("seeds, bad", [("0,x", "'x'"), ("0,-1", "-1"), ("1,2,4294967296", "4294967296"),
                                        ("0,1.5", "'1.5'")])
def test_every_seed_is_checked_before_a_folder_is_made(tmp_path, capsys, seeds, bad):
    err = _refused(capsys, ["--profile", "smoke", "--pe", "none", "--seeds", seeds, "--out", str(tmp_path / "r")])
    assert "--seeds" in err and bad in err
    assert list(tmp_path.iterdir()) == []


def test_every_scheme_is_checked_before_a_folder_is_made(tmp_path, capsys):
    err = _refused(capsys, ["--profile", "smoke", "--pe", "none,rope,bogus", "--out", str(tmp_path / "r")])
    assert "'bogus'" in err and "rope" in err  # the bad name and the valid choices
    assert list(tmp_path.iterdir()) == []


def _copy_shipped(dest: Path, skip: tuple[str, ...] = ()) -> Path:
    dest.mkdir()
    for p in SHIPPED_DIR.iterdir():
        if p.name not in skip:
            (dest / p.name).symlink_to(p)
    return dest


def test_a_data_dir_missing_a_file_is_refused_before_a_folder_is_made(tmp_path, capsys):
    data = _copy_shipped(tmp_path / "data", skip=("newstest2014.en",))
    out = tmp_path / "r"
    err = _refused(capsys, ["--profile", "smoke", "--pe", "none", "--data-dir", str(data), "--out", str(out)])
    assert "newstest2014.en" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no run or checkpoint folder


def test_half_of_a_held_out_pair_is_refused_not_replaced_by_the_shipped_one(tmp_path, capsys):
    """A --data-dir with heldout.en but no heldout.fr used to borrow the shipped pair, dropping the user's file."""
    data = _copy_shipped(tmp_path / "data", skip=("heldout.fr",))
    err = _refused(capsys, ["--profile", "smoke", "--pe", "none", "--data-dir", str(data), "--out", str(tmp_path / "r")])
    assert "heldout.fr" in err and "heldout.en" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_a_gpu_profile_on_a_machine_without_cuda_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _refused(capsys, ["--profile", "gpu", "--pe", "none", "--out", str(tmp_path / "r")])
    assert "gpu" in err and "CUDA" in err and "--device cpu" in err
    assert list(tmp_path.iterdir()) == []
    err = _refused(capsys, ["calibrate", "--profile", "gpu", "--pe", "none", "--out", str(tmp_path / "r")])
    assert "CUDA" in err and "--device cpu" in err
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_after_the_folders_are_made_removes_the_empty_ones_it_made(tmp_path, capsys):
    """A run folder whose config clashes is refused; the checkpoint folder made on the way is removed again."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"profile": {"name": "smoke", "d_model": 999}}))
    err = _refused(capsys, ["--profile", "smoke", "--pe", "none", "--source", "files", "--out", str(out)])
    assert "d_model 999" in err and "now 32" in err  # the field and both values
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


# -- a misalignment is reported where it starts -------------------------------------------------------
@pytest.mark.parametrize("missing", [40, 700, 1650])
def test_a_line_missing_inside_a_split_is_named_where_the_sides_fall_out_of_step(tmp_path, missing):
    from posenc_lib.experiments.wmt14.data import read_lines, read_parallel

    data = tmp_path / "data"
    data.mkdir()
    fr, en = (read_lines(SHIPPED_DIR / f"heldout.{lang}") for lang in ("fr", "en"))
    (data / "heldout.fr").write_text("".join(line + "\n" for line in fr))
    (data / "heldout.en").write_text("".join(line + "\n" for i, line in enumerate(en, 1) if i != missing))
    with pytest.raises(ValueError, match=rf"has {len(fr)} lines but .* has {len(en) - 1}") as exc:
        read_parallel(data, "heldout")
    import re

    near = int(re.search(r"out of step near line (\d+) of \S*heldout\.fr", str(exc.value)).group(1))
    assert abs(near - missing) <= 2, str(exc.value)
