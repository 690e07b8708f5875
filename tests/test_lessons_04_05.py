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
    out = attn(x, pos=scheme, ctx=scheme.prepare(pos, pos), layer=0)
    shifted = attn(x, pos=scheme, ctx=scheme.prepare(pos + 1000, pos + 1000), layer=0)
    assert torch.equal(out, shifted)
    plain = attn(x)
    assert not torch.allclose(out, plain, atol=1e-4)  # the position terms do change the output
