"""CoPE, contextual position encoding (Golovneva, Wang, Weston & Sukhbaatar 2024, "Contextual Position
Encoding: Learning to Count What's Important", arXiv:2405.18719).

Every other scheme of the course counts *tokens*: the position of key ``j`` seen from query ``i`` is
``i - j`` whatever the tokens are.  CoPE lets the query decide what to count.  A gate says, for every
key between ``j`` and ``i``, whether it counts, and the position is the number of keys that do:

    g_ik = sigmoid(q_i . k_k / sqrt(d))                  (1 = "count this token")
    p_ij = sum_{k = j}^{i} g_ik                            (a reverse cumulative sum over the keys)
    score_ij = q_i . k_j / sqrt(d) + q_i . e[p_ij]

``p_ij`` is fractional, so the position embedding is interpolated between the two integer positions
around it, ``e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]``; as in the paper this is
computed on the products ``z_i[n] = q_i . e[n]`` (one per integer position, not per pair), and ``p`` is
clipped at ``max_pos - 1``.  If the gates fire only on, say, full stops, ``p_ij`` counts *sentences*
back from the query; if they fire everywhere it counts tokens (``p_ij = i - j + 1``) and CoPE is a
learned relative embedding.  A query can count words, sentences or a particular symbol, which no fixed
relative scheme can express.

The embeddings ``e`` (``max_pos`` rows of ``head_dim``) are per layer and shared by the heads, and start
at zero, as in the paper's code; the gates use the layer's own scaled scores.  ``max_pos`` defaults to
64 here (``x-transformers``' ``cope_max_pos`` defaults to 16; the paper sets ``npos_max`` per task).

**Causal** in the paper: the sum runs over the keys a causal query sees.  **Bidirectional form** (the
library's, not the paper's): keys right of the query get a count of their own, ``sum_{k = i}^{j} g_ik``,
read from a second table of ``max_pos`` embeddings, so left and right stay apart.  Padding keys are not
known to the gates: right padding (what the models use) never lies between a real query and a real key,
but left padding would be counted.  Keys must be in position order (the models' aranges are).

CoPE is a content-dependent score term (like DeBERTa's and XLNet's), so attention runs the explicit
softmax, or on CPU at long lengths the fused kernel with the term as a float mask rebuilt from
``q``, ``k`` and the table in the backward pass (:func:`~posenc_lib.attention.cpu_flash.flash_scores`);
long inputs run over query blocks.  A cached decoding step computes one row of gates against the cached
keys.  Checked against ``x-transformers``' CoPE (``attn_use_cope``) in tests/test_survey_positions.py.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..attention.layer import PositionScheme
from .registry import register_scheme
from ..checks import check_positive_int


def cope_positions(q, k, q_pos, k_pos, scale: float, causal: bool = True) -> torch.Tensor:
    """``(B, H, Lq, Lk)`` float32 contextual positions ``p_ij = sum_{k=j}^{i} sigmoid(q_i . k_k * scale)``.

    ``q: (B, H, Lq, d)``, ``k: (B, H, Lk, d)``, ``q_pos (Lq,)``, ``k_pos (Lk,)`` ascending.  Keys after the
    query count 0 (causal), or, with ``causal=False``, ``sum_{k=i}^{j}`` (the library's bidirectional form).
    For reading and plots; :func:`cope_term` computes them again inside its own forward pass.
    """
    gates = torch.sigmoid((q @ k.transpose(-1, -2)).float() * scale)
    left = k_pos[None, :] <= q_pos[:, None]
    pos = gates.masked_fill(~left, 0.0).flip(-1).cumsum(-1).flip(-1)
    if not causal:
        right = gates.masked_fill(~(k_pos[None, :] >= q_pos[:, None]), 0.0).cumsum(-1)
        pos = torch.where(left, pos, right)
    return pos


def cope_term(q, k, table, q_pos, k_pos, scale: float, max_pos: int, causal: bool = True) -> torch.Tensor:
    """CoPE's score term ``q_i . e[p_ij]`` (interpolated), ``(B, H, Lq, Lk)`` (float32, or float64 for float64
    inputs), to add to the scaled scores.

    ``table: (max_pos, d)`` embeddings (``(2 * max_pos, d)`` with ``causal=False``: left counts, then right).
    The interpolation is written ``z[n] + w (z[n + 1] - z[n])`` with ``n = floor(p)``, ``w = p - n`` (the paper's
    ``w z[ceil p] + (1 - w) z[floor p]``, one index instead of two), and the gradient is written out
    (:class:`_CopeTerm`): the backward pass of a reverse cumulative sum is a plain cumulative sum.
    """
    left = k_pos[None, :] <= q_pos[:, None]
    ahead = None if causal else k_pos[None, :] >= q_pos[:, None]
    return _CopeTerm.apply(q, k, table.to(q.dtype), left, ahead, scale, max_pos)


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{m >= j} x[..., m]``."""
    return x.flip(-1).cumsum(-1).flip(-1)


class _CopeTerm(torch.autograd.Function):
    """CoPE's term with a written-out backward pass: it keeps the gates, the interpolation weights, the
    floor index and the slopes ``z[n + 1] - z[n]`` at it (four ``(B, H, Lq, Lk)`` tensors) instead of every
    intermediate of autograd's version, and needs no flip for the causal gates' gradient."""

    @staticmethod
    def forward(ctx, q, k, table, left, ahead, scale, max_pos):
        # left: keys at or before the query (the paper's sum); ahead: keys at or after it (bidirectional only)
        acc = torch.promote_types(q.dtype, torch.float32)  # float32 for bf16/fp16 inputs, float64 stays
        g = torch.matmul(q, k.transpose(-1, -2)).to(acc).mul_(scale).sigmoid_()  # (B, H, Lq, Lk) gates
        if ahead is None:
            g.masked_fill_(~left, 0.0)
            pos = _reverse_cumsum(g)
        else:
            pos = torch.where(left, _reverse_cumsum(g.masked_fill(~left, 0.0)), g.masked_fill(~ahead, 0.0).cumsum(-1))
        floor = pos.clamp_(max=max_pos - 1).floor()
        w = pos.sub_(floor)  # in place: pos is not needed again
        index = floor.long()
        if ahead is not None:  # keys after the query read the second half of the table
            index.add_((~left).long() * max_pos)
        z = torch.matmul(q, table.t()).to(acc)  # (B, H, Lq, rows): z_i[n] = q_i . e[n]
        zh = z.unflatten(-1, (-1, max_pos))
        slope = torch.zeros_like(zh)
        slope[..., :-1] = zh[..., 1:] - zh[..., :-1]  # 0 at the last row of each half (the clipped end)
        slope = slope.flatten(-2)
        at = slope.gather(-1, index)
        ctx.save_for_backward(q, k, table, left, ahead if ahead is not None else left, g, w, index, at)
        ctx.scale, ctx.max_pos, ctx.bidirectional = scale, max_pos, ahead is not None
        return z.gather(-1, index).addcmul_(w, at)

    @staticmethod
    def backward(ctx, grad):
        q, k, table, left, ahead, g, w, index, at = ctx.saved_tensors
        grad = grad.to(g.dtype)
        dpos = grad * at  # dT/dp = z[n + 1] - z[n] (0 where p was clipped)
        if not ctx.bidirectional:
            dgate = dpos.cumsum(-1)  # p_ij = sum_{m >= j} g_im  =>  dg_im = sum_{j <= m} dp_ij
        else:
            dgate = dpos.masked_fill(~left, 0.0).cumsum(-1).masked_fill_(~left, 0.0)
            dgate += _reverse_cumsum(dpos.masked_fill(left, 0.0)).masked_fill_(~ahead, 0.0)
        ds = dgate.mul_(g).mul_(1 - g).mul_(ctx.scale)  # through the sigmoid (0 at masked gates: g = 0)
        ds = ds.to(q.dtype)
        dq, dk = ds @ k, ds.transpose(-1, -2) @ q
        rows = table.shape[0]
        dz = grad.new_zeros(*grad.shape[:-1], rows)
        dz.scatter_add_(-1, index, grad)  # T = z[n] + w (z[n + 1] - z[n])
        dslope = torch.zeros_like(dz).scatter_add_(-1, index, grad * w)
        dslope = dslope.unflatten(-1, (-1, ctx.max_pos))
        dzh = dz.unflatten(-1, (-1, ctx.max_pos))
        dzh[..., 1:] += dslope[..., :-1]
        dzh[..., :-1] -= dslope[..., :-1]
        dz = dz.to(q.dtype)
        dq = dq + dz @ table
        dtable = dz.reshape(-1, rows).t() @ q.reshape(-1, q.shape[-1])
        return dq, dk, dtable, None, None, None, None


@register_scheme(kind="contextual", group="survey", year=2024, arxiv="2405.18719",
                 paper="Golovneva et al. 2024, Contextual Position Encoding: Learning to Count What's Important (CoPE)")
class CoPE(PositionScheme):
    """Per layer a table of ``max_pos`` position embeddings (``2 * max_pos`` in a bidirectional stack)."""

    name = "cope"
    enters = "scores"

    def __init__(self, d_model, n_heads, num_layers, causal=False, max_pos: int = 64):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.max_pos = check_positive_int("max_pos", max_pos)
        rows = max_pos if causal else 2 * max_pos
        self.pos_emb = nn.Parameter(torch.zeros(num_layers, rows, self.head_dim))
        #: the attention's scale (as MultiHeadAttention computes it), which the gates share
        self.gate_scale = 1.0 / math.sqrt(self.head_dim * self.score_terms)

    def query_slice(self, prep, start, end):
        return {**prep, "q_pos": prep["q_pos"][start:end]}

    def key_slice(self, prep, k_end):
        # a causal block's keys after its last query have gate 0 for every row: dropping them changes no count
        return {**prep, "k_pos": prep["k_pos"][:k_end]}

    def scores(self, q, k, prep, layer, attn):
        return self.scores_from_parts(q, k, self.score_parts(q, prep, layer, attn), prep)

    def score_parts(self, q, prep, layer, attn):
        """What the score term is built from (besides ``q`` and ``k``): this layer's position embeddings."""
        return (self.pos_emb[layer],)

    def scores_from_parts(self, q, k, parts, prep, scale: float = 1.0):
        """The term in the attention's unscaled units (it is multiplied by the attention's scale later),
        times ``scale``: with ``scale`` = the attention's scale this is the paper's term itself."""
        (table,) = parts
        term = cope_term(q, k, table, prep["q_pos"], prep["k_pos"], self.gate_scale, self.max_pos, self.causal)
        return term.mul_(scale / self.gate_scale) if scale != self.gate_scale else term

    def extra_repr(self):
        form = "" if self.causal else " (bidirectional: left and right counts, not the paper's)"
        return f"causal={self.causal}{form}, max_pos={self.max_pos}"
