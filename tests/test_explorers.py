"""posenc_lib.course.explorers: each drawing shows what the library computes; the sliders redraw it."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from posenc_lib.course import explorers as E  # noqa: E402
from posenc_lib.schemes.alibi import alibi_slopes  # noqa: E402
from posenc_lib.schemes.rope_scaling import wavelengths  # noqa: E402
from posenc_lib.schemes.t5 import t5_relative_bucket  # noqa: E402

pytest.importorskip("ipywidgets")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _line(ax, i=0):
    line = ax.lines[i]
    return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)


def test_sinusoidal_drawing_is_the_closed_form():
    dim, base, n, pair = 32, 500.0, 60, 3
    fig = E.draw_sinusoidal(dim=dim, base=base, n_positions=n, pair=pair)
    table_ax, pair_ax = fig.axes[0], fig.axes[1]  # fig.axes[2] is the colour bar
    t = np.arange(n)
    w = base ** (-2 * pair / dim)
    assert np.allclose(_line(pair_ax, 0)[1], np.sin(t * w), atol=1e-5)
    assert np.allclose(_line(pair_ax, 1)[1], np.cos(t * w), atol=1e-5)
    shown = table_ax.images[0].get_array()
    assert shown.shape == (n, dim)
    assert np.allclose(shown[:, 2 * pair], np.sin(t * w), atol=1e-5)


def test_rope_pair_turns_by_m_theta_and_scores_are_the_cosine_sum():
    head_dim, base, pair = 16, 100.0, 2
    theta = base ** (-2 * pair / head_dim)
    pos = torch.arange(12)
    track = E.rope_pair_track(head_dim, base, pair, pos).double()
    assert torch.allclose(track.norm(dim=-1), torch.ones(12, dtype=torch.float64), atol=1e-6)
    angle = torch.atan2(track[:, 1], track[:, 0])
    expected = torch.remainder(pos.double() * theta + math.pi, 2 * math.pi) - math.pi
    assert torch.allclose(angle, expected, atol=1e-5)
    scores = E.rope_equal_vector_scores(head_dim, base, 200).double()
    thetas = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    closed = (2 / head_dim) * torch.cos(torch.arange(201, dtype=torch.float64)[:, None] * thetas).sum(-1)
    assert torch.allclose(scores, closed, atol=1e-4)
    assert scores[0] == pytest.approx(1.0, abs=1e-6) and scores[1:].max() < 1.0  # distance 0 scores highest


def test_t5_drawing_shows_the_library_buckets():
    fig = E.draw_t5_buckets(num_buckets=16, max_distance=40, bidirectional=False, length=50)
    x, y = _line(fig.axes[0])
    assert np.array_equal(y, t5_relative_bucket(torch.as_tensor(x).long(), False, 16, 40).numpy())
    pos = torch.arange(50)
    bucket_map = t5_relative_bucket(pos[None, :] - pos[:, None], False, 16, 40).numpy()
    assert np.array_equal(fig.axes[1].images[0].get_array(), bucket_map)
    assert fig.axes[0].get_title().startswith(f"causal (decoder): {len(np.unique(bucket_map))} of 16")


def test_alibi_prior_is_a_geometric_distribution_with_the_paper_slopes():
    prior = E.alibi_prior(8, 400)
    assert torch.allclose(prior.sum(-1), torch.ones(8), atol=1e-5)
    m = alibi_slopes(8).double()
    # softmax(-m d) over d = 0, 1, ... is geometric: mean distance 1 / (e^m - 1) for a long context
    mean = (prior.double() * torch.arange(400)).sum(-1)
    assert mean[:4].tolist() == pytest.approx((1 / torch.expm1(m[:4])).tolist(), rel=1e-3)
    fig = E.draw_alibi(n_heads=12, head=3, length=32)
    assert np.allclose(_line(fig.axes[0])[1], alibi_slopes(12).numpy())


def test_yarn_keeps_fast_pairs_and_divides_slow_ones():
    s, L = 4.0, 1024
    fig = E.draw_yarn(factor=s, original_length=L, beta_fast=32.0, beta_slow=1.0, head_dim=64, base=10000.0)
    _, gamma = _line(fig.axes[0])
    _, plain = _line(fig.axes[1], 0)
    _, scaled = _line(fig.axes[1], 1)
    assert gamma[0] == 1 and gamma[-1] == 0 and np.all(np.diff(gamma) <= 0)
    assert np.allclose(scaled[gamma == 1], plain[gamma == 1], rtol=1e-5)
    assert np.allclose(scaled[gamma == 0], s * plain[gamma == 0], rtol=1e-5)
    # a kept pair turns more than beta_slow times within L; an interpolated one fewer than beta_fast
    assert np.all(L / plain[gamma == 1] > 1.0) and np.all(L / plain[gamma == 0] < 32.0)
    assert np.allclose(plain, wavelengths(10000.0 ** (-torch.arange(0, 64, 2) / 64)).numpy(), rtol=1e-5)


@pytest.mark.parametrize("draw, bad", [
    (E.draw_sinusoidal, {"dim": 7}),
    (E.draw_sinusoidal, {"dim": 16, "pair": 8}),
    (E.draw_rope, {"head_dim": 64, "pair": 32}),
    (E.draw_rope, {"base": 1.0}),
    (E.draw_t5_buckets, {"num_buckets": 7, "bidirectional": True}),
    (E.draw_alibi, {"n_heads": 8, "head": 9}),
    (E.draw_alibi, {"n_heads": 0}),
    (E.draw_yarn, {"beta_fast": 2.0, "beta_slow": 4.0}),
    (E.draw_yarn, {"factor": 0.5}),
])  # fmt: skip
def test_bad_knobs_raise_a_clear_value_error(draw, bad):
    with pytest.raises(ValueError, match="|".join(bad)):
        draw(**bad)


@pytest.mark.parametrize("make", [E.sinusoidal_explorer, E.rope_explorer, E.t5_explorer, E.alibi_explorer,
                                  E.yarn_explorer, E.partial_rotary_explorer])  # fmt: skip
def test_explorer_text_is_short_and_stable(make):
    a, b = make(), make()
    assert repr(a) == repr(b) and len(repr(a)) < 110  # ipywidgets cuts longer text/plain reprs
    bundle = a._repr_mimebundle_()
    assert bundle["text/plain"] == repr(a) and "application/vnd.jupyter.widget-view+json" in bundle
    assert a.image.value[:8] == b"\x89PNG\r\n\x1a\n"


def test_moving_a_slider_redraws_and_caps_dependent_sliders():
    ex = E.sinusoidal_explorer(dim=64, pair=20)
    before = ex.image.value
    ex.controls["dim"].value = 16  # only 8 pairs now: the pair slider follows
    assert ex.controls["pair"].max == 7 and ex.controls["pair"].value == 7
    assert ex.image.value != before
    assert ex.image.value == ex.render(dim=16, base=10000.0, n_positions=100, pair=7)
    assert ex.values() == {"dim": 16, "base": 10000.0, "n_positions": 100, "pair": 7}


def test_explorer_reports_a_rejected_combination_and_keeps_the_picture():
    ex = E.yarn_explorer()
    before = ex.image.value
    ex.controls["beta_fast"].value = 2.0
    ex.controls["beta_slow"].value = 4.0
    assert "beta_slow < beta_fast" in ex.message.value and ex.image.value != b""
    ex.controls["beta_fast"].value = 32.0
    ex.controls["beta_slow"].value = 1.0
    assert ex.message.value == "" and ex.image.value == before


def test_partial_rotary_drawing_shows_both_ladders():
    from posenc_lib.schemes.rope_spectrum import partial_rotary_ladder

    fig = E.draw_partial_rotary(fraction=0.25, head_dim=64, base=10000.0, context=512)
    ax1 = fig.axes[0]
    full = _line(ax1, 0)[1]
    neox, prope = _line(ax1, 1)[1], _line(ax1, 3)[1]
    assert len(full) == 32 and len(neox) == len(prope) == 8
    assert np.allclose(neox, partial_rotary_ladder("neox", 0.25, 64)[:8].numpy())
    assert np.allclose(prope, full[:8]) and not np.allclose(neox, prope)
    for bad in ({"fraction": 1.5}, {"head_dim": 7}, {"context": 0}):
        with pytest.raises(ValueError, match="|".join(bad)):
            E.draw_partial_rotary(**bad)
    ex = E.partial_rotary_explorer()
    assert repr(ex) == "Explorer(partial rotary: NeoX vs p-RoPE: fraction, head_dim, base, context)"
