"""Lesson 15: the RoPE settings released checkpoints ship -- Gemma 3's scaled global layers, DeepSeek-V3's YaRN
rotary key with its softmax-scale correction, Llama 4 Scout's and Maverick's bases and scaling -- on tiny random
``transformers`` configs that carry the released rope fields, against ``transformers``' own code at positions
far past the original lengths (no download)."""
import logging
import math
import random
import warnings

import pytest
import torch

from posenc_lib.models.causal_lm import CausalLM
from posenc_lib.schemes.mla import LatentAttention, latent_attention_from_config, softmax_mscale
from posenc_lib.schemes.rope_layers import NoPETemperature, layers_from_config
from posenc_lib.schemes.rope_scaling import check_scaling, scaled_rope_frequencies
from posenc_lib.schemes.shipped import SHIPPED, max_cos_sin_difference, rope_kinds, tiny_config
from test_llm_rope import hf  # one skip-if-missing import of transformers models for both files

warnings.filterwarnings("ignore")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

#: the start of a sequence, then positions up to 40,000: past Llama 4's 8,192 and DeepSeek-V3's 4,096
POSITIONS = torch.cat((torch.arange(64), torch.randperm(40_000 - 64, generator=torch.Generator().manual_seed(15))[:192]
                       .sort().values + 64))  # fmt: skip


# ==================================================================== the table and the configs
def test_tiny_configs_carry_the_released_fields_where_the_class_defaults_differ():
    (Gemma3TextConfig,) = hf("gemma3", "Gemma3TextConfig")
    (DeepseekV3Config,) = hf("deepseek_v3", "DeepseekV3Config")
    (Llama4TextConfig,) = hf("llama4", "Llama4TextConfig")
    for name, entry in SHIPPED.items():
        assert tiny_config(name).rope_parameters == entry["rope_parameters"], name
    gemma, deepseek, llama = Gemma3TextConfig(), DeepseekV3Config(), Llama4TextConfig()
    # the class defaults: Gemma 3 1B's settings, Llama 4 Maverick's, and plain RoPE for DeepSeek-V3
    assert gemma.rope_parameters == tiny_config("gemma3-1b").rope_parameters
    assert gemma.rope_parameters != tiny_config("gemma3-4b+").rope_parameters
    assert llama.rope_parameters == tiny_config("llama4-maverick").rope_parameters
    assert llama.rope_parameters != tiny_config("llama4-scout").rope_parameters
    assert deepseek.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert tiny_config("deepseek-v3").qk_rope_head_dim == deepseek.qk_rope_head_dim == 64
    assert rope_kinds("gemma3-4b+")["full_attention"]["factor"] == 8.0
    assert list(rope_kinds("llama4-scout")) == ["rope"] and list(rope_kinds("deepseek-v3")) == ["rotary key"]


def test_shipped_rope_fields_pass_the_library_checks():
    for name in SHIPPED:
        for params in rope_kinds(name).values():
            if params["rope_type"] != "default":
                scaling = check_scaling({k: v for k, v in params.items() if k != "rope_theta"})
                assert {k: scaling[k] for k in params if k != "rope_theta"} == {k: v for k, v in params.items()
                                                                                 if k != "rope_theta"}  # fmt: skip


def test_llama3_scaling_with_equal_factors_is_a_step_as_in_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers import LlamaConfig

    rng = random.Random(4)
    for _ in range(30):
        head_dim, L = rng.choice([8, 32, 64, 128]), rng.choice([64, 1024, 8192])
        f = rng.choice([0.5, 1.0, 2.0])
        params = {"rope_type": "llama3", "factor": rng.choice([2.0, 16.0]), "low_freq_factor": f,
                  "high_freq_factor": f, "original_max_position_embeddings": L}  # fmt: skip
        base = rng.choice([10000.0, 500000.0, rng.uniform(100.0, 1e6)])
        cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                          max_position_embeddings=64 * L, rope_parameters={**params, "rope_theta": base})  # fmt: skip
        ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
        ours, scale = scaled_rope_frequencies(head_dim, base, params)
        torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
        plain, _ = scaled_rope_frequencies(head_dim, base)
        long = 2 * math.pi / plain > L / f
        assert scale == 1.0 and torch.equal(ours[long], plain[long] / params["factor"])
        assert torch.equal(ours[~long], plain[~long])


# ==================================================================== Gemma 3
@pytest.mark.parametrize("name", ["gemma3-4b+", "gemma3-1b"])
def test_gemma3_shipped_layers_rotate_like_transformers(name):
    (Rotary, apply) = hf("gemma3.modeling_gemma3", "Gemma3RotaryEmbedding", "apply_rotary_pos_emb")
    cfg = tiny_config(name)
    specs = layers_from_config(cfg)
    full = {"base": 1e6, "interleaved": False}
    if name == "gemma3-4b+":
        full["scaling"] = {"rope_type": "linear", "factor": 8.0}
    assert specs == [("rope", {"base": 1e4, "interleaved": False})] * 5 + [("rope", full)]
    model = CausalLM(50, specs, d_model=cfg.hidden_size, n_heads=2, num_layers=6, dim_feedforward=16)
    rot, n = Rotary(cfg), len(POSITIONS)
    q, k = torch.randn(1, 2, n, 256), torch.randn(1, 2, n, 256)
    for i, layer_type in enumerate(cfg.layer_types):
        cos, sin = rot(q, POSITIONS[None], layer_type)
        scheme, index = model.scheme_per_layer[i]
        prep = scheme.prepare(POSITIONS, POSITIONS)
        torch.testing.assert_close(prep["cos"], cos[0], atol=1e-6, rtol=0)
        torch.testing.assert_close(prep["sin"], sin[0], atol=1e-6, rtol=0)
        eq, ek = apply(q, k, cos, sin)
        oq, ok = scheme.rotate(q, k, prep, index)
        torch.testing.assert_close(oq, eq, atol=1e-5, rtol=1e-5, msg=f"{name} layer {i} ({layer_type})")
        torch.testing.assert_close(ok, ek, atol=1e-5, rtol=1e-5, msg=f"{name} layer {i} ({layer_type})")


# ==================================================================== Llama 4
@pytest.mark.parametrize("name", ["llama4-scout", "llama4-maverick"])
def test_llama4_shipped_layers_rotate_like_transformers(name):
    (Rotary, apply) = hf("llama4.modeling_llama4", "Llama4TextRotaryEmbedding", "apply_rotary_emb")
    cfg = tiny_config(name)
    specs = layers_from_config(cfg)
    rope = {"base": 500000.0, "interleaved": True}
    if name == "llama4-scout":
        rope["scaling"] = {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                           "original_max_position_embeddings": 8192}  # fmt: skip
    assert specs == [("rope", rope)] * 3 + [(NoPETemperature, {"floor_scale": 8192, "attn_scale": 0.1})]
    model = CausalLM(50, specs, d_model=cfg.hidden_size, n_heads=2, num_layers=4, dim_feedforward=16)
    freqs_cis = Rotary(cfg)(torch.zeros(1), POSITIONS[None])
    n = len(POSITIONS)
    q, k = torch.randn(1, n, 2, 128), torch.randn(1, n, 2, 128)  # transformers' layout: (batch, T, heads, dim)
    eq, ek = apply(q, k, freqs_cis)
    for i in range(3):
        scheme, index = model.scheme_per_layer[i]
        prep = scheme.prepare(POSITIONS, POSITIONS)
        torch.testing.assert_close(prep["cos"][:, ::2], freqs_cis[0].real, atol=1e-6, rtol=0)
        torch.testing.assert_close(prep["sin"][:, ::2], freqs_cis[0].imag, atol=1e-6, rtol=0)
        oq, ok = scheme.rotate(q.transpose(1, 2), k.transpose(1, 2), prep, index)
        torch.testing.assert_close(oq, eq.transpose(1, 2), atol=1e-5, rtol=1e-5, msg=f"{name} layer {i}")
        torch.testing.assert_close(ok, ek.transpose(1, 2), atol=1e-5, rtol=1e-5, msg=f"{name} layer {i}")


# ==================================================================== DeepSeek-V3
def _deepseek_v3_pair():
    (Attention, Rotary) = hf("deepseek_v3.modeling_deepseek_v3", "DeepseekV3Attention", "DeepseekV3RotaryEmbedding")
    cfg = tiny_config("deepseek-v3")
    ref = Attention(cfg, 0).eval()
    with torch.no_grad():
        ref.kv_a_layernorm.weight.uniform_(0.5, 1.5)
    ours = latent_attention_from_config(cfg).eval()
    with torch.no_grad():
        for a, b in ((ours.q_proj, ref.q_proj), (ours.kv_a_proj, ref.kv_a_proj_with_mqa), (ours.kv_norm, ref.kv_a_layernorm),
                     (ours.kv_b_proj, ref.kv_b_proj), (ours.o_proj, ref.o_proj)):  # fmt: skip
            a.weight.copy_(b.weight)
    return cfg, ref, Rotary(cfg), ours


def test_deepseek_v3_shipped_yarn_attention_matches_transformers_softmax_scale_included():
    cfg, ref, rot, ours = _deepseek_v3_pair()
    t = 12  # increasing positions up to the extended 163,840, the first two inside the original 4,096
    positions = torch.cat((torch.tensor([5, 3000]), torch.randperm(163_840 - 4096)[:10].sort().values + 4096))
    x = torch.randn(2, t, cfg.hidden_size)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = ref(x, rot(x, positions[None]), mask)
        got, absorbed = ours(x, positions), ours(x, positions, absorb=True)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(absorbed, got, atol=1e-5, rtol=1e-5)
    mscale = 0.1 * math.log(40) + 1  # 1.369: logits x 1.874, cos and sin untouched
    assert softmax_mscale(ours.scaling) == pytest.approx(mscale, rel=1e-12)
    assert ours.scale == pytest.approx(ref.scaling, rel=1e-12) == mscale**2 / math.sqrt(16 + 64)
    assert rot.attention_scaling == 1.0 and scaled_rope_frequencies(64, 10000.0, ours.scaling)[1] == 1.0
    # the comparison sees both parts: without the softmax factor, or without YaRN, the output moves
    plain = LatentAttention(32, 4, 16, 16, 64, 16, eps=cfg.rms_norm_eps).eval()
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        ours.scale = plain.scale
        assert (ours(x, positions) - expected).abs().max() > 1e-3
        assert (plain(x, positions) - expected).abs().max() > 1e-3


def test_latent_attention_defaults_are_unchanged_by_scaling_support():
    plain = LatentAttention(32, 4, kv_rank=16, nope_dim=12, rope_dim=8, v_dim=10)
    assert plain.scaling is None and plain.scale == 1.0 / math.sqrt(20) and softmax_mscale(None) == 1.0
    linear = LatentAttention(32, 4, 16, 12, 8, 10, scaling={"rope_type": "linear", "factor": 4.0})
    assert linear.scale == plain.scale  # only YaRN with mscale_all_dim touches the softmax scale
    pos = torch.arange(30)
    torch.testing.assert_close(linear.cos_sin(pos)[0], plain.cos_sin(pos / 4)[0])


# ==================================================================== the lesson's comparison
def test_every_shipped_model_matches_transformers_cos_and_sin():
    for name in SHIPPED:
        diffs = max_cos_sin_difference(name, POSITIONS)
        assert set(diffs) == set(rope_kinds(name)), name
        assert all(d < 1e-6 for d in diffs.values()), (name, diffs)


# ==================================================================== bad inputs
@pytest.mark.parametrize("call,match", [
    (lambda: tiny_config("gemma3-27b"), "unknown shipped model 'gemma3-27b'; valid names: gemma3-4b\\+, gemma3-1b"),
    (lambda: tiny_config("llama4-scout", rope_parameters={"rope_type": "default"}), "keeps the released rope fields"),
    (lambda: check_scaling({"rope_type": "llama3", "factor": 8, "low_freq_factor": 2, "high_freq_factor": 1,
                            "original_max_position_embeddings": 64}), "or both equal .*got 2.0 and 1.0"),
    (lambda: LatentAttention(32, 4, 16, 12, 8, 10, scaling={"rope_type": "dynamic", "factor": 2.0,
                                                            "original_max_position_embeddings": 64}),
     "rope_type 'dynamic' depends on the length \\(valid: linear, ntk, yarn"),
    (lambda: latent_attention_from_config(transformers.DeepseekV3Config(q_lora_rank=1536)), "q_lora_rank=1536"),
])  # fmt: skip
def test_bad_inputs_name_the_value_and_the_choices(call, match):
    with pytest.raises(ValueError, match=match):
        call()
