"""DeBERTa disentangled attention (He et al. 2021, "DeBERTa: Decoding-enhanced BERT with
Disentangled Attention", arXiv:2006.03654; log buckets from DeBERTa-v2).

Content and position are kept as separate vectors; the score of query ``i`` on
key ``j`` sums three of the four cross terms:

    A_ij = Q^c_i . K^c_j                   content -> content
         + Q^c_i . K^r_{delta(i,j)}         content -> position
         + K^c_j . Q^r_{delta(i,j)}         position -> content
    score_ij = A_ij / sqrt(3 d)

``K^r = P W_k`` and ``Q^r = P W_q`` project a shared table ``P`` of ``2k``
relative-position embeddings (layer-normed) with the layer's own key/query
weights (DeBERTa-v2's ``share_att_key``).  The position -> position term is
dropped: with relative positions only, it carries no information about the
tokens.  ``delta(i, j)`` is the relative position ``i - j``, log-bucketed
(:func:`deberta_log_bucket`: exact up to ``bucket_size/2``, logarithmic up to
``max_position``), shifted by ``k`` and clipped to ``[0, 2k)``.  The index of
the position -> content term follows the official implementation (and
``transformers``' ``DebertaV2``), which this module is tested against.

Sign convention: ``delta`` is built from ``i - j`` (query minus key), as in the paper; in the course's
convention (key minus query, :mod:`posenc_lib.attention.layer`) the row is ``clip(k - bucket(j - i), 0, 2k - 1)``.

Taught in notebooks/09_deberta.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from ..attention.layer import PositionScheme, check_positions
from .registry import register_scheme
from ..attention.step import distance_table
from ..checks import check_position_tensor, check_positive_int


def deberta_log_bucket(relative_position: torch.Tensor, bucket_size: int, max_position: int) -> torch.Tensor:
    """Log-bucketed relative positions (sign kept): exact for ``|r| <= bucket_size // 2``.

    Beyond, ``sign(r) * (mid + ceil(log(|r|/mid) / log((max_position - 1)/mid) * (mid - 1)))``
    with ``mid = bucket_size // 2``.  ``relative_position``: an integer tensor; returns int64 of the same shape.
    """
    check_position_tensor("relative_position", relative_position, integer=True, dim=None)
    bucket_size = check_positive_int("bucket_size", bucket_size)
    max_position = check_positive_int("max_position", max_position)
    mid = bucket_size // 2
    if mid < 2 or max_position - 1 <= mid:
        raise ValueError(
            f"need bucket_size >= 4 and max_position > bucket_size // 2 + 1, got bucket_size={bucket_size}, "
            f"max_position={max_position}"
        )
    rel = relative_position.long()
    sign = torch.sign(rel)
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs()).float()
    # Both logarithms in float32, as in the official code: at |r| = max_position - 1 the ratio is
    # exactly 1 only if numerator and denominator are rounded alike (a float64 denominator lets
    # ceil() jump one bucket too far for some sizes, e.g. bucket_size=44, max_position=128).
    log_max = torch.full((), (max_position - 1) / mid, dtype=torch.float32, device=rel.device).log()
    log_pos = torch.ceil(torch.log(abs_pos / mid) / log_max * (mid - 1)) + mid
    return torch.where(abs_pos <= mid, rel.float(), log_pos * sign).long()


def deberta_index(q_pos, k_pos, span: int, bucket_size: int | None, max_position: int | None) -> torch.Tensor:
    """``(q_len, k_len)`` index ``clip(delta(i, j) + span, 0, 2*span - 1)`` with ``delta = bucket(i - j)``."""
    rel = q_pos[:, None] - k_pos[None, :]
    if bucket_size is not None and bucket_size > 0:
        rel = deberta_log_bucket(rel, bucket_size, max_position)
    return (rel + span).clamp(0, 2 * span - 1)


def disentangled_scores(q, k, pos_q, pos_k, index, ends=None):
    """c2p + p2c terms (unscaled).

    ``q: (B, H, Lq, d)``, ``k: (B, H, Lk, d)``, ``pos_q, pos_k: (H, 2k, d)`` (projected
    relative embeddings), ``index: (Lq, Lk)`` -> ``(B, H, Lq, Lk)``.  ``ends``: :func:`clipped_ends` of
    ``index`` where the caller knows it.
    """
    if q.shape[2] == 1:  # one query (a cached decoding step): only its Lk buckets are needed
        return _one_query(q, k, pos_q, pos_k, index[0])
    c2p_all = q @ pos_k.transpose(-1, -2)  # (B, H, Lq, 2k): every query against every bucket
    p2c_all = pos_q @ k.transpose(-1, -2)  # (B, H, 2k, Lk): every bucket against every key
    left, right = clipped_ends(index) if ends is None else ends
    if left + (index.shape[1] - right) < index.shape[1] // 4:
        return _gathered(c2p_all, p2c_all, index)
    # keys far enough left (right) of every query of the block share the last (first) bucket: there the
    # terms are a row value plus a column value, a broadcast sum; only the band between needs a gather
    parts = []
    if left:
        c = int(index[0, 0])
        parts.append(c2p_all[..., c : c + 1] + p2c_all[:, :, c : c + 1, :left])
    if right > left:
        parts.append(_gathered(c2p_all, p2c_all[..., left:right], index[:, left:right]))
    if right < index.shape[1]:
        c = int(index[0, -1])
        parts.append(c2p_all[..., c : c + 1] + p2c_all[:, :, c : c + 1, right:])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _one_query(q, k, pos_q, pos_k, index):
    """The terms of one query row, ``q: (B, H, 1, d)``, for the bucket of each key, ``index: (Lk,)``.

    Products with all ``2k`` buckets would multiply every key by every bucket; here each key meets only its
    own bucket's position query (``Lk`` dot products per head instead of ``2k * Lk``).
    """
    b, h, _, d = q.shape
    # q . pos_k[index_j]: per head, every sequence's query against the head's buckets (q @ pos_k^T would first
    # copy pos_k once for every sequence, to broadcast it over the batch)
    c2p = torch.bmm(q.transpose(0, 1).reshape(h, b, d), pos_k.transpose(-1, -2))  # (H, B, 2k)
    c2p = c2p.transpose(0, 1)[:, :, None, :].index_select(-1, index)  # (B, H, 1, Lk)
    # k_j . pos_q[index_j], as a product and a sum over d: einsum would lay out a transposed copy of every key first
    p2c = (k * pos_q.index_select(1, index)).sum(-1)
    return c2p.add_(p2c[:, :, None, :])


def _gathered(c2p_all, p2c_all, index):
    b, h, lq, _ = c2p_all.shape
    idx = index.expand(b, h, lq, index.shape[1])
    c2p = c2p_all.gather(-1, idx)  # c2p[i, j] = q_i . pos_k[index_ij]
    # p2c[i, j] = k_j . pos_q[index_ij]: gather the (B, H, 2k, Lk) products along the bucket axis, which
    # writes the (Lq, Lk) layout directly (no transposed copy)
    return c2p.add_(p2c_all.gather(-2, idx))


def _ends_of(prep: dict) -> tuple[int, int]:
    """:func:`clipped_ends` of ``prep["index"]``, worked out once per forward pass for each block's slice of it (the
    layers of a stack share them; the cache lives in the context :meth:`DebertaDisentangled.prepare` made)."""
    index, cache = prep["index"], prep.get("ends_cache")
    if cache is None or torch.compiler.is_compiling():  # compiled: the full range, no key made of sizes
        return clipped_ends(index)
    key = (index.data_ptr(), tuple(index.shape), index.stride())
    if key not in cache:
        cache[key] = clipped_ends(index)
    return cache[key]


def clipped_ends(index: torch.Tensor) -> tuple[int, int]:
    """``(left, right)``: columns ``< left`` hold ``index[0, 0]`` in every row and columns ``>= right`` hold
    ``index[0, -1]`` (the clipped distances of a long block); ``(0, Lk)`` off the CPU (no host read)."""
    lk = index.shape[1]
    if index.device.type != "cpu" or index.numel() == 0 or torch.compiler.is_compiling():  # no host read
        return 0, lk
    same_left = (index == index[:1, :1]).all(0)
    same_right = (index == index[:1, -1:]).all(0)
    left = int(same_left.long().cumprod(0).sum())
    right = lk - int(same_right.flip(0).long().cumprod(0).sum())
    return left, max(left, right)


@register_scheme(kind="relative", group="classic", year=2021, arxiv="2006.03654",
                 paper="He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention")
class DebertaDisentangled(PositionScheme):
    """A shared, layer-normed table of ``2 * position_buckets`` relative embeddings per stack."""

    name = "deberta"
    clipped_sides = True
    enters = "scores"
    score_terms = 3

    def __init__(
        self, d_model, n_heads, num_layers, causal=False, position_buckets: int = 32, max_relative_positions: int = 128
    ):
        super().__init__(d_model, n_heads, num_layers, causal)
        self.position_buckets = check_positive_int("position_buckets", position_buckets)
        self.max_relative_positions = check_positive_int("max_relative_positions", max_relative_positions)
        if self.position_buckets < 4 or self.max_relative_positions <= self.position_buckets // 2 + 1:
            raise ValueError(
                "need position_buckets >= 4 and max_relative_positions > position_buckets // 2 + 1, got "
                f"position_buckets={position_buckets}, max_relative_positions={max_relative_positions}"
            )
        self.rel_embeddings = nn.Embedding(2 * self.position_buckets, d_model)
        nn.init.normal_(self.rel_embeddings.weight, std=0.02)
        self.rel_norm = nn.LayerNorm(d_model)

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        index = deberta_index(q_pos, k_pos, self.position_buckets, self.position_buckets, self.max_relative_positions)
        rel = self.rel_norm(self.rel_embeddings.weight)
        return {"q_pos": q_pos, "k_pos": k_pos, "index": index, "rel": rel, "ends_cache": {}}

    def prepare_step(self, q_pos, k_pos, state):
        """A decoding step of one query: its row of the index read from a table of every distance's bucket, kept in
        ``state`` (the query minus each key, ``0, 1, ...``; made once, longer when a step needs it), instead of
        bucketing the distances anew; the layer-normed table of relative embeddings is made only when a layer first
        projects it (:meth:`scores` keeps the projections)."""
        if q_pos.shape[0] != 1:
            return super().prepare_step(q_pos, k_pos, state)
        span, buckets, most = self.position_buckets, self.position_buckets, self.max_relative_positions
        build = lambda d: deberta_index(d, d[:1], span, buckets, most)[:, 0]  # noqa: E731 (query d after key 0)
        table = distance_table(state, "deberta_index", k_pos.shape[0], build, q_pos.device)
        return {"q_pos": q_pos, "k_pos": k_pos, "index": table[q_pos - k_pos][None], "step_state": state}

    def query_slice(self, prep, start, end):
        return {**prep, "q_pos": prep["q_pos"][start:end], "index": prep["index"][start:end]}

    def key_slice(self, prep, k_end):
        return {**prep, "k_pos": prep["k_pos"][:k_end], "index": prep["index"][:, :k_end]}

    def key_range(self, prep, start, end):
        return {**prep, "k_pos": prep["k_pos"][start:end], "index": prep["index"][:, start:end]}

    def block_sides(self, prep):
        """``(lo, hi, edges)`` of a query block's context: keys ``0:lo`` at one bucket in every row (far enough to be
        clipped), keys ``hi:`` at another; ``edges``, those two buckets."""
        index = prep["index"]
        lo, hi = _ends_of(prep)
        if index.numel() == 0:
            return lo, hi, (None, None)
        return lo, hi, (int(index[0, 0]), int(index[0, -1]))

    def side_terms(self, q, parts, edge, scale):
        """Keys all at bucket ``edge``: c2p is the row's ``q_i . K^r_edge``, p2c the key's ``k_j . Q^r_edge``, so the
        scaled terms are ``row_i + scale * u . k_j`` with ``u = Q^r_edge``."""
        pos_q, pos_k = parts
        row = (q @ pos_k[:, edge, :, None]).squeeze(-1) * scale  # (B, H, rows)
        return row, pos_q[None, :, edge, None, :]

    def scores(self, q, k, prep, layer, attn):
        state = prep.get("step_state")  # decoding with a cache: the projections do not change between steps
        key = ("deberta_pos", layer, q.dtype)
        if state is not None and key in state:
            pos_q, pos_k = state[key]
        else:
            pos_q, pos_k = self.score_parts(q, prep, layer, attn)
            if state is not None:
                state[key] = pos_q, pos_k
        return disentangled_scores(q, k, pos_q, pos_k, prep["index"], _ends_of(prep) if q.shape[2] > 1 else None)

    def score_parts(self, q, prep, layer, attn):
        """What the score terms are built from: the relative embeddings through this layer's q and k projections."""
        rel = (prep["rel"] if "rel" in prep else self.rel_norm(self.rel_embeddings.weight)).to(q.dtype)
        h, dh = self.n_heads, self.head_dim
        pos_q = attn.q_proj(rel).view(-1, h, dh).transpose(0, 1)  # (H, 2k, dh)
        pos_k = attn.k_proj(rel).view(-1, h, dh).transpose(0, 1)
        return pos_q, pos_k

    def block_parts(self, parts, prep, start, end, n):
        """The projected tables depend on the layer only: every query block uses them whole."""
        return parts

    def scores_from_parts(self, q, k, parts, prep, scale: float = 1.0):
        """c2p + p2c from the projected tables ``parts``, times ``scale`` (applied to the tables)."""
        pos_q, pos_k = parts
        if scale != 1.0:
            pos_q, pos_k = pos_q * scale, pos_k * scale
        return disentangled_scores(q, k, pos_q, pos_k, prep["index"], _ends_of(prep))

    def extra_repr(self):
        return (
            f"causal={self.causal}, position_buckets={self.position_buckets}, "
            f"max_relative_positions={self.max_relative_positions}"
        )
