"""Parity with outside implementations: Hugging Face ``transformers``' own T5, DeBERTa-v2,
XLNet, Llama and RoFormer code on tiny random configs (no download, no hub)."""
import math
import warnings

import pytest
import torch

warnings.filterwarnings("ignore")
transformers = pytest.importorskip("transformers")

from posenc_lib import alibi_slopes, apply_rope, deberta_log_bucket, t5_relative_bucket  # noqa: E402
from posenc_lib.attention.layer import MultiHeadAttention  # noqa: E402
from posenc_lib.schemes.deberta import DebertaDisentangled  # noqa: E402
from posenc_lib.schemes.t5 import T5Bias  # noqa: E402
from posenc_lib.schemes.xlnet import XLNetRelative, rel_shift  # noqa: E402


# ---------------------------------------------------------------------------- T5
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (16, 64)])
def test_t5_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 301)[None, :] - torch.arange(0, 1)[:, None]
    ours = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)
    ref = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_bias_matches_compute_bias(is_decoder):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=is_decoder)
    ref = T5Attention(cfg, has_relative_attention_bias=True).eval()
    ours = T5Bias(32, 4, 1, causal=is_decoder)
    with torch.no_grad():
        ours.relative_attention_bias.weight.copy_(ref.relative_attention_bias.weight)
    q_len, k_len = 40, 300
    with torch.no_grad():
        expected = ref.compute_bias(q_len, k_len)
        got = ours.compute_bias(torch.arange(q_len), torch.arange(k_len))
    assert got.shape == expected.shape == (1, 4, q_len, k_len)
    torch.testing.assert_close(got, expected)


# ---------------------------------------------------------------------------- DeBERTa
def test_deberta_log_bucket_matches_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = torch.arange(-700, 701)
    for bucket_size, max_position in [(256, 512), (32, 128), (8, 40)]:
        ref = make_log_bucket_position(rel, bucket_size, max_position).long()
        assert torch.equal(deberta_log_bucket(rel, bucket_size, max_position), ref)


def _deberta_pair(hidden=32, heads=4, buckets=8, max_rel=40):
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    cfg = DebertaV2Config(hidden_size=hidden, num_attention_heads=heads, relative_attention=True,
                          position_buckets=buckets, max_relative_positions=max_rel, share_att_key=True,
                          pos_att_type=["p2c", "c2p"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = DisentangledSelfAttention(cfg).eval()
    scheme = DebertaDisentangled(hidden, heads, 1, position_buckets=buckets, max_relative_positions=max_rel)
    attn = MultiHeadAttention(hidden, heads)
    with torch.no_grad():
        for ours, theirs in [(attn.q_proj, ref.query_proj), (attn.k_proj, ref.key_proj), (attn.v_proj, ref.value_proj)]:
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        attn.out_proj.weight.copy_(torch.eye(hidden))
        attn.out_proj.bias.zero_()
    return ref, scheme, attn.eval()


def test_deberta_disentangled_attention_matches_transformers():
    ref, scheme, attn = _deberta_pair()
    x = torch.randn(2, 30, 32)  # length 30 > buckets: exercises the log buckets and clipping
    pos = torch.arange(30)
    prep = scheme.prepare(pos, pos)
    mask = torch.ones(2, 1, 30, 30, dtype=torch.bool)
    with torch.no_grad():
        expected, _ = ref(x, mask, rel_embeddings=prep["rel"])
        got = attn(x, scheme=scheme, prep=prep)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_deberta_long_input_in_query_blocks_matches_transformers(monkeypatch):
    """Query blocks of a long input (the fused CPU path): far from the diagonal every key of a block falls in
    one clipped bucket, where the terms are built as broadcast sums; still equal to transformers'."""
    from posenc_lib.attention import layer as attention
    from posenc_lib.schemes import deberta

    ref, scheme, attn = _deberta_pair()
    n = 120  # > max_relative_positions (40): distances clip
    x, pos = torch.randn(2, n, 32), torch.arange(n)
    prep = scheme.prepare(pos, pos)
    mask = torch.ones(2, 1, n, n, dtype=torch.bool)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 2 * 4 * 8 * n)  # blocks of 8 query rows
    ends = []
    real = deberta.clipped_ends
    monkeypatch.setattr(deberta, "clipped_ends", lambda index: ends.append(real(index)) or ends[-1])
    with torch.no_grad():
        expected, _ = ref(x, mask, rel_embeddings=prep["rel"])
        got = attn(x, scheme=scheme, prep=prep)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert any(left > 0 for left, _ in ends) and any(right < n for _, right in ends)


@pytest.mark.parametrize("path", ["explicit", "fused", "sides"])
def test_deberta_matches_transformers_with_gradients(path, monkeypatch):
    """With gradients on, the explicit path and the fused CPU path (in one block, ``FUSED_MIN_ELEMENTS``; or in blocks
    of 6 rows with relative positions clipped at 10, so that the keys beyond run without a mask) give transformers'
    output and its gradient for the input and the query projection."""
    from posenc_lib.attention import cpu_flash
    from posenc_lib.attention import layer as attention

    ref, scheme, attn = _deberta_pair(max_rel=10) if path == "sides" else _deberta_pair()
    monkeypatch.setattr(attention, "FUSED_MIN_ELEMENTS", None if path == "explicit" else 1)
    if path == "sides":
        monkeypatch.setattr(attention, "SIDED_BLOCK_ROWS", 6)
    used = []
    real = cpu_flash.flash_blocks  # a layer's blocks in one node, the tables projected once

    def spy(*a, ranges=None, sides=None, **kw):
        used.append(ranges)
        return real(*a, ranges=ranges, sides=sides, **kw)

    monkeypatch.setattr(cpu_flash, "flash_blocks", spy)
    x = torch.randn(2, 30, 32, requires_grad=True)
    pos = torch.arange(30)
    prep = scheme.prepare(pos, pos)
    mask = torch.ones(2, 1, 30, 30, dtype=torch.bool)
    d_out = torch.randn(2, 30, 32)
    expected, _ = ref(x, mask, rel_embeddings=prep["rel"])
    want = torch.autograd.grad(expected, [x, ref.query_proj.weight], d_out)
    got = attn(x, scheme=scheme, prep=prep)
    have = torch.autograd.grad(got, [x, attn.q_proj.weight], d_out)
    assert len(used) == (path != "explicit")
    if path == "sides":  # buckets clipped for i - j >= 7 and <= -10: rows 12-17 split off keys 0-5 and 27-29
        assert used[0][2] == (6, 27)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    for name, a, b in zip(("d_x", "d_query_proj"), have, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def test_deberta_scale_is_one_over_sqrt_3d():
    assert DebertaDisentangled.score_terms == 3


# ---------------------------------------------------------------------------- XLNet
def _xlnet_pair(d_model=32, n_head=4):
    from transformers import XLNetConfig, XLNetModel
    from transformers.models.xlnet.modeling_xlnet import XLNetRelativeAttention

    cfg = XLNetConfig(vocab_size=10, d_model=d_model, n_layer=1, n_head=n_head, d_inner=64, dropout=0.0)
    ref = XLNetRelativeAttention(cfg).eval()
    with torch.no_grad():
        for p in (ref.r, ref.r_w_bias, ref.r_r_bias):
            p.normal_(0, 0.3)
    model = XLNetModel(cfg).eval()
    scheme = XLNetRelative(d_model, n_head, 1)
    with torch.no_grad():
        scheme.r_proj[0].copy_(ref.r.reshape(d_model, d_model))
        scheme.u[0].copy_(ref.r_w_bias)
        scheme.v[0].copy_(ref.r_r_bias)
    return ref, model, scheme


@pytest.mark.parametrize("q_len,k_len", [(9, 9), (3, 11), (1, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_xlnet_relative_attention_matches_transformers(q_len, k_len, causal):
    """The last ``q_len`` positions attend to ``k_len`` keys (XLNet's memory / our decoding cache)."""
    ref, model, scheme = _xlnet_pair()
    b, h, d = 2, 4, 8
    q, k, v = torch.randn(b, h, q_len, d), torch.randn(b, h, k_len, d), torch.randn(b, h, k_len, d)
    q_pos, k_pos = torch.arange(k_len - q_len, k_len), torch.arange(k_len)
    with torch.no_grad():
        pos_emb = model.relative_positional_encoding(q_len, k_len, bsz=b)  # (P, b, d_model)
        k_head_r = torch.einsum("ibh,hnd->ibnd", pos_emb, ref.r)
        to_ibnd = lambda t: t.permute(2, 0, 1, 3)  # noqa: E731
        mask = None
        if causal:
            future = (k_pos[None, :] > q_pos[:, None]).float()  # 1 = masked, (i, j)
            mask = future[:, :, None, None].expand(q_len, k_len, b, h)
        expected = ref.rel_attn_core(to_ibnd(q), to_ibnd(k), to_ibnd(v), k_head_r, attn_mask=mask)
        prep = scheme.prepare(q_pos, k_pos)
        s = (q @ k.transpose(-1, -2) + scheme.scores(q, k, prep, 0, None)) / math.sqrt(d)
        if causal:
            s = s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
        got = torch.softmax(s, -1) @ v
    torch.testing.assert_close(got.permute(2, 0, 1, 3), expected, atol=1e-5, rtol=1e-4)


def test_rel_shift_equals_gather_and_xlnet_shift():
    from transformers.models.xlnet.modeling_xlnet import XLNetRelativeAttention

    lq, lk = 5, 8
    p = lq + lk - 1
    x = torch.randn(2, 3, lq, p)
    ours = rel_shift(x, lk)
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    assert torch.equal(ours, x[..., i, j + lq - 1 - i])
    # XLNet keeps one more distance column (klen) at the front: prepend it and compare.
    x_xl = torch.cat((torch.randn(2, 3, lq, 1), x), dim=-1)
    assert torch.equal(XLNetRelativeAttention.rel_shift_bnij(x_xl, klen=lk), ours)


# ---------------------------------------------------------------------------- RoPE
def test_half_split_rope_matches_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    rot = LlamaRotaryEmbedding(cfg)
    q, k = torch.randn(2, 4, 50, 16), torch.randn(2, 4, 50, 16)
    position_ids = torch.arange(100, 150)[None].expand(2, 50)
    cos, sin = rot(q, position_ids)
    eq, ek = apply_rotary_pos_emb(q, k, cos, sin)
    positions = torch.arange(100, 150)
    torch.testing.assert_close(apply_rope(q, positions, interleaved=False), eq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k, positions, interleaved=False), ek, atol=1e-5, rtol=1e-5)


def test_interleaved_rope_matches_roformer():
    from transformers.models.roformer.modeling_roformer import (
        RoFormerSelfAttention,
        RoFormerSinusoidalPositionalEmbedding,
    )

    emb = RoFormerSinusoidalPositionalEmbedding(64, 16)
    with torch.no_grad():
        emb.weight.copy_(emb.create_weight())  # a standalone instance starts random
    q, k = torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    sinusoidal_pos = emb((2, 40))[None, None]
    eq, ek = RoFormerSelfAttention.apply_rotary_position_embeddings(sinusoidal_pos, q, k)
    torch.testing.assert_close(apply_rope(q), eq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(apply_rope(k), ek, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_closed_form():
    """Powers of two: 2^(-8h/n). 12 heads: the 8-head slopes, then every other 16-head slope."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** (-h) for h in range(1, 9)]))
    s16 = [2.0 ** (-0.5 * h) for h in range(1, 17)]
    expected12 = [2.0 ** (-h) for h in range(1, 9)] + s16[0::2][:4]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected12))


def test_alibi_slopes_match_bloom():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n in (4, 6, 8, 12, 16):
        mask = torch.ones(1, 5)
        alibi = build_alibi_tensor(mask, n, torch.float32)  # (n, 1, 5) = slope * position
        torch.testing.assert_close(alibi[:, 0, 1], alibi_slopes(n))
