"""scripts/gpu_check.sh rehearsed on the CPU (tests, profile, run, results), its bad settings, and a run stopped by
SIGTERM that checkpoints and continues (what the script's time limit does to the gpu profile)."""
import json
import os
import signal
import subprocess
import sys
import time

from test_wmt14_pipeline import ENV, ROOT, tiny_dir

SCRIPT = str(ROOT / "scripts" / "gpu_check.sh")
TINY = ["vocab_size=300", "val_pairs=8", "batch_tokens=300", "eval_limit=4", "bootstrap_samples=20", "bertscore=false"]


def test_rehearsal_runs_every_stage_and_scores_every_model(tmp_path):
    run = tmp_path / "run"
    env = {**ENV, "PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "REHEARSE": "1", "RUN_DIR": str(run),
           "DATA": str(tiny_dir(tmp_path)), "PES": "none,rope", "TESTS_K": "cached_greedy and none",
           "PROFILE_ARGS": "--warm 1 --updates 2 --threads 1",
           "EXTRA": " ".join(f"--set {kv}" for kv in TINY + ["max_steps=4", "log_every=2", "val_every=2",
                                                            "ckpt_every=0", "ckpt_on_signal=true"])}
    proc = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    for stage in ("machine", "CUDA tests", "profile: one update per scheme", "run: none,rope, seed(s) 0, smoke profile",
                  "finished: every model scored (none-seed0 rope-seed0)"):
        assert stage in out, stage
    assert "1 passed" in (run / "cuda_tests.txt").read_text()
    prof = json.loads((run / "profile.json").read_text())
    assert list(prof["schemes"]) == ["none", "rope"] and prof["matmul_flops_per_target_token"]["total"] > 0
    assert all(r["s_per_update"] > 0 and r["tflop_per_s"] > 0 for r in prof["schemes"].values())
    assert "Self CPU" in (run / "profile.rope.txt").read_text()
    res = json.loads((run / "results.json").read_text())
    assert list(res["models"]) == ["none", "rope"] and res["config"]["profile"]["max_steps"] == 4


def test_bad_settings_are_refused_before_any_work(tmp_path):
    base = {**ENV, "PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "RUN_DIR": str(tmp_path / "r")}
    for extra, words in (({"REHEARSE": "yes"}, "REHEARSE must be 0 or 1, got 'yes'"),
                         ({"REHEARSE": "1", "BUDGET_S": "9min"}, "BUDGET_S must be a positive integer of seconds, "
                                                                 "got '9min'")):
        proc = subprocess.run(["bash", SCRIPT], env={**base, **extra}, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()
    if not _has_cuda():
        proc = subprocess.run(["bash", SCRIPT], env=base, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "REHEARSE=1 bash scripts/gpu_check.sh" in proc.stderr
        assert not (tmp_path / "r").exists()


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_sigterm_checkpoints_a_run_and_the_same_command_continues_it(tmp_path):
    """The command is stopped with SIGTERM in its third update or later: the process writes a checkpoint and ends
    with SIGTERM's status; the same command with --resume finishes on the curve of an uncut run."""
    data = tiny_dir(tmp_path)
    sets = [a for kv in TINY + ["max_steps=40", "log_every=4", "val_every=20", "ckpt_every=0",
                                "ckpt_on_signal=true"] for a in ("--set", kv)]

    def cmd(out):
        return [sys.executable, "-m", "posenc_lib.experiments.wmt14", "--profile", "smoke", "--pe", "rope",
                "--data-dir", str(data), "--out", str(out), "--threads", "1", "--no-progress", "--resume", *sets]

    env = {**ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd(tmp_path / "cut"), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=tmp_path)
    metrics = tmp_path / "cut" / "rope-seed0" / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:  # until the first log line after update 0
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()[-2000:]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGTERM, out[-2000:]
    assert "SIGTERM: checkpoint at update" in out
    ck = tmp_path / "cut-ckpt" / "rope-seed0" / "checkpoint.pt"
    assert ck.is_file() and not (tmp_path / "cut" / "rope-seed0" / "result.json").exists()
    again = subprocess.run(cmd(tmp_path / "cut"), env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert again.returncode == 0 and "resumed rope-seed0 from update" in again.stdout, again.stderr[-2000:]
    full = subprocess.run(cmd(tmp_path / "full"), env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]
    curves = [[(r["step"], r["train_loss"], r["val_loss"]) for r in
               json.loads((tmp_path / name / "rope-seed0" / "result.json").read_text())["curve"]]
              for name in ("cut", "full")]
    assert curves[0] == curves[1]
    assert os.path.getsize(ck) > 0
