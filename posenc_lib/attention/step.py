"""Cached decoding steps of one query per sequence, float32 on CPU, no gradient: what a step needs of attention and
no more.

* :func:`append_to_cache`: a decoder self-attention layer's keys and values, kept in buffers that grow by doubling;
* :func:`self_attention_step`: a causal self-attention step without padding: its queries, keys and values (in one
  product inside a decoding loop, :func:`~posenc_lib.models.decoding.packed_weights`), the scheme's rotation,
  the cache, and the attention itself through :func:`~posenc_lib.attention.backends.dense`, the computation
  :meth:`~posenc_lib.attention.layer.MultiHeadAttention.forward` reaches for such a call, without the choices on the
  way (blocks, masks, fused training paths) that a step of one query never takes;
* :func:`cross_attention`: the cross-attention step as two batched products against keys transposed once;
* :func:`distance_table`: what a scheme keeps per distance ``0, 1, ...`` between steps (T5's bias, DeBERTa's buckets,
  XLNet's projected distances).

Used by :class:`~posenc_lib.attention.layer.MultiHeadAttention` during
:func:`~posenc_lib.models.decoding.greedy_decode` and beam search; tested against the full forward pass in
tests/test_decoding_state.py.
"""
from __future__ import annotations

import math

import torch

from .backends import dense


def cached_len(cache: dict) -> int:
    """How many keys a self-attention layer's ``cache`` holds (its buffers', or keys handed in as ``"k"``)."""
    return cache.get("len", cache["k"].shape[2] if "k" in cache else 0)


def distance_table(state: dict, key, k_len: int, build, device) -> torch.Tensor:
    """``state[key]``, a table with one row per distance ``0, 1, ...`` kept in a decoding cache's ``state``, with at
    least ``k_len`` rows: made by ``build(distances)`` when missing or too short, for the cache's capacity when it is
    known, else for twice the distances a step needs (at least 32), so that later steps read it without growing it."""
    table = state.get(key)
    if table is None or table.shape[0] < k_len:
        n = max(2 * k_len, 32, state.get("capacity") or 0)
        table = state[key] = build(torch.arange(n, device=device))
    return table


def takes_self_step(attn, x: torch.Tensor, key_padding_mask, scheme, cache: dict, block_elements) -> bool:
    """A causal self-attention call that :func:`self_attention_step` computes as ``forward`` would: one query per
    sequence, float32 on CPU, no gradient, no padding, a position scheme, and scores within ``block_elements``
    (:attr:`~posenc_lib.attention.backends.AttentionTuning.block_elements`; a longer call is split into blocks)."""
    if x.shape[1] != 1 or key_padding_mask is not None or scheme is None or torch.is_grad_enabled():
        return False
    if x.dtype != torch.float32 or x.device.type != "cpu":
        return False
    k_len = cached_len(cache) + 1
    return block_elements is None or x.shape[0] * attn.n_heads * k_len <= block_elements


def self_attention_step(attn, x: torch.Tensor, scheme, prep: dict, layer: int, cache: dict, path) -> torch.Tensor:
    """``attn(x, causal=True, scheme=scheme, prep=prep, layer=layer, cache=cache)`` for a call :func:`takes_self_step`
    accepts; ``path``: the call's :func:`~posenc_lib.attention.layer.choose_attention_path` (one query needs no mask)."""
    b = x.shape[0]
    qkv = attn.step_qkv(x) if attn.step_qkv is not None else None
    if qkv is not None:
        q, k, v = (attn.split(t) for t in qkv.chunk(3, dim=-1))
    else:
        q, k, v = attn.split(attn.q_proj(x)), attn.split(attn.k_proj(x)), attn.split(attn.v_proj(x))
    q, k = scheme.rotate(q, k, prep, layer)
    k, v = append_to_cache(cache, k, v)
    scale = 1.0 / math.sqrt(attn.head_dim * scheme.score_terms)
    out, _ = dense(q, k, v, None, scheme.bias(prep, layer), prep, scheme, layer, attn, path, scale, 0.0)
    return attn.out_proj(out.transpose(1, 2).reshape(b, 1, attn.d_model))


def cross_step(q: torch.Tensor) -> bool:
    """A cross-attention call of one query per sequence against cached keys, float32 on CPU, no gradient: it takes
    :func:`cross_attention`."""
    return q.shape[2] == 1 and q.dtype == torch.float32 and q.device.type == "cpu" and not torch.is_grad_enabled()


def cross_attention(q: torch.Tensor, cache: dict, key_padding_mask: torch.Tensor | None, scale: float):
    """Cross-attention of one query row per sequence, ``q: (batch, heads, 1, head_dim)``, to the memory's keys and
    values in ``cache`` as two batched products: ``softmax(scale * q K^T + pad) V``.

    At the first step the cache gains the keys transposed, ``"k_t": (batch, heads, head_dim, src_len)``, the values
    contiguous, and, for a padded source, an additive ``-inf`` at its pads; later steps read them (all batch-first,
    so :meth:`~posenc_lib.models.seq2seq.DecoderCache.reorder` keeps their rows).  The memory and its padding are
    those of the first step, as for the cached keys themselves.  On this CPU the fused kernel took about 1.6x as long
    for this shape inside a decoding step (batch 8, 8 heads, 64 source tokens: benchmarks/README.md, "Cached decoding").  A row
    whose every key is padding gets zeros, as the fused kernel gives it."""
    if "k_t" not in cache:
        k, v = cache["k"], cache["v"]
        cache["k_t"], cache["v_c"] = k.transpose(-1, -2).contiguous(), v.contiguous()
        if key_padding_mask is not None:
            pads = key_padding_mask.bool()[:, None, None, :].expand(-1, k.shape[1], 1, -1)
            cache["pad_bias"] = torch.zeros(pads.shape, dtype=q.dtype, device=q.device).masked_fill_(pads, float("-inf"))
    k_t, v_c, pad = cache["k_t"], cache["v_c"], cache.get("pad_bias")
    b, h, _, d = q.shape
    n = k_t.shape[-1]  # source length (sizes written out: a batch may be empty)
    s = torch.bmm(q.reshape(b * h, 1, d), k_t.view(b * h, d, n)).mul_(scale)
    if pad is not None:
        s.add_(pad.view(b * h, 1, n))
    p = torch.softmax(s, dim=-1)
    if pad is not None:
        p = p.nan_to_num_(0.0)  # a row with nothing to see: zeros
    return torch.bmm(p, v_c.view(b * h, n, d)).view(b, h, 1, d)


def append_to_cache(cache: dict, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the new keys/values into the layer's preallocated buffers; return all keys/values so far.

    The buffers (``k_buf``, ``v_buf``: ``(batch, heads, capacity, head_dim)``) double when full, so a
    decoding step copies only its own row, not every earlier key (as growing by ``torch.cat`` would).
    Earlier keys/values handed in as ``cache["k"]``, ``cache["v"]`` are taken over as the buffers' start.
    ``cache["capacity"]`` (set by :class:`~posenc_lib.models.seq2seq.DecoderCache` when the length is known):
    the buffers are made at least that long.
    """
    if "k" in cache and "k_buf" not in cache:  # keys/values handed in as plain tensors: adopt them
        cache["k_buf"], cache["v_buf"] = cache.pop("k"), cache.pop("v")
        cache["len"] = cache["k_buf"].shape[2]
    n, new = cache.get("len", 0), k.shape[2]
    buf = cache.get("k_buf")
    if buf is None or n + new > buf.shape[2] or buf.shape[:2] != k.shape[:2] or buf.dtype != k.dtype:
        cap = max(2 * (n + new), 16, cache.get("capacity", 0))
        k_buf = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
        v_buf = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
        if n:
            k_buf[:, :, :n] = cache["k_buf"][:, :, :n]
            v_buf[:, :, :n] = cache["v_buf"][:, :, :n]
        cache["k_buf"], cache["v_buf"] = k_buf, v_buf
    cache["k_buf"][:, :, n : n + new] = k
    cache["v_buf"][:, :, n : n + new] = v
    cache["len"] = n + new
    return cache["k_buf"][:, :, : n + new], cache["v_buf"][:, :, : n + new]
