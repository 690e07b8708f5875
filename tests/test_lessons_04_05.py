"""Properties that lessons 04 (learned positions) and 05 (Shaw relative positions) rely on."""
import math

import pytest
import torch

from posenc_lib import build_model
from posenc_lib.schemes.absolute import LearnedPositionalEmbedding, LearnedScheme, hierarchical_positions
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.schemes.shaw import (ShawRelative, shaw_index, shaw_key_scores, shaw_scores_naive, shaw_value_term,
                             shaw_values_naive)


# -- lesson 04 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.1, 0.4, 0.7, 0.95])
@pytest.mark.parametrize("n", [1, 5, 12])
def test_hierarchical_reproduces_first_n_and_follows_the_formula(n, alpha):
    p = torch.randn(n, 8, dtype=torch.float64)
    q = hierarchical_positions(p, alpha=alpha)
    assert q.shape == (n * n, 8)
    assert torch.allclose(q[:n], p)
    u = (p - alpha * p[0]) / (1 - alpha)
    for i, j in [(0, 0), (n - 1, 0), (0, n - 1), (n // 2, n - 1)]:
        assert torch.allclose(q[i * n + j], alpha * u[i] + (1 - alpha) * u[j])


def test_hierarchical_codes_are_distinct_for_alpha_not_half():
    q = hierarchical_positions(torch.randn(6, 16), alpha=0.4)
    dist = torch.cdist(q, q) + torch.eye(36) * 1e9
    assert dist.min() > 1e-3


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, -0.2, 1.5])
def test_hierarchical_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        hierarchical_positions(torch.randn(4, 8), alpha=alpha)


@pytest.mark.parametrize("shape", [(12,), (2, 6, 8)])
def test_hierarchical_rejects_non_2d_tables(shape):
    with pytest.raises(ValueError, match="shape"):
        hierarchical_positions(torch.randn(*shape))


def test_learned_init_scales():
    # lesson 04 relies on: the scheme's table starts at the token-embedding scale (std 1),
    # the bare module at std 0.02, and init_std is honoured
    torch.manual_seed(0)
    assert abs(LearnedScheme(64, 2, 1, max_len=512).table.weight.std().item() - 1.0) < 0.05
    assert abs(LearnedPositionalEmbedding(512, 64).weight.std().item() - 0.02) < 0.001
    assert abs(LearnedScheme(64, 2, 1, max_len=512, init_std=0.02).table.weight.std().item() - 0.02) < 0.001


def test_learned_table_errors_beyond_max_len_in_the_model():
    table = LearnedPositionalEmbedding(max_len=8, d_model=4)
    assert table(torch.arange(8)).shape == (8, 4)
    with pytest.raises(ValueError, match=r"max_len=8"):
        table(torch.arange(9))
    model = build_model("learned", 11, d_model=16, n_heads=2, num_layers=1, dim_feedforward=32, max_len=8)
    with pytest.raises(ValueError, match=r"position 8 is beyond"):
        model.encode(torch.ones(1, 9, dtype=torch.long))


# -- lesson 05 ---------------------------------------------------------------------------------
def test_shaw_index_small_case():
    pos = torch.arange(6)
    expected = torch.tensor([[2, 3, 4, 4, 4, 4], [1, 2, 3, 4, 4, 4], [0, 1, 2, 3, 4, 4],
                             [0, 0, 1, 2, 3, 4], [0, 0, 0, 1, 2, 3], [0, 0, 0, 0, 1, 2]])
    assert torch.equal(shaw_index(pos, pos, 2), expected)


@pytest.mark.parametrize("q_pos,k_pos", [(torch.arange(9), torch.arange(9)), (torch.tensor([7]), torch.arange(8)),
                                         (torch.arange(3, 7), torch.arange(7))])
def test_shaw_efficient_equals_naive(q_pos, k_pos):
    b, h, d, k = 2, 3, 5, 2
    q = torch.randn(b, h, len(q_pos), d, dtype=torch.float64)
    kk = torch.randn(b, h, len(k_pos), d, dtype=torch.float64)
    v = torch.randn(b, h, len(k_pos), d, dtype=torch.float64)
    w_k, w_v = torch.randn(2 * k + 1, d, dtype=torch.float64), torch.randn(2 * k + 1, d, dtype=torch.float64)
    idx = shaw_index(q_pos, k_pos, k)
    scores = q @ kk.transpose(-1, -2) + shaw_key_scores(q, w_k, idx)
    assert torch.allclose(scores, shaw_scores_naive(q, kk, w_k, idx))
    probs = torch.softmax(scores / math.sqrt(d), dim=-1)
    assert torch.allclose(probs @ v + shaw_value_term(probs, w_v, idx), shaw_values_naive(probs, v, w_v, idx))


def test_shaw_layer_is_translation_invariant_and_uses_relative_positions():
    attn = MultiHeadAttention(16, 2).eval()
    scheme = ShawRelative(16, 2, num_layers=1, max_relative_position=3)
    x = torch.randn(2, 7, 16)
    pos = torch.arange(7)
    out = attn(x, scheme=scheme, prep=scheme.prepare(pos, pos), layer=0)
    shifted = attn(x, scheme=scheme, prep=scheme.prepare(pos + 1000, pos + 1000), layer=0)
    assert torch.equal(out, shifted)
    plain = attn(x)
    assert not torch.allclose(out, plain, atol=1e-4)  # the position terms do change the output


@pytest.mark.parametrize("L,k", [(16, 3), (24, 5)])
def test_shaw_gather_and_sum_per_distance_are_adjoint(L, k):
    # lesson 05: the key term's gather and the value term's sum per distance are each other's backward pass
    q = torch.randn(2, 3, L, 2 * k + 1, dtype=torch.float64)
    grad = torch.randn(2, 3, L, L, dtype=torch.float64)
    idx = shaw_index(torch.arange(L), torch.arange(L), k)
    eye = torch.eye(2 * k + 1, dtype=torch.float64)
    per_distance = shaw_value_term(grad, eye, idx)                    # sum of grad over the keys of each distance
    expected = torch.zeros(2, 3, L, 2 * k + 1, dtype=torch.float64).scatter_add_(-1, idx.expand(2, 3, L, L), grad)
    assert torch.allclose(per_distance, expected)
    lhs = (shaw_key_scores(q, eye, idx) * grad).sum()                 # <gather(S), G>, with S = q here
    rhs = (q * per_distance).sum()                                    # <S, sum per distance of G>
    assert torch.allclose(lhs, rhs)


def test_shaw_clipping_leaks_the_distance_to_the_ends():
    # lesson 05: identical tokens get different outputs, on a line in the position, from the clipped end rows
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    scheme = ShawRelative(32, 4, num_layers=1, max_relative_position=3)
    same = torch.randn(1, 1, 32).expand(1, 16, 32)
    pos = torch.arange(16)
    with torch.no_grad():
        out = attn(same, scheme=scheme, prep=scheme.prepare(pos, pos), layer=0)[0]
    inner = out[3:13]                                                 # queries with keys in both end rows
    steps = inner[1:] - inner[:-1]
    assert steps.norm(dim=-1).min() > 1e-3                            # every position differs from its neighbour
    cos = torch.nn.functional.cosine_similarity(steps[:-1], steps[1:], dim=-1)
    assert cos.min() > 0.99                                           # and they lie on (nearly) a straight line


def test_rotation_in_each_pair_makes_the_position_term_toeplitz_and_signed():
    # lesson 05: p_i W p_j^T with W = I is symmetric; with W = T_3^T it is Toeplitz and peaks at j - i = +3
    from posenc_lib.schemes.sinusoidal import sinusoidal_shift_matrix, sinusoidal_table

    p = sinusoidal_table(24, 64).double()
    sym = p @ p.T
    assert torch.allclose(sym, sym.T)
    m = p @ sinusoidal_shift_matrix(3, 64).double().T @ p.T
    assert torch.allclose(m[1:, 1:], m[:-1, :-1], atol=1e-4)          # a function of j - i only
    profile = torch.stack([m.diagonal(d).mean() for d in range(-6, 7)])
    assert int(profile.argmax()) - 6 == 3 and not torch.allclose(m, m.T, atol=1e-2)
