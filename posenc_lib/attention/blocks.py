"""Pieces of an attention call that runs in parts: rows of a mask for a block of queries, the last key a block may
see, and chunks of batch rows.  Shared by the backends (:mod:`posenc_lib.attention.backends`), the scheme kernels
(:mod:`posenc_lib.kernels`) and Shaw's fused path."""
from __future__ import annotations

import torch


def mask_rows(t: torch.Tensor | None, start: int, end: int) -> torch.Tensor | None:
    """Query rows ``start:end`` of a mask or bias broadcastable to ``(..., q_len, k_len)``."""
    if t is None or t.dim() < 2 or t.shape[-2] == 1:
        return t
    return t[..., start:end, :]


def last_key(allowed: torch.Tensor | None, k_len: int) -> int:
    """One past the last key that any row of the boolean ``allowed (..., rows, k_len)`` may see
    (``k_len`` when nothing is masked); read on the host, for the CPU path only."""
    if allowed is None or allowed.shape[-1] != k_len:
        return k_len
    seen = allowed.reshape(-1, k_len).any(0).nonzero()
    return int(seen[-1]) + 1 if seen.numel() else k_len


def block_keys(allowed: torch.Tensor | None, start: int, end: int, k_len: int):
    """``(rows, n)``: the boolean mask of query rows ``start:end`` for keys ``0:n`` and ``n``, one past the
    last key any of those rows may see (a causal block needs no key after its last query)."""
    rows = mask_rows(allowed, start, end)
    n = last_key(rows, k_len)
    return (rows if n == k_len else rows[..., :n]), n


def in_batch_chunks(fn, chunk: int, *args):
    """``fn(*args)`` over chunks of ``chunk`` batch rows, joined; the first argument has the whole batch ``b``.  Each
    argument is a tensor of batch ``b`` (sliced), of batch 1 or ``None`` (passed as it is), or a list of those."""
    b = args[0].shape[0]
    if chunk >= b:
        return fn(*args)
    cut = lambda t, c0, c1: t if t is None or t.shape[0] == 1 else t[c0:c1]  # noqa: E731
    outs = []
    for c0 in range(0, b, chunk):
        c1 = min(c0 + chunk, b)
        outs.append(fn(*([cut(t, c0, c1) for t in a] if isinstance(a, list) else cut(a, c0, c1) for a in args)))
    return torch.cat(outs)
