"""The WMT14 experiment pipeline on tiny data: end to end, resume, DDP, decoding, bad inputs."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc_lib import PE_TYPES, build_model, greedy_decode
from posenc_lib.models.beam import beam_search
from posenc_lib.experiments.wmt14.data import load_wmt14, read_parallel
from posenc_lib.experiments.wmt14.evaluate import bleu_by_source_length, bleu_chrf, paired_bootstrap
from posenc_lib.experiments.wmt14.train import get_profile, lr_at, make_batches
from posenc_lib.experiments.wmt14 import bleu_by_length, main, parse_pes, prepare_data, run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: these models are tiny, and a busy 2-core machine punishes oversubscription."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_dir(tmp_path: Path, n_train: int = 300) -> Path:
    """A data directory with the shipped files' first lines (same names, plain text)."""
    d = tmp_path / "data"
    d.mkdir()
    for split, n in (("train", n_train), ("newstest2013", 40), ("newstest2014", 30), ("heldout", 30)):
        fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", split, n)
        (d / f"{split}.fr").write_text("\n".join(fr) + "\n", encoding="utf-8")
        (d / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return d


def tiny_profile(**kw):
    base = dict(vocab_size=300, max_train_pairs=None, max_steps=8, log_every=2, val_every=4, ckpt_every=4,
                val_pairs=8, eval_limit=6, bertscore=False, bootstrap_samples=20, batch_tokens=300)
    base.update(kw)
    return get_profile("smoke", base)


def test_shipped_data_is_complete_and_heldout_unseen():
    splits, origin = load_wmt14(source="files")
    assert "local files" in origin
    assert len(splits["newstest2014"][0]) == 3003 and len(splits["newstest2013"][0]) == 3000
    assert len(splits["heldout"][0]) == 2000
    train_fr, train_en = set(splits["train"][0]), set(splits["train"][1])
    assert not train_fr & set(splits["heldout"][0]) and not train_en & set(splits["heldout"][1])


def test_smoke_end_to_end(tmp_path):
    prof = tiny_profile(bertscore=True)
    res = run(prof, ["none", "rope"], [0], tmp_path / "run", data_dir=tiny_dir(tmp_path), source="files",
              progress=False, log=lambda m: None)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["models"].keys() == {"none", "rope"}
    r = saved["models"]["rope"]["0"]
    assert r["updates"] == 8 and r["params"] > 0 and len(r["samples"]) == 5
    assert [row["step"] for row in r["curve"] if row["val_loss"] is not None] == [0, 4, 8]
    for test in ("heldout", "newstest2014"):
        t = r["tests"][test]
        assert t["bleu_signature"].startswith("nrefs:1") and 0 <= t["chrf"] <= 100 and 0 <= t["bertscore_f1"] <= 1
    assert "MiniLM" in saved["bertscore"]["model"] and saved["bertscore"]["num_layers"] == 6
    att = r["attention"]
    assert len(att["weights"]) == len(att["tokens"]) and abs(sum(att["weights"][0]) - 1) < 1e-2
    pb = saved["paired_bootstrap"]["heldout"][0]
    assert (pb["baseline"], pb["system"]) == ("none", "rope") and 0 <= pb["bleu_p"] <= 1
    assert (tmp_path / "run" / "figures" / "bleu.png").is_file()
    assert res["models"]["none"]["0"]["tests"]["heldout"]["sentences"] == 6
    # the run keeps its test sources, so BLEU by source length can be computed afterwards
    src = (tmp_path / "run" / "src.newstest2014.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert src == read_parallel(tmp_path / "data", "newstest2014", 6)[0]
    by_len = bleu_by_length(tmp_path / "run", "newstest2014", edges=[1, 20, 31])
    assert by_len.keys() == {"none", "rope"}
    rows = by_len["rope"]
    assert sum(row["sentences"] for row in rows) == 6
    assert all((row["min_len"] > prof.max_tokens) == row["beyond_training"] for row in rows)
    with pytest.raises(ValueError, match="valid choices"):
        bleu_by_length(tmp_path / "run", "newstest2013")
    # a finished model is skipped on rerun: its result file is not rewritten
    mtime = (tmp_path / "run" / "rope-seed0" / "result.json").stat().st_mtime_ns
    run(prof, ["rope"], [0], tmp_path / "run", data_dir=tmp_path / "data", source="files", progress=False,
        log=lambda m: None)
    assert (tmp_path / "run" / "rope-seed0" / "result.json").stat().st_mtime_ns == mtime


def test_resume_equals_uninterrupted(tmp_path):
    prof = tiny_profile(eval_limit=4)
    d = tiny_dir(tmp_path)
    kw = dict(data_dir=d, source="files", progress=False, log=lambda m: None)
    run(prof, ["shaw"], [1], tmp_path / "full", **kw)
    assert run(prof, ["shaw"], [1], tmp_path / "cut", stop_after=5, **kw) is None  # "killed" after update 5
    run(prof, ["shaw"], [1], tmp_path / "cut", resume=True, **kw)  # continues from the update-4 checkpoint
    a = json.loads((tmp_path / "full" / "shaw-seed1" / "result.json").read_text())
    b = json.loads((tmp_path / "cut" / "shaw-seed1" / "result.json").read_text())
    strip = lambda curve: [(r["step"], r["train_loss"], r["val_loss"]) for r in curve]  # noqa: E731
    assert strip(a["curve"]) == strip(b["curve"])
    wa = torch.load(tmp_path / "full-ckpt" / "shaw-seed1" / "checkpoint.pt", weights_only=False)["model"]
    wb = torch.load(tmp_path / "cut-ckpt" / "shaw-seed1" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_ddp_two_gloo_processes(tmp_path):
    d = tiny_dir(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "posenc_lib.experiments.wmt14", "--profile", "smoke", "--pe", "sinusoidal", "--data-dir", str(d),
           "--out", str(tmp_path / "ddp"), "--no-progress", "--threads", "1"]
    for kv in ("vocab_size=300", "max_steps=4", "log_every=2", "val_every=2", "ckpt_every=2", "val_pairs=8",
               "eval_limit=4", "bertscore=false", "batch_tokens=300", "micro_batch_tokens=100"):  # parts: no_sync
        cmd += ["--set", kv]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "ddp" / "sinusoidal-seed0" / "result.json").read_text())
    assert r["updates"] == 4 and r["curve"][-1]["val_loss"] is not None
    assert proc.stdout.count("results:") == 1  # only rank 0 reports
    assert "decoding shared by 2 processes" in proc.stdout  # each rank translated half the sentences
    for name in ("heldout", "newstest2014"):
        hyp = (tmp_path / "ddp" / "sinusoidal-seed0" / f"hyp.{name}.txt").read_text(encoding="utf-8").split("\n")
        assert len(hyp) == 5 and hyp[-1] == ""  # all 4 sentences, in order, gathered on rank 0
    ck = torch.load(tmp_path / "ddp-ckpt" / "sinusoidal-seed0" / "checkpoint.pt", weights_only=False)
    assert len(ck["rng"]) == 2 and all(r["cpu"].dtype == torch.uint8 for r in ck["rng"])  # one state per process
    # the gathered translations are in the sources' order: rank r decoded sentences r, r + 2, ... (the
    # batch sets the length limit, so the same shares are decoded here in one process to compare)
    from posenc_lib.experiments.wmt14.evaluate import translate
    from posenc_lib.experiments.wmt14.tokenizer import load_bpe

    cfg = dict(ck["config"])
    model = build_model(cfg.pop("pe"), cfg.pop("vocab_size"), **cfg)
    model.load_state_dict(ck["model"])
    src = (tmp_path / "ddp" / "src.newstest2014.txt").read_text(encoding="utf-8").split("\n")[:-1]
    hyp = (tmp_path / "ddp" / "sinusoidal-seed0" / "hyp.newstest2014.txt").read_text(encoding="utf-8").split("\n")
    tok = load_bpe(tmp_path / "ddp" / "tokenizer.json")
    expected = [None] * len(src)
    for r in range(2):
        expected[r::2] = translate(model.eval(), tok, src[r::2])
    assert expected == hyp[:-1]


@pytest.mark.parametrize("pe", PE_TYPES)
def test_cached_greedy_and_beam1_match_uncached(pe):
    model = build_model(pe, 50, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).eval()
    src = torch.randint(4, 50, (3, 7))
    src[2, 5:] = 0
    kw = dict(max_new_tokens=12, bos_id=2, eos_id=3, src_key_padding_mask=src == 0)
    cached = greedy_decode(model, src, use_cache=True, **kw)
    assert torch.equal(cached, greedy_decode(model, src, use_cache=False, **kw))
    assert torch.equal(cached, beam_search(model, src, beam=1, alpha=0.0, **kw))
    assert beam_search(model, src, beam=4, **kw).shape[0] == 3


def test_batches_respect_token_budget_and_schedule():
    lens = [3, 9, 4, 12, 7, 5, 8, 2, 11, 6] * 20
    batches = make_batches(lens, lens, batch_tokens=40, seed=0)
    assert sorted(i for b in batches for i in b) == list(range(len(lens)))
    assert all(len(b) * max(lens[i] for i in b) <= 40 for b in batches)
    assert batches == make_batches(lens, lens, batch_tokens=40, seed=0)
    assert lr_at(50, 1e-3, 100) == pytest.approx(5e-4) and lr_at(400, 1e-3, 100) == pytest.approx(5e-4)


def test_bad_inputs_give_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown positional encoding 'bogus'.*sinusoidal"):
        parse_pes("none,bogus")
    assert parse_pes("all") == list(PE_TYPES) and parse_pes("nonepe,sinpe,rpe,rope") == ["none", "sinusoidal",
                                                                                       "shaw", "rope"]
    with pytest.raises(ValueError, match="unknown profile field 'bogus'"):
        get_profile("smoke", {"bogus": 1})
    with pytest.raises(SystemExit):
        main(["--pe", "bogus", "--out", str(tmp_path / "x")])
    d = tiny_dir(tmp_path)
    prof = tiny_profile()
    (d / "newstest2014.en").unlink()
    with pytest.raises(FileNotFoundError, match="newstest2014.en"):
        prepare_data(prof, tmp_path / "r", data_dir=d, source="files", log=lambda m: None)
    (d / "newstest2014.en").write_text("a\nb\n")
    (d / "newstest2014.fr").write_text("a\nb\nc\n")
    with pytest.raises(ValueError, match=r"newstest2014.fr has 3 lines but .*newstest2014.en has 2"):
        prepare_data(prof, tmp_path / "r", data_dir=d, source="files", log=lambda m: None)
    (d / "newstest2014.fr").write_text("a\n\nc\n")
    with pytest.raises(ValueError, match=r"newstest2014.fr, line 2: empty line"):
        prepare_data(prof, tmp_path / "r", data_dir=d, source="files", log=lambda m: None)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_wmt14(tmp_path / "nowhere", source="files")
    with pytest.raises(ValueError, match="unknown direction 'de-en'"):
        prepare_data(prof, tmp_path / "r", direction="de-en", data_dir=d, source="files")


def test_bleu_by_source_length_buckets():
    refs = ["the cat sat on the mat", "a dog", "hello world again and again", "one two three four five six seven"]
    hyps = ["the cat sat on the mat", "a cat", "hello world again and again", "nothing alike here"]
    rows = bleu_by_source_length(hyps, refs, [6, 2, 5, 30], [0, 5, 25], train_max_len=24)
    assert [r["bucket"] for r in rows] == ["0-4", "5-24", "25+"]
    assert [r["sentences"] for r in rows] == [1, 2, 1]
    assert rows[1]["bleu"] == pytest.approx(100.0) and rows[2]["bleu"] < 10
    assert [r["beyond_training"] for r in rows] == [False, False, True]
    # each bucket's scores are sacreBLEU's corpus scores of its sentences alone
    for row, idx in zip(rows, ([1], [0, 2], [3])):
        alone = bleu_chrf([hyps[i] for i in idx], [refs[i] for i in idx])
        assert (row["bleu"], row["chrf"]) == (alone["bleu"], alone["chrf"])
    with pytest.raises(ValueError, match="strictly increasing"):
        bleu_by_source_length(hyps, refs, [1, 2, 3, 4], [0, 10, 5])
    with pytest.raises(ValueError, match="differ in length"):
        bleu_by_source_length(hyps, refs[:2], [1, 2, 3, 4], [0, 10])


def test_paired_bootstrap_of_several_systems_gives_each_pair_its_own_test():
    refs = ["the cat sat on the mat", "a dog barks at night", "hello world again", "one two three four five"]
    systems = {"a": ["the cat sat on a mat", "a dog barks", "hello world", "one two three"],
               "b": ["the cat sat on the mat", "the dog barks at night", "hello again", "one two three four"],
               "c": ["a cat", "a dog barks at night", "hello world again", "five four three two one"]}
    rows = paired_bootstrap(systems, refs, n_samples=50)
    assert [(r["baseline"], r["system"]) for r in rows] == [("a", "b"), ("a", "c"), ("b", "c")]
    for r in rows:
        alone = paired_bootstrap({r["baseline"]: systems[r["baseline"]], r["system"]: systems[r["system"]]}, refs, 50)
        assert alone == [r]


def test_save_figures_leaves_the_plotting_backend_alone(tmp_path):
    """Called from a notebook, the figure writer must not switch the notebook's backend (figures vanish)."""
    import matplotlib

    from posenc_lib.experiments.wmt14 import save_figures

    results = json.loads((ROOT / "results" / "wmt14-laptop" / "results.json").read_text())
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        save_figures(results, tmp_path / "figures")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    names = {p.name for p in (tmp_path / "figures").iterdir()}
    assert names == {"val_loss_vs_step.png", "val_loss_vs_wall_s.png", "bleu.png", "chrf.png", "bertscore_f1.png",
                     "shuffled.png"}
