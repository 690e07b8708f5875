"""The fused CPU attention with a gradient for its float mask (posenc_lib.attention.cpu_flash) equals the written-out
softmax, forward and backward, for every mask shape it accepts, with -inf entries; the attention module
uses it for blocked calls of the score and bias schemes and gives the same loss and gradients."""
import pytest
import torch

from posenc_lib import build_model, make_scheme, set_seed
from posenc_lib.attention import backends, cpu_flash
from posenc_lib.attention import layer as attention
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.schemes.registry import registered_schemes


SIDED_BLOCK_ROWS = attention.SIDED_BLOCK_ROWS


@pytest.fixture(autouse=True)
def _blocks_as_set(monkeypatch):
    """The tests below choose the block size through FUSED_BLOCK_ROWS for every scheme (the schemes with clipped
    sides otherwise use SIDED_BLOCK_ROWS); a test that checks that choice sets it back."""
    monkeypatch.setattr(attention, "SIDED_BLOCK_ROWS", None)


def _explicit(q, k, v, mask, scale):
    return torch.softmax(q @ k.transpose(-1, -2) * scale + mask, dim=-1) @ v


@pytest.mark.parametrize("written", [True, False])
@pytest.mark.parametrize("mask_batch,mask_heads", [(1, 3), (2, 3), (2, 1), (1, 1)])
def test_equals_the_explicit_softmax_with_gradients(mask_batch, mask_heads, written, monkeypatch):
    """Both backward passes (written out, or the kernel's and then the mask's gradient) give the explicit gradients."""
    monkeypatch.setattr(cpu_flash, "WRITTEN_BACKWARD", written)
    taken = []
    real = cpu_flash.attention_backward
    monkeypatch.setattr(cpu_flash, "attention_backward", lambda *a, **k: taken.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 7, 5, generator=g, requires_grad=True)
    k = torch.randn(2, 3, 9, 5, generator=g, requires_grad=True)
    v = torch.randn(2, 3, 9, 5, generator=g, requires_grad=True)
    mask = torch.randn(mask_batch, mask_heads, 7, 9, generator=g)
    mask[..., 0, 3] = float("-inf")  # a key not allowed for query 0
    mask[..., 4, :8] = float("-inf")  # query 4 may see only the last key
    mask.requires_grad_()
    d_out = torch.randn(2, 3, 7, 5, generator=g)
    results = []
    for fn in (_explicit, cpu_flash.flash_attention):
        for t in (q, k, v, mask):
            t.grad = None
        out = fn(q, k, v, mask, 0.37)
        out.backward(d_out)
        results.append([out.detach()] + [t.grad.clone() for t in (q, k, v, mask)])
    for name, ref, got in zip(("out", "dq", "dk", "dv", "dmask"), *results):
        torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5, msg=name)
    assert results[1][4].shape == mask.shape
    assert (results[1][4][..., 0, 3] == 0).all()  # a masked entry gets no gradient
    assert bool(taken) == written  # the flag chooses the backward pass


@pytest.mark.parametrize("mask_batch", [1, 2])
def test_small_workspace_gives_the_same_mask_gradient(mask_batch, monkeypatch):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 10, 4, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.randn(mask_batch, 2, 10, 10, generator=g, requires_grad=True)
    grads = []
    for elements in (2**24, 2 * 2 * 3 * 10):  # one block, then blocks of 3 query rows
        monkeypatch.setattr(cpu_flash, "WORKSPACE_ELEMENTS", elements)
        mask.grad = None
        cpu_flash.flash_attention(q, k, v, mask, 0.5).sum().backward()
        grads.append(mask.grad.clone())
    torch.testing.assert_close(grads[1], grads[0])


@pytest.mark.parametrize("mask_batch", [1, 2])
def test_causal_blocks_against_their_keys_equal_the_explicit_softmax(mask_batch):
    """Query blocks that each run against only the keys up to their last query (the rest of their rows
    -inf): same output and gradients, and the left-out part of the mask gets a zero gradient."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 10, 4, generator=g, requires_grad=True) for _ in range(3))
    mask = torch.randn(mask_batch, 3, 10, 10, generator=g).masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    mask.requires_grad_()
    d_out = torch.randn(2, 3, 10, 4, generator=g)
    results = []
    for blocks in (None, [(0, 4, 4), (4, 8, 8), (8, 10, 10)]):
        for t in (q, k, v, mask):
            t.grad = None
        out = cpu_flash.flash_attention(q, k, v, mask, 0.6, blocks)
        out.backward(d_out)
        results.append([out.detach()] + [t.grad.clone() for t in (q, k, v, mask)])
    ref = _explicit(q, k, v, mask, 0.6).detach()
    torch.testing.assert_close(results[1][0], ref, atol=2e-6, rtol=1e-5)
    for name, a, b in zip(("out", "dq", "dk", "dv", "dmask"), *results):
        torch.testing.assert_close(b, a, atol=2e-6, rtol=1e-5, msg=name)
    assert (results[1][4][..., :4, 4:] == 0).all()


def test_bad_mask_shape_is_named():
    q = k = v = torch.zeros(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"mask must have shape \(1 or 2, 1 or 3, 4, 4\), got \(3, 4\)"):
        cpu_flash.flash_attention(q, k, v, torch.zeros(3, 4), 1.0)
    with pytest.raises(ValueError, match="got \\(2, 3, 4, 5\\)"):
        cpu_flash.flash_attention(q, k, v, torch.zeros(2, 3, 4, 5), 1.0)


def test_supported_only_for_float32_cpu_without_dropout():
    x = torch.zeros(1, 1, 2, 2)
    assert cpu_flash.supported(x, 0.0)
    assert not cpu_flash.supported(x, 0.1)
    assert not cpu_flash.supported(x.double(), 0.0)
    assert not cpu_flash.supported(x.bfloat16(), 0.0)


@pytest.mark.parametrize("pe", ["t5", "xlnet", "deberta", "shaw"])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("written", [True, False])
def test_blocked_model_uses_it_with_the_same_loss_and_gradients(pe, padded, written, monkeypatch):
    monkeypatch.setattr(cpu_flash, "WRITTEN_BACKWARD", written)
    set_seed(0)
    model = build_model(pe, 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).train()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (3, 13), generator=g), torch.randint(4, 31, (3, 12), generator=g)
    pads = {}
    if padded:
        src_pad = torch.zeros(3, 13, dtype=torch.bool)
        src_pad[0, 9:] = True
        pads = dict(src_key_padding_mask=src_pad)
    calls = {"flash_attention": [], "flash_scores": [], "shaw_attention": [], "flash_blocks": []}
    for name, seen in calls.items():
        real = getattr(cpu_flash, name)
        monkeypatch.setattr(cpu_flash, name, lambda *a, real=real, seen=seen, **kw: seen.append(a) or real(*a, **kw))
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 3 * 4 * 4 * 13)  # blocks of 4 query rows
    results = {}
    for fused in (False, True):
        monkeypatch.setattr(attention, "CPU_FLASH", fused)
        model.zero_grad(set_to_none=True)
        loss = model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)
        loss.backward()
        results[fused] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        used = {name for name, seen in calls.items() if seen}
        expected = {"t5": "flash_attention", "xlnet": "flash_blocks", "deberta": "flash_blocks", "shaw": "shaw_attention"}
        assert used == ({expected[pe]} if fused else set())
        assert all(len(a[-1]) >= 3 for a in calls["shaw_attention"])  # Shaw: its blocks in one call
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-6, rtol=1e-5)
    assert results[True][1].keys() == results[False][1].keys()
    for name, grad in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    if pe in ("xlnet", "deberta"):  # a causal block of the decoder sees only the keys up to its last query
        assert any([n for _, _, n in a[4]] == [4, 8, 11] for a in calls["flash_blocks"])  # a layer's blocks in one call
    if pe == "shaw":
        assert {blk[2].index.shape[1] for a in calls["shaw_attention"] for blk in a[-1]} >= {4, 8, 11}
    if pe == "t5" and not padded:  # a bias shared over the batch: one fused call per layer, not per block
        assert all(a[3].shape[0] == 1 for a in calls["flash_attention"])
        assert any(a[3].shape[2] == 13 for a in calls["flash_attention"])
        # the decoder's causal self-attention: blocks of 4 queries against the keys up to their last query
        assert any(a[5] == [(0, 4, 4), (4, 8, 8), (8, 11, 11)] for a in calls["flash_attention"])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_shaw_outer_keys_in_the_kernel_without_a_mask_equal_the_naive_reference(causal, padded):
    """Keys more than k positions from every query of a block (all at the table's first or last row) run in the
    kernel without a mask, joined to the strip between through the log-sum-exps: output and every gradient equal
    the paper's (L, L, d) form, with a causal mask and with padded keys (a side holding a padded key stays in
    the strip)."""
    from posenc_lib.kernels.shaw import shaw_sides, shaw_split
    from posenc_lib.schemes.shaw import shaw_index, shaw_plan, shaw_scores_naive, shaw_values_naive

    g = torch.Generator().manual_seed(3)
    b, h, length, d, k_max, rows = 2, 3, 24, 5, 3, 6
    q, k, v = (torch.randn(b, h, length, d, generator=g, requires_grad=True) for _ in range(3))
    table_k, table_v = (torch.randn(2 * k_max + 1, d, generator=g, requires_grad=True) for _ in range(2))
    pos = torch.arange(length)
    index = shaw_index(pos, pos, k_max)
    allowed = torch.ones(b, 1, length, length, dtype=torch.bool)
    if causal:
        allowed &= pos[None, :] <= pos[:, None]
    if padded:
        allowed[0, :, :, length - 5 :] = False
    scores = (shaw_scores_naive(q, k, table_k, index) * 0.4).masked_fill(~allowed, float("-inf"))
    ref = shaw_values_naive(torch.softmax(scores, -1), v, table_v, index)
    d_out = torch.randn(ref.shape, generator=g)
    blocks = []
    for start in range(0, length, rows):
        end = start + rows
        n = end if causal and not padded else length  # a causal block needs no key after its last query
        block_allowed = allowed[:, :, start:end, :n] if padded else allowed[:1, :, start:end, :n]
        plan = shaw_plan(index[start:end, :n], 2 * k_max + 1)
        blocks.append((start, end, plan, block_allowed, shaw_split(plan, block_allowed)))
        lo, hi = shaw_sides(plan)  # consecutive positions: every row at least k keys away
        assert (lo, hi) == (max(0, start - k_max + 1), min(n, end - 1 + k_max))
    out = cpu_flash.shaw_attention(q, k, v, table_k, table_v, 0.4, blocks)
    splits = [split[:2] for *_, split in blocks]
    assert splits[2] == ((10, 24) if padded else (10, 18) if causal else (10, 20))  # a side left, right if allowed
    leaves = (q, k, v, table_k, table_v)
    for name, got, want in zip(("out", "dq", "dk", "dv", "dtable_k", "dtable_v"),
                               (out, *torch.autograd.grad(out, leaves, d_out)),
                               (ref, *torch.autograd.grad(ref, leaves, d_out))):  # fmt: skip
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("padded", [False, True])
def test_shaw_model_with_outer_keys_gives_the_explicit_loss_and_gradients(padded, monkeypatch):
    """A Shaw model whose blocks have keys beyond the clipping distance on both sides (k = 2, blocks of 4 rows of 13
    and 11 positions): the fused path splits them off and gives the explicit path's loss and gradients."""
    set_seed(0)
    model = build_model("shaw", 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                        max_relative_position=2).train()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (3, 13), generator=g), torch.randint(4, 31, (3, 12), generator=g)
    pads = {}
    if padded:
        src_pad = torch.zeros(3, 13, dtype=torch.bool)
        src_pad[0, 10:] = True
        pads = dict(src_key_padding_mask=src_pad)
    from posenc_lib.kernels import shaw as shaw_module

    split, real = [], shaw_module.shaw_split

    def spy(plan, allowed):
        s0, s1, *rest = real(plan, allowed)
        split.append((s0, s1) != (0, plan.index.shape[1]))
        return (s0, s1, *rest)

    monkeypatch.setattr(shaw_module, "shaw_split", spy)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    results = []
    for fused_min in (None, 3 * 4 * 11 * 11):
        monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", fused_min)
        model.zero_grad(set_to_none=True)
        loss = model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert any(split) and not all(split)  # some blocks split, the first ones (no key k away) not
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("chunk", [None, 1])
def test_deberta_keys_beyond_the_clipping_run_without_a_mask_with_the_explicit_loss_and_gradients(padded, chunk,
                                                                                                 monkeypatch):  # fmt: skip
    """DeBERTa's keys that are clipped to one bucket for every row of a block (4 buckets, relative positions up to 4,
    blocks of 4 rows of 20 and 15 positions) run in the kernel without a mask on q + Q^r, their c2p term folded
    into the log-sum-exp: the loss and every gradient equal the explicit path's, encoder (both sides) and causal
    decoder (the left side), with padded keys (a side holding one stays with the strip); the batch at once, or
    each batch row on its own (BATCH_CHUNK_ELEMENTS)."""
    monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", chunk)
    set_seed(0)
    model = build_model("deberta", 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                        position_buckets=4, max_relative_positions=4).train()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (3, 20), generator=g), torch.randint(4, 31, (3, 16), generator=g)
    pads = {}
    if padded:
        src_pad = torch.zeros(3, 20, dtype=torch.bool)
        src_pad[0, 17:] = True
        pads = dict(src_key_padding_mask=src_pad)
    seen, real = [], cpu_flash.flash_blocks

    def spy(*a, ranges=None, sides=None, **kw):
        seen.append((a[4], ranges))
        return real(*a, ranges=ranges, sides=sides, **kw)

    monkeypatch.setattr(cpu_flash, "flash_blocks", spy)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    results = []
    for fused_min in (None, 3 * 4 * 15 * 15):
        monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", fused_min)
        model.zero_grad(set_to_none=True)
        loss = model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    encoder = [r for blocks, r in seen if blocks[-1][2] == 20 and blocks[0][2] == 20]
    decoder = [r for blocks, r in seen if blocks[0][2] == 4]
    assert len(encoder) == len(decoder) == 2 * (3 if chunk == 1 else 1)  # a node per layer, or per batch row
    # the bucket index is clipped for keys j <= i - 3 and j >= i + 4: rows 8-11 split off keys 0-5 and 15-19 in the
    # encoder (the right side stays with the strip where a padded key sits there), keys 0-5 in the causal decoder
    assert encoder[0][2] == ((6, 20) if padded else (6, 15))
    assert decoder[0][2] == (6, 12) and decoder[0][0] == (0, 4)


def test_the_naive_shaw_contrast_keeps_the_explicit_path():
    from benchmarks.common import ShawNaive
    from posenc_lib.schemes.shaw import ShawRelative

    q = torch.zeros(1, 4, 2, 8)
    assert backends.cpu_flash_wanted(ShawRelative(32, 4, 1), q, 0.0)
    assert not backends.cpu_flash_wanted(ShawNaive(32, 4, 1), q, 0.0)
    assert not backends.cpu_flash_wanted(ShawRelative(32, 4, 1), q, 0.1)  # dropout: explicit


# -- the fused path below the blocking threshold (attention.FUSED_MIN_ELEMENTS) ------------------------------
#: every registered scheme with a score bias or score terms
SCORE_AND_BIAS = [pe for pe, info in registered_schemes().items() if info.cls.adds_bias or info.cls.adds_scores]


def _spy_paths(monkeypatch):
    """Record which fused CPU function each attention call used."""
    calls = []
    for name in ("flash_attention", "flash_scores", "shaw_attention", "flash_blocks", "flash_whole_offsets"):
        real = getattr(cpu_flash, name)
        monkeypatch.setattr(cpu_flash, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    return calls


def _explicit_then_fused(pe, padded, monkeypatch, batch=3):
    """Loss and gradients of a small model (2 + 2 layers) with every self-attention call explicit, then fused
    (``FUSED_MIN_ELEMENTS`` at the calls' size), with padding if asked: ``{setting: (loss, grads, calls)}``, the
    fused CPU functions each setting called; the two settings' losses and gradients are checked equal."""
    set_seed(0)
    model = build_model(pe, 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).train()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (batch, 13), generator=g), torch.randint(4, 31, (batch, 12), generator=g)
    pads = {}
    if padded:
        src_pad, tgt_pad = torch.zeros(batch, 13, dtype=torch.bool), torch.zeros(batch, 11, dtype=torch.bool)
        src_pad[0, 9:], tgt_pad[-1, 7:] = True, True
        pads = dict(src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)
    calls = _spy_paths(monkeypatch)
    loss = lambda: model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)  # noqa: E731
    return _explicit_and_fused(model, loss, batch * 4 * 11 * 11, monkeypatch, calls)  # every self-attention call fused


def _explicit_and_fused(model, loss_fn, fused_min, monkeypatch, calls=None):
    """``loss_fn()`` and its backward pass with every attention call explicit, then fused from ``fused_min`` score
    elements: ``{setting: (loss, grads, calls)}`` (``calls``: a :func:`_spy_paths` list, emptied before each setting),
    the two settings' losses and every gradient checked equal."""
    results = {}
    for setting in (None, fused_min):
        monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", setting)
        if calls is not None:
            calls.clear()
        model.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[setting] = loss.detach(), grads, list(calls or [])
    (loss_e, grads_e, _), (loss_f, grads_f, _) = results.values()
    torch.testing.assert_close(loss_f, loss_e, atol=1e-6, rtol=1e-5)
    assert grads_f.keys() == grads_e.keys()
    for name, grad in grads_e.items():
        torch.testing.assert_close(grads_f[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    return results


def _small_clipped_t5(monkeypatch):
    """A small T5 (8 buckets, max_distance 6: distances from 3 on share a bucket) whose calls of any size use values
    per offset, in blocks of 4 query rows."""
    from posenc_lib.schemes import t5 as t5_module

    monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", 1)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    set_seed(0)
    return build_model("t5", 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                       num_buckets=8, max_distance=6).train()  # fmt: skip


@pytest.mark.parametrize("pe", SCORE_AND_BIAS)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("rows", [128, 4])
def test_fused_blocks_below_the_threshold_give_the_same_loss_and_gradients(pe, padded, rows, monkeypatch):
    """A training call above FUSED_MIN_ELEMENTS but below BLOCK_ELEMENTS runs in the fused kernel (in one block,
    or in blocks of FUSED_BLOCK_ROWS): the same loss and gradients as the explicit softmax, encoder and causal
    decoder, with padding."""
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", rows)
    for fused_min, (_, _, calls) in _explicit_then_fused(pe, padded, monkeypatch).items():
        if pe == "alibi":  # a bias without a gradient is SDPA's own fused kernel on either setting
            assert calls == []
        else:
            assert bool(calls) == (fused_min is not None)
            # 2 encoder + 2 decoder self-attention layers (one call per block, or per layer where the scheme
            # takes all blocks at once); a padded bias block is checkpointed (its call runs twice)
            assert fused_min is None or len(calls) >= 4


@pytest.mark.parametrize("pe", ["deberta", "xlnet"])
@pytest.mark.parametrize("padded", [False, True])
def test_a_layers_blocks_run_in_one_node_from_parts_made_once(pe, padded, monkeypatch):
    """DeBERTa's projected tables (the same for every query block) and XLNet's projected distances (a block's rows
    of them) are made once per layer (block_parts), and all of a layer's blocks run in one flash_blocks node, the
    mask's gradient reaching q, k and the parts; loss and every gradient equal the explicit path's."""
    from posenc_lib.schemes.deberta import DebertaDisentangled
    from posenc_lib.schemes.xlnet import XLNetRelative

    cls = {"deberta": DebertaDisentangled, "xlnet": XLNetRelative}[pe]
    made, cut = [], []
    real_parts, real_block = cls.score_parts, cls.block_parts
    monkeypatch.setattr(cls, "score_parts", lambda self, *a: made.append(1) or real_parts(self, *a))
    monkeypatch.setattr(cls, "block_parts", lambda self, parts, *a: cut.append(a[1:]) or real_block(self, parts, *a))
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)  # 3 blocks of the 11 target and 13 source positions
    results = _explicit_then_fused(pe, padded, monkeypatch)
    assert results[None][2] == []
    assert results[3 * 4 * 11 * 11][2] == ["flash_blocks"] * 4  # 2 encoder + 2 decoder layers, one node each
    assert len(made) == 4 + 4  # once per layer in each setting (explicit: one piece per layer)
    # the decoder's causal blocks against the keys up to their last query, in the forward and the backward pass
    assert {(0, 4, 4), (4, 8, 8), (8, 11, 11)} <= set(cut) and {(0, 4, 13), (12, 13, 13)} <= set(cut)


@pytest.mark.parametrize("pe", ["deberta", "xlnet"])
@pytest.mark.parametrize("padded", [False, True])
def test_batch_rows_in_chunks_give_the_loss_and_gradients_of_the_explicit_path(pe, padded, monkeypatch):
    """With BATCH_CHUNK_ELEMENTS below one batch row's blocks, each batch row runs in its own flash_blocks node (its
    rows of the padding mask, the layer's parts shared): the loss and every gradient equal the explicit path's."""
    monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    results = _explicit_then_fused(pe, padded, monkeypatch)
    assert results[3 * 4 * 11 * 11][2] == ["flash_blocks"] * 4 * 3  # 2 encoder + 2 decoder layers, 3 batch rows
    monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", 4 * 4 * 13 * 2)  # two batch rows of the encoder's blocks
    results = _explicit_then_fused(pe, padded, monkeypatch)
    assert results[3 * 4 * 11 * 11][2] == ["flash_blocks"] * 4 * 2  # chunks of 2 rows and 1 row


@pytest.mark.parametrize("chunk, rows, nodes", [(None, 1, 4), (4 * 4 * 13, 4, 12)])
def test_above_the_blocking_threshold_a_blocks_rows_count_against_one_chunk(chunk, rows, nodes, monkeypatch):
    """Above BLOCK_ELEMENTS a call runs in blocks of fewer rows the larger its batch; XLNet's, whose batch rows run
    in chunks, counts a block's rows against one chunk's batch rows: with chunks of one batch row, blocks of
    FUSED_BLOCK_ROWS (4) where the whole batch of 3 gets blocks of 1 row; a block never exceeds BLOCK_ELEMENTS."""
    monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 4 * 4 * 13)  # 4 heads x 4 rows x 13 keys: 1 row of 3 batch rows
    seen, real = [], cpu_flash.flash_blocks
    monkeypatch.setattr(cpu_flash, "flash_blocks", lambda *a, **kw: seen.append((a[0].shape[0], a[4])) or real(*a, **kw))
    set_seed(0)
    model = build_model("xlnet", 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).train()
    src, tgt = torch.randint(4, 31, (3, 13)), torch.randint(4, 31, (3, 12))
    model.loss(src, tgt[:, :-1], tgt[:, 1:]).backward()
    assert len(seen) == nodes and all(max(e - s for s, e, _ in spans) == rows for _, spans in seen)
    assert all(b * 4 * (e - s) * n <= attention.BLOCK_ELEMENTS for b, spans in seen for s, e, n in spans)


def test_xlnet_block_parts_are_the_rows_its_slices_of_r_project():
    """XLNet's share of the projected distances for a block is R's rows that query_slice and key_slice keep, projected."""
    set_seed(0)
    scheme = make_scheme("xlnet", 32, 4, 1, causal=True)
    mha = MultiHeadAttention(32, 4)
    pos = torch.arange(11)
    prep = scheme.prepare(pos, pos)
    q = torch.zeros(1, 4, 11, 8)
    whole = scheme.score_parts(q, prep, 0, mha)
    for start, end, n in [(0, 4, 4), (4, 8, 8), (8, 11, 11), (4, 8, 11)]:
        sliced = scheme.key_slice(scheme.query_slice(prep, start, end), n)
        expected = scheme.score_parts(q[:, :, start:end], sliced, 0, mha)
        for got, want in zip(scheme.block_parts(whole, prep, start, end, n), expected):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("pad", [1, 16])
def test_xlnets_block_mask_and_kernel_queries_give_its_score_terms_with_their_gradients(pad, monkeypatch):
    """XLNet's fused path: the kernel's queries q + u times k plus block_mask (terms (b)+(d) of one block, gradients
    written out, buffers reused through ``work``) equal scores_from_parts times the scale, -inf where not allowed,
    and so do the gradients of q, k and the parts; with and without padding of the distances, no mask, a causal and
    a padding mask, reusing one ``work``."""
    from posenc_lib.kernels import xlnet

    monkeypatch.setattr(xlnet, "DISTANCE_PAD", pad)
    set_seed(0)
    scheme = make_scheme("xlnet", 12, 2, 1)
    work = {}
    for b, h, rows, n, dh, kind in [(2, 3, 4, 6, 5, None), (1, 2, 3, 3, 4, "causal"), (3, 2, 4, 7, 3, "pad")]:
        q, k = torch.randn(b, h, rows, dh, dtype=torch.double), torch.randn(b, h, n, dh, dtype=torch.double)
        parts = (torch.randn(rows + n - 1, h * dh, dtype=torch.double), *torch.randn(2, h, dh, dtype=torch.double))
        leaves = [t.requires_grad_() for t in (q, k, *parts)]
        allowed = {None: None, "causal": torch.ones(rows, n, dtype=torch.bool).tril(n - rows)[None, None],
                   "pad": torch.rand(b, 1, 1, n) > 0.3}[kind]  # fmt: skip
        want = scheme.scores_from_parts(q, k, parts, {}, scale=0.7)
        want = want if allowed is None else want.masked_fill(~allowed, float("-inf"))
        got = xlnet.mask_from_parts(scheme, q, k, parts, {}, 0.7, allowed, work)
        got = got + 0.7 * xlnet.kernel_queries(scheme, q, parts) @ k.transpose(-1, -2) - 0.7 * q @ k.transpose(-1, -2)
        torch.testing.assert_close(got, want)
        grad = torch.randn_like(want).masked_fill(torch.isinf(want), 0.0)
        for g, w in zip(torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)):
            torch.testing.assert_close(g, w)
    assert set(work) == {"bd", "grad"} | ({"r"} if pad > 1 else set())


def test_the_buffers_of_a_pass_are_emptied_when_it_ends(monkeypatch):
    """The score-sized buffers XLNet's blocks share (flash_blocks' ``work``) hold nothing between the forward and
    the backward pass, nor after it: the fused path keeps no more memory than one block's."""
    seen, real = [], cpu_flash.flash_blocks

    def spy(*a, work=None, **kw):
        out = real(*a, work=work, **kw)
        seen.append(work)
        assert work == {}  # emptied when the forward pass ends
        return out

    monkeypatch.setattr(cpu_flash, "flash_blocks", spy)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", 1)
    set_seed(0)
    model = build_model("xlnet", 31, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).train()
    src, tgt = torch.randint(4, 31, (3, 13)), torch.randint(4, 31, (3, 12))
    from posenc_lib.kernels import xlnet

    filled, real_work = [], xlnet.work_buffer
    monkeypatch.setattr(xlnet, "work_buffer", lambda work, *a: filled.append(work) or real_work(work, *a))
    model.loss(src, tgt[:, :-1], tgt[:, 1:]).backward()
    assert len(seen) == 4 and all(w == {} for w in seen)  # 2 encoder + 2 decoder layers, emptied after backward too
    assert filled and all(any(w is s for s in seen) for w in filled)  # every buffer was one of those dicts'


@pytest.mark.parametrize("pe", ["t5", "shaw", "xlnet", "deberta"])
def test_the_courses_small_calls_keep_the_explicit_path(pe, monkeypatch):
    """Below FUSED_MIN_ELEMENTS (every training call of the lessons' small models, and the WMT14 finale's
    CPU batches) and without gradients the explicit path runs, so their trained numbers stay as they were;
    a training call at the measured crossover takes the fused path."""
    monkeypatch.setattr(attention, "SIDED_BLOCK_ROWS", SIDED_BLOCK_ROWS)  # Shaw's and DeBERTa's blocks: their own size
    set_seed(0)
    model = build_model(pe, 31, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0).train()
    calls = _spy_paths(monkeypatch)
    src = torch.randint(4, 31, (32, 64), generator=torch.Generator().manual_seed(1))  # 32 x 4 heads x 64 x 64
    assert 32 * 4 * 64 * 64 < attention.FUSED_MIN_ELEMENTS
    model.loss(src, src[:, :-1], src[:, 1:]).backward()
    assert calls == []
    scheme = model.enc_scheme
    b, n = 2, 1
    while b * 4 * n * n < attention.FUSED_MIN_ELEMENTS:
        n *= 2
    prep = scheme.prepare(torch.arange(n), torch.arange(n))
    q = torch.zeros(b, 4, n, 8)
    path = attention.choose_attention_path(scheme, q_len=n, k_len=n, causal=False, padded=False)
    bias = scheme.bias(prep, 0)
    rows = SIDED_BLOCK_ROWS if pe in ("shaw", "deberta") else attention.FUSED_BLOCK_ROWS
    assert SIDED_BLOCK_ROWS != attention.FUSED_BLOCK_ROWS
    expected = [(s, min(s + rows, n)) for s in range(0, n, rows)]
    assert rows < n and backends.query_blocks(scheme, q, n, path, bias) == expected  # fused, in blocks
    with torch.no_grad():
        assert backends.query_blocks(scheme, q, n, path, bias) is None  # inference: the explicit path as before
    assert backends.query_blocks(scheme, q, n, path, bias, 0.1) is None  # dropout: explicit
    below = (attention.FUSED_MIN_ELEMENTS - 1) // (b * 4 * n)  # query rows of a call just below the crossover
    assert backends.query_blocks(scheme, q[:, :, :below], n, path, bias) is None


def test_the_naive_shaw_contrast_stays_explicit_below_the_threshold(monkeypatch):
    from benchmarks.common import ShawNaive

    monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", 1)
    q = torch.zeros(2, 4, 6, 8)
    scheme = ShawNaive(32, 4, 1)
    prep = scheme.prepare(torch.arange(6), torch.arange(6))
    path = attention.choose_attention_path(scheme, q_len=6, k_len=6, causal=False, padded=False)
    assert backends.query_blocks(scheme, q, 6, path, None) is None


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("rows", [128, 4])
def test_t5_offset_values_laid_out_per_block_give_the_same_loss_and_gradients(padded, rows, monkeypatch):
    """T5 over consecutive positions (one bias value per offset): a causal training call on the fused path lays
    out each query block's rows of the bias from those values (flash_blocks, no whole bias), the encoder's
    calls use the whole bias (flash_attention); the loss and every gradient equal the explicit softmax's."""
    from posenc_lib.schemes import t5 as t5_module

    monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", 1)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", rows)
    results = _explicit_then_fused("t5", padded, monkeypatch)
    assert results[None][2] == []
    fused = results[3 * 4 * 11 * 11][2]
    assert fused.count("flash_blocks") == 2  # the decoder's two causal layers, every block in one call
    assert "flash_scores" not in fused
    if padded:  # the encoder: the whole bias, masked per sequence, in blocks
        assert "flash_attention" in fused and "flash_whole_offsets" not in fused
    else:  # the whole bias shared over the batch: one call per layer, the gradient summed per diagonal
        assert fused.count("flash_whole_offsets") == 2 and "flash_attention" not in fused


@pytest.mark.parametrize("padded", [False, True])
def test_t5_keys_beyond_max_distance_run_without_a_mask_with_the_explicit_loss_and_gradients(padded, monkeypatch):
    """T5's causal calls over values per offset (8 buckets, max_distance 6, blocks of 4 rows of 20 positions): the
    keys whose offsets share the last bucket for every row of a block run in the kernel without a mask, the bucket's
    value added to the log-sum-exp; the loss and every gradient (the bias table's too) equal the explicit path's."""
    from posenc_lib.schemes import t5 as t5_module

    model = _small_clipped_t5(monkeypatch)
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (3, 13), generator=g), torch.randint(4, 31, (3, 21), generator=g)
    pads = {}
    if padded:
        tgt_pad = torch.zeros(3, 20, dtype=torch.bool)
        tgt_pad[1, 5] = True  # a masked key among the distant ones of rows 12-15
        pads = dict(tgt_key_padding_mask=tgt_pad)
    seen, real = [], cpu_flash.flash_blocks

    def spy(*a, ranges=None, sides=None, **kw):
        seen.append(ranges)
        return real(*a, ranges=ranges, sides=sides, **kw) if ranges is not None else real(*a, **kw)

    monkeypatch.setattr(cpu_flash, "flash_blocks", spy)
    _explicit_and_fused(model, lambda: model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads), 3 * 4 * 13 * 13, monkeypatch)
    assert len(seen) == 2 and seen[0] is not None  # the decoder's two layers
    scheme = model.dec_scheme
    prep = scheme.prepare(torch.arange(20), torch.arange(20))
    a, z = scheme.offset_runs(prep)
    buckets = t5_module.t5_relative_bucket(torch.arange(-19, 20), False, 8, 6)
    assert (buckets[:a] == 7).all() and buckets[a] != 7 and (buckets[z:] == 0).all()  # distances >= 6: the last bucket
    # rows 8-11 see keys 0-2 at distance >= 6 from each, rows 12-15 keys 0-6 (where key 5 is padded, the whole
    # block is laid out); rows 0-3 have no such key
    assert seen[0][0] == (0, 4) and seen[0][2] == (3, 12) and seen[0][3] == ((0, 16) if padded else (7, 16))


@pytest.mark.parametrize("padded", [False, True])
def test_t5s_encoder_at_batch_1_lays_out_its_bias_per_block_with_the_explicit_loss_and_gradients(padded, monkeypatch):
    """At batch 1 T5's encoder lays out its learned bias block by block too (flash_blocks, no whole bias), the keys
    beyond max_distance on either side of a block run without a mask; from batch 2 it takes the whole bias
    (flash_whole_offsets).  The loss and every gradient (the bias table's too) equal the explicit path's."""
    from posenc_lib.schemes import t5 as t5_module

    model = _small_clipped_t5(monkeypatch)
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 31, (2, 20), generator=g), torch.randint(4, 31, (2, 13), generator=g)
    pads = {}
    if padded:
        src_pad = torch.zeros(2, 20, dtype=torch.bool)
        src_pad[:, 18:] = True  # the last two keys, among the far ones of rows 0-11
        pads = dict(src_key_padding_mask=src_pad)
    seen, real = [], cpu_flash.flash_blocks

    def spy(*a, ranges=None, **kw):
        seen.append((a[0].shape[0], ranges))
        return real(*a, ranges=ranges, **kw)

    monkeypatch.setattr(cpu_flash, "flash_blocks", spy)
    calls = _spy_paths(monkeypatch)
    for batch in (1, 2):
        few = {k: m[:batch] for k, m in pads.items()}
        loss = lambda: seen.clear() or model.loss(src[:batch], tgt[:batch, :-1], tgt[:batch, 1:], **few)  # noqa: E731
        fused = _explicit_and_fused(model, loss, 1, monkeypatch, calls)[1][2]  # the fused functions called
        encoder = [r for b, r in seen if r is not None and len(r) == 5]  # 20 source positions: 5 blocks of 4 rows
        if batch == 1:
            assert "flash_whole_offsets" not in fused and len(encoder) == 2
            # rows 8-11: the keys in the far bucket before every row (0-4) and after every row (15-19; 18-19 padded)
            buckets = t5_module.t5_relative_bucket(torch.arange(20)[None] - torch.arange(8, 12)[:, None], True, 8, 6)
            far = t5_module.t5_relative_bucket(torch.tensor([-100, 100]), True, 8, 6)
            left, right = (buckets == far[0]).all(0), (buckets == far[1]).all(0)
            assert left.tolist() == [True] * 5 + [False] * 15 and right.tolist() == [False] * 15 + [True] * 5
            assert encoder[0][2] == encoder[1][2] == (5, 15)
        else:
            assert fused.count("flash_whole_offsets") == (0 if padded else 2) and encoder == []


def test_t5_offset_values_lay_out_the_same_bias():
    """The per-block layout of T5's offset values equals the whole bias, rows and keys of every block."""
    from posenc_lib.kernels.offsets import offset_block
    from posenc_lib.schemes import t5 as t5_module

    set_seed(0)
    scheme = make_scheme("t5", 32, 4, 1, causal=True)
    q_pos, k_pos = torch.arange(5, 1029), torch.arange(1029)  # the newest 1024 of 1029 keys
    prep = scheme.prepare(q_pos, k_pos)
    assert "bias" not in prep and "offset_values" in prep  # large and consecutive: laid out on demand
    values = scheme.offset_bias(prep)
    whole = scheme.bias(prep, 0)
    torch.testing.assert_close(whole, scheme.compute_bias(q_pos, k_pos), rtol=0, atol=0)
    buckets = scheme.buckets(q_pos, k_pos)
    torch.testing.assert_close(whole[0], scheme.relative_attention_bias.weight[buckets].permute(2, 0, 1), rtol=0, atol=0)
    assert t5_module.TOEPLITZ_MIN_ELEMENTS <= 4 * 1024 * 1029
    for start, end, n in [(0, 128, 133), (128, 256, 1029), (1000, 1024, 1029), (7, 9, 3)]:
        block = offset_block(1024, start, end, n, None, None, None, values)
        torch.testing.assert_close(block, whole[:, :, start:end, :n], rtol=0, atol=0)


@pytest.mark.parametrize("padded", [False, True])
def test_alibi_offset_values_laid_out_per_block_give_the_same_loss_and_gradients(padded, monkeypatch):
    """ALiBi over a large window (OFFSET_MIN_ELEMENTS): its causal training calls lay out each block's rows of the
    fixed bias in flash_blocks (the kernel's own backward pass, no gradient for the bias), the encoder's calls
    take the whole bias, laid out once; the loss and every gradient equal the explicit path's."""
    from posenc_lib.schemes import alibi as alibi_module

    monkeypatch.setattr(alibi_module, "OFFSET_MIN_ELEMENTS", 1)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    results = _explicit_then_fused("alibi", padded, monkeypatch)
    assert results[None][2] == []
    assert results[3 * 4 * 11 * 11][2] == ["flash_blocks"] * 2  # the decoder's two causal layers; the encoder: SDPA


@pytest.mark.parametrize("bidirectional", ["symmetric", "directional"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_heads", [8, 6])
def test_alibi_offset_values_lay_out_the_same_bias_bit_for_bit(causal, n_heads, bidirectional):
    """ALiBi's one value per offset, laid out whole or one block of rows at a time, is alibi_bias exactly
    (the same float32 products), for windows that start anywhere; "split" and scattered positions keep the
    whole bias."""
    from posenc_lib.kernels.offsets import offset_block
    from posenc_lib.schemes import alibi as alibi_module

    scheme = make_scheme("alibi", 48, n_heads, 1, causal=causal, bidirectional=bidirectional)
    left = scheme.slopes.flip(0) if bidirectional == "directional" and not causal else None
    for q_pos, k_pos in [(torch.arange(1024), torch.arange(1024)), (torch.arange(5, 1029), torch.arange(1029)),
                         (torch.arange(3, 700), torch.arange(10, 800))]:  # fmt: skip
        assert n_heads * q_pos.numel() * k_pos.numel() >= alibi_module.OFFSET_MIN_ELEMENTS
        prep = scheme.prepare(q_pos, k_pos)
        assert "bias" not in prep and "offset_values" in prep  # large and consecutive: laid out on demand
        whole = scheme.bias(prep, 0)
        assert whole.dtype == torch.float32 and torch.equal(whole, alibi_module.alibi_bias(q_pos, k_pos, scheme.slopes,
                                                                                       left_slopes=left))
        assert scheme.bias(prep, 1) is whole  # once per stack
        q_len, k_len = q_pos.numel(), k_pos.numel()
        for start, end, n in [(0, 128, 133), (128, 256, k_len), (q_len - 24, q_len, k_len), (7, 9, 3)]:
            block = offset_block(q_len, start, end, n, None, None, None, scheme.offset_bias(prep))
            assert torch.equal(block, whole[:, :, start:end, :n])
    pos = torch.arange(1024)
    assert "bias" in make_scheme("alibi", 48, n_heads, 1, causal=False, bidirectional="split").prepare(pos, pos)
    assert "bias" in scheme.prepare(torch.tensor([0, 2, 5]), pos)
    small = torch.arange(64)  # the course's models: built as before
    assert n_heads * 64 * 64 < alibi_module.OFFSET_MIN_ELEMENTS and "bias" in scheme.prepare(small, small)


@pytest.mark.parametrize("batch,padded", [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("rows", [256, 5])
def test_flash_whole_offsets_sums_the_mask_gradient_per_diagonal(batch, padded, rows, monkeypatch):
    """One fused call with a mask laid out from values per offset: output and the gradients of q, k, v and the values
    equal the explicit softmax's through the laid-out mask (autograd through utils.toeplitz_bias), with the
    backward pass in blocks of ``rows`` query rows, a mask shared over the batch or masked per sequence."""
    from posenc_lib.utils import toeplitz_bias

    monkeypatch.setattr(cpu_flash, "BACKWARD_BLOCK_ROWS", rows)
    g = torch.Generator().manual_seed(7)
    h, lq, lk, d = 4, 23, 19, 8
    q, k, v = (torch.randn(batch, h, n, d, generator=g).requires_grad_() for n in (lq, lk, lk))
    values = torch.randn(h, lq + lk - 1, generator=g).requires_grad_()
    keep = torch.ones(batch, 1, 1, lk, dtype=torch.bool)
    if padded:
        keep[0, :, :, 15:] = False
    d_out = torch.randn(batch, h, lq, d, generator=g)

    def explicit():
        bias = toeplitz_bias(values.t(), lq, lk)
        s = (q @ k.transpose(-1, -2)) * 0.3 + bias
        return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v

    def fused():
        mask = toeplitz_bias(values.detach().t(), lq, lk)
        mask = mask.masked_fill(~keep, float("-inf")) if padded else mask
        return cpu_flash.flash_whole_offsets(q, k, v, mask, values, 0.3)

    results = []
    for run in (explicit, fused):
        out = run()
        results.append((out, *torch.autograd.grad(out, (q, k, v, values), d_out)))
    for name, a, b in zip(("out", "dq", "dk", "dv", "dvalues"), *results):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("batch_mask", [False, True])
def test_offset_rows_gradient_sums_each_diagonal(batch_mask):
    """_OffsetRows' written-out backward pass (each diagonal summed through a strided buffer) equals autograd's
    through a gather of the same entries, masked entries getting no gradient."""
    from posenc_lib.kernels.offsets import offset_block

    g = torch.Generator().manual_seed(0)
    q_len, k_len, start, end, n = 9, 11, 3, 7, 8
    values = torch.randn(4, q_len + k_len - 1, generator=g, requires_grad=True)
    allowed = torch.rand(2 if batch_mask else 1, 1, end - start, n, generator=g) > 0.3
    out = offset_block(q_len, start, end, n, allowed, None, None, values)
    i, j = torch.arange(start, end)[:, None], torch.arange(n)[None]
    ref = values[:, j - i + q_len - 1][None].masked_fill(~allowed, float("-inf"))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    grad = torch.randn(out.shape, generator=g)
    (mine,) = torch.autograd.grad(out, values, grad)
    (theirs,) = torch.autograd.grad(ref, values, grad)
    torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("pe, rows", [("xlnet", 128), ("deberta", 256), ("shaw", 256)])
def test_the_benchmark_shape_at_batch_32_runs_blocks_of_full_rows(pe, rows, monkeypatch):
    """At batch 32, L = 1024 (the benchmark model: 8 heads of 32) BLOCK_ELEMENTS alone would allow blocks of 64 rows;
    the chunked schemes count a block against one chunk of batch rows and keep their full blocks."""
    from posenc_lib.attention.layer import choose_attention_path

    monkeypatch.setattr(attention, "SIDED_BLOCK_ROWS", SIDED_BLOCK_ROWS)  # the module's own choice
    scheme = make_scheme(pe, 256, 8, 1, causal=True)
    q = torch.empty(32, 8, 1024, 32)
    path = choose_attention_path(scheme, q_len=1024, k_len=1024, causal=True, padded=False)
    assert attention.BLOCK_ELEMENTS // (32 * 8 * 1024) == 64
    with torch.enable_grad():
        blocks = backends.query_blocks(scheme, q, 1024, path, None)
    assert {e - s for s, e in blocks} == {rows}


@pytest.mark.parametrize("pe", ["t5", "shaw"])
@pytest.mark.parametrize("padded", [False, True])
def test_t5_and_shaw_batch_rows_in_chunks_give_the_loss_and_gradients_of_the_explicit_path(pe, padded, monkeypatch):
    """T5's calls (the encoder's one fused call over the whole bias, the decoder's blocks laid out per offset) and
    Shaw's run their batch rows in chunks of BATCH_CHUNK_ELEMENTS: with chunks of one batch row each fused call
    gets one row (its rows of the padding mask), and the loss and every gradient equal the explicit path's."""
    from posenc_lib.schemes import t5 as t5_module

    monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", 1)
    monkeypatch.setattr(attention, "FUSED_BLOCK_ROWS", 4)
    sizes = []
    for name in ("flash_whole_offsets", "flash_blocks", "shaw_attention", "flash_attention"):
        real = getattr(cpu_flash, name)
        monkeypatch.setattr(cpu_flash, name, lambda *a, real=real, name=name, **kw: sizes.append((name, a[0].shape[0]))
                            or real(*a, **kw))
    for chunk, batch in ((None, 3), (1, 1)):
        monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", chunk)
        sizes.clear()
        _explicit_then_fused(pe, padded, monkeypatch)
        names = {name for name, _ in sizes}
        assert names and all(b == batch for name, b in sizes if name != "flash_attention"), sizes
        if pe == "t5":
            assert "flash_blocks" in names and ("flash_whole_offsets" in names) == (not padded)
        else:
            assert names == {"shaw_attention"}


def _offset_selection(scheme, prep, q, path):
    """``(values, blocks, chunk)`` of the ``cpu_offsets`` backend for a self-attention call of queries ``q``."""
    call = backends.AttentionCall(q, q, q, None, scheme, prep, 0, None, path, 1.0, 0.0, False)
    chosen = backends.offset_selection(call, backends.TUNING)
    assert chosen.backend == "cpu_offsets"
    return chosen.values, chosen.blocks, chosen.chunk


def test_t5s_causal_blocks_at_batch_32_l_2048_hold_full_rows_in_chunks(monkeypatch):
    """At batch 32, L = 2048 (the benchmark model: 8 heads of 32) BLOCK_ELEMENTS alone allows T5's causal blocks 32
    rows; its batch rows run in chunks of 4 (BATCH_CHUNK_ELEMENTS), each with blocks of FUSED_BLOCK_ROWS (128)."""
    from posenc_lib.attention.layer import choose_attention_path

    scheme = make_scheme("t5", 256, 8, 2, causal=True)
    prep = scheme.prepare(torch.arange(2048), torch.arange(2048))
    q = torch.empty(32, 8, 2048, 32)
    path = choose_attention_path(scheme, q_len=2048, k_len=2048, causal=True, padded=False)
    assert attention.BLOCK_ELEMENTS // (32 * 8 * 2048) == 32
    with torch.enable_grad():
        values, blocks, chunk = _offset_selection(scheme, prep, q, path)
        assert chunk == 4 and {e - s for s, e in blocks} == {attention.FUSED_BLOCK_ROWS} == {128}
        monkeypatch.setattr(attention, "BATCH_CHUNK_ELEMENTS", None)
        values, blocks, chunk = _offset_selection(scheme, prep, q, path)
        assert chunk == 32 and {e - s for s, e in blocks} == {32}
