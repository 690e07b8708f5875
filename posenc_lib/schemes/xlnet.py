"""Transformer-XL / XLNet relative attention (Dai et al. 2019, "Transformer-XL: Attentive
Language Models Beyond a Fixed-Length Context", arXiv:1901.02860, section 3.3; Yang et al.
2019, "XLNet", arXiv:1906.08237).

Expanding ``(x_i + p_i) W_q . (x_j + p_j) W_k`` gives four terms; Transformer-XL
replaces every absolute ``p_j`` by a sinusoid of the distance ``R_{i-j}`` and
the query's position by two learned global vectors ``u`` and ``v``:

    A_ij = q_i . k_j          (a) content-content
         + q_i . W_R R_{i-j}  (b) content-position
         + u   . k_j          (c) global content bias
         + v   . W_R R_{i-j}  (d) global position bias
         = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}

Values carry no position.  ``R`` uses the XLNet layout ``[sin(d w), cos(d w)]``
(sines in the first half).  Term (b)+(d) is first computed against every
distance the block needs, an ``(L_q, L_q + L_k - 1)`` matrix, and the
*relative shift* (:func:`rel_shift`) slides row ``i`` left by ``L_q - 1 - i``
so that column ``j`` holds distance ``i - j``, with reshapes only (no gather).

Sign convention: the paper (and ``transformers``) index ``R`` by ``i - j``, the query minus the key, how
far the key lies behind the query; in the course's convention (key minus query, ``j - i``, stated in
:mod:`posenc_lib.attention.layer`) that is ``R_{-(j-i)}``.  The module keeps the paper's index.

Taught in notebooks/08_transformer_xl_xlnet.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..attention.step import distance_table
from ..checks import check_even, check_float_range, check_position_tensor


def xlnet_sinusoid(distances: torch.Tensor, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """``(n, d_model)``: ``[sin(d * w), cos(d * w)]`` with ``w_k = base^(-2k/d_model)`` (XLNet layout) for
    ``distances (n,)``, integer or floating."""
    check_position_tensor("distances", distances)
    check_even("d_model", d_model)
    check_float_range("base", base, 1.0, low_open=True)
    return _sinusoid(distances, d_model, base)


def _sinusoid(distances: torch.Tensor, d_model: int, base: float) -> torch.Tensor:
    """:func:`xlnet_sinusoid` without its checks (``d_model`` and ``base`` checked when the scheme was built):
    a compiled decoding step traces no check of a number."""
    inv_freq = 1.0 / (base ** (torch.arange(0, d_model, 2, dtype=torch.float32, device=distances.device) / d_model))
    ang = distances.to(torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat((ang.sin(), ang.cos()), dim=-1)


def rel_shift(x: torch.Tensor, k_len: int) -> torch.Tensor:
    """Relative shift: ``x (..., Lq, P)`` with column ``p`` = distance ``dmax - p`` -> ``(..., Lq, k_len)``.

    Requires ``P = Lq + k_len - 1`` distances in descending order, ``dmax`` being
    the distance of the last query to the first key.  Output ``[i, j] = x[i, j + Lq - 1 - i]``.
    Transformer-XL gets it by padding a zero column on the left, viewing the result as
    ``(P + 1, Lq)``, dropping the first row and viewing back as ``(Lq, P)``; the same elements
    are a strided *view* of ``x`` (no copy): start at column ``Lq - 1`` of row 0 and step
    ``P - 1`` elements per row, one fewer than a row holds, so each row starts one column further left.
    """
    *lead, lq, p = x.shape
    if p != lq + k_len - 1:
        raise ValueError(f"rel_shift needs Lq + k_len - 1 = {lq + k_len - 1} distance columns, got {p}")
    if torch.compiler.is_compiling():  # a fresh copy starts its storage at 0: no storage_offset() to trace
        x, offset = x.clone(memory_format=torch.contiguous_format), 0
    else:
        x = x.contiguous()
        offset = x.storage_offset()
    return x.as_strided((*lead, lq, k_len), (*x.stride()[:-2], p - 1, 1), offset + lq - 1)


def _is_arange(pos: torch.Tensor) -> bool:
    """True for consecutive positions; only read on CPU (the model's positions always are)."""
    if pos.numel() == 0 or not on_host(pos):
        return True
    return bool(torch.equal(pos, torch.arange(int(pos[0]), int(pos[0]) + pos.numel(), device=pos.device)))


def _one_query_terms(q, k, r, u, v):
    """Terms (c) and (b)+(d) of one query row, ``q: (B, H, 1, dh)``, against keys ``k: (B, H, Lk, dh)``.

    ``r: (Lk, H * dh)`` holds the projected distances ``0, 1, ..., Lk - 1``; key ``j`` is at distance
    ``Lk - 1 - j`` from the query, so the distance scores are reversed.  One product per head over the
    batch rows, with no relative shift and no copy of ``r`` per batch row.
    """
    b, h, _, dh = q.shape
    qv = (q + v[None, :, None, :]).view(b, h, dh).transpose(0, 1)  # (H, B, dh)
    position = torch.bmm(qv, r.view(-1, h, dh).permute(1, 2, 0))  # (H, B, Lk): distance 0 first
    content = (k @ u[:, :, None]).squeeze(-1)  # (B, H, Lk): u . k_j
    return content.add_(position.transpose(0, 1).flip(-1))[:, :, None, :]


@register_scheme(kind="relative", group="classic", year=2019, arxiv="1901.02860",
                 paper="Dai et al. 2019, Transformer-XL; Yang et al. 2019, XLNet")
class XLNetRelative(PositionScheme):
    """Per-layer ``W_R`` (d_model -> heads*head_dim) and global biases ``u``, ``v`` (heads, head_dim)."""

    name = "xlnet"
    enters = "scores"

    def __init__(self, d_model, n_heads, num_layers, causal=False, base: float = 10000.0):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.base = check_float_range("base", base, 1.0, low_open=True)
        self.r_proj = nn.Parameter(torch.randn(num_layers, d_model, d_model) * d_model**-0.5)
        self.u = nn.Parameter(torch.randn(num_layers, n_heads, self.head_dim) * 0.02)  # r_w_bias
        self.v = nn.Parameter(torch.randn(num_layers, n_heads, self.head_dim) * 0.02)  # r_r_bias

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        if not (_is_arange(q_pos) and _is_arange(k_pos)):
            raise ValueError("xlnet relative attention expects contiguous positions (aranges) for the relative shift")
        n = q_pos.numel() + k_pos.numel() - 1
        # distances dmax, dmax - 1, ..., with dmax = last query - first key, kept on the device
        distances = (q_pos[-1] - k_pos[0]) - torch.arange(n, device=q_pos.device)
        return {"q_pos": q_pos, "k_pos": k_pos, "R": _sinusoid(distances, self.d_model, self.base)}

    def prepare_step(self, q_pos, k_pos, state):
        if q_pos.numel() == 1:  # one new token: its distances k_len - 1, ..., 0 come from a kept table
            return {"q_pos": q_pos, "k_pos": k_pos, "step_state": state}
        return super().prepare_step(q_pos, k_pos, state)

    def query_slice(self, prep, start, end):
        # R holds distances dmax, dmax - 1, ... for all queries; the block's last query is
        # (q_len - end) positions earlier, so its distances start that many rows further down
        lq, lk = prep["q_pos"].numel(), prep["k_pos"].numel()
        first = lq - end
        r = prep["R"][first : first + (end - start) + lk - 1]
        return {**prep, "q_pos": prep["q_pos"][start:end], "R": r}

    def key_slice(self, prep, k_end):
        # R of a block holds distances from its last query to key 0 down to its first query to the last
        # key: dropping the keys after k_end drops the smallest distances, the rows at the end of R
        n = prep["q_pos"].numel() + k_end - 1
        return {**prep, "k_pos": prep["k_pos"][:k_end], "R": prep["R"][:n]}

    def _decoding_r(self, state: dict, layer: int, k_len: int, dtype) -> torch.Tensor:
        """Projected ``R`` for distances ``0, 1, ..., k_len - 1`` (one cached decoding step), kept across steps.

        The table holds distances ``0, 1, ...`` projected once; it is extended (doubled) only when
        a step needs a longer distance, instead of projecting ``k_len`` rows at every step.
        """
        build = lambda d: _sinusoid(d, self.d_model, self.base).to(dtype) @ self.r_proj[layer].to(dtype)  # noqa: E731
        return distance_table(state, ("xlnet_r", layer, dtype), k_len, build, self.r_proj.device)[:k_len]

    def scores(self, q, k, prep, layer, attn):
        state = prep.get("step_state")
        if state is not None and q.shape[2] == 1:  # a cached decoding step: key j is at distance k_len - 1 - j
            r = self._decoding_r(state, layer, k.shape[2], q.dtype)
            return _one_query_terms(q, k, r, self.u[layer].to(q.dtype), self.v[layer].to(q.dtype))
        return self.scores_from_parts(q, k, self.score_parts(q, prep, layer, attn), prep)

    def score_parts(self, q, prep, layer, attn):
        """What the score terms are built from: the projected distances ``R W_r`` and the biases ``u``, ``v``."""
        return prep["R"].to(q.dtype) @ self.r_proj[layer].to(q.dtype), self.u[layer].to(q.dtype), self.v[layer].to(q.dtype)

    def block_parts(self, parts, prep, start, end, n):
        """Query block ``start:end``'s rows of the projected distances (against keys ``0:n``), as :meth:`query_slice`
        and :meth:`key_slice` cut ``R``; ``u`` and ``v`` whole."""
        r, u, v = parts
        first = prep["q_pos"].numel() - end
        return r[first : first + (end - start) + n - 1], u, v

    def scores_from_parts(self, q, k, parts, prep, scale: float = 1.0):
        """The score terms (c), (b)+(d) from ``parts``, times ``scale`` (applied to the small factors)."""
        r, u, v = parts
        h, dh = q.shape[1], q.shape[3]
        r = r.view(-1, h, dh).transpose(0, 1)  # (H, P, dh)
        qv = q + v[None, :, None, :]
        if scale != 1.0:
            u, qv = u * scale, qv.mul_(scale)
        content_bias = torch.einsum("hd,bhjd->bhj", u, k)[:, :, None, :]
        bd = qv @ r.transpose(-1, -2)  # (B, H, Lq, P)
        return content_bias + rel_shift(bd, k.shape[2])

    def extra_repr(self):
        return f"causal={self.causal}, base={self.base}"
