"""A padded batch as variable-length sequences (posenc_lib/attention/varlen.py): the cuts, the reference kernel, and a
whole model that takes the path where the padded path took its boolean masks, with the same logits, loss and
gradients for every scheme the path serves.  On CPU the path runs the reference kernel, the function of flash's
variable-length kernel; tests/test_cuda.py runs flash's own on a GPU."""
import pytest
import torch

from posenc_lib import build_model, greedy_decode, set_seed
from posenc_lib.attention import backends, varlen
from posenc_lib.schemes.registry import registered_schemes

V = 50
SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)
#: the schemes that add nothing to the scores: the ones the path serves (what they declare, not their names)
SERVED = tuple(pe for pe, info in registered_schemes().items()
               if not (info.cls.adds_bias or info.cls.adds_scores or info.cls.adds_values))
OTHERS = tuple(pe for pe in registered_schemes() if pe not in SERVED)


@pytest.fixture
def varlen_on():
    old = backends.TUNING
    backends.tune(varlen=True)
    yield
    backends.TUNING = old


def spy_backends(monkeypatch) -> list[str]:
    seen, real = [], backends.select_backend

    def spy(*a, **kw):
        chosen = real(*a, **kw)
        seen.append(chosen.backend)
        return chosen

    monkeypatch.setattr(backends, "select_backend", spy)
    return seen


def padded_batch(seed=0):
    """Sources and targets of different lengths (one of each unpadded), pads at the end, and the targets' next ids."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, V, (4, 11), generator=g), torch.randint(3, V, (4, 8), generator=g)
    for row, (s, t) in enumerate([(11, 5), (7, 8), (3, 2), (1, 6)]):
        src[row, s:] = 0
        tgt[row, t:] = 0
    out = torch.cat((tgt[:, 1:], torch.zeros(4, 1, dtype=torch.long)), 1)
    return src, tgt, out, src == 0, tgt == 0


def test_served_schemes_are_the_ones_without_score_terms():
    assert {"none", "sinusoidal", "learned", "rope", "xpos"} <= set(SERVED)
    assert not {"t5", "alibi", "shaw", "deberta", "xlnet", "cope"} & set(SERVED)


def test_rows_are_cut_into_tokens_and_pads():
    cu = varlen.row_segments(torch.tensor([5, 3, 0, 1]), 5)
    assert cu.dtype == torch.int32
    assert cu.tolist() == [0, 5, 5, 8, 10, 10, 15, 16, 20]


def test_reference_is_attention_within_each_sequence():
    """Against a block-diagonal boolean mask: empty sequences, a sequence with queries and no keys (zeros), causal."""
    g = torch.Generator().manual_seed(0)
    cu_q, cu_k = torch.tensor([0, 4, 4, 6, 9]), torch.tensor([0, 3, 5, 5, 9])
    q, k, v = (torch.randn(n, 2, 8, generator=g) for n in (9, 9, 9))
    seq_q = torch.repeat_interleave(torch.arange(4), cu_q.diff())
    seq_k = torch.repeat_interleave(torch.arange(4), cu_k.diff())
    allowed = seq_q[:, None] == seq_k[None, :]
    for causal in (False, True):
        got = varlen.reference(q, k, v, cu_q, cu_k, causal=causal, scale=0.3)
        if causal:  # each sequence's own positions
            pos_q, pos_k = torch.arange(9) - cu_q[seq_q], torch.arange(9) - cu_k[seq_k]
            allowed_c = allowed & (pos_k[None, :] <= pos_q[:, None])
        else:
            allowed_c = allowed
        s = torch.einsum("qhd,khd->hqk", q, k) * 0.3
        p = torch.softmax(s.masked_fill(~allowed_c, float("-inf")), -1).nan_to_num(0.0)
        want = torch.einsum("hqk,khd->qhd", p, v)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert got[6:9].abs().sum() > 0 and not got[4:6].any()  # sequence 2: queries, no keys


@pytest.mark.parametrize("pe", SERVED)
def test_model_on_the_variable_length_path_equals_the_padded_path(pe, monkeypatch):
    """Logits at every target token, the loss, the encoder's memory at every source token, and every gradient."""
    set_seed(0)
    model = build_model(pe, V, **SMALL)
    src, tgt, out, src_pad, tgt_pad = padded_batch()

    def run():
        model.zero_grad()
        masks = dict(src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)
        loss = model.loss(src, tgt, out, **masks)
        loss.backward()
        with torch.no_grad():
            logits, memory = model(src, tgt, **masks), model.encode(src, src_pad)
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return loss.detach(), logits, memory, grads

    ref = run()
    seen = spy_backends(monkeypatch)
    with monkeypatch.context() as patch:
        patch.setattr(backends, "TUNING", backends.AttentionTuning(varlen=True))
        got = run()
    # the encoder's self-attention, the decoder's and the cross-attention of every layer, in both passes
    assert seen.count("varlen") == 2 * 3 * SMALL["num_layers"] + SMALL["num_layers"], seen
    torch.testing.assert_close(got[0], ref[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[1][~tgt_pad], ref[1][~tgt_pad], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got[2][~src_pad], ref[2][~src_pad], atol=2e-6, rtol=1e-5)
    assert got[3].keys() == ref[3].keys()
    for name, g in ref[3].items():
        torch.testing.assert_close(got[3][name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert torch.isfinite(got[1]).all() and torch.isfinite(got[2]).all()  # the pads' rows too


@pytest.mark.parametrize("pe", ["none", "rope"])
def test_greedy_decoding_gives_the_same_tokens(pe, varlen_on, monkeypatch):
    set_seed(1)
    model = build_model(pe, V, **SMALL).eval()
    src, _, _, src_pad, _ = padded_batch(3)
    kw = dict(max_new_tokens=9, bos_id=1, eos_id=2, src_key_padding_mask=src_pad)
    seen = spy_backends(monkeypatch)
    got = greedy_decode(model, src, **kw)
    assert "varlen" in seen
    backends.tune(varlen=False)
    assert torch.equal(got, greedy_decode(model, src, **kw))


def test_off_by_default_so_cpu_runs_keep_their_path(monkeypatch):
    assert backends.AttentionTuning().varlen is False and backends.TUNING.varlen is False
    set_seed(0)
    model = build_model("rope", V, **SMALL)
    src, tgt, out, src_pad, tgt_pad = padded_batch()
    seen = spy_backends(monkeypatch)
    model.loss(src, tgt, out, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad).backward()
    assert seen and "varlen" not in seen


@pytest.mark.parametrize("pe", OTHERS)
def test_schemes_with_score_terms_keep_their_masks(pe, varlen_on, monkeypatch):
    set_seed(0)
    model = build_model(pe, V, **SMALL)
    src, tgt, _, src_pad, tgt_pad = padded_batch()
    seen = spy_backends(monkeypatch)
    model(src, tgt, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)
    # only the cross-attention, where no scheme enters, is served
    assert seen.count("varlen") == SMALL["num_layers"], seen


def test_padding_before_a_token_keeps_the_padded_path(varlen_on, monkeypatch):
    set_seed(0)
    model = build_model("none", V, **SMALL)
    src, tgt, _, src_pad, tgt_pad = padded_batch()
    src_pad = src_pad.flip(1)  # pads first
    seen = spy_backends(monkeypatch)
    model(src, tgt, src_key_padding_mask=src_pad)
    assert seen and "varlen" not in seen
    assert not bool(varlen.right_padded(src_pad)) and bool(varlen.right_padded(tgt_pad))


def test_weights_wanted_take_the_explicit_path(varlen_on):
    set_seed(0)
    model = build_model("none", V, **SMALL)
    src, _, _, src_pad, _ = padded_batch()
    attn = model.encoder[0].self_attn
    x = torch.randn(4, 11, SMALL["d_model"])
    _, weights = attn(x, key_padding_mask=src_pad, need_weights=True)
    assert weights.shape == (4, SMALL["n_heads"], 11, 11)


def test_dropout_runs_within_each_sequence(varlen_on):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, requires_grad=True) for _ in range(3))
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[1, 4:] = pad[2, 1:] = True
    out = varlen.attend(q, k, v, pad, self_attention=True, causal=False, scale=0.35, p_drop=0.5)
    out[~pad.unsqueeze(1).expand(-1, 2, -1)].sum().backward()
    assert torch.isfinite(out).all() and k.grad[2, :, 1:].abs().sum() == 0  # pads are no row's keys


def test_tuning_names_a_bad_switch():
    with pytest.raises(TypeError, match="varlen.*'yes'"):
        backends.AttentionTuning(varlen="yes")
