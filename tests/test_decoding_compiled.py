"""``greedy_decode(compile=True)``: the cached step compiled as one graph gives the uncompiled step's tokens.

Every scheme is traced by TorchDynamo and its graph run by the eager kernels (the ``eager`` backend, a few
seconds per scheme); one scheme, XLNet (the one whose step also fills a table it keeps), goes on through
AOTAutograd's functional graph (``aot_eager``, tens of seconds), and one through inductor, the backend users
get (tens of seconds to compile).  The decoding benchmark checks every scheme with inductor at the
benchmark's size (``identical_compiled`` in benchmarks/results/batches/decode.json).
"""
from __future__ import annotations

import pytest
import torch

from posenc_lib import PE_TYPES, build_model, greedy_decode
from posenc_lib.models import decoding

V = 40
TINY = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)


def _model(pe: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    return build_model(pe, V, **TINY, **kw).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=g)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[1, 5:] = True  # a padded source row
    src[1, 5:] = 0
    return src, mask


def _graphs_of_step() -> int:
    """Graphs compiled since the last ``torch._dynamo.reset()``."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


#: the scheme whose step also goes through AOTAutograd's functional graph (``aot_eager``)
FUNCTIONAL = "xlnet"


@pytest.fixture
def backend(request, monkeypatch):
    """The compile backend of the decoding step for one test (``eager`` unless the test is parametrized)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    name = getattr(request, "param", "eager")
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", name)
    yield name
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "pe, backend", [(pe, "aot_eager" if pe == FUNCTIONAL else "eager") for pe in PE_TYPES], indirect=["backend"]
)
def test_compiled_step_gives_the_uncompiled_tokens(pe, backend):
    model = _model(pe, max_len=64) if pe == "learned" else _model(pe)
    src, mask = _batch()
    for eos in (None, 2):  # every step decoded; rows ending at different steps (the loop stops when all have)
        kw = dict(max_new_tokens=20, bos_id=1, eos_id=eos, src_key_padding_mask=mask)
        want = greedy_decode(model, src, **kw)
        got = greedy_decode(model, src, compile=True, **kw)
        assert torch.equal(got, want), (pe, eos)
        assert torch.equal(greedy_decode(model, src, compile=True, **kw), want)  # the compiled graphs again
    # two graphs: the first step (an empty cache) and every later one (buffers sized for the whole loop)
    assert 0 < _graphs_of_step() <= 2


@pytest.mark.parametrize("pe", PE_TYPES)
def test_the_compiled_step_is_one_graph_without_breaks(pe):
    """No graph break: nothing in the step reads a value back (the checks stay outside, in greedy_decode)."""
    import torch._dynamo

    model = _model(pe, max_len=64) if pe == "learned" else _model(pe)
    src, _ = _batch()
    with torch.no_grad():
        memory = model.encode(src)
        cache = model.new_cache(capacity=12)
        done = torch.zeros(3, dtype=torch.bool)
        inp = torch.ones(3, 1, dtype=torch.long)
        for _ in range(3):
            inp = decoding.greedy_step(model, inp, memory, None, cache, done, 0)[:, None]
        explained = torch._dynamo.explain(decoding.greedy_step)(model, inp, memory, None, cache, done, 0)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_compiled_step_with_inductor_gives_the_uncompiled_tokens():
    """The backend users get: C++ kernels and wrapper, compiled here once (tens of seconds on 2 cores)."""
    model = _model("rope", seed=3)
    src, mask = _batch()
    kw = dict(max_new_tokens=12, bos_id=1, eos_id=2, src_key_padding_mask=mask)
    want = greedy_decode(model, src, **kw)
    assert torch.equal(greedy_decode(model, src, compile=True, **kw), want)
    assert torch.equal(greedy_decode(model, src, compile=True, **kw), want)


def test_a_learned_table_too_short_is_refused_as_without_compiling(backend):
    model = _model("learned", max_len=6)
    src, _ = _batch()
    src = src[:, :5]
    for compile in (False, True):
        with pytest.raises(ValueError, match="beyond the learned table"):
            greedy_decode(model, src, max_new_tokens=10, bos_id=1, eos_id=None, compile=compile)


def test_a_failing_compiler_falls_back_to_the_uncompiled_step_with_a_warning(monkeypatch):
    from torch._inductor.exc import CppCompileError

    def broken(*args, **kwargs):
        raise CppCompileError(["c++", "step.cpp"], "c++: command not found")

    model = _model("none")
    monkeypatch.setitem(decoding.COMPILED_STEPS, model, broken)
    src, mask = _batch()
    kw = dict(max_new_tokens=8, bos_id=1, eos_id=2, src_key_padding_mask=mask)
    want = greedy_decode(model, src, **kw)
    with pytest.warns(UserWarning, match="torch.compile failed .*CppCompileError.*decoding without it"):
        assert torch.equal(greedy_decode(model, src, compile=True, **kw), want)


def test_an_error_of_the_model_is_not_hidden_by_the_fallback(monkeypatch):
    def wrong(*args, **kwargs):
        raise RuntimeError("shape mismatch in the model")

    model = _model("none")
    monkeypatch.setitem(decoding.COMPILED_STEPS, model, wrong)
    src, _ = _batch()
    with pytest.raises(RuntimeError, match="shape mismatch in the model"):
        greedy_decode(model, src, max_new_tokens=4, bos_id=1, eos_id=2, compile=True)


@pytest.mark.parametrize("bad, error, match", [
    ("yes", TypeError, "compile must be True or False, got 'yes'"),
    (1, TypeError, "compile must be True or False, got 1"),
])
def test_compile_must_be_a_bool(bad, error, match):
    src, _ = _batch()
    with pytest.raises(error, match=match):
        greedy_decode(_model("none"), src, max_new_tokens=2, bos_id=1, eos_id=2, compile=bad)


def test_compile_needs_the_cache():
    src, _ = _batch()
    with pytest.raises(ValueError, match="compile=True needs use_cache=True"):
        greedy_decode(_model("none"), src, max_new_tokens=2, bos_id=1, eos_id=2, use_cache=False, compile=True)


@pytest.mark.parametrize("pe", ["xlnet", "t5", "rope"])
def test_a_cache_given_a_capacity_decodes_past_it_as_one_without(pe):
    """The capacity only sizes the buffers and tables at the first step; a longer decoding grows them as usual."""
    model = _model(pe)
    src, mask = _batch()
    with torch.no_grad():
        memory = model.encode(src, mask)
        tokens = torch.randint(4, V, (3, 10), generator=torch.Generator().manual_seed(2))
        whole = model.decode(tokens, memory, memory_key_padding_mask=mask)
        for capacity in (None, 4, 11):
            cache = model.new_cache(capacity)
            steps = [model.decode(tokens[:, i : i + 1], memory, memory_key_padding_mask=mask, cache=cache)
                     for i in range(10)]
            torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_a_bad_capacity_is_refused(bad):
    with pytest.raises(ValueError, match=f"capacity must be a positive integer, got {bad!r}"):
        _model("none").new_cache(bad)
