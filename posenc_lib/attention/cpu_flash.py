"""Fused CPU attention whose additive score term gets a gradient.

PyTorch's fused CPU kernel (``scaled_dot_product_attention``'s flash path) accepts a float
``attn_mask`` that is added to the scaled scores, but treats it as a constant: a mask that needs a
gradient (T5's learned bias; the content-dependent score terms of Shaw, Transformer-XL and DeBERTa,
passed in as a mask) sends SDPA to its math path, which writes out every score and weight and keeps
them for the backward pass.  :func:`flash_attention` keeps the fused kernel for the forward pass and
for the gradients of ``q``, ``k`` and ``v``, and adds the one gradient the kernel does not give:

    dM = dS = P * (dP - D),   P = exp(q k^T * scale + M - lse),   dP = dO v^T,   D = rowsum(dO * O)

(the softmax backward, with the kernel's row log-sum-exp ``lse`` standing in for the stored
weights).  It is computed over blocks of query rows in two reusable buffers, so memory holds one
block of scores, never all of them.  Two matrix products give both terms of each block with no
extra pass: ``[q * scale, -lse] @ [k, 1]^T = q k^T * scale - lse`` and
``[dO, -D] @ [v, 1]^T = dP - D``.  Where the mask is shared over the batch (a bias), its gradient
is summed over the batch block by block.

Since ``P`` and ``dS`` are built anyway, the backward pass takes the other gradients from them too
(:func:`attention_backward`): ``dv = P^T dO``, ``dq = dS k * scale``, ``dk = dS^T q * scale``, five matrix
products per block in all, where the kernel's own backward pass would rebuild ``P`` and ``dS`` a second
time (:data:`WRITTEN_BACKWARD`).

Where every query block's mask is laid out from the same small tensors (one value per offset: T5's learned
bias, ALiBi's fixed one), :func:`flash_blocks` runs all blocks of a call in one autograd node and builds each
block's mask when it is needed, in the forward pass and again in the backward pass, so no whole mask is ever
written.  A call that sees every key (T5's encoder, from batch 2) runs on the whole mask, laid out once for a
stack, and :func:`flash_whole_offsets` sums its gradient per offset block by block, so no whole gradient of it is
written.

Only for float32 CPU tensors without dropout (:func:`supported`); the attention module falls back to
its explicit path otherwise.  On a GPU the same job is FlexAttention's (see ``flex.py``).

Every kernel call here runs with denormal floats flushed to zero (:func:`flush_denormals`): a weight
``exp(s - max)`` between ``exp(-104)`` and ``exp(-87)`` is a denormal number, and x86 cores take tens of
times longer for arithmetic on those.  ALiBi's bias ``-m |i - j|`` sends distant keys through that range
(at slope 1/8 the keys 700 to 830 places away), which made one fused call at L = 1024 (8 heads, forward
and backward, 2 threads) take 169 ms against 58 ms with flushing, and 62 ms with a random mask of the same
shape.  Flushing changes only values below ``1.2e-38``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
from pathlib import Path

import torch

from ..utils import diagonal_sums, fill_closed_

#: query rows per block are chosen so that one block of scores holds at most this many elements
WORKSPACE_ELEMENTS = 2**24


def supported(q: torch.Tensor, dropout_p: float) -> bool:
    """True when :func:`flash_attention` can run: a float32 CPU tensor, no dropout, no autocast."""
    return (
        q.device.type == "cpu" and q.dtype == torch.float32 and dropout_p == 0.0
        and not torch.is_autocast_enabled("cpu") and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")
    )  # fmt: skip


def flushing() -> bool:
    """Whether this thread flushes denormal floats to zero now (``torch`` has no getter: a denormal product tells)."""
    return bool((torch.tensor([2.0**-120], dtype=torch.float32) * 2.0**-10).item() == 0.0)


# The mode is a register of each thread.  ``torch.set_flush_denormal`` sets the calling thread's only, and
# torch's OpenMP workers (which do half the work on 2 cores) keep the mode they were started with.  So the
# mode is also set inside one OpenMP parallel region of the library torch loaded: its team is the pool of
# workers torch's own operators use (measured: benchmarks/README.md).
_UNSET = object()
_GOMP_PARALLEL = _UNSET
_TEAM_MODE = [False]


def gomp_parallel():
    """``GOMP_parallel`` of the OpenMP library in torch's wheel (the one its operators use), or None."""
    global _GOMP_PARALLEL
    if _GOMP_PARALLEL is _UNSET:
        _GOMP_PARALLEL = None
        if "parallel backend: OpenMP" in torch.__config__.parallel_info():
            for path in sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*")):
                try:
                    fn = ctypes.CDLL(str(path)).GOMP_parallel
                except (OSError, AttributeError):
                    continue
                fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint], None
                _GOMP_PARALLEL = fn
                break
    return _GOMP_PARALLEL


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _set_in_this_thread(_data):
    torch.set_flush_denormal(_TEAM_MODE[0])


def _set_mode(on: bool) -> bool:
    """Set the mode in this thread and in torch's OpenMP workers; False where the CPU has no such mode."""
    if not torch.set_flush_denormal(on):
        return False
    threads, parallel = torch.get_num_threads(), gomp_parallel()
    if threads > 1 and parallel is not None:
        _TEAM_MODE[0] = on
        parallel(ctypes.cast(_set_in_this_thread, ctypes.c_void_p), None, threads, 0)
    return True


@contextlib.contextmanager
def flush_denormals():
    """Flush denormal floats to zero inside the block, in this thread and in torch's OpenMP workers; after it,
    the mode this thread had before, everywhere."""
    before = flushing()
    if not _set_mode(True):  # a CPU without the mode
        yield
        return
    try:
        yield
    finally:
        if not before:
            _set_mode(False)


def _flushed(fn):
    """``fn`` run under :func:`flush_denormals` (the forward and backward passes of the functions below)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with flush_denormals():
            return fn(*args, **kwargs)

    return run


def _aug(x: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """``x (..., n, d)`` with ``col (..., n)`` appended as column ``d``."""
    return torch.cat([x, col.unsqueeze(-1).to(x.dtype)], dim=-1)


def mask_gradient(q, k, v, mask, dout, out, lse, scale: float, buffers=None) -> torch.Tensor:
    """``dL/dmask`` of attention with the additive float ``mask``, reduced to ``mask``'s shape.

    ``buffers``: two flat work buffers of at least ``batch * heads * q_len * k_len`` elements to use
    instead of new ones (a caller that runs many blocks allocates them once).
    """
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    ones = k.new_ones(k.shape[:-1])
    d_row = (dout * out).sum(-1)  # D = rowsum(dO * O)
    qa, ka_t = _aug(q * scale, -lse), _aug(k, ones).transpose(-1, -2).contiguous()
    da, va_t = _aug(dout, -d_row), _aug(v, ones).transpose(-1, -2).contiguous()
    rows = max(1, min(q_len, WORKSPACE_ELEMENTS // max(1, b * h * k_len)))
    reduce_dims = [i for i in (0, 1) if mask.shape[i] == 1 and (b, h)[i] > 1]  # a mask shared over batch/heads
    dmask = mask.new_empty(mask.shape)
    if buffers is not None:
        rows = q_len
        ds_buf, p_buf = (_view(f, b, h, rows, k_len) for f in buffers)
    else:
        ds_buf = q.new_empty(b, h, rows, k_len)
        p_buf = q.new_empty(b, h, rows, k_len) if reduce_dims else None  # else P is built in dmask itself
    for start in range(0, q_len, rows):
        end = min(start + rows, q_len)
        p = p_buf[:, :, : end - start] if reduce_dims else dmask[:, :, start:end]
        ds = ds_buf[:, :, : end - start]
        torch.matmul(qa[:, :, start:end], ka_t, out=p)  # q k^T * scale - lse
        p.add_(mask[:, :, start:end]).exp_()  # the attention weights P
        torch.matmul(da[:, :, start:end], va_t, out=ds)  # dP - D
        if reduce_dims:
            dmask[:, :, start:end] = ds.mul_(p).sum(dim=reduce_dims, keepdim=True)
        else:
            p.mul_(ds)  # dS, in place of P in dmask
    return dmask


#: The backward pass of a call whose mask needs a gradient: ``True`` writes it out block by block from the
#: weights rebuilt once (``P``, ``dS = P * (dP - D)``, then ``dq``, ``dk``, ``dv`` and the mask's gradient
#: from them: five matrix products), ``False`` runs the kernel's own backward pass and then
#: :func:`mask_gradient` (the kernel rebuilds ``P`` and ``dS`` inside, and the mask's gradient rebuilds them again).
WRITTEN_BACKWARD: bool = True


#: :func:`attention_backward` builds the weights ``P`` and ``dS`` of at most this many query rows at a time (fewer
#: where :data:`WORKSPACE_ELEMENTS` asks), so that they stay in cache between the five products that read them
#: (measured: benchmarks/README.md).  ``None``: no limit but the workspace.
BACKWARD_BLOCK_ROWS: int | None = 256


def _backward_rows(row_elements: int, q_len: int) -> int:
    """Query rows per block of :func:`attention_backward` for rows of ``row_elements`` scores each."""
    rows = min(q_len, WORKSPACE_ELEMENTS // max(1, row_elements))
    return max(1, rows if BACKWARD_BLOCK_ROWS is None else min(rows, BACKWARD_BLOCK_ROWS))


def augmented_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with a column of ones appended, transposed ``(b, h, d + 1, k_len)``: the right-hand sides of
    :func:`attention_backward`'s two products that rebuild ``P`` and ``dP - D`` (a caller that runs many blocks
    against the same keys makes them once and passes column slices)."""
    ones = k.new_ones(k.shape[:-1])
    return _aug(k, ones).transpose(-1, -2).contiguous(), _aug(v, ones).transpose(-1, -2).contiguous()


def attention_backward(q, k, v, mask, dout, out, lse, scale: float, want_mask: bool = True, buffers=None,
                       mask_rows=None, keys=None, into=None):  # fmt: skip
    """``dq, dk, dv`` and ``dL/dmask`` (reduced to ``mask``'s shape; ``None`` unless ``want_mask``) of
    ``softmax(q k^T * scale + mask) v``, written out over blocks of query rows from the kernel's ``out``
    and row log-sum-exp ``lse``: each block's weights and ``dS`` are built once and serve all four gradients.

    ``buffers``: as for :func:`mask_gradient`, and a third, if given, holds the mask's gradient (returned as a view of
    it, valid until the buffer is used again).  ``mask_rows``: instead of writing the whole gradient of the mask,
    hand each block's rows of it to ``mask_rows(start, end, grad)`` (``grad`` reduced to the mask's batch and head
    sizes, valid only during the call) and return ``None`` for it.  ``keys``: :func:`augmented_keys` of ``k`` and
    ``v``, made by the caller.  ``into``: ``(dk_t, dv_t)``, ``(b * h, d, k_len)`` tensors to which the gradients of
    ``k`` and ``v`` are added, transposed (returned as ``None``); without it they are returned as transposed views.
    The keys' and values' gradients are accumulated transposed, ``dv^T += dO^T P``: one product with the long side
    as its columns, added in place (a block of 128 rows against 2048 keys, batch 2, 8 heads, 2 threads: 6.9 ms
    against 9.3 ms for ``dv += P^T dO``)."""
    b, h, q_len, d = q.shape
    k_len, dv_len = k.shape[2], v.shape[-1]
    qs = q * scale
    ka_t, va_t = augmented_keys(k, v) if keys is None else keys
    qa, da = _aug(qs, -lse), _aug(dout, -(dout * out).sum(-1))
    rows = _backward_rows(b * h * k_len, q_len)
    reduce_dims = [i for i in (0, 1) if mask.shape[i] == 1 and (b, h)[i] > 1]
    if buffers is not None:
        ds_buf, p_buf = (_view(f, b, h, rows, k_len) for f in buffers[:2])
    else:
        ds_buf, p_buf = q.new_empty(b, h, rows, k_len), q.new_empty(b, h, rows, k_len)
    dq = torch.empty_like(q)
    dk_t, dv_t = (k.new_zeros(b * h, d, k_len), v.new_zeros(b * h, dv_len, k_len)) if into is None else into
    dmask = None
    if want_mask and mask_rows is None:  # in a third buffer where one is given and the mask is not reduced
        dmask = _view(buffers[2], *mask.shape) if len(buffers or ()) > 2 and not reduce_dims else mask.new_empty(mask.shape)
    for start in range(0, q_len, rows):
        end = min(start + rows, q_len)
        p, ds = p_buf[:, :, : end - start], ds_buf[:, :, : end - start]
        if dmask is not None and not reduce_dims:
            ds = dmask[:, :, start:end]  # dS is the mask's gradient: built in place
        torch.matmul(qa[:, :, start:end], ka_t, out=p)  # q k^T * scale - lse
        p.add_(mask[:, :, start:end]).exp_()  # the attention weights P
        dv_t.baddbmm_(dout[:, :, start:end].transpose(-1, -2).flatten(0, 1), p.flatten(0, 1))
        torch.matmul(da[:, :, start:end], va_t, out=ds)  # dP - D
        ds.mul_(p)  # dS
        dq[:, :, start:end] = ds @ k
        dk_t.baddbmm_(qs[:, :, start:end].transpose(-1, -2).flatten(0, 1), ds.flatten(0, 1))
        if want_mask and mask_rows is not None:
            mask_rows(start, end, ds.sum(dim=reduce_dims, keepdim=True) if reduce_dims else ds)
        elif want_mask and reduce_dims:
            dmask[:, :, start:end] = ds.sum(dim=reduce_dims, keepdim=True)
    if into is not None:
        return dq.mul_(scale), None, None, dmask
    dk, dv = (t.view(b, h, -1, k_len).transpose(-1, -2) for t in (dk_t, dv_t))
    return dq.mul_(scale), dk, dv, dmask


class _FlashWithMaskGrad(torch.autograd.Function):
    @staticmethod
    @_flushed
    def forward(ctx, q, k, v, mask, scale, blocks):
        if blocks is None:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, False, attn_mask=mask, scale=scale
            )
        else:  # query blocks, each with the keys it can see
            out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
            for start, end, n in blocks:
                out[:, :, start:end], lse[:, :, start:end] = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[:, :, start:end], k[:, :, :n], v[:, :, :n], 0.0, False,
                    attn_mask=mask[:, :, start:end, :n].contiguous(), scale=scale,
                )  # fmt: skip
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale, ctx.blocks = scale, blocks
        return out

    @staticmethod
    @_flushed
    def backward(ctx, dout):
        q, k, v, mask, out, lse = ctx.saved_tensors
        scale, blocks, want_mask = ctx.scale, ctx.blocks, ctx.needs_input_grad[3]
        dout = dout.contiguous()
        if blocks is None:
            if want_mask and WRITTEN_BACKWARD:
                return (*attention_backward(q, k, v, mask, dout, out, lse, scale), None, None)
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=scale
            )
            dmask = mask_gradient(q, k, v, mask, dout, out, lse, scale) if want_mask else None
            return dq, dk, dv, dmask, None, None
        b, h = q.shape[:2]
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dmask = torch.zeros_like(mask) if want_mask else None  # zero where no row of a block looks
        size = b * h * max((end - start) * n for start, end, n in blocks)
        buffers = (q.new_empty(size), q.new_empty(size)) if want_mask else None
        for start, end, n in blocks:
            args = (q[:, :, start:end].contiguous(), k[:, :, :n].contiguous(), v[:, :, :n].contiguous())
            m, do_b = mask[:, :, start:end, :n].contiguous(), dout[:, :, start:end]
            o_b, l_b = out[:, :, start:end].contiguous(), lse[:, :, start:end].contiguous()
            if want_mask and WRITTEN_BACKWARD:
                dq_b, dk_b, dv_b, dmask[:, :, start:end, :n] = attention_backward(
                    *args, m, do_b, o_b, l_b, scale, buffers=buffers
                )
            else:  # a constant mask (ALiBi): the kernel's own backward pass
                dq_b, dk_b, dv_b = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    do_b, *args, o_b, l_b, 0.0, False, attn_mask=m, scale=scale
                )
                if want_mask:
                    dmask[:, :, start:end, :n] = mask_gradient(*args, m, do_b, o_b, l_b, scale, buffers=buffers)
            dq[:, :, start:end] = dq_b
            dk[:, :, :n].add_(dk_b)
            dv[:, :, :n].add_(dv_b)
        return dq, dk, dv, dmask, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, blocks=None):
    """``softmax(q k^T * scale + mask) v`` in the fused CPU kernel, with a gradient for ``mask``.

    ``q: (batch, heads, q_len, d)``, ``k, v: (batch, heads, k_len, d)``; ``mask``: float32
    ``(batch or 1, heads or 1, q_len, k_len)``, ``-inf`` where a key is not allowed (no row may be
    all ``-inf``).  ``blocks``: optional ``(start, end, n)`` query ranges covering ``0..q_len``, each run
    against keys ``0..n`` only; the mask must be ``-inf`` at every key a block leaves out (a causal
    block needs no key after its last query).  A mask that needs no gradient gets none: the kernel's two
    passes as SDPA runs them, with denormals flushed (see the module's notes).
    """
    b, h, q_len, _ = q.shape
    if mask.dim() != 4 or mask.shape[0] not in (1, b) or mask.shape[1] not in (1, h) or mask.shape[2:] != (q_len, k.shape[2]):
        raise ValueError(f"mask must have shape (1 or {b}, 1 or {h}, {q_len}, {k.shape[2]}), got {tuple(mask.shape)}")
    return _FlashWithMaskGrad.apply(q, k, v, mask.contiguous(), scale, blocks)


def sum_per_row(p: torch.Tensor, plan) -> torch.Tensor:
    """``M[..., i, r] = sum_j p[..., i, j] [index_ij = r]``: ``(B, H, Lq, Lk) -> (B, H, Lq, R)``.

    ``plan`` is an index plan of a clipped relative table (``posenc_lib.schemes.shaw.ShawPlan``): ``index
    (Lq, Lk)`` rows of ``rows``; with ``fast`` set, inner rows come from one gather at ``band_j``/``band_ok``
    and the two clipped ends from masked row sums against ``ends``; otherwise a scatter-add.
    """
    b, h, lq, lk = p.shape
    if not plan.fast:
        out = p.new_zeros(b, h, lq, plan.rows)
        return out.scatter_add_(-1, plan.index.expand(b, h, lq, lk), p)
    band = p.gather(-1, plan.band_j.expand(b, h, lq, plan.rows - 2)) * plan.band_ok.to(p.dtype)
    # clipped ends: one masked row sum each, as L_q small matrix products (batch = query row)
    ends = torch.bmm(p.reshape(b * h, lq, lk).transpose(0, 1), plan.ends.to(p.dtype))  # (Lq, B*H, 2)
    ends = ends.transpose(0, 1).reshape(b, h, lq, 2)
    return torch.cat((ends[..., :1], band, ends[..., 1:]), dim=-1)



# -- Shaw et al.: a key term in the mask, a value term from the weights --------------------------------
class _ShawFlash(torch.autograd.Function):
    """Shaw et al.'s attention over query blocks: the fused kernel for ``softmax(q (k + a^K)^T) v``, the
    value term ``sum_j P_ij a^V_ij`` from weights rebuilt with the kernel's ``lse``, and a written-out
    backward pass that rebuilds each block's weights once (no second forward pass).

    The keys a block's rows all see at the same clipped distance (every key more than ``k`` positions from each
    of its queries, :func:`~posenc_lib.kernels.shaw.shaw_sides`) add the same ``q . a^K`` to a row's scores
    and the same ``a^V`` to its output.  There the kernel runs without a mask, forward and backward, and the
    three key ranges are joined through their log-sum-exps; only the strip between (the block's rows plus
    ``2k`` keys wide) lays out a mask and its weights (the split: :func:`~posenc_lib.kernels.shaw.shaw_split`).  Against laying out every key
    (whole step, median of 5 interleaved repeats over ``none``'s): 1.70 -> 1.40 at batch 2 and 1.66 -> 1.44 at
    batch 1, L = 1024; 1.83 -> 1.53 at batch 1, L = 2048."""

    @staticmethod
    @_flushed
    def forward(ctx, q, k, v, table_k, table_v, scale, blocks):
        b, h, q_len, d = q.shape
        rows_t = table_k.shape[0]
        blocks, splits = _shaw_blocks(blocks)
        size = max((end - start) * (s1 - s0) for (start, end, *_), (s0, s1, *_) in zip(blocks, splits))
        m_flat, p_flat = q.new_empty(b * h * size), q.new_empty(b * h * size)
        out, lse = torch.empty_like(q), q.new_empty(b, h, q_len)
        per_row = q.new_empty(b, h, q_len, rows_t)  # attention mass per clipped distance
        sided = any((s0, s1) != (0, _keys(plan)) for (_, _, plan, _), (s0, s1, *_) in zip(blocks, splits))
        side = q.new_zeros(2, b, h, q_len, d) if sided else None  # each outer key range's own output
        side_lse = q.new_full((2, b, h, q_len), float("-inf")) if sided else None  # and log-sum-exp
        qs = q * scale
        ka_t = _aug(k, k.new_ones(k.shape[:-1])).transpose(-1, -2).contiguous()
        for (start, end, plan, _), (s0, s1, strip, allowed) in zip(blocks, splits):
            m, p = _view(m_flat, b, h, end - start, s1 - s0), _view(p_flat, b, h, end - start, s1 - s0)
            q_b, qs_b = q[:, :, start:end], qs[:, :, start:end]
            _shaw_mask(qs_b, table_k, strip, allowed, out=m)
            o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q_b, k[:, :, s0:s1], v[:, :, s0:s1], 0.0, False, attn_mask=m, scale=scale
            )
            torch.matmul(_aug(qs_b, -l), ka_t[..., s0:s1], out=p)  # q k^T * scale - lse
            p.add_(m).exp_()  # the weights P of the strip
            mass = sum_per_row(p, strip)
            if (s0, s1) == (0, _keys(plan)):  # the block is one strip
                per_row[:, :, start:end] = mass
                out[:, :, start:end] = o + mass @ table_v
                lse[:, :, start:end] = l
                continue
            if allowed is not None:  # a strip row that may see no key there: its share is nothing
                l = l.masked_fill(~allowed.any(-1), float("-inf"))
            for i, a, z, row in _shaw_sides(plan, s0, s1):
                side[i, :, :, start:end], l_r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q_b, k[:, :, a:z], v[:, :, a:z], 0.0, False, scale=scale
                )[:2]  # fmt: skip
                side_lse[i, :, :, start:end] = l_r + qs_b @ table_k[row]  # the same q . a^K on every key
            l_all = torch.logsumexp(torch.stack((l, *side_lse[:, :, :, start:end])), dim=0)
            w = torch.exp(torch.stack((l, *side_lse[:, :, :, start:end])) - l_all)  # each range's share of the mass
            mass.mul_(w[0, ..., None])
            mass[..., 0] += w[1]
            mass[..., -1] += w[2]
            per_row[:, :, start:end] = mass
            o_b = o.mul_(w[0, ..., None]).add_(side[0, :, :, start:end] * w[1, ..., None])
            out[:, :, start:end] = o_b.add_(side[1, :, :, start:end] * w[2, ..., None]).add_(mass @ table_v)
            lse[:, :, start:end] = l_all
        ctx.save_for_backward(q, k, v, table_k, table_v, out, lse, per_row, side, side_lse)
        ctx.scale, ctx.blocks, ctx.splits = scale, blocks, splits
        return out

    @staticmethod
    @_flushed
    def backward(ctx, dout):
        q, k, v, table_k, table_v, out, lse, mass, side, side_lse = ctx.saved_tensors
        scale, blocks = ctx.scale, ctx.blocks
        b, h, q_len, d = q.shape
        rows_t = table_k.shape[0]
        size = max((end - start) * (s1 - s0) for (start, end, *_), (s0, s1, *_) in zip(blocks, ctx.splits))
        m_flat, p_flat, g_flat = (q.new_empty(b * h * size) for _ in range(3))
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dout = dout.contiguous()
        qs = q * scale
        ones = k.new_ones(k.shape[:-1])
        ka_t, va_t = _aug(k, ones).transpose(-1, -2).contiguous(), _aug(v, ones).transpose(-1, -2).contiguous()
        d_row = (dout * out).sum(-1)  # D = rowsum(dO * O), O with the value term
        qa, da = _aug(qs, -lse), _aug(dout, -d_row)
        dtable_v = mass.reshape(-1, rows_t).t() @ dout.reshape(-1, d)
        dtable_k = torch.zeros_like(table_k)
        for (start, end, plan, _), (s0, s1, strip, allowed) in zip(blocks, ctx.splits):
            qs_b, do_b = qs[:, :, start:end], dout[:, :, start:end]
            m, p, g = (_view(f, b, h, end - start, s1 - s0) for f in (m_flat, p_flat, g_flat))
            _shaw_mask(qs_b, table_k, strip, allowed, out=m)
            torch.matmul(qa[:, :, start:end], ka_t[..., s0:s1], out=p)
            p.add_(m).exp_()  # P again
            dv[:, :, s0:s1].add_(p.transpose(-1, -2) @ do_b)
            torch.matmul(da[:, :, start:end], va_t[..., s0:s1], out=m)  # dO v^T - D (m's buffer is free again)
            torch.gather(do_b @ table_v.t(), -1, strip.index.expand(m.shape), out=g)  # dO . a^V_ij
            ds = m.add_(g).mul_(p)  # dS / scale
            per_row = sum_per_row(ds, strip)  # summed per clipped distance
            dq_b = ds @ k[:, :, s0:s1]
            dk[:, :, s0:s1].add_(ds.transpose(-1, -2) @ qs_b)
            if (s0, s1) != (0, _keys(plan)):
                q_b, out_b, lse_b = q[:, :, start:end].contiguous(), out[:, :, start:end], lse[:, :, start:end]
                do_c = do_b.contiguous()
                dq_sides = torch.zeros_like(q_b)
                for i, a, z, row in _shaw_sides(plan, s0, s1):
                    # the kernel's backward pass over keys a:z, where every score has the same q . a^K (folded
                    # into the log-sum-exp) and every value the same a^V (taken from the output, so D is right)
                    shift = qs_b @ table_k[row]
                    dq_r, dk_r, dv_r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                        do_c, q_b, k[:, :, a:z].contiguous(), v[:, :, a:z].contiguous(), out_b - table_v[row],
                        lse_b - shift, 0.0, False, scale=scale,
                    )  # fmt: skip
                    dq_sides.add_(dq_r)
                    dk[:, :, a:z].add_(dk_r)
                    dv[:, :, a:z].add_(dv_r)
                    share = torch.exp(side_lse[i, :, :, start:end] - lse_b)  # the range's mass
                    seen = (do_b * (side[i, :, :, start:end] + table_v[row])).sum(-1)  # dO . (its output + a^V)
                    per_row[..., row] += share * (seen - d_row[:, :, start:end])  # the summed dS of the range
                dq[:, :, start:end] = (dq_b.add_(per_row @ table_k)).mul_(scale).add_(dq_sides)
            else:
                dq[:, :, start:end] = (dq_b.add_(per_row @ table_k)).mul_(scale)
            dtable_k.add_(per_row.reshape(-1, rows_t).t() @ qs_b.reshape(-1, d))
        return dq, dk, dv, dtable_k, dtable_v, None, None


#: The fused path of a scheme with a clipping distance (Shaw: ``shaw_split``; DeBERTa, T5: ``ranges`` and ``sides`` in
#: :func:`flash_blocks`) runs a block's keys beyond that distance from all its rows in the kernel without a mask
#: where they are at least this many (fewer stay with the laid-out strip); ``None``: never.
SIDE_MIN_KEYS: int | None = 1


def _shaw_blocks(blocks):
    """``(blocks, splits)``: :func:`shaw_attention`'s blocks as ``(start, end, plan, allowed)`` and each one's split
    ``(s0, s1, strip_plan, strip_allowed)`` (``(0, n, plan, allowed)`` for a block given without one)."""
    plain, splits = [], []
    for start, end, plan, allowed, *split in blocks:
        plain.append((start, end, plan, allowed))
        splits.append(split[0] if split else (0, _keys(plan), plan, allowed))
    return plain, splits


def _shaw_sides(plan, s0: int, s1: int):
    """The outer key ranges of a split block: ``(i, a, z, row)``, keys ``a:z`` at table row ``row``, ``i`` 0 for the
    left range and 1 for the right one; an empty range is left out."""
    n, rows = _keys(plan), plan.rows
    return [(i, a, z, row) for i, a, z, row in ((0, 0, s0, 0), (1, s1, n, rows - 1)) if z > a]


def _keys(plan) -> int:
    """The number of keys a block's plan covers (all of them, or those up to a causal block's last query)."""
    return plan.index.shape[1]


def _view(flat: torch.Tensor, b: int, h: int, n: int, k: int) -> torch.Tensor:
    """A contiguous ``(b, h, n, k)`` view of the start of a reusable flat buffer."""
    return flat[: b * h * n * k].view(b, h, n, k)


def _shaw_mask(qs_b, table_k, plan, allowed, *, out: torch.Tensor) -> torch.Tensor:
    """``qs . a^K_ij`` (``qs``: the block's queries times the scale), ``-inf`` where not allowed, into ``out``."""
    b, h, n, _ = qs_b.shape
    torch.gather(qs_b @ table_k.t(), -1, plan.index.expand(b, h, n, plan.index.shape[1]), out=out)
    return out if allowed is None else fill_closed_(out, allowed, float("-inf"))


def shaw_attention(q, k, v, table_k, table_v, scale: float, blocks) -> torch.Tensor:
    """Shaw et al.'s attention (key and value terms) in the fused CPU kernel, over query ``blocks``.

    ``table_k, table_v: (2k+1, d)`` for this layer; ``blocks``: ``(start, end, plan, allowed)`` with the
    :class:`~posenc_lib.schemes.shaw.ShawPlan` of each block's rows and its boolean mask (broadcastable to
    ``(batch, 1, end - start, n)``) or ``None``, where ``n``, the plan's number of keys, may stop short
    of ``k_len`` when no row of the block sees the keys after it.  Same function and gradients as the explicit path.
    A block may carry a fifth item, its split ``(s0, s1, strip_plan, strip_allowed)``
    (:func:`~posenc_lib.kernels.shaw.shaw_split`): keys ``0:s0`` and ``s1:n`` then run without a mask.
    """
    return _ShawFlash.apply(q, k, v, table_k, table_v, scale, blocks)


# -- score terms built from small parts: rebuilt in the backward pass, no second forward --------------------
class _FlashScores(torch.autograd.Function):
    @staticmethod
    @_flushed
    def forward(ctx, q, k, v, scale, build, *parts):
        with torch.no_grad():
            mask = build(q, k, *parts)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, *parts)
        ctx.scale, ctx.build = scale, build
        return out

    @staticmethod
    @_flushed
    def backward(ctx, dout):
        q, k, v, out, lse, *parts = ctx.saved_tensors
        dout = dout.contiguous()
        needs = [True, True] + list(ctx.needs_input_grad[5:])
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(need) for t, need in zip([q, k, *parts], needs)]
            mask = ctx.build(*leaves)  # the block's mask again, now with its graph
        m = mask.detach()
        if WRITTEN_BACKWARD:
            dq, dk, dv, dm = attention_backward(q, k, v, m, dout, out, lse, ctx.scale)
        else:
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse, 0.0, False, attn_mask=m, scale=ctx.scale
            )
            dm = mask_gradient(q, k, v, m, dout, out, lse, ctx.scale)
        wanted = [t for t in leaves if t.requires_grad]
        grads = iter(torch.autograd.grad(mask, wanted, dm, allow_unused=True))
        g = [next(grads) if t.requires_grad else None for t in leaves]
        dq = dq if g[0] is None else dq + g[0]
        dk = dk if g[1] is None else dk + g[1]
        return (dq, dk, dv, None, None, *g[2:])


def flash_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, build, *parts: torch.Tensor):
    """``softmax(q k^T * scale + build(q, k, *parts)) v`` in the fused CPU kernel, with gradients for
    ``q``, ``k``, ``v`` and ``parts``.

    ``build`` returns the float32 mask ``(batch or 1, heads or 1, q_len, k_len)`` from ``q``, ``k`` and the
    small tensors ``parts`` (a scheme's projected relative tables); it runs without gradients in the
    forward pass and again with them in the backward pass, so only ``parts`` are kept, not the mask and
    not a second forward pass of the kernel (which ``torch.utils.checkpoint`` would repeat).
    """
    return _FlashScores.apply(q, k, v, scale, build, *parts)


# -- a whole mask laid out from one value per offset: its gradient summed per diagonal, block by block -------------
def _offset_rows_sum(dvals: torch.Tensor, q_len: int):
    """A ``mask_rows`` for :func:`attention_backward`: adds each block's rows of the mask's gradient, summed over the
    batch and along each diagonal, into ``dvals (heads, q_len + k_len - 1)``, the gradient of the values per offset."""

    def add(start: int, end: int, grad: torch.Tensor) -> None:
        g = grad.sum(0) if grad.shape[0] > 1 else grad[0]
        width = (end - start) + g.shape[-1] - 1
        dvals[:, q_len - end : q_len - end + width] += diagonal_sums(g)

    return add


class _FlashWholeOffsets(torch.autograd.Function):
    @staticmethod
    @_flushed
    def forward(ctx, q, k, v, mask, values, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=scale
        )
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale, ctx.values_shape = scale, values.shape
        return out

    @staticmethod
    @_flushed
    def backward(ctx, dout):
        q, k, v, mask, out, lse = ctx.saved_tensors
        want = ctx.needs_input_grad[4]
        dvals = q.new_zeros(ctx.values_shape) if want else None
        rows = _offset_rows_sum(dvals, q.shape[2]) if want else None
        dq, dk, dv, _ = attention_backward(
            q, k, v, mask, dout.contiguous(), out, lse, ctx.scale, want_mask=want, mask_rows=rows
        )  # fmt: skip
        return dq, dk, dv, None, dvals, None


def flash_whole_offsets(q, k, v, mask: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` in one call of the fused kernel, where ``mask`` (float32, ``(1 or batch,
    heads, q_len, k_len)``, no gradient of its own) is laid out from ``values (heads, q_len + k_len - 1)``,
    ``mask[.., h, i, j] = values[h, j - i + q_len - 1]`` (``-inf`` where masked).  The gradient reaches ``values``
    summed per diagonal for each block of rows of the written-out backward pass, so the whole ``(heads, q_len,
    k_len)`` gradient of the mask is never written (a non-causal call's T5 bias: laid out once for a stack's layers,
    and before, one whole gradient per layer, summed into the bias's)."""
    return _FlashWholeOffsets.apply(q, k, v, mask.contiguous(), values, scale)


# -- blocks of queries whose masks are laid out from the same small parts: one autograd node for all ---------------
class _FlashBuiltBlocks(torch.autograd.Function):
    @staticmethod
    @_flushed
    def forward(ctx, q, k, v, scale, blocks, build, ranges, sides, work, *parts):
        b, h, q_len, d = q.shape
        ranges = ranges or [(0, n) for _, _, n in blocks]
        split = any(r != (0, n) for r, (_, _, n) in zip(ranges, blocks))
        side_out = q.new_zeros(2, b, h, q_len, d) if split else None  # each outer key range's own output
        side_lse = q.new_full((2, b, h, q_len), float("-inf")) if split else None  # and log-sum-exp
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
        with torch.no_grad():
            for i, ((start, end, n), (s0, s1)) in enumerate(zip(blocks, ranges)):
                mask = build(i, *parts)
                o, l = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[:, :, start:end], k[:, :, s0:s1], v[:, :, s0:s1], 0.0, False, attn_mask=mask, scale=scale
                )[:2]  # fmt: skip
                if (s0, s1) == (0, n):
                    out[:, :, start:end], lse[:, :, start:end] = o, l
                    continue
                l = l.masked_fill(torch.isneginf(mask).all(-1), float("-inf"))  # a row that sees no key in the strip
                for slot, a, z, row, u in sides(i, *parts):
                    q_r = q[:, :, start:end] if u is None else q[:, :, start:end] + u
                    side_out[slot, :, :, start:end], l_r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                        q_r, k[:, :, a:z], v[:, :, a:z], 0.0, False, scale=scale
                    )[:2]  # fmt: skip
                    side_lse[slot, :, :, start:end] = l_r + row
                terms = torch.stack((l, *side_lse[:, :, :, start:end]))
                lse[:, :, start:end] = l_all = torch.logsumexp(terms, dim=0)
                w = torch.exp(terms - l_all)[..., None]  # each key range's share of the row's mass
                o_b = o.mul_(w[0]).add_(side_out[0, :, :, start:end] * w[1])
                out[:, :, start:end] = o_b.add_(side_out[1, :, :, start:end] * w[2])
        if work is not None:
            work.clear()
        ctx.save_for_backward(q, k, v, out, lse, side_out, side_lse, *parts)
        ctx.scale, ctx.blocks, ctx.build, ctx.ranges, ctx.sides, ctx.work = scale, blocks, build, ranges, sides, work
        return out

    @staticmethod
    @_flushed
    def backward(ctx, dout):
        q, k, v, out, lse, side_out, side_lse, *parts = ctx.saved_tensors
        scale, blocks, ranges = ctx.scale, ctx.blocks, ctx.ranges
        dout = dout.contiguous()
        leaves = [t.detach().requires_grad_(need) for t, need in zip(parts, ctx.needs_input_grad[9:])]
        wanted = [t for t in leaves if t.requires_grad]
        sums = [None] * len(wanted)
        b, h, _, d = q.shape
        k_len = k.shape[2]
        dq = torch.empty_like(q)
        # the keys' and values' gradients are summed transposed (see attention_backward); dk, dv: views of them
        dk_t, dv_t = k.new_zeros(b * h, d, k_len), v.new_zeros(b * h, v.shape[-1], k_len)
        dk, dv = (t.view(b, h, -1, k_len).transpose(-1, -2) for t in (dk_t, dv_t))
        size = b * h * max((end - start) * (s1 - s0) for (start, end, _), (s0, s1) in zip(blocks, ranges))
        buffers = (q.new_empty(size), q.new_empty(size), *[q.new_empty(size)] * bool(wanted))  # P, dS, the mask's grad
        if wanted:  # made once for every block: the whole keys, contiguous, and augmented_keys of them
            k, v = k.contiguous(), v.contiguous()
            keys = augmented_keys(k, v)
        for i, ((start, end, n), (s0, s1)) in enumerate(zip(blocks, ranges)):
            split = (s0, s1) != (0, n)
            with torch.enable_grad():
                mask = ctx.build(i, *leaves)
                terms = ctx.sides(i, *leaves) if split else []
            o_b, l_b, do_b = out[:, :, start:end].contiguous(), lse[:, :, start:end].contiguous(), dout[:, :, start:end]
            if wanted:  # P and dS written out once serve the mask's gradient and the other three
                args = (q[:, :, start:end].contiguous(), k[:, :, s0:s1], v[:, :, s0:s1])
                dq_b, _, _, dm = attention_backward(
                    *args, mask.detach(), do_b, o_b, l_b, scale, buffers=buffers,
                    keys=[t[..., s0:s1] for t in keys], into=(dk_t[:, :, s0:s1], dv_t[:, :, s0:s1]),
                )  # fmt: skip
            else:  # a constant mask (ALiBi): the kernel's own backward pass
                args = (q[:, :, start:end].contiguous(), k[:, :, s0:s1].contiguous(), v[:, :, s0:s1].contiguous())
                dq_b, dk_b, dv_b = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    do_b, *args, o_b, l_b, 0.0, False, attn_mask=mask, scale=scale
                )
                dk[:, :, s0:s1].add_(dk_b)
                dv[:, :, s0:s1].add_(dv_b)
            made, grads = [mask], [dm] if wanted else []
            if terms:
                d_row = (do_b * o_b).sum(-1)  # D = rowsum(dO * O)
            for slot, a, z, row, u in terms:
                # the kernel's backward pass over keys a:z, where every score has the same row term (folded into
                # the log-sum-exp) and the same key term (folded into the queries, q + u)
                q_r = args[0] if u is None else (args[0] + u.detach()).contiguous()
                dq_r, dk_r, dv_r = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    do_b, q_r, k[:, :, a:z].contiguous(), v[:, :, a:z].contiguous(),
                    o_b, (l_b - row.detach()).contiguous(), 0.0, False, scale=scale,
                )  # fmt: skip
                dq_b = dq_b + dq_r
                dk[:, :, a:z].add_(dk_r)
                dv[:, :, a:z].add_(dv_r)
                share = torch.exp(side_lse[slot, :, :, start:end] - l_b)  # the range's mass
                d_range = share * ((do_b * side_out[slot, :, :, start:end]).sum(-1) - d_row)  # the range's summed dS
                made.append(row)  # it reaches the row term; dq_r, summed, the key term
                grads.append(_sum_to(d_range, row.shape))
                if u is not None:
                    made.append(u)
                    grads.append(_sum_to(dq_r, u.shape))
            dq[:, :, start:end] = dq_b
            if wanted:
                pairs = [(t, g) for t, g in zip(made, grads) if t.requires_grad]
                got = torch.autograd.grad([t for t, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                for j, g in enumerate(got):
                    if g is not None:
                        sums[j] = g if sums[j] is None else sums[j].add_(g)
        if ctx.work is not None:
            ctx.work.clear()
        grads = iter(sums)
        return (dq, dk, dv, *[None] * 6, *[next(grads) if t.requires_grad else None for t in leaves])


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """``grad`` summed over the axes where ``shape`` (broadcast against it) has size 1."""
    dims = [i for i, (g, s) in enumerate(zip(grad.shape, shape)) if s == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def flash_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, blocks, build, *parts: torch.Tensor,
                 ranges=None, sides=None, work: dict | None = None):  # fmt: skip
    """``softmax(q k^T * scale + mask) v`` over query blocks ``(start, end, n)`` (covering ``0..q_len``, each
    against keys ``0..n``), block ``i``'s mask ``build(i, *parts)`` laid out from small tensors ``parts``
    (float32 ``(1 or batch, heads or 1, end - start, n)``, ``-inf`` at every key the block may not see).
    Gradients for ``q``, ``k``, ``v`` and ``parts``, in one autograd node: each mask is built without
    gradients in the forward pass and again with them in the backward pass, where the blocks' gradients of
    ``k``, ``v`` and ``parts`` are summed in place (:func:`flash_scores` per block would add a node, a sliced copy
    of ``k`` and ``v``'s gradient and a concatenation for each).  Parts that need no gradient (ALiBi's fixed
    values) leave each block's backward pass to the kernel's own (:func:`attention_backward` writes out ``P`` and
    ``dS`` to serve the mask's gradient too; without one the kernel's pass was the faster, e.g. ALiBi's whole
    step at batch 1, L = 2048: 1.44 against 1.27 of ``none``'s, median of 6 interleaved repeats).

    ``ranges``: for each block, the keys ``(s0, s1)`` its mask covers (``build`` then lays out ``(..., end - start,
    s1 - s0)``); the keys ``0:s0`` and ``s1:n`` outside it must all be allowed, and their mask entries be
    ``row_i + scale * u . k_j`` for query ``i`` and key ``j``: ``sides(i, *parts)`` gives those terms as ``(slot,
    a, z, row, u)`` (slot 0 for keys ``0:s0``, 1 for ``s1:n``; ``row (batch or 1, heads, end - start)``, ``u``
    broadcastable to ``q`` or ``None``), built from ``parts`` so that their gradients reach them.  Those keys run in the
    kernel without a mask (on ``q + u``), forward and backward, joined to the rest through the log-sum-exps.

    ``work``: a dict in which ``build`` may keep buffers for the blocks of one pass; it is emptied after the forward
    pass and after the backward pass, so that nothing it holds outlives the pass that made it."""
    return _FlashBuiltBlocks.apply(q, k, v, scale, tuple(blocks), build, ranges, sides, work, *parts)

