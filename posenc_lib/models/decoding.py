"""Greedy decoding with a key/value cache (and without, for comparison).

With ``use_cache=True`` each step feeds only the newest token: every decoder
layer appends its key and value to a cache (RoPE keys rotated once, at their
own absolute position) and the position scheme builds its bias or relative
indices for the one new query row against all cached keys.  With
``use_cache=False`` the whole prefix is re-run at every step, as the seed
report did; both must give identical tokens.

Stopping early once every row has finished needs one read from the device.
On CPU that read is free and happens after every step; on an accelerator it
happens every :data:`SYNC_EVERY` steps, so the device is not stalled at each
token, and the extra columns (padding only) are cut off at the end, so the
result is the same either way.

Taught in notebooks/06_rope.ipynb (the cache) and used by notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import numbers

import torch

from .seq2seq import Seq2SeqTransformer
from ..utils import check_positive_int, check_token_tensor

#: on an accelerator, decoding loops check "has every row finished?" once per this many steps
SYNC_EVERY = 8


def check_token_id(name: str, value, vocab_size: int) -> int:
    """``value`` if it is a token id of a vocabulary of ``vocab_size``, i.e. an int in ``[0, vocab_size)``.

    A non-integer is a ``TypeError``, an id outside the vocabulary a ``ValueError``; both name
    the argument, the value and the valid range.
    """
    allowed = f"an integer in [0, {vocab_size - 1}]"
    detail = f"a token id in [0, vocab_size) with vocab_size={vocab_size}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__}): {detail}")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be {allowed}, got {value!r}: {detail}")
    return int(value)


def sync_every(device: torch.device) -> int:
    """Steps between reads of the "all finished" flag: 1 on CPU (free), :data:`SYNC_EVERY` elsewhere."""
    return 1 if device.type == "cpu" else SYNC_EVERY


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    use_cache: bool = True,
    src_key_padding_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
) -> torch.Tensor:
    """Decode ``src (B, S)`` greedily; returns ``(B, <= max_new_tokens + 1)`` ids starting with ``bos_id``.

    Rows that produced ``eos_id`` are filled with ``pad_id`` (default: the
    model's) afterwards; decoding stops early once every row has finished.
    ``eos_id=None``: no token ends a row, exactly ``max_new_tokens`` are decoded.
    ``bos_id``, ``eos_id`` and ``pad_id`` must be token ids of the model, in ``[0, vocab_size)``.
    """
    check_token_tensor("src", src)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    check_token_id("bos_id", bos_id, model.vocab_size)
    if eos_id is not None:  # None: no end token, always decode max_new_tokens (benchmarks)
        check_token_id("eos_id", eos_id, model.vocab_size)
    pad_id = model.pad_id if pad_id is None else check_token_id("pad_id", pad_id, model.vocab_size)
    was_training = model.training
    model.eval()
    try:
        memory = model.encode(src, src_key_padding_mask)
        b = src.shape[0]
        ys = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(b, dtype=torch.bool, device=src.device)
        # columns needed: 1 + the step at which the last row finished (kept on the device)
        width = torch.full((), max_new_tokens + 1, dtype=torch.long, device=src.device)
        every = sync_every(src.device)
        cache = model.new_cache() if use_cache else None
        for step in range(max_new_tokens):
            inp = ys[:, -1:] if use_cache else ys
            logits = model.decode(inp, memory, memory_key_padding_mask=src_key_padding_mask, cache=cache)
            nxt = logits[:, -1].argmax(-1).masked_fill(done, pad_id)
            ys = torch.cat((ys, nxt[:, None]), dim=1)
            if eos_id is not None:
                done |= nxt == eos_id
            width = torch.where(done.all() & (width > step + 2), step + 2, width)
            if (step + 1) % every == 0 and bool(done.all()):
                break
        if ys.shape[1] > 1 and every > 1:
            ys = ys[:, : int(width)]  # one read, after the loop
        return ys
    finally:
        model.train(was_training)
