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

Taught in notebooks/15_rope_in_llms.ipynb (section 4).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .rotary import apply_rope_cos_sin, rope_cos_sin
from ..checks import check_even, check_positive_int

__all__ = ["LatentAttention", "kv_cache_elements", "CACHE_KINDS"]

#: the attention kinds :func:`kv_cache_elements` sizes
CACHE_KINDS = ("mha", "gqa", "mla")


class LatentAttention(nn.Module):
    """Causal multi-head latent attention with a decoupled rotary key (DeepSeek-V2/V3, ``q_lora_rank=None``).

    ``d_model``: model width; ``n_heads``; ``kv_rank``: the cached latent's size; ``nope_dim``: each head's
    position-free query/key part; ``rope_dim``: each head's rotary query part and the shared rotary key
    (even); ``v_dim``: each head's value size.  ``forward(x (batch, T, d_model), absorb=False)`` returns
    ``(batch, T, d_model)``; ``absorb=True`` computes the same attention against the latents, with
    ``W_UK`` folded into the queries and ``W_UV`` applied after the weighted sum.
    """

    def __init__(self, d_model: int, n_heads: int, kv_rank: int, nope_dim: int, rope_dim: int, v_dim: int,
                 base: float = 10000.0, interleaved: bool = True, eps: float = 1e-6):  # fmt: skip
        super().__init__()
        for name, v in (("d_model", d_model), ("n_heads", n_heads), ("kv_rank", kv_rank), ("nope_dim", nope_dim),
                        ("v_dim", v_dim)):  # fmt: skip
            check_positive_int(name, v)
        self.n_heads, self.kv_rank, self.nope_dim, self.v_dim = n_heads, kv_rank, nope_dim, v_dim
        self.rope_dim = check_even("rope_dim", rope_dim)
        self.base, self.interleaved = base, interleaved
        self.q_proj = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)
        self.kv_a_proj = nn.Linear(d_model, kv_rank + rope_dim, bias=False)  # W_DKV and W_KR side by side
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps)
        self.kv_b_proj = nn.Linear(kv_rank, n_heads * (nope_dim + v_dim), bias=False)  # W_UK and W_UV per head
        self.o_proj = nn.Linear(n_heads * v_dim, d_model, bias=False)
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim)

    def cache_elements_per_token(self) -> int:
        """Numbers cached per token (this layer): the latent and the shared rotary key."""
        return self.kv_rank + self.rope_dim

    def latents(self, x: torch.Tensor, positions: torch.Tensor):
        """What a cache would hold: ``c (batch, T, kv_rank)`` and the rotated shared key ``k_rope (batch, T, rope_dim)``."""
        c, k_rope = self.kv_a_proj(x).split((self.kv_rank, self.rope_dim), dim=-1)
        cos, sin = rope_cos_sin(positions, self.rope_dim, self.base, self.interleaved)
        return self.kv_norm(c), apply_rope_cos_sin(k_rope, cos, sin, self.interleaved)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, absorb: bool = False) -> torch.Tensor:
        b, t, _ = x.shape
        positions = torch.arange(t, device=x.device) if positions is None else positions
        q = self.q_proj(x).view(b, t, self.n_heads, -1).transpose(1, 2)  # (b, H, T, nope + rope)
        q_nope, q_rope = q.split((self.nope_dim, self.rope_dim), dim=-1)
        cos, sin = rope_cos_sin(positions, self.rope_dim, self.base, self.interleaved)
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
