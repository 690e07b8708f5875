"""Attention over a padded batch as variable-length sequences, so that a GPU runs its flash kernel without a mask.

A padded call (a source batch in the encoder's self-attention and in cross-attention, a target batch in training)
carries a boolean key padding mask, and SDPA never picks FlashAttention for a call with a mask.  Flash's
variable-length form takes no mask: it takes sequences laid end to end, ``(total, heads, head_dim)``, and their
offsets ``cu_seqlens`` (``[0, n_0, n_0 + n_1, ...]``), and each query sees the keys of its own sequence only.

A right-padded batch is already laid out end to end: row ``b`` of a ``(batch, heads, width, head_dim)`` tensor,
transposed back to ``(batch, width, heads, head_dim)`` (the layout the projections made, so no copy), holds its
``n_b`` tokens and then ``width - n_b`` pads.  Cutting every row into two sequences, its tokens and its pads, gives
``2 * batch`` sequences with offsets computed on the device from the lengths (:func:`row_segments`): nothing is
packed, no length is read back to the host, and every token's query sees exactly its row's tokens:

* self-attention (``q_len == k_len``): the queries are cut as the keys; with ``causal`` each piece is causal on its
  own (a token piece starts at its row's position 0, so the diagonal is the same);
* cross-attention: each row's queries are one piece, against its source's tokens, and the pads' piece has no
  queries.

Each token's output is that of the padded call.  A padding query's is not: the padded call lets it see the row's
tokens and itself (:func:`~posenc_lib.attention.inputs.merge_masks`), here it sees the row's pads.  Nothing reads
those rows (a pad is masked as a key in every later call, and the loss ignores pad targets), so the model's logits,
loss and gradients are the padded path's; tests/test_varlen.py checks that for every scheme this path serves.

Which schemes: those that add nothing to the scores (no ``bias``, ``scores`` or ``values`` hook: none, sinusoidal,
learned, rope, xpos); the others need the scores in hand (their bias can enter FlexAttention's ``score_mod``,
:mod:`posenc_lib.attention.flex`).  Where: a CUDA call in float16 or bfloat16 (flash's dtypes; training under
autocast) with a head size flash takes; any CPU call runs :func:`reference`, the same sequences through SDPA one by
one (for tests: it is slower than the padded call).  Off by default: ``tune(varlen=True)``
(:class:`~posenc_lib.attention.backends.AttentionTuning`).  The padding must sit at the end of each row (the
course's batches are built so): on CPU a call whose mask has a pad before a token keeps the padded path; on a GPU,
where reading the mask would stall the device, the condition is asserted on the device.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

#: flash's dtypes and the largest head size it takes (a multiple of 8)
FLASH_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MAX_HEAD_DIM = 256


@functools.lru_cache(maxsize=None)
def flash_device(index: int) -> bool:
    """Whether CUDA device ``index`` runs flash attention (compute capability 8.0 or later, flash built in)."""
    available = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)()
    return bool(available) and torch.cuda.get_device_capability(index) >= (8, 0)


def right_padded(key_padding_mask: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: every row of ``key_padding_mask (batch, len)`` (True at padding) has its pads after all its
    tokens (computed where the mask lives; nothing is read back)."""
    m = key_padding_mask
    return (m[:, 1:] >= m[:, :-1]).all() if m.shape[1] > 1 else torch.ones((), dtype=torch.bool, device=m.device)


def supported(q: torch.Tensor, k: torch.Tensor, key_padding_mask: torch.Tensor) -> bool:
    """Whether :func:`attend` runs this call: CUDA with flash's dtype and head size, or any float call on CPU whose
    mask is right padding (read there, where reading costs nothing; never on the GPU)."""
    if q.device.type == "cuda":
        d = q.shape[-1]
        return (q.dtype in FLASH_DTYPES and k.dtype == q.dtype and d % 8 == 0 and d <= FLASH_MAX_HEAD_DIM
                and torch.backends.cuda.flash_sdp_enabled() and flash_device(q.device.index or 0))  # fmt: skip
    if q.device.type != "cpu" or not q.dtype.is_floating_point or torch.compiler.is_compiling():
        return False
    return bool(right_padded(key_padding_mask))


def row_segments(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """``cu_seqlens`` (int32, ``2 * batch + 1``) of rows of ``width`` entries cut into their first ``lengths[b]``
    entries and the rest: ``[0, n_0, width, width + n_1, 2 width, ..., batch * width]``."""
    starts = torch.arange(lengths.shape[0], device=lengths.device, dtype=torch.int32) * width
    ends = starts.new_full((1,), lengths.shape[0] * width)
    return torch.cat((torch.stack((starts, starts + lengths.to(torch.int32)), 1).flatten(), ends))


def reference(q, k, v, cu_q: torch.Tensor, cu_k: torch.Tensor, *, causal: bool, scale: float, p_drop: float = 0.0):
    """What flash's variable-length kernel computes, on any device, one sequence at a time: ``q (total_q, heads,
    head_dim)``, ``k, v (total_k, heads, head_dim)``, sequence ``i`` the rows ``cu[i]:cu[i + 1]``; a sequence with
    queries and no keys gives zeros (as the kernel does)."""
    pieces = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for a, b, c, d in zip(cq, cq[1:], ck, ck[1:]):
        if b == a:
            continue
        if d == c:
            pieces.append(q.new_zeros(b - a, q.shape[1], v.shape[2]))
            continue
        out = F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[c:d].transpose(0, 1), v[c:d].transpose(0, 1),
                                             dropout_p=p_drop, is_causal=causal, scale=scale)  # fmt: skip
        pieces.append(out.transpose(0, 1))
    return torch.cat(pieces) if pieces else q.new_zeros(q.shape[0], q.shape[1], v.shape[2])


def flash(q, k, v, cu_q, cu_k, max_q: int, max_k: int, *, causal: bool, scale: float, p_drop: float = 0.0):
    """Flash's variable-length kernel (CUDA), with its gradient and dropout (the operator that SDPA's nested-tensor
    path calls; :func:`reference` is its function)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, p_drop, causal, False,
                                                   scale=scale)[0]  # fmt: skip


def attend(q, k, v, key_padding_mask: torch.Tensor, *, self_attention: bool, causal: bool, scale: float,
           p_drop: float = 0.0) -> torch.Tensor:
    """The attention output ``(batch, heads, q_len, head_dim)`` of a padded call, its pads as sequences of their own
    (see the module's notes); ``key_padding_mask (batch, k_len)``: True at padding, at the end of each row."""
    b, h, q_len, d = q.shape
    k_len = k.shape[2]
    lengths = (~key_padding_mask).sum(1, dtype=torch.int32)
    cu_k = row_segments(lengths, k_len)
    cu_q = cu_k if self_attention else row_segments(torch.full_like(lengths, q_len), q_len)
    flat = lambda t: t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])  # noqa: E731 (a view where t is split())
    if q.device.type == "cuda":
        torch._assert_async(right_padded(key_padding_mask))  # a pad before a token would join the wrong sequence
        out = flash(flat(q), flat(k), flat(v), cu_q, cu_k, q_len, k_len, causal=causal, scale=scale, p_drop=p_drop)
    else:
        out = reference(flat(q), flat(k), flat(v), cu_q, cu_k, causal=causal, scale=scale, p_drop=p_drop)
    return out.view(b, q_len, h, v.shape[3]).transpose(1, 2)
