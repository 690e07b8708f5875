"""Lesson 14: RoPE context extension (PI, dynamic NTK, YaRN, Llama 3) and the long-context experiment."""
import math
import random
import warnings

import pytest
import torch

from posenc_lib import ROPE_TYPES, build_model, greedy_decode, make_scheme, scaled_rope_frequencies
from posenc_lib.schemes.rope_scaling import check_scaling, scaled_rope_cos_sin, yarn_mscale
from posenc_lib.schemes.rotary import RotaryCache, apply_rope_cos_sin, rope_frequencies


def _hf_config(head_dim, base, scaling, L):
    """A Llama config whose ``rope_parameters`` describe ``scaling`` (transformers 5 convention)."""
    from transformers import LlamaConfig

    params = {**scaling, "rope_theta": base}
    if scaling["rope_type"] == "dynamic":
        params.pop("original_max_position_embeddings")  # transformers reads max_position_embeddings instead
        max_pos = L
    else:
        max_pos = int(L * scaling["factor"]) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                           max_position_embeddings=max_pos, rope_parameters=params)  # fmt: skip


#: the context extensions of lesson 14 (LongRoPE and proportional, lesson 15's, are tested in test_llm_rope.py)
LESSON14_TYPES = ("dynamic", "linear", "llama3", "yarn")


def _random_scaling(rng):
    rope_type = rng.choice(LESSON14_TYPES)
    L = rng.choice([16, 64, 100, 2048, 8192])
    sc = {"rope_type": rope_type, "factor": rng.choice([1.0, 2.0, 8.0, rng.uniform(1.0, 40.0)])}
    if rope_type != "linear":
        sc["original_max_position_embeddings"] = L
    if rope_type == "yarn" and rng.random() < 0.7:
        sc["beta_fast"] = rng.uniform(8.0, 64.0)
        sc["beta_slow"] = rng.uniform(0.25, 4.0)
    if rope_type == "llama3":
        sc["low_freq_factor"] = rng.choice([1.0, 0.5, 2.0])
        sc["high_freq_factor"] = sc["low_freq_factor"] * rng.choice([2.0, 4.0, 8.0])
    return sc, L


# -------------------------------------------------------------------- parity with transformers
@pytest.mark.parametrize("rope_type", LESSON14_TYPES)
def test_scaled_frequencies_match_transformers_on_random_settings(rope_type):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rng = random.Random(LESSON14_TYPES.index(rope_type))
    checked = 0
    while checked < 25:
        sc, L = _random_scaling(rng)
        if sc["rope_type"] != rope_type:
            continue
        head_dim = rng.choice([4, 8, 16, 64, 128])
        base = rng.choice([10000.0, 500000.0, rng.uniform(100.0, 1e6)])
        seq_len = rng.choice([None, L // 2, L, 3 * L, 8 * L])
        ref, ref_scale = ROPE_INIT_FUNCTIONS[rope_type](_hf_config(head_dim, base, sc, L), None, seq_len=seq_len)
        ours, scale = scaled_rope_frequencies(head_dim, base, sc, seq_len)
        assert ours.shape == (head_dim // 2,) and ours.dtype == torch.float32
        torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=0)
        assert scale == pytest.approx(ref_scale, rel=1e-12)
        checked += 1


def test_static_ntk_is_transformers_dynamic_read_at_s_times_L():
    """Static NTK-aware scaling (bloc97) has no rope type in transformers: its ``dynamic`` with factor 1, read at
    ``seq_len = s * L``, raises the base by exactly ``s ** (d / (d - 2))``, the static rule."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rng = random.Random(7)
    for _ in range(25):
        head_dim, L = rng.choice([4, 8, 16, 64, 128]), rng.choice([16, 64, 2048])
        base, s = rng.choice([10000.0, 500000.0, rng.uniform(100.0, 1e6)]), rng.choice([1.0, 2.0, 8.0, 32.0])
        dyn = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": L}
        ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf_config(head_dim, base, dyn, L), None, seq_len=int(s * L))
        ours, scale = scaled_rope_frequencies(head_dim, base, {"rope_type": "ntk", "factor": s})
        torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=0)
        assert scale == 1.0
        plain, _ = scaled_rope_frequencies(head_dim, base)
        assert ours[0] == plain[0]  # the fastest pair is kept, the slowest divided by exactly s
        torch.testing.assert_close(ours[-1], plain[-1] / s, rtol=1e-5, atol=0)


def test_yarn_attention_factor_options_match_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for extra in ({"attention_factor": 1.3}, {"mscale": 1.0, "mscale_all_dim": 0.5}, {"truncate": False}):
        sc = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096, **extra}
        ref, ref_scale = ROPE_INIT_FUNCTIONS["yarn"](_hf_config(64, 10000.0, sc, 4096), None)
        ours, scale = scaled_rope_frequencies(64, 10000.0, sc)
        torch.testing.assert_close(ours, ref.float(), rtol=1e-5, atol=0)
        assert scale == pytest.approx(ref_scale)


@pytest.mark.parametrize("rope_type", ["linear", "yarn", "llama3"])
def test_rotary_scheme_rotates_like_llama_rotary_embedding(rope_type):
    """End to end: RotaryScheme's cos/sin (attention scale included) equal LlamaRotaryEmbedding's."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    sc = {"rope_type": rope_type, "factor": 4.0, "original_max_position_embeddings": 64}
    if rope_type == "llama3":
        sc.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if rope_type == "linear":
        del sc["original_max_position_embeddings"]
    rot = LlamaRotaryEmbedding(_hf_config(16, 10000.0, sc, 64))
    q, k = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
    pos = torch.arange(200, 240)
    cos, sin = rot(q, pos[None])
    eq, ek = apply_rotary_pos_emb(q, k, cos, sin)
    scheme = make_scheme("rope", 32, 2, 1, causal=True, interleaved=False, scaling=sc)
    prep = scheme.prepare(pos, torch.arange(240))
    oq, ok = scheme.rotate(q, k, prep, 0)
    torch.testing.assert_close(oq, eq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ok, ek, atol=1e-5, rtol=1e-5)


# -------------------------------------------------------------------- properties
def test_no_scaling_is_plain_rope_and_factor_one_changes_nothing():
    f, s = scaled_rope_frequencies(32)
    assert s == 1.0 and torch.equal(f, rope_frequencies(32))
    assert set(LESSON14_TYPES) < set(ROPE_TYPES)
    for rope_type in LESSON14_TYPES:
        sc = {"rope_type": rope_type, "factor": 1.0, "original_max_position_embeddings": 64,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # fmt: skip
        sc = {k: v for k, v in sc.items() if k in ("rope_type", *ROPE_TYPES[rope_type][0])}
        g, scale = scaled_rope_frequencies(32, scaling=sc, seq_len=64)
        torch.testing.assert_close(g, f, rtol=1e-6, atol=0)
        assert scale == 1.0


def test_each_method_changes_the_spectrum_as_its_paper_says():
    d, base, L, s = 64, 10000.0, 64, 8.0
    plain, _ = scaled_rope_frequencies(d, base)
    pi, _ = scaled_rope_frequencies(d, base, {"rope_type": "linear", "factor": s})
    torch.testing.assert_close(pi, plain / s, rtol=1e-6, atol=0)  # PI: every frequency / s
    dyn_short, _ = scaled_rope_frequencies(d, base, {"rope_type": "dynamic", "factor": s,
                                                     "original_max_position_embeddings": L}, seq_len=L)
    torch.testing.assert_close(dyn_short, plain, rtol=1e-6, atol=0)  # dynamic: nothing changes up to L
    dyn, _ = scaled_rope_frequencies(d, base, {"rope_type": "dynamic", "factor": 1.0,
                                               "original_max_position_embeddings": L}, seq_len=s * L)
    assert dyn[0] == plain[0]  # the highest frequency is kept ...
    torch.testing.assert_close(dyn[-1], plain[-1] / s, rtol=1e-5, atol=0)  # ... the lowest is divided by s
    assert torch.all(dyn <= plain) and torch.all(dyn[1:] < plain[1:])
    yarn, mscale = scaled_rope_frequencies(d, base, {"rope_type": "yarn", "factor": s,
                                                     "original_max_position_embeddings": L})
    assert mscale == pytest.approx(0.1 * math.log(s) + 1) == yarn_mscale(s)
    turns = L * plain / (2 * math.pi)  # full turns of each frequency inside the original length
    assert torch.equal(yarn[turns > 32], plain[turns > 32])  # many turns: kept
    torch.testing.assert_close(yarn[turns < 1], plain[turns < 1] / s, rtol=1e-6, atol=0)  # under a turn: interpolated
    sc3 = {"rope_type": "llama3", "factor": s, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": L}  # fmt: skip
    l3, _ = scaled_rope_frequencies(d, base, sc3)
    wl = 2 * math.pi / plain
    assert torch.equal(l3[wl < L / 4], plain[wl < L / 4])
    torch.testing.assert_close(l3[wl > L], plain[wl > L] / s, rtol=1e-6, atol=0)
    mid = (wl >= L / 4) & (wl <= L)
    assert mid.any() and torch.all(l3[mid] <= plain[mid]) and torch.all(l3[mid] >= plain[mid] / s)


def test_dynamic_accepts_a_device_length_without_reading_it():
    sc = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}
    a, _ = scaled_rope_frequencies(16, 10000.0, sc, seq_len=100)
    b, _ = scaled_rope_frequencies(16, 10000.0, sc, seq_len=torch.tensor(100))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


# -------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "scaling, match",
    [
        ({"rope_type": "ntk-aware", "factor": 2},
         r"unknown rope_type 'ntk-aware'; valid rope types: linear, dynamic, yarn, llama3, longrope, proportional, ntk"),
        ({"rope_type": "ntk"}, r"missing \['factor'\]"),
        ({"factor": 2}, "missing 'rope_type'"),
        ({"rope_type": "linear"}, r"missing \['factor'\]"),
        ({"rope_type": "yarn", "factor": 4}, r"missing \['original_max_position_embeddings'\]"),
        ({"rope_type": "llama3", "factor": 8, "original_max_position_embeddings": 64},
         r"missing \['low_freq_factor', 'high_freq_factor'\]"),
        ({"rope_type": "linear", "factor": 2, "rope_theta": 1e4}, "unknown key.*rope_theta.*base="),
        ({"rope_type": "linear", "factor": 0.5}, r"factor.*>= 1.0, got 0.5"),
        ({"rope_type": "linear", "factor": "2"}, "factor.*finite number, got '2'"),
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 1, "beta_slow": 2},
         "beta_slow < beta_fast"),
        ({"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 0}, "positive integer"),
        ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
          "original_max_position_embeddings": 64}, "low_freq_factor < high_freq_factor"),
    ],
)  # fmt: skip
def test_bad_scaling_is_refused_with_the_valid_choices(scaling, match):
    with pytest.raises(ValueError, match=match):
        scaled_rope_frequencies(16, scaling=scaling)
    with pytest.raises(ValueError, match=match):
        build_model("rope", 11, d_model=32, n_heads=2, num_layers=1, dim_feedforward=32, scaling=scaling)


def test_other_bad_arguments():
    with pytest.raises(TypeError, match="scaling must be None or a dict"):
        check_scaling("yarn")
    with pytest.raises(ValueError, match="head_dim must be even"):
        scaled_rope_frequencies(15)
    with pytest.raises(ValueError, match="base must be a number > 1"):
        scaled_rope_frequencies(16, base=1.0)
    with pytest.raises(ValueError, match=r"rotary_dim=64 exceeds head_dim=16"):
        make_scheme("rope", 32, 2, 1, rotary_dim=64)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        make_scheme("rope", 32, 2, 1, rotary_dim=5)


# -------------------------------------------------------------------- the scheme and its cache
SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8},
]  # fmt: skip


def _small(**options):
    torch.manual_seed(0)
    return build_model("rope", 13, d_model=32, n_heads=2, num_layers=1, dim_feedforward=64, dropout=0.0, **options).eval()


@pytest.mark.parametrize("options", [{"scaling": s} for s in SCALINGS] + [{"rotary_dim": 8},
                                     {"rotary_dim": 8, "scaling": SCALINGS[1]}])  # fmt: skip
def test_kv_cache_is_exact_with_scaling_and_partial_rotary(options):
    m = _small(**options)
    src, tgt = torch.randint(3, 13, (2, 5)), torch.randint(3, 13, (2, 20))
    with torch.no_grad():
        memory = m.encode(src)
        full = m.decode(tgt, memory)
        cache = m.new_cache()
        steps = torch.cat([m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(20)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-4)
    kw = dict(max_new_tokens=24, bos_id=1, eos_id=2)
    assert torch.equal(greedy_decode(m, src, use_cache=True, **kw), greedy_decode(m, src, use_cache=False, **kw))
    assert not torch.allclose(full, _small().decode(tgt, memory))  # the option did change the model


def test_dynamic_cache_matches_up_to_the_training_length_then_keeps_old_rotations():
    sc = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}
    m = _small(scaling=sc)
    src, tgt = torch.randint(3, 13, (2, 5)), torch.randint(3, 13, (2, 16))
    with torch.no_grad():
        memory = m.encode(src)
        cache = m.new_cache()
        steps = torch.cat([m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(16)], 1)
        full8 = m.decode(tgt[:, :8], memory)
        full16 = m.decode(tgt, memory)
    torch.testing.assert_close(steps[:, :8], full8, atol=1e-5, rtol=1e-4)  # within L: identical
    assert not torch.allclose(steps[:, 8:], full16[:, 8:], atol=1e-4)  # beyond L: keys keep their old rotation


def test_cache_tables_hold_the_scaled_frequencies_and_yarn_scale():
    sc = SCALINGS[1]
    cache = RotaryCache(8, 10000.0, interleaved=False, scaling=sc)
    pos = torch.tensor([0, 5, 70])  # beyond the first table: it grows
    cos, sin = cache(pos)
    ref_cos, ref_sin = scaled_rope_cos_sin(pos, 8, 10000.0, False, sc)
    torch.testing.assert_close(cos, ref_cos)
    torch.testing.assert_close(sin, ref_sin)
    assert cos[0, 0].item() == pytest.approx(yarn_mscale(4.0))  # cos(0) times the attention scale
    x = torch.randn(3, 8)
    # rotation keeps the norm up to the attention scale
    torch.testing.assert_close(apply_rope_cos_sin(x, cos, sin, False).norm(dim=-1), x.norm(dim=-1) * yarn_mscale(4.0))


def test_partial_rotary_leaves_the_tail_of_each_head_untouched():
    scheme = make_scheme("rope", 32, 2, 1, rotary_dim=4)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    prep = scheme.prepare(torch.arange(6), torch.arange(6))
    oq, ok = scheme.rotate(q, k, prep, 0)
    assert torch.equal(oq[..., 4:], q[..., 4:]) and torch.equal(ok[..., 4:], k[..., 4:])
    assert not torch.allclose(oq[..., :4], q[..., :4])


# -------------------------------------------------------------------- the experiment (smoke size)
from posenc_lib.experiments import long_context as lc  # noqa: E402


def test_causal_lm_is_causal_and_a_scaling_swap_keeps_the_weights():
    cfg = lc.SMOKE
    m = lc.make_model("rope", cfg, 20).eval()
    x = torch.randint(0, 20, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(0, 20, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:, :7], m(y)[:, :7])  # the future never leaks back
        before = m(x)
        lc.use_method(m, "rope", cfg, "linear")
        after = m(x)
        assert not torch.allclose(before, after)  # positions are read differently ...
        lc.use_method(m, "rope", cfg, "none")
        torch.testing.assert_close(m(x), before)  # ... and the weights are untouched


def test_scalings_cover_every_method_and_extend_to_the_longest_length():
    cfg = lc.COURSE
    sc = lc.scalings(cfg)
    assert tuple(sc) == lc.METHODS and sc["none"] is None
    assert cfg.factor * cfg.train_len == cfg.long_len == 512
    for method, s in sc.items():
        if s is not None:
            scaled_rope_frequencies(cfg.d_model // cfg.n_heads, scaling=s, seq_len=cfg.long_len)  # all valid


def test_smoke_run_writes_results_resumes_and_refuses_another_config(tmp_path):
    cfg = lc.SMOKE
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    logs = []
    lc.run_all(cfg, [0], out, ckpt, names=["rope", "nope"], finetunes=[("rope", "yarn")], log=logs.append)
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == ["nope_seed0.json", "rope+ft-yarn_seed0.json", "rope_seed0.json"]
    recs = lc.load_results(out)
    rope = next(r for r in recs if r["model"] == "rope" and r["kind"] == "pretrain")
    assert set(rope["eval"]) == set(lc.METHODS)
    for rows in rope["eval"].values():
        assert [r["length"] for r in rows] == list(cfg.eval_lengths)
        for r in rows:
            assert r["ppl"] == pytest.approx(math.exp(r["nll"]), rel=1e-3) and 1 < r["ppl"] < rope["vocab_size"] * 2
            assert 0 <= r["attention_entropy"] <= math.log(r["length"]) + 1e-3
    # the untrained-at-long-length dynamic scaling changes nothing at the training length
    assert rope["eval"]["dynamic"][0]["nll"] == rope["eval"]["none"][0]["nll"]
    s = lc.summarize(recs)
    assert ("finetune", "rope", "yarn") in s and s[("pretrain", "nope", "none")]["seeds"] == [0]
    # resume: nothing left to do
    logs.clear()
    lc.run_all(cfg, [0], out, ckpt, names=["rope", "nope"], finetunes=[("rope", "yarn")], log=logs.append)
    assert logs == ["skipping 3 finished result(s) in " + str(out)]
    from dataclasses import replace

    with pytest.raises(ValueError, match="another configuration"):
        lc.run_all(replace(cfg, steps=31), [0], out, ckpt, names=["nope"], finetunes=[], log=logs.append)


def test_command_line_rejects_bad_flags(capsys):
    for argv in (["--models", "rope,gpt"], ["--seeds", "a"], ["--jobs", "0"], ["--profile", "huge"]):
        with pytest.raises(SystemExit) as e:
            lc.main(argv)
        assert e.value.code == 2
    assert "valid choices: rope, rope-base500k" in capsys.readouterr().err


def test_config_validation():
    from dataclasses import replace

    with pytest.raises(ValueError, match="steps must be a positive integer"):
        replace(lc.SMOKE, steps=0)
    with pytest.raises(ValueError, match="eval_chars=10 is shorter"):
        replace(lc.SMOKE, eval_chars=10)


@pytest.mark.parametrize("scaling", SCALINGS + [{"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}])
def test_scaled_rope_is_built_on_the_positions_device_without_reading_values(scaling):
    """On the meta device nothing can be read back: any host read or CPU-only tensor would fail here."""
    scheme = make_scheme("rope", 32, 2, 1, causal=True, scaling=scaling)
    pos = torch.arange(20, device="meta")
    prep = scheme.prepare(pos, pos)
    assert prep["cos"].device.type == "meta" and prep["cos"].shape == (20, 16)
    q = torch.empty(1, 2, 20, 16, device="meta")
    oq, ok = scheme.rotate(q, q, prep, 0)
    assert oq.shape == q.shape and oq.device.type == "meta"


def test_t5_ablation_changes_nothing_within_the_training_length(tmp_path):
    # lesson 07: the untrained buckets are replaced by the last trained one; at the training length no untrained
    # bucket is used, so the evaluation there must not move
    import json

    from posenc_lib.experiments import long_context_extra as extra

    cfg = lc.SMOKE
    assert extra.trained_buckets(lc.COURSE) == list(range(27))         # distances 0..63 reach buckets 0..26
    rec = json.loads(extra.t5_ablation(cfg=cfg, out=tmp_path).read_text())
    assert rec["trained_buckets"] == extra.trained_buckets(cfg) and rec["table_max_abs_diff_vs_committed"] is None
    assert sorted(rec["trained_buckets"] + rec["unseen_buckets"]) == list(range(32))
    trained, copied = rec["eval"].values()
    assert trained[0]["length"] == cfg.train_len and trained[0]["nll"] == copied[0]["nll"]
