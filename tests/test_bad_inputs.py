"""Bad input, drawn rather than listed: every call works or says clearly what was wrong.

Property-based tests (hypothesis) draw model arguments, scheme options, input
tensors, profile overrides and experiment settings, one possibly-bad value at a
time, and check the contract of the library:

* the call works (and then its result is sane: the right shape, finite), or
* it raises ``ValueError``/``TypeError`` whose message names the bad argument.

Anything else (an ``IndexError`` from deep inside torch, a ``RuntimeError`` about
tensor sizes, NaN logits) fails the test.  Every command line is run in-process
through its ``main(argv)`` with bad flags: it must exit with status 2 and print
exactly one line on stderr, never a traceback.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import math
import os
import sys
from dataclasses import fields

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc_lib import ALL_TYPES, build_model, greedy_decode, scheme_options

#: a fixed, fast draw for ``make test``; ``BAD_INPUT_EXAMPLES=500`` searches wider (and randomly)
_N = int(os.environ.get("BAD_INPUT_EXAMPLES", "0"))
FAST = settings(max_examples=_N or 40, deadline=None, derandomize=not _N,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip
TINY = dict(d_model=8, n_heads=2, num_layers=1, dim_feedforward=8, dropout=0.0)
VOCAB = 12

#: values a hurried user might pass where a count, a size or a rate belongs (kept small: no 8 GB tables)
WEIRD = st.one_of(
    st.integers(-3, 40),
    st.floats(-1e6, 1e6),
    st.sampled_from([None, True, False, "8", "", "0.1", [2], 2.5, -0.5, 1e-9, math.nan, math.inf, -math.inf]),
)


def works_or_names(call, *names):
    """Run ``call``; a ``ValueError``/``TypeError`` must name one of ``names``. Returns (result, error)."""
    try:
        return call(), None
    except (ValueError, TypeError) as err:
        msg = str(err)
        assert any(n in msg for n in names), f"{type(err).__name__} names none of {names}: {msg}"
        return None, err


def _tokens(b=2, n=5, seed=0):
    return torch.randint(1, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


def _sane(logits, b, t, vocab=VOCAB):
    assert logits.shape == (b, t, vocab)
    assert torch.isfinite(logits).all(), "non-finite logits"


# -- model arguments ---------------------------------------------------------------------------------
MODEL_ARGS = ("vocab_size", "d_model", "n_heads", "num_layers", "num_decoder_layers", "dim_feedforward",
              "dropout", "pad_id")  # fmt: skip


@FAST
@given(pe=st.sampled_from(ALL_TYPES), name=st.sampled_from(MODEL_ARGS), value=WEIRD)
def test_build_model_arguments(pe, name, value):
    kw = dict(TINY)
    vocab = value if name == "vocab_size" else VOCAB
    if name != "vocab_size":
        kw[name] = value
    # a head split that is fine for the model may still be refused by a scheme that pairs dimensions
    split = ("d_model", "n_heads", "head_dim") if name in ("d_model", "n_heads") else ()
    model, err = works_or_names(lambda: build_model(pe, vocab, **kw), name, *split)
    if model is not None:
        src, tgt = _tokens() % model.vocab_size, _tokens(n=4, seed=1) % model.vocab_size
        _sane(model.eval()(src, tgt), 2, 4, model.vocab_size)
        if (tgt != model.pad_id).any():  # (a target of nothing but padding has no tokens to average over)
            assert torch.isfinite(model.loss(src, tgt, tgt))


#: every option of every registered scheme (its constructor's keyword arguments)
SCHEME_OPTIONS = {pe: tuple(scheme_options(pe)) for pe in ALL_TYPES if scheme_options(pe)}


@FAST
@given(data=st.data(), value=st.one_of(WEIRD, st.sampled_from(["split", "symmetric", "left", "log", "power"])))
def test_scheme_options(data, value):
    pe = data.draw(st.sampled_from(sorted(SCHEME_OPTIONS)))
    name = data.draw(st.sampled_from(SCHEME_OPTIONS[pe]))
    model, err = works_or_names(lambda: build_model(pe, VOCAB, **TINY, **{name: value}), name)
    if model is not None:
        src = _tokens(n=6)
        out, err = works_or_names(lambda: model.eval()(src, src[:, :4]), name)  # a short learned table
        if out is not None:
            _sane(out, 2, 4)


def test_unknown_option_and_scheme_names_are_named():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['max_len'\] .*valid options: \['max_relative_position'\]"):
        build_model("shaw", VOCAB, **TINY, max_len=4)
    with pytest.raises(TypeError, match=r"pe must be a string"):
        build_model(3, VOCAB, **TINY)
    with pytest.raises(ValueError, match=r"unknown positional encoding 'rotery'.*valid choices"):
        build_model("rotery", VOCAB, **TINY)


# -- input tensors -----------------------------------------------------------------------------------
_MODELS: dict[str, torch.nn.Module] = {}


def _model(pe):
    if pe not in _MODELS:
        torch.manual_seed(0)
        _MODELS[pe] = build_model(pe, VOCAB, **TINY, **({"max_len": 8} if pe == "learned" else {})).eval()
    return _MODELS[pe]


DTYPES = [torch.int64, torch.int64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.float32]


@st.composite
def token_tensors(draw, b, lo=-2, hi=VOCAB + 2):
    """Mostly valid ``(b, n)`` int64 ids; sometimes another dtype, shape, an empty row or an id out of range."""
    n = draw(st.integers(0, 11))  # up to 11: past the learned table's 8 rows
    shape = draw(st.sampled_from([(b, n), (b, n), (b, n), (n,), (b, n, 1), (b + 1, n)]))
    dtype = draw(st.sampled_from(DTYPES))
    ids = torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    if draw(st.booleans()) and ids.numel():  # one id anywhere in [lo, hi)
        ids.view(-1)[draw(st.integers(0, ids.numel() - 1))] = draw(st.integers(lo, hi))
    return ids.to(dtype)


@st.composite
def padding_masks(draw, b, n):
    kind = draw(st.sampled_from(["none", "random", "all padding row", "all padding", "wrong shape", "float", "list"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    if kind == "none":
        return None
    mask = torch.rand(b, n, generator=g) < 0.3
    if kind == "all padding row" and b:
        mask[0] = True
    elif kind == "all padding":
        mask[:] = True
    elif kind == "wrong shape":
        mask = torch.zeros(b, n + 1, dtype=torch.bool)
    elif kind == "float":
        mask = mask.float()
    elif kind == "list":
        mask = mask.tolist()
    return mask


INPUT_NAMES = ("src", "tgt", "src_key_padding_mask", "tgt_key_padding_mask", "max_len", "vocab")


@FAST
@given(data=st.data(), pe=st.sampled_from(ALL_TYPES), b=st.integers(0, 3))
def test_forward_inputs(data, pe, b):
    """Wrong dtypes, shapes, ranges, empty batches, all-padding rows, lengths beyond a learned table."""
    model = _model(pe)
    src, tgt = data.draw(token_tensors(b)), data.draw(token_tensors(b))
    n_src = src.shape[-1] if src.dim() else 0
    n_tgt = tgt.shape[-1] if tgt.dim() else 0
    src_mask, tgt_mask = data.draw(padding_masks(b, n_src)), data.draw(padding_masks(b, n_tgt))
    with torch.no_grad():
        out, err = works_or_names(
            lambda: model(src, tgt, src_key_padding_mask=src_mask, tgt_key_padding_mask=tgt_mask), *INPUT_NAMES
        )
    if out is not None:
        _sane(out, tgt.shape[0], n_tgt)


_LMS: dict[str, torch.nn.Module] = {}


@FAST
@given(pe=st.sampled_from(ALL_TYPES), tokens=token_tensors(2))
def test_causal_lm_inputs(pe, tokens):
    """The long-context lesson's decoder-only model: the same contract for its one input."""
    from posenc_lib.models.causal_lm import CausalLM

    if pe not in _LMS:
        torch.manual_seed(0)
        extra = {"max_len": 8} if pe == "learned" else {}
        _LMS[pe] = CausalLM(VOCAB, pe, d_model=8, n_heads=2, num_layers=1, dim_feedforward=8, **extra).eval()
    with torch.no_grad():
        out, err = works_or_names(lambda: _LMS[pe](tokens), "tokens", "max_len")
    if out is not None:
        _sane(out, tokens.shape[0], tokens.shape[1])


@pytest.mark.parametrize("pe", ALL_TYPES)
def test_named_edge_cases(pe):
    """The cases the draws above should meet, made certain for every scheme."""
    model, src, tgt = _model(pe), _tokens(2, 5), _tokens(2, 4, seed=1)
    with torch.no_grad():
        _sane(model(src[:0], tgt[:0]), 0, 4)  # an empty batch
        pad_row = torch.zeros(2, 5, dtype=torch.bool)
        pad_row[1] = True  # one source row is nothing but padding
        _sane(model(src, tgt, src_key_padding_mask=pad_row, tgt_key_padding_mask=pad_row[:, :4]), 2, 4)
        cases = [
            ((src.float(), tgt), {}, TypeError, r"src must hold integer token ids"),
            ((src, tgt[:1]), {}, ValueError, r"tgt has batch size 1"),
            ((src[:, :0], tgt), {}, ValueError, r"src must hold at least one token"),
            ((torch.tensor([[1, 25]]), tgt[:1]), {}, ValueError, r"src holds token id 25 .*vocab_size=12"),
            ((src, tgt), {"src_key_padding_mask": pad_row[:, :3]}, ValueError, r"src_key_padding_mask must have shape"),
            ((src, tgt), {"src_key_padding_mask": pad_row.float()}, TypeError, r"src_key_padding_mask must be a bool"),
            ((src, tgt), {"tgt_key_padding_mask": [[0] * 4] * 2}, TypeError, r"tgt_key_padding_mask must be a bool"),
        ]
        if pe == "learned":  # 8 rows: a 9-token source has no row for position 8
            cases.append(((_tokens(2, 9), tgt), {}, ValueError, r"max_len=8"))
        for args, kw, kind, match in cases:
            with pytest.raises(kind, match=match):
                model(*args, **kw)


@FAST
@given(pe=st.sampled_from(ALL_TYPES), src=token_tensors(2), max_new=WEIRD, bos=st.integers(-2, VOCAB + 2))
def test_greedy_decode_inputs(pe, src, max_new, bos):
    model = _model(pe)
    ys, err = works_or_names(
        lambda: greedy_decode(model, src, max_new_tokens=max_new, bos_id=bos, eos_id=2),
        "src", "max_new_tokens", "bos_id", "max_len", "vocab_size=12",
    )
    if ys is not None:
        assert ys.shape[0] == src.shape[0] and ys.dtype == torch.long and (ys[:, 0] == bos).all()


@FAST
@given(pe=st.sampled_from(["none", "rope", "learned"]), src=token_tensors(2), beam=WEIRD, bos=st.integers(-2, VOCAB + 2))
def test_beam_search_inputs(pe, src, beam, bos):
    from posenc_lib.models.beam import beam_search

    ys, err = works_or_names(lambda: beam_search(_model(pe), src, max_new_tokens=3, bos_id=bos, eos_id=2, beam=beam),
                             "src", "beam", "bos_id", "max_len", "vocab_size=12")  # fmt: skip
    if ys is not None:
        assert ys.shape[0] == src.shape[0] and (ys[:, 0] == bos).all()


# -- the functions the lessons call ------------------------------------------------------------------
def _functions():
    """name -> (call taking one drawn value, the argument that value fills)."""
    import posenc_lib as P

    x = torch.randn(2, 5, 8)
    rel = torch.arange(-6, 7)
    return {
        "integer_positions": (lambda v: P.integer_positions(v), "length"),
        "normalized_positions": (lambda v: P.normalized_positions(v), "length"),
        "binary_positions": (lambda v: P.binary_positions(v), "length"),
        "binary_positions n_bits": (lambda v: P.binary_positions(8, v), "n_bits"),
        "hierarchical_positions": (lambda v: P.hierarchical_positions(torch.randn(4, 8), v), "alpha"),
        "sinusoidal_table n": (lambda v: P.sinusoidal_table(v, 8), "n_positions"),
        "sinusoidal_table dim": (lambda v: P.sinusoidal_table(4, v), "dim"),
        "sinusoidal_table base": (lambda v: P.sinusoidal_table(4, 8, v), "base"),
        "sinusoidal_table_2d": (lambda v: P.sinusoidal_table_2d(3, v, 8), "width"),
        "sinusoidal_shift_matrix": (lambda v: P.sinusoidal_shift_matrix(v, 8), "delta"),
        "apply_rope base": (lambda v: P.apply_rope(x, base=v), "base"),
        "apply_rope_complex base": (lambda v: P.apply_rope_complex(x, base=v), "base"),
        "rope_cos_sin head_dim": (lambda v: P.rope_cos_sin(torch.arange(5), v), "head_dim"),
        "rope_cos_sin base": (lambda v: P.rope_cos_sin(torch.arange(5), 8, v), "base"),
        "t5_relative_bucket num_buckets": (lambda v: P.t5_relative_bucket(rel, True, v), "num_buckets"),
        "t5_relative_bucket max_distance": (lambda v: P.t5_relative_bucket(rel, True, 32, v), "max_distance"),
        "deberta_log_bucket bucket_size": (lambda v: P.deberta_log_bucket(rel, v, 128), "bucket_size"),
        "deberta_log_bucket max_position": (lambda v: P.deberta_log_bucket(rel, 32, v), "max_position"),
        "alibi_slopes": (lambda v: P.alibi_slopes(v), "n_heads"),
        "xlnet_sinusoid d_model": (lambda v: P.xlnet_sinusoid(rel, v), "d_model"),
        "xlnet_sinusoid base": (lambda v: P.xlnet_sinusoid(rel, 8, v), "base"),
        "LearnedPositionalEmbedding max_len": (lambda v: P.LearnedPositionalEmbedding(v, 8), "max_len"),
        "LearnedPositionalEmbedding d_model": (lambda v: P.LearnedPositionalEmbedding(8, v), "d_model"),
        "set_seed": (lambda v: P.set_seed(v), "seed"),
    }


@FAST
@given(data=st.data(), value=WEIRD)
def test_lesson_functions(data, value):
    """The building blocks the notebooks call: a result without NaN/inf, or an error naming the argument."""
    name = data.draw(st.sampled_from(sorted(_functions())))
    call, arg = _functions()[name]
    out, err = works_or_names(lambda: call(value), arg)
    if isinstance(out, torch.Tensor) and out.is_floating_point():
        assert torch.isfinite(out).all(), f"{name}({value!r}) has non-finite values"


# -- experiment settings -----------------------------------------------------------------------------
def _profile_fields():
    from posenc_lib.experiments.wmt14.train import Profile

    return [f.name for f in fields(Profile) if f.name != "name"]


PROFILE_VALUES = st.one_of(
    st.sampled_from(["-3", "0", "-0.5", "1e-3", "abc", "none", "None", "true", "nan", "inf", "", "1.5", "7", "64"]),
    WEIRD,
)


@FAST
@given(profile=st.sampled_from(["smoke", "cpu", "gpu"]), data=st.data(), value=PROFILE_VALUES)
def test_profile_overrides(profile, data, value):
    """``get_profile(name, {field: value})`` (what ``--set field=value`` does) works or names the field."""
    from posenc_lib.experiments.wmt14.train import get_profile

    name = data.draw(st.sampled_from(_profile_fields() + ["bogus", "name"]))
    prof, err = works_or_names(lambda: get_profile(profile, {name: value}), name)
    if prof is not None:  # what was accepted is usable: counts, sizes and rates in range
        for f in ("d_model", "n_heads", "num_layers", "dim_feedforward", "batch_tokens", "max_steps", "warmup",
                  "log_every", "val_pairs", "beam"):  # fmt: skip
            v = getattr(prof, f)
            assert isinstance(v, int) and not isinstance(v, bool) and v >= 1, (f, v)
        assert math.isfinite(prof.lr) and prof.lr > 0 and 0 <= prof.dropout < 1


def _extrapolation_fields():
    from posenc_lib.experiments.extrapolation import ExtrapolationConfig

    return [f.name for f in fields(ExtrapolationConfig)]


@FAST
@given(data=st.data(), value=st.one_of(WEIRD, st.sampled_from([(), (4, 0), (3, 8), [4, 8], "reverse", "copy"])))
def test_extrapolation_config_fields(data, value):
    from posenc_lib.experiments.extrapolation import ExtrapolationConfig, make_batch, make_model

    name = data.draw(st.sampled_from(_extrapolation_fields()))
    extra = {"train_max_len": 4, "d_model": 8, "n_heads": 2} if name not in ("train_max_len", "d_model", "n_heads") else {}
    pairs = {"d_model": "n_heads", "n_heads": "d_model", "train_min_len": "train_max_len", "train_max_len": "train_min_len"}
    cfg, err = works_or_names(lambda: ExtrapolationConfig(**{**extra, name: value}), name, pairs.get(name, name))
    if cfg is not None:  # an accepted configuration builds its model and its batches
        model = make_model("rope", cfg)
        b = make_batch(cfg, [cfg.train_min_len, cfg.train_max_len], torch.Generator().manual_seed(0))
        longest = int((b["src"] != 0).sum(1).max())  # symbols (and an end marker, if the task adds one)
        assert b["src"].shape[0] == 2 and longest >= cfg.train_max_len and b["tgt_out"].max() < cfg.vocab_size
        assert cfg.lr > 0 and cfg.warmup >= 0 and cfg.grad_clip > 0 and 0 <= cfg.dropout < 1
        assert model.vocab_size == cfg.vocab_size


@FAST
@given(data=st.data(), value=st.one_of(WEIRD, st.sampled_from([(), (16, 0), "cpu", "cuda", "tpu", "float64"])))
def test_benchmark_config_fields(data, value):
    import dataclasses

    from benchmarks.common import BenchConfig

    name = data.draw(st.sampled_from([f.name for f in fields(BenchConfig)]))
    other = {"d_model": "n_heads", "n_heads": "d_model"}.get(name, name)
    cfg, err = works_or_names(lambda: dataclasses.replace(BenchConfig.quick(), **{name: value}), name, other)
    if cfg is not None:
        d = cfg.as_dict()
        assert all(d[k] >= 1 for k in ("batch", "repeats", "decode_repeats", "memory_length", "decode_new_tokens"))
        assert cfg.warmup >= 0 and cfg.lengths and min(cfg.lengths) >= 1 and 0 <= cfg.dropout < 1


# -- command lines -----------------------------------------------------------------------------------
def run_cli(main, argv):
    """``main(argv)`` in-process; returns (exit status, stderr lines). A traceback fails the test."""
    err, threads = io.StringIO(), torch.get_num_threads()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        finally:
            torch.set_num_threads(threads)  # an accepted --threads must not leak into the other tests
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


def assert_one_line_error(main, argv, *names):
    code, lines = run_cli(main, argv)
    assert code == 2, f"{argv}: exit status {code!r}, stderr {lines}"
    assert len(lines) == 1, f"{argv}: expected one line on stderr, got {lines}"
    assert "Traceback" not in lines[0]
    assert any(n in lines[0] for n in names), f"{argv}: {lines[0]!r} names none of {names}"


@pytest.fixture()
def bad_paths(tmp_path):
    """A file where a folder belongs, and a data folder whose train.fr.xz was cut off mid-copy."""
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a folder\n")
    data = tmp_path / "data"
    data.mkdir()
    for split in ("newstest2013", "newstest2014"):
        for lang in ("fr", "en"):
            (data / f"{split}.{lang}").write_text("une phrase\n" if lang == "fr" else "a sentence\n")
    packed = lzma.compress("".join(f"phrase {i}\n" for i in range(2000)).encode())
    (data / "train.fr.xz").write_bytes(packed[: len(packed) // 2])
    (data / "train.en.gz").write_bytes(gzip.compress("".join(f"sentence {i}\n" for i in range(2000)).encode()))
    return {"file": str(a_file), "data": str(data), "nowhere": str(tmp_path / "nowhere"), "out": str(tmp_path / "o")}


WMT14_BAD = [
    (["--profile", "huge"], "--profile"),
    (["--pe", "rotery"], "rotery"),
    (["--pe", ","], "--pe", "positional encoding"),
    (["--seeds", "a"], "--seeds"),
    (["--seeds", ","], "--seeds"),
    (["--seeds=--"], "--seeds"),  # Python 3.11's argparse hands "--" on as an empty list
    (["--direction", "de-en"], "--direction"),
    (["--source", "web"], "--source"),
    (["--source", "hub"], "--source files"),  # offline (the tests set HF_HUB_OFFLINE=1): one line, not a traceback
    (["--tokenizer", "words"], "--tokenizer"),
    (["--beam", "-2"], "beam"),
    (["--beam", "two"], "--beam"),
    (["--set", "max_steps=-3"], "max_steps"),
    (["--set", "lr=0"], "lr"),
    (["--set", "lr=abc"], "lr"),
    (["--set", "dropout=1.5"], "dropout"),
    (["--set", "batch_tokens=0"], "batch_tokens"),
    (["--set", "bogus=1"], "bogus"),
    (["--set", "max_steps"], "--set"),
    (["--threads", "-1"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--stop-after", "-1"], "--stop-after"),
    (["--jobs", "0"], "--jobs"),
    (["--data-dir", "{file}"], "a_file.txt"),
    (["--data-dir", "{nowhere}"], "nowhere"),
    (["--data-dir", "{data}"], "train.fr.xz"),
    (["--out", "{file}"], "a_file.txt", "--out"),
    (["--bogus-flag"], "--bogus-flag"),
]


@pytest.mark.parametrize("argv,names", [(a, n) for a, *n in WMT14_BAD], ids=[" ".join(a) for a, *_ in WMT14_BAD])
def test_wmt14_bad_flags(argv, names, bad_paths, monkeypatch):
    from posenc_lib.experiments.wmt14 import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    argv = [a.format(**bad_paths) for a in argv]
    out = [] if "--out" in argv else ["--out", bad_paths["out"]]
    data = [] if "--data-dir" in argv else ["--data-dir", bad_paths["nowhere"]]  # a flag that slips through fails fast
    assert_one_line_error(main, ["--profile", "smoke", *argv, *out, *data] if argv[0] != "--profile" else
                          [*argv, *out, *data], *names)  # fmt: skip


def test_wmt14_truncated_training_file_is_named(bad_paths):
    """The issue's example: a cut-off train.fr.xz gives one line naming the file and calling it damaged."""
    from posenc_lib.experiments.wmt14 import main

    code, lines = run_cli(main, ["--profile", "smoke", "--pe", "none", "--data-dir", bad_paths["data"],
                                 "--out", bad_paths["out"], "--no-progress"])  # fmt: skip
    assert code == 2 and len(lines) == 1 and "train.fr.xz: damaged xz file" in lines[0], lines


def test_wmt14_subcommands_bad_flags(bad_paths):
    from posenc_lib.experiments.wmt14 import main

    assert_one_line_error(main, ["score"], "run_dir")
    assert_one_line_error(main, ["score", bad_paths["nowhere"]], "nowhere")
    assert_one_line_error(main, ["make-data"], "--src")
    assert_one_line_error(main, ["make-data", "--src", bad_paths["data"], "--pairs", "-5",
                                 "--out", bad_paths["out"]], "pairs")  # fmt: skip
    assert_one_line_error(main, ["make-data", "--src", bad_paths["nowhere"], "--out", bad_paths["out"]], "nowhere")


EXTRAPOLATION_BAD = [
    (["--profile", "huge"], "--profile"),
    (["--pe", "rotery"], "rotery"),
    (["--pe", ","], "--pe"),
    (["--seeds", "x"], "--seeds"),
    (["--seeds", "-1"], "--seeds"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "two"], "--jobs"),
    (["--pe=--"], "--pe"),
    (["--out", "{file}"], "--out"),
    (["--bogus-flag"], "--bogus-flag"),
]


@pytest.mark.parametrize("argv,names", [(a, n) for a, *n in EXTRAPOLATION_BAD],
                         ids=[" ".join(a) for a, *_ in EXTRAPOLATION_BAD])  # fmt: skip
def test_extrapolation_bad_flags(argv, names, bad_paths):
    from posenc_lib.experiments.extrapolation import main

    argv = [a.format(**bad_paths) for a in argv]
    out = [] if "--out" in argv else ["--out", bad_paths["file"]]  # a flag that slips through fails fast
    assert_one_line_error(main, [*argv, *out, "--no-progress"], *names)


BENCH_BAD = [
    (["--only", "speed"], "--only"),
    (["--schemes", "rotery"], "--schemes"),
    (["--lengths", "0,64"], "--lengths"),
    (["--lengths", "abc"], "--lengths"),
    (["--batch", "0"], "--batch"),
    (["--memory-length", "-4"], "--memory-length"),
    (["--repeats", "0"], "--repeats"),
    (["--decode-repeats", "-1"], "--decode-repeats"),
    (["--warmup", "-1"], "--warmup"),
    (["--dropout", "1.5"], "--dropout"),
    (["--threads", "0"], "--threads"),
    (["--device", "tpu"], "--device"),
    (["--dtype", "int8"], "--dtype"),
    (["--out", "{file}"], "--out"),
]


@pytest.mark.parametrize("argv,names", [(a, n) for a, *n in BENCH_BAD], ids=[" ".join(a) for a, *_ in BENCH_BAD])
def test_benchmark_bad_flags(argv, names, bad_paths):
    from benchmarks.run import main

    argv = [a.format(**bad_paths) for a in argv]
    out = [] if "--out" in argv else ["--out", bad_paths["file"]]  # a flag that slips through fails fast
    assert_one_line_error(main, ["--quick", "--quiet", *argv, *out], *names)


def test_memory_worker_bad_flags():
    from benchmarks.memory import main

    assert_one_line_error(main, ["--worker", "rotery", "--config", "{}"], "rotery")
    assert_one_line_error(main, ["--worker", "rope", "--config", "{oops"], "--config")
    assert_one_line_error(main, ["--worker", "rope", "--config", '{"batch": 0}'], "batch")
    assert_one_line_error(main, ["--worker", "rope", "--config", "{}", "--threads", "0"], "--threads")


LONGCTX_BAD = [
    (["--profile", "huge"], "--profile"),
    (["--seeds", "x"], "--seeds"),
    (["--seeds", ","], "--seeds"),
    (["--models", "bogus"], "bogus"),
    (["--models=--"], "--models"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "two"], "--jobs"),
    (["--out", "{file}"], "--out"),
    (["--ckpt", "{file}"], "--ckpt"),
    (["--bogus-flag"], "--bogus-flag"),
]


@pytest.mark.parametrize("argv,names", [(a, n) for a, *n in LONGCTX_BAD], ids=[" ".join(a) for a, *_ in LONGCTX_BAD])
def test_longctx_bad_flags(argv, names, bad_paths, monkeypatch):
    from posenc_lib.experiments import long_context as longctx

    def slipped_through(*args, **kwargs):
        raise AssertionError(f"{argv} was accepted: training would start")

    monkeypatch.setattr(longctx, "run_all", slipped_through)
    argv = [a.format(**bad_paths) for a in argv]
    out = [] if "--out" in argv else ["--out", bad_paths["out"]]
    assert_one_line_error(longctx.main, ["--profile", "smoke", *argv, *out] if argv[0] != "--profile" else
                          [*argv, *out], *names)  # fmt: skip


def test_book_build_bad_flags(bad_paths, monkeypatch):
    import book.build

    def slipped_through(*args, **kwargs):
        raise AssertionError("accepted: the website build would start")

    monkeypatch.setattr(book.build, "build", slipped_through)
    assert_one_line_error(book.build.main, ["--bogus-flag"], "--bogus-flag")
    assert_one_line_error(book.build.main, ["--out", bad_paths["file"]], "--out")
    assert_one_line_error(book.build.main, ["--out=--"], "--out")


FLAG_TEXT = st.text(st.characters(codec="ascii", exclude_categories=["Cc"]), max_size=6)


def _valid_value(flag, text):
    from posenc_lib.experiments.extrapolation import PROFILES, run_name

    parts = [p.strip() for p in text.split(",") if p.strip()]
    if flag == "--profile":
        return text in PROFILES
    if flag == "--pe":
        try:
            return text.strip().lower() == "all" or bool([run_name(p) for p in parts])
        except ValueError:
            return False
    try:
        vals = [int(p) for p in parts] if flag == "--seeds" else [int(text)]
    except ValueError:
        return False
    return bool(vals) and all(0 <= v < 2**32 for v in vals) if flag == "--seeds" else vals[0] >= 1


@FAST
@given(flag=st.sampled_from(["--seeds", "--jobs", "--pe", "--profile"]), text=FLAG_TEXT)
def test_extrapolation_flag_values_drawn(flag, text, tmp_path_factory):
    """Any text after a flag is either valid or a one-line error naming that flag."""
    from posenc_lib.experiments.extrapolation import main

    a_file = tmp_path_factory.mktemp("x") / "f"
    a_file.write_text("")
    code, lines = run_cli(main, [f"{flag}={text}", "--out", str(a_file), "--no-progress"])
    assert code == 2 and len(lines) == 1, lines
    # a valid value gets past its check and is stopped by the next one: --out is a file
    assert ("--out" if _valid_value(flag, text) else flag) in lines[0], (flag, text, lines)


def _wmt14_main():
    from posenc_lib.experiments.wmt14 import main

    return main


def _longctx_main():
    from posenc_lib.experiments.long_context import main

    return main


DRAWN_FLAGS = {
    "wmt14": (_wmt14_main, ["--seeds", "--pe", "--jobs", "--profile", "--set", "--beam", "--threads", "--out"]),
    "longctx": (_longctx_main, ["--seeds", "--models", "--jobs", "--profile", "--out"]),
}


@FAST
@given(data=st.data(), text=FLAG_TEXT)
@pytest.mark.parametrize("cli", sorted(DRAWN_FLAGS))
def test_flag_values_drawn_never_trace_back(cli, data, text, tmp_path_factory, monkeypatch):
    """Any text after any flag: exit status 2 and one line, naming the flag or, for a value that is fine,
    the first thing that stops the run here (a data folder that does not exist, training switched off)."""
    get_main, flags = DRAWN_FLAGS[cli]
    flag = data.draw(st.sampled_from(flags))
    folder = tmp_path_factory.mktemp("cli")
    monkeypatch.chdir(folder)  # a drawn relative --out must not land in the checkout
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if cli == "longctx":
        from posenc_lib.experiments import long_context as longctx

        def stop(*args, **kwargs):
            raise SystemExit(print("stopped: accepted", file=sys.stderr) or 2)

        monkeypatch.setattr(longctx, "run_all", stop)
    safety = ["--data-dir", str(folder / "nowhere")] if cli == "wmt14" else []
    out = [] if flag == "--out" else ["--out", str(folder / "o")]
    code, lines = run_cli(get_main(), ["--profile=smoke", f"{flag}={text}", *out, *safety])
    assert code == 2 and len(lines) == 1, (flag, text, lines)
    assert "Traceback" not in lines[0]


def test_wmt14_damaged_caches_are_named(tmp_path):
    """A cut-off data cache or tokenizer file in a run folder: one line naming it and what to do."""
    from posenc_lib.experiments.wmt14 import main

    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 60), ("newstest2013", 10), ("newstest2014", 10)):
        (data / f"{split}.fr").write_text("".join(f"la phrase {split} {i}\n" for i in range(n)))
        (data / f"{split}.en").write_text("".join(f"the sentence {split} {i}\n" for i in range(n)))
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    argv = ["--profile", "smoke", "--pe", "none", "--data-dir", str(data), "--out", str(out), "--ckpt-dir", str(ckpt),
            "--no-progress", "--stop-after", "1"]  # fmt: skip
    ckpt.mkdir()
    (ckpt / "data-fr-en.pt").write_bytes(b"cut off")
    code, lines = run_cli(main, argv)
    assert code == 2 and len(lines) == 1 and "data-fr-en.pt is unreadable" in lines[0] and "delete it" in lines[0], lines
    (ckpt / "data-fr-en.pt").unlink()
    (out / "tokenizer.json").write_text('{"version": "1.0", "trunc')
    code, lines = run_cli(main, argv)
    assert code == 2 and len(lines) == 1 and "tokenizer.json is unreadable" in lines[0] and "delete it" in lines[0], lines


# -- the command lines' file-system behaviour: nothing a user has is destroyed ----------------------
#: what a hurried user might already have in the folder a command is pointed at
USER_FILES = ("notes.txt", "src/mine.md", "html/index.html", "doctrees/x", "warnings.txt", "train.json", "table.md",
              "cost.png", "config.json", "train.fr", "MANIFEST.json", "none_seed0.json", "nope_seed0.json",
              "decode_profile.json", "none-seed0/result.json")
FOLDER_STATES = st.one_of(
    st.sampled_from([("absent", ()), ("file", ()), ("empty", ()), ("stale_lock", ()), ("live_lock", ())]),
    st.tuples(st.just("holds"), st.lists(st.sampled_from(USER_FILES), min_size=1, max_size=3, unique=True)),
)


def _make_state(out, state, files):
    """Put ``out`` in a drawn state; returns the lock file's content if a live process holds it."""
    import json as _json

    from posenc_lib.files import LOCK_NAME, process_start

    if state == "file":
        out.write_text("a file where a folder belongs\n")
    elif state != "absent":
        out.mkdir()
    for name in files:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(f"the user's own {name}\n")
    if state in ("stale_lock", "live_lock"):
        pid = os.getppid() if state == "live_lock" else 2**22 + 12345  # no such process (above Linux's pid_max)
        text = _json.dumps({"pid": pid, "start": process_start(pid) if state == "live_lock" else None,
                            "since": "earlier", "command": "another command"})
        (out / LOCK_NAME).write_text(text)
        return text if state == "live_lock" else None
    return None


def _snapshot(root):
    from posenc_lib.files import LOCK_NAME

    if not root.exists():
        return {}
    if root.is_file():
        return {".": root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != LOCK_NAME}


_CORPUS: list = []


def _file_system_clis(tmp, monkeypatch):
    """Each command line that writes a folder, with its expensive work stubbed out: ``(main, argv before --out)``."""
    import benchmarks.run as br
    import book.build as bb
    from posenc_lib.experiments import cope_counting as cc
    from posenc_lib.experiments import extrapolation as ex
    from posenc_lib.experiments import inside as ins
    from posenc_lib.experiments import long_context as lc
    from posenc_lib.experiments import long_context_extra as extra
    from posenc_lib.experiments import long_context_scaled as lcs
    from posenc_lib.experiments import passkey_trained as pkt
    from posenc_lib.experiments import rope_variants as rv
    from posenc_lib.experiments import sliding_window as sw
    from posenc_lib.experiments.wmt14 import main as wmt14_main
    from posenc_lib.experiments.wmt14.data import read_parallel
    from posenc_lib.files import atomic_write_json

    src = tmp / "corpus"
    if not src.exists():
        src.mkdir()
        if not _CORPUS:  # reading the shipped training file takes seconds: once per session
            _CORPUS.extend(read_parallel(bb.ROOT / "data" / "wmt14-fr-en", "heldout", 12))
        for lang, lines in zip(("fr", "en"), _CORPUS):
            (src / f"train.{lang}").write_text("\n".join(lines) + "\n")

    def finish(pe, cfg, seed, out, progress):  # what a finished model writes, without the training
        from dataclasses import asdict
        import json as _json

        atomic_write_json(ex.result_path(out, pe, seed), {"config": _json.loads(_json.dumps(asdict(cfg)))})
        return "done"

    def config_of(cfg):
        from dataclasses import asdict
        import json as _json

        return _json.loads(_json.dumps(asdict(cfg)))

    def extra_run(name, out):  # long_context_extra's model, without the training
        path = Path(out) / f"{name}_seed0.json"
        if not extra.finished(path, lc.COURSE):
            atomic_write_json(path, {"config": config_of(lc.COURSE)})
        return path

    monkeypatch.setattr(ex, "train_and_write", finish)
    monkeypatch.setattr(lc, "pretrain", lambda name, seed, cfg, out, ckpt: "done")
    monkeypatch.setattr(rv, "train_one", lambda name, seed, cfg, out: atomic_write_json(
        lc.result_path(out, name, seed), {"config": config_of(cfg)}) or "done")
    monkeypatch.setattr(cc, "train_one", lambda name, seed, cfg, out: atomic_write_json(
        cc.result_path(out, name, seed), {"config": cc.config_record(cfg)}) or "done")
    monkeypatch.setattr(cc, "write_summary", lambda out: None)
    monkeypatch.setattr(ins, "train_one", lambda name, seed, cfg, out: atomic_write_json(
        ins.result_path(out, name, seed), {"config": config_of(cfg)}) or "done")
    monkeypatch.setattr(extra, "run", extra_run)
    monkeypatch.setattr(pkt, "train_one", lambda name, seed, pk, out: atomic_write_json(
        pkt.result_path(out, name, seed), {"config": config_of(pk.lm()), "passkey_training": config_of(pk)}) or "done")
    monkeypatch.setattr(lcs, "readings", lambda seed, cfg, out, ckpt, trials: atomic_write_json(
        lcs.result_path(out, "readings", seed), {"config": config_of(cfg), "trials": trials}) or "done")
    monkeypatch.setattr(sw, "read_model", lambda name, seed, cfg, out, ckpt: atomic_write_json(
        sw.result_path(out, name, seed), {"config": config_of(cfg)}) or "done")
    monkeypatch.setattr(br, "bench_train", lambda schemes, cfg, quiet: {"lengths": {}})
    monkeypatch.setattr(br, "write_report", lambda out: (out / "table.md").write_text("report\n"))
    monkeypatch.setattr(bb.subprocess, "run", lambda cmd, **kw: Path(cmd[cmd.index("-d") + 3]).mkdir(parents=True))
    monkeypatch.setattr(bb, "write_sources", lambda out: (out / "src").mkdir(exist_ok=True) or out / "src")
    # every file a run reads is there (checked before any work), but train.fr.xz is damaged: the run stops
    # with one line when it reads the data, after it has met the folder
    bad = tmp / "bad-data"
    bad.mkdir(exist_ok=True)
    for split in ("train", "newstest2013", "newstest2014"):
        (bad / f"{split}.en").write_text("one\n")
        (bad / f"{split}.fr").write_text("un\n")
    (bad / "train.fr").unlink()
    (bad / "train.fr.xz").write_bytes(b"not xz")
    return {
        "wmt14": (wmt14_main, ["--profile", "smoke", "--pe", "none", "--data-dir", str(bad)]),
        "make-data": (wmt14_main, ["make-data", "--src", str(src), "--pairs", "5"]),
        "calibrate": (wmt14_main, ["calibrate", "--profile", "smoke", "--pe", "none", "--data-dir", str(bad),
                                   "--source", "files"]),
        "extrapolation": (ex.main, ["--pe", "none", "--seeds", "0", "--no-progress"]),
        "long_context": (lc.main, ["--models", "nope", "--seeds", "0", "--no-finetune", "--ckpt", str(tmp / "ck")]),
        "long_context_extra": (extra.main, ["sinusoidal"]),
        "long_context_scaled": (lcs.main, ["--seeds", "0", "--finetunes", "none", "--ckpt", str(tmp / "ck")]),
        "sliding_window": (sw.main, ["--models", "nope", "--seeds", "0", "--ckpt", str(tmp / "ck")]),
        "passkey_trained": (pkt.main, ["--models", "nope", "--seeds", "0"]),
        "rope_variants": (rv.main, ["--models", "nope", "--seeds", "0"]),
        "cope_counting": (cc.main, ["--models", "none", "--seeds", "0"]),
        "inside": (ins.main, ["--models", "nope", "--seeds", "0"]),
        "benchmarks": (br.main, ["--only", "train", "--schemes", "none", "--threads", "1", "--quiet"]),
        "book": (bb.main, []),
    }


from pathlib import Path  # noqa: E402 (used by the stubs above)

FS_CLIS = ("wmt14", "make-data", "calibrate", "extrapolation", "long_context", "long_context_extra", "long_context_scaled",
           "sliding_window", "passkey_trained", "rope_variants", "cope_counting",
           "inside", "benchmarks", "book")


@settings(max_examples=_N or 12, deadline=None, derandomize=not _N,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(folder=FOLDER_STATES)
@pytest.mark.parametrize("cli", FS_CLIS)
def test_command_lines_never_destroy_what_the_folder_holds(cli, folder, tmp_path_factory, monkeypatch):
    """Any command that writes a folder, pointed at a folder in a drawn state (missing, a file, empty, holding
    the user's files, locked by a living process or by a dead one): it works or stops with one line, every file
    that was there is byte for byte what it was, and it leaves no lock behind (a living holder's stays)."""
    from posenc_lib.files import LOCK_NAME

    tmp = tmp_path_factory.mktemp("fs")
    monkeypatch.chdir(tmp)
    main, argv = _file_system_clis(tmp, monkeypatch)[cli]
    out = tmp / "out"
    live = _make_state(out, *folder)
    before = _snapshot(out)
    code, lines = run_cli(main, [*argv, "--out", str(out)])
    lines = [line for line in lines if not line.startswith("note:")]  # a dead holder's lock taken over
    code = 0 if isinstance(code, dict) else code  # benchmarks.run's main returns what it wrote
    assert code in (0, None, 2), (cli, folder, code, lines)
    if code == 2:
        assert len(lines) == 1 and "Traceback" not in lines[0], (cli, folder, lines)
    after = _snapshot(out)
    assert {k: v for k, v in after.items() if k in before} == before, (cli, folder, lines)
    lock = out / LOCK_NAME
    assert (lock.read_text() == live) if live else not lock.exists(), (cli, folder)
    if folder[0] == "live_lock":
        assert code == 2 and "being written by another process" in lines[0], (cli, lines)
    if folder[0] == "file":
        assert code == 2, (cli, lines)


@pytest.mark.parametrize("cli", FS_CLIS)
def test_command_lines_name_an_out_under_a_file(cli, tmp_path, monkeypatch):
    """--out pointed under a file (``afile/sub``): one line naming the path and the file, the file kept; every
    command that writes a folder ended in a raw NotADirectoryError from mkdir."""
    monkeypatch.chdir(tmp_path)
    main, argv = _file_system_clis(tmp_path, monkeypatch)[cli]
    a_file = tmp_path / "afile"
    a_file.write_text("the user's own file\n")
    code, lines = run_cli(main, [*argv, "--out", str(a_file / "sub")])
    assert code == 2 and len(lines) == 1, (cli, code, lines)
    assert f"{a_file / 'sub'} lies under {a_file}, which is a file" in lines[0], (cli, lines)
    assert a_file.read_text() == "the user's own file\n"
