"""Rotary position embedding, RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with
Rotary Position Embedding", arXiv:2104.09864).

Treat each pair of query/key dimensions as a complex number and multiply it by
``exp(i * m * theta_k)`` with ``theta_k = base^(-2k/d)``:

    f(x, m) = R_m x,   R_m = blockdiag([[cos m.th_k, -sin m.th_k], [sin m.th_k, cos m.th_k]])
    <R_m q, R_n k> = q^T R_{n-m} k        (depends on m and n only through n - m)

with the query at ``m`` and the key at ``n``: ``n - m`` is the course's convention, key minus query
(:mod:`posenc_lib.attention.layer`); the paper writes its goal as a function of ``m - n``.

Two conventions for *which* dimensions form a pair:

* ``interleaved=True`` -- pairs ``(x0, x1), (x2, x3), ...`` as in the RoFormer paper
  and the seed report;
* ``interleaved=False`` -- pairs ``(x_k, x_{k + d/2})`` with ``rotate_half`` as in
  GPT-NeoX and Llama.

They are the same rotation up to a fixed permutation of dimensions, so weights
trained with one cannot be used with the other without permuting.

The angles ``m * theta_k`` are always computed in float32 (never bf16/fp16, whose
8-/11-bit mantissas cannot hold ``m * theta`` for large ``m``), then the rotation
is applied in the input dtype.  ``positions`` are absolute, so a decoder with a
key/value cache rotates each new key once, at its own position.

Taught in notebooks/06_rope.ipynb.
"""
from __future__ import annotations

import torch
from torch import nn

from .rope_scaling import LENGTH_DEPENDENT, check_scaling, scaled_rope_cos_sin, scaled_rope_frequencies  # noqa: F401
from ..checks import check_bool, check_even, check_float_range, check_float_tensor, check_position_tensor


def rope_frequencies(head_dim: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """``(head_dim // 2,)`` float32 frequencies ``theta_k = base^(-2k/head_dim)``."""
    head_dim = check_even("head_dim", head_dim)
    base = check_float_range("base", base, 1.0, low_open=True)
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rope_angles(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``(seq, head_dim // 2)`` float32 angles ``m * theta_k``; ``positions (seq,)`` integer or (fractional) float."""
    check_position_tensor("positions", positions)
    theta = rope_frequencies(head_dim, base, positions.device)
    return positions.to(torch.float32)[:, None] * theta[None, :]


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float = 10000.0, interleaved: bool = True):
    """cos and sin expanded to ``(seq, head_dim)`` for the chosen pairing (float32)."""
    check_bool("interleaved", interleaved)
    ang = rope_angles(positions, head_dim, base)
    if interleaved:
        ang = ang.repeat_interleave(2, dim=-1)  # th0 th0 th1 th1 ...
    else:
        ang = torch.cat((ang, ang), dim=-1)  # th0 th1 ... th0 th1 ...
    return ang.cos(), ang.sin()


def _check_pairs(x) -> None:
    """``x`` is a tensor whose last dimension splits into rotation pairs."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor (..., head_dim), got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dimension (rotation pairs), got shape {tuple(x.shape)}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension (half-split pairing)."""
    _check_pairs(x)
    return _rotate_half(x)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)`` (interleaved pairing)."""
    _check_pairs(x)
    return _rotate_pairs(x)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x_odd, x_even), dim=-1).flatten(-2)


def apply_rope_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = True) -> torch.Tensor:
    """Rotate ``x (..., seq, head_dim)`` with precomputed ``cos, sin (seq, head_dim)`` (or shapes that broadcast)."""
    check_float_tensor("x", x)
    _check_pairs(x)
    for name, t in (("cos", cos), ("sin", sin)):
        check_float_tensor(name, t)
        if t.dim() == 0 or t.shape[-1] != x.shape[-1]:
            raise ValueError(f"{name} must have the last dimension of x, {x.shape[-1]}, got shape {tuple(t.shape)}")
    try:
        torch.broadcast_shapes(x.shape, cos.shape, sin.shape)
    except RuntimeError:
        raise ValueError(f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must broadcast to x's shape "
                         f"{tuple(x.shape)} (seq, head_dim)") from None  # fmt: skip
    return apply_rope_cos_sin_unchecked(x, cos, sin, check_bool("interleaved", interleaved))


def apply_rope_cos_sin_unchecked(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool
) -> torch.Tensor:
    """:func:`apply_rope_cos_sin` without its checks: the schemes' rotation at every layer and decoding step."""
    rot = _rotate_pairs(x) if interleaved else _rotate_half(x)
    out = x.float() * cos + rot.float() * sin
    return out.to(x.dtype)


def _checked_positions(x: torch.Tensor, positions: torch.Tensor | None):
    """Validate ``x (..., seq, head_dim)`` and ``positions``; returns ``seq, head_dim, positions``."""
    check_float_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., seq, head_dim), got {tuple(x.shape)}")
    seq, head_dim = x.shape[-2], x.shape[-1]
    check_even("head_dim", head_dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    check_position_tensor("positions", positions, dim=None)
    if positions.dim() != 1 or positions.shape[0] != seq:
        raise ValueError(f"positions must be 1-D with length seq={seq}, got shape {tuple(positions.shape)}")
    return seq, head_dim, positions.to(x.device)


def apply_rope(
    x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0, interleaved: bool = True
) -> torch.Tensor:
    """Rotate ``x (..., seq, head_dim)`` by its positions.

    ``positions``: 1-D tensor of absolute positions, length ``seq`` (default
    ``arange(seq)``); pass ``arange(offset, offset + seq)`` for cached decoding.
    """
    seq, head_dim, positions = _checked_positions(x, positions)
    cos, sin = rope_cos_sin(positions, head_dim, base, interleaved)
    return apply_rope_cos_sin_unchecked(x, cos, sin, interleaved)


def apply_rope_complex(x: torch.Tensor, positions: torch.Tensor | None = None, *, base: float = 10000.0) -> torch.Tensor:
    """The paper's complex form with ``torch.polar`` (interleaved pairing); for teaching and tests."""
    seq, head_dim, positions = _checked_positions(x, positions)
    rot = torch.polar(torch.ones(seq, head_dim // 2, device=x.device), rope_angles(positions, head_dim, base))
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], head_dim // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


def interleaved_to_half_permutation(head_dim: int) -> torch.Tensor:
    """Index ``p`` with ``rope_half(x[..., p]) == rope_interleaved(x)[..., p]``.

    ``p = [0, 2, 4, ..., 1, 3, 5, ...]`` gathers the pair members into the two halves.
    """
    head_dim = check_even("head_dim", head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


class RotaryCache(nn.Module):
    """cos/sin tables cached per (length, device), grown on demand; float32 phases.

    ``scaling``: a context-extension dict (see posenc_lib/schemes/rope_scaling.py); the tables then hold the
    scaled frequencies, times YaRN's or LongRoPE's attention scale.  ``dynamic`` and ``longrope`` depend on
    the current length ``seq_len`` and are computed per call instead of cached.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = True, scaling: dict | None = None):
        super().__init__()
        self.head_dim = check_even("head_dim", head_dim)
        self.base = base
        self.interleaved = check_bool("interleaved", interleaved)
        self.scaling = check_scaling(scaling)
        scaled_rope_frequencies(self.head_dim, base, self.scaling)  # reject a bad base or head_dim now
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def forward(self, positions: torch.Tensor, seq_len: torch.Tensor | int | None = None):
        """``positions (seq,)`` -> ``cos, sin`` each ``(seq, head_dim)`` float32.

        ``seq_len``: the current total length, read by ``dynamic`` and ``longrope`` scaling only.
        """
        check_position_tensor("positions", positions)
        return self.cos_sin(positions, seq_len)

    def cos_sin(self, positions: torch.Tensor, seq_len: torch.Tensor | int | None = None):
        """:meth:`forward` without its check of ``positions`` (a scheme's ``prepare`` has made it)."""
        if self.scaling is not None and self.scaling["rope_type"] in LENGTH_DEPENDENT:
            return scaled_rope_cos_sin(positions, self.head_dim, self.base, self.interleaved, self.scaling, seq_len)
        if positions.device.type != "cpu" or torch.compiler.is_compiling() or positions.dtype.is_floating_point:
            # growing the table reads positions.max() back, which would stall an accelerator on
            # every forward (and break a compiled graph): compute the rows directly (the same float32 numbers);
            # the table has no row for a fractional position either
            return scaled_rope_cos_sin(positions, self.head_dim, self.base, self.interleaved, self.scaling)
        count = positions.numel()
        if count == 1:  # a decoding step's one position: one read
            lo = hi = int(positions)
        else:
            lo, hi = (int(v) for v in positions.aminmax()) if count else (0, -1)
        if lo < 0:  # the table's rows are positions 0, 1, ...: index -1 would read the last row
            return scaled_rope_cos_sin(positions, self.head_dim, self.base, self.interleaved, self.scaling)
        need = hi + 1
        if self._cos is None or self._cos.shape[0] < need or self._cos.device != positions.device:
            n = max(need, 64 if self._cos is None else 2 * self._cos.shape[0])
            self._cos, self._sin = scaled_rope_cos_sin(
                torch.arange(n, device=positions.device), self.head_dim, self.base, self.interleaved, self.scaling
            )
        return self._cos[positions], self._sin[positions]

    def extra_repr(self) -> str:
        extra = f", scaling={self.scaling}" if self.scaling is not None else ""
        return f"head_dim={self.head_dim}, base={self.base}, interleaved={self.interleaved}{extra}"


from ..attention.layer import PositionScheme, check_positions  # noqa: E402
from .registry import register_scheme  # noqa: E402


@register_scheme(kind="rotary", group="classic", year=2021, arxiv="2104.09864", aliases=("rotary",),
                 paper="Su et al. 2021, RoFormer: Rotary Position Embedding")
class RotaryScheme(PositionScheme):
    """Rotates queries and keys of every self-attention layer; keys are cached already rotated.

    ``scaling``: a frequency-changing dict (``rope_type`` linear, dynamic, yarn, llama3, longrope or
    proportional; see posenc_lib/schemes/rope_scaling.py).  With ``dynamic`` the frequencies follow the length seen so far
    (``k_pos`` max + 1): a full forward rotates every token with the frequencies of its whole
    length, while a cached key keeps the rotation of the step that cached it (as in
    ``transformers``), so cached and uncached decoding agree only up to the training length; ``longrope``
    switches from its short to its long factors the same way.
    ``rotary_dim``: rotate only the first ``rotary_dim`` dimensions of each head (partial
    rotary, GPT-NeoX); the rest carry no position.
    """

    name = "rope"
    enters = "q,k"

    def __init__(self, d_model, n_heads, num_layers, causal=False, base: float = 10000.0, interleaved: bool = True,
                 scaling: dict | None = None, rotary_dim: int | None = None):  # fmt: skip
        super().__init__(d_model, n_heads, num_layers, causal)
        self.rotary_dim = self.head_dim if rotary_dim is None else check_even("rotary_dim", rotary_dim)
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={self.head_dim}; "
                             f"choose an even rotary_dim in [2, {self.head_dim}]")  # fmt: skip
        self.cache = RotaryCache(self.rotary_dim, base, interleaved, scaling)
        self.interleaved = interleaved

    def prepare(self, q_pos, k_pos):
        check_positions(q_pos, k_pos)
        cos, sin = self.cache.cos_sin(q_pos, k_pos.max() + 1 if k_pos.numel() else None)
        return {"q_pos": q_pos, "k_pos": k_pos, "cos": cos, "sin": sin}

    def rotate(self, q, k, prep, layer):
        cos, sin = prep["cos"], prep["sin"]
        r = self.rotary_dim
        if r == self.head_dim:
            rotate = apply_rope_cos_sin_unchecked
            return rotate(q, cos, sin, self.interleaved), rotate(k, cos, sin, self.interleaved)
        q = torch.cat((apply_rope_cos_sin_unchecked(q[..., :r], cos, sin, self.interleaved), q[..., r:]), dim=-1)
        k = torch.cat((apply_rope_cos_sin_unchecked(k[..., :r], cos, sin, self.interleaved), k[..., r:]), dim=-1)
        return q, k

    def extra_repr(self):
        extra = f", scaling={self.cache.scaling}" if self.cache.scaling is not None else ""
        extra += f", rotary_dim={self.rotary_dim}" if self.rotary_dim != self.head_dim else ""
        return f"causal={self.causal}, interleaved={self.interleaved}, base={self.cache.base}{extra}"
