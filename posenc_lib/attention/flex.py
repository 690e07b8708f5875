"""Attention for the score-modifying schemes through FlexAttention (``torch.nn.attention.flex_attention``).

FlexAttention computes ``softmax(scale * q k^T + mods) v`` in one fused kernel (once compiled with
``torch.compile``, on a GPU), where the modification is a function ``score_mod(score, b, h, i, j)``
of one score and its indices.  Every position scheme of this course that changes scores fits:

* T5 and ALiBi: ``score + bias[h, i, j]`` (the bias the scheme already builds);
* Shaw's key term: ``score + scale * S[b, h, i, index[i, j]]`` with the small ``S = q w^K^T``
  (``(B, H, Lq, 2k+1)``);
* DeBERTa: ``score + scale * (C2P[b, h, i, index[i, j]] + P2C[b, h, j, index[i, j]])``, both
  ``(B, H, L, 2k)``;
* Transformer-XL: ``score + scale * (u . k_j + BD[b, h, i, j + Lq - 1 - i])``, the relative shift
  done as an index inside ``score_mod``;
* any other scheme with score terms only (CoPE, whose positions are sums over a row of gates):
  ``score + scale * terms[b, h, i, j]`` from its written-out terms (no memory saved).

Padding and the causal mask are applied inside ``score_mod`` (``-inf``), and, where they let a
whole block be skipped, as a block mask (``create_block_mask``).

Shaw's value term ``sum_j p_ij w^V[index[i, j]]`` is not a score modification.  It needs the
attention mass per clipped distance, ``M[i, r]``.  The cheapest exact way found here: ask the
kernel for the log-sum-exp of every row (``return_lse=True``); for the inner distances
``|r - k| < k`` each row has at most one key, so ``M[i, r] = exp(s_ij - lse_i)`` from that one
score (2k - 1 dot products per query, not L); the two clipped ends take the rest, one by a
second pass restricted to the keys at distance >= k (its log-sum-exp), the other as what remains
of 1.

On CPU, torch 2.13 has no FlexAttention backward, and without ``torch.compile`` the call runs an
unfused reference (it materialises the scores): there it is for inference and for checking.
:func:`use_flex` says whether the model should take this path: only when ``POSENC_FLEX=1`` is set
and never by default.
"""
from __future__ import annotations

import os
import warnings

import torch

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch
    create_block_mask = flex_attention = None
try:  # torch >= 2.9: the log-sum-exp is asked for with return_aux
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # pragma: no cover
    AuxRequest = None

#: environment switch: ``POSENC_FLEX=1`` sends score-modifying schemes through FlexAttention
ENV = "POSENC_FLEX"
_compiled = None


def available() -> bool:
    return flex_attention is not None


def use_flex() -> bool:
    """True when ``POSENC_FLEX=1`` is set and this torch has FlexAttention (off by default)."""
    return available() and os.environ.get(ENV, "") == "1"


def _kernel(device: torch.device):
    """``flex_attention`` compiled on a GPU; the eager reference on CPU (no compile, no warning)."""
    global _compiled
    if device.type == "cuda":
        if _compiled is None:
            _compiled = torch.compile(flex_attention, dynamic=False)
        return _compiled
    return flex_attention


def _call(q, k, v, score_mod, block_mask, scale, return_lse):
    """The output, and with ``return_lse`` also the row log-sum-exp ``(B, H, Lq)``."""
    kernel = _kernel(q.device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        if not return_lse:
            return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
        if AuxRequest is not None:
            out, aux = kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              return_aux=AuxRequest(lse=True))  # fmt: skip
            return out, aux.lse
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, return_lse=True)


def _mask_parts(allowed: torch.Tensor | None, q_len: int, k_len: int, device):
    """A ``score_mod`` wrapper for the boolean ``allowed`` mask and a block mask that skips blocks."""
    if allowed is None:
        return (lambda s, b, h, i, j: s), None
    a = allowed.expand(allowed.shape[0], 1, q_len, k_len)
    per_batch = a.shape[0] > 1

    def keep(b, h, i, j):
        return a[b if per_batch else 0, 0, i, j]

    def apply(s, b, h, i, j):
        return torch.where(keep(b, h, i, j), s, -float("inf"))

    block = None
    if device.type == "cuda":  # on CPU the reference computes every block anyway
        block = create_block_mask(keep, a.shape[0] if per_batch else None, None, q_len, k_len, device=device)
    return apply, block


def scheme_score_mod(pos, q, k, ctx, layer, attn, scale):
    """``(b, h, i, j) -> extra`` (already scaled) for ``pos``'s score terms and bias, or ``None``."""
    name = getattr(pos, "name", None)
    b_, h_, lq, _ = q.shape
    lk = k.shape[2]
    if name == "shaw":
        s_k = (q @ pos.table_k[layer].to(q.dtype).t()) * scale  # (B, H, Lq, 2k+1)
        index = ctx["index"]
        return lambda b, h, i, j: s_k[b, h, i, index[i, j]]
    if name == "deberta":
        rel = ctx["rel"].to(q.dtype)
        dh = q.shape[-1]
        pos_q = attn.q_proj(rel).view(-1, h_, dh).transpose(0, 1)
        pos_k = attn.k_proj(rel).view(-1, h_, dh).transpose(0, 1)
        c2p, p2c = (q @ pos_k.transpose(-1, -2)) * scale, (k @ pos_q.transpose(-1, -2)) * scale
        index = ctx["index"]
        return lambda b, h, i, j: c2p[b, h, i, index[i, j]] + p2c[b, h, j, index[i, j]]
    if name == "xlnet":
        dh = q.shape[-1]
        r = (ctx["R"].to(q.dtype) @ pos.r_proj[layer].to(q.dtype)).view(-1, h_, dh).transpose(0, 1)
        cb = torch.einsum("hd,bhjd->bhj", pos.u[layer].to(q.dtype), k) * scale  # (B, H, Lk)
        bd = ((q + pos.v[layer].to(q.dtype)[None, :, None, :]) @ r.transpose(-1, -2)) * scale  # (B, H, Lq, P)
        return lambda b, h, i, j: cb[b, h, j] + bd[b, h, i, j + lq - 1 - i]
    if pos.adds_bias and not pos.adds_scores:
        bias = pos.bias(ctx, layer)
        if bias is None:
            return None
        bias = bias.expand(bias.shape[0], h_, lq, lk)
        per_batch = bias.shape[0] > 1
        return lambda b, h, i, j: bias[b if per_batch else 0, h, i, j].to(torch.float32)
    if pos.adds_scores and not (pos.adds_bias or pos.adds_values):
        # any other score scheme (CoPE, whose positions depend on a whole row of gates): its written-out
        # terms, indexed (no saving over the explicit path, but the same kernel call)
        extra = pos.scores(q, k, ctx, layer, attn).float() * scale
        return lambda b, h, i, j: extra[b if extra.shape[0] > 1 else 0, h, i, j]
    raise ValueError(
        f"no FlexAttention form for scheme {name!r}; valid choices: shaw, deberta, xlnet, a bias-only scheme, "
        "or a scheme with score terms only"
    )


def flex_attend(pos, q, k, v, ctx, layer, attn, scale, allowed):
    """Attention output ``(B, H, Lq, dh)`` through FlexAttention; equal to the explicit path."""
    lq, lk = q.shape[2], k.shape[2]
    extra = scheme_score_mod(pos, q, k, ctx, layer, attn, scale)
    masked, block = _mask_parts(allowed, lq, lk, q.device)

    def score_mod(s, b, h, i, j):
        if extra is not None:
            s = s + extra(b, h, i, j)
        return masked(s, b, h, i, j)

    if not pos.adds_values:
        return _call(q, k, v, score_mod, block, scale, False)
    out, lse = _call(q, k, v, score_mod, block, scale, True)
    return out + _shaw_value_term(pos, q, k, ctx, layer, scale, score_mod, block, allowed, lse, v)


def _shaw_value_term(pos, q, k, ctx, layer, scale, score_mod, block, allowed, lse, v):
    """``sum_r M[i, r] w^V_r`` from the row log-sum-exp (see the module docstring)."""
    plan = ctx["plan"]
    rows = plan.rows
    if not plan.fast:
        raise ValueError("the FlexAttention Shaw value term needs an index that hits each inner distance "
                         "at most once per query (distinct key positions, as the model's aranges)")
    b_, h_, lq, _ = q.shape
    table_k = pos.table_k[layer].to(q.dtype)
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
    index = ctx["index"]
    last = rows - 1

    def right_only(s, b, h, i, j):  # keys at the clipped right end only
        return torch.where(index[i, j] == last, score_mod(s, b, h, i, j), -float("inf"))

    _, lse_right = _call(q, k, v, right_only, block, scale, True)
    m_right = torch.exp(lse_right.float() - lse)
    m_right = torch.where(torch.isfinite(lse_right), m_right, torch.zeros_like(m_right))
    m_left = (1.0 - inner.sum(-1) - m_right).clamp(min=0.0)
    mass = torch.cat((m_left[..., None], inner, m_right[..., None]), -1)  # (B, H, Lq, 2k+1)
    return (mass @ pos.table_v[layer].float()).to(q.dtype)
