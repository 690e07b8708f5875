"""The RoPE settings released checkpoints ship, next to the defaults of the library and of ``transformers``.

A config class's defaults are not a checkpoint: ``Gemma3TextConfig()`` has no scaling on its global layers,
``DeepseekV3Config()`` plain RoPE and ``Llama4TextConfig()`` no scaling, and this library's RoPE has base
10,000 unless told otherwise.  What the released models use:

* **Gemma 3** (Gemma Team 2025, arXiv:2503.19786, sec. 2.2 "Long context"): global (full-attention)
  layers base 1,000,000 with linear positional interpolation, factor 8 (the 4B, 12B and 27B models,
  128K context); local (sliding-window) layers base 10,000, no scaling; the 1B model (32K context) has
  no scaling.
* **DeepSeek-V3** (DeepSeek-AI 2024, arXiv:2412.19437, sec. 4.3): YaRN on the decoupled rotary key only,
  ``s = 40, alpha = 1, beta = 32`` over an original length of 4,096, base 10,000, 64 rotary dimensions
  per head in interleaved pairs.  The temperature goes into the softmax scale, not into cos and sin
  (:func:`posenc_lib.schemes.mla.softmax_mscale`).
* **Llama 4** (Meta 2025, no paper; reference code meta-llama/llama-models, llama4 args: "Only
  Llama-4-Scout uses scaled rope"): Scout base 500,000 with ``llama3`` scaling, factor 16, both
  frequency factors 1 (a step at 8,192 positions, no blend); Maverick base 500,000, no scaling.
  Interleaved pairs; every fourth layer NoPE with the attention temperature (rope_layers.py).

:data:`SHIPPED` holds these as ``transformers``-style ``rope_parameters``; :func:`tiny_config` builds a
small random ``transformers`` config around them (the rope fields untouched) and
:func:`max_cos_sin_difference` compares this library's cos and sin with ``transformers``' own rotary
embedding for every kind of layer.

Taught in notebooks/15_rope_in_llms.ipynb.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from .mla import latent_attention_from_config
from .registry import make_scheme
from .rope_layers import layers_from_config

__all__ = ["SHIPPED", "rope_kinds", "tiny_config", "max_cos_sin_difference"]

_GEMMA3 = "Gemma Team 2025, arXiv:2503.19786, sec. 2.2 (Long context)"
_LLAMA4 = "Meta 2025, meta-llama/llama-models, llama4 args (only Llama-4-Scout uses scaled rope)"

#: released rope fields per model, as ``transformers``' ``rope_parameters`` (Gemma 3: one dict per layer type);
#: ``head_dim``: the rotating size per head (the head size of ``transformers``' defaults for Gemma 3 and Llama 4,
#: ``qk_rope_head_dim`` for DeepSeek-V3); ``max_position_embeddings``: the tiny config's (Gemma 3's 128K and 32K
#: contexts, 40 x 4,096 for DeepSeek-V3, ``transformers``' default for Llama 4)
SHIPPED: dict[str, dict[str, Any]] = {
    "gemma3-4b+": {
        "model_type": "gemma3_text", "head_dim": 256, "max_position_embeddings": 131072, "source": _GEMMA3,
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    },
    "gemma3-1b": {
        "model_type": "gemma3_text", "head_dim": 256, "max_position_embeddings": 32768, "source": _GEMMA3,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    },
    "deepseek-v3": {
        "model_type": "deepseek_v3", "head_dim": 64, "max_position_embeddings": 163840,
        "source": "DeepSeek-AI 2024, arXiv:2412.19437, sec. 4.3 (long-context extension)",
        "rope_parameters": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "rope_theta": 10_000.0},
    },
    "llama4-scout": {
        "model_type": "llama4_text", "head_dim": 128, "max_position_embeddings": 131072, "source": _LLAMA4,
        "rope_parameters": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                            "original_max_position_embeddings": 8192, "rope_theta": 500_000.0},
    },
    "llama4-maverick": {
        "model_type": "llama4_text", "head_dim": 128, "max_position_embeddings": 131072, "source": _LLAMA4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0},
    },
}  # fmt: skip


def _entry(name: str) -> dict[str, Any]:
    if name not in SHIPPED:
        raise ValueError(f"unknown shipped model {name!r}; valid names: {', '.join(SHIPPED)}")
    return SHIPPED[name]


def rope_kinds(name: str) -> dict[str, dict[str, Any]]:
    """The rope parameters per kind of rotating layer: Gemma 3's two layer types, Llama 4's RoPE layers
    (``"rope"``; its NoPE layers have none), DeepSeek-V3's shared rotary key (``"rotary key"``)."""
    entry = _entry(name)
    params = copy.deepcopy(entry["rope_parameters"])
    if entry["model_type"] == "gemma3_text":
        return params
    return {"rotary key" if entry["model_type"] == "deepseek_v3" else "rope": params}


def tiny_config(name: str, **overrides):
    """A small random ``transformers`` config with the released rope fields of ``name`` (see :data:`SHIPPED`).

    Two heads of the released rotary size, a few layers (one full Gemma 3 pattern of 6, one Llama 4 pattern
    of 4, one DeepSeek-V3 layer with ``q_lora_rank=None``), small vocabulary and feed-forward.
    ``overrides``: other config fields (the rope fields cannot be overridden).
    """
    entry = _entry(name)
    if "rope_parameters" in overrides or "rope_scaling" in overrides:
        raise ValueError(f"tiny_config keeps the released rope fields of {name!r}; override other fields only")
    import transformers

    d = entry["head_dim"]
    common = dict(vocab_size=64, intermediate_size=32, max_position_embeddings=entry["max_position_embeddings"],
                  rope_parameters=copy.deepcopy(entry["rope_parameters"]))  # fmt: skip
    kind = entry["model_type"]
    if kind == "gemma3_text":
        fields = dict(hidden_size=2 * d, num_attention_heads=2, num_key_value_heads=1, head_dim=d, num_hidden_layers=6)
        cls = transformers.Gemma3TextConfig
    elif kind == "llama4_text":
        fields = dict(hidden_size=2 * d, num_attention_heads=2, num_key_value_heads=2, head_dim=d, num_hidden_layers=4,
                      intermediate_size_mlp=32, num_local_experts=2)  # fmt: skip
        cls = transformers.Llama4TextConfig
    else:
        fields = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                      qk_rope_head_dim=d, qk_nope_head_dim=16, v_head_dim=16, num_hidden_layers=1,
                      rope_interleave=True, moe_intermediate_size=16)  # fmt: skip
        cls = transformers.DeepseekV3Config
    config = cls(**{**common, **fields, **overrides})
    config._attn_implementation = "eager"
    return config


def _pairs(cos: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """One column per rotation pair, from an expanded ``(n, head_dim)`` table."""
    return cos[:, ::2] if interleaved else cos[:, : cos.shape[-1] // 2]


def max_cos_sin_difference(name: str, positions: torch.Tensor) -> dict[str, float]:
    """Largest ``|cos - cos_ref|`` and ``|sin - sin_ref|`` per kind of layer (:func:`rope_kinds`), this library
    against ``transformers``' rotary embedding of :func:`tiny_config`, at ``positions (n,)``.

    Ours: the schemes of :func:`layers_from_config` (Gemma 3, Llama 4; every layer of a kind compared) and
    :func:`latent_attention_from_config` (DeepSeek-V3).  Compared per rotation pair, so that both pairings
    (interleaved, halves) line up.
    """
    entry = _entry(name)
    config = tiny_config(name)
    kind = entry["model_type"]
    pos = positions[None]
    out: dict[str, float] = {}

    def record(key, ours, ref):
        diff = max(float((o - r).abs().max()) for o, r in zip(ours, ref))
        out[key] = max(out.get(key, 0.0), diff)

    if kind == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

        cos, sin = latent_attention_from_config(config).cos_sin(positions)
        ref = DeepseekV3RotaryEmbedding(config)(torch.zeros(1), pos)
        record("rotary key", (_pairs(cos, True), _pairs(sin, True)),
               (_pairs(ref[0][0], False), _pairs(ref[1][0], False)))  # fmt: skip
        return out
    if kind == "gemma3_text":
        from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

        rot = Gemma3RotaryEmbedding(config)
        refs = {t: rot(torch.zeros(1), pos, t) for t in set(config.layer_types)}
        kinds = list(config.layer_types)
    else:
        from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding

        freqs_cis = Llama4TextRotaryEmbedding(config)(torch.zeros(1), pos)
        refs = {"rope": (freqs_cis.real.float(), freqs_cis.imag.float())}
        kinds = ["rope" if use else None for use in config.no_rope_layers]
    for (scheme, options), key in zip(layers_from_config(config), kinds):
        if key is None:  # a NoPE layer
            continue
        layer = make_scheme(scheme, config.hidden_size, config.num_attention_heads, 1, causal=True, **options)
        prep = layer.prepare(positions, positions)
        interleaved = options["interleaved"]
        cos_ref, sin_ref = refs[key]
        if kind == "gemma3_text":
            cos_ref, sin_ref = _pairs(cos_ref[0], False), _pairs(sin_ref[0], False)
        else:
            cos_ref, sin_ref = cos_ref[0], sin_ref[0]
        record(key, (_pairs(prep["cos"], interleaved), _pairs(prep["sin"], interleaved)), (cos_ref, sin_ref))
    return out
