"""A small decoder-only (causal) language model whose positions come from any course scheme.

Pre-norm blocks of causal self-attention (the course's one :class:`~posenc_lib.attention.layer.MultiHeadAttention`)
and a feed-forward layer, with a tied output layer.  The scheme is any name of the registry
(:func:`~posenc_lib.schemes.registry.make_scheme` with ``causal=True``) and can be swapped on a trained model
(:meth:`CausalLM.set_scheme`), which is how a RoPE model is read with another ``scaling``.

Used by the long-context experiment (posenc_lib/experiments/long_context.py, taught in
notebooks/14_long_context.ipynb), by the decoder-only runs of the length-extrapolation experiment
(notebooks/13_length_extrapolation.ipynb) and by lesson 10's ALiBi comparison.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention.layer import MultiHeadAttention, on_host
from ..schemes.registry import make_scheme
from ..utils import check_positive_int, check_token_tensor


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention, then a feed-forward layer."""

    def __init__(self, d_model: int, n_heads: int, dim_feedforward: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads)
        self.ff = nn.Sequential(nn.Linear(d_model, dim_feedforward), nn.GELU(), nn.Linear(dim_feedforward, d_model))

    def forward(self, x, pos, ctx, layer, need_weights=False):
        a = self.attn(self.norm1(x), causal=True, pos=pos, ctx=ctx, layer=layer, need_weights=need_weights)
        a, w = a if need_weights else (a, None)
        x = x + a
        return x + self.ff(self.norm2(x)), w


class CausalLM(nn.Module):
    """A small decoder-only language model whose positions come from any course scheme.

    ``pe`` and ``options`` go to :func:`~posenc_lib.schemes.registry.make_scheme` with ``causal=True``;
    :meth:`set_scheme` swaps the scheme of a trained model (RoPE schemes hold no weights), which is
    how a RoPE model is read with a different ``scaling``.
    """

    def __init__(self, vocab_size: int, pe: str, *, d_model: int, n_heads: int, num_layers: int,
                 dim_feedforward: int, **options):  # fmt: skip
        super().__init__()
        for name, v in (("vocab_size", vocab_size), ("num_layers", num_layers), ("dim_feedforward", dim_feedforward)):
            check_positive_int(name, v)
        self.dims = (d_model, n_heads, num_layers)
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)  # tied output: logits start near 0
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dim_feedforward) for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.set_scheme(pe, **options)

    def set_scheme(self, pe: str, **options) -> None:
        self.pos = make_scheme(pe, *self.dims, causal=True, **options)

    def forward(self, tokens: torch.Tensor, need_weights: bool = False):
        """``tokens (batch, T)`` -> logits ``(batch, T, vocab)`` (and per-layer attention weights)."""
        check_token_tensor("tokens", tokens)
        vocab = self.embed.num_embeddings
        if on_host(tokens) and tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
            bad = int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())
            raise ValueError(f"tokens holds id {bad} outside the vocabulary: vocab_size={vocab}, valid ids 0..{vocab - 1}")
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) * math.sqrt(self.dims[0])
        code = self.pos.embed(positions)
        if code is not None:
            x = x + code
        ctx = self.pos.prepare(positions, positions)
        weights = []
        for i, block in enumerate(self.blocks):
            x, w = block(x, self.pos, ctx, i, need_weights)
            weights.append(w)
        logits = self.norm(x) @ self.embed.weight.t()
        return (logits, weights) if need_weights else logits

    def loss(self, windows: torch.Tensor) -> torch.Tensor:
        """Mean next-character cross-entropy (nats) of ``windows (batch, T + 1)``."""
        if windows.dim() != 2 or windows.shape[0] < 1 or windows.shape[1] < 2:
            raise ValueError(
                f"windows must be (batch >= 1, T + 1 >= 2) token ids, got shape {tuple(windows.shape)}: "
                "with no window or no next character the mean loss is undefined"
            )
        logits = self(windows[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
