"""Closed-form properties of the encodings (hypothesis where it fits)."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc_lib import (
    alibi_bias,
    alibi_slopes,
    apply_rope,
    apply_rope_complex,
    binary_positions,
    hierarchical_positions,
    normalized_positions,
    sinusoidal_shift_matrix,
    sinusoidal_table,
    sinusoidal_table_2d,
    t5_relative_bucket,
)
from posenc_lib.schemes.rotary import interleaved_to_half_permutation, rope_cos_sin, RotaryCache
from posenc_lib.schemes.shaw import shaw_index, shaw_key_scores, shaw_scores_naive, shaw_value_term, shaw_values_naive

SETTINGS = settings(max_examples=25, deadline=None)


# ----------------------------------------------------------------- sinusoidal
def test_sinusoidal_layout_and_values():
    pe = sinusoidal_table(50, 16)
    assert pe.shape == (50, 16) and pe.dtype == torch.float32
    t, i = 7, 3
    w = 10000 ** (-2 * i / 16)
    assert math.isclose(pe[t, 2 * i].item(), math.sin(t * w), abs_tol=1e-6)
    assert math.isclose(pe[t, 2 * i + 1].item(), math.cos(t * w), abs_tol=1e-6)


@SETTINGS
@given(delta=st.integers(-40, 40), dim=st.sampled_from([8, 16, 64]))
def test_sinusoidal_shift_is_a_rotation(delta, dim):
    pe = sinusoidal_table(200, dim).double()
    T = sinusoidal_shift_matrix(delta, dim).double()
    torch.testing.assert_close(T @ T.T, torch.eye(dim, dtype=torch.float64), atol=1e-6, rtol=0)
    t = torch.arange(50, 150)
    torch.testing.assert_close(pe[t + delta], pe[t] @ T.T, atol=1e-4, rtol=0)


@SETTINGS
@given(delta=st.integers(0, 60))
def test_sinusoidal_dot_product_depends_only_on_distance(delta):
    pe = sinusoidal_table(300, 32).double()
    dots = (pe[:200] * pe[delta : 200 + delta]).sum(-1)
    expected = torch.cos(delta * 10000 ** (-torch.arange(0, 32, 2).double() / 32)).sum()
    torch.testing.assert_close(dots, expected.expand(200), atol=1e-4, rtol=0)


def test_sinusoidal_2d_codes_rows_and_columns():
    pe = sinusoidal_table_2d(4, 5, 16)
    assert pe.shape == (4, 5, 16)
    assert torch.equal(pe[2, 0, :8], pe[2, 4, :8]) and torch.equal(pe[0, 3, 8:], pe[3, 3, 8:])


# ----------------------------------------------------------------- absolute
def test_binary_and_normalized_positions():
    b = binary_positions(8)
    assert b.shape == (8, 3) and torch.equal(b[5], torch.tensor([1.0, 0.0, 1.0]))
    assert len({tuple(r.tolist()) for r in binary_positions(100)}) == 100
    n = normalized_positions(5)
    assert n[0] == 0 and n[-1] == 1 and torch.allclose(n[1:] - n[:-1], torch.full((4,), 0.25))


def test_hierarchical_extension_reproduces_table():
    p = torch.randn(10, 6)
    q = hierarchical_positions(p, alpha=0.4)
    assert q.shape == (100, 6)
    torch.testing.assert_close(q[:10], p)
    assert len({tuple(r.round(decimals=5).tolist()) for r in q}) == 100


# ----------------------------------------------------------------- RoPE
@SETTINGS
@given(m=st.integers(0, 2000), n=st.integers(0, 2000), shift=st.integers(-500, 500),
       interleaved=st.booleans())
def test_rope_scores_depend_only_on_relative_position(m, n, shift, interleaved):
    g = torch.Generator().manual_seed(m * 7 + n)
    q, k = torch.randn(1, 32, generator=g, dtype=torch.float64), torch.randn(1, 32, generator=g, dtype=torch.float64)
    shift = max(shift, -min(m, n))

    def score(a, b):
        qa = apply_rope(q, torch.tensor([a]), interleaved=interleaved)
        kb = apply_rope(k, torch.tensor([b]), interleaved=interleaved)
        return (qa * kb).sum()

    torch.testing.assert_close(score(m, n), score(m + shift, n + shift), atol=1e-3, rtol=1e-4)


@SETTINGS
@given(interleaved=st.booleans(), offset=st.integers(0, 5000))
def test_rope_preserves_norms(interleaved, offset):
    x = torch.randn(3, 10, 16)
    y = apply_rope(x, torch.arange(offset, offset + 10), interleaved=interleaved)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-4, rtol=1e-5)


def test_rope_three_implementations_agree():
    x = torch.randn(2, 4, 12, 16)
    pos = torch.arange(3, 15)
    torch.testing.assert_close(apply_rope(x, pos), apply_rope_complex(x, pos), atol=1e-5, rtol=1e-5)
    perm = interleaved_to_half_permutation(16)
    torch.testing.assert_close(apply_rope(x, pos)[..., perm], apply_rope(x[..., perm], pos, interleaved=False),
                               atol=1e-5, rtol=1e-5)


def test_rope_phases_in_float32_for_half_inputs():
    x = torch.randn(1, 1, 4, 64)
    pos = torch.arange(40000, 40004)
    ref = apply_rope(x.double(), pos)
    bf = apply_rope(x.bfloat16(), pos).double()
    assert (bf - ref).abs().max() < 0.05  # bf16 storage error only, not bf16 phases
    cos, _ = rope_cos_sin(pos, 64)
    assert cos.dtype == torch.float32


def test_rotary_cache_grows_and_matches():
    cache = RotaryCache(16)
    pos = torch.arange(100, 300)
    cos, sin = cache(pos)
    c2, s2 = rope_cos_sin(pos, 16)
    torch.testing.assert_close(cos, c2)
    torch.testing.assert_close(sin, s2)


# ----------------------------------------------------------------- T5, ALiBi, Shaw
def test_t5_buckets_are_monotone_and_bounded():
    rel = torch.arange(-500, 501)
    b = t5_relative_bucket(rel, True, 32, 128)
    assert b.min() >= 0 and b.max() <= 31
    d = torch.arange(8)
    assert torch.equal(b[500 - d], d)  # keys in the past: exact buckets 0..7
    assert torch.equal(b[500 + d[1:]], 16 + d[1:])  # keys in the future: the other half
    causal = t5_relative_bucket(rel, False, 32, 128)
    assert torch.all(causal[501:] == 0)  # future keys collapse into bucket 0
    neg = causal[:501].flip(0)  # distance 0, 1, 2, ... into the past
    assert torch.all(neg[1:] >= neg[:-1]) and neg[200] == 31


def test_alibi_bias_is_linear_and_symmetric():
    pos = torch.arange(6)
    slopes = alibi_slopes(4)
    bias = alibi_bias(pos, pos, slopes)[0]
    assert bias.shape == (4, 6, 6)
    torch.testing.assert_close(bias, bias.transpose(-1, -2))
    torch.testing.assert_close(bias[:, 5, 0], -5 * slopes)


@SETTINGS
@given(length=st.integers(1, 20), k=st.integers(1, 6))
def test_shaw_efficient_equals_naive(length, k):
    q, kk, v = (torch.randn(2, 3, length, 8, dtype=torch.float64) for _ in range(3))
    tk, tv = torch.randn(2 * k + 1, 8, dtype=torch.float64), torch.randn(2 * k + 1, 8, dtype=torch.float64)
    pos = torch.arange(length)
    idx = shaw_index(pos, pos, k)
    fast = q @ kk.transpose(-1, -2) + shaw_key_scores(q, tk, idx)
    torch.testing.assert_close(fast, shaw_scores_naive(q, kk, tk, idx))
    probs = torch.softmax(fast, -1)
    torch.testing.assert_close(probs @ v + shaw_value_term(probs, tv, idx), shaw_values_naive(probs, v, tv, idx))


def test_shaw_index_clips():
    idx = shaw_index(torch.arange(5), torch.arange(5), 2)
    assert idx.tolist()[0] == [2, 3, 4, 4, 4] and idx.tolist()[4] == [0, 0, 0, 1, 2]


# ----------------------------------------------------------------- attention dispatch
@SETTINGS
@given(q_len=st.integers(1, 6), cached=st.integers(0, 4), causal=st.booleans(), padded=st.booleans(),
       pe=st.sampled_from(["none", "rope", "alibi", "t5"]))
def test_fused_path_equals_explicit_path_for_every_shape(q_len, cached, causal, padded, pe):
    """Whatever ``choose_attention_path`` picks (is_causal, no mask for one query, a boolean or a
    float mask) gives the explicit softmax's result, with and without cached keys."""
    from posenc_lib import make_scheme
    from posenc_lib.attention.layer import MultiHeadAttention

    g = torch.Generator().manual_seed(q_len * 31 + cached * 7 + causal * 3 + padded)
    attn = MultiHeadAttention(16, 2).eval()
    scheme = make_scheme(pe, 16, 2, 1, causal=causal)
    k_len = cached + q_len
    prep = scheme.prepare(torch.arange(cached, k_len), torch.arange(k_len))
    x = torch.randn(2, q_len, 16, generator=g)
    past = {"k": torch.randn(2, 2, cached, 8, generator=g), "v": torch.randn(2, 2, cached, 8, generator=g)}
    pad = None
    if padded:
        pad = torch.zeros(2, k_len, dtype=torch.bool)
        pad[1, 0] = True  # the oldest key of row 1 is padding
    outs = []
    for weights in (False, True):
        cache = {key: t.clone() for key, t in past.items()} if cached else None
        out = attn(x, causal=causal, scheme=scheme, prep=prep, key_padding_mask=pad, cache=cache, need_weights=weights)
        outs.append(out[0] if weights else out)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-4)
