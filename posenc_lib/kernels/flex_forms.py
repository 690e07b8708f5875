"""FlexAttention forms of the schemes whose score terms are built from small tables (see
:mod:`posenc_lib.attention.flex`): each ``score_mod`` reads a few scaled products indexed per score, never the whole
``(B, H, Lq, Lk)`` terms.

* Shaw: ``scale * S[b, h, i, index[i, j]]`` with ``S = q w^K^T`` ``(B, H, Lq, 2k+1)``, and its value term from the
  kernel's row log-sum-exp (:func:`shaw_value_term`);
* DeBERTa: ``scale * (C2P[b, h, i, index[i, j]] + P2C[b, h, j, index[i, j]])``, both ``(B, H, L, 2k)``;
* Transformer-XL: ``scale * (u . k_j + BD[b, h, i, j + Lq - 1 - i])``, the relative shift done as an index.
"""
from __future__ import annotations

import torch

from ..attention import flex
from ..schemes.deberta import DebertaDisentangled
from ..schemes.shaw import ShawRelative
from ..schemes.xlnet import XLNetRelative


def shaw_score_mod(scheme, q, k, prep, layer, attn, scale):
    s_k = (q @ scheme.table_k[layer].to(q.dtype).t()) * scale  # (B, H, Lq, 2k+1)
    index = prep["index"]
    return lambda b, h, i, j: s_k[b, h, i, index[i, j]]


def deberta_score_mod(scheme, q, k, prep, layer, attn, scale):
    h_, dh = q.shape[1], q.shape[-1]
    rel = prep["rel"].to(q.dtype)
    pos_q = attn.q_proj(rel).view(-1, h_, dh).transpose(0, 1)
    pos_k = attn.k_proj(rel).view(-1, h_, dh).transpose(0, 1)
    c2p, p2c = (q @ pos_k.transpose(-1, -2)) * scale, (k @ pos_q.transpose(-1, -2)) * scale
    index = prep["index"]
    return lambda b, h, i, j: c2p[b, h, i, index[i, j]] + p2c[b, h, j, index[i, j]]


def xlnet_score_mod(scheme, q, k, prep, layer, attn, scale):
    h_, lq, dh = q.shape[1], q.shape[2], q.shape[-1]
    r = (prep["R"].to(q.dtype) @ scheme.r_proj[layer].to(q.dtype)).view(-1, h_, dh).transpose(0, 1)
    cb = torch.einsum("hd,bhjd->bhj", scheme.u[layer].to(q.dtype), k) * scale  # (B, H, Lk)
    bd = ((q + scheme.v[layer].to(q.dtype)[None, :, None, :]) @ r.transpose(-1, -2)) * scale  # (B, H, Lq, P)
    return lambda b, h, i, j: cb[b, h, j] + bd[b, h, i, j + lq - 1 - i]


def shaw_value_term(scheme, q, k, v, prep, layer, scale, score_mod, block, allowed, lse):
    """``sum_r M[i, r] w^V_r`` from the row log-sum-exp (see :mod:`posenc_lib.attention.flex`)."""
    plan = prep["plan"]
    rows = plan.rows
    if not plan.fast:
        raise ValueError("the FlexAttention Shaw value term needs an index that hits each inner distance "
                         "at most once per query (distinct key positions, as the model's aranges)")
    b_, h_, lq, _ = q.shape
    table_k = scheme.table_k[layer].to(q.dtype)
    lse = lse.float()
    inner = []
    for r in range(1, rows - 1):  # at most one key per row: the key at distance r - k
        j = plan.band_j[:, r - 1]  # (Lq,) clamped to a valid key
        kj = k[:, :, j]  # (B, H, Lq, dh)
        s = ((q * (kj + table_k[r])).sum(-1) * scale).float()
        ok = plan.band_ok[:, r - 1].bool()[None, None]
        if allowed is not None:
            a = allowed.expand(allowed.shape[0], 1, lq, allowed.shape[-1])
            ok = ok & a[:, :, torch.arange(lq, device=q.device), j]
        inner.append(torch.where(ok, torch.exp(s - lse), torch.zeros_like(s)))
    inner = torch.stack(inner, -1) if inner else lse.new_zeros(b_, h_, lq, 0)
    index = prep["index"]
    last = rows - 1

    def right_only(s, b, h, i, j):  # keys at the clipped right end only
        return torch.where(index[i, j] == last, score_mod(s, b, h, i, j), -float("inf"))

    _, lse_right = flex.call(q, k, v, right_only, block, scale, True)
    m_right = torch.exp(lse_right.float() - lse)
    m_right = torch.where(torch.isfinite(lse_right), m_right, torch.zeros_like(m_right))
    m_left = (1.0 - inner.sum(-1) - m_right).clamp(min=0.0)
    mass = torch.cat((m_left[..., None], inner, m_right[..., None]), -1)  # (B, H, Lq, 2k+1)
    return (mass @ scheme.table_v[layer].float()).to(q.dtype)


flex.register(ShawRelative, score_mod=shaw_score_mod, value_term=shaw_value_term)
flex.register(DebertaDisentangled, score_mod=deberta_score_mod)
flex.register(XLNetRelative, score_mod=xlnet_score_mod)
