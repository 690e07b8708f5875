"""Edge cases of the model, the decoders and the notebook setup: a clear error, never a silent wrong value."""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch

from posenc_lib import build_model, greedy_decode
from posenc_lib.course import notebook
from posenc_lib.models.beam import beam_search

TINY = dict(d_model=8, n_heads=2, num_layers=1, dim_feedforward=8, dropout=0.0)
V = 12
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _model(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model("rope", V, **TINY, **kw).eval()


# -- the loss of a batch without target tokens ------------------------------------------------------
def test_loss_of_an_all_padding_target_is_an_error_naming_pad_id():
    m = _model(pad_id=3)
    src = torch.randint(4, V, (2, 5))
    tgt_in = torch.randint(4, V, (2, 4))
    with pytest.raises(ValueError, match=r"no target tokens: every target position is padding \(pad_id=3\)"):
        m.loss(src, tgt_in, torch.full((2, 4), 3))
    with pytest.raises(ValueError, match=r"no target tokens"):  # label smoothing averages over the same tokens
        m.loss(src, tgt_in, torch.full((2, 4), 3), label_smoothing=0.1)


def test_loss_with_one_real_target_token_is_finite_and_has_a_gradient():
    m = _model(pad_id=0)
    src, tgt_in = torch.randint(1, V, (2, 5)), torch.randint(1, V, (2, 4))
    tgt_out = torch.zeros(2, 4, dtype=torch.long)
    tgt_out[1, 2] = 7  # one token in the whole batch
    loss = m.loss(src, tgt_in, tgt_out)
    assert torch.isfinite(loss) and loss.item() > 0
    # the mean over that one token: the cross-entropy of position (1, 2) alone
    logp = torch.log_softmax(m(src, tgt_in)[1, 2].float(), -1)
    assert torch.allclose(loss, -logp[7], atol=1e-6)
    loss.backward()
    assert m.embed.weight.grad is not None and torch.isfinite(m.embed.weight.grad).all()


def test_loss_reads_the_targets_only_on_the_host(monkeypatch):
    """On an accelerator the check would stall the device each step: it is skipped there."""
    import posenc_lib.models.seq2seq as model_module

    m = _model(pad_id=0)
    src, tgt_in = torch.randint(1, V, (1, 5)), torch.randint(1, V, (1, 4))
    monkeypatch.setattr(model_module, "on_host", lambda t: False)
    m.loss(src, tgt_in, torch.zeros(1, 4, dtype=torch.long))  # no ValueError: no value was read


def test_loss_rejects_a_target_that_is_not_a_token_tensor():
    m = _model()
    src, tgt_in = torch.randint(1, V, (1, 5)), torch.randint(1, V, (1, 4))
    with pytest.raises(TypeError, match=r"tgt_out must hold integer token ids"):
        m.loss(src, tgt_in, tgt_in.float())


# -- norm_first / tie_embeddings must be booleans ---------------------------------------------------
@pytest.mark.parametrize("name", ["norm_first", "tie_embeddings"])
@pytest.mark.parametrize("value", ["no", "False", 1, 0, None, 1.0])
def test_boolean_model_options_refuse_truthy_and_falsy_stand_ins(name, value):
    with pytest.raises(TypeError, match=rf"^{name} must be True or False, got {re.escape(repr(value))}$"):
        build_model("rope", V, **TINY, **{name: value})


def test_boolean_model_options_take_true_and_false():
    post = _model(norm_first=False, tie_embeddings=False)
    assert isinstance(post.enc_norm, torch.nn.Identity) and post.out_proj is not None
    pre = _model(norm_first=True, tie_embeddings=True)
    assert isinstance(pre.enc_norm, torch.nn.LayerNorm) and pre.out_proj is None
    assert pre.config["norm_first"] is True and post.config["tie_embeddings"] is False


# -- token ids of the decoders ----------------------------------------------------------------------
SRC = torch.randint(3, V, (2, 4), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("bad", [V, V + 5, -1])
@pytest.mark.parametrize("name", ["pad_id", "bos_id", "eos_id"])
def test_greedy_decode_ids_outside_the_vocabulary(name, bad):
    ids = dict(bos_id=1, eos_id=2, pad_id=0) | {name: bad}
    with pytest.raises(ValueError, match=rf"{name} must be an integer in \[0, {V - 1}\], got {bad}: "
                                         rf"a token id in \[0, vocab_size\) with vocab_size={V}"):  # fmt: skip
        greedy_decode(_model(), SRC, max_new_tokens=3, **ids)


@pytest.mark.parametrize("bad", ["0", 1.0, True])
def test_greedy_decode_pad_id_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match=rf"pad_id must be an integer in \[0, {V - 1}\], got {re.escape(repr(bad))}"):
        greedy_decode(_model(), SRC, max_new_tokens=3, bos_id=1, eos_id=2, pad_id=bad)


@pytest.mark.parametrize("bad", [V, -1, "0"])
@pytest.mark.parametrize("name", ["pad_id", "bos_id", "eos_id"])
def test_beam_search_ids_outside_the_vocabulary(name, bad):
    """Beam search refuses bad token ids with the same errors and words as greedy decoding."""
    ids = dict(bos_id=1, eos_id=2, pad_id=0) | {name: bad}
    error = TypeError if isinstance(bad, str) else ValueError
    with pytest.raises(error, match=rf"{name} must be an integer in \[0, {V - 1}\], got {re.escape(repr(bad))}"):
        beam_search(_model(), SRC, max_new_tokens=3, beam=2, **ids)
    with pytest.raises(error, match=rf"{name} must be an integer in \[0, {V - 1}\], got {re.escape(repr(bad))}"):
        greedy_decode(_model(), SRC, max_new_tokens=3, **ids)


def test_decoders_fill_finished_rows_with_a_valid_pad_id():
    m = _model(seed=2)  # an untrained model whose two rows start with different tokens
    free = greedy_decode(m, SRC, max_new_tokens=6, bos_id=1, eos_id=None)
    eos = int(free[0, 1])  # row 0's first token ends it; row 1 goes on (checked below)
    assert eos not in free[1].tolist()
    ys = greedy_decode(m, SRC, max_new_tokens=6, bos_id=1, eos_id=eos, pad_id=V - 1)
    assert ys.shape[1] >= 3 and ys[0, 1] == eos and (ys[0, 2:] == V - 1).all()
    assert ys.min() >= 0 and ys.max() < V
    assert beam_search(m, SRC, max_new_tokens=4, bos_id=1, eos_id=eos, beam=2, pad_id=V - 1).max() < V


def test_greedy_decode_without_an_end_token_decodes_every_step():
    ys = greedy_decode(_model(), SRC, max_new_tokens=5, bos_id=1, eos_id=None, pad_id=0)
    assert ys.shape == (2, 6) and (ys[:, 0] == 1).all()


# -- notebook.setup(threads=...) --------------------------------------------------------------------
@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("bad", [0, -2])
def test_setup_refuses_fewer_than_one_thread(bad, keep_threads):
    with pytest.raises(ValueError, match=rf"threads must be an integer >= 1, 'auto' or None, got {bad}"):
        notebook.setup(seed=0, threads=bad)


@pytest.mark.parametrize("bad", ["2", "all", 2.0, True, [2]])
def test_setup_refuses_a_thread_count_that_is_not_an_integer(bad, keep_threads):
    before = torch.get_num_threads()
    msg = rf"threads must be an integer >= 1, 'auto' or None, got {re.escape(repr(bad))}"
    with pytest.raises(TypeError, match=msg):
        notebook.setup(seed=0, threads=bad)
    assert torch.get_num_threads() == before


def test_setup_warns_when_it_uses_fewer_threads_than_asked(monkeypatch, keep_threads):
    monkeypatch.setattr(notebook, "available_cores", lambda: 2)
    with pytest.warns(UserWarning, match=r"setup\(threads=5\) asks for more threads than the 2 available core\(s\); "
                                         r"using 2") as record:  # fmt: skip
        notebook.setup(seed=0, threads=5)
    assert torch.get_num_threads() == 2
    assert record[0].filename == __file__  # points at the caller's line


@pytest.mark.parametrize(("cores", "threads", "used"), [(1, "auto", 1), (16, "auto", 2), (4, 3, 3), (1, 1, 1)])
def test_setup_takes_a_fitting_count_silently(monkeypatch, keep_threads, cores, threads, used):
    monkeypatch.setattr(notebook, "available_cores", lambda: cores)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        notebook.setup(seed=0, threads=threads)
    assert torch.get_num_threads() == used


def test_setup_with_threads_none_leaves_torch_alone(keep_threads):
    torch.set_num_threads(1)
    notebook.setup(seed=0, threads=None)
    assert torch.get_num_threads() == 1


def _notebook_setup_calls():
    calls = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                calls += [(path.name, c) for c in re.findall(r"\bsetup\([^)]*\)", "".join(cell["source"]))]
    return calls


def test_every_lesson_sets_up_without_a_warning_even_on_one_core(monkeypatch, keep_threads):
    """A warning would land in a lesson's stored output and fail nbval."""
    calls = _notebook_setup_calls()
    assert len(calls) >= 13
    for cores in (1, 2):
        monkeypatch.setattr(notebook, "available_cores", lambda: cores)
        for name, call in calls:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                eval(call, {"setup": notebook.setup})  # noqa: S307 -- the lesson's own line
            assert 1 <= torch.get_num_threads() <= cores, name


@pytest.mark.parametrize("shape", [(0, 9), (2, 1), (8,)])
def test_causal_lm_loss_refuses_windows_without_a_next_character(shape):
    from posenc_lib.models.causal_lm import CausalLM

    lm = CausalLM(20, "rope", d_model=16, n_heads=2, num_layers=1, dim_feedforward=32)
    with pytest.raises(ValueError, match=r"windows must be \(batch >= 1, T \+ 1 >= 2\).*got shape"):
        lm.loss(torch.zeros(shape, dtype=torch.long))
    assert torch.isfinite(lm.loss(torch.randint(0, 20, (2, 5))))  # the smallest valid batch has a finite loss


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_atomic_writes_give_the_mode_open_would_give(tmp_path, mask):
    from posenc_lib.files import atomic_torch_save, atomic_write_json

    old = os.umask(mask)
    try:
        atomic_write_json(tmp_path / "r.json", {"a": 1})
        atomic_torch_save({"w": torch.zeros(2)}, tmp_path / "m.pt")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    want = (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert want == 0o666 & ~mask
    for name in ("r.json", "m.pt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == want, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "plain.txt", "r.json"]  # no temporary left
