"""Bad input gets a clear error naming the bad value and the valid choices."""
import gzip
import lzma

import pytest
import torch

from posenc_lib import (
    LearnedPositionalEmbedding,
    alibi_slopes,
    apply_rope,
    build_model,
    deberta_log_bucket,
    greedy_decode,
    set_seed,
    sinusoidal_table,
    t5_relative_bucket,
)
from posenc_lib.experiments.wmt14.data import load_wmt14, read_lines, read_parallel
from posenc_lib.schemes.xlnet import rel_shift


def test_unknown_scheme_lists_choices():
    with pytest.raises(ValueError, match=r"unknown positional encoding 'rotery'.*none, sinusoidal, learned"):
        build_model("rotery", 10)


def test_unknown_scheme_option_lists_valid_options():
    with pytest.raises(ValueError, match=r"max_relative_position"):
        build_model("shaw", 10, max_relative_positon=4)
    with pytest.raises(ValueError, match=r"valid options: none"):
        build_model("none", 10, num_buckets=4)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"n_heads=5 does not divide d_model=64.*\[1, 2, 4, 8, 16, 32, 64\]"):
        build_model("none", 10, n_heads=5)


@pytest.mark.parametrize("pe", ["rope", "sinusoidal"])
def test_odd_dimensions_rejected_where_pairs_are_needed(pe):
    with pytest.raises(ValueError, match=r"must be even.*got (9|36)|got 9"):
        build_model(pe, 10, d_model=36, n_heads=4) if pe == "rope" else sinusoidal_table(10, 9)
    with pytest.raises(ValueError, match="must be even"):
        apply_rope(torch.randn(2, 5, 7))


def test_learned_table_too_short():
    table = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match=r"position 9 is beyond the learned table \(max_len=8"):
        table(torch.arange(10))
    m = build_model("learned", 10, d_model=16, n_heads=2, num_layers=1, max_len=6)
    with pytest.raises(ValueError, match="max_len=6"):
        m(torch.ones(1, 7, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_wrong_dtypes():
    m = build_model("none", 10, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(TypeError, match=r"src must hold integer token ids.*torch.float32"):
        m(torch.zeros(1, 4), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, length\)"):
        m(torch.ones(4, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point"):
        apply_rope(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="seed must be an int"):
        set_seed("0")


def test_bad_numbers():
    with pytest.raises(ValueError, match="n_heads must be a positive integer, got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="num_buckets must be even"):
        t5_relative_bucket(torch.arange(3), True, 31)
    with pytest.raises(ValueError, match="bucket_size"):
        deberta_log_bucket(torch.arange(3), 2, 10)
    with pytest.raises(ValueError, match="distance columns"):
        rel_shift(torch.randn(3, 5), 4)
    with pytest.raises(ValueError, match="dropout"):
        build_model("none", 10, dropout=1.5)
    m = build_model("none", 10, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(m, torch.ones(1, 3, dtype=torch.long), max_new_tokens=0, bos_id=1, eos_id=2)


# -- data files: each problem is named with its file (and line) -----------------------------------
def _split(folder, name="train", fr="un\ndeux\ntrois\n", en="one\ntwo\nthree\n"):
    folder.mkdir(exist_ok=True)
    for lang, text in (("fr", fr), ("en", en)):
        (folder / f"{name}.{lang}").write_text(text, encoding="utf-8")
    return folder


def test_data_file_missing(tmp_path):
    d = _split(tmp_path / "d")
    (d / "train.en").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing data file .*train\.en \(also tried \.xz and \.gz\)"):
        read_parallel(d, "train")
    with pytest.raises(FileNotFoundError, match=r"missing data file .*nothing\.fr"):
        read_lines(d / "nothing.fr")


def test_data_file_empty(tmp_path):
    d = _split(tmp_path / "d", en="")
    with pytest.raises(ValueError, match=r"train\.en is empty"):
        read_parallel(d, "train")
    (d / "train.en").write_text("\n \n")  # only blank lines counts as empty too
    with pytest.raises(ValueError, match=r"train\.en is empty"):
        read_lines(d / "train.en")


def test_data_files_misaligned(tmp_path):
    d = _split(tmp_path / "d", en="one\ntwo\n")
    with pytest.raises(ValueError, match=r"train\.fr has 3 lines but .*train\.en has 2.*out of step near line \d of .*train\.fr"):
        read_parallel(d, "train")


@pytest.mark.parametrize("suffix", ["xz", "gz"])
def test_truncated_compressed_file_is_named_and_called_damaged(tmp_path, suffix):
    d = _split(tmp_path / "d")
    text = "".join(f"phrase numéro {i}\n" for i in range(3000)).encode()
    packed = lzma.compress(text) if suffix == "xz" else gzip.compress(text)
    (d / "train.fr").unlink()
    (d / f"train.fr.{suffix}").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match=rf"train\.fr\.{suffix}: damaged {suffix} file"):
        read_parallel(d, "train")
    (d / f"train.fr.{suffix}").write_bytes(b"not compressed at all\n")
    with pytest.raises(ValueError, match=rf"train\.fr\.{suffix}: damaged {suffix} file"):
        read_lines(d / f"train.fr.{suffix}")
    (d / f"train.fr.{suffix}").write_bytes(packed)  # the intact file reads
    assert read_lines(d / f"train.fr.{suffix}")[2999] == "phrase numéro 2999"


def test_data_file_not_utf8_names_the_line(tmp_path):
    d = _split(tmp_path / "d")
    (d / "train.fr").write_bytes("un\ndeux\ntrès\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train\.fr, line 3: not UTF-8 text .*b'\\xe8'"):
        read_parallel(d, "train")


def test_data_file_empty_or_blank_line(tmp_path):
    d = _split(tmp_path / "d", en="one\n\nthree\n")
    with pytest.raises(ValueError, match=r"train\.en, line 2: empty line"):
        read_parallel(d, "train")
    (d / "train.en").write_text("one\ntwo\n   \n")
    with pytest.raises(ValueError, match=r"train\.en, line 3: empty line"):
        read_parallel(d, "train")
    (d / "train.en").write_text("one\r\ntwo\r\nthree")  # CRLF and a missing final newline are fine
    assert read_parallel(d, "train")[1] == ["one", "two", "three"]


def test_data_dir_errors(tmp_path):
    (tmp_path / "afile").write_text("x\n")
    with pytest.raises(ValueError, match=r"data directory .*afile is a file, not a folder"):
        load_wmt14(tmp_path / "afile", source="files")
    with pytest.raises(ValueError, match=r"max_train must be a positive integer, got -3"):
        load_wmt14(tmp_path, source="files", max_train=-3)
    with pytest.raises(ValueError, match=r"limit must be a positive integer, got 0"):
        read_parallel(tmp_path, "train", 0)


def test_sizes_that_would_divide_by_zero_are_refused():
    with pytest.raises(ValueError, match=r"need num_buckets >= 4 and max_distance > 1.*num_buckets=2"):
        build_model("t5", 10, d_model=16, n_heads=2, num_layers=1, num_buckets=2)
    with pytest.raises(ValueError, match=r"max_distance > 8.*max_distance=8"):
        t5_relative_bucket(torch.arange(3), True, 32, 8)
    with pytest.raises(ValueError, match=r"need position_buckets >= 4"):
        build_model("deberta", 10, d_model=16, n_heads=2, num_layers=1, position_buckets=2)
    for pe in ("sinusoidal", "xlnet"):
        with pytest.raises(ValueError, match=r"base must be a finite number in \(1.0, inf\), got 0"):
            build_model(pe, 10, d_model=16, n_heads=2, num_layers=1, base=0)


def test_decoding_ids_and_model_ids_are_checked():
    m = build_model("none", 10, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(ValueError, match=r"bos_id must be an integer in \[0, 9\], got 12"):
        greedy_decode(m, torch.ones(1, 3, dtype=torch.long), max_new_tokens=2, bos_id=12, eos_id=2)
    with pytest.raises(ValueError, match=r"pad_id must be an integer in \[0, 9\], got 10"):
        build_model("none", 10, pad_id=10)
    with pytest.raises(TypeError, match=r"dropout must be a finite number in \[0.0, 1.0\), got .0.1. \(str\)"):
        build_model("none", 10, dropout="0.1")


def test_experiment_settings_name_field_and_range():
    from benchmarks.common import BenchConfig
    from posenc_lib.experiments.extrapolation import ExtrapolationConfig

    for kw, match in [
        ({"lr": 0}, r"lr must be a finite number in \(0.0, inf\), got 0"),
        ({"warmup": -1}, r"warmup must be an integer >= 0, got -1"),
        ({"steps": 0}, r"steps must be a positive integer, got 0"),
        ({"grad_clip": -1.0}, r"grad_clip must be a finite number in \(0.0, inf\)"),
        ({"test_lengths": ()}, r"test_lengths must name at least one length"),
        ({"d_model": 12, "n_heads": 4}, r"d_model / n_heads=3 must both be even"),
    ]:
        with pytest.raises(ValueError, match=match):
            ExtrapolationConfig(**kw)
    for kw, match in [
        ({"batch": 0}, r"batch must be an integer >= 1, got 0"),
        ({"lengths": (64, 0)}, r"every training length must be an integer >= 1, got 0"),
        ({"dropout": 1.0}, r"dropout must be a finite number in \[0.0, 1.0\), got 1.0"),
        ({"dtype": "int8"}, r"unknown dtype 'int8'; valid choices: float32"),
        ({"vocab_size": 3}, r"vocab_size must be an integer >= 5"),
    ]:
        with pytest.raises(ValueError, match=match):
            BenchConfig(**kw)


def test_readme_troubleshooting_rows_are_the_real_messages(tmp_path, monkeypatch):
    """Each message the README's Troubleshooting table quotes ("…" = any text) is what the code says."""
    import json
    import re
    from dataclasses import asdict
    from pathlib import Path

    import posenc_lib.experiments.wmt14.data as data
    from posenc_lib.experiments import extrapolation
    from posenc_lib.experiments.wmt14 import train
    from posenc_lib.experiments.wmt14 import pipeline as wmt14

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Troubleshooting", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]

    def message(call):
        try:
            call()
        except Exception as err:  # noqa: BLE001 (each trigger must fail; the message is what counts)
            return str(err)
        raise AssertionError("no error")

    d = tmp_path / "d"
    d.mkdir()

    def files(**texts):
        for name, text in texts.items():
            (d / name.replace("_", ".")).write_bytes(text if isinstance(text, bytes) else text.encode())

    def truncated_xz():
        packed = lzma.compress(b"phrase\n" * 5000)
        files(train_fr_xz=packed[: len(packed) // 2], train_en="one\n")
        return read_lines(d / "train.fr.xz")

    def hub_down():
        monkeypatch.setattr(data, "load_hub", lambda n: (_ for _ in ()).throw(OSError("offline")))
        return load_wmt14(source="hub")

    def other_settings():
        prof = train.get_profile("smoke")
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text(json.dumps({"profile": {**asdict(prof), "d_model": 8}}))
        return wmt14.check_config(tmp_path / "run", {"profile": asdict(prof)})

    def other_configuration():
        (tmp_path / "ex").mkdir()
        (tmp_path / "ex" / "none_seed0.json").write_text(json.dumps({"config": {}, "profile": "smoke"}))
        return extrapolation.pending(extrapolation.SMOKE, ["none"], [0], tmp_path / "ex")

    def damaged_checkpoint():
        (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
        return train.load_checkpoint(tmp_path / "checkpoint.pt")

    wd = tmp_path / "wd"  # a tiny data folder (held-out pairs borrowed from the shipped ones)
    wd.mkdir()
    for split, n in (("train", 60), ("newstest2013", 12), ("newstest2014", 12)):
        (wd / f"{split}.fr").write_text("".join(f"la phrase {split} numéro {i}\n" for i in range(n)))
        (wd / f"{split}.en").write_text("".join(f"the sentence {split} number {i}\n" for i in range(n)))
    prof = train.get_profile("smoke", {"vocab_size": "100"})

    def locked():
        import os as _os

        from posenc_lib.files import FolderLock, process_start

        holder = _os.getppid()  # a living process other than this one
        (tmp_path / "lk").mkdir()
        (tmp_path / "lk" / ".posenc-lock").write_text(json.dumps({"pid": holder, "start": process_start(holder)}))
        return FolderLock(tmp_path / "lk").acquire()

    def checkpoint_without_resume():
        ck = tmp_path / "cr-ckpt" / "none-seed0" / "checkpoint.pt"
        ck.parent.mkdir(parents=True)
        ck.write_bytes(b"an earlier sitting's checkpoint")
        return wmt14.run(prof, ["none"], [0], tmp_path / "cr", data_dir=wd, log=lambda m: None)

    def other_data():
        return wmt14.prepare_data(prof, tmp_path / "od", data_dir=wd, source="files", log=lambda m: None,
                                  expect={"sha256": "0" * 64, "where": "local files in /elsewhere"})

    def other_eval_limit():
        (tmp_path / "ev" / "none-seed0").mkdir(parents=True)
        (tmp_path / "ev" / "none-seed0" / "result.json").write_text("{}")
        (tmp_path / "ev" / "config.json").write_text(json.dumps({"profile": {**asdict(prof), "eval_limit": 20}}))
        return wmt14.check_config(tmp_path / "ev", {"profile": asdict(prof)})

    def other_benchmark_model():
        import benchmarks.run as br
        from benchmarks.common import BenchConfig

        (tmp_path / "bench").mkdir()
        (tmp_path / "bench" / "train.json").write_text(json.dumps({"schema": br.SCHEMA,
                                                                   "config": BenchConfig.quick().as_dict()}))
        raise ValueError(br.other_model(tmp_path / "bench", ["train"], BenchConfig()))

    def would_replace():
        from posenc_lib.files import refuse_overwrite

        (tmp_path / "train.json").write_text("{}")
        return refuse_overwrite([tmp_path / "train.json"])

    def under_a_file():
        from posenc_lib.files import check_folder_path

        (tmp_path / "afile").write_text("mine")
        return check_folder_path(tmp_path / "afile" / "sub", "--out")

    def folder_for_a_file():
        from posenc_lib.files import check_file_path

        return check_file_path(tmp_path, "--out")

    def already_holds():
        (tmp_path / "md").mkdir()
        (tmp_path / "md" / "notes.txt").write_text("mine")
        return wmt14.make_data(wd, tmp_path / "md", pairs=5, log=lambda m: None)

    def interrupted():
        import contextlib
        import io

        import posenc_lib.experiments.wmt14.pipeline as pipeline
        from posenc_lib.experiments.wmt14 import main

        monkeypatch.setattr(pipeline, "run_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["--profile", "smoke", "--pe", "none", "--data-dir", str(wd), "--set", "vocab_size=100",
                         "--out", str(tmp_path / "ki"), "--no-progress"])
        raise RuntimeError(f"exit {code}: {err.getvalue().strip()}")

    def damaged_weights():
        from posenc_lib.files import load_weights

        (tmp_path / "w.pt").write_bytes(b"cut off")
        return load_weights(tmp_path / "w.pt")

    def damaged_metrics():
        (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 2}\n{"step": 4,,\n{"step": 6}\n')
        return train.read_metrics(tmp_path / "metrics.jsonl", 6)

    def bad_vocab():
        from posenc_lib.experiments.wmt14.tokenizer import load_mbert

        (tmp_path / "vocab.txt").write_text("a\nb\n")
        return load_mbert(tmp_path / "vocab.txt")

    def half_pair():
        (tmp_path / "hp").mkdir()
        (tmp_path / "hp" / "heldout.en").write_text("one\n")
        return data.has_split(tmp_path / "hp", "heldout")

    def gpu_profile_here():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        return wmt14.check_hardware(train.get_profile("gpu"), None)

    def workers_still_running():
        import os as _os
        import subprocess
        import sys

        from posenc_lib.files import FolderLock

        gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                                  text=True, check=True).stdout)
        (tmp_path / "wk").mkdir()
        (tmp_path / "wk" / ".posenc-lock").write_text(json.dumps({"pid": gone, "start": None,
                                                                  "workers": [{"pid": _os.getppid()}]}))
        return FolderLock(tmp_path / "wk").acquire()

    def missing_results():
        from posenc_lib.course.notebook import results_file

        return results_file(tmp_path / "results" / "long_context_extra" / "t5_seed0.json")

    small = dict(d_model=16, n_heads=2, num_layers=1)
    ones = torch.ones(1, 3, dtype=torch.long)
    triggers = [
        [lambda: build_model("rotery", 10)],
        [lambda: build_model("none", 10, n_heads=5)],
        [lambda: build_model("learned", 20, **small, max_len=8)(torch.ones(1, 9, dtype=torch.long), ones)],
        [lambda: build_model("none", 20, **small)(torch.tensor([[1, 25]]), ones)],
        [lambda: build_model("none", 20, **small)(torch.zeros(1, 3), ones)],
        [lambda: train.get_profile("cpu", {"max_steps": "-3"})],
        [truncated_xz],
        [lambda: files(train_en="one\ntwo\ntrès\n".encode("latin-1")) or read_lines(d / "train.en")],
        [lambda: files(train_en="one\n\nthree\n") or read_lines(d / "train.en")],
        [lambda: files(train_fr="un\ndeux\ntrois\n", train_en="one\ntwo\n") or read_parallel(d, "train")],
        [half_pair],
        [lambda: read_parallel(d, "newstest2013")],
        [gpu_profile_here],
        [lambda: wmt14.parse_seeds("0,-1")],
        [hub_down],
        [damaged_checkpoint],
        [other_settings, other_configuration],
        [workers_still_running],
        [locked],
        [checkpoint_without_resume],
        [other_data],
        [other_eval_limit],
        [other_benchmark_model],
        [would_replace, already_holds],
        [under_a_file, folder_for_a_file],
        [interrupted],
        [damaged_weights],
        [damaged_metrics],
        [lambda: wmt14.check_device("tpu")],
        [bad_vocab],
        [missing_results],
    ]
    assert len(rows) == len(triggers), "a Troubleshooting row needs a trigger here (or one was removed)"
    for row, calls in zip(rows, triggers):
        quoted = re.findall(r"`([^`]+)`", row.split(" | ")[0])
        got = [message(c) for c in calls]
        for q in quoted:
            pattern = ".*".join(map(re.escape, q.split("…")))
            assert any(re.search(pattern, m) for m in got), f"README quotes {q!r}; the code says {got}"


def test_scoring_needs_one_hypothesis_per_reference():
    from posenc_lib.experiments.wmt14.evaluate import bleu_chrf, paired_bootstrap

    with pytest.raises(ValueError, match=r"hyps has 1 sentences but the references have 2"):
        bleu_chrf(["a b"], ["a b", "c d"])
    with pytest.raises(ValueError, match=r"refs is empty"):
        bleu_chrf([], [])
    with pytest.raises(TypeError, match=r"refs must be a list of sentences \(strings\), got str"):
        bleu_chrf("a b", "a b")  # a string would be scored character by character
    with pytest.raises(TypeError, match=r"hyps\[1\] must be a string, got NoneType"):
        bleu_chrf(["a", None], ["a", "b"])
    with pytest.raises(ValueError, match=r"systems\['rope'\] has 2 sentences but the references have 1"):
        paired_bootstrap({"none": ["x"], "rope": ["x", "y"]}, ["x"], n_samples=10)
    assert bleu_chrf(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"] == 100.0
