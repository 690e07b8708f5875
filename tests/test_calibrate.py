"""The WMT14 calibration: the projection's arithmetic, the fitted max_steps, a real timed run on the
CPU (two processes at once), the command it prints, and bad inputs."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from posenc_lib.experiments.wmt14.calibrate import calibrate, largest_fit, project, run_order, timing_profile
from posenc_lib.experiments.wmt14.train import get_profile, train_model
from posenc_lib.experiments.wmt14 import default_ckpt_dir, prepare_data
from test_wmt14 import _one_thread, tiny_profile  # noqa: F401 (_one_thread: autouse, one torch thread here too)
from test_wmt14_pipeline import ENV, ROOT, tiny_dir


def fake(s_per_update, startup=10.0, val=1.0, decode=2.0, ckpt=0.5):
    return {"s_per_update": s_per_update, "startup_s": startup, "val_s": val, "decode_sample_s": decode, "ckpt_s": ckpt}


def test_projection_is_list_scheduling_of_the_runs_order():
    schemes = {"none": fake(0.01), "shaw": fake(0.02)}
    prof = get_profile("gpu", {"val_every": "100", "ckpt_every": "100"})
    assert run_order(["none", "shaw"], [0, 1]) == [("none", 0), ("shaw", 0), ("none", 1), ("shaw", 1)]
    # one model: start-up (with the validation at update 0) + 200 updates + validations and checkpoints
    # at 100 and 200 + decoding (2 s x scale 5)
    p = project(schemes, ["none"], [0], 1, prof, 200, 5.0, overhead_s=3.0)
    assert p["per_model_s"] == {"none-seed0": 10 + 2 + 2 * 1 + 2 * 0.5 + 10} and p["wall_s"] == 3 + 25
    # an update count that is not a multiple of the period: validated and saved after the last update too
    assert project(schemes, ["none"], [0], 1, prof, 250, 5.0)["wall_s"] == 10 + 2.5 + 3 * 1 + 3 * 0.5 + 10
    # two slots: none-seed0 (25) and shaw-seed0 (27) start together; none-seed1 takes the slot free at 25,
    # shaw-seed1 the one free at 27: the run ends at 27 + 27
    p = project(schemes, ["none", "shaw"], [0, 1], 2, prof, 200, 5.0)
    assert p["per_model_s"]["shaw-seed1"] == 27 and p["wall_s"] == 54
    # one slot: everything in a row
    assert project(schemes, ["none", "shaw"], [0, 1], 1, prof, 200, 5.0)["wall_s"] == 2 * (25 + 27)


def test_largest_fit_is_the_last_step_count_inside_the_budget():
    schemes = {"none": fake(0.05), "rope": fake(0.06)}
    prof = get_profile("gpu")  # log_every 100, val_every 400
    for budget in (120.0, 600.0, 900.0):
        n = largest_fit(schemes, ["none", "rope"], [0, 1], 4, prof, 10.0, 5.0, budget)
        wall = lambda k: project(schemes, ["none", "rope"], [0, 1], 4, prof, k, 10.0, 5.0)["wall_s"]
        assert n % prof.log_every == 0 and wall(n) <= budget < wall(n + prof.log_every)
    # more seeds on the same slots leave fewer updates per model
    fits = [largest_fit(schemes, ["none", "rope"], list(range(k)), 2, prof, 10.0, 5.0, 900.0) for k in (1, 2, 3)]
    assert fits[0] > fits[1] > fits[2]
    assert largest_fit(schemes, ["none"], [0], 1, prof, 10.0, 5.0, budget_s=20.0) is None  # start-up alone is 10 s


def test_timing_profile_keeps_the_recipe_and_moves_logging_past_the_window():
    prof = get_profile("gpu")
    t = timing_profile(prof, 5, 20)
    assert (t.log_every, t.val_every, t.ckpt_every) == (26, 26, 26) and t.max_steps == prof.max_steps
    assert (t.d_model, t.batch_tokens, t.lr, t.warmup) == (prof.d_model, prof.batch_tokens, prof.lr, prof.warmup)


def test_on_update_sees_every_update_once(tmp_path):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(max_steps=6)
    tok, data, _ = prepare_data(prof, tmp_path / "run", data_dir=d, source="files", log=lambda m: None)
    seen = []
    tr = train_model("rope", 0, prof, data, tok, tmp_path / "m", progress=False, log=lambda m: None,
                     on_update=lambda st: seen.append((st["step"], st["tokens"])))
    assert [s for s, _ in seen] == list(range(1, 7)) and tr["updates"] == 6
    assert all(b > a for (_, a), (_, b) in zip(seen, seen[1:]))  # tokens only grow
    assert "peak_mem_gib" not in tr  # a GPU figure only


def test_calibrate_two_processes_on_the_cpu_and_the_command_it_prints(tmp_path):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(max_steps=40, log_every=10, val_every=20, ckpt_every=20, warmup=8)
    out = tmp_path / "run"
    lines = []
    res = calibrate(prof, ["none", "shaw"], [0, 1], out, data_dir=d, source="files", jobs=2, threads=1, warm=2,
                    updates=6, sample=5, budget_min=1.0, log=lines.append)
    saved = json.loads((out / "calibration.json").read_text())
    assert saved == json.loads(json.dumps(res))
    assert list(res["schemes"]) == ["none", "shaw"] and res["jobs"] == 2
    for m in res["schemes"].values():
        assert m["concurrent"] == 2 and m["aligned"] is True  # both timed while the other trained
        assert m["s_per_update"] > 0 and m["tok_per_s"] > 0 and m["decode_sample_s"] > 0 and m["startup_s"] > 0
        assert m["ckpt_s"] > 0 and m["decode_mode"] == "greedy, no early stop (upper bound)"
        assert m["peak_rss_gib"] > 0 and m["precision"] == "fp32"
    assert res["memory"] == {"gpu_gib": None, "reserved_gib_all_jobs": None, "fits": None}
    # the projection uses the measured figures
    p = project(res["schemes"], ["none", "shaw"], [0, 1], 2, prof, prof.max_steps, res["decode_scale"], res["load_s"])
    assert abs(res["projection"]["wall_min"] - p["wall_s"] / 60) <= 0.006  # wall_s is itself rounded to 0.1 s
    steps = [f["max_steps"] for f in res["fits"]]
    assert all(s is not None for s in steps) and steps[0] >= steps[1] >= steps[2]
    assert res["max_steps_for_seeds"] == steps[1] and all(f["wall_min"] <= 1.0 for f in res["fits"])
    # warm-up scaled with the steps, as in the profile (8 of 40)
    assert res["fits"][1]["warmup"] == max(1, round(8 * steps[1] / 40))
    assert any(line.startswith("run: python -m posenc_lib.experiments.wmt14") for line in lines)
    # nothing of the timed models is left; the tokenizer and data cache are the run's
    ckpt = default_ckpt_dir(out)
    assert not list(ckpt.glob(".calibration-*")) and (ckpt / "data-fr-en.pt").is_file()
    assert (out / "tokenizer.json").is_file() and not list(out.glob("*-seed*"))
    # the printed command runs (cut to two updates here) and reuses the prepared data
    args = shlex.split(res["command"])
    assert args[:3] == ["python", "-m", "posenc_lib.experiments.wmt14"] and f"max_steps={steps[1]}" in args
    stamp = (ckpt / "data-fr-en.pt").stat().st_mtime_ns
    cmd = [sys.executable, *args[1:], "--pe", "none", "--seeds", "0", "--set", "max_steps=2", "--set",
           "eval_limit=3", "--source", "files", "--threads", "1", "--no-progress"]
    proc = subprocess.run(cmd, env={**ENV, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "none-seed0" / "result.json").is_file() and (ckpt / "data-fr-en.pt").stat().st_mtime_ns == stamp


def test_a_last_smaller_group_is_timed_beside_schemes_measured_already(tmp_path):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(max_steps=40, log_every=10, val_every=20, ckpt_every=20, warmup=8)
    res = calibrate(prof, ["none", "rope", "alibi"], [0], tmp_path / "run", data_dir=d, source="files", jobs=2,
                    threads=1, warm=2, updates=3, sample=3, budget_min=1.0, log=lambda m: None)
    assert list(res["schemes"]) == ["none", "rope", "alibi"]  # alibi once, though none trained beside it again
    assert all(m["concurrent"] == 2 and m["aligned"] is True for m in res["schemes"].values())
    assert not list(default_ckpt_dir(tmp_path / "run").glob(".calibration-*"))


def test_translate_without_early_stop_decodes_every_batch_to_its_budget(tmp_path, monkeypatch):
    import posenc_lib.experiments.wmt14.evaluate as ev
    from posenc_lib import build_model

    d = tiny_dir(tmp_path)
    tok, _, splits = prepare_data(tiny_profile(), tmp_path / "run", data_dir=d, source="files", log=lambda m: None)
    model = build_model("rope", tok.vocab_size, pad_id=tok.pad_id, d_model=16, n_heads=2, num_layers=1,
                        num_decoder_layers=1, dim_feedforward=32).eval()
    seen = []
    real = ev.greedy_decode

    def spy(model, src, **kw):
        ys = real(model, src, **kw)
        seen.append((kw["eos_id"], kw["max_new_tokens"], src.shape[1], ys.shape[1] - 1))
        return ys

    monkeypatch.setattr(ev, "greedy_decode", spy)
    sources = splits["newstest2014"][0][:6]
    ev.translate(model, tok, sources, batch_tokens=60, stop_at_eos=False)
    assert len(seen) > 1 and all(eos is None and steps == new == int(1.5 * width) + 10
                                 for eos, new, width, steps in seen)
    seen.clear()
    ev.translate(model, tok, sources, batch_tokens=60)
    assert all(eos == tok.eos_id for eos, *_ in seen)
    with pytest.raises(ValueError, match="stop_at_eos=False is for greedy decoding"):
        ev.translate(model, tok, sources, beam=2, stop_at_eos=False)


def test_a_data_cache_made_with_other_settings_is_refused(tmp_path):
    d = tiny_dir(tmp_path)
    kw = dict(data_dir=d, source="files", log=lambda m: None)
    prepare_data(tiny_profile(), tmp_path / "run", **kw)
    with pytest.raises(ValueError, match=r"made with other settings: max_tokens 30 \(now 20\); delete it and .*tokenizer"):
        prepare_data(tiny_profile(max_tokens=20), tmp_path / "run", **kw)


@pytest.mark.parametrize("flags,words", [
    (["--updates", "0"], "--updates must be a positive integer, got 0"),
    (["--budget-min", "-2"], "--budget-min must be a positive number of minutes, got -2.0"),
    (["--pe", "bogus"], "unknown positional encoding 'bogus'"),
    (["--jobs", "many"], "--jobs must be a positive integer or 'auto'"),
    (["--set", "max_steps=0"], "max_steps"),
    (["--seeds", "a"], "--seeds must be comma-separated integers"),
])  # fmt: skip
def test_bad_calibration_inputs_exit_2_with_one_line(tmp_path, flags, words):
    cmd = [sys.executable, "-m", "posenc_lib.experiments.wmt14", "calibrate", "--profile", "smoke", "--out", str(tmp_path / "o"),
           "--data-dir", str(tmp_path / "none"), *flags]
    proc = subprocess.run(cmd, env={**ENV, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert not (tmp_path / "o" / "calibration.json").exists()


def test_gpu_finale_script_runs_every_stage_and_packs_the_run_without_checkpoints(tmp_path):
    """scripts/gpu_finale.sh on the CPU with a tiny profile: tests, calibration, the fitted run, the archive."""
    import tarfile

    d = tiny_dir(tmp_path)
    run = tmp_path / "runs" / "wmt"
    env = {**ENV, "PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "DATA": str(d), "RUN_DIR": str(run),
           "REHEARSE_ON_CPU": "1", "PROFILE": "smoke", "PES": "none,rope", "SEEDS": "0", "JOBS": "1",
           "EXTRA": "--set vocab_size=300 --set val_pairs=8 --set batch_tokens=300 --set eval_limit=4 "
                    "--set bootstrap_samples=20 --sample 4 --warm 2 --updates 4 --threads 1"}
    script = str(ROOT / "scripts" / "gpu_finale.sh")
    proc = subprocess.run(["bash", script, "start", "0.3"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "exit status 0" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    for stage in ("CUDA tests", "calibration (budget 0.3 min)", "run: python -m posenc_lib.experiments.wmt14", "finished"):
        assert stage in proc.stdout
    cal = json.loads((run / "calibration.json").read_text())
    res = json.loads((run / "results.json").read_text())
    assert list(res["models"]) == ["none", "rope"]
    assert res["config"]["profile"]["max_steps"] == cal["max_steps_for_seeds"] == cal["fits"][0]["max_steps"]
    assert (default_ckpt_dir(run) / "rope-seed0" / "checkpoint.pt").is_file()
    proc = subprocess.run(["bash", script, "pack", str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "out" / "wmt14-gpu.tar.gz") as tar:
        names = tar.getnames()
    assert not any(n.endswith(".pt") for n in names) and not (tmp_path / "out" / "wmt14-gpu.tar.gz.tmp").exists()
    for part in ("wmt/results.json", "wmt/calibration.json", "wmt/cuda_tests.txt", "wmt/rope-seed0/result.json",
                 "wmt.log", "wmt.done"):
        assert any(n.endswith(part) for n in names), part
    proc = subprocess.run(["bash", script, "bogus"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "usage: bash scripts/gpu_finale.sh start" in proc.stderr
    bad = {**env, "SOURCE": "sharedfolder"}
    bad.pop("DATA")
    proc = subprocess.run(["bash", script, "start"], env=bad, capture_output=True, text=True)
    assert proc.returncode == 2 and "SOURCE must be hub or files, got 'sharedfolder'" in proc.stderr


def test_gpu_runbook_needs_only_the_repository_and_the_hub():
    """The GPU runbook's commands and the script read the hub's wmt14, the shipped files or a folder made from
    either: nothing outside the repository."""
    page = (ROOT / "scripts" / "README.md").read_text()
    runbook = page[page.index("## Running the finale on a GPU"):]
    prose = re.sub(r"```.*?```", "", runbook, flags=re.S)
    commands = "\n".join(re.findall(r"```bash\n(.*?)```", runbook, re.S) + re.findall(r"`([^`\n]+)`", prose))
    script = (ROOT / "scripts" / "gpu_finale.sh").read_text()
    for doc in (commands, script):
        assert "../" not in doc and "shared/" not in doc
    assert "--source hub --set max_train_pairs=600000" in commands and 'SOURCE=${SOURCE:-hub}' in script




def test_steady_windows_time_the_last_window_after_a_slow_start():
    """A fake clock: updates take 0.5 s until update 25, then 0.2 s; the first window (6-25) is the slow start the
    old calibration timed, the last one the steady state; the barrier runs once, before the first edge's time."""
    from posenc_lib.experiments.wmt14.calibrate import SteadyWindows

    now = [0.0]
    events = []
    timer = SteadyWindows(5, 20, 3, clock=lambda: now[0], sync=lambda: events.append("sync"),
                          at_warm=lambda: events.append("barrier"))
    assert timer.last_step == 65
    tokens = 0
    for step in range(1, 66):
        now[0] += 0.5 if step <= 25 else 0.2
        tokens += 1000
        timer({"step": step, "tokens": tokens})
    r = timer.result()
    assert r["windows_s_per_update"] == [0.5, 0.2, 0.2] and r["s_per_update"] == 0.2 and r["steady"] is True
    assert r["tok_per_s"] == 5000.0 and events == ["sync", "barrier", "sync", "sync", "sync"]
    slow = SteadyWindows(1, 10, 2, clock=lambda: now[0])
    for step, dt in zip(range(1, 22), [0.5] * 11 + [0.3] * 10):
        now[0] += dt
        slow({"step": step, "tokens": step})
    assert slow.result()["steady"] is False  # 0.5 then 0.3: not yet steady, and said so
    with pytest.raises(RuntimeError, match="never ended"):
        SteadyWindows(5, 20, 1).result()


def test_projection_names_its_parts_and_a_checkpoint_only_at_the_end():
    schemes = {"none": fake(0.01)}
    prof = get_profile("gpu", {"val_every": "100"})  # ckpt_every 0: one checkpoint, after the last update
    p = project(schemes, ["none"], [0, 1], 1, prof, 200, 5.0)
    assert p["parts_s"] == {"startup": 20.0, "training": 4.0, "validation": 4.0, "checkpoints": 1.0, "scoring": 20.0}
    assert p["wall_s"] == sum(p["parts_s"].values())
