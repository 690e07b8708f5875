"""Properties that lessons 01-03 teach, checked on the library (beyond test_properties.py)."""
import math

import pytest
import torch

from posenc_lib import (
    MultiHeadAttention,
    binary_positions,
    sinusoidal_shift_matrix,
    sinusoidal_table,
    sinusoidal_table_2d,
)
from posenc_lib.schemes.sinusoidal import sinusoidal_encode, sinusoidal_frequencies


def test_attention_layer_is_permutation_equivariant_but_causal_is_not():
    mha = MultiHeadAttention(d_model=16, n_heads=4).eval()
    x = torch.randn(2, 7, 16)
    perm = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        assert torch.allclose(mha(x[:, perm]), mha(x)[:, perm], atol=1e-5)
        _, a = mha(x, need_weights=True)
        _, a_p = mha(x[:, perm], need_weights=True)
        assert torch.allclose(a_p, a[:, :, perm][:, :, :, perm], atol=1e-6)
        assert not torch.allclose(mha(x[:, perm], causal=True), mha(x, causal=True)[:, perm], atol=1e-3)


def test_cross_attention_is_invariant_to_memory_order():
    mha = MultiHeadAttention(d_model=16, n_heads=2).eval()
    x, mem = torch.randn(1, 4, 16), torch.randn(1, 6, 16)
    with torch.no_grad():
        assert torch.allclose(mha(x, kv=mem), mha(x, kv=mem[:, torch.randperm(6)]), atol=1e-5)


def test_binary_squared_distance_is_hamming_and_fixed_width_is_length_independent():
    p = binary_positions(64)
    hamming = torch.cdist(p, p, p=1)
    assert torch.allclose(torch.cdist(p, p) ** 2, hamming, atol=1e-4)
    assert hamming[31, 32] == 6 and hamming[0, 32] == 1
    assert torch.equal(binary_positions(5, n_bits=8), binary_positions(50, n_bits=8)[:5])


@pytest.mark.parametrize("delta", [0.5, -2.25, 7.0])
def test_fractional_shift_rotates_fractional_positions(delta):
    t = torch.arange(50, dtype=torch.float64)
    T = sinusoidal_shift_matrix(delta, 32).double()
    assert torch.allclose(sinusoidal_encode(t, 32) @ T.T, sinusoidal_encode(t + delta, 32), atol=1e-5)


def test_codes_have_constant_norm_and_the_paper_wavelengths():
    pe = sinusoidal_table(300, 128)
    assert torch.allclose(pe.pow(2).sum(1), torch.full((300,), 64.0), atol=1e-3)
    lam = 2 * math.pi / sinusoidal_frequencies(128, dtype=torch.float64)
    assert lam[0].item() == pytest.approx(2 * math.pi)
    assert lam[-1].item() == pytest.approx(2 * math.pi * 10000 ** (126 / 128))


def test_2d_dot_product_is_sum_of_row_and_column_terms():
    grid = sinusoidal_table_2d(6, 7, 32).double()
    f = lambda k: torch.cos(sinusoidal_frequencies(16, dtype=torch.float64) * k).sum()  # noqa: E731
    for (r, c), (a, b) in [((0, 0), (3, 5)), ((5, 6), (-2, -4)), ((2, 3), (1, -3))]:
        assert (grid[r, c] @ grid[r + a, c + b]).item() == pytest.approx((f(a) + f(b)).item(), abs=1e-4)


def test_float64_positions_give_float64_codes():
    assert sinusoidal_encode(torch.arange(4, dtype=torch.float64), 8).dtype == torch.float64
    assert sinusoidal_encode(torch.arange(4), 8).dtype == torch.float32


@pytest.mark.parametrize("delta", [1, 5, 17, -3])
def test_shift_identity_holds_to_float64_rounding(delta):
    # lesson 03's central identity T_delta PE_t = PE_(t+delta), checked in float64 as the lesson does
    t = torch.arange(200, dtype=torch.float64)
    w = sinusoidal_frequencies(128, dtype=torch.float64) * delta
    T = torch.block_diag(*[torch.tensor([[c, s], [-s, c]], dtype=torch.float64) for c, s in zip(w.cos().tolist(), w.sin().tolist())])
    assert (sinusoidal_encode(t, 128) @ T.T - sinusoidal_encode(t + delta, 128)).abs().max() < 1e-12
    assert torch.allclose(T.float(), sinusoidal_shift_matrix(delta, 128), atol=1e-6)


@pytest.mark.parametrize("delta", [3, -5])
def test_query_projection_T_delta_makes_a_head_look_delta_tokens_away(delta):
    p = sinusoidal_encode(torch.arange(40, dtype=torch.float64), 128)
    scores = (p @ sinusoidal_shift_matrix(delta, 128).double().T) @ p.T
    rows = torch.arange(max(0, -delta), 40 - max(0, delta))
    assert torch.equal(scores[rows].argmax(dim=1), rows + delta)


def test_far_sinusoidal_codes_leave_the_range_seen_in_training():
    seen, far = sinusoidal_table(50, 128), sinusoidal_table(501, 128)[500]
    outside = (far < seen.min(0).values - 1e-6) | (far > seen.max(0).values + 1e-6)
    assert outside.sum() > 32
