"""Attention over query blocks (``attention.BLOCK_ELEMENTS``) computes the same function as attention
in one piece, forward and backward, for every scheme: encoder and causal decoder, with padding."""
import pytest
import torch

from posenc_lib import PE_TYPES, build_model, set_seed
from posenc_lib.attention import backends
from posenc_lib.attention import layer as attention
from posenc_lib.attention.layer import MultiHeadAttention

SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)
V = 31


def _loss_and_grads(model, src, tgt, pads):
    model.zero_grad(set_to_none=True)
    loss = model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _count_blocks(monkeypatch):
    """Count attention calls that ran in blocks (the number of blocks each)."""
    seen = []
    real = backends.query_blocks

    def spy(*a, **kw):
        blocks = real(*a, **kw)
        if blocks is not None:
            seen.append(len(blocks))
        return blocks

    monkeypatch.setattr(backends, "query_blocks", spy)
    return seen


@pytest.mark.parametrize("pe", PE_TYPES)
@pytest.mark.parametrize("padded", [False, True])
def test_blocks_give_the_same_loss_and_gradients(pe, padded, monkeypatch):
    set_seed(0)
    model = build_model(pe, V, **SMALL, **({"max_len": 32} if pe == "learned" else {})).train()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 13), generator=g)
    tgt = torch.randint(4, V, (3, 12), generator=g)
    pads = {}
    if padded:
        src_pad = torch.zeros(3, 13, dtype=torch.bool)
        src_pad[0, 9:] = True
        tgt_pad = torch.zeros(3, 11, dtype=torch.bool)
        tgt_pad[1, 7:] = True
        pads = dict(src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", None)
    loss_1, grads_1 = _loss_and_grads(model, src, tgt, pads)
    seen = _count_blocks(monkeypatch)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 3 * 4 * 4 * 13)  # blocks of 4 query rows
    loss_b, grads_b = _loss_and_grads(model, src, tgt, pads)
    explicit = pe in ("shaw", "xlnet", "deberta", "t5")  # t5: its bias needs a gradient
    assert bool(seen) == explicit and all(n >= 3 for n in seen)
    torch.testing.assert_close(loss_b, loss_1, atol=1e-6, rtol=1e-5)
    assert grads_b.keys() == grads_1.keys()
    for name in grads_1:
        torch.testing.assert_close(grads_b[name], grads_1[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("pe", ["shaw", "xlnet", "deberta", "t5"])
def test_blocks_without_gradients_and_in_decoding_give_the_same_outputs(pe, monkeypatch):
    set_seed(0)
    model = build_model(pe, V, **SMALL).eval()
    src = torch.randint(4, V, (2, 10), generator=torch.Generator().manual_seed(2))
    tgt = torch.randint(4, V, (2, 9), generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", None)
    with torch.no_grad():
        ref = model(src, tgt)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 2 * 4 * 3 * 10)
    seen = _count_blocks(monkeypatch)
    with torch.no_grad():
        got = model(src, tgt)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    if pe != "t5":  # without gradients the t5 bias rides in the fused kernel, unblocked
        assert seen


def test_a_scheme_with_score_terms_but_no_query_slice_runs_in_one_piece(monkeypatch):
    class Plain(attention.PositionScheme):
        def scores(self, q, k, prep, layer, attn):
            return torch.zeros(q.shape[:-1] + (k.shape[2],))

    scheme = Plain(16, 2, 1)
    assert not scheme.splits_queries
    mha = MultiHeadAttention(16, 2)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 8)
    pos = torch.arange(6)
    x = torch.randn(2, 6, 16, requires_grad=True)
    out = mha(x, scheme=scheme, prep=scheme.prepare(pos, pos))
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", None)
    torch.testing.assert_close(out, mha(x, scheme=scheme, prep=scheme.prepare(pos, pos)))
