"""Lesson 15: RoPE as today's open models use it, each mechanism checked against ``transformers``' own code on
tiny random configs (no download): p-RoPE and NeoX partial rotary, LongRoPE, per-layer positions (Llama 4,
SmolLM3, Cohere2, Gemma 3), Llama 4's temperature, MLA's decoupled RoPE (DeepSeek-V3), M-RoPE (Qwen2-VL,
Qwen3-VL).  A class missing from the installed ``transformers`` skips its test with the reason."""
import importlib
import logging
import math
import random
import warnings

import pytest
import torch

from posenc_lib import make_scheme
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.models.causal_lm import CausalLM
from posenc_lib.schemes.mla import LatentAttention, kv_cache_elements
from posenc_lib.schemes.mrope import apply_mrope, mrope_axes, mrope_cos_sin, mrope_position_ids
from posenc_lib.schemes.rope_layers import (NoPETemperature, layers_from_config, llama4_attention_scale,
                                            rope_nope_pattern)  # fmt: skip
from posenc_lib.schemes.rope_scaling import check_scaling, scaled_rope_cos_sin, scaled_rope_frequencies
from posenc_lib.schemes.rope_spectrum import (base_bound_interval, base_lower_bound, failing_base_windows,
                                              first_negative_margin, full_turn_pairs, partial_rotary_ladder,
                                              rotary_pairs, similarity_margin)  # fmt: skip
from posenc_lib.schemes.rotary import apply_rope, apply_rope_cos_sin, interleaved_to_half_permutation, rope_frequencies

warnings.filterwarnings("ignore")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


def hf(module: str, *names: str):
    """``names`` from ``transformers.models.<module>``, or skip: the pinned version lacks that model."""
    try:
        mod = importlib.import_module(f"transformers.models.{module}")
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no {module} model")
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        pytest.skip(f"transformers {transformers.__version__}: {module} lacks {missing}")
    return [getattr(mod, n) for n in names]


def _llama_config(head_dim, params, max_pos=4096):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=params)  # fmt: skip


def _causal_mask(t):
    return torch.full((t, t), float("-inf")).triu(1)[None, None]


def _copy_attention(ours: MultiHeadAttention, ref) -> MultiHeadAttention:
    with torch.no_grad():
        for a, b in ((ours.q_proj, ref.q_proj), (ours.k_proj, ref.k_proj), (ours.v_proj, ref.v_proj),
                     (ours.out_proj, ref.o_proj)):  # fmt: skip
            a.weight.copy_(b.weight)
    return ours.eval()


# ==================================================================== 1. partial rotary: NeoX vs p-RoPE
def test_proportional_frequencies_match_transformers_on_random_settings():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rng = random.Random(15)
    for _ in range(40):
        head_dim = rng.choice([4, 8, 16, 30, 64, 128, 256, 512])
        p = rng.choice([0.0, 0.1, 0.25, 0.5, 0.75, 1.0, rng.random()])
        base = rng.choice([10000.0, 1e6, rng.uniform(100.0, 1e7)])
        params = {"rope_type": "proportional", "partial_rotary_factor": p, "rope_theta": base}
        if rng.random() < 0.3:
            params["factor"] = rng.choice([1.0, 2.0, 8.0])
        ref, ref_scale = ROPE_INIT_FUNCTIONS["proportional"](_llama_config(head_dim, params), None)
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        ours, scale = scaled_rope_frequencies(head_dim, base, scaling)
        assert ours.shape == (head_dim // 2,) and scale == ref_scale == 1.0
        torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
        assert int((ours > 0).sum()) == rotary_pairs(p, head_dim)  # the fastest pairs kept, the slowest zero


def test_proportional_matches_gemma4_global_layers():
    (Gemma4TextConfig,) = hf("gemma4", "Gemma4TextConfig")
    (Gemma4TextRotaryEmbedding,) = hf("gemma4.modeling_gemma4", "Gemma4TextRotaryEmbedding")
    cfg = Gemma4TextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           global_head_dim=32, num_hidden_layers=6, intermediate_size=32, vocab_size=64,
                           vocab_size_per_layer_input=64, hidden_size_per_layer_input=8)  # fmt: skip
    params = cfg.rope_parameters["full_attention"]
    assert params["rope_type"] == "proportional" and params["partial_rotary_factor"] == 0.25
    rot = Gemma4TextRotaryEmbedding(cfg)
    pos = torch.arange(300)
    for layer_type, head_dim, scaling in (("full_attention", 32, {"rope_type": "proportional",
                                                                   "partial_rotary_factor": 0.25}),
                                          ("sliding_attention", 16, None)):  # fmt: skip
        cos, sin = rot(torch.zeros(1, 1, head_dim), pos[None], layer_type)
        base = cfg.rope_parameters[layer_type]["rope_theta"]
        oc, os_ = scaled_rope_cos_sin(pos, head_dim, base, interleaved=False, scaling=scaling)
        torch.testing.assert_close(oc, cos[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(os_, sin[0], atol=1e-5, rtol=1e-5)
    # in a p-RoPE head the zero-frequency pairs do not move: 12 of 16 pairs, dims 2..15 and 18..31
    scheme = make_scheme("rope", 64, 2, 1, causal=True, interleaved=False,
                         scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})  # fmt: skip
    q = torch.randn(1, 2, 300, 32)
    rq, _ = scheme.rotate(q, q, scheme.prepare(pos, pos), 0)
    still = torch.cat((torch.arange(4, 16), torch.arange(20, 32)))
    assert torch.equal(rq[..., still], q[..., still]) and not torch.allclose(rq[..., :4], q[..., :4])


@pytest.mark.parametrize("module,attention,rotary", [("gpt_neox.modeling_gpt_neox", "GPTNeoXAttention", "GPTNeoXRotaryEmbedding"),
                                                     ("phi.modeling_phi", "PhiAttention", "PhiRotaryEmbedding"),
                                                     ("stablelm.modeling_stablelm", "StableLmAttention",
                                                      "StableLmRotaryEmbedding")])  # fmt: skip
def test_neox_partial_rotary_matches_transformers(module, attention, rotary):
    """RotaryScheme(rotary_dim=r) rotates what GPT-NeoX, Phi and StableLM rotate: their cos/sin and apply."""
    (rot_cls, apply) = hf(module, rotary, "apply_rotary_pos_emb")
    family = module.split(".")[0]
    config_cls = {"gpt_neox": "GPTNeoXConfig", "phi": "PhiConfig", "stablelm": "StableLmConfig"}[family]
    cfg = getattr(transformers, config_cls)(hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                                           intermediate_size=32, vocab_size=50,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                            "partial_rotary_factor": 0.25})  # fmt: skip
    rot = rot_cls(cfg)
    pos = torch.arange(40)
    q, k = torch.randn(1, 2, 40, 32), torch.randn(1, 2, 40, 32)
    cos, sin = rot(q, pos[None])
    r = cos.shape[-1]
    assert r == 8 == 2 * rotary_pairs(0.25, 32)
    if family == "gpt_neox":
        eq, ek = apply(q, k, cos, sin)
    else:  # Phi and StableLM split the head themselves before rotating
        eq, ek = apply(q[..., :r], k[..., :r], cos, sin)
        eq, ek = torch.cat((eq, q[..., r:]), -1), torch.cat((ek, k[..., r:]), -1)
    scheme = make_scheme("rope", 64, 2, 1, causal=True, interleaved=False, rotary_dim=r)
    oq, ok = scheme.rotate(q, k, scheme.prepare(pos, pos), 0)
    torch.testing.assert_close(oq, eq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ok, ek, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(partial_rotary_ladder("neox", 0.25, 32)[: r // 2], rot.inv_freq.float())


def test_the_two_partial_ladders_agree_only_at_the_ends():
    for head_dim in (16, 32, 64, 128):
        for f in (0.0, 1.0):
            torch.testing.assert_close(partial_rotary_ladder("neox", f, head_dim),
                                       partial_rotary_ladder("proportional", f, head_dim))  # fmt: skip
        for f in (0.25, 0.5):
            neox, prop = partial_rotary_ladder("neox", f, head_dim), partial_rotary_ladder("proportional", f, head_dim)
            pairs = rotary_pairs(f, head_dim)
            assert int((neox > 0).sum()) == int((prop > 0).sum()) == pairs
            assert neox[0] == prop[0] == 1.0                        # both keep the fastest pair
            assert (neox[1:pairs] < prop[1:pairs]).all()            # NeoX reaches down to slow speeds, p-RoPE does not
            torch.testing.assert_close(neox[pairs - 1], torch.tensor(10000.0 ** (-(2 * pairs - 2) / (2 * pairs))))
    assert rotary_pairs(0.1, 16) == 0 and rotary_pairs(0.1, 32) == 1 and rotary_pairs(0.1, 64) == 3


# ==================================================================== 2. LongRoPE
def _longrope(head_dim, rng, L=64):
    return {"rope_type": "longrope", "factor": 8.0, "original_max_position_embeddings": L,
            "short_factor": [rng.uniform(1.0, 1.5) for _ in range(head_dim // 2)],
            "long_factor": [rng.uniform(1.0, 20.0) for _ in range(head_dim // 2)]}  # fmt: skip


def test_longrope_frequencies_match_transformers_on_random_settings():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rng = random.Random(3)
    for _ in range(30):
        head_dim, L = rng.choice([4, 8, 32, 96, 128]), rng.choice([64, 4096, 8192])
        sc = _longrope(head_dim, rng, L)
        sc["factor"] = rng.choice([1.0, 4.0, 32.0])
        if rng.random() < 0.3:
            sc["attention_factor"] = rng.uniform(0.8, 1.5)
        base = rng.choice([10000.0, rng.uniform(100.0, 1e6)])
        seq_len = rng.choice([None, 1, L, L + 1, 16 * L])
        cfg = _llama_config(head_dim, {**sc, "rope_theta": base}, max_pos=int(L * sc["factor"]))
        ref, ref_scale = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=seq_len)
        ours, scale = scaled_rope_frequencies(head_dim, base, sc, seq_len)
        torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
        assert scale == pytest.approx(ref_scale, rel=1e-12)
        if seq_len is not None:  # a length on the device picks the same set without being read back
            assert torch.equal(scaled_rope_frequencies(head_dim, base, sc, torch.tensor(seq_len))[0], ours)


def test_longrope_scheme_rotates_like_phi3_short_then_long():
    Phi3Config = transformers.Phi3Config
    (Phi3RotaryEmbedding, apply) = hf("phi3.modeling_phi3", "Phi3RotaryEmbedding", "apply_rotary_pos_emb")
    sc = _longrope(16, random.Random(1))
    cfg = Phi3Config(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32,
                     vocab_size=50, max_position_embeddings=512, original_max_position_embeddings=64,
                     rope_parameters={k: v for k, v in sc.items() if k != "factor"} | {"rope_theta": 10000.0})  # fmt: skip
    scheme = make_scheme("rope", 32, 2, 1, causal=True, interleaved=False, scaling=sc)
    for n in (40, 64, 65, 300):  # short factors up to the original length, long beyond (the whole sequence)
        rot = Phi3RotaryEmbedding(cfg)
        pos = torch.arange(n)
        q, k = torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16)
        eq, ek = apply(q, k, *rot(q, pos[None]))
        oq, ok = scheme.rotate(q, k, scheme.prepare(pos, pos), 0)
        torch.testing.assert_close(oq, eq, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ok, ek, atol=1e-5, rtol=1e-5)
    assert scaled_rope_frequencies(16, 10000.0, sc)[1] == pytest.approx(math.sqrt(1 + math.log(8) / math.log(64)))


# ==================================================================== 3. the base and the context
def test_full_turns_and_the_similarity_margin():
    assert full_turn_pairs(16, 10000.0, 64) == 3                    # lesson 14's head
    assert [full_turn_pairs(128, b, 8192) for b in (1e4, 5e5, 1e6)] == [50, 35, 34]
    m = torch.arange(0, 5000)
    B = similarity_margin(m, 128, 10000.0)
    assert B[0] == 64 and first_negative_margin(128, 10000.0, 5000) == int((B < 0).nonzero()[0, 0])
    assert first_negative_margin(128, 1e9, 5000) is None
    theta = rope_frequencies(128, 10000.0).double()
    torch.testing.assert_close(B[1234], torch.cos(1234 * theta).sum())


def test_base_bound_interval_brackets_the_first_passing_base_to_rtol():
    for L, step, rtol in ((256, 0.01, 1e-3), (1024, 0.002, 1e-5)):
        r = base_bound_interval(L, 128, low=L, step=step, rtol=rtol)
        assert first_negative_margin(128, r.upper, L) is None               # B >= 0 for every m <= L
        assert first_negative_margin(128, r.lower, L) == r.fails_at <= L    # some m <= L has B < 0
        assert similarity_margin(torch.tensor([r.fails_at]), 128, r.lower).item() < 0
        assert r.lower < r.upper <= r.lower * (1 + rtol)
        below = [L * 10 ** (i * step) for i in range(10**4) if L * 10 ** (i * step) <= r.lower]
        assert below and all(first_negative_margin(128, b, L) is not None for b in below)  # every grid base below fails
        assert base_lower_bound(L, 128, low=L, step=step, rtol=rtol) == r.upper
    m = torch.arange(0, 1025)
    r = base_bound_interval(1024, 128, low=1024, step=0.002)
    assert (similarity_margin(m, 128, r.upper) >= 0).all() and (similarity_margin(m, 128, r.lower) < 0).any()


def test_base_bound_interval_closed_form_for_two_pairs():
    # d = 4: theta = (1, b^-1/2), B(m) = cos m + cos(m / sqrt b). For b >= 100 and m <= 22, m / sqrt b < pi, where
    # B(m) >= 0 exactly when m / sqrt b <= acos(-cos m), the distance from m to the nearest odd multiple of pi: the
    # passing bases are [b*, inf) with b* = max over m <= L of (m / acos(-cos m))^2 (m = 3 for L = 3, m = 22 for L = 22)
    for L, worst in ((3, 3), (22, 22)):
        exact = max((m / math.acos(-math.cos(m))) ** 2 for m in range(1, L + 1))
        nearest_odd = math.pi * (2 * round((worst / math.pi - 1) / 2) + 1)
        assert exact == pytest.approx((worst / abs(worst - nearest_odd)) ** 2)
        r = base_bound_interval(L, 4, low=100.0, step=0.01, rtol=1e-6)
        assert r.upper <= r.lower * (1 + 1e-6)
        assert r.lower * (1 - 1e-6) <= exact <= r.upper * (1 + 1e-6)   # float32 frequencies: about 1e-7 relative
    assert round(base_lower_bound(3, 4, low=100.0, rtol=1e-6)) == round((3 / (math.pi - 3)) ** 2) == 449


def test_the_margin_is_not_monotone_in_the_base():
    # a coarser grid steps over a narrow window of passing bases that a finer one finds
    coarse, fine = (base_bound_interval(1024, 128, low=1024, step=s) for s in (0.01, 0.002))
    assert fine.upper < coarse.lower
    # above the bound bases fail again: the windows are runs of failing grid bases, the grid between them passes
    start, stop, step = fine.upper, 10 * fine.upper, 0.005
    grid = [10 ** (math.log10(start) + i * step) for i in range(201)]
    fails = [first_negative_margin(128, b, 1024) is not None for b in grid]
    windows = failing_base_windows(1024, 128, start, stop, step=step)
    assert windows and not fails[0]
    runs, i = [], 0
    while i < len(grid):
        if fails[i]:
            j = i
            while j + 1 < len(grid) and fails[j + 1]:
                j += 1
            runs.append((grid[i], grid[j]))
            i = j
        i += 1
    flat = lambda pairs: [x for pair in pairs for x in pair]
    assert len(windows) == len(runs) and flat(windows) == pytest.approx(flat(runs), rel=1e-12)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(context_len=0), ValueError, "context_len must be a positive integer, got 0"),
    (dict(context_len=2.5), ValueError, "context_len must be a positive integer"),
    (dict(head_dim=127), ValueError, "head_dim must be even"),
    (dict(low=1.0), ValueError, r"low must be a finite number in \(1.0, inf\), got 1.0"),
    (dict(low=float("nan")), ValueError, "low must be a finite number"),
    (dict(high=500.0), ValueError, "low must be smaller than high, got low=1000.0, high=500.0"),
    (dict(step=0), ValueError, r"step must be a finite number in \(0.0, "),
    (dict(step=20.0), ValueError, r"step must be a finite number in \(0.0, 7.0\], got 20.0"),
    (dict(step="fine"), TypeError, "step must be a finite number"),
    (dict(rtol=0.0), ValueError, r"rtol must be a finite number in \[1e-12, 1.0\), got 0.0"),
    (dict(rtol=1.0), ValueError, "rtol must be a finite number in"),
    (dict(low=1e7), ValueError, "low=10000000.0 already keeps B\\(m\\) >= 0 .* choose a smaller low"),
    (dict(high=2000.0), ValueError, "no base in \\[1000, 2000\\] keeps .* raise high"),
])  # fmt: skip
def test_base_bound_interval_rejects_bad_inputs(kwargs, error, match):
    args = dict(context_len=1024, head_dim=128, low=1000.0, high=1e10) | kwargs
    with pytest.raises(error, match=match):
        base_bound_interval(args.pop("context_len"), args.pop("head_dim"), **args)


def test_failing_base_windows_rejects_bad_inputs():
    with pytest.raises(ValueError, match="start must be smaller than stop"):
        failing_base_windows(1024, 128, 1e5, 1e4)
    with pytest.raises(ValueError, match=r"stop must be a finite number in \(1.0, inf\)"):
        failing_base_windows(1024, 128, 1e4, float("inf"))
    with pytest.raises(ValueError, match="context_len must be a positive integer"):
        failing_base_windows(-5, 128, 1e4, 1e5)


# ==================================================================== 4. layers that differ
def test_rope_nope_pattern_is_the_llama4_and_smollm3_default():
    pattern = rope_nope_pattern(8)
    assert pattern == [True, True, True, False] * 2
    for name in ("Llama4TextConfig", "SmolLM3Config"):
        if not hasattr(transformers, name):
            continue
        cfg = getattr(transformers, name)(num_hidden_layers=8, hidden_size=32, num_attention_heads=2,
                                          num_key_value_heads=2, intermediate_size=32)  # fmt: skip
        assert [bool(x) for x in cfg.no_rope_layers] == pattern


def test_llama4_temperature_rule_matches_the_reference_formula():
    pos = torch.tensor([0, 8190, 8191, 16382, 16383, 100000])
    s = llama4_attention_scale(pos)
    expected = [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3),
                1 + 0.1 * math.log(math.floor(100001 / 8192) + 1)]  # fmt: skip
    torch.testing.assert_close(s, torch.tensor(expected))


def _run_hf_layers(family, cfg, rotary, ref_layers, position_embeddings, t=20):
    """Our attention, one scheme per layer from ``layers_from_config``, against each ``transformers`` layer."""
    specs = layers_from_config(cfg)
    model = CausalLM(50, specs, d_model=cfg.hidden_size, n_heads=cfg.num_attention_heads,
                     num_layers=cfg.num_hidden_layers, dim_feedforward=16)  # fmt: skip
    x = torch.randn(2, t, cfg.hidden_size)
    pos = torch.arange(t)
    used_rope = []
    for i, ref in enumerate(ref_layers):
        ours = _copy_attention(MultiHeadAttention(cfg.hidden_size, cfg.num_attention_heads, bias=False), ref)
        scheme, index = model.scheme_per_layer[i]
        with torch.no_grad():
            expected, _ = ref(x, position_embeddings, _causal_mask(t))
            got = ours(x, causal=True, scheme=scheme, prep=scheme.prepare(pos, pos), layer=index)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=2e-5, msg=f"{family} layer {i}")
        used_rope.append(scheme.name)
    return specs, used_rope


def test_llama4_layers_rope_nope_and_temperature_match_transformers():
    Llama4TextConfig = transformers.Llama4TextConfig if hasattr(transformers, "Llama4TextConfig") else None
    if Llama4TextConfig is None:
        pytest.skip(f"transformers {transformers.__version__} has no Llama4TextConfig")
    (Attention, Rotary) = hf("llama4.modeling_llama4", "Llama4TextAttention", "Llama4TextRotaryEmbedding")
    cfg = Llama4TextConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                           num_hidden_layers=4, intermediate_size=32, intermediate_size_mlp=32, use_qk_norm=False,
                           attention_chunk_size=None, floor_scale=4, attn_scale=0.5,
                           rope_parameters={"rope_type": "default", "rope_theta": 500.0})  # fmt: skip
    cfg._attn_implementation = "eager"
    layers = [Attention(cfg, i).eval() for i in range(4)]
    assert [bool(layer.use_rope) for layer in layers] == [True, True, True, False]
    t = 20
    freqs_cis = Rotary(cfg)(torch.zeros(1), torch.arange(t)[None])
    specs, names = _run_hf_layers("llama4", cfg, None, layers, freqs_cis, t)
    assert names == ["rope", "rope", "rope", "nope+temperature"]
    assert specs[0] == ("rope", {"base": 500.0, "interleaved": True})
    assert specs[3] == (NoPETemperature, {"floor_scale": 4, "attn_scale": 0.5})


def test_smollm3_layers_match_transformers():
    (Config,) = hf("smollm3", "SmolLM3Config")
    (Attention, Rotary) = hf("smollm3.modeling_smollm3", "SmolLM3Attention", "SmolLM3RotaryEmbedding")
    cfg = Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=4, intermediate_size=32,
                 vocab_size=50, no_rope_layers=[1, 0, 1, 1], rope_parameters={"rope_type": "default", "rope_theta": 300.0})
    cfg._attn_implementation = "eager"
    layers = [Attention(cfg, i).eval() for i in range(4)]
    t = 20
    cos_sin = Rotary(cfg)(torch.zeros(1), torch.arange(t)[None])
    _, names = _run_hf_layers("smollm3", cfg, None, layers, cos_sin, t)
    assert names == ["rope", "none", "rope", "rope"]


def test_cohere2_layers_match_transformers():
    (Config,) = hf("cohere2", "Cohere2Config")
    (Attention, Rotary) = hf("cohere2.modeling_cohere2", "Cohere2Attention", "Cohere2RotaryEmbedding")
    cfg = Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=8, intermediate_size=32,
                 vocab_size=50, sliding_window=4096, rope_parameters={"rope_type": "default", "rope_theta": 700.0})
    cfg._attn_implementation = "eager"
    layers = [Attention(cfg, i).eval() for i in range(8)]
    t = 20
    cos_sin = Rotary(cfg)(torch.zeros(1), torch.arange(t)[None])
    specs, names = _run_hf_layers("cohere2", cfg, None, layers, cos_sin, t)
    assert names == ["rope", "rope", "rope", "none"] * 2  # Command R7B / A: RoPE in the sliding layers only
    assert specs[0] == ("rope", {"base": 700.0, "interleaved": True})


def test_gemma3_local_and_global_bases_match_transformers():
    (Config,) = hf("gemma3", "Gemma3TextConfig")
    (Rotary,) = hf("gemma3.modeling_gemma3", "Gemma3RotaryEmbedding")
    cfg = Config(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_hidden_layers=12,
                 intermediate_size=32, vocab_size=50)
    specs = layers_from_config(cfg)
    bases = [opts["base"] for _, opts in specs]
    assert bases == ([10000.0] * 5 + [1000000.0]) * 2  # five local layers, one global
    rot = Rotary(cfg)
    pos = torch.arange(500)
    model = CausalLM(50, specs, d_model=32, n_heads=2, num_layers=12, dim_feedforward=16)
    assert len(model.layer_schemes) == 2
    for i, layer_type in enumerate(cfg.layer_types):
        cos, sin = rot(torch.zeros(1), pos[None], layer_type)
        scheme, _ = model.scheme_per_layer[i]
        prep = scheme.prepare(pos, pos)
        torch.testing.assert_close(prep["cos"], cos[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(prep["sin"], sin[0], atol=1e-5, rtol=1e-5)


def test_layers_from_config_refuses_other_models():
    with pytest.raises(ValueError, match="llama4_text.*got 'llama'"):
        layers_from_config(transformers.LlamaConfig(hidden_size=32, num_attention_heads=2))


def test_one_scheme_model_is_unchanged_and_per_layer_lists_equal_it():
    torch.manual_seed(0)
    one = CausalLM(30, "rope", d_model=32, n_heads=2, num_layers=4, dim_feedforward=64, interleaved=False)
    torch.manual_seed(0)
    listed = CausalLM(30, [("rope", {"interleaved": False})] * 4, d_model=32, n_heads=2, num_layers=4,
                      dim_feedforward=64)  # fmt: skip
    assert one.scheme is not None and listed.scheme is None and len(listed.layer_schemes) == 1
    assert list(one.state_dict()) == list(listed.state_dict())
    x = torch.randint(0, 30, (2, 25))
    assert torch.equal(one(x), listed(x))
    one.set_scheme(["rope", "rope", "rope", "none"])
    assert [s.name for s, _ in one.scheme_per_layer] == ["rope", "rope", "rope", "none"]
    assert [i for _, i in one.scheme_per_layer] == [0, 1, 2, 0]
    one.set_scheme("rope", interleaved=False)
    assert torch.equal(one(x), listed(x))


def test_a_nope_layer_is_blind_to_order_and_temperature_keeps_keys():
    scheme = NoPETemperature(16, 2, 1, causal=True, floor_scale=2, attn_scale=1.0)
    pos = torch.arange(10)
    q, k = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    rq, rk = scheme.rotate(q, k, scheme.prepare(pos, pos), 0)
    assert torch.equal(rk, k) and torch.equal(rq[..., 0, :], q[..., 0, :]) and not torch.equal(rq, q)
    assert scheme.fused  # still the fused kernel


@pytest.mark.parametrize("bad,match", [
    (["rope"] * 3, "lists 3 layer entries"), ([("rope", 3)] * 4, "an entry is a name"),
    (["sinusoidal"] * 4, "adds to the token embeddings"), (["rotary", "nope", "bogus", "rope"], "unknown positional"),
])  # fmt: skip
def test_bad_layer_lists_are_refused(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        CausalLM(30, bad, d_model=32, n_heads=2, num_layers=4, dim_feedforward=64)
    with pytest.raises(ValueError, match="give each layer's options in its entry"):
        CausalLM(30, ["rope"] * 4, d_model=32, n_heads=2, num_layers=4, dim_feedforward=64, base=5.0)


# ==================================================================== 5. MLA's decoupled RoPE
def _deepseek_pair():
    (Config,) = hf("deepseek_v3", "DeepseekV3Config")
    (Attention, Rotary) = hf("deepseek_v3.modeling_deepseek_v3", "DeepseekV3Attention", "DeepseekV3RotaryEmbedding")
    cfg = Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                 qk_rope_head_dim=8, qk_nope_head_dim=12, v_head_dim=10, rope_interleave=True, num_hidden_layers=1,
                 vocab_size=50, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    cfg._attn_implementation = "eager"
    ref = Attention(cfg, 0).eval()
    with torch.no_grad():
        ref.kv_a_layernorm.weight.uniform_(0.5, 1.5)
    ours = LatentAttention(32, 4, kv_rank=16, nope_dim=12, rope_dim=8, v_dim=10, eps=cfg.rms_norm_eps).eval()
    with torch.no_grad():
        for a, b in ((ours.q_proj, ref.q_proj), (ours.kv_a_proj, ref.kv_a_proj_with_mqa), (ours.kv_norm, ref.kv_a_layernorm),
                     (ours.kv_b_proj, ref.kv_b_proj), (ours.o_proj, ref.o_proj)):  # fmt: skip
            a.weight.copy_(b.weight)
    return cfg, ref, Rotary(cfg), ours


def test_latent_attention_matches_deepseek_v3_and_absorption_is_exact():
    torch.manual_seed(0)
    cfg, ref, rot, ours = _deepseek_pair()
    t = 11
    x = torch.randn(2, t, 32)
    with torch.no_grad():
        expected, _ = ref(x, rot(x, torch.arange(t)[None]), _causal_mask(t))
        got, absorbed = ours(x), ours(x, absorb=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(absorbed, got, atol=1e-5, rtol=1e-5)
    assert ours.cache_elements_per_token() == 16 + 8 and ours.scale == ref.scaling


def test_deepseek_interleaved_rotation_is_lesson_06s_interleaved_rope_regrouped():
    (apply_interleave, Rotary) = hf("deepseek_v3.modeling_deepseek_v3", "apply_rotary_pos_emb_interleave",
                                    "DeepseekV3RotaryEmbedding")  # fmt: skip
    cfg, _, rot, _ = _deepseek_pair()
    pos = torch.arange(37)
    cos, sin = rot(torch.zeros(1), pos[None])
    q, k = torch.randn(1, 4, 37, 8), torch.randn(1, 1, 37, 8)
    eq, ek = apply_interleave(q, k, cos, sin)
    perm = interleaved_to_half_permutation(8)  # DeepSeek returns evens then odds
    torch.testing.assert_close(apply_rope(q, pos, interleaved=True)[..., perm], eq, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(apply_rope(k, pos, interleaved=True)[..., perm], ek, atol=1e-6, rtol=1e-6)


def test_rope_on_the_full_key_breaks_absorption():
    torch.manual_seed(0)
    d, r, n = 16, 8, 6
    w_uk, q, c = torch.randn(d, r, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64), torch.randn(n, r, dtype=torch.float64)
    plain = q @ (c @ w_uk.t()).t()
    torch.testing.assert_close((q @ w_uk) @ c.t(), plain)              # absorbed: exact
    pos = torch.arange(n)
    roped = apply_rope(q, pos) @ apply_rope(c @ w_uk.t(), pos).t()
    absorbed = (apply_rope(q, pos) @ w_uk) @ c.t()                     # the best one can fold in
    assert (roped - absorbed).abs().max() > 0.1


def test_kv_cache_sizes_of_deepseek_v2_against_its_dense_predecessor():
    mla = kv_cache_elements("mla", layers=60, kv_rank=512, rope_dim=64)        # DeepSeek-V2
    gqa = kv_cache_elements("gqa", layers=95, n_kv_heads=8, head_dim=128)      # DeepSeek LLM 67B
    mha = kv_cache_elements("mha", layers=60, n_heads=128, head_dim=128)       # V2's heads with plain MHA
    assert (mla, gqa, mha) == (34560, 194560, 1966080)
    assert round(1 - mla / gqa, 3) == 0.822 and round(1 - mla * 6 / (gqa * 16), 3) == 0.933
    with pytest.raises(ValueError, match="unknown attention kind 'mqa'; valid kinds: mha, gqa, mla"):
        kv_cache_elements("mqa", layers=1)


# ==================================================================== 6. M-RoPE
def _qwen_models():
    out = {}
    text = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1, intermediate_size=32,
                vocab_size=50, head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                             "rope_theta": 10000.0})  # fmt: skip
    if hasattr(transformers, "Qwen2VLModel"):
        cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(
            depth=1, embed_dim=16, hidden_size=32, num_heads=2, spatial_merge_size=2, patch_size=2,
            temporal_patch_size=1, mlp_ratio=1))  # fmt: skip
        out["qwen2_vl"] = transformers.Qwen2VLModel(cfg).eval()
    if hasattr(transformers, "Qwen3VLModel"):
        cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=dict(
            depth=1, hidden_size=16, num_heads=2, intermediate_size=16, spatial_merge_size=2, patch_size=2,
            temporal_patch_size=1, out_hidden_size=32, deepstack_visual_indexes=[]))  # fmt: skip
        out["qwen3_vl"] = transformers.Qwen3VLModel(cfg).eval()
    return out


@pytest.fixture(scope="module")
def qwen_models():
    return _qwen_models()


@pytest.mark.parametrize("family,layout", [("qwen2_vl", "chunked"), ("qwen3_vl", "interleaved")])
def test_mrope_ids_and_rotation_match_qwen(qwen_models, family, layout):
    if family not in qwen_models:
        pytest.skip(f"transformers {transformers.__version__} has no {family} model")
    model = qwen_models[family]
    segments = [("text", 3), ("image", (2, 3)), ("text", 2), ("image", (3, 1)), ("text", 4)]
    types = [0] * 3 + [1] * 6 + [0] * 2 + [1] * 3 + [0] * 4
    ids = torch.tensor([[7] * len(types)])
    grid = torch.tensor([[1, 4, 6], [1, 6, 2]])  # before the 2x2 merge
    ref_ids, _ = model.get_rope_index(ids, torch.tensor([types]), image_grid_thw=grid)
    ours = mrope_position_ids(segments)
    assert torch.equal(ours, ref_ids[:, 0])
    rot = model.language_model.rotary_emb
    cos, sin = rot(torch.zeros(1), ref_ids)
    oc, os_ = mrope_cos_sin(ours, 16, (2, 3, 3), 10000.0, layout)
    torch.testing.assert_close(oc, cos[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(os_, sin[0], atol=1e-6, rtol=1e-6)


def test_mrope_layouts_and_text_reduces_to_rope():
    assert mrope_axes(16, (2, 3, 3), "chunked").tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert mrope_axes(16, (2, 3, 3), "interleaved").tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert torch.bincount(mrope_axes(128, (24, 20, 20), "interleaved")).tolist() == [24, 20, 20]
    x = torch.randn(2, 9, 16)
    text = mrope_position_ids([("text", 9)])
    for layout in ("chunked", "interleaved"):
        torch.testing.assert_close(apply_mrope(x, text, (2, 3, 3), layout=layout), apply_rope(x, interleaved=False))
    # scores depend on (dt, dh, dw) only: shifting every id by the same amounts changes nothing
    ids = mrope_position_ids([("image", (3, 3))])
    q, k = torch.randn(9, 16), torch.randn(9, 16)
    shifted = ids + torch.tensor([[5], [2], [7]])
    for layout in ("chunked", "interleaved"):
        s0 = apply_mrope(q, ids, (2, 3, 3), layout=layout) @ apply_mrope(k, ids, (2, 3, 3), layout=layout).t()
        s1 = apply_mrope(q, shifted, (2, 3, 3), layout=layout) @ apply_mrope(k, shifted, (2, 3, 3), layout=layout).t()
        torch.testing.assert_close(s0, s1, atol=1e-5, rtol=1e-5)


# ==================================================================== bad inputs
@pytest.mark.parametrize("call,match", [
    (lambda: check_scaling({"rope_type": "proportional", "partial_rotary_factor": 1.5}), "in \\[0, 1\\]; got 1.5"),
    (lambda: check_scaling({"rope_type": "longrope", "factor": 2.0, "original_max_position_embeddings": 64,
                            "short_factor": [], "long_factor": [1.0]}), "short_factor.*non-empty list"),
    (lambda: scaled_rope_frequencies(16, 10000.0, {"rope_type": "longrope", "factor": 2.0,
                                                   "original_max_position_embeddings": 64, "short_factor": [1.0] * 4,
                                                   "long_factor": [1.0] * 8}), "has 4 factors; head_dim=16 has 8"),
    (lambda: check_scaling({"rope_type": "ntk-aware", "factor": 2.0}), "valid rope types: .*longrope, proportional, ntk"),
    (lambda: partial_rotary_ladder("gptj", 0.5, 16), "unknown partial rotary kind 'gptj'; valid kinds: neox, proportional"),
    (lambda: rotary_pairs(1.2, 16), "fraction must be a number in \\[0, 1\\]"),
    (lambda: mrope_axes(16, (2, 3, 4)), "summing to head_dim // 2 = 8, got \\[2, 3, 4\\]"),
    (lambda: mrope_axes(16, (2, 3, 3), "zigzag"), "unknown M-RoPE layout 'zigzag'; valid layouts: chunked, interleaved"),
    (lambda: mrope_position_ids([("audio", 3)]), "segment 0 must be"),
    (lambda: llama4_attention_scale(torch.arange(3), floor_scale=0), "floor_scale must be a number > 0"),
    (lambda: LatentAttention(32, 4, 16, 12, 7, 10), "rope_dim must be even"),
])  # fmt: skip
def test_bad_inputs_name_the_value_and_the_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_rope_cos_sin_of_zero_frequencies_is_the_identity():
    cos, sin = scaled_rope_cos_sin(torch.arange(50), 16, 10000.0, False, {"rope_type": "proportional",
                                                                        "partial_rotary_factor": 0.0})  # fmt: skip
    assert torch.equal(cos, torch.ones(50, 16)) and torch.equal(sin, torch.zeros(50, 16))
    x = torch.randn(3, 50, 16)
    assert torch.equal(apply_rope_cos_sin(x, cos, sin, interleaved=False), x)


# ==================================================================== the experiment (smoke profile)
def test_sweep_models_rotate_what_their_names_say():
    from posenc_lib.experiments import rope_variants as rv

    cfg = rv.COURSE
    assert cfg.d_model // cfg.n_heads == 32 and cfg.num_layers == 4 and cfg.train_len == 64
    specs = rv.models(cfg)
    assert list(specs) == ["nope", "rope", "neox-0.1", "prope-0.1", "neox-0.25", "prope-0.25", "neox-0.5",
                           "prope-0.5", "rope3-nope1"]  # fmt: skip
    assert [specs[f"neox-{f:g}"][1]["rotary_dim"] for f in (0.1, 0.25, 0.5)] == [2, 8, 16]
    for f in (0.1, 0.25, 0.5):  # the same number of rotating pairs for both kinds
        model = rv.make_model(f"prope-{f:g}", cfg, 20)
        inv, _ = scaled_rope_frequencies(32, 10000.0, model.scheme.cache.scaling)
        assert int((inv > 0).sum()) == rotary_pairs(f, 32) == specs[f"neox-{f:g}"][1]["rotary_dim"] // 2
        assert rv.make_model(f"neox-{f:g}", cfg, 20).scheme.rotary_dim == 2 * rotary_pairs(f, 32)
    assert [rv.model_name(k, f) for k in rv.KINDS for f in (0.0, 1.0)] == ["nope", "rope"] * 2
    layered = rv.make_model("rope3-nope1", cfg, 20)
    assert [s.name for s, _ in layered.scheme_per_layer] == ["rope", "rope", "rope", "none"]
    with pytest.raises(ValueError, match="fraction 0.3 is not in the sweep"):
        rv.model_name("neox", 0.3)


def test_sweep_smoke_run_writes_one_file_per_model_resumes_and_refuses_another_config(tmp_path):
    from dataclasses import replace

    from posenc_lib.experiments import long_context as lc
    from posenc_lib.experiments import rope_variants as rv

    cfg, logs = rv.SMOKE, []
    names = ["nope", "prope-0.25", "rope3-nope1"]
    rv.run_all(cfg, [0], tmp_path, names=names, log=logs.append)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(f"{n}_seed0.json" for n in names)
    recs = lc.load_results(tmp_path)
    for r in recs:
        assert r["profile"] == "rope-variants-smoke" and [e["length"] for e in r["eval"]["none"]] == list(cfg.eval_lengths)
        assert all(1 < e["ppl"] < 2 * r["vocab_size"] for e in r["eval"]["none"])
    table = rv.table(recs)
    assert set(table) == {("neox", 0.0), ("prope", 0.0), ("prope", 0.25)}
    logs.clear()
    rv.run_all(cfg, [0], tmp_path, names=names, log=logs.append)
    assert logs == [f"skipping 3 finished result(s) in {tmp_path}"]
    with pytest.raises(ValueError, match="another configuration"):
        rv.run_all(replace(cfg, steps=31), [0], tmp_path, names=["nope"], log=logs.append)


def test_sweep_timing_and_command_line(tmp_path, capsys):
    from posenc_lib.experiments import rope_variants as rv

    timing = rv.time_updates(rv.SMOKE, updates=2, warmup=1, names=["rope", "rope3-nope1"], log=lambda *_: None)
    assert set(timing["per_model"]) == {"rope", "rope3-nope1"} and timing["cpu_seconds_3_seeds"] > 0
    for argv in (["--models", "rope,gpt"], ["--seeds", "a"], ["--jobs", "0"], ["--time-updates", "-1"]):
        with pytest.raises(SystemExit) as e:
            rv.main(argv)
        assert e.value.code == 2
    assert "valid choices: nope, rope, neox-0.1" in capsys.readouterr().err
    assert rv.main(["--profile", "smoke", "--models", "nope", "--seeds", "0", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "nope_seed0.json").exists()
