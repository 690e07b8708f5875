"""Beam search with a key/value cache and the GNMT length penalty.

Keeps the ``beam`` best *unfinished* translations per sentence, ranked by
total log probability.  At every step each of them is extended by every token;
of all ``beam x vocab`` candidates of a sentence:

* an end-of-sentence candidate that ranks among the ``beam`` best *finishes*:
  it leaves the beam for the sentence's finished hypotheses, scored by its
  length-normalised log probability ``log p(y | x) / lp(|y|)``;
* the ``beam`` best candidates that do not end the sentence refill the beam.

After every step the decoder cache is reordered so each surviving hypothesis
keeps its own keys and values (``DecoderCache.reorder``).  The length penalty
is the one of Wu et al. 2016 (Google's Neural Machine Translation System,
arXiv:1609.08144), applied whenever finished hypotheses are compared::

    lp(y) = ((5 + |y|) / 6) ** alpha,   |y| = generated tokens, end-of-sentence included

``alpha = 0`` picks the most probable hypothesis; larger values favour longer
ones.  A hypothesis still unfinished after ``max_new_tokens`` tokens competes
with the finished ones on the same normalised score.

A sentence stops once no unfinished hypothesis can beat its best finished one:
log probabilities only fall as a hypothesis grows, so with ``alpha >= 0`` an
unfinished hypothesis of score ``s`` can at best reach ``s / lp(max_new_tokens)``.
That bound is exact, so stopping never changes the result: with a beam as wide
as every possible hypothesis (``vocab ** max_new_tokens``) beam search returns
the exhaustive-search optimum, and ``beam=1, alpha=0`` is greedy decoding.
Reading the "all stopped" flag from an accelerator stalls it, so there the
check runs every few steps (see :func:`~posenc_lib.models.decoding.sync_every`).

Used by ``python -m posenc_lib.experiments.wmt14 --beam 4``; greedy decoding is in decoding.py.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from . import decoding
from .seq2seq import Seq2SeqTransformer
from ..checks import check_float_range, check_padding_mask, check_positive_int, check_token_tensor


def length_penalty(length: torch.Tensor | float, alpha: float) -> torch.Tensor | float:
    """GNMT ``((5 + length) / 6) ** alpha``; ``length`` (generated tokens) and ``alpha`` finite numbers >= 0."""
    _check_alpha(alpha)
    if not isinstance(length, torch.Tensor):  # a tensor's values are not read (no device sync)
        check_float_range("length", length, 0.0)
    return ((5.0 + length) / 6.0) ** alpha


def _check_budgets(budgets, batch: int, max_new_tokens: int) -> list[int] | None:
    """``budgets`` as a list of ``batch`` ints in ``[1, max_new_tokens]``, or None."""
    if budgets is None:
        return None
    if isinstance(budgets, (str, bytes, torch.Tensor)) or not isinstance(budgets, Sequence):
        raise TypeError(f"budgets must be a list of ints (new tokens per row) or None, got {type(budgets).__name__}")
    if len(budgets) != batch:
        raise ValueError(f"budgets must hold one int per row of src ({batch}), got {len(budgets)}")
    for i, n in enumerate(budgets):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"budgets[{i}] must be an int in [1, max_new_tokens={max_new_tokens}], got {n!r}")
        if not 1 <= n <= max_new_tokens:
            raise ValueError(f"budgets[{i}] must be an int in [1, max_new_tokens={max_new_tokens}], got {n}")
    return [int(n) for n in budgets]


def _check_alpha(alpha) -> None:
    """The length penalty exponent: a finite number >= 0 (0 picks the most probable hypothesis)."""
    message = f"alpha (the length penalty exponent) must be a finite number >= 0, got {alpha!r}"
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(message)
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(message)


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    beam: int = 4,
    alpha: float = 0.6,
    src_key_padding_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
    budgets: Sequence[int] | None = None,
) -> torch.Tensor:
    """Decode ``src (B, S)``; returns the best hypothesis per row, ``(B, <= max_new_tokens + 1)``.

    Each row starts with ``bos_id``, ends with ``eos_id`` if the hypothesis finished, and is
    right-padded with ``pad_id`` (default: the model's); all three are token ids in ``[0, vocab_size)``.
    As in :func:`~posenc_lib.models.decoding.greedy_decode`, ``eos_id=None`` means no token ends a
    hypothesis (exactly ``max_new_tokens`` are decoded), and an empty batch ``(0, S)`` gives ``(0, 1)``.
    ``budgets``: each row's own ``max_new_tokens`` (ints in ``[1, max_new_tokens]``, one per row): a row ends at its
    budget, its unfinished hypotheses competing then, exactly as a search of that budget would (rows of different
    budgets share one batch).
    """
    decoding.check_model(model)
    check_token_tensor("src", src)
    k = check_positive_int("beam", beam)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    _check_alpha(alpha)
    check_padding_mask("src_key_padding_mask", src_key_padding_mask, *src.shape)  # before it is indexed below
    bos_id = decoding.check_token_id("bos_id", bos_id, model.vocab_size)  # the same checks and words as greedy
    if eos_id is not None:  # None: no end token, every hypothesis runs max_new_tokens (as greedy_decode)
        eos_id = decoding.check_token_id("eos_id", eos_id, model.vocab_size)
    pad_id = model.pad_id if pad_id is None else decoding.check_token_id("pad_id", pad_id, model.vocab_size)
    budgets = _check_budgets(budgets, src.shape[0], max_new_tokens)
    if budgets is not None and len(set(budgets)) == 1:  # one budget for every row: the search of that budget
        max_new_tokens, budgets = budgets[0], None
    if src.shape[0] == 0:  # nothing to decode (greedy_decode returns as quickly)
        return torch.full((0, 1), bos_id, dtype=torch.long, device=src.device)
    was_training = model.training
    model.eval()
    try:
        b, dev = src.shape[0], src.device
        rows = torch.arange(b, device=dev)
        rep = rows.repeat_interleave(k)
        mask = src_key_padding_mask[rep] if src_key_padding_mask is not None else None
        memory = model.encode(src, src_key_padding_mask)[rep]  # (B*k, S, d)
        width = max_new_tokens + 1
        # live hypotheses: total log probability (B, k); all start identical, so keep one alive
        live = torch.full((b, k), float("-inf"), device=dev)
        live[:, 0] = 0.0
        ys = torch.full((b * k, 1), bos_id, dtype=torch.long, device=dev)
        # best finished hypothesis per sentence: normalised score and tokens (pad-filled)
        best = torch.full((b,), float("-inf"), device=dev)
        best_ys = torch.full((b, width), pad_id, dtype=torch.long, device=dev)
        best_ys[:, 0] = bos_id
        best_len = torch.ones(b, dtype=torch.long, device=dev)  # columns used, BOS included
        stopped = torch.zeros(b, dtype=torch.bool, device=dev)
        lp_max = length_penalty(float(max_new_tokens), alpha)
        ends_at = None
        if budgets is not None:  # rows of different budgets: each its own bound and end
            ends_at = torch.tensor(budgets, device=dev)
            lp_max = torch.tensor([length_penalty(float(n), alpha) for n in budgets], device=dev)
        every = decoding.sync_every(dev)
        cache = model.new_cache()
        for step in range(max_new_tokens):
            n = step + 1  # generated tokens after this step
            logits = model.decode(ys[:, -1:], memory, memory_key_padding_mask=mask, cache=cache)
            logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (B*k, V)
            v = logp.shape[-1]
            cand = (live.reshape(-1, 1) + logp).reshape(b, k * v)
            # 1. end-of-sentence candidates among the k best finish, normalised by lp(n)
            top_score, top_idx = cand.topk(k, dim=-1)
            ends = (top_idx % v == (-1 if eos_id is None else eos_id)) & torch.isfinite(top_score)
            fin = torch.where(ends, top_score / length_penalty(float(n), alpha), float("-inf"))
            fin_best, fin_at = fin.max(-1)
            parent = rows * k + top_idx.gather(-1, fin_at[:, None])[:, 0] // v
            better = (fin_best > best) & ~stopped
            hyp = torch.cat((ys[parent], torch.full((b, 1), 0 if eos_id is None else eos_id, dtype=torch.long,
                                                    device=dev)), dim=1)
            best = torch.where(better, fin_best, best)
            best_ys[:, : n + 1] = torch.where(better[:, None], hyp, best_ys[:, : n + 1])
            best_len = torch.where(better, n + 1, best_len)
            # 2. the k best candidates that do not end the sentence refill the beam
            if eos_id is not None:
                cand[:, eos_id::v] = float("-inf")
            live, idx = cand.topk(k, dim=-1)
            parent = (rows[:, None] * k + idx // v).reshape(-1)
            ys = torch.cat((ys[parent], (idx % v).reshape(-1, 1)), dim=1)
            cache.reorder(parent)
            # 3. a sentence stops when no live hypothesis can beat its best finished one
            bound = live.max(-1).values / lp_max
            stopped |= best >= bound
            live = live.masked_fill(stopped[:, None], float("-inf"))
            if ends_at is not None:  # 4. a sentence at its budget: its unfinished hypotheses compete, and it stops
                last = ends_at == n
                score, at = (live / lp_max[:, None]).max(-1)
                better = (score > best) & ~stopped & last
                best_ys[:, : n + 1] = torch.where(better[:, None], ys.view(b, k, -1)[rows, at], best_ys[:, : n + 1])
                best_len = torch.where(better, n + 1, best_len)
                stopped |= last
                live = live.masked_fill(stopped[:, None], float("-inf"))
            if (step + 1) % every == 0 and bool(stopped.all()):
                break
        else:
            # hypotheses still unfinished after max_new_tokens compete on the same footing
            score, at = (live / (lp_max if ends_at is None else lp_max[:, None])).max(-1)
            better = (score > best) & ~stopped
            best_ys = torch.where(better[:, None], ys.view(b, k, -1)[rows, at], best_ys)
            best_len = torch.where(better, width, best_len)
        return best_ys[:, : int(best_len.max())]  # one read, after the loop
    finally:
        model.train(was_training)
