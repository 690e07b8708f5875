"""Interactive explorers: turn a knob of a positional encoding and watch what changes.

Each explorer is a pair:

* ``draw_*(fig=None, **knobs)`` draws a static figure for given knob values (a new pyplot figure when
  ``fig`` is None) and returns the figure. A lesson shows it with the defaults, so the picture is
  there on the website and in nbval's view of the notebook;
* ``*_explorer(**knobs)`` puts ipywidgets sliders in front of the same drawing. It redraws into an
  ``Image`` widget (a PNG made off-screen with matplotlib's Agg canvas), so moving a slider sends no
  cell output: the committed outputs of a notebook stay what they were, and its text form (the
  ``repr``) is one stable line that nbval can compare.

The explorers, by lesson:

* :func:`sinusoidal_explorer` -- lesson 03: model width ``dim``, ``base`` and a coordinate pair;
  the table ``PE(t, 2i) = sin(t w_i)``, ``PE(t, 2i+1) = cos(t w_i)``, ``w_i = base^(-2i/dim)``.
* :func:`rope_explorer` -- lesson 06: ``base``, ``head_dim``, a pair ``k`` and a position ``m``;
  pair ``k`` of a vector turns by ``m theta_k``, and the score of two equal vectors,
  ``q . R_n q``, decays (unevenly) with the distance ``n``.
* :func:`t5_explorer` -- lesson 07: ``num_buckets``, ``max_distance``, bidirectional or causal;
  which relative distances share a learned bias.
* :func:`alibi_explorer` -- lesson 10: the number of heads and one head; the slopes
  ``m_h = 2^(-8h/n)`` (and the rule for other head counts) and the content-free attention prior
  ``softmax(-m_h * distance)`` they imply.
* :func:`yarn_explorer` -- lesson 14: YaRN's factor ``s``, training length ``L``, ``beta_fast`` and
  ``beta_slow``; the ramp ``gamma_k`` that keeps fast pairs and interpolates slow ones, and the
  wavelengths before and after.
* :func:`partial_rotary_explorer` -- lesson 15: the fraction of each head that rotates, ``head_dim``,
  ``base`` and a context length ``n``; the frequency ladders of NeoX-style partial rotary and of p-RoPE
  side by side, and which of their pairs complete a full turn within ``n`` positions.

Every drawing calls the library function it illustrates (``sinusoidal_table``, ``apply_rope``,
``t5_relative_bucket``, ``alibi_slopes``/``alibi_bias``, ``scaled_rope_frequencies``,
``partial_rotary_ladder``), and bad knob
values raise the library's ``ValueError``.
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable

import torch

from ..schemes.alibi import alibi_bias, alibi_slopes
from ..schemes.rope_scaling import scaled_rope_frequencies, wavelengths, yarn_ramp
from ..schemes.rope_spectrum import partial_rotary_ladder, rotary_pairs
from ..schemes.rotary import apply_rope, rope_frequencies
from ..schemes.sinusoidal import sinusoidal_frequencies, sinusoidal_table
from ..schemes.t5 import t5_relative_bucket
from ..checks import check_positive_int

__all__ = [
    "Explorer", "draw_sinusoidal", "sinusoidal_explorer", "draw_rope", "rope_explorer", "draw_t5_buckets",
    "t5_explorer", "draw_alibi", "alibi_explorer", "draw_yarn", "yarn_explorer", "draw_partial_rotary",
    "partial_rotary_explorer",
]  # fmt: skip

WIDE = (11.0, 3.6)  # every explorer draws two panels side by side


def _figure(fig, figsize=WIDE):
    if fig is not None:
        fig.clear()
        return fig
    import matplotlib.pyplot as plt

    return plt.figure(figsize=figsize)


def _pair_index(name: str, value, n_pairs: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_pairs:
        raise ValueError(f"{name} must be an integer in [0, {n_pairs - 1}] (there are {n_pairs} pairs), got {value!r}")
    return value


# ------------------------------------------------------------------ lesson 03: sinusoidal


def draw_sinusoidal(fig=None, *, dim: int = 64, base: float = 10000.0, n_positions: int = 100, pair: int = 4):
    """Left: the ``(n_positions, dim)`` table. Right: pair ``pair``'s sine and cosine against position."""
    n_positions = check_positive_int("n_positions", n_positions)
    table = sinusoidal_table(n_positions, dim, base)  # validates dim and base
    pair = _pair_index("pair", pair, dim // 2)
    w = float(sinusoidal_frequencies(dim, base, torch.float64)[pair])
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    im = ax1.imshow(table.numpy(), aspect="auto", cmap="RdBu", vmin=-1, vmax=1, interpolation="nearest")
    ax1.axvline(2 * pair - 0.5, color="k", lw=0.8)
    ax1.axvline(2 * pair + 1.5, color="k", lw=0.8)
    ax1.set(title=f"sinusoidal table, dim={dim}, base={base:g}", xlabel="dimension (sin even, cos odd)",
            ylabel="position t")  # fmt: skip
    fig.colorbar(im, ax=ax1, fraction=0.05)
    t = torch.arange(n_positions)
    ax2.plot(t, table[:, 2 * pair], label=f"sin(t w_{pair})  (dim {2 * pair})")
    ax2.plot(t, table[:, 2 * pair + 1], label=f"cos(t w_{pair})  (dim {2 * pair + 1})")
    ax2.set(title=f"pair {pair}: w = {w:.3g} rad/position, wavelength {2 * math.pi / w:.3g}", xlabel="position t",
            ylim=(-1.15, 1.45))  # fmt: skip
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lesson 06: RoPE


def rope_pair_track(head_dim: int, base: float, pair: int, positions: torch.Tensor) -> torch.Tensor:
    """``(len(positions), 2)``: pair ``pair`` of the vector whose pairs are all ``(1, 0)``, rotated to each position."""
    pair = _pair_index("pair", pair, head_dim // 2)
    x = torch.zeros(len(positions), head_dim)
    x[:, 0::2] = 1.0  # interleaved pairs (x_{2k}, x_{2k+1}) = (1, 0)
    return apply_rope(x, positions, base=base)[:, 2 * pair: 2 * pair + 2]


def rope_equal_vector_scores(head_dim: int, base: float, max_distance: int) -> torch.Tensor:
    """``(max_distance + 1,)``: ``q . R_n q / head_dim`` for ``q = (1, ..., 1)`` and ``n = 0..max_distance``.

    RoPE's scores depend only on the distance, so this is the score of a query at position 0 against
    the same vector as a key at position n: ``(2/d) sum_k cos(n theta_k)``.
    """
    max_distance = check_positive_int("max_distance", max_distance)
    n = torch.arange(max_distance + 1)
    q = torch.ones(1, head_dim)
    keys = apply_rope(torch.ones(len(n), head_dim), n, base=base)
    return (apply_rope(q, torch.zeros(1, dtype=torch.long), base=base) @ keys.T)[0] / head_dim


def draw_rope(fig=None, *, base: float = 10000.0, head_dim: int = 64, pair: int = 0, position: int = 5,
              max_distance: int = 512):  # fmt: skip
    """Left: pair ``pair`` rotated to positions ``0..position``. Right: score of equal q, k against distance."""
    position = check_positive_int("position", position)
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not base > 1:
        raise ValueError(f"base must be a number > 1, got {base!r}")
    theta = float(rope_frequencies(head_dim, base)[_pair_index("pair", pair, head_dim // 2)])
    track = rope_pair_track(head_dim, base, pair, torch.arange(position + 1))
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    circle = torch.linspace(0, 2 * math.pi, 200)
    ax1.plot(circle.cos(), circle.sin(), color="0.85", lw=1)
    ax1.plot(track[:, 0], track[:, 1], "o-", ms=3, lw=0.6, color="C0", alpha=0.6)
    ax1.annotate("", xy=(float(track[-1, 0]), float(track[-1, 1])), xytext=(0, 0),
                 arrowprops={"arrowstyle": "->", "color": "C3", "lw": 2})  # fmt: skip
    ax1.annotate("m=0", (1.0, 0.0), xytext=(1.05, -0.18), fontsize=8)
    ax1.set(title=f"pair {pair}: {theta:.3g} rad per position\nm = {position}: angle {position * theta:.3g} rad",
            xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xticks=[], yticks=[])  # fmt: skip
    scores = rope_equal_vector_scores(head_dim, base, max_distance)
    ax2.plot(torch.arange(max_distance + 1), scores, lw=1)
    ax2.axvline(position, color="C3", ls=":", lw=1)
    ax2.set(title=f"score of equal q and k, base={base:g}, head_dim={head_dim}", xlabel="distance n = |m - m'|",
            ylabel="q . R_n q / d", ylim=(-0.35, 1.05))  # fmt: skip
    ax2.set_xscale("symlog", linthresh=10)
    ax2.set_xlim(0, max_distance)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lesson 07: T5 buckets


def draw_t5_buckets(fig=None, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True,
                    length: int = 160):  # fmt: skip
    """Left: bucket of each relative distance ``j - i``. Right: the ``(length, length)`` bucket map."""
    length = check_positive_int("length", length)
    rel = torch.arange(-length + 1, length)
    buckets = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance)  # validates the knobs
    pos = torch.arange(length)
    bucket_map = t5_relative_bucket(pos[None, :] - pos[:, None], bidirectional, num_buckets, max_distance)
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.step(rel, buckets, where="mid", lw=1)
    for x in (-max_distance, max_distance):
        if abs(x) < length:
            ax1.axvline(x, color="0.5", ls=":", lw=1)
    used = len(buckets.unique())
    kind = "bidirectional (encoder)" if bidirectional else "causal (decoder)"
    ax1.set(title=f"{kind}: {used} of {num_buckets} buckets used", xlabel="relative position j - i",
            ylabel="bucket")  # fmt: skip
    im = ax2.imshow(bucket_map.numpy(), aspect="auto", interpolation="nearest", vmin=0, vmax=num_buckets - 1)
    ax2.set(title=f"bucket map, max_distance={max_distance}", xlabel="key position j", ylabel="query position i")
    fig.colorbar(im, ax=ax2, fraction=0.05, label="bucket")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lesson 10: ALiBi


def alibi_prior(n_heads: int, length: int) -> torch.Tensor:
    """``(n_heads, length)``: ``softmax(-m_h * distance)`` over keys at distances ``0..length-1`` (causal)."""
    length = check_positive_int("length", length)
    q = torch.tensor([length - 1])
    bias = alibi_bias(q, torch.arange(length), alibi_slopes(n_heads))[0, :, 0]  # (heads, keys), key j at distance L-1-j
    return torch.softmax(bias, dim=-1).flip(-1)  # index = distance


def draw_alibi(fig=None, *, n_heads: int = 8, head: int = 1, length: int = 64):
    """Left: the slope of every head. Right: each head's content-free attention prior over distances."""
    slopes = alibi_slopes(n_heads)  # validates n_heads
    if isinstance(head, bool) or not isinstance(head, int) or not 1 <= head <= n_heads:
        raise ValueError(f"head must be an integer in [1, {n_heads}] (heads are numbered from 1), got {head!r}")
    prior = alibi_prior(n_heads, length)
    dist = torch.arange(length)
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2)
    h = torch.arange(1, n_heads + 1)
    ax1.plot(h, slopes, "o-", color="C0", ms=4)
    ax1.plot([head], [float(slopes[head - 1])], "o", color="C3", ms=9)
    ax1.set(yscale="log", title=f"{n_heads} heads: slopes m_h", xlabel="head h", ylabel="slope m_h (log scale)")
    for i in range(n_heads):
        ax2.plot(dist, prior[i], color="C3" if i == head - 1 else "0.75", lw=2 if i == head - 1 else 0.8)
    mean = float((prior[head - 1] * dist).sum())
    ax2.set(title=f"head {head}: m = {float(slopes[head - 1]):.3g}, mean distance {mean:.1f}",
            xlabel="distance to the key (causal)", ylabel="softmax(-m_h * distance)")  # fmt: skip
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lesson 14: YaRN


def draw_yarn(fig=None, *, factor: float = 8.0, original_length: int = 2048, beta_fast: float = 32.0,
              beta_slow: float = 1.0, head_dim: int = 128, base: float = 10000.0):  # fmt: skip
    """Left: YaRN's ramp ``gamma_k`` (1 keep, 0 interpolate). Right: wavelengths before and after."""
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original_length,
               "beta_fast": beta_fast, "beta_slow": beta_slow}  # fmt: skip
    scaled, attention_scale = scaled_rope_frequencies(head_dim, base, scaling)  # validates every knob
    plain, _ = scaled_rope_frequencies(head_dim, base, None)
    gamma = yarn_ramp(head_dim, base, original_length, float(beta_fast), float(beta_slow))
    k = torch.arange(head_dim // 2)
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(k, gamma, "o-", ms=3)
    ax1.set(title=f"YaRN ramp: beta_fast={beta_fast:g}, beta_slow={beta_slow:g}", xlabel="pair k (fast -> slow)",
            ylabel="gamma_k (1 keep, 0 divide by s)", ylim=(-0.08, 1.08))  # fmt: skip
    ax2.plot(k, wavelengths(plain), label="RoPE")
    ax2.plot(k, wavelengths(scaled), "--", label=f"YaRN, s = {factor:g}")
    ax2.axhline(original_length, color="0.4", ls=":", lw=1)
    ax2.axhline(factor * original_length, color="0.7", ls=":", lw=1)
    ax2.set(yscale="log", xlabel="pair k", ylabel="wavelength 2 pi / theta_k (positions)",
            title=f"L = {original_length} (dotted) -> s L = {factor * original_length:g}; "
                  f"cos, sin x {attention_scale:.3f}")  # fmt: skip
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ lesson 15: partial rotary, two kinds


def draw_partial_rotary(fig=None, *, fraction: float = 0.25, head_dim: int = 128, base: float = 10000.0,
                        context: int = 8192):  # fmt: skip
    """Left: the frequency of every pair for full RoPE, NeoX partial rotary and p-RoPE (non-rotating pairs
    drawn as crosses on the floor). Right: their wavelengths against the context ``n``."""
    context = check_positive_int("context", context)
    full = partial_rotary_ladder("proportional", 1.0, head_dim, base)  # validates head_dim and base
    ladders = {"NeoX partial": partial_rotary_ladder("neox", fraction, head_dim, base),
               "p-RoPE": partial_rotary_ladder("proportional", fraction, head_dim, base)}  # fmt: skip
    pairs = rotary_pairs(fraction, head_dim)
    k = torch.arange(head_dim // 2)
    floor = float(full.min()) / 10
    fig = _figure(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(k, full, color="0.6", lw=1, label="full RoPE")
    for (name, lad), (c, mk) in zip(ladders.items(), (("tab:blue", "o"), ("tab:red", "s"))):
        on = lad > 0
        ax1.plot(k[on], lad[on], mk, ms=3, color=c, label=f"{name}: {int(on.sum())} pairs rotate")
        ax1.plot(k[~on], torch.full((int((~on).sum()),), floor), "x", ms=3, color=c)
        turns = int(((context - 1) * lad >= 2 * math.pi).sum())
        ax2.plot(k[on], wavelengths(lad[on]), mk, ms=3, color=c, label=f"{name}: {turns} turn fully within n")
    ax1.set(yscale="log", xlabel="pair k (fast -> slow)", ylabel="theta_k (rad per position)",
            title=f"fraction {fraction:g} of d = {head_dim}: {pairs} pairs rotate (x: no rotation)")  # fmt: skip
    ax1.legend(fontsize=8)
    ax2.axhline(context - 1, color="0.4", ls=":", lw=1)
    ax2.set(yscale="log", xlabel="pair k", ylabel="wavelength 2 pi / theta_k (positions)",
            title=f"base {base:g}; dotted: n = {context}")  # fmt: skip
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ the widget


class Explorer:
    """Sliders in front of a ``draw_*`` function, redrawn as a PNG in an ``ipywidgets.Image``.

    ``controls`` maps each keyword of ``draw`` to a widget; ``adjust(controls)``, if given, runs
    before each redraw (e.g. to cap a pair index at ``dim // 2 - 1``). ``widget`` is what Jupyter
    shows; displaying the explorer shows it. Its text form is the stable line from ``repr``.
    """

    def __init__(self, title: str, draw: Callable, controls: dict, adjust: Callable | None = None, figsize=WIDE):
        import ipywidgets as widgets

        self.title, self.draw, self.controls, self.adjust, self.figsize = title, draw, controls, adjust, figsize
        self.image = widgets.Image(format="png")
        self.message = widgets.HTML()
        for control in controls.values():
            control.observe(self._update, names="value")
        rows = [widgets.HBox(list(controls.values())[i:i + 3]) for i in range(0, len(controls), 3)]
        self.widget = widgets.VBox([widgets.HTML(f"<b>{title}</b>"), *rows, self.message, self.image])
        self._update()

    def values(self) -> dict:
        """The knob values the sliders show now."""
        return {name: control.value for name, control in self.controls.items()}

    def render(self, **values) -> bytes:
        """PNG bytes of ``draw(**values)`` (default: the current slider values), drawn off-screen."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=self.figsize, dpi=80)
        FigureCanvasAgg(fig)
        self.draw(fig, **(values or self.values()))
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()

    def _update(self, change=None) -> None:
        if self.adjust is not None:
            self.adjust(self.controls)
        try:
            self.image.value = self.render()
            self.message.value = ""
        except ValueError as err:  # a combination the library rejects: say why, keep the last picture
            self.message.value = f"<span style='color:#b00'>{err}</span>"

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs) | {"text/plain": repr(self)}

    def __repr__(self) -> str:
        return f"Explorer({self.title}: {', '.join(self.controls)})"


def _int(description, value, lo, hi, step=1):
    import ipywidgets as widgets

    return widgets.IntSlider(value=value, min=lo, max=hi, step=step, description=description, continuous_update=False)


def _log(description, value, lo_exp, hi_exp):
    import ipywidgets as widgets

    return widgets.FloatLogSlider(value=value, base=10, min=lo_exp, max=hi_exp, step=0.05, description=description,
                                  continuous_update=False, readout_format=".3g")  # fmt: skip


def _cap(control_name: str, by: str, fn: Callable[[int], int]) -> Callable:
    def adjust(controls):
        controls[control_name].max = fn(controls[by].value)

    return adjust


def sinusoidal_explorer(dim: int = 64, base: float = 10000.0, n_positions: int = 100, pair: int = 4) -> Explorer:
    """Lesson 03: sliders for ``dim``, ``base``, ``n_positions`` and the pair drawn on the right."""
    controls = {"dim": _int("dim", dim, 8, 256, 8), "base": _log("base", base, 1, 6),
                "n_positions": _int("positions", n_positions, 16, 512, 8), "pair": _int("pair", pair, 0, 127)}  # fmt: skip
    return Explorer("sinusoidal frequencies", draw_sinusoidal, controls, _cap("pair", "dim", lambda d: d // 2 - 1))


def rope_explorer(base: float = 10000.0, head_dim: int = 64, pair: int = 0, position: int = 5) -> Explorer:
    """Lesson 06: sliders for ``base``, ``head_dim``, the pair on the circle and the position ``m``."""
    controls = {"base": _log("base", base, 1, 6), "head_dim": _int("head_dim", head_dim, 8, 256, 8),
                "pair": _int("pair", pair, 0, 127), "position": _int("position m", position, 1, 512)}  # fmt: skip
    return Explorer("RoPE base and rotation", draw_rope, controls, _cap("pair", "head_dim", lambda d: d // 2 - 1))


def t5_explorer(num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True, length: int = 160) -> Explorer:
    """Lesson 07: sliders for ``num_buckets``, ``max_distance``, the sequence length; a bidirectional switch."""
    import ipywidgets as widgets

    controls = {"num_buckets": _int("buckets", num_buckets, 2, 64, 2),
                "max_distance": _int("max_distance", max_distance, 2, 512),
                "bidirectional": widgets.Checkbox(value=bidirectional, description="bidirectional"),
                "length": _int("length", length, 8, 256, 8)}  # fmt: skip
    return Explorer("T5 buckets", draw_t5_buckets, controls)


def alibi_explorer(n_heads: int = 8, head: int = 1, length: int = 64) -> Explorer:
    """Lesson 10: sliders for the number of heads, the highlighted head and the context length."""
    controls = {"n_heads": _int("heads", n_heads, 1, 32), "head": _int("head", head, 1, 32),
                "length": _int("length", length, 8, 512, 8)}  # fmt: skip
    return Explorer("ALiBi slopes", draw_alibi, controls, _cap("head", "n_heads", lambda n: n))


def yarn_explorer(factor: float = 8.0, original_length: int = 2048, beta_fast: float = 32.0, beta_slow: float = 1.0,
                  head_dim: int = 128, base: float = 10000.0) -> Explorer:  # fmt: skip
    """Lesson 14: sliders for YaRN's ``factor``, training length, ``beta_fast``, ``beta_slow``, ``head_dim``, ``base``."""
    import ipywidgets as widgets

    controls = {"factor": widgets.FloatSlider(value=factor, min=1, max=64, step=0.5, description="factor s",
                                              continuous_update=False),
                "original_length": _int("L", original_length, 64, 16384, 64),
                "beta_fast": widgets.FloatSlider(value=beta_fast, min=1, max=128, step=1, description="beta_fast",
                                                 continuous_update=False),
                "beta_slow": widgets.FloatSlider(value=beta_slow, min=0.125, max=8, step=0.125,
                                                 description="beta_slow", continuous_update=False),
                "head_dim": _int("head_dim", head_dim, 16, 256, 8), "base": _log("base", base, 2, 7)}  # fmt: skip
    return Explorer("YaRN ramp", draw_yarn, controls)


def partial_rotary_explorer(fraction: float = 0.25, head_dim: int = 128, base: float = 10000.0,
                            context: int = 8192) -> Explorer:  # fmt: skip
    """Lesson 15: sliders for the rotating ``fraction``, ``head_dim``, ``base`` and the context ``n``."""
    import ipywidgets as widgets

    controls = {"fraction": widgets.FloatSlider(value=fraction, min=0, max=1, step=0.05, description="fraction",
                                                continuous_update=False),
                "head_dim": _int("head_dim", head_dim, 8, 256, 8), "base": _log("base", base, 2, 7),
                "context": _int("context n", context, 16, 131072, 16)}  # fmt: skip
    return Explorer("partial rotary: NeoX vs p-RoPE", draw_partial_rotary, controls)
