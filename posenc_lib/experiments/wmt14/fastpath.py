"""The ``gpu`` profile's training path: batches gathered on the device, a loss without a full fp32 logits copy.

* :class:`DeviceData`: every training pair's token ids encoded once into two flat tensors (ids and
  offsets per side) on the training device; a batch is one gather by index arithmetic, padded exactly
  as :func:`~posenc_lib.experiments.wmt14.train.collate` pads (``src + </s>``, ``<s> + tgt``, ``tgt + </s>``),
  with no Python loop over rows and no copy from host memory per update;
* :func:`chunked_cross_entropy`: label-smoothed cross-entropy over the tied output layer computed a few
  thousand rows at a time, each part's logits made, used for its loss and gradients, and dropped; the
  gradients are computed in the forward pass (the loss is a scalar), so nothing is recomputed;
* :func:`padding_fraction` and :func:`matmul_flops_per_token`: the arithmetic the GPU check reports.

Both paths are switched on by profile fields (``device_data``, ``loss_chunk``) that only the ``gpu`` profile sets;
the CPU profiles train exactly as before.
"""
from __future__ import annotations

import numpy as np
import torch

from ...checks import check_positive_int


class DeviceData:
    """Token ids of a list of (source, target) pairs as flat tensors on ``device`` (``ids`` + ``offsets`` per side).

    :meth:`gather` builds ``(src, tgt_in, tgt_out)`` for the pairs at some indices with the widths
    :func:`collate` gives them; the widths come from host-side lengths (numpy), so nothing is read
    back from the device.  Batches of an epoch can be uploaded at once with :meth:`upload_batches`.
    """

    def __init__(self, src: list[list[int]], tgt: list[list[int]], pad: int, bos: int, eos: int,
                 device: str | torch.device = "cpu"):
        if len(src) != len(tgt) or not src:
            raise ValueError(f"DeviceData needs as many sources as targets, at least one; got {len(src)} sources "
                             f"and {len(tgt)} targets")
        self.pad, self.bos, self.eos, self.device = pad, bos, eos, torch.device(device)
        self.src_len = np.fromiter((len(r) for r in src), dtype=np.int64, count=len(src))
        self.tgt_len = np.fromiter((len(r) for r in tgt), dtype=np.int64, count=len(tgt))
        self._src = self._flat(src, self.src_len)
        self._tgt = self._flat(tgt, self.tgt_len)

    def _flat(self, rows: list[list[int]], lens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(lens.sum()))
        offsets = np.zeros(len(rows), dtype=np.int64)
        np.cumsum(lens[:-1], out=offsets[1:])
        # one spare pad at the end: a clamped index past a row's end reads something harmless
        flat = np.append(flat, self.pad)
        to = dict(device=self.device)
        return (torch.from_numpy(flat).to(**to), torch.from_numpy(offsets).to(**to), torch.from_numpy(lens).to(**to))

    def __len__(self) -> int:
        return len(self.src_len)

    def widths(self, idx) -> tuple[int, int]:
        """``(source width, target width)`` of the batch at ``idx``: longest row + 1 (``</s>`` or ``<s>``)."""
        idx = np.asarray(idx, dtype=np.int64)
        return int(self.src_len[idx].max()) + 1, int(self.tgt_len[idx].max()) + 1

    def upload_batches(self, batches: list[list[int]]) -> list[tuple[torch.Tensor, int, int]]:
        """Every batch's indices in one copy to the device: ``[(indices view, source width, target width)]``."""
        flat = np.fromiter((i for b in batches for i in b), dtype=np.int64, count=sum(len(b) for b in batches))
        dev = torch.from_numpy(flat).to(self.device)
        out, start = [], 0
        for b in batches:
            out.append((dev[start : start + len(b)], *self.widths(b)))
            start += len(b)
        return out

    def gather(self, idx: torch.Tensor, src_width: int, tgt_width: int):
        """``(src, tgt_in, tgt_out)`` int64 for the pairs at ``idx`` (a tensor on the device), as collate pads them."""
        (s_flat, s_off, s_len), (t_flat, t_off, t_len) = self._src, self._tgt
        sl, so = s_len[idx].unsqueeze(1), s_off[idx].unsqueeze(1)
        tl, to = t_len[idx].unsqueeze(1), t_off[idx].unsqueeze(1)
        js = torch.arange(src_width, device=idx.device).unsqueeze(0)
        jt = torch.arange(tgt_width, device=idx.device).unsqueeze(0)
        end_s, end_t = s_flat.numel() - 1, t_flat.numel() - 1  # the spare pad
        # a position past a row's end reads the spare pad; python scalars in masked_fill: no copy to the device
        src = s_flat[torch.where(js < sl, so + js, end_s)].masked_fill_(js == sl, self.eos)
        tgt_out = t_flat[torch.where(jt < tl, to + jt, end_t)].masked_fill_(jt == tl, self.eos)
        # decoder input: <s>, then the target shifted right by one
        tgt_in = t_flat[torch.where((jt >= 1) & (jt <= tl), to + jt - 1, end_t)].masked_fill_(jt == 0, self.bos)
        return src, tgt_in, tgt_out


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Sum over rows of label-smoothed cross-entropy of ``h @ weight.T``; the gradients are made in forward."""

    @staticmethod
    def forward(ctx, h, weight, target, ignore_index: int, smoothing: float, chunk: int, dtype):
        n, v = h.shape[0], weight.shape[0]
        want_h, want_w = h.requires_grad, weight.requires_grad
        w = weight.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        grad_h = torch.empty(h.shape, dtype=torch.float32, device=h.device) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_w else None
        for a in range(0, n, chunk):
            hc, yc = h[a : a + chunk].to(dtype), target[a : a + chunk]
            logits = (hc @ w.t()).float()  # as the model's logits, upcast: bf16 under autocast, fp32 otherwise
            keep = yc != ignore_index
            y = torch.where(keep, yc, 0)
            lse = torch.logsumexp(logits, dim=1)
            nll = lse - logits.gather(1, y.unsqueeze(1)).squeeze(1)
            row = (1.0 - smoothing) * nll + smoothing * (lse - logits.mean(dim=1)) if smoothing else nll
            total += torch.where(keep, row, 0.0).sum()
            if want_h or want_w:
                # d row / d logits = softmax - (1 - eps) * onehot(y) - eps / V, zero on ignored rows
                g = torch.softmax(logits, dim=1)
                g.scatter_add_(1, y.unsqueeze(1), torch.full_like(lse, -(1.0 - smoothing)).unsqueeze(1))
                if smoothing:
                    g -= smoothing / v
                g *= keep.unsqueeze(1)
                g = g.to(dtype)
                if want_h:
                    grad_h[a : a + chunk] = (g @ w).float()
                if want_w:
                    grad_w += (g.t() @ hc).float()
            del logits
        ctx.save_for_backward(grad_h, grad_w)
        ctx.h_dtype, ctx.w_dtype = h.dtype, weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gh = (grad_h * grad_out).to(ctx.h_dtype) if grad_h is not None else None
        gw = (grad_w * grad_out).to(ctx.w_dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None, None


#: rows of logits made at once by :func:`chunked_cross_entropy` (4096 x a 16k vocabulary: 256 MiB in fp32)
DEFAULT_CHUNK = 4096


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, ignore_index: int,
                          label_smoothing: float = 0.0, reduction: str = "mean", chunk: int = DEFAULT_CHUNK,
                          dtype: torch.dtype | None = None) -> torch.Tensor:
    """``F.cross_entropy((h @ weight.T).float(), target, ...)`` without the full ``(N, V)`` logits.

    ``h``: ``(N, d)`` decoder states; ``weight``: ``(V, d)`` output layer; ``target``: ``(N,)`` ids,
    ``ignore_index`` where a row counts for nothing.  The matrix products run in ``dtype`` (default: the
    autocast dtype when autocast is on, else ``h``'s), the softmax in float32, as the model's logits
    followed by ``.float()`` do.  ``reduction``: ``"mean"`` over the rows that count, or ``"sum"``.
    Extra memory: ``chunk`` rows of logits, plus the gradients of ``h`` and ``weight`` made in the
    forward pass (the loss is a scalar, so they are only scaled in the backward pass).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"unknown reduction {reduction!r}; valid choices: 'mean', 'sum'")
    chunk = check_positive_int("chunk", chunk)
    if dtype is None:
        on = torch.is_autocast_enabled(h.device.type)
        dtype = torch.get_autocast_dtype(h.device.type) if on else h.dtype
    h2, t2 = h.reshape(-1, h.shape[-1]), target.reshape(-1)
    with torch.autocast(device_type=h.device.type, enabled=False):
        total = _ChunkedCrossEntropy.apply(h2, weight, t2, ignore_index, float(label_smoothing), chunk, dtype)
    if reduction == "sum":
        return total
    return total / (t2 != ignore_index).sum().clamp(min=1)


# -- arithmetic the GPU check reports --------------------------------------------------------------
def padding_fraction(batches: list[list[int]], src_lens, tgt_lens) -> dict:
    """Share of padded positions in the source and target tensors of ``batches`` (lengths with ``</s>``)."""
    s, t = np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)
    real_s = real_t = cells_s = cells_t = 0
    for b in batches:
        idx = np.asarray(b, dtype=np.int64)
        real_s, real_t = real_s + int(s[idx].sum()), real_t + int(t[idx].sum())
        cells_s, cells_t = cells_s + len(b) * int(s[idx].max()), cells_t + len(b) * int(t[idx].max())
    return {"source": round(1 - real_s / cells_s, 4), "target": round(1 - real_t / cells_t, 4),
            "batches": len(batches), "source_tokens": real_s, "target_tokens": real_t}


def matmul_flops_per_token(d_model: int, dim_feedforward: int, num_layers: int, num_decoder_layers: int,
                           vocab_size: int, src_per_tgt: float = 1.0, train: bool = True) -> dict:
    """Matrix-multiply FLOPs per target token of one update (weights only; attention scores apart).

    Per target token: each decoder layer's self-attention (4 d^2), cross-attention queries and output
    (2 d^2) and feed-forward (2 d ff) multiply-adds, and the output layer (V d); per source token
    (``src_per_tgt`` of them per target token): each encoder layer's 4 d^2 + 2 d ff and each decoder
    layer's cross-attention keys and values (2 d^2).  2 FLOPs per multiply-add; a training update is
    3 x forward (the backward pass computes two products per forward one).
    """
    d, ff = d_model, dim_feedforward
    dec = num_decoder_layers * (6 * d * d + 2 * d * ff)
    out = vocab_size * d
    per_src = num_layers * (4 * d * d + 2 * d * ff) + num_decoder_layers * 2 * d * d
    macs = dec + out + src_per_tgt * per_src
    factor = 2 * (3 if train else 1)
    return {"decoder": factor * dec, "output_layer": factor * out,
            "encoder_and_cross_kv": factor * src_per_tgt * per_src, "total": factor * macs}
