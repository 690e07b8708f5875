"""The survey's extra schemes: 2-D positions, URPE, FLOATER, complex-order embeddings, un-bucketed T5."""
import pytest
import torch

from posenc_lib.schemes.complex_order import ComplexOrderEmbedding
from posenc_lib.schemes.floater import Floater
from posenc_lib.schemes.t5 import t5_distance_index
from posenc_lib.schemes.twod import RelativeBias2D, axial_rope, grid_positions, relative_offsets_2d, sinusoidal_table_2d
from posenc_lib.schemes.urpe import URPE, toeplitz_from_distances


def test_grid_positions_are_row_major():
    p = grid_positions(3, 4)
    assert p.shape == (12, 2)
    assert p[5].tolist() == [1, 1] and p[11].tolist() == [2, 3]


def test_2d_sinusoidal_codes_rows_and_columns_apart():
    t = sinusoidal_table_2d(5, 6, 16)
    assert torch.equal(t[2, 0, :8], t[2, 5, :8])      # same row -> same first half
    assert torch.equal(t[0, 3, 8:], t[4, 3, 8:])      # same column -> same second half
    assert t.reshape(30, 16).unique(dim=0).shape[0] == 30


def test_2d_relative_bias_depends_on_offset_only():
    torch.manual_seed(0)
    bias = RelativeBias2D(2, 5, 5)(4, 5)[0]           # (heads, 20, 20)
    off = relative_offsets_2d(grid_positions(4, 5))
    for dy, dx in [(0, 1), (2, 3), (-1, -2), (3, -4)]:          # every pair of patches with this offset
        sel = (off[..., 0] == dy) & (off[..., 1] == dx)
        assert sel.sum() > 0
        assert (bias[:, sel] == bias[:, sel][:, :1]).all()
    # patches (0,1)->(1,1) (one down) and (0,1)->(0,2) (one right) are different offsets
    assert not torch.equal(bias[:, 1, 6], bias[:, 1, 2])
    with pytest.raises(ValueError, match="grid"):
        RelativeBias2D(2, 3, 3)(4, 3)


def test_axial_rope_scores_depend_on_2d_offset_only():
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)
    pos = grid_positions(6, 6)
    qs, ks = axial_rope(q.expand(36, 16), pos), axial_rope(k.expand(36, 16), pos)
    s = qs @ ks.T
    off = relative_offsets_2d(pos)
    # every pair with the same (dy, dx) has the same score
    for dy, dx in [(0, 1), (1, 0), (2, -3), (-1, -1)]:
        sel = s[(off[..., 0] == dy) & (off[..., 1] == dx)]
        assert torch.allclose(sel, sel[0].expand_as(sel), atol=1e-4)
    # and (0, 1) differs from (1, 0): rows and columns are told apart
    assert not torch.isclose(s[0, 1], s[0, 6], atol=1e-3)
    assert torch.allclose(qs.norm(dim=-1), q.norm().expand(36), atol=1e-5)
    with pytest.raises(ValueError, match="pos"):
        axial_rope(torch.randn(5, 16), pos)


def test_urpe_breaks_the_averaging_limit():
    L = 6
    pos = torch.arange(L)
    probs = torch.tril(torch.ones(L, L)) / (pos + 1)[:, None]      # identical tokens: uniform causal weights
    v = torch.ones(L, 1)
    assert torch.allclose(probs @ v, torch.ones(L, 1))            # any softmax average of equal values is that value
    urpe = URPE(1, L)
    with torch.no_grad():
        urpe.g[0] = 2 * torch.arange(-L, L + 1).float() + 1          # g(i - j) = 2(i - j) + 1
    counted = urpe(probs[None, None], pos, pos)[0, 0] @ v
    assert torch.allclose(counted[:, 0], (pos + 1).float())       # z_i = i + 1: a position counter
    C = toeplitz_from_distances(urpe.g, pos, pos, L)[0]
    assert torch.equal(C[1:, 1:], C[:-1, :-1])                    # Toeplitz
    with pytest.raises(ValueError, match="probs"):
        urpe(torch.rand(1, 2, L, L), pos, pos)


def test_floater_codes_are_an_ode_solution():
    torch.manual_seed(0)
    f = Floater(8, steps_per_unit=2)
    codes = f(12)
    assert codes.shape == (12, 8) and f.evaluations == 4 * 2 * 11   # RK4: 4 calls per step, sequential
    assert torch.equal(codes[:5], f(5))                             # a prefix of a longer run
    codes[-1].sum().backward()                                      # trained through the solver
    assert f.p0.grad.abs().sum() > 0 and f.h[0].weight.grad.abs().sum() > 0
    with torch.no_grad():
        for p in f.h.parameters():
            p.zero_()
    assert torch.allclose(f(7), f.p0.expand(7, 8))                  # h = 0: the code never moves


def test_complex_order_shift_is_a_fixed_rotation_per_word():
    torch.manual_seed(0)
    emb = ComplexOrderEmbedding(30, 6)
    tok = torch.tensor([[3, 7, 7, 12]])
    a, b = emb(tok), emb(tok, torch.arange(4) + 9)
    assert torch.allclose(b, a * torch.exp(1j * emb.frequency(tok) * 9), atol=1e-5)
    assert torch.allclose(a.abs(), emb.amplitude(tok).abs(), atol=1e-6)   # position only turns the phase
    assert not torch.allclose(a[0, 1], a[0, 2])                     # the same word at two positions differs


def test_t5_distance_index_is_unbucketed_and_symmetric():
    rel = torch.arange(-20, 21)
    idx = t5_distance_index(rel, 16)
    assert torch.equal(idx, rel.abs().clamp(max=15))
    assert torch.equal(idx, t5_distance_index(-rel, 16))
    with pytest.raises(ValueError, match="max_distance"):
        t5_distance_index(rel, 0)
