"""Beam search with a key/value cache and a GNMT length penalty.

Keeps the ``beam`` best partial translations per sentence by total log
probability; after every step the decoder cache is reordered so each surviving
hypothesis keeps its own keys and values (``DecoderCache.reorder``).  Finished
hypotheses stay in the beam with their score frozen.  At the end the winner
maximises ``log p(y | x) / lp(y)`` with the length penalty of Wu et al. 2016
(Google's Neural Machine Translation System, arXiv:1609.08144)::

    lp(y) = ((5 + |y|) / 6) ** alpha

``alpha = 0`` picks the most probable hypothesis; larger values favour longer
ones.  With ``beam=1`` the result equals greedy decoding.  Used by
``python -m posenc_lib.wmt14 --beam 4``; greedy decoding is in decoding.py.
"""
from __future__ import annotations

import torch

from .model import Seq2SeqTransformer
from .utils import check_positive_int, check_token_tensor


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int,
    beam: int = 4,
    alpha: float = 0.6,
    src_key_padding_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
) -> torch.Tensor:
    """Decode ``src (B, S)``; returns the best hypothesis per row, ``(B, <= max_new_tokens + 1)``, BOS first."""
    check_token_tensor("src", src)
    k = check_positive_int("beam", beam)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    pad_id = model.pad_id if pad_id is None else pad_id
    was_training = model.training
    model.eval()
    try:
        b, dev = src.shape[0], src.device
        rep = torch.arange(b, device=dev).repeat_interleave(k)
        mask = src_key_padding_mask[rep] if src_key_padding_mask is not None else None
        memory = model.encode(src, src_key_padding_mask)[rep]  # (B*k, S, d)
        scores = torch.full((b, k), float("-inf"), device=dev)
        scores[:, 0] = 0.0  # all beams start identical: keep only one alive
        ys = torch.full((b * k, 1), bos_id, dtype=torch.long, device=dev)
        lengths = torch.zeros(b * k, device=dev)
        done = torch.zeros(b * k, dtype=torch.bool, device=dev)
        cache = model.new_cache()
        for _ in range(max_new_tokens):
            logits = model.decode(ys[:, -1:], memory, memory_key_padding_mask=mask, cache=cache)
            logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B*k, V)
            v = logp.shape[-1]
            logp[done] = float("-inf")
            logp[done, pad_id] = 0.0  # a finished hypothesis only extends with free padding
            cand = (scores.reshape(-1, 1) + logp).reshape(b, k * v)
            scores, idx = cand.topk(k, dim=-1)
            parent = (torch.arange(b, device=dev)[:, None] * k + idx // v).reshape(-1)
            tok = (idx % v).reshape(-1)
            ys = torch.cat((ys[parent], tok[:, None]), dim=1)
            lengths = lengths[parent] + (~done[parent]).float()
            done = done[parent] | (tok == eos_id)
            cache.reorder(parent)
            if bool(done.all()):
                break
        penalty = ((5.0 + lengths) / 6.0) ** alpha
        best = (scores.reshape(-1) / penalty).reshape(b, k).argmax(-1)
        return ys[torch.arange(b, device=dev) * k + best]
    finally:
        model.train(was_training)
