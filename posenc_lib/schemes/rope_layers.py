"""Layers that differ in their positions: local and global bases, RoPE layers beside NoPE layers, and
Llama 4's attention temperature on its NoPE layers.

Most open models of 2024-2026 no longer give every layer the same positions:

* **Local/global bases** -- Gemma 3 (Gemma Team 2025, arXiv:2503.19786): five sliding-window ("local")
  layers with RoPE base 10,000 for every full-attention ("global") layer with base 1,000,000
  (``config.layer_types`` and one ``rope_parameters`` entry per layer type in ``transformers``).
* **RoPE and NoPE layers** -- Cohere's Command R7B and Command A (``Cohere2``): RoPE in the
  sliding-window layers, none in every fourth, full-attention layer; Llama 4's iRoPE (Meta 2025) and
  SmolLM3 (Hugging Face 2025): every fourth layer has no positional encoding (``config.no_rope_layers``,
  1 = this layer rotates, 0 = NoPE).  The NoPE layers see the whole context with nothing that
  depends on distance (lesson 13 and Kazemnejad et al. 2023, arXiv:2305.19466); the RoPE layers carry
  order (in Llama 4 inside chunks of 8,192 tokens, in Cohere's models inside a sliding window).
* **Attention temperature** -- Llama 4 multiplies the queries of its NoPE layers by a factor that
  grows with the log of the position (``attn_temperature_tuning``; ``transformers`` cites
  Nakanishi 2025, "Scalable-Softmax Is Superior for Attention", arXiv:2501.19399)::

      q_m <- q_m * (1 + attn_scale * ln(floor((m + 1) / floor_scale) + 1))     (floor_scale 8192, attn_scale 0.1)

  Every score of query ``m`` grows by that factor: the softmax does not flatten as the number of
  keys grows (lesson 14 measured how entropy grows with length).  Positions below ``floor_scale - 1``
  get the factor 1 exactly.

:func:`layers_from_config` turns a ``transformers`` config into one position scheme per layer for
:class:`~posenc_lib.models.causal_lm.CausalLM` (``pe=[...]``).  Masks (sliding windows, Llama 4's chunks)
are not positions and are left out.

Taught in notebooks/15_rope_in_llms.ipynb (section 3).
"""
from __future__ import annotations

from numbers import Real
from typing import Any

import torch

from ..attention.layer import PositionScheme
from ..checks import check_positive_int

__all__ = ["rope_nope_pattern", "llama4_attention_scale", "NoPETemperature", "layers_from_config", "LAYER_FAMILIES"]

#: ``config.model_type`` values :func:`layers_from_config` reads, and the field that says which layer does what
LAYER_FAMILIES = {
    "llama4_text": "no_rope_layers (+ attn_temperature_tuning on the NoPE layers)",
    "smollm3": "no_rope_layers",
    "cohere2": "layer_types (RoPE in sliding_attention layers only)",
    "gemma3_text": "layer_types (a base per layer type)",
}


def rope_nope_pattern(num_layers: int, nope_every: int = 4) -> list[bool]:
    """``True`` for a RoPE layer, ``False`` for a NoPE layer: every ``nope_every``-th layer is NoPE
    (layers 3, 7, 11, ... for 4), the default of Llama 4's and SmolLM3's ``no_rope_layers``."""
    num_layers, nope_every = check_positive_int("num_layers", num_layers), check_positive_int("nope_every", nope_every)
    return [(i + 1) % nope_every != 0 for i in range(num_layers)]


def llama4_attention_scale(positions: torch.Tensor, floor_scale: float = 8192, attn_scale: float = 0.1) -> torch.Tensor:
    """Llama 4's query factor per absolute position ``positions (n,)``: ``1 + attn_scale * ln(floor((m+1)/F) + 1)``.

    float32, like the reference (``Llama4TextAttention``).
    """
    if isinstance(floor_scale, bool) or not isinstance(floor_scale, Real) or not floor_scale > 0:
        raise ValueError(f"floor_scale must be a number > 0 (positions per step of the factor), got {floor_scale!r}")
    if isinstance(attn_scale, bool) or not isinstance(attn_scale, Real) or not attn_scale >= 0:
        raise ValueError(f"attn_scale must be a number >= 0, got {attn_scale!r}")
    return torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0


class NoPETemperature(PositionScheme):
    """No positional encoding, with Llama 4's temperature: queries scaled by :func:`llama4_attention_scale`.

    Enters attention through the ``rotate`` hook (queries only; keys untouched, so a key cache is
    unaffected) and keeps the fused kernel.  ``floor_scale``, ``attn_scale``: Llama 4's config fields.
    """

    name = "nope+temperature"
    enters = "q (scaled)"

    def __init__(self, d_model, n_heads, num_layers, causal=False, floor_scale: float = 8192, attn_scale: float = 0.1):
        super().__init__(d_model, n_heads, num_layers, causal)
        llama4_attention_scale(torch.zeros(1), floor_scale, attn_scale)  # reject bad values now
        self.floor_scale, self.attn_scale = floor_scale, attn_scale

    def rotate(self, q, k, prep, layer):
        scale = llama4_attention_scale(prep["q_pos"], self.floor_scale, self.attn_scale)
        return (q * scale[:, None]).to(q.dtype), k

    def extra_repr(self):
        return f"causal={self.causal}, floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"


def _rope(params: dict, head_dim: int, interleaved: bool) -> tuple[str, dict[str, Any]]:
    """``("rope", options)`` for one ``rope_parameters`` dict of ``transformers``."""
    params = dict(params)
    rope_type = params.pop("rope_type", "default")
    options: dict[str, Any] = {"base": float(params.pop("rope_theta")), "interleaved": interleaved}
    fraction = params.pop("partial_rotary_factor", None)
    if rope_type == "proportional":
        options["scaling"] = {"rope_type": "proportional", **params,
                              **({"partial_rotary_factor": fraction} if fraction is not None else {})}  # fmt: skip
        return "rope", options
    if fraction is not None and fraction < 1:
        options["rotary_dim"] = int(head_dim * fraction)
    if rope_type != "default":
        options["scaling"] = {"rope_type": rope_type, **params}
    return "rope", options


def layers_from_config(config) -> list[tuple[Any, dict[str, Any]]]:
    """One ``(scheme, options)`` per layer of a ``transformers`` config, for ``CausalLM(vocab, pe=...)``.

    ``scheme`` is a registry name (``"rope"``, ``"none"``) or :class:`NoPETemperature`.  Reads the
    fields of :data:`LAYER_FAMILIES`; the pairing (interleaved pairs for Llama 4 and Cohere, halves for
    SmolLM3 and Gemma 3) follows each model's ``apply_rotary`` code.
    """
    kind = getattr(config, "model_type", None)
    if kind not in LAYER_FAMILIES:
        raise ValueError(f"layers_from_config reads model_type {', '.join(LAYER_FAMILIES)}; got {kind!r}")
    n = config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if kind in ("llama4_text", "smollm3"):
        rope = _rope(config.rope_parameters, head_dim, interleaved=kind == "llama4_text")
        nope: tuple[Any, dict] = ("none", {})
        if kind == "llama4_text" and config.attn_temperature_tuning:
            nope = (NoPETemperature, {"floor_scale": config.floor_scale, "attn_scale": config.attn_scale})
        return [rope if config.no_rope_layers[i] else nope for i in range(n)]
    if kind == "cohere2":
        rope = _rope(config.rope_parameters, head_dim, interleaved=True)
        return [rope if config.layer_types[i] == "sliding_attention" else ("none", {}) for i in range(n)]
    # gemma3_text: every layer rotates, with its layer type's parameters
    return [_rope(config.rope_parameters[config.layer_types[i]], head_dim, interleaved=False) for i in range(n)]
