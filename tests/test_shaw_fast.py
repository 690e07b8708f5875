"""The fast Shaw key/value terms equal the naive (L, L, d) ones, values and gradients."""
import pytest
import torch

from posenc_lib import build_model
from posenc_lib.schemes.shaw import (
    shaw_index,
    shaw_key_scores,
    shaw_plan,
    shaw_scores_naive,
    shaw_value_term,
    shaw_values_naive,
)

CASES = [  # q_len, k_len, k, first query position
    (1, 1, 1, 0),
    (6, 6, 2, 0),
    (6, 6, 16, 0),  # k larger than the sequence: no clipped keys at all
    (40, 40, 4, 0),  # mostly clipped
    (1, 12, 3, 11),  # a cached decoder step: one query against all keys
    (3, 12, 3, 9),
]


def _inputs(lq, lk, k, off, dtype=torch.float64):
    g = torch.Generator().manual_seed(lq * 100 + lk + k)
    q = torch.randn(2, 3, lq, 8, dtype=dtype, generator=g)
    kk = torch.randn(2, 3, lk, 8, dtype=dtype, generator=g)
    v = torch.randn(2, 3, lk, 8, dtype=dtype, generator=g)
    tk = torch.randn(2 * k + 1, 8, dtype=dtype, generator=g)
    tv = torch.randn(2 * k + 1, 8, dtype=dtype, generator=g)
    idx = shaw_index(torch.arange(off, off + lq), torch.arange(lk), k)
    return q, kk, v, tk, tv, idx


@pytest.mark.parametrize("lq,lk,k,off", CASES)
def test_values_and_gradients_match_naive(lq, lk, k, off):
    q, kk, v, tk, tv, idx = _inputs(lq, lk, k, off)
    leaves = [t.requires_grad_() for t in (q, tk, tv)]

    def fast():
        s = q @ kk.transpose(-1, -2) + shaw_key_scores(q, tk, idx)
        p = torch.softmax(s, -1)
        return s, p @ v + shaw_value_term(p, tv, idx)

    def naive():
        s = shaw_scores_naive(q, kk, tk, idx)
        return s, shaw_values_naive(torch.softmax(s, -1), v, tv, idx)

    (s1, z1), (s2, z2) = fast(), naive()
    torch.testing.assert_close(s1, s2)
    torch.testing.assert_close(z1, z2)
    w = torch.randn_like(z1)
    g1 = torch.autograd.grad((z1 * w).sum() + s1.square().mean(), leaves)
    g2 = torch.autograd.grad((z2 * w).sum() + s2.square().mean(), leaves)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("lq,lk,k,off", [(5, 5, 1, 0), (1, 6, 2, 5)])
def test_gradcheck(lq, lk, k, off):
    q, _, _, tk, tv, idx = _inputs(lq, lk, k, off)
    q, tk, tv = q[:1, :1, :, :3], tk[:, :3], tv[:, :3]  # small: gradcheck perturbs every input
    p = torch.softmax(torch.randn(1, 1, lq, lk, dtype=torch.float64), -1)
    for t in (q, tk, tv, p):
        t.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: shaw_key_scores(a, b, idx), (q, tk))
    assert torch.autograd.gradcheck(lambda a, b: shaw_value_term(a, b, idx), (p, tv))


def test_float32_close_to_naive_at_longer_length():
    q, kk, v, tk, tv, idx = _inputs(130, 130, 16, 0, dtype=torch.float32)
    p = torch.softmax(q @ kk.transpose(-1, -2), -1)
    torch.testing.assert_close(q @ kk.transpose(-1, -2) + shaw_key_scores(q, tk, idx), shaw_scores_naive(q, kk, tk, idx))
    torch.testing.assert_close(p @ v + shaw_value_term(p, tv, idx), shaw_values_naive(p, v, tv, idx))


def test_plan_falls_back_for_an_index_with_repeated_inner_rows():
    idx = torch.tensor([[1, 1, 2], [0, 1, 1]])  # row 1 hit twice: not a Shaw index of distinct positions
    plan = shaw_plan(idx, 3)
    assert not plan.fast
    p = torch.rand(1, 1, 2, 3, dtype=torch.float64)
    tv = torch.randn(3, 4, dtype=torch.float64)
    torch.testing.assert_close(shaw_value_term(p, tv, idx, plan), torch.einsum("bhij,ijd->bhid", p, tv[idx]))


def test_plan_for_another_index_is_rejected():
    a = shaw_index(torch.arange(4), torch.arange(4), 2)
    b = shaw_index(torch.arange(4), torch.arange(4), 1)
    with pytest.raises(ValueError, match="different index"):
        shaw_key_scores(torch.randn(1, 1, 4, 2), torch.randn(5, 2), a, shaw_plan(b, 3))


def test_model_with_cache_matches_full_decoder():
    model = build_model("shaw", 50, d_model=16, n_heads=2, num_layers=1, dim_feedforward=32, dropout=0.0).eval()
    src, tgt = torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 6))
    with torch.no_grad():
        mem = model.encode(src)
        full = model.decode(tgt, mem)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, t : t + 1], mem, cache=cache) for t in range(tgt.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
