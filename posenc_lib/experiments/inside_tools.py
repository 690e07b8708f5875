"""Measurements inside a model: RoPE's decay bound, position probes, rotary bands, attention sinks.

The tools of notebooks/16_inside_a_trained_model.ipynb (the experiment that trains the models is
posenc_lib/experiments/inside.py).  Each works on any :class:`~posenc_lib.models.causal_lm.CausalLM`:

* **RoPE's long-term decay** (Su et al. 2021, RoFormer, arXiv:2104.09864, section 3.4.3).  With pair ``j``
  of a query and a key read as complex numbers, ``h_j = q_j conj(k_j)``, ``r`` the relative position and
  ``S_j = sum_{l<j} exp(i r theta_l)``, summation by parts gives::

      |sum_j h_j exp(i r theta_j)| <= (max_j |h_{j+1} - h_j|) * sum_{j=1}^{d/2} |S_j|     (h_{d/2} = 0)

  :func:`relative_upper_bound` is the content-free factor ``(1/(d/2)) sum_j |S_j|`` (RoFormer's Figure 2).
  It is a bound, not an expectation: for Gaussian ``q`` and ``k = rho q + sqrt(1 - rho^2) e``,
  ``E[q . R_r k] = 2 rho sum_j cos(r theta_j)`` (:func:`expected_rope_score`): zero at every distance for
  independent vectors, a decaying curve only when they are correlated.
* **Linear position probes** (Haviv, Ram, Press, Izsak & Levy 2022, "Transformer Language Models without
  Positional Encodings Still Learn Positional Information", arXiv:2203.16634): :func:`probe_position` fits a
  multinomial logistic regression (and a least-squares line) from hidden states to absolute positions and
  scores it on held-out tokens; :func:`hidden_states` collects every layer's states.
* **Which rotary pairs carry what** (Barbero, Vitvitskyi, Perivolaropoulos, Pascanu & Velickovic 2024, "Round
  and Round We Go! What makes Rotary Positional Encodings useful?", arXiv:2410.06205): :func:`qk_pair_norms`
  (the norm of each rotation pair of the queries and keys), :class:`BandRoPE` (RoPE with some pairs
  *frozen*, frequency 0 as in p-RoPE, or *dropped*, their query and key components zeroed),
  :func:`score_by_distance` (the mean score of a trained model at each distance), and what makes it fall:
  :func:`pair_products_by_distance` (the unrotated ``E[conj(q_j) k_j]`` at each distance) and :func:`decay_parts`
  (the fall split into the rotation of a distance-free resemblance, the change of the products, and both).
* **Attention sinks** (Xiao, Tian, Chen, Han & Lewis 2024, "Efficient Streaming Language Models with Attention
  Sinks", arXiv:2309.17453; Gu, Pang, Du, Liu, Zhang, Lin & Wang 2025, "When Attention Sink Emerges in Language
  Models: An Empirical View", arXiv:2410.10781): :func:`first_token_mass`, and :func:`stream_nll`, a rolling
  key/value cache that keeps the first ``sinks`` tokens and the latest ones, with positions counted inside
  the cache as StreamingLLM does, optionally with heads blocked from the first tokens; :func:`recompute_nll` is the
  sliding window recomputed at every token.

Relative positions follow the course's convention (posenc_lib/attention/layer.py): ``r = n - m``, the key's
position minus the query's.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..models.causal_lm import CausalLM
from ..schemes.rotary import RotaryScheme
from ..checks import check_choice, check_positive_int

BAND_MODES = ("freeze", "drop")


# -- 1. RoPE's bound and the expected score (numpy) ------------------------------------------------
def rope_thetas(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """``(head_dim // 2,)`` float64 frequencies ``theta_j = base^(-2j/head_dim)``, fast to slow."""
    head_dim = check_positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (pairs of dimensions rotate), got {head_dim}")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")
    return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def partial_sums(distances, thetas: np.ndarray) -> np.ndarray:
    """``(len(distances), d/2)`` complex ``S_j = sum_{l < j} exp(i r theta_l)`` for ``j = 1 .. d/2``."""
    r = np.asarray(distances, dtype=np.float64)
    return np.cumsum(np.exp(1j * r[:, None] * np.asarray(thetas)[None, :]), axis=1)


def relative_upper_bound(distances, head_dim: int = 128, base: float = 10000.0) -> np.ndarray:
    """RoFormer's relative upper bound ``(1/(d/2)) sum_{j=1}^{d/2} |S_j|`` at each distance (float64)."""
    return np.abs(partial_sums(distances, rope_thetas(head_dim, base))).mean(axis=1)


def pair_products(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``h_j = q_j conj(k_j)`` of real vectors ``(..., d)`` whose pairs are interleaved ``(x0, x1), (x2, x3), ...``."""
    q, k = np.asarray(q, dtype=np.float64), np.asarray(k, dtype=np.float64)
    if q.shape != k.shape or q.shape[-1] % 2:
        raise ValueError(f"q and k must have one even last dimension and equal shapes, got {q.shape} and {k.shape}")
    qc, kc = q[..., 0::2] + 1j * q[..., 1::2], k[..., 0::2] + 1j * k[..., 1::2]
    return qc * np.conj(kc)


def rope_score(q: np.ndarray, k: np.ndarray, distances, base: float = 10000.0) -> np.ndarray:
    """``(..., len(distances))`` the rotary score ``<R_m q, R_n k> = Re sum_j conj(h_j) exp(i r theta_j)``, ``r = n - m``
    (interleaved pairs, as in RoFormer)."""
    h = pair_products(q, k)
    thetas = rope_thetas(2 * h.shape[-1], base)
    waves = np.exp(1j * np.asarray(distances, dtype=np.float64)[:, None] * thetas[None, :])  # (r, d/2)
    return (np.conj(h) @ waves.T).real


def abel_bound(q: np.ndarray, k: np.ndarray, distances, base: float = 10000.0) -> np.ndarray:
    """RoFormer's bound for one pair of vectors ``(..., d)``: ``max_j |h_{j+1} - h_j| * sum_j |S_j|`` at each distance."""
    h = pair_products(q, k)
    steps = np.abs(np.diff(np.concatenate([h, np.zeros_like(h[..., :1])], axis=-1), axis=-1)).max(axis=-1)
    sums = np.abs(partial_sums(distances, rope_thetas(2 * h.shape[-1], base))).sum(axis=1)  # (r,)
    return steps[..., None] * sums


def expected_rope_score(distances, head_dim: int = 128, base: float = 10000.0, rho: float = 0.0) -> np.ndarray:
    """``E[q . R_r k]`` for ``q ~ N(0, I_d)`` and ``k = rho q + sqrt(1 - rho^2) e`` (``e`` independent):
    ``2 rho sum_j cos(r theta_j)``, since ``E[q^T R q] = trace(R)`` and each 2x2 block has trace ``2 cos``."""
    if not -1.0 <= rho <= 1.0:
        raise ValueError(f"rho is a correlation in [-1, 1], got {rho!r}")
    r = np.asarray(distances, dtype=np.float64)
    return 2.0 * rho * np.cos(r[:, None] * rope_thetas(head_dim, base)[None, :]).sum(axis=1)


# -- 2. probing hidden states for position ---------------------------------------------------------
@torch.no_grad()
def hidden_states(model: CausalLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """``[layer 0 (the input to the first block), after block 1, ...]``, each ``(batch, T, d_model)`` float32."""
    model.eval()
    states: list[torch.Tensor] = []
    hooks = [model.blocks[0].register_forward_pre_hook(lambda _m, args: states.append(args[0].detach()))]
    hooks += [b.register_forward_hook(lambda _m, _a, out: states.append(out[0].detach())) for b in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return states


def probe_position(train_x: torch.Tensor, train_pos: torch.Tensor, test_x: torch.Tensor, test_pos: torch.Tensor, *,
                   classes: int, steps: int = 100, l2: float = 1e-3) -> dict[str, float]:  # fmt: skip
    """Fit linear probes from features to absolute positions; score them on held-out features.

    ``train_x: (n, d)``, ``train_pos: (n,)`` integer positions in ``[0, classes)``; the same for ``test``.
    Features are standardised with the training mean and deviation.  Returns ``accuracy`` (multinomial
    logistic regression, L-BFGS for ``steps`` iterations, L2 penalty ``l2``), ``chance`` (the accuracy of always
    answering the commonest training position), ``r2`` and ``mae`` (least-squares line to the position,
    in positions) on the test set.
    """
    steps = check_positive_int("steps", steps)
    for name, x, p in (("train", train_x, train_pos), ("test", test_x, test_pos)):
        if x.dim() != 2 or p.shape != (x.shape[0],) or x.shape[0] < 2:
            raise ValueError(f"{name}_x must be (n >= 2, d) with {name}_pos (n,), got {tuple(x.shape)} and "
                             f"{tuple(p.shape)}")  # fmt: skip
        if p.dtype not in (torch.int32, torch.int64) or int(p.min()) < 0 or int(p.max()) >= classes:
            raise ValueError(f"{name}_pos must hold integer positions in [0, {classes}), got {p.dtype} in "
                             f"[{p.min().item()}, {p.max().item()}]")  # fmt: skip
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train and test features differ in width: {train_x.shape[1]} vs {test_x.shape[1]}")
    mu, sd = train_x.double().mean(0), train_x.double().std(0).clamp_min(1e-6)
    xtr = torch.cat([(train_x.double() - mu) / sd, torch.ones(len(train_x), 1, dtype=torch.float64)], 1)
    xte = torch.cat([(test_x.double() - mu) / sd, torch.ones(len(test_x), 1, dtype=torch.float64)], 1)
    w = torch.zeros(xtr.shape[1], classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe", tolerance_grad=1e-9)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(xtr @ w, train_pos) + l2 * w[:-1].pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        accuracy = float(((xte @ w).argmax(1) == test_pos).double().mean())
        fit = torch.linalg.lstsq(xtr, train_pos.double()[:, None]).solution
        pred = (xte @ fit)[:, 0]
        y = test_pos.double()
        r2 = 1.0 - float(((pred - y) ** 2).sum() / ((y - y.mean()) ** 2).sum().clamp_min(1e-12))
        mae = float((pred - y).abs().mean())
    chance = float((test_pos == torch.bincount(train_pos, minlength=classes).argmax()).double().mean())
    return {"accuracy": accuracy, "chance": chance, "r2": r2, "mae": mae}


def probe_layers(model: CausalLM, train_windows: torch.Tensor, test_windows: torch.Tensor, *, steps: int = 100
                 ) -> dict[str, list[float]]:  # fmt: skip
    """:func:`probe_position` on every layer's hidden states: windows ``(n, T)`` of token ids, the probe's
    classes are the ``T`` positions.  Returns lists over layers 0 .. num_layers."""
    t = train_windows.shape[1]
    if test_windows.shape[1] != t:
        raise ValueError(f"train and test windows differ in length: {t} vs {test_windows.shape[1]}")
    htr, hte = hidden_states(model, train_windows), hidden_states(model, test_windows)
    ptr = torch.arange(t).repeat(train_windows.shape[0])
    pte = torch.arange(t).repeat(test_windows.shape[0])
    rows = [probe_position(a.reshape(-1, a.shape[-1]), ptr, b.reshape(-1, b.shape[-1]), pte, classes=t, steps=steps)
            for a, b in zip(htr, hte)]  # fmt: skip
    return {key: [round(r[key], 5) for r in rows] for key in rows[0]}


# -- 3. rotary pairs -------------------------------------------------------------------------------
def pair_index(head_dim: int, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two dimensions of each rotation pair ``j = 0 .. head_dim/2 - 1`` (pair 0 turns fastest):
    ``(2j, 2j + 1)`` interleaved, ``(j, j + head_dim/2)`` half-split (GPT-NeoX, Llama)."""
    half = head_dim // 2
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    j = torch.arange(half)
    return (2 * j, 2 * j + 1) if interleaved else (j, j + half)


def pair_norms(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """``(..., head_dim) -> (..., head_dim // 2)``: the length of each rotation pair (a rotation keeps it)."""
    a, b = pair_index(x.shape[-1], interleaved)
    return torch.sqrt(x[..., a] ** 2 + x[..., b] ** 2)


@torch.no_grad()
def queries_and_keys(model: CausalLM, tokens: torch.Tensor, *, rotated: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(q, k)``, both ``(batch, heads, T, head_dim)``, as projected (``rotated=False``) or after
    the layer's scheme has rotated them at positions ``0 .. T-1`` (the scores' inputs)."""
    model.eval()
    got: list[torch.Tensor] = []
    hooks = [proj.register_forward_hook(lambda _m, _a, out, attn=b.attn: got.append(attn.split(out).detach()))
             for b in model.blocks for proj in (b.attn.q_proj, b.attn.k_proj)]  # fmt: skip
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    pairs = list(zip(got[0::2], got[1::2]))
    if rotated:
        pos = torch.arange(tokens.shape[1])
        pairs = [scheme.rotate(q, k, scheme.prepare(pos, pos), index) for (q, k), (scheme, index) in zip(pairs, model.scheme_per_layer)]
    return pairs


def qk_pair_norms(model: CausalLM, tokens: torch.Tensor, interleaved: bool = False) -> dict[str, list]:
    """Mean norm of each rotation pair of the queries and keys, per layer and head:
    ``{"q": (layers, heads, pairs), "k": ...}`` as nested lists (a rotation does not change them)."""
    out: dict[str, list] = {"q": [], "k": []}
    for q, k in queries_and_keys(model, tokens):
        for key, x in (("q", q), ("k", k)):
            norms = pair_norms(x, interleaved).mean(dim=(0, 2))  # (heads, pairs)
            out[key].append([[round(float(v), 5) for v in head] for head in norms])
    return out


def score_by_distance(model: CausalLM, tokens: torch.Tensor, digits: int | None = 5) -> list[list[float]]:
    """Mean content score ``q_m . k_n / sqrt(head_dim)`` (after the model's rotation, before any bias) at each
    distance ``m - n = 0 .. T-1`` (key at or before the query), per layer, over windows, queries and heads;
    rounded to ``digits`` decimals (``None``: not rounded)."""
    t = tokens.shape[1]
    rel = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).flatten()  # m - n
    seen = rel >= 0
    counts = torch.arange(t, 0, -1, dtype=torch.float64)  # pairs at distance 0 .. t-1
    rows = []
    for q, k in queries_and_keys(model, tokens, rotated=True):
        s = ((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])).double().mean(dim=(0, 1)).flatten()
        sums = torch.zeros(t, dtype=torch.float64).index_add_(0, rel[seen], s[seen])
        rows.append([float(v) if digits is None else round(float(v), digits) for v in sums / counts])
    return rows


@torch.no_grad()
def pair_products_by_distance(model: CausalLM, tokens: torch.Tensor, interleaved: bool = False) -> np.ndarray:
    """``(layers, T, pairs)`` complex128: the mean *unrotated* pair product ``p_j(r) = E[conj(q_j) k_j] / sqrt(head_dim)``
    over windows, heads and the query/key pairs at distance ``r = m - n = 0 .. T-1`` (key ``r`` places before the
    query), with pair ``j`` of a vector read as the complex number ``x_a + i x_b`` (:func:`pair_index`).

    For RoPE, :func:`score_from_pair_products` turns it back into :func:`score_by_distance`'s mean score."""
    t = tokens.shape[1]
    rows = []
    for q, k in queries_and_keys(model, tokens):
        a, b = pair_index(q.shape[-1], interleaved)
        qc = torch.complex(q[..., a].double(), q[..., b].double())
        kc = torch.complex(k[..., a].double(), k[..., b].double())
        by_r = [(qc[:, :, r:].conj() * kc[:, :, : t - r]).mean(dim=(0, 1, 2)) for r in range(t)]
        rows.append(torch.stack(by_r) / math.sqrt(q.shape[-1]))
    return torch.stack(rows).numpy()


def _rope_waves(distances: int, thetas: np.ndarray, sign: int) -> np.ndarray:
    return np.exp(sign * 1j * np.arange(distances)[:, None] * np.asarray(thetas, dtype=np.float64)[None, :])


def score_from_pair_products(p: np.ndarray, thetas: np.ndarray, sign: int = -1) -> np.ndarray:
    """``(..., T)``: ``sum_j Re(p_j(r) exp(sign i r theta_j))`` of pair products ``p (..., T, pairs)`` at distances
    ``r = 0 .. T-1``.  With the key ``r`` places before the query, the course's relative position is ``n - m = -r``:
    ``sign = -1`` is RoPE's score (``sign = +1`` exists to show that the other sign does not fit)."""
    p = np.asarray(p)
    if sign not in (-1, 1):
        raise ValueError(f"sign must be -1 or +1, got {sign!r}")
    if p.ndim < 2 or p.shape[-1] != len(thetas):
        raise ValueError(f"pair products must be (..., distances, pairs) with {len(thetas)} pairs, got shape {p.shape}")
    return (p * _rope_waves(p.shape[-2], thetas, sign)).real.sum(axis=-1)


#: the parts of :func:`decay_parts`, which add up to the actual score's terms
DECAY_PARTS = ("rotation", "content", "interaction")


def decay_parts(p: np.ndarray, thetas: np.ndarray, near: int = 4, far_from: int | None = None
                ) -> dict[str, dict[str, np.ndarray]]:  # fmt: skip
    """Split the fall with distance of RoPE's mean score into what the rotation does and what the queries and keys do.

    ``p (..., T, pairs)``: pair products by distance (:func:`pair_products_by_distance`); ``pbar_j`` is their mean over
    the ``T`` distances.  Per pair ``j`` and distance ``r`` (``w_j(r) = exp(-i r theta_j)``), exactly::

        Re(p_j w_j) = Re(pbar_j w_j)                      rotation: a resemblance that does not change with distance, turned
                    + Re(p_j) - Re(pbar_j)                 content: how the unrotated products change with distance
                    + Re((p_j - pbar_j)(w_j - 1))          interaction: the change, turned

    Returns ``"actual"`` and each part of :data:`DECAY_PARTS` as ``terms`` ``(..., T, pairs)``, and their ``fall``:
    the mean over distances ``0 .. near-1`` minus the mean over ``far_from .. T-1`` (default ``T // 2``), per pair
    (``fall_by_pair``, ``(..., pairs)``) and summed over pairs (``fall``, ``(...)``)."""
    p = np.asarray(p, dtype=np.complex128)
    if p.ndim < 2 or p.shape[-1] != len(thetas):
        raise ValueError(f"pair products must be (..., distances, pairs) with {len(thetas)} pairs, got shape {p.shape}")
    t = p.shape[-2]
    far_from = t // 2 if far_from is None else far_from
    if not 1 <= near <= far_from < t:
        raise ValueError(f"need 1 <= near <= far_from < T={t} distances, got near={near}, far_from={far_from}")
    w = _rope_waves(t, thetas, -1)
    pbar = p.mean(axis=-2, keepdims=True)
    terms = {"actual": (p * w).real, "rotation": (pbar * w).real, "content": (p - pbar).real,
             "interaction": ((p - pbar) * (w - 1)).real}  # fmt: skip
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, x in terms.items():
        by_pair = x[..., :near, :].mean(axis=-2) - x[..., far_from:, :].mean(axis=-2)
        out[name] = {"terms": x, "fall_by_pair": by_pair, "fall": by_pair.sum(axis=-1)}
    return out


class BandRoPE(RotaryScheme):
    """RoPE with some rotation pairs ablated, for reading a trained RoPE model at inference.

    ``pairs``: the pair indices (0 turns fastest); ``mode``: ``"freeze"`` sets their frequency to zero, so they
    stop rotating and carry no position (what p-RoPE does to its slowest pairs; lesson 15), ``"drop"`` zeroes
    their query and key components, so they leave the score altogether.  Every other pair is rotated exactly
    as by :class:`RotaryScheme`.  Install on a model with ``model.set_scheme([(BandRoPE, options)] * num_layers)``.
    """

    name = "rope-band"

    def __init__(self, d_model, n_heads, num_layers, causal=False, pairs: Sequence[int] = (), mode: str = "freeze",
                 base: float = 10000.0, interleaved: bool = True):  # fmt: skip
        super().__init__(d_model, n_heads, num_layers, causal, base=base, interleaved=interleaved)
        check_choice("mode", mode, BAND_MODES)
        half = self.head_dim // 2
        pairs = [int(p) for p in pairs]
        bad = [p for p in pairs if not 0 <= p < half]
        if bad or len(set(pairs)) != len(pairs):
            raise ValueError(f"pairs must be distinct indices in [0, {half}) (head_dim {self.head_dim}), got {list(pairs)}")
        a, b = pair_index(self.head_dim, interleaved)
        band = torch.zeros(self.head_dim, dtype=torch.bool)
        band[a[pairs]] = True
        band[b[pairs]] = True
        self.register_buffer("band", band, persistent=False)
        self.pairs, self.mode = tuple(pairs), mode

    def prepare(self, q_pos, k_pos):
        prep = super().prepare(q_pos, k_pos)
        if self.mode == "freeze":
            prep["cos"] = prep["cos"].masked_fill(self.band, 1.0)
            prep["sin"] = prep["sin"].masked_fill(self.band, 0.0)
        return prep

    def rotate(self, q, k, prep, layer):
        q, k = super().rotate(q, k, prep, layer)
        if self.mode == "drop":
            q, k = q.masked_fill(self.band, 0.0), k.masked_fill(self.band, 0.0)
        return q, k

    def extra_repr(self):
        return f"{super().extra_repr()}, pairs={list(self.pairs)}, mode={self.mode!r}"


@torch.no_grad()
def mean_nll(model: CausalLM, ids: torch.Tensor, length: int, *, max_windows: int | None = None, batch: int = 16) -> float:
    """Mean next-token NLL (nats) over non-overlapping windows of ``length`` tokens of the stream ``ids``."""
    length = check_positive_int("length", length)
    n = (ids.numel() - 1) // length
    if max_windows is not None:
        n = min(n, check_positive_int("max_windows", max_windows))
    if n < 1:
        raise ValueError(f"{ids.numel()} tokens hold no window of length {length} (plus one target)")
    model.eval()
    x, y = ids[: n * length].view(n, length), ids[1 : n * length + 1].view(n, length)
    total = 0.0
    for i in range(0, n, batch):
        logits = model(x[i : i + batch])
        total += float(F.cross_entropy(logits.transpose(1, 2), y[i : i + batch], reduction="sum"))
    return total / (n * length)


# -- 4. attention sinks and a rolling cache --------------------------------------------------------
@torch.no_grad()
def first_token_mass(model: CausalLM, tokens: torch.Tensor, from_query: int = 1) -> dict[str, object]:
    """Attention weight on key 0, per layer and head, averaged over windows and the queries
    ``from_query .. T-1``; with ``uniform``, the same average if every query spread its weight evenly
    over the keys it may see (``1 / (m + 1)`` for a causal model)."""
    t = tokens.shape[1]
    if not 1 <= from_query < t:
        raise ValueError(f"from_query must lie in [1, {t}) for windows of {t} tokens, got {from_query}")
    model.eval()
    _, weights = model(tokens, need_weights=True)
    mass = [w[:, :, from_query:, 0].mean(dim=(0, 2)).tolist() for w in weights]  # (layers, heads)
    uniform = float((1.0 / torch.arange(from_query + 1, t + 1, dtype=torch.float64)).mean()) if model.causal else 1 / t
    return {"mass": [[round(v, 5) for v in layer] for layer in mass], "uniform": round(uniform, 5),
            "from_query": from_query}  # fmt: skip


@torch.no_grad()
def first_token_swaps(model: CausalLM, tokens: torch.Tensor, filler: int) -> dict[str, object]:
    """Is the weight on the first token about its place or its content?  Per layer and head, the mean
    attention weight of queries ``2 .. T-1`` on

    * ``first``: key 0 of the windows as they are;
    * ``replaced``: key 0 after its character is replaced by ``filler`` (same place, other content);
    * ``new_first`` and ``moved``: after ``filler`` is put in front (the windows' last character drops), the
      weight on the filler, now first, and on the original first character, now at place 1 (same content,
      other place).

    ``uniform`` is the weight a query would give any one key if it spread its attention evenly."""
    t = tokens.shape[1]
    if t < 3:
        raise ValueError(f"windows need at least 3 tokens to compare keys 0 and 1 from queries 2.., got {t}")
    model.eval()
    replaced = tokens.clone()
    replaced[:, 0] = filler
    shifted = torch.cat([torch.full_like(tokens[:, :1], filler), tokens[:, :-1]], dim=1)

    def mass(x: torch.Tensor, key: int) -> list[list[float]]:
        _, weights = model(x, need_weights=True)
        return [[round(v, 5) for v in w[:, :, 2:, key].mean(dim=(0, 2)).tolist()] for w in weights]

    uniform = float((1.0 / torch.arange(3, t + 1, dtype=torch.float64)).mean()) if model.causal else 1 / t
    return {"first": mass(tokens, 0), "replaced": mass(replaced, 0), "new_first": mass(shifted, 0),
            "moved": mass(shifted, 1), "uniform": round(uniform, 5), "filler": int(filler)}  # fmt: skip


def _check_streamable(model: CausalLM) -> None:
    for scheme, _ in model.scheme_per_layer:
        if scheme.enters == "input" or scheme.adds_scores or scheme.adds_values:
            raise ValueError(f"the rolling cache here handles schemes that rotate q, k or add a bias (rope, alibi, "
                             f"none); {scheme.name!r} enters at {scheme.enters!r}")  # fmt: skip
    if not model.causal:
        raise ValueError("a rolling cache needs a causal model (MaskedLM sees the future)")


def _check_blocked(model: CausalLM, blocked, first: int, cache: int | None, sinks: int) -> dict[int, list[int]]:
    layers, heads = len(model.blocks), model.dims[1]
    if not isinstance(blocked, dict) or not blocked:
        raise ValueError(f"blocked must map layers (0..{layers - 1}) to lists of heads (0..{heads - 1}), got {blocked!r}")
    out = {}
    for layer, hs in blocked.items():
        hs = [int(h) for h in hs]
        if not isinstance(layer, int) or not 0 <= layer < layers or not hs or any(not 0 <= h < heads for h in hs):
            raise ValueError(f"blocked must map layers (0..{layers - 1}) to lists of heads (0..{heads - 1}), got "
                             f"{layer!r}: {hs}")  # fmt: skip
        out[layer] = sorted(set(hs))
    if first < 1 or (cache is not None and first > sinks):
        limit = "the cache's kept first tokens (sinks)" if cache is not None else "the stream"
        raise ValueError(f"first={first}: blocked heads need 1 or more first tokens, within {limit}"
                         + (f" (sinks={sinks})" if cache is not None else ""))  # fmt: skip
    return out


@torch.no_grad()
def stream_nll(model: CausalLM, ids: torch.Tensor, *, cache: int | None, sinks: int = 0,
               blocked: dict[int, Sequence[int]] | None = None, first: int | None = None) -> torch.Tensor:  # fmt: skip
    """Per-step NLL ``(T - 1,)`` (mean over streams) of reading ``ids (streams, T)`` one token at a time.

    ``cache=None``: every earlier token stays, at its own position (dense attention).  Otherwise a rolling
    cache of ``cache`` tokens: the first ``sinks`` tokens of the stream and the latest ``cache - sinks``; keys
    are kept unrotated and every cached token takes its slot in the cache as its position (StreamingLLM's
    rule, so no distance exceeds ``cache - 1``).  Step ``t`` predicts token ``t + 1``.

    ``blocked``: ``{layer: heads}`` (from 0) that may not attend to the stream's first ``first`` tokens (default
    ``sinks``; with a cache, at most ``sinks``, the kept ones) from any later query: those heads' weights are
    spread over the other keys as if the first tokens were not there, in every step, so later tokens' cached states
    are computed that way too.
    """
    _check_streamable(model)
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids must be (streams, T >= 2) token ids, got shape {tuple(ids.shape)}")
    if cache is not None:
        cache = check_positive_int("cache", cache)
        if not 0 <= sinks < cache:
            raise ValueError(f"sinks must lie in [0, cache={cache}), got {sinks}")
    elif sinks:
        raise ValueError("sinks needs a cache size: every token is kept without one")
    first = sinks if first is None else first
    if blocked is not None:
        blocked = _check_blocked(model, blocked, first, cache, sinks)
    model.eval()
    d = model.dims[0]
    layers = len(model.blocks)
    keys: list[torch.Tensor | None] = [None] * layers
    values: list[torch.Tensor | None] = [None] * layers
    nll = torch.zeros(ids.shape[1] - 1, dtype=torch.float64)
    for t in range(ids.shape[1] - 1):
        x = model.embed(ids[:, t : t + 1]) * math.sqrt(d)  # (streams, 1, d)
        for li, (block, (scheme, index)) in enumerate(zip(model.blocks, model.scheme_per_layer)):
            attn = block.attn
            h = block.norm1(x)
            q, k, v = attn.split(attn.q_proj(h)), attn.split(attn.k_proj(h)), attn.split(attn.v_proj(h))
            keys[li] = k if keys[li] is None else torch.cat((keys[li], k), dim=2)
            values[li] = v if values[li] is None else torch.cat((values[li], v), dim=2)
            if cache is not None and keys[li].shape[2] > cache:  # evict the oldest token after the sinks
                keep = torch.cat((torch.arange(sinks), torch.arange(keys[li].shape[2] - cache + sinks, keys[li].shape[2])))
                keys[li], values[li] = keys[li][:, :, keep], values[li][:, :, keep]
            n = keys[li].shape[2]
            slots = torch.arange(n)
            _, kr = scheme.rotate(keys[li], keys[li], scheme.prepare(slots, slots), index)
            prep = scheme.prepare(slots[-1:], slots)
            qr, _ = scheme.rotate(q, q, prep, index)
            s = (qr @ kr.transpose(-1, -2)) / math.sqrt(attn.head_dim)
            bias = scheme.bias(prep, index)
            if bias is not None:
                s = s + bias
            if blocked is not None and li in blocked and t >= first:
                s[:, blocked[li], :, :first] = float("-inf")
            out = torch.softmax(s, dim=-1) @ values[li]
            x = x + attn.out_proj(out.transpose(1, 2).reshape(x.shape[0], 1, d))
            x = x + block.ff(block.norm2(x))
        logits = model.norm(x[:, 0]) @ model.embed.weight.t()
        nll[t] = F.cross_entropy(logits, ids[:, t + 1]).double()
    return nll


@torch.no_grad()
def recompute_nll(model: CausalLM, ids: torch.Tensor, window: int, *, batch: int = 256) -> torch.Tensor:
    """Per-step NLL ``(T - 1,)`` (mean over streams) when every prediction reruns the model on the latest
    ``window`` tokens at positions ``0 .. window - 1`` (StreamingLLM's "sliding window with re-computation";
    the first ``window - 1`` steps see their whole prefix)."""
    window = check_positive_int("window", window)
    if ids.dim() != 2 or ids.shape[1] <= window:
        raise ValueError(f"ids must be (streams, T > window={window}) token ids, got shape {tuple(ids.shape)}")
    model.eval()
    streams, t_len = ids.shape
    nll = torch.zeros(t_len - 1, dtype=torch.float64)
    head = model(ids[:, :window])  # steps 0 .. window - 1
    nll[:window] = F.cross_entropy(head.transpose(1, 2), ids[:, 1 : window + 1], reduction="none").double().mean(0)
    wins = ids[:, 1:-1].unfold(1, window, 1)  # (streams, T - window - 1, window): windows ending at steps window ..
    flat = wins.reshape(-1, window)
    last = torch.cat([model(flat[i : i + batch])[:, -1] for i in range(0, len(flat), batch)])
    targets = ids[:, window + 1 :].reshape(-1)
    nll[window:] = F.cross_entropy(last, targets, reduction="none").double().view(streams, -1).mean(0)
    return nll


__all__ = ["BAND_MODES", "rope_thetas", "partial_sums", "relative_upper_bound", "pair_products", "rope_score",
           "abel_bound", "expected_rope_score", "hidden_states", "probe_position", "probe_layers", "pair_index",
           "pair_norms", "queries_and_keys", "qk_pair_norms", "pair_products_by_distance", "score_from_pair_products",
           "DECAY_PARTS", "decay_parts", "BandRoPE", "mean_nll", "score_by_distance", "first_token_mass",
           "first_token_swaps", "stream_nll", "recompute_nll"]  # fmt: skip
