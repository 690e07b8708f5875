"""Lesson 16: measurements inside a model (posenc_lib/experiments/inside_tools.py) and the experiment (inside.py)."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from posenc_lib.experiments import inside as ins
from posenc_lib.experiments import inside_tools as tools
from posenc_lib.models.causal_lm import CausalLM, MaskedLM
from posenc_lib.schemes.rotary import RotaryScheme, apply_rope


def _lm(pe="rope", layers=2, cls=CausalLM, **options):
    torch.manual_seed(0)
    model = cls(11, pe, d_model=16, n_heads=2, num_layers=layers, dim_feedforward=32, **options).eval()
    return model.requires_grad_(False)


# ------------------------------------------------------------------ 1. RoPE's bound and the expected score
def test_relative_upper_bound_matches_a_direct_double_sum():
    d, base = 16, 10000.0
    theta = [base ** (-2 * j / d) for j in range(d // 2)]
    for r in (0, 1, 5, 37, 400):
        direct = sum(abs(sum(complex(math.cos(r * t), math.sin(r * t)) for t in theta[:j])) for j in range(1, d // 2 + 1))
        assert tools.relative_upper_bound([r], d, base)[0] == pytest.approx(direct / (d // 2), rel=1e-12)
    assert tools.relative_upper_bound([0], d)[0] == pytest.approx((d // 2 + 1) / 2)  # |S_j| = j at r = 0


def test_rope_score_is_the_dot_product_of_rotated_vectors():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    dist = np.array([0, 1, 3, 20])
    ours = tools.rope_score(q, k, dist)
    # brute force: rotate q at position 7 and k at 7 + r with 2x2 blocks; and the library's interleaved apply_rope
    theta = tools.rope_thetas(8)
    for i, r in enumerate(dist):
        def rot(x, m):
            out = x.copy()
            for j, t in enumerate(theta):
                c, s = math.cos(m * t), math.sin(m * t)
                out[..., 2 * j], out[..., 2 * j + 1] = c * x[..., 2 * j] - s * x[..., 2 * j + 1], s * x[..., 2 * j] + c * x[..., 2 * j + 1]
            return out
        brute = (rot(q, 7) * rot(k, 7 + r)).sum(-1)
        np.testing.assert_allclose(ours[:, i], brute, rtol=1e-10, atol=1e-10)
        lib = (apply_rope(torch.tensor(q, dtype=torch.float64)[:, None], torch.tensor([7]))
               * apply_rope(torch.tensor(k, dtype=torch.float64)[:, None], torch.tensor([7 + int(r)]))).sum(-1)[:, 0]
        np.testing.assert_allclose(ours[:, i], lib.numpy(), rtol=1e-5, atol=1e-5)


def test_the_bound_holds_and_summation_by_parts_is_exact():
    rng = np.random.default_rng(1)
    d = 32
    dist = np.arange(0, 300, 7)
    for _ in range(50):
        q, k = rng.normal(size=d), rng.normal(size=d)
        score = np.abs(tools.rope_score(q, k, dist))
        assert (score <= tools.abel_bound(q, k, dist) + 1e-9).all()
        # Abel: sum_j h_j e^{i r t_j} = -sum_j S_{j+1} (h_{j+1} - h_j), h_{d/2} = 0
        h = np.conj(tools.pair_products(q, k))
        s = tools.partial_sums(dist, tools.rope_thetas(d))
        lhs = (h[None] * np.exp(1j * dist[:, None] * tools.rope_thetas(d)[None])).sum(1)
        rhs = -(s * np.diff(np.append(h, 0))[None]).sum(1)
        np.testing.assert_allclose(lhs, rhs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rho", [0.0, 0.6, 1.0])
def test_expected_score_matches_monte_carlo_and_lesson_15s_margin(rho):
    from posenc_lib.schemes.rope_spectrum import similarity_margin

    rng = np.random.default_rng(2)
    d, n = 16, 40000
    dist = np.array([0, 2, 10, 50])
    q = rng.normal(size=(n, d))
    k = rho * q + math.sqrt(1 - rho**2) * rng.normal(size=(n, d))
    mc = tools.rope_score(q, k, dist)  # (n, r)
    expected = tools.expected_rope_score(dist, d, rho=rho)
    se = mc.std(0) / math.sqrt(n)
    assert (np.abs(mc.mean(0) - expected) < 4 * se).all()
    np.testing.assert_allclose(expected, 2 * rho * similarity_margin(torch.tensor(dist), d, 10000.0).numpy(), atol=1e-9)
    if rho == 0:
        assert (expected == 0).all()


# ------------------------------------------------------------------ 2. the probe
def _positions(n_windows, t):
    return torch.arange(t).repeat(n_windows)


def test_probe_recovers_a_position_that_is_encoded_and_not_one_that_is_not():
    g = torch.Generator().manual_seed(0)
    t = 16
    ptr, pte = _positions(60, t), _positions(40, t)
    freqs = torch.tensor([0.05, 0.2, 0.5, 1.0, 2.0])

    def encoded(p):  # sinusoids of the position in 10 of 24 features, noise everywhere
        code = torch.cat([torch.sin(p[:, None] * freqs), torch.cos(p[:, None] * freqs)], 1)
        return torch.cat([code, torch.zeros(len(p), 14)], 1) + 0.05 * torch.randn(len(p), 24, generator=g)

    good = tools.probe_position(encoded(ptr), ptr, encoded(pte), pte, classes=t)
    assert good["accuracy"] > 0.95 and good["mae"] < 1.5 and good["r2"] > 0.9
    blind = tools.probe_position(torch.randn(len(ptr), 24, generator=g), ptr, torch.randn(len(pte), 24, generator=g),
                                 pte, classes=t)  # fmt: skip
    assert blind["accuracy"] < 2.5 / t and blind["r2"] < 0.05
    assert good["chance"] == blind["chance"] == pytest.approx(1 / t)


def test_a_bidirectional_nope_model_is_permutation_equivariant_so_no_probe_can_find_position():
    model = _lm("none", cls=MaskedLM)
    x = torch.randint(0, 11, (3, 12))
    perm = torch.randperm(12)
    for a, b in zip(tools.hidden_states(model, x), tools.hidden_states(model, x[:, perm])):
        torch.testing.assert_close(a[:, perm], b, atol=1e-5, rtol=1e-5)
    causal = tools.hidden_states(_lm("none"), x)
    assert not torch.allclose(causal[1][:, perm], tools.hidden_states(_lm("none"), x[:, perm])[1], atol=1e-3)


def test_hidden_states_are_the_input_and_every_block_output():
    model = _lm("rope", layers=3)
    x = torch.randint(0, 11, (2, 9))
    states = tools.hidden_states(model, x)
    assert len(states) == 4 and all(s.shape == (2, 9, 16) for s in states)
    torch.testing.assert_close(states[0], model.embed(x) * 4.0)
    torch.testing.assert_close(model.norm(states[-1]) @ model.embed.weight.t(), model(x))


def test_masked_lm_scores_only_the_masked_characters():
    model = _lm("none", cls=MaskedLM, mask_prob=0.25)
    assert model.mask_id == 11 and model.embed.num_embeddings == 12 and not model.causal
    windows = torch.randint(0, 11, (4, 9))
    torch.manual_seed(3)
    loss = model.loss(windows)
    torch.manual_seed(3)
    masked = torch.rand(4, 8).argsort(dim=1)[:, :2]
    logits = model(windows[:, :-1].scatter(1, masked, 11))
    ref = torch.nn.functional.cross_entropy(logits.gather(1, masked[..., None].expand(-1, -1, 12)).reshape(-1, 12),
                                            windows[:, :-1].gather(1, masked).reshape(-1))  # fmt: skip
    torch.testing.assert_close(loss, ref)


# ------------------------------------------------------------------ 3. rotary bands
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("mode", ["freeze", "drop"])
def test_band_ablation_leaves_every_other_pair_untouched(interleaved, mode):
    d_model, heads, head_dim = 32, 2, 16
    plain = RotaryScheme(d_model, heads, 1, True, interleaved=interleaved)
    banded = tools.BandRoPE(d_model, heads, 1, True, pairs=[1, 6], mode=mode, interleaved=interleaved)
    q, k = torch.randn(2, heads, 10, head_dim), torch.randn(2, heads, 10, head_dim)
    pos = torch.arange(10)
    pq, pk = plain.rotate(q, k, plain.prepare(pos, pos), 0)
    bq, bk = banded.rotate(q, k, banded.prepare(pos, pos), 0)
    a, b = tools.pair_index(head_dim, interleaved)
    hit = torch.zeros(head_dim, dtype=torch.bool)
    hit[a[[1, 6]]] = hit[b[[1, 6]]] = True
    assert hit.sum() == 4
    torch.testing.assert_close(bq[..., ~hit], pq[..., ~hit], rtol=0, atol=0)
    torch.testing.assert_close(bk[..., ~hit], pk[..., ~hit], rtol=0, atol=0)
    if mode == "freeze":  # the frozen pairs do not turn: exactly the unrotated input
        torch.testing.assert_close(bq[..., hit], q[..., hit], rtol=0, atol=0)
        torch.testing.assert_close(bk[..., hit], k[..., hit], rtol=0, atol=0)
    else:
        assert (bq[..., hit] == 0).all() and (bk[..., hit] == 0).all()


def test_freezing_the_slowest_pairs_is_p_rope():
    cfg = replace(ins.SMOKE, d_model=32, n_heads=2, band_pairs=2)  # 8 pairs; freeze the 2 slowest = keep 6 of 8
    model = ins.make_model("rope", cfg, 11).eval()
    x = torch.randint(0, 11, (2, 40))
    plain = model(x)
    frozen = ins.with_band(model, cfg, "freeze-low")(x)
    model.set_scheme("rope", interleaved=False, scaling={"rope_type": "proportional", "partial_rotary_factor": 6 / 8})
    torch.testing.assert_close(frozen, model(x), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(frozen, plain, atol=1e-4)
    torch.testing.assert_close(ins.with_band(model, cfg, None)(x), plain, rtol=0, atol=0)
    assert ins.band_pairs(cfg, "low") == [6, 7] and ins.band_pairs(cfg, "high") == [0, 1]


def test_pair_norms_are_unchanged_by_the_rotation_and_read_per_layer_and_head():
    model = _lm("rope", layers=2, interleaved=False)  # half-split pairs (j, j + 4), as the experiment's model
    x = torch.randint(0, 11, (3, 7))
    norms = tools.qk_pair_norms(model, x)
    assert np.asarray(norms["q"]).shape == (2, 2, 4) == np.asarray(norms["k"]).shape
    for (q, k), (qr, kr) in zip(tools.queries_and_keys(model, x), tools.queries_and_keys(model, x, rotated=True)):
        torch.testing.assert_close(tools.pair_norms(q, False), tools.pair_norms(qr, False), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(q, qr)
    q0 = tools.queries_and_keys(model, x)[0][0]
    assert norms["q"][0][1][3] == pytest.approx(float(torch.sqrt(q0[:, 1, :, 3] ** 2 + q0[:, 1, :, 7] ** 2).mean()), abs=1e-5)


def test_score_by_distance_averages_each_diagonal():
    model = _lm("rope", layers=1)
    x = torch.randint(0, 11, (2, 6))
    (q, k), = tools.queries_and_keys(model, x, rotated=True)
    s = (q @ k.transpose(-1, -2) / math.sqrt(8)).mean(dim=(0, 1))
    rows = tools.score_by_distance(model, x)
    assert len(rows) == 1 and len(rows[0]) == 6
    for r in range(6):
        assert rows[0][r] == pytest.approx(float(torch.diagonal(s, -r).mean()), abs=1e-5)


# ------------------------------------------------------------------ 4. sinks and the rolling cache
def test_first_token_mass_equals_the_uniform_baseline_when_attention_is_uniform():
    model = _lm("none")
    for b in model.blocks:  # queries of zero: every score 0, so each query spreads evenly over what it sees
        torch.nn.init.zeros_(b.attn.q_proj.weight)
        torch.nn.init.zeros_(b.attn.q_proj.bias)
    out = tools.first_token_mass(model, torch.randint(0, 11, (3, 10)), from_query=2)
    assert np.allclose(out["mass"], out["uniform"], atol=1e-6)
    assert out["uniform"] == pytest.approx(np.mean([1 / (m + 1) for m in range(2, 10)]), abs=1e-5)


def test_first_token_swaps_read_the_weights_of_the_edited_windows():
    model = _lm("none")
    tokens = torch.randint(1, 11, (4, 9))
    out = tools.first_token_swaps(model, tokens, filler=0)
    _, w = model(tokens, need_weights=True)
    assert out["first"][1][0] == pytest.approx(float(w[1][:, 0, 2:, 0].mean()), abs=1e-5)
    shifted = torch.cat([torch.zeros(4, 1, dtype=tokens.dtype), tokens[:, :-1]], dim=1)
    _, w = model(shifted, need_weights=True)
    assert out["moved"][0][1] == pytest.approx(float(w[0][:, 1, 2:, 1].mean()), abs=1e-5)
    assert out["new_first"][0][1] == pytest.approx(float(w[0][:, 1, 2:, 0].mean()), abs=1e-5)
    same = tools.first_token_swaps(model, torch.cat([torch.zeros(4, 1, dtype=tokens.dtype), tokens[:, 1:]], 1), 0)
    assert same["replaced"] == same["first"]  # replacing a character by itself changes nothing
    assert out["uniform"] == pytest.approx(np.mean([1 / (m + 1) for m in range(2, 9)]), abs=1e-5)
    with pytest.raises(ValueError, match="at least 3 tokens"):
        tools.first_token_swaps(model, tokens[:, :2], 0)


def test_measuring_during_training_leaves_the_training_unchanged():
    from posenc_lib.experiments import long_context as lc

    ids = torch.randint(0, 11, (2000,))
    kw = dict(length=12, batch=4, steps=7, lr=1e-3, warmup=2, grad_clip=1.0, seed=3, log_every=2)
    torch.manual_seed(0)
    plain = _lm("rope").requires_grad_(True)
    base = lc.train_steps(plain, ids, **kw)
    seen = []

    def look(u, model):
        assert not model.training and not torch.is_grad_enabled()
        seen.append(u)
        model(torch.randint(0, 11, (1, 5)))  # a forward pass in between changes nothing

    torch.manual_seed(0)
    watched = _lm("rope").requires_grad_(True)
    gen = torch.Generator().manual_seed(9)
    assert lc.train_steps(watched, ids, **kw, at=(0, 3, 7), on_update=lambda u, m: look(u, m) or torch.randint(
        0, 1, (1,), generator=gen)) == base  # fmt: skip
    assert seen == [0, 3, 7]
    for a, b in zip(plain.parameters(), watched.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match=r"updates \[8\] outside 0..7"):
        lc.train_steps(watched, ids, **kw, at=(8,), on_update=look)
    with pytest.raises(ValueError, match="needs on_update"):
        lc.train_steps(watched, ids, **kw, at=(1,))


@pytest.mark.parametrize("pe", ["rope", "alibi", "none"])
def test_stream_without_eviction_equals_the_full_forward(pe):
    model = _lm(pe)
    ids = torch.randint(0, 11, (3, 20))
    full = torch.nn.functional.cross_entropy(model(ids[:, :-1]).transpose(1, 2), ids[:, 1:], reduction="none").mean(0)
    torch.testing.assert_close(tools.stream_nll(model, ids, cache=None), full.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tools.stream_nll(model, ids, cache=25, sinks=3), full.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pe", ["rope", "alibi", "none"])
@pytest.mark.parametrize("sinks", [0, 2])
def test_rolling_cache_of_a_one_layer_model_is_a_forward_over_sinks_and_recent_tokens(pe, sinks):
    """With one layer a cached key depends only on its own token: step t of the rolling cache is the full
    model run on [first sinks tokens] + [latest cache - sinks tokens], at positions 0 .. cache - 1."""
    model = _lm(pe, layers=1)
    ids = torch.randint(0, 11, (2, 30))
    cache = 8
    got = tools.stream_nll(model, ids, cache=cache, sinks=sinks)
    for t in (cache, cache + 1, 17, 28):
        keep = list(range(sinks)) + list(range(t - (cache - sinks) + 1, t + 1))
        logits = model(ids[:, keep])[:, -1]
        ref = torch.nn.functional.cross_entropy(logits, ids[:, t + 1]).double()
        assert float(got[t]) == pytest.approx(float(ref), abs=1e-5)


def test_heads_blocked_from_the_kept_first_tokens_never_read_them():
    """A NoPE model whose every head is blocked from the 2 kept first tokens reads, once the tokens that saw them
    have left the cache, exactly what a rolling cache of the latest ``cache - 2`` tokens reads; one blocked head
    changes the reading, and blocking nobody is the plain cache; the dense reading with key 0 blocked in a one-layer
    model is a forward pass without token 0."""
    model = _lm("none")
    ids = torch.randint(0, 11, (2, 40))
    every = {0: [0, 1], 1: [0, 1]}
    blocked = tools.stream_nll(model, ids, cache=8, sinks=2, blocked=every)
    plain = tools.stream_nll(model, ids, cache=6, sinks=0)
    torch.testing.assert_close(blocked[16:], plain[16:], atol=1e-5, rtol=1e-5)  # 2 layers: from step 2 + 2 * 6 on
    kept = tools.stream_nll(model, ids, cache=8, sinks=2)
    one = tools.stream_nll(model, ids, cache=8, sinks=2, blocked={1: [0]})
    assert (one[16:] - kept[16:]).abs().max() > 1e-4 and (one[16:] - blocked[16:]).abs().max() > 1e-4
    torch.testing.assert_close(one[:2], kept[:2])  # the first tokens' own steps are not blocked
    single = _lm("none", layers=1)
    dense = tools.stream_nll(single, ids, cache=None, blocked={0: [0, 1]}, first=1)
    for t in (1, 5, 30):
        ref = torch.nn.functional.cross_entropy(single(ids[:, 1 : t + 1])[:, -1], ids[:, t + 1]).double()
        assert float(dense[t]) == pytest.approx(float(ref), abs=1e-5)
    for bad, msg in (({2: [0]}, "map layers"), ({0: [2]}, "map layers"), ({}, "map layers")):
        with pytest.raises(ValueError, match=msg):
            tools.stream_nll(model, ids, cache=8, sinks=2, blocked=bad)
    with pytest.raises(ValueError, match="within the cache's kept first tokens"):
        tools.stream_nll(model, ids, cache=8, sinks=2, blocked={0: [0]}, first=3)
    with pytest.raises(ValueError, match="need 1 or more first tokens"):
        tools.stream_nll(model, ids, cache=8, sinks=0, blocked={0: [0]})


@pytest.mark.parametrize("interleaved", [False, True])
def test_pair_products_give_back_the_rotated_score_and_the_decay_parts_add_up(interleaved):
    """On a small random RoPE model, the unrotated pair products by distance turned by exp(-i r theta) are the
    model's rotated mean score to float tolerance (the other sign is not); the three parts of the decomposition
    add up to the actual terms at every distance and pair, and so do their falls."""
    model = _lm("rope", interleaved=interleaved)
    x = torch.randint(0, 11, (6, 24))
    p = tools.pair_products_by_distance(model, x, interleaved=interleaved)
    assert p.shape == (2, 24, 4) and p.dtype == np.complex128
    thetas = tools.rope_thetas(8, model.scheme.cache.base)
    actual = np.asarray(tools.score_by_distance(model, x, digits=None))
    assert np.abs(tools.score_from_pair_products(p, thetas) - actual).max() < 1e-5
    assert np.abs(tools.score_from_pair_products(p, thetas, sign=1) - actual).max() > 1e-2
    # p_j(0) by brute force: layer 0, pair 1, as a + ib of the projected q and k
    (q, k), *_ = tools.queries_and_keys(model, x)
    a, b = tools.pair_index(8, interleaved)
    qc, kc = torch.complex(q[..., a[1]].double(), q[..., b[1]].double()), torch.complex(k[..., a[1]].double(), k[..., b[1]].double())
    assert abs(complex((qc.conj() * kc).mean()) / math.sqrt(8) - p[0, 0, 1]) < 1e-9
    assert abs(complex((qc[:, :, 3:].conj() * kc[:, :, :-3]).mean()) / math.sqrt(8) - p[0, 3, 1]) < 1e-9
    parts = tools.decay_parts(p, thetas, near=4)
    total = sum(parts[n]["terms"] for n in tools.DECAY_PARTS)
    np.testing.assert_allclose(total, parts["actual"]["terms"], atol=1e-12)
    np.testing.assert_allclose(parts["actual"]["terms"].sum(-1), tools.score_from_pair_products(p, thetas), atol=1e-12)
    np.testing.assert_allclose(sum(parts[n]["fall"] for n in tools.DECAY_PARTS), parts["actual"]["fall"], atol=1e-12)
    score = parts["actual"]["terms"].sum(-1)
    np.testing.assert_allclose(parts["actual"]["fall"], score[:, :4].mean(1) - score[:, 12:].mean(1), atol=1e-12)
    # a resemblance that does not change with distance: everything is rotation
    flat = np.broadcast_to(p.mean(axis=1, keepdims=True), p.shape)
    still = tools.decay_parts(flat, thetas)
    np.testing.assert_allclose(still["rotation"]["fall"], still["actual"]["fall"], atol=1e-12)
    assert np.abs(still["content"]["fall"]).max() < 1e-12 and np.abs(still["interaction"]["fall"]).max() < 1e-12
    with pytest.raises(ValueError, match="need 1 <= near <= far_from"):
        tools.decay_parts(p, thetas, near=20)
    with pytest.raises(ValueError, match="with 4 pairs"):
        tools.decay_parts(p[..., :3], thetas)


def test_recompute_reruns_the_latest_window_at_positions_from_zero():
    model = _lm("rope")
    ids = torch.randint(0, 11, (2, 25))
    got = tools.recompute_nll(model, ids, 6, batch=7)
    for t in (0, 5, 6, 13, 23):
        lo = max(0, t - 5)
        ref = torch.nn.functional.cross_entropy(model(ids[:, lo : t + 1])[:, -1], ids[:, t + 1]).double()
        assert float(got[t]) == pytest.approx(float(ref), abs=1e-5)


# ------------------------------------------------------------------ the experiment, end to end
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("inside") / "out"
    assert ins.main(["--profile", "smoke", "--seeds", "0", "--out", str(out)]) == 0
    return out


def test_smoke_run_writes_one_checked_file_per_model(smoke):
    recs = ins.load_results(smoke)
    assert sorted(r["model"] for r in recs) == sorted(ins.MODELS)
    cfg = ins.SMOKE
    for r in recs:
        assert r["config"] == json.loads(json.dumps(ins.asdict(cfg))) and r["profile"] == "smoke"
        assert len(r["probe"]["accuracy"]) == cfg.num_layers + 1
        assert all(0 <= a <= 1 for a in r["probe"]["accuracy"])
    rope = next(r for r in recs if r["model"] == "rope")
    assert set(rope["nll"]) == {"lengths", "none", *ins.BANDS}
    assert np.asarray(rope["pair_norms"]["q"]).shape == (2, 2, 8)  # layers, heads, pairs
    assert np.asarray(rope["sinks"]["mass"]).shape == (2, 2)
    assert set(rope["stream"]["past_window"]) == {"dense", "window", "sinks", "recompute"}
    assert "sinks" not in next(r for r in recs if r["model"] == "nope-bidir")
    for r in recs:
        if r["model"] != "nope-bidir":
            over = r["sinks_over_training"]
            assert over["updates"] == list(cfg.sink_updates) and np.asarray(over["mass"]).shape == (3, 2, 2)
            assert over["mass"][-1] == r["sinks"]["mass"]  # the last one is the trained model's
            assert set(r["first_token"]) == {"first", "replaced", "new_first", "moved", "uniform", "filler"}
    assert "sinks_over_training" not in next(r for r in recs if r["model"] == "nope-bidir")
    acc, seeds = ins.collect(recs, "nope", "probe.accuracy")
    assert acc.shape == (1, cfg.num_layers + 1) and seeds == [0]
    with pytest.raises(KeyError, match="no 'pair_norms'"):
        ins.collect(recs, "nope", "pair_norms.q")
    with pytest.raises(KeyError, match="models present"):
        ins.collect(recs, "t5", "probe.accuracy")


def test_a_folder_with_results_resumes_and_refuses_another_configuration(smoke, capsys):
    before = {p.name: p.read_bytes() for p in smoke.glob("*.json")}
    for resume in ([], ["--resume"]):  # the same command resumes; --resume changes nothing
        assert ins.main(["--profile", "smoke", "--seeds", "0", "--models", "nope", "--out", str(smoke), *resume]) == 0
        assert f"skipping 1 finished result(s) in {smoke}" in capsys.readouterr().out
    logs = []
    ins.run_all(ins.SMOKE, [0], smoke, log=logs.append)
    assert logs == [f"skipping 4 finished result(s) in {smoke}"]
    assert {p.name: p.read_bytes() for p in smoke.glob("*.json")} == before
    with pytest.raises(ValueError, match="another configuration.*or --profile smoke to continue it"):
        ins.run_all(replace(ins.SMOKE, steps=31), [0], smoke, names=["nope"])
    assert ins.pending(ins.SMOKE, ["rope", "alibi"], [0, 1], smoke) == [("rope", 1), ("alibi", 1)]


def test_resume_makes_only_what_is_missing(tmp_path):
    logs = []
    ins.run_all(ins.SMOKE, [0], tmp_path, names=["nope"], log=logs.append)
    first = (tmp_path / "nope_seed0.json").read_bytes()
    ins.run_all(ins.SMOKE, [0, 1], tmp_path, names=["nope"], log=logs.append)
    assert (tmp_path / "nope_seed0.json").read_bytes() == first and (tmp_path / "nope_seed1.json").exists()
    assert logs[-2] == f"skipping 1 finished result(s) in {tmp_path}" and logs[-1].startswith("done nope seed 1")


def test_the_bands_run_retrains_the_same_model_and_ablates_a_norm_matched_middle_band(smoke, tmp_path, capsys):
    """--bands: one checked file per seed in its own folder (the main run's folder and loader are untouched), the
    RoPE model trained again update for update, the end bands read as in the main run, and a middle band clear of
    both ends whose q.k norm weight is the closest to the fastest band's; the same command resumes."""
    out = tmp_path / "bands"
    assert ins.main(["--profile", "smoke", "--bands", "--seeds", "0", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["rope_seed0.json"]
    (rec,) = ins.load_bands(out)
    main = next(r for r in ins.load_results(smoke) if r["model"] == "rope")
    assert rec["train_loss"] == main["train_loss"] and rec["config"] == main["config"]
    assert {k: rec["nll"][k] for k in main["nll"]} == main["nll"]  # the same model, read the same way
    assert set(rec["nll"]) == {"lengths", "none", *ins.BANDS, *ins.MID_BANDS}
    weight = ins.pair_weight(main["pair_norms"])
    assert np.allclose(rec["pair_weight"], weight, atol=1e-4)
    b, half = ins.SMOKE.band_pairs, len(weight)
    mid = rec["bands"]["freeze-mid"]
    assert mid == rec["bands"]["drop-mid"] == ins.matched_band(weight, b) and len(mid) == b
    assert b <= mid[0] and mid[-1] < half - b  # overlaps neither end band
    candidates = [weight[s : s + b].sum() for s in range(b, half - 2 * b + 1)]
    assert abs(weight[mid].sum() - weight[:b].sum()) == min(abs(c - weight[:b].sum()) for c in candidates)
    assert math.isclose(rec["band_weight"]["mid"], weight[mid].sum(), abs_tol=1e-3)
    before = (out / "rope_seed0.json").read_bytes()
    assert ins.main(["--profile", "smoke", "--bands", "--seeds", "0", "--out", str(out)]) == 0
    assert "skipping 1 finished result(s)" in capsys.readouterr().out and (out / "rope_seed0.json").read_bytes() == before
    with pytest.raises(ValueError, match="another configuration"):
        ins.run_bands(replace(ins.SMOKE, steps=31), [0], out)
    for argv in (["--bands", "--models", "alibi"], ["--bands", "--time-updates", "3"]):
        with pytest.raises(SystemExit):
            ins.main(["--profile", "smoke", *argv, "--out", str(tmp_path / "x")])
        assert "--bands trains the rope model only" in capsys.readouterr().err
    rec["bands"]["freeze-mid"] = [0, 1]  # a "middle" band on the fastest pairs is refused
    (out / "rope_seed0.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="not a run of contiguous pairs clear of the fastest band"):
        ins.load_bands(out)


def test_the_decay_run_retrains_the_same_model_and_splits_its_mean_score(smoke, tmp_path, capsys):
    """--decay: one checked file per seed, the RoPE model trained again update for update (the main run's losses and
    mean score by distance), pair products that give back that score with the RoPE sign and not the other, falls
    that are the decomposition of the stored products; a record whose products miss the score is refused."""
    out = tmp_path / "decay"
    assert ins.main(["--profile", "smoke", "--decay", "--seeds", "0", "--out", str(out)]) == 0
    (rec,) = ins.load_decay(out)
    main = next(r for r in ins.load_results(smoke) if r["model"] == "rope")
    assert rec["train_loss"] == main["train_loss"] and rec["config"] == main["config"]
    assert rec["score_by_distance"] == main["score_by_distance"]
    err = rec["reconstruction_error"]
    assert err["rope_sign"] < 1e-5 < 1e-2 < err["other_sign"]
    p = np.asarray(rec["pair_products"]["re"]) + 1j * np.asarray(rec["pair_products"]["im"])
    assert p.shape == (ins.SMOKE.num_layers, ins.SMOKE.train_len, 8)
    np.testing.assert_allclose(tools.score_from_pair_products(p, np.asarray(rec["thetas"])), rec["score_by_distance"],
                               atol=1e-3)
    parts = ins.decay_from_record(rec)
    for name in ("actual", *tools.DECAY_PARTS):
        np.testing.assert_allclose(parts[name]["fall"], rec["fall"][name], atol=2e-5)
        np.testing.assert_allclose(parts[name]["fall_by_pair"], rec["fall_by_pair"][name], atol=2e-5)
    score = np.asarray(main["score_by_distance"])
    fall = score[:, :4].mean(1) - score[:, score.shape[1] // 2 :].mean(1)
    np.testing.assert_allclose(rec["fall"]["actual"], fall, atol=1e-4)
    assert ins.main(["--profile", "smoke", "--decay", "--seeds", "0", "--out", str(out)]) == 0
    assert "skipping 1 finished result(s)" in capsys.readouterr().out
    for argv, msg in ((["--decay", "--models", "alibi"], "--decay trains the rope model only"),
                      (["--decay", "--bands"], "--bands and --decay are separate runs")):  # fmt: skip
        with pytest.raises(SystemExit):
            ins.main(["--profile", "smoke", *argv, "--out", str(tmp_path / "x")])
        assert msg in capsys.readouterr().err
    rec["reconstruction_error"]["rope_sign"] = 0.5
    (out / "rope_seed0.json").write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="do not give back the model's rotated score"):
        ins.load_decay(out)


def test_the_cache_controls_retrain_the_same_model_and_read_it_as_the_main_run_did(smoke, tmp_path, capsys):
    """--cache-controls: the causal NoPE model trained again update for update, whose plain readings (the cache
    without and with the first tokens, the recomputed window, the training windows read densely, the first-token
    weights) are the main run's; the first-place head is the one with the largest first-token weight; every control
    is read at the run's cache size, three of them at half of it; only causal models are taken."""
    out = tmp_path / "controls"
    assert ins.main(["--profile", "smoke", "--cache-controls", "--models", "nope", "--seeds", "0", "--out", str(out)]) == 0
    (rec,) = ins.load_controls(out)
    main = next(r for r in ins.load_results(smoke) if r["model"] == "nope")
    cfg = ins.SMOKE
    assert rec["train_loss"] == main["train_loss"] and rec["config"] == main["config"]
    assert rec["sinks"] == main["sinks"] and rec["filler"] == main["first_token"]["filler"]
    at = rec["stream"][str(cfg.cache)]
    assert set(at) == set(ins.CACHE_CONTROLS) and set(rec["stream"][str(cfg.cache // 2)]) == {"window", "sinks", "recompute"}
    for mode in ("window", "sinks", "recompute"):
        assert at[mode] == pytest.approx(main["stream"]["past_window"][mode], abs=2e-5)
    assert rec["dense"]["none"] == pytest.approx(main["nll"]["none"][cfg.band_lengths.index(cfg.train_len)], abs=2e-5)
    mass = np.asarray(main["sinks"]["mass"])
    assert tuple(rec["head"]) == np.unravel_index(mass.argmax(), mass.shape) == ins.first_place_head(mass)
    assert ins.main(["--profile", "smoke", "--cache-controls", "--models", "nope", "--seeds", "0", "--out", str(out)]) == 0
    assert "skipping 1 finished result(s)" in capsys.readouterr().out
    for argv in (["--models", "nope-bidir"], ["--models", "nope", "--time-updates", "2"]):
        with pytest.raises(SystemExit):
            ins.main(["--profile", "smoke", "--cache-controls", *argv, "--out", str(tmp_path / "x")])
        assert "--cache-controls reads causal models (rope, alibi, nope)" in capsys.readouterr().err
    with pytest.raises(ValueError, match="valid choices: rope, alibi, nope"):
        ins.run_controls(cfg, [0], tmp_path / "y", names=["nope-bidir"])
    with pytest.raises(ValueError, match=r"must be \(layers, heads\)"):
        ins.first_place_head([1.0, 2.0])


def test_matched_band_picks_the_closest_middle_run():
    w = [5.0, 5.0, 1.0, 1.0, 4.0, 6.0, 0.5, 9.0, 9.0, 0.1, 0.1, 0.1]
    assert ins.matched_band(w, 2) == [4, 5]  # 10, as the fastest pair of 2; [7, 8] (18) is heavier, not closer
    assert ins.matched_band(w, 3) == [3, 4, 5]  # 11 against 11
    with pytest.raises(ValueError, match="needs at least 15 pairs"):
        ins.matched_band(w, 5)
    with pytest.raises(ValueError, match="needs its pairs"):
        ins.with_band(_lm(), ins.SMOKE, "freeze-mid")
    with pytest.raises(ValueError, match=r"must be \(layers, heads, pairs\)"):
        ins.pair_weight({"q": [[1.0, 2.0]], "k": [[1.0, 2.0]]})


# ------------------------------------------------------------------ bad inputs
def test_command_line_rejects_bad_flags(capsys, tmp_path):
    for argv, msg in ((["--models", "rope,gpt"], "valid choices: rope, alibi, nope, nope-bidir"),
                      (["--seeds", "a"], "--seeds must be comma-separated integers"),
                      (["--jobs", "0"], "--jobs must be a positive integer"),
                      (["--profile", "huge"], "invalid choice: 'huge'"),
                      (["--time-updates", "-1"], "--time-updates must be >= 0"),
                      (["--timing-out", "t.json"], "--timing-out needs --time-updates")):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            ins.main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err, argv
    (tmp_path / "f").write_text("")
    with pytest.raises(SystemExit):
        ins.main(["--out", str(tmp_path / "f")])
    assert "is a file" in capsys.readouterr().err


def test_bad_arguments_are_named_with_the_valid_choices():
    with pytest.raises(ValueError, match="band_pairs=5: two bands must fit in the 8 pairs"):
        replace(ins.SMOKE, band_pairs=5)
    with pytest.raises(ValueError, match="need 0 <= sinks < cache < stream_len"):
        replace(ins.SMOKE, sinks=16)
    with pytest.raises(ValueError, match="too short for the streams"):
        replace(ins.SMOKE, streams=100)
    with pytest.raises(ValueError, match="unknown model 'gpt'; valid choices: rope, alibi"):
        ins.make_model("gpt", ins.SMOKE, 10)
    with pytest.raises(ValueError, match="unknown band ablation 'mid'; valid choices: freeze-low"):
        ins.with_band(_lm(), ins.SMOKE, "mid")
    with pytest.raises(ValueError, match="unknown end 'middle'"):
        ins.band_pairs(ins.SMOKE, "middle")
    with pytest.raises(ValueError, match="mode"):
        tools.BandRoPE(16, 2, 1, pairs=[0], mode="zero")
    with pytest.raises(ValueError, match=r"distinct indices in \[0, 4\)"):
        tools.BandRoPE(16, 2, 1, pairs=[4])
    with pytest.raises(ValueError, match="rho is a correlation"):
        tools.expected_rope_score([0], 8, rho=1.5)
    with pytest.raises(ValueError, match="head_dim must be even"):
        tools.rope_thetas(7)
    with pytest.raises(ValueError, match=r"integer positions in \[0, 4\)"):
        tools.probe_position(torch.randn(6, 3), torch.arange(6), torch.randn(6, 3), torch.arange(6), classes=4)
    with pytest.raises(ValueError, match="sinks must lie in"):
        tools.stream_nll(_lm(), torch.randint(0, 11, (1, 9)), cache=4, sinks=4)
    with pytest.raises(ValueError, match="needs a causal model"):
        tools.stream_nll(_lm("none", cls=MaskedLM), torch.randint(0, 11, (1, 9)), cache=4)
    with pytest.raises(ValueError, match="'sinusoidal' enters at 'input'"):
        tools.stream_nll(_lm("sinusoidal"), torch.randint(0, 11, (1, 9)), cache=4)
    with pytest.raises(ValueError, match="from_query must lie in"):
        tools.first_token_mass(_lm(), torch.randint(0, 11, (1, 5)), from_query=5)
    with pytest.raises(ValueError, match="mask_prob must lie in"):
        _lm("none", cls=MaskedLM, mask_prob=1.0)
    with pytest.raises(FileNotFoundError, match="no results folder"):
        ins.load_results("/nonexistent/inside")
