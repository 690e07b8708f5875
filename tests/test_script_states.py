"""The scripts in scripts/ in every state of their run (none started, running, finished, killed): each subcommand
ends with one clear line, refuses before doing any work when the hardware or its input is wrong, and leaves no
half-written file or empty folder behind.  Stub pythons stand in for the training: every test takes seconds."""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
FINALE = ROOT / "scripts" / "gpu_finale.sh"
BUDGET = ROOT / "scripts" / "extrapolation_budget.sh"
BUDGET_16000 = ROOT / "scripts" / "extrapolation_budget_16000.sh"
PAUSED = ROOT / "scripts" / "with_budget_paused.py"
USAGE = "usage: bash scripts/gpu_finale.sh start [BUDGET_MIN] | follow [SECONDS] | pack DEST"


def _stub(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not yet reaped) no longer runs
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 20) -> bool:
    deadline = time.time() + seconds
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _one_error(proc, *words) -> str:
    """The command printed exactly one line on stderr (nothing on stdout), naming ``words``."""
    lines = _lines(proc.stderr)
    assert proc.stdout == "" and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in lines[0] and all(w in lines[0] for w in words), lines
    return lines[0]


# ----------------------------------------------------------------------------- scripts/gpu_finale.sh
@pytest.fixture
def finale(tmp_path):
    """Run gpu_finale.sh on a run folder under tmp_path; every pipeline a test starts is stopped at the end."""
    run = tmp_path / "runs" / "wmt14-gpu"
    real = sys.executable
    # a python that answers `-c` (the torch checks) and fails everything else: a pipeline started by mistake is short
    py = _stub(tmp_path, "py-c-only", f'case "$1" in -c) exec "{real}" "$@";; esac\nexit 1')
    env = {**ENV, "PATH": "/usr/bin:/bin", "PYTHON": str(py), "RUN_DIR": str(run), "FOLLOW": "0"}
    env.pop("REHEARSE_ON_CPU", None)
    started = []

    def call(*args, timeout=60, **extra):
        proc = subprocess.run(["bash", str(FINALE), *args], env={**env, **extra}, capture_output=True, text=True,
                              timeout=timeout)
        with contextlib.suppress(OSError, ValueError):
            started.append(int(Path(f"{run}.pid").read_text()))
        return proc

    call.run, call.env, call.tmp = run, env, tmp_path
    yield call
    for pid in started:  # the pipeline is a session of its own (setsid): its group holds all of it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def _finished(run: Path, status: int = 0) -> None:
    (run / "rope-seed0").mkdir(parents=True)
    (run / "rope-seed0" / "result.json").write_text("{}")
    (run / "rope-seed0" / "checkpoint.pt").write_text("weights")
    Path(f"{run}.log").write_text("== 10:00:00 machine\n== 10:05:00 finished\n")
    Path(f"{run}.done").write_text(f"{status}\n")


def _killed(run: Path) -> None:
    (run / "rope-seed0").mkdir(parents=True)
    (run / "cuda_tests.txt").write_text("62 passed\n")
    Path(f"{run}.log").write_text("== 10:00:00 machine\n== 10:01:00 calibration (budget 14 min)\n")
    Path(f"{run}.pid").write_text(f"{_dead_pid()}\n")


@contextlib.contextmanager
def _running(run: Path):
    run.mkdir(parents=True)
    Path(f"{run}.log").write_text("== 10:00:00 machine\n")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    Path(f"{run}.pid").write_text(f"{proc.pid}\n")
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_start_without_a_gpu_is_refused_at_once_and_leaves_nothing(finale):
    """`start` on a machine without a CUDA GPU launched the pipeline (CUDA tests, a calibration of the gpu
    profile on the CPU); it is refused with one line saying how to rehearse on the CPU, before any file exists."""
    proc = finale("start", "14")
    assert proc.returncode == 1
    _one_error(proc, "no CUDA GPU", "REHEARSE_ON_CPU=1")
    assert not (finale.tmp / "runs").exists()  # no run folder, log or pid file


def test_start_refuses_a_python_without_torch_and_a_bad_rehearsal_switch(finale):
    no_torch = _stub(finale.tmp, "no-torch", "echo 'ModuleNotFoundError: torch' >&2; exit 1")
    proc = finale("start", PYTHON=str(no_torch))
    assert proc.returncode == 1
    _one_error(proc, "cannot import torch", "PYTHON")
    proc = finale("start", REHEARSE_ON_CPU="yes")
    assert proc.returncode == 2
    _one_error(proc, "REHEARSE_ON_CPU must be 0 or 1, got 'yes'")
    assert not (finale.tmp / "runs").exists()


@pytest.mark.parametrize("args", [[], ["bogus"], ["pack"], ["pack", ""], ["follow", "5", "more"], ["_stages"]])
def test_a_missing_or_unknown_subcommand_prints_the_usage_in_one_line(finale, args):
    proc = finale(*args)
    assert proc.returncode == 2 and _one_error(proc) == USAGE
    assert not (finale.tmp / "runs").exists()


def test_follow_with_no_pipeline_says_so_at_once(finale):
    """`follow` before any start waited SECONDS (540 by default) and then said "still running"."""
    t0 = time.time()
    proc = finale("follow", "3")
    assert proc.returncode == 1 and time.time() - t0 < 3
    _one_error(proc, "no pipeline has started", "gpu_finale.sh start")
    assert not (finale.tmp / "runs").exists()


def test_follow_of_a_killed_pipeline_says_it_did_not_finish(finale):
    """A pipeline killed with SIGKILL (pid file left, no end marker): `follow` said "still running" after SECONDS."""
    _killed(finale.run)
    t0 = time.time()
    proc = finale("follow", "20")
    assert proc.returncode == 1 and time.time() - t0 < 10
    assert proc.stdout == Path(f"{finale.run}.log").read_text()  # the log, then one line
    err = _lines(proc.stderr)
    assert len(err) == 1 and "no longer runs" in err[0] and "did not finish" in err[0], proc.stderr


def test_follow_of_a_running_pipeline_ends_with_how_to_go_on(finale):
    with _running(finale.run) as pid:
        proc = finale("follow", "1")
    assert proc.returncode == 0 and proc.stderr == ""
    lines = _lines(proc.stdout)
    assert lines[0] == "== 10:00:00 machine"
    assert f"pid {pid}" in lines[-1] and "still runs" in lines[-1] and "gpu_finale.sh follow" in lines[-1]


@pytest.mark.parametrize("status", [0, 1])
def test_follow_of_a_finished_pipeline_reports_its_exit_status(finale, status):
    _finished(finale.run, status)
    proc = finale("follow")
    out = _lines(proc.stdout)
    assert out[:2] == ["== 10:00:00 machine", "== 10:05:00 finished"]
    if status == 0:
        assert proc.returncode == 0 and proc.stderr == "" and len(out) == 3
        assert "finished" in out[-1] and "exit status 0" in out[-1]
    else:  # a failed pipeline is not a success of `follow`
        assert proc.returncode == 1 and len(out) == 2
        err = _lines(proc.stderr)
        assert len(err) == 1 and "failed" in err[0] and "exit status 1" in err[0], proc.stderr


def test_pack_with_nothing_to_pack_writes_nothing(finale):
    """`pack` before any run: tar's "Cannot stat" errors, an empty DEST and a wmt14-gpu.tar.gz.tmp left there."""
    dest = finale.tmp / "out"
    proc = finale("pack", str(dest))
    assert proc.returncode == 1
    _one_error(proc, "nothing to pack")
    assert not dest.exists()


def test_pack_refuses_a_running_pipeline(finale):
    """Packing while the pipeline writes its folder would archive files half-written."""
    dest = finale.tmp / "out"
    with _running(finale.run) as pid:
        proc = finale("pack", str(dest))
    assert proc.returncode == 1
    _one_error(proc, "still runs", f"pid {pid}")
    assert not dest.exists()


def test_pack_of_a_killed_run_keeps_what_finished_and_says_it_did_not_finish(finale):
    _killed(finale.run)
    dest = finale.tmp / "out"
    proc = finale("pack", str(dest))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = _lines(proc.stdout)
    assert len(out) == 1 and str(dest / "wmt14-gpu.tar.gz") in out[0] and "did not finish" in out[0], out
    assert sorted(p.name for p in dest.iterdir()) == ["wmt14-gpu.tar.gz"]
    with tarfile.open(dest / "wmt14-gpu.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("wmt14-gpu/cuda_tests.txt") for n in names)
    assert any(n.endswith("wmt14-gpu.log") for n in names)
    assert not any(n.endswith(".pid") for n in names)


def test_pack_of_a_finished_run_and_never_over_an_archive(finale):
    _finished(finale.run)
    dest = finale.tmp / "out"
    proc = finale("pack", str(dest))
    assert proc.returncode == 0 and proc.stderr == ""
    out = _lines(proc.stdout)
    assert len(out) == 1 and str(dest / "wmt14-gpu.tar.gz") in out[0] and "did not finish" not in out[0], out
    assert sorted(p.name for p in dest.iterdir()) == ["wmt14-gpu.tar.gz"]
    with tarfile.open(dest / "wmt14-gpu.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("rope-seed0/result.json") for n in names) and not any(n.endswith(".pt") for n in names)
    assert any(n.endswith("wmt14-gpu.done") for n in names)
    before = (dest / "wmt14-gpu.tar.gz").read_bytes()
    again = finale("pack", str(dest))
    assert again.returncode == 1
    _one_error(again, "exists")
    assert (dest / "wmt14-gpu.tar.gz").read_bytes() == before and len(list(dest.iterdir())) == 1


@pytest.mark.parametrize("made", [False, True])
def test_pack_leaves_no_half_written_archive_when_tar_fails(finale, made):
    """tar failing half-way left DEST/wmt14-gpu.tar.gz.tmp (and the DEST folder it made) behind."""
    _finished(finale.run)
    fake = finale.tmp / "fakebin"
    fake.mkdir()
    # writes part of an archive where -f points, then fails as a full disk would
    _stub(fake, "tar", 'while [ $# -gt 0 ]; do [ "$1" = -czf ] && { echo partial > "$2"; }; shift; done\n'
                       'echo "tar: write error: No space left on device" >&2; exit 2')
    dest = finale.tmp / "out" / "deeper"
    if made:
        dest.mkdir(parents=True)
    proc = finale("pack", str(dest), PATH=f"{fake}:/usr/bin:/bin")
    assert proc.returncode == 1
    _one_error(proc, "No space left on device")
    if made:
        assert list(dest.iterdir()) == []
    else:
        assert not (finale.tmp / "out").exists()


def test_pack_into_a_file_is_refused(finale):
    _finished(finale.run)
    dest = finale.tmp / "a-file"
    dest.write_text("mine")
    proc = finale("pack", str(dest))
    assert proc.returncode == 2
    _one_error(proc, "not a folder")
    assert dest.read_text() == "mine"


@pytest.mark.skipif(os.name != "posix", reason="setsid")
def test_start_then_sigkill_then_follow_and_start_again(finale):
    """The pipeline killed outright keeps its pid file and a log without an end; `follow` says so, `start` takes
    over.  A pipeline that fails ends its log with its status and `start` reports the failure in one line."""
    sleeper = _stub(finale.tmp, "sleepy-python", "exec sleep 60")
    proc = finale("start", "1", PYTHON=str(sleeper), REHEARSE_ON_CPU="1")
    assert proc.returncode == 0, proc.stderr
    pid = int(Path(f"{finale.run}.pid").read_text())
    last = _lines(proc.stdout)[-1]
    assert f"pid {pid}" in last and "gpu_finale.sh follow" in last, proc.stdout
    os.killpg(pid, signal.SIGKILL)
    assert _wait_gone(pid)
    follow = finale("follow", "20")
    assert follow.returncode == 1 and "no longer runs" in _lines(follow.stderr)[-1], follow.stderr
    assert Path(f"{finale.run}.pid").exists() and not Path(f"{finale.run}.done").exists()
    failing = _stub(finale.tmp, "failing-python", "exit 1")
    proc = finale("start", "1", PYTHON=str(failing), REHEARSE_ON_CPU="1", FOLLOW="30")
    err = _lines(proc.stderr)
    assert proc.returncode == 1 and "no longer runs; taking it over" in err[0], proc.stderr
    assert "failed" in err[-1] and "exit status 1" in err[-1] and len(err) == 2, proc.stderr
    assert Path(f"{finale.run}.done").read_text().strip() == "1" and not Path(f"{finale.run}.pid").exists()
    assert "exit status 1" in _lines(Path(f"{finale.run}.log").read_text())[-1]  # the log says how it ended


# ----------------------------------------------------------------------------- the budget scripts
@pytest.fixture
def budget(tmp_path):
    """Run a budget script with a stub python that logs its arguments (never trains); its processes end after."""
    calls = tmp_path / "calls"
    pids = tmp_path / "pids"
    pids.mkdir()
    # STUB_FAIL: an argument that makes it fail; STUB_SLEEP: seconds it trains
    py = _stub(tmp_path, "py", f'echo "$*" >> "{calls}"\necho $$ > "{pids}/$$"\n'
                               'case " $* " in *" $STUB_FAIL "*) exit 3;; esac\nexec sleep "${STUB_SLEEP:-0}"')
    env = {**ENV, "PATH": "/usr/bin:/bin", "PYTHON": str(py), "SEEDS": "0", "COPY_SEEDS": "0", "TASKS": "reverse",
           "STUB_FAIL": "none-of-them"}

    def call(script, *args, timeout=60, **extra):
        return subprocess.run(["bash", str(script), *args], env={**env, **extra}, capture_output=True, text=True,
                              timeout=timeout)

    call.env, call.calls, call.pids, call.tmp = env, calls, pids, tmp_path
    yield call
    for f in pids.iterdir():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(f.name), signal.SIGKILL)


@pytest.mark.parametrize("script", [BUDGET, BUDGET_16000])
def test_budget_script_ends_with_one_line_when_all_is_done(budget, script):
    proc = budget(script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and len(_lines(proc.stdout)) == 1 and "done" in proc.stdout, proc.stdout
    assert len(budget.calls.read_text().splitlines()) == (2 if script == BUDGET else 1)


@pytest.mark.parametrize("script", [BUDGET, BUDGET_16000])
@pytest.mark.parametrize("bad, words", [({"SEEDS": "0 a"}, "SEEDS must be integers"),
                                        ({"SEEDS": ""}, "SEEDS must be integers"),
                                        ({"PYTHON": "/no/such/python"}, "no python at /no/such/python")])
def test_budget_script_refuses_bad_settings_before_any_training(budget, script, bad, words):
    proc = budget(script, **bad)
    assert proc.returncode in (1, 2)
    _one_error(proc, words)
    assert not budget.calls.exists()


@pytest.mark.parametrize("bad, words", [({"TASKS": "reverse sort"}, "TASKS must be reverse and/or copy"),
                                        ({"COPY_SEEDS": "x"}, "COPY_SEEDS must be integers")])
def test_budget_script_refuses_bad_tasks_and_copy_seeds(budget, bad, words):
    proc = budget(BUDGET, **bad)
    assert proc.returncode == 2
    _one_error(proc, words)
    assert not budget.calls.exists()


@pytest.mark.parametrize("script", [BUDGET, BUDGET_16000])
def test_budget_script_needs_two_cores_and_says_so(budget, script):
    fake = budget.tmp / "fakebin"
    fake.mkdir()
    _stub(fake, "nproc", "echo 1")
    proc = budget(script, PATH=f"{fake}:/usr/bin:/bin")
    assert proc.returncode == 1
    _one_error(proc, "2 CPU cores", "1")
    assert not budget.calls.exists()


@pytest.mark.parametrize("script", [BUDGET, BUDGET_16000])
def test_budget_script_refuses_a_second_run_and_arguments(budget, script):
    with open(script) as held:  # a first run holds this lock for as long as it (or its training) runs
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = budget(script)
    assert proc.returncode == 1
    _one_error(proc, "already runs")
    assert not budget.calls.exists()
    proc = budget(script, "now")
    assert proc.returncode == 2
    _one_error(proc, "usage:", script.name)


def test_budget_script_waits_for_both_chains_and_names_the_failed_one(budget):
    """A failed decoder model ended the script at once (set -e on `wait`) while the encdec chain trained on."""
    proc = budget(BUDGET, STUB_FAIL="decoder", STUB_SLEEP="2")
    assert proc.returncode == 1
    err = _lines(proc.stderr)
    assert len(err) == 1 and "decoder" in err[0] and "exit 3" in err[0] and "encdec" not in err[0], proc.stderr
    assert all(not _alive(int(f.name)) for f in budget.pids.iterdir())  # the encdec model was waited for
    assert len(budget.calls.read_text().splitlines()) == 2


def test_budget_16000_stops_at_the_failed_seed_and_names_it(budget):
    proc = budget(BUDGET_16000, SEEDS="0 1", STUB_FAIL="0")
    assert proc.returncode == 1
    _one_error(proc, "seed 0", "exit 3")
    assert len(budget.calls.read_text().splitlines()) == 1


@pytest.mark.parametrize("script", [BUDGET, BUDGET_16000])
@pytest.mark.parametrize("how", ["kill PID", "Ctrl-C"])
def test_budget_script_stopped_stops_its_training_too(budget, script, how):
    """`kill PID` (SIGTERM) of the script ended it silently and left its training running in the background.
    Ctrl-C at a terminal (SIGINT to the whole process group) stops it and its training alike."""
    # its own process group with Ctrl-C at its default action, as a terminal's foreground job
    proc = subprocess.Popen(["bash", str(script)], env={**budget.env, "STUB_SLEEP": "60"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        want = 2 if script == BUDGET else 1
        deadline = time.time() + 30
        while len(list(budget.pids.iterdir())) < want:
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.3)
        if how == "kill PID":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (143 if how == "kill PID" else 130), (out, err)
    lines = _lines(err)
    assert len(lines) == 1 and "stopped" in lines[0] and "again to resume" in lines[0], err
    assert all(_wait_gone(int(f.name), 5) for f in budget.pids.iterdir())  # no training left behind


# ----------------------------------------------------------------------------- scripts/with_budget_paused.py
def _paused_module():
    spec = importlib.util.spec_from_file_location("with_budget_paused", PAUSED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_budget_training():
    """Skip where budget training runs (the script would stop it) or the tests run inside with_budget_paused.py."""
    module = _paused_module()
    if any(module.budget_processes(ROOT / folder) for folder in module.FOLDERS):
        pytest.skip("budget training is running on this machine")
    if module.other_instances():
        pytest.skip("with_budget_paused.py runs on this machine")


def test_with_budget_paused_usage_is_one_line():
    proc = subprocess.run([sys.executable, str(PAUSED)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == ""
    lines = _lines(proc.stdout)
    assert len(lines) == 1 and lines[0].startswith("usage:") and "with_budget_paused.py make test" in lines[0]
    helped = subprocess.run([sys.executable, str(PAUSED), "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "SIGSTOP" in helped.stdout


def test_with_budget_paused_refuses_a_missing_command_before_pausing():
    """A command that does not exist: a traceback (FileNotFoundError) after training had been stopped for it."""
    _no_budget_training()
    proc = subprocess.run([sys.executable, str(PAUSED), "no-such-command-xyz", "--flag"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 127
    _one_error(proc, "no-such-command-xyz", "not found")


def test_with_budget_paused_stopped_stops_its_command(tmp_path):
    """SIGTERM to with_budget_paused.py killed it at once: no record, training left stopped, its command running."""
    _no_budget_training()
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, str(PAUSED), "sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        child = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    lines = _lines(err)
    assert len(lines) == 1 and "stopped" in lines[0] and "none was running" in lines[0], err
    assert _wait_gone(child, 5)


def test_with_budget_paused_inside_another_runs_the_command_only_and_a_second_beside_it_is_refused(tmp_path):
    """Nested (`with_budget_paused.py make test` whose tests call it again): the inner one resumed the training
    while the outer command still ran.  Two side by side: the first to end resumed it under the other."""
    _no_budget_training()
    inner = subprocess.run([sys.executable, str(PAUSED), sys.executable, str(PAUSED), "true"], capture_output=True,
                           text=True, timeout=120)
    assert inner.returncode == 0, inner.stderr
    lines = _lines(inner.stderr)
    assert len(lines) == 2 and "outer with_budget_paused.py" in lines[0] and "none was running" in lines[1], lines
    outer = subprocess.Popen([sys.executable, str(PAUSED), "sleep", "30"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 60
        while not any("sleep" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")
                      for c in _children(outer.pid)):
            assert time.time() < deadline and outer.poll() is None
            time.sleep(0.1)
        beside = subprocess.run([sys.executable, str(PAUSED), "true"], capture_output=True, text=True, timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(outer.pid, signal.SIGKILL)
        outer.communicate()
    assert beside.returncode == 1
    _one_error(beside, "another with_budget_paused.py", f"pid {outer.pid}")


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """with_budget_paused's main() in this process, with one fake training process writing tmp_path/budget."""
    module = _paused_module()
    folder = tmp_path / "budget"
    folder.mkdir()
    training = subprocess.Popen(["sleep", "60"])
    fake = [{"pid": training.pid, "out": str(folder / "reverse" / "decoder"), "workers": [],
             "models": ["reverse/decoder/rope_seed0.json"]}]
    monkeypatch.setattr(module, "FOLDERS", (folder,))
    monkeypatch.setattr(module, "budget_processes", lambda f, *a: fake if Path(f) == folder else [])
    monkeypatch.setattr(module, "other_instances", lambda: [])  # alone, also when the tests run inside one
    monkeypatch.chdir(tmp_path)  # main() changes to the repository's folder
    module.folder, module.training = folder, training
    yield module
    training.kill()
    training.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_with_budget_paused_stops_records_and_resumes(paused, tmp_path, capsys):
    seen = tmp_path / "seen"
    rc = paused.main(["sh", "-c", f"cut -d' ' -f3 /proc/{paused.training.pid}/stat > {seen}; exit 4"])
    assert rc == 4 and seen.read_text().strip() == "T"  # stopped while the command ran
    assert _state(paused.training.pid) != "T"
    pauses = json.loads((paused.folder / "paused.json").read_text())["pauses"]
    assert [p["models"] for p in pauses] == [["reverse/decoder/rope_seed0.json"]]
    last = _lines(capsys.readouterr().err)
    assert len(last) == 1 and "budget/reverse/decoder/rope_seed0.json" in last[0] and "paused.json" in last[0]


def test_with_budget_paused_a_pause_it_cannot_record_is_one_line(paused, capsys):
    """A damaged paused.json: a JSONDecodeError traceback after the command."""
    (paused.folder / "paused.json").write_text("{")
    rc = paused.main(["true"])
    assert rc == 1 and _state(paused.training.pid) != "T"
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("error:") and "paused.json" in err[0], err
    assert "0 s for reverse/decoder/rope_seed0.json by hand" in err[0], err
    assert (paused.folder / "paused.json").read_text() == "{"


def test_with_budget_paused_resumes_training_a_killed_one_left_stopped(paused, capsys):
    os.kill(paused.training.pid, signal.SIGSTOP)  # what a with_budget_paused.py killed with SIGKILL leaves
    deadline = time.monotonic() + 10
    while _state(paused.training.pid) != "T" and time.monotonic() < deadline:  # SIGSTOP lands asynchronously
        time.sleep(0.01)
    assert paused.main(["true"]) == 0
    assert _state(paused.training.pid) != "T"
    err = _lines(capsys.readouterr().err)
    assert len(err) == 2 and "was already stopped" in err[0] and "rope_seed0" in err[1], err
