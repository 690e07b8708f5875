"""FIRE, functional interpolation for relative positions (Li, You, Guruganesh, Ainslie, Ontanon, Zaheer,
Sanghai, Yang, Kumar & Bhojanapalli 2024, "Functional Interpolation for Relative Positions Improves Long
Context Transformers", ICLR 2024, arXiv:2310.04418).

T5 learns one scalar per bucket, ALiBi and Kerple fix the shape of the penalty; FIRE learns the whole
function of the distance with a small MLP ``f: R -> R^heads`` and feeds it a *normalised* distance:

    b(i, j) = f( psi(i - j) / psi(max(L, i)) ),      psi(x) = log(c x + 1)

* ``psi`` warps the distance logarithmically (nearby tokens far apart, distant ones close together),
  with a learned ``c > 0``: FIRE learns its own warp;
* dividing by ``psi(i)``, the warped distance to the sequence start, maps every distance of query
  ``i`` into ``[0, 1]`` ("progressive interpolation"): a longer input is never outside the range ``f``
  was trained on;
* the learned threshold ``L`` keeps short queries from being stretched: for ``i <= L`` the
  normaliser is the constant ``psi(L)`` and the bias depends on ``i - j`` alone.

``i - j`` is the paper's query-minus-key distance (the library's convention is ``j - i``; causal
attention sees ``i - j >= 0``).  Implementation as the paper's PyTorch reference code: ``f`` is
``Linear(1, 32) -> ReLU -> Linear(32, heads)``, ``psi(x) = log(|c| x + 1)`` with ``c`` starting at 0.1,
``L = |l * 512|`` with a learned multiplier ``l`` starting at 1, and ``1e-6`` added to the normaliser.
One FIRE per layer by default; ``shared_layers=True`` keeps one for the whole stack (as T5 shares its
bias), computed once per forward pass.

**Special cases.**  For queries ``i <= L`` the input is a fixed increasing function of ``i - j``, so an
MLP that interpolates values at the integer distances reproduces *any* bias of the distance there:
:func:`interpolating_mlp` builds one (``D + 1`` ReLU units for distances ``0 .. D``, constant beyond).
T5's buckets, ALiBi and Kerple are thereby special cases (checked numerically in
tests/test_survey_positions.py).  Kerple's log kernel needs no interpolation at all: with ``c = r2``
and the linear ``f(x) = -r1 (psi(L) + 1e-6) x`` it is FIRE exactly.

**Bidirectional form** (the library's, not the paper's, whose models are causal): the input keeps the
sign of ``i - j``, ``sign(i - j) psi(|i - j|) / psi(max(L, i))``, so ``f`` on ``[-1, 1]`` can tell keys left
of the query from keys right of it (the reference code's ``|c (i - j)|`` alone would make the bias
symmetric, blind to reversal like symmetric ALiBi).

Like T5's and Kerple's, the bias is content-free and learned: the fused kernel with a float mask at
inference, and on CPU at long lengths in training the fused kernel with the bias's gradient.  On CPU the
rows ``i <= L`` are read from a table of per-distance values (``f`` evaluated once per distance); rows
beyond ``L`` evaluate ``f`` at every pair, in chunks of rows, each chunk's hidden layer recomputed in the
backward pass instead of kept.  Checked against the equations above written out naively in tests/test_survey_positions.py.

Taught in notebooks/11_beyond_the_classics.ipynb.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..attention.layer import PositionScheme, check_positions, on_host
from .registry import register_scheme
from ..checks import check_float_range, check_positive_int
from ..utils import table_bias

#: added to the normaliser ``psi(max(L, i))`` (the paper's reference code)
EPS = 1e-6
#: the most (pairs x hidden units) of the MLP's hidden layer held at once: rows of pairs beyond ``L`` run in
#: chunks of this size, and with gradients each chunk's hidden layer is recomputed in the backward pass
RECOMPUTE_ELEMENTS = 2**22


def fire_psi(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``psi(x) = log(|c| x + 1)`` in float32, for ``x >= 0``."""
    return torch.log1p(c.abs().float() * x.float())


def fire_inputs(q_pos, k_pos, c, threshold, signed: bool = False) -> torch.Tensor:
    """``(q_len, k_len)`` float32 MLP inputs ``psi(|i - j|) / (psi(max(L, i)) + eps)``, times ``sign(i - j)``
    when ``signed`` (the bidirectional form).  ``threshold``: ``L``, a scalar tensor."""
    rel = (q_pos[:, None] - k_pos[None, :]).float()  # i - j
    q = q_pos.float()
    threshold = threshold.float()
    # max(L, i), with a tie read as L (as the table of the rows i <= L does, gradient included)
    norm = fire_psi(torch.where(q > threshold, q, threshold), c) + EPS
    x = fire_psi(rel.abs(), c) / norm[:, None]
    return x * rel.sign() if signed else x


def _mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``f(x)``: ``(...)`` inputs -> ``(..., heads)``, in float32."""
    first, last = mlp[0], mlp[-1]
    with _without_autocast(x.device.type):  # a bias is built in float32, under autocast too
        hidden = torch.relu(x[..., None] * first.weight[:, 0].float() + first.bias.float())
        return hidden @ last.weight.float().t() + last.bias.float()


def _without_autocast(device_type: str):
    """A context that turns autocast off where it is on for ``device_type`` (nothing to do elsewhere, e.g. meta)."""
    if device_type in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _mlp_rows(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``f(x)`` for ``x (rows, k_len)`` -> ``(rows, k_len, heads)``, over chunks of rows whose hidden layer holds at
    most :data:`RECOMPUTE_ELEMENTS` values; with gradients, each chunk's hidden layer is recomputed in the
    backward pass (checkpointed) instead of kept."""
    width = mlp[0].weight.shape[0]
    if x.numel() * width <= RECOMPUTE_ELEMENTS:
        return _mlp(mlp, x)
    grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in mlp.parameters()))
    step = max(1, RECOMPUTE_ELEMENTS // (x.shape[1] * width))
    chunks = (x[s : s + step] for s in range(0, x.shape[0], step))
    return torch.cat([checkpoint(_mlp, mlp, xs, use_reentrant=False) if grad else _mlp(mlp, xs) for xs in chunks])


def interpolating_mlp(values: torch.Tensor, c: float, threshold: float, width: int | None = None) -> nn.Sequential:
    """A FIRE MLP with ``f(psi(d) / psi(L)) = values[d]`` at every integer distance ``d = 0 .. D`` (and
    ``values[D]`` beyond), for queries ``i <= L``: piecewise linear in the input, with a ReLU unit at each of
    the ``D + 1`` distances (``width``, at least ``D + 1``, pads with idle units).

    ``values: (D + 1, heads)``.  With it any bias of the distance alone (T5's buckets, ALiBi, Kerple) is a
    FIRE bias: the constructive half of the paper's expressiveness argument.
    """
    values = values.double()
    n, heads = values.shape
    width = n if width is None else width
    if width < n:
        raise ValueError(f"width must be at least len(values)={n} (one unit per distance), got {width}")
    c_t = torch.tensor(c, dtype=torch.float64)
    x = torch.log1p(c_t * torch.arange(n, dtype=torch.float64)) / (torch.log1p(c_t * threshold) + EPS)
    slopes = torch.diff(values, dim=0) / torch.diff(x)[:, None]  # (D, heads) between neighbouring distances
    change = torch.diff(slopes, dim=0, prepend=torch.zeros(1, heads, dtype=torch.float64),
                        append=torch.zeros(1, heads, dtype=torch.float64))  # (D + 1, heads): flat beyond D
    mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, heads))
    with torch.no_grad():
        mlp[0].weight.zero_()
        mlp[0].bias.zero_()
        mlp[2].weight.zero_()
        mlp[0].weight[:n, 0] = 1.0
        mlp[0].bias[:n] = (-x).float()  # unit k: relu(x - x_k)
        mlp[2].weight[:, :n] = change.t().float()
        mlp[2].bias.copy_(values[0].float())
    return mlp


@register_scheme(kind="bias", group="survey", year=2024, arxiv="2310.04418",
                 paper="Li et al. 2024, Functional Interpolation for Relative Positions Improves Long Context "
                       "Transformers (FIRE)")
class FIRE(PositionScheme):
    """One FIRE (MLP, ``c``, threshold multiplier) per layer, or one for the stack (``shared_layers``)."""

    name = "fire"
    enters = "scores (bias)"

    def __init__(self, d_model, n_heads, num_layers, causal=False, mlp_width: int = 32, init_c: float = 0.1,
                 init_L: float = 512.0, shared_layers: bool = False):  # fmt: skip
        super().__init__(d_model, n_heads, num_layers, causal)
        self.mlp_width = check_positive_int("mlp_width", mlp_width)
        init_c = check_float_range("init_c", init_c, 0.0, low_open=True)
        self.init_L = check_float_range("init_L", init_L, 0.0, low_open=True)
        if not isinstance(shared_layers, bool):
            raise TypeError(f"shared_layers must be True or False, got {shared_layers!r}")
        self.shared_layers = shared_layers
        n = 1 if shared_layers else num_layers
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, n_heads)) for _ in range(n)
        )
        self.c = nn.Parameter(torch.full((n,), init_c))
        self.L_multiplier = nn.Parameter(torch.ones(n))

    def threshold(self, layer: int) -> torch.Tensor:
        """``L = |l * init_L|`` of ``layer`` (a float32 scalar tensor)."""
        i = 0 if self.shared_layers else layer
        return (self.L_multiplier[i].float() * self.init_L).abs()

    def compute_bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor, layer: int) -> torch.Tensor:
        """``(1, heads, q_len, k_len)`` float32 bias of ``layer``."""
        i = 0 if self.shared_layers else layer
        mlp, c, threshold = self.mlps[i], self.c[i], self.threshold(layer)
        signed = not self.causal
        parts = []
        rows = 0
        if on_host(q_pos) and q_pos.numel() and k_pos.numel() and _ascending(q_pos):
            # rows i <= L share the normaliser psi(L): their bias is a function of i - j, one value per distance
            rows = int((q_pos <= threshold.detach()).sum())
            if rows:
                low = int(q_pos[0]) - int(k_pos.max())
                rel = q_pos[:rows, None] - k_pos[None, :] - low  # table rows, 0 .. high - low
                distances = torch.arange(low, int(q_pos[rows - 1]) - int(k_pos.min()) + 1, device=q_pos.device)
                x = fire_psi(distances.abs(), c) / (fire_psi(threshold, c) + EPS)
                parts.append(table_bias(_mlp(mlp, x * distances.sign() if signed else x), rel))
        if rows < q_pos.numel():
            x = fire_inputs(q_pos[rows:], k_pos, c, threshold, signed)
            parts.append(_mlp_rows(mlp, x).permute(2, 0, 1)[None])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        prep = {"q_pos": q_pos, "k_pos": k_pos}
        if self.shared_layers:  # FIRE-S: one bias for every layer of the stack, as T5's
            prep["bias"] = self.compute_bias(q_pos, k_pos, 0)
        return prep

    def bias(self, prep, layer):
        if "bias" in prep:
            return prep["bias"]
        return self.compute_bias(prep["q_pos"], prep["k_pos"], layer)

    def extra_repr(self):
        return (f"causal={self.causal}, mlp_width={self.mlp_width}, init_L={self.init_L:g}, "
                f"shared_layers={self.shared_layers}")  # fmt: skip


def _ascending(pos: torch.Tensor) -> bool:
    """True when the (CPU) positions never decrease (the model's aranges always are)."""
    return pos.numel() < 2 or bool((pos[1:] >= pos[:-1]).all())

