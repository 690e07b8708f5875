"""Decoupled RoPE in multi-head latent attention (MLA), and what it saves in the key/value cache.

MLA (DeepSeek-AI 2024, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model", arXiv:2405.04434; kept in DeepSeek-V3, arXiv:2412.19437, and Kimi K2) caches one small latent
vector ``c_t = RMSNorm(W_DKV h_t)`` of ``kv_rank`` numbers per token instead of every head's key and
value; a head's key and value are up-projections of it, ``k_t = W_UK c_t``, ``v_t = W_UV c_t``.  At
inference the up-projection of the key can be *absorbed* into the query::

    q_m . k_n = q_m . (W_UK c_n) = (W_UK^T q_m) . c_n

so attention runs against the cached latents and no key is ever expanded.  RoPE breaks this: with
rotations, ``(R_m q_m) . (R_n W_UK c_n) = q_m^T R_(n-m) W_UK c_n``, and a matrix that depends on the
distance sits between the query and ``W_UK``: no fixed matrix can be folded into the query.

**Decoupled RoPE** keeps positions out of the latent path: each head's query gets ``rope_dim`` extra
dimensions ``q^R``, and one *shared* key ``k^R_t = RoPE(W_KR h_t)`` of ``rope_dim`` numbers per token
(the same for every head) is cached beside ``c_t``::

    score(m, n) = q^C_m . (W_UK c_n)  +  RoPE_m(q^R_m) . k^R_n       (scaled by 1 / sqrt(nope_dim + rope_dim))

The first term is absorbable, the second is RoPE on a small shared key.  The cache holds
``kv_rank + rope_dim`` numbers per token and layer (512 + 64 in DeepSeek-V2/V3), against
``2 * n_heads * head_dim`` for multi-head attention and ``2 * n_kv_heads * head_dim`` for grouped-query
attention (:func:`kv_cache_elements`).

DeepSeek-V3's checkpoints store ``q^R`` and ``k^R`` with interleaved pairs ``(x0, x1), (x2, x3), ...``
(``rope_interleave`` in ``transformers``), which :class:`LatentAttention` applies with lesson 06's
interleaved rotation.

DeepSeek-V3 (arXiv:2412.19437, sec. 4.3) extends its context with YaRN on the rotary part only
(``scaling={"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1,
"mscale_all_dim": 1}``).  With ``mscale == mscale_all_dim`` the temperature does not reach cos and sin
(their factor ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` is 1); it multiplies the softmax scale
instead, by ``mscale(s, mscale_all_dim)^2`` with ``mscale(s, a) = 0.1 a ln s + 1`` (1.874 at ``s = 40``),
as ``yarn_apply_mscale`` in ``transformers``' DeepSeek-V3 code does: every score, the position-free
part included, is sharpened.

Taught in notebooks/15_rope_in_llms.ipynb (section 4).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .rope_scaling import LENGTH_DEPENDENT, check_scaling, scaled_rope_cos_sin, scaled_rope_frequencies, yarn_mscale
from .rotary import apply_rope_cos_sin, rope_cos_sin
from ..checks import check_even, check_positive_int

__all__ = ["LatentAttention", "latent_attention_from_config", "softmax_mscale", "kv_cache_elements", "CACHE_KINDS"]

#: the attention kinds :func:`kv_cache_elements` sizes
CACHE_KINDS = ("mha", "gqa", "mla")


class LatentAttention(nn.Module):
    """Causal multi-head latent attention with a decoupled rotary key (DeepSeek-V2/V3, ``q_lora_rank=None``).

    ``d_model``: model width; ``n_heads``; ``kv_rank``: the cached latent's size; ``nope_dim``: each head's
    position-free query/key part; ``rope_dim``: each head's rotary query part and the shared rotary key
    (even); ``v_dim``: each head's value size.  ``forward(x (batch, T, d_model), absorb=False)`` returns
    ``(batch, T, d_model)``; ``absorb=True`` computes the same attention against the latents, with
    ``W_UK`` folded into the queries and ``W_UV`` applied after the weighted sum.
    ``scaling``: ``None`` (plain RoPE) or a context-extension dict for the rotary part (rope_scaling.py; not
    the length-dependent ``dynamic`` or ``longrope``); a YaRN dict with ``mscale_all_dim`` also multiplies
    the softmax scale by :func:`softmax_mscale` (DeepSeek-V3).
    """

    def __init__(self, d_model: int, n_heads: int, kv_rank: int, nope_dim: int, rope_dim: int, v_dim: int,
                 base: float = 10000.0, interleaved: bool = True, eps: float = 1e-6,
                 scaling: dict | None = None):  # fmt: skip
        super().__init__()
        for name, v in (("d_model", d_model), ("n_heads", n_heads), ("kv_rank", kv_rank), ("nope_dim", nope_dim),
                        ("v_dim", v_dim)):  # fmt: skip
            check_positive_int(name, v)
        self.n_heads, self.kv_rank, self.nope_dim, self.v_dim = n_heads, kv_rank, nope_dim, v_dim
        self.rope_dim = check_even("rope_dim", rope_dim)
        self.base, self.interleaved = base, interleaved
        self.scaling = check_scaling(scaling)
        if self.scaling is not None:
            if self.scaling["rope_type"] in LENGTH_DEPENDENT:
                raise ValueError(f"LatentAttention takes a fixed rope scaling; rope_type {self.scaling['rope_type']!r} "
                                 f"depends on the length (valid: linear, ntk, yarn, llama3, proportional)")  # fmt: skip
            scaled_rope_frequencies(self.rope_dim, base, self.scaling)  # reject a bad base now
        self.q_proj = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)
        self.kv_a_proj = nn.Linear(d_model, kv_rank + rope_dim, bias=False)  # W_DKV and W_KR side by side
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_rank, n_heads * (nope_dim + v_dim), bias=False)  # W_UK and W_UV per head
        self.o_proj = nn.Linear(n_heads * v_dim, d_model, bias=False)
        mscale = softmax_mscale(self.scaling)  # 1 unless YaRN with mscale_all_dim (DeepSeek-V3)
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim) * mscale * mscale

    def cache_elements_per_token(self) -> int:
        """Numbers cached per token (this layer): the latent and the shared rotary key."""
        return self.kv_rank + self.rope_dim

    def latents(self, x: torch.Tensor, positions: torch.Tensor):
        """What a cache would hold: ``c (batch, T, kv_rank)`` and the rotated shared key ``k_rope (batch, T, rope_dim)``."""
        c, k_rope = self.kv_a_proj(x).split((self.kv_rank, self.rope_dim), dim=-1)
        cos, sin = self.cos_sin(positions)
        return self.kv_norm(c), apply_rope_cos_sin(k_rope, cos, sin, self.interleaved)

    def cos_sin(self, positions: torch.Tensor):
        """cos and sin ``(T, rope_dim)`` of the rotary part, scaled when ``scaling`` is given."""
        if self.scaling is None:
            return rope_cos_sin(positions, self.rope_dim, self.base, self.interleaved)
        return scaled_rope_cos_sin(positions, self.rope_dim, self.base, self.interleaved, self.scaling)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, absorb: bool = False) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device) if positions is None else positions
        q = self.q_proj(x).view(b, t, self.n_heads, -1).transpose(1, 2)  # (b, H, T, nope + rope)
        q_nope, q_rope = q.split((self.nope_dim, self.rope_dim), dim=-1)
        cos, sin = self.cos_sin(positions)
        q_rope = apply_rope_cos_sin(q_rope, cos, sin, self.interleaved)
        c, k_rope = self.latents(x, positions)  # (b, T, kv_rank), (b, T, rope)
        w = self.kv_b_proj.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_rank)
        w_uk, w_uv = w[:, : self.nope_dim], w[:, self.nope_dim :]  # (H, nope, kv_rank), (H, v, kv_rank)
        rope_scores = q_rope @ k_rope[:, None].transpose(-1, -2)  # one shared key for every head
        if absorb:  # (W_UK^T q) . c: attention runs on the latents
            nope_scores = (q_nope @ w_uk) @ c[:, None].transpose(-1, -2)
        else:
            k_nope = torch.einsum("hdr,btr->bhtd", w_uk, c)
            nope_scores = q_nope @ k_nope.transpose(-1, -2)
        scores = (nope_scores + rope_scores) * self.scale
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        probs = F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1, dtype=torch.float32).to(x.dtype)
        if absorb:  # sum the latents first, expand once per query
            out = (probs @ c[:, None]) @ w_uv.transpose(-1, -2)
        else:
            out = probs @ torch.einsum("hvr,btr->bhtv", w_uv, c)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.n_heads * self.v_dim))


def softmax_mscale(scaling: dict | None) -> float:
    """DeepSeek's factor on the softmax scale is this squared: ``0.1 * mscale_all_dim * ln(factor) + 1`` for a
    scaling dict with ``mscale_all_dim`` (YaRN), 1 otherwise (as ``yarn_apply_mscale`` in ``transformers``)."""
    scaling = check_scaling(scaling)
    if scaling is None or not scaling.get("mscale_all_dim"):
        return 1.0
    return yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])


def latent_attention_from_config(config) -> LatentAttention:
    """:class:`LatentAttention` with the sizes and rope fields of a ``transformers`` DeepSeek-V2/V3 config.

    Needs ``q_lora_rank=None`` (queries projected directly) and a single ``rope_parameters`` dict.
    """
    if getattr(config, "q_lora_rank", None) is not None:
        raise ValueError(f"LatentAttention projects queries directly; the config has q_lora_rank="
                         f"{config.q_lora_rank!r}, give q_lora_rank=None")  # fmt: skip
    params = dict(config.rope_parameters)
    rope_type = params.pop("rope_type", "default")
    base = float(params.pop("rope_theta"))
    return LatentAttention(config.hidden_size, config.num_attention_heads, config.kv_lora_rank, config.qk_nope_head_dim,
                           config.qk_rope_head_dim, config.v_head_dim, base=base,
                           interleaved=bool(getattr(config, "rope_interleave", True)), eps=config.rms_norm_eps,
                           scaling=None if rope_type == "default" else {"rope_type": rope_type, **params})  # fmt: skip


def kv_cache_elements(kind: str, *, layers: int, n_heads: int = 0, head_dim: int = 0, n_kv_heads: int = 0,
                      kv_rank: int = 0, rope_dim: int = 0) -> int:  # fmt: skip
    """Numbers a key/value cache holds per token, over ``layers`` layers.

    ``"mha"``: ``2 n_heads head_dim``; ``"gqa"``: ``2 n_kv_heads head_dim``; ``"mla"``: ``kv_rank + rope_dim``
    (per layer).  Multiply by the bytes per number (2 for bf16) for the memory.
    """
    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; valid kinds: {', '.join(CACHE_KINDS)}")
    layers = check_positive_int("layers", layers)
    if kind == "mha":
        return layers * 2 * check_positive_int("n_heads", n_heads) * check_positive_int("head_dim", head_dim)
    if kind == "gqa":
        return layers * 2 * check_positive_int("n_kv_heads", n_kv_heads) * check_positive_int("head_dim", head_dim)
    return layers * (check_positive_int("kv_rank", kv_rank) + check_even("rope_dim", rope_dim))
