"""Attention for the score-modifying schemes through FlexAttention (``torch.nn.attention.flex_attention``).

FlexAttention computes ``softmax(scale * q k^T + mods) v`` in one fused kernel (once compiled with
``torch.compile``, on a GPU), where the modification is a function ``score_mod(score, b, h, i, j)``
of one score and its indices.  Every position scheme of this course that changes scores fits:

* a bias-only scheme (T5, ALiBi): ``score + bias[h, i, j]`` (the bias the scheme already builds);
* a scheme whose class registered its own form (:func:`register`; Shaw, DeBERTa and Transformer-XL in
  :mod:`posenc_lib.kernels.flex_forms`): a few small scaled products indexed per score;
* any other scheme with score terms only (CoPE, whose positions are sums over a row of gates):
  ``score + scale * terms[b, h, i, j]`` from its written-out terms (no memory saved).

Padding and the causal mask are applied inside ``score_mod`` (``-inf``), and, where they let a
whole block be skipped, as a block mask (``create_block_mask``).

A value term (Shaw's ``sum_j p_ij w^V[index[i, j]]``) is not a score modification; a scheme with one registers
a ``value_term`` that rebuilds it from the kernel's row log-sum-exp.  Shaw's needs the
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

from .by_class import for_class

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


def call(q, k, v, score_mod, block_mask, scale, return_lse):
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


#: FlexAttention forms registered by scheme class (:func:`register`): ``score_mod(scheme, q, k, prep, layer, attn, scale)
#: -> (b, h, i, j) -> extra`` and ``value_term(scheme, q, k, v, prep, layer, scale, score_mod, block, allowed, lse)``
SCORE_MODS: dict[type, object] = {}
VALUE_TERMS: dict[type, object] = {}


def register(scheme_class: type, *, score_mod=None, value_term=None) -> None:
    """Give ``scheme_class`` (and its subclasses that keep its terms) its FlexAttention form: a ``score_mod`` for its score terms and,
    for a scheme with a value term, the ``value_term`` that rebuilds it from the kernel's row log-sum-exp."""
    if not isinstance(scheme_class, type):
        raise TypeError(f"scheme_class must be a class, got {type(scheme_class).__name__}")
    if score_mod is not None:
        SCORE_MODS[scheme_class] = score_mod
    if value_term is not None:
        VALUE_TERMS[scheme_class] = value_term


def scheme_score_mod(scheme, q, k, prep, layer, attn, scale):
    """``(b, h, i, j) -> extra`` (already scaled) for ``scheme``'s score terms and bias, or ``None``: the form registered
    for its class, else its bias (a bias-only scheme) or its written-out score terms (a score-only scheme)."""
    own = for_class(SCORE_MODS, scheme)
    if own is not None:
        return own(scheme, q, k, prep, layer, attn, scale)
    b_, h_, lq, _ = q.shape
    lk = k.shape[2]
    if scheme.adds_bias and not scheme.adds_scores:
        bias = scheme.bias(prep, layer)
        if bias is None:
            return None
        bias = bias.expand(bias.shape[0], h_, lq, lk)
        per_batch = bias.shape[0] > 1
        return lambda b, h, i, j: bias[b if per_batch else 0, h, i, j].to(torch.float32)
    if scheme.adds_scores and not (scheme.adds_bias or scheme.adds_values):
        # any other score scheme (CoPE, whose positions depend on a whole row of gates): its written-out
        # terms, indexed (no saving over the explicit path, but the same kernel call)
        extra = scheme.scores(q, k, prep, layer, attn).float() * scale
        return lambda b, h, i, j: extra[b if extra.shape[0] > 1 else 0, h, i, j]
    registered = ", ".join(sorted(c.__name__ for c in SCORE_MODS)) or "none"
    raise ValueError(
        f"no FlexAttention form for scheme {type(scheme).__name__} ({getattr(scheme, 'name', None)!r}); valid choices: "
        f"a registered class ({registered}), a bias-only scheme, or a scheme with score terms only"
    )


def flex_attend(scheme, q, k, v, prep, layer, attn, scale, allowed):
    """Attention output ``(B, H, Lq, dh)`` through FlexAttention; equal to the explicit path."""
    lq, lk = q.shape[2], k.shape[2]
    extra = scheme_score_mod(scheme, q, k, prep, layer, attn, scale)
    masked, block = _mask_parts(allowed, lq, lk, q.device)

    def score_mod(s, b, h, i, j):
        if extra is not None:
            s = s + extra(b, h, i, j)
        return masked(s, b, h, i, j)

    if not scheme.adds_values:
        return call(q, k, v, score_mod, block, scale, False)
    value_term = for_class(VALUE_TERMS, scheme)
    if value_term is None:
        raise ValueError(f"no FlexAttention value term for scheme {type(scheme).__name__}; register one with "
                         "flex.register(scheme_class, value_term=...)")
    out, lse = call(q, k, v, score_mod, block, scale, True)
    return out + value_term(scheme, q, k, v, prep, layer, scale, score_mod, block, allowed, lse)
