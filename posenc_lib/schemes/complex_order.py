"""Complex-order word embeddings (Wang, Zhao, Lioma, Li, Zhang & Simonsen 2020, "Encoding
Word Order in Complex Embeddings", ICLR 2020, arXiv:1912.12333).

An absolute code makes a word's input a function of the word ``j`` and the position ``t``,
``f(j, t) = x_j + p_t``.  Wang et al. learn that function directly, in the complex plane, one
amplitude, frequency and initial phase per word and dimension:

    f(j, t) = r_j * exp(i * (omega_j * t + theta_j))          (element-wise over the dimensions)

The amplitude ``r_j`` is the word's meaning; the frequency ``omega_j`` says how fast the word's
phase turns with position (how much its order matters).  Moving a word by ``D`` positions
multiplies it by ``exp(i * omega_j * D)``, a linear map that does not depend on ``t``: relative
order is built in, as in RoPE (which rotates queries and keys with fixed frequencies instead).
The cost: three embedding tables instead of one (three times the embedding parameters) and a
complex-valued network downstream.

Taught in notebooks/11_beyond_the_classics.ipynb (section "Two more schemes from the survey").
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks import check_positive_int


class ComplexOrderEmbedding(nn.Module):
    """``(tokens (B, L) int, positions (L,)) -> (B, L, dim)`` complex embeddings ``r e^{i(omega t + theta)}``."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.amplitude = nn.Embedding(check_positive_int("vocab_size", vocab_size), check_positive_int("dim", dim))
        self.frequency = nn.Embedding(vocab_size, dim)
        self.phase = nn.Embedding(vocab_size, dim)
        nn.init.uniform_(self.phase.weight, -torch.pi, torch.pi)
        nn.init.normal_(self.frequency.weight, std=0.1)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, length), got shape {tuple(tokens.shape)}")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        angle = self.frequency(tokens) * positions.to(torch.float32)[None, :, None] + self.phase(tokens)
        return torch.polar(self.amplitude(tokens).abs(), angle)
