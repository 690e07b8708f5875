"""One multi-head attention module with small extension points for position schemes.

A position scheme (:class:`PositionScheme`) can enter attention in exactly four
places, and each scheme overrides only the hooks it needs:

==================  ==========================================  ===========================
hook                what it does                                used by
==================  ==========================================  ===========================
``embed``           add a code to the token embeddings          sinusoidal, learned
``rotate``          rotate queries and keys                     rope, xpos
``bias``            add a content-free bias to the scores       t5, alibi, fire, kerple
``scores``          add content-dependent score terms           shaw, xlnet, deberta, cope
``values``          add a term to the attention output          shaw
==================  ==========================================  ===========================

Scores are ``(q k^T + scores) / sqrt(head_dim * score_terms) + bias``; DeBERTa
sets ``score_terms = 3`` (its 1/sqrt(3d) scale).  ``prepare`` runs once per
forward pass of a stack and returns ``prep``, a dict (relative-index matrices, the T5
bias, RoPE's cos/sin) that every layer of the stack reuses and every hook takes.

How a call is computed is no concern of the hooks: :meth:`MultiHeadAttention.forward` projects, rotates and
caches, and hands the call to :mod:`posenc_lib.attention.backends`, where one function picks a backend (the fused
SDPA kernel, the explicit softmax, query blocks, the fused CPU kernels, FlexAttention, a padded batch as
variable-length sequences) from what the scheme declares
(``adds_bias``, ``adds_scores``, ``adds_values``; derived from the hooks it overrides) and the call's shape.  Every
backend computes the same function (the variable-length one at every token; a padding query's row, which nothing
reads, is its own).  A causal self-attention with nothing to mask but the future (no padding, no
bias) passes ``is_causal=True`` and *no* mask, the only form the flash kernels on a GPU accept
(:func:`choose_attention_path`).

Causal self-attention: the queries are the newest ``q_len`` of the ``k_len``
keys (a decoder cache holds only earlier positions), so the causal mask is
"key position <= query position" read bottom-right: with ``q_len == k_len``
it is SDPA's ``is_causal``; with ``q_len == 1`` (a cached step) it masks nothing.

Position biases are built in float32 whatever the autocast or parameter dtype
(a bf16 distance is already rounded above 256); they are cast to the kernel's
dtype only where they enter it.  Nothing in a forward pass reads a value back
from the device (``.item()``, ``int(tensor)``): checks that must read values run
only on CPU tensors (:func:`on_host`), where reading costs no synchronisation.

Relative positions, one convention: a relative position is ``j - i``, the key's position minus the
query's (:func:`posenc_lib.utils.relative_positions`); negative means the key lies to the left (in the
past).  Shaw (``clip(j - i, k)``), T5 (``bucket(j - i)``), RoPE (``<R_m q, R_n k> = q^T R_{n-m} k``, query at
``m``) and the 2-D offsets use it as written in their papers.  Transformer-XL/XLNet (``R_{i-j}``), DeBERTa
(``delta(i, j)`` from ``i - j``) and URPE (``g(i - j)``) index by the query minus the key, ``-(j - i)``, as
their papers and ``transformers`` do; the library keeps their index so that parity tests read alike.  ALiBi's
``|i - j|`` does not depend on the order, and its causal ``-m (i - j)`` is ``m (j - i)``.  Each scheme's
docstring says which form it uses; notebooks/01_why_position.ipynb states the convention for learners.

Shapes: ``q: (batch, heads, q_len, head_dim)``, ``k, v: (batch, heads, k_len, head_dim)``;
positions ``q_pos: (q_len,)``, ``k_pos: (k_len,)`` are absolute (a cached decoder
step has ``q_pos = [t]`` and ``k_pos = [0..t]``).

Taught across notebooks/05-10 and costed in notebooks/12_cost.ipynb; the module is the common ground of them all.
"""
from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import backends
from .backends import AttentionCall, attend, scale_of
from .step import append_to_cache, cached_len, cross_attention, cross_step, self_attention_step, takes_self_step
from .inputs import check_attention_call, check_positions, merge_masks  # noqa: F401 (the schemes import them here)
from ..checks import check_bool, check_divides, check_float_range, check_positive_int


def on_host(t: torch.Tensor) -> bool:
    """True when reading ``t``'s values costs no device synchronisation (a CPU tensor) and breaks no
    compiled graph (not while :func:`torch.compile` traces).

    Checks that must look at values (token ids beyond the vocabulary, positions
    beyond a learned table) run only then; on an accelerator the read would stall
    the device on every call, in a traced function it would split the graph, and the
    model's own positions never need it (a compiled decoding step's caller checks lengths
    with plain ints).
    """
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


class PositionScheme(nn.Module):
    """Base class and the ``none`` scheme: attention sees no position at all.

    One instance serves one stack (the encoder's self-attention or the
    decoder's); per-layer parameters are indexed by ``layer``.
    """

    name = "none"
    #: where the position enters: "input", "q,k", "scores", "scores+values" or "nowhere"
    enters = "nowhere"
    #: number of score terms that share the 1/sqrt(head_dim * score_terms) scale
    score_terms = 1
    #: what the scheme adds inside attention, read by :func:`choose_attention_path`; a subclass
    #: gets them from the hooks it overrides (``bias``, ``scores``, ``values``) unless it sets them
    adds_bias = False
    adds_scores = False
    adds_values = False
    #: the number of positions the scheme can code (a learned table's rows), or None for any
    max_positions: int | None = None
    #: The optional hooks below serve the fast paths alone (:mod:`posenc_lib.kernels`); ``None`` where a scheme has none.
    #: ``score_parts(q, prep, layer, attn)`` and ``scores_from_parts(q, k, parts, prep, scale)``: the small tensors the
    #: score terms are built from (DeBERTa's projected tables, XLNet's projected distances, CoPE's table), and the
    #: terms built from them, so that a block's terms can be rebuilt in the backward pass instead of kept
    score_parts = scores_from_parts = None
    #: ``offset_bias(prep)``: the bias as one value per offset ``(heads, q_len + k_len - 1)`` where the context has it
    #: (T5, ALiBi over consecutive positions), else ``None``; ``offset_runs(prep)``: ``(a, z)``, offsets ``0:a`` and
    #: ``z:`` sharing one value each (T5's clipped buckets)
    offset_bias = offset_runs = None
    #: ``block_sides(prep)`` and ``key_range(prep, start, end)``, with ``side_terms``: the keys of a block beyond the
    #: clipping distance of all its rows, and the context of keys ``start:end``
    block_sides = key_range = None
    #: ``block_parts(parts, prep, start, end, n)``, where a scheme defines it: query block ``start:end``'s share (against
    #: keys ``0:n``) of the parts ``score_parts`` made for the whole call (the same parts, or rows of them); the fused
    #: CPU path then makes the parts once per layer and runs all of a layer's blocks in one node
    block_parts = None
    #: ``side_terms(q, parts, edge, scale) -> (row, u)``, where a scheme defines it (with ``block_sides`` and
    #: ``key_range``): for keys that all sit at one clipped relative index ``edge`` from a block's queries ``q``,
    #: their score terms times ``scale`` as ``row_i + scale * u . k_j``
    #: (see :func:`~posenc_lib.attention.cpu_flash.flash_blocks`)
    side_terms = None
    #: the fused CPU path runs the keys beyond the scheme's clipping distance from a block's queries without a mask
    #: (Shaw's own path, DeBERTa's ``side_terms``), so its blocks are ``sided_block_rows`` long
    #: (:class:`~posenc_lib.attention.backends.AttentionTuning`)
    clipped_sides = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for flag, hook in (("adds_bias", "bias"), ("adds_scores", "scores"), ("adds_values", "values")):
            if flag not in cls.__dict__:
                setattr(cls, flag, getattr(cls, hook) is not getattr(PositionScheme, hook))

    def __init__(self, d_model: int, n_heads: int, num_layers: int, causal: bool = False):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = check_divides(d_model, n_heads)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.causal = check_bool("causal", causal)

    # -- the hooks --------------------------------------------------------------------------
    def embed(self, positions: torch.Tensor) -> torch.Tensor | None:
        """``(seq, d_model)`` code added to the token embeddings, or ``None``."""
        return None

    def prepare(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> dict[str, Any]:
        """``prep``: what every layer of the stack reuses in one forward pass (the positions, and what the scheme
        builds from them)."""
        check_positions(q_pos, k_pos)
        return {"q_pos": q_pos, "k_pos": k_pos}

    def prepare_step(self, q_pos: torch.Tensor, k_pos: torch.Tensor, state: dict) -> dict[str, Any]:
        """The ``prep`` of a decoding step with a cache: :meth:`prepare`'s, plus ``state`` as ``"step_state"``.

        ``state`` lives as long as the cache: what a scheme keeps in it (tables that depend only on its
        parameters and distances) is built at the first step and reused.  A scheme whose one-query step
        needs less than :meth:`prepare` builds overrides this.
        """
        return {**self.prepare(q_pos, k_pos), "step_state": state}

    def rotate(self, q: torch.Tensor, k: torch.Tensor, prep: dict, layer: int):
        """Rotate ``q`` and the *new* keys ``k`` (both at positions ``prep['q_pos']``)."""
        return q, k

    def bias(self, prep: dict, layer: int) -> torch.Tensor | None:
        """Content-free score bias broadcastable to ``(batch, heads, q_len, k_len)``."""
        return None

    def scores(self, q: torch.Tensor, k: torch.Tensor, prep: dict, layer: int, attn: "MultiHeadAttention"):
        """Extra (unscaled) score terms ``(batch, heads, q_len, k_len)``, or ``None``."""
        return None

    def values(self, probs: torch.Tensor, prep: dict, layer: int) -> torch.Tensor | None:
        """Extra output term ``(batch, heads, q_len, head_dim)`` from the attention weights."""
        return None

    @property
    def splits_queries(self) -> bool:
        """True when :meth:`query_slice` is defined for this scheme's score and value terms."""
        return not (self.adds_scores or self.adds_values) or (
            type(self).query_slice is not PositionScheme.query_slice
        )

    def query_slice(self, prep: dict, start: int, end: int) -> dict:
        """The ``prep`` of query rows ``start:end`` of ``prep`` (attention over query blocks).

        A bias needs nothing here (the bias tensor itself is sliced); a scheme with score or
        value terms overrides this to slice its relative-index structures (until it does,
        its attention runs in one piece).
        """
        return {**prep, "q_pos": prep["q_pos"][start:end]}

    def key_slice(self, prep: dict, k_end: int) -> dict | None:
        """The ``prep`` of ``prep`` (one query block's) for keys ``0:k_end`` only, or ``None`` if the scheme
        cannot drop keys.  A causal block needs no key after its last query: its score terms are built
        for those keys alone (:func:`~posenc_lib.attention.blocks.last_key`)."""
        return None

    # -- facts for the comparison table ------------------------------------------------------
    @property
    def fused(self) -> bool:
        """True when attention can use the fused ``scaled_dot_product_attention`` kernel."""
        return choose_attention_path(self, q_len=1, k_len=1, causal=False, padded=False).fused

    def extra_repr(self) -> str:
        return f"causal={self.causal}"


@dataclass(frozen=True)
class AttentionPath:
    """How one attention call is computed (see :func:`choose_attention_path`).

    ``fused``: ``scaled_dot_product_attention``, else scores and softmax written out.
    ``is_causal``: fused only; SDPA applies the causal mask itself and gets no ``attn_mask``
    (the one form every kernel, flash included, accepts).
    ``causal_mask``: a causal part must be built into the boolean mask.
    """

    fused: bool
    is_causal: bool
    causal_mask: bool


def choose_attention_path(
    scheme: PositionScheme | None,
    *,
    q_len: int,
    k_len: int,
    causal: bool,
    padded: bool,
    need_weights: bool = False,
) -> AttentionPath:
    """Pick the computation from what ``scheme`` declares and the call's shape (no tensors read).

    * score or value terms (shaw, xlnet, deberta), or weights wanted: explicit softmax;
    * otherwise the fused kernel; a bias (t5, alibi) rides along as a float ``attn_mask``;
    * causal self-attention: queries are the newest ``q_len`` keys, so one query (a cached
      step) needs no causal mask, and ``q_len == k_len`` with no padding and no bias goes to
      SDPA as ``is_causal=True`` with no mask.  SDPA's ``is_causal`` is aligned top-left, so it
      is never used when ``q_len != k_len``.
    """
    adds_scores = scheme is not None and scheme.adds_scores
    adds_values = scheme is not None and scheme.adds_values
    adds_bias = scheme is not None and scheme.adds_bias
    fused = not (adds_scores or adds_values or need_weights)
    needs_causal = causal and q_len > 1
    is_causal = fused and needs_causal and q_len == k_len and not padded and not adds_bias
    return AttentionPath(fused=fused, is_causal=is_causal, causal_mask=needs_causal and not is_causal)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (batch first) with position-scheme hooks and an optional cache."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.head_dim = check_divides(d_model, n_heads)
        dropout = check_float_range("dropout", dropout, 0.0, 1.0, high_open=True)
        bias = check_bool("bias", bias)
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        #: set True to keep the last attention weights in ``last_weights`` (for plots)
        self.keep_weights = False
        self.last_weights: torch.Tensor | None = None

    #: set by :func:`~posenc_lib.models.decoding.packed_weights` for the span of a cached decoding loop: ``x ->`` the
    #: ``(batch, len, 3 * d_model)`` queries, keys and values of self-attention in one product, or ``None`` where ``x``
    #: has too many rows for it (the three projections then run as they are)
    step_qkv = None
    #: set True (the ``gpu`` training profile) to make self-attention's queries, keys and values with one matrix
    #: product over the three weights concatenated: one kernel instead of three, the same parameters
    fused_qkv = False

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, len, d_model) -> (batch, heads, len, head_dim)``."""
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        kv: torch.Tensor | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
        scheme: PositionScheme | None = None,
        prep: dict | None = None,
        layer: int = 0,
        cache: dict | None = None,
        need_weights: bool = False,
    ):
        """Attend from ``x (batch, q_len, d_model)`` to ``kv`` (default: ``x``, self-attention).

        ``cache``: a dict this layer owns during incremental decoding.  For self-attention it accumulates keys/values
        (RoPE keys already rotated) in preallocated buffers; for cross-attention it stores the projected memory once.
        Returns ``(batch, q_len, d_model)``, and the attention weights if ``need_weights``.
        """
        if cache is None:  # a cached call is a decoding step: its model checked the inputs at the first step
            if scheme is not None and not isinstance(scheme, PositionScheme):
                raise TypeError(f"scheme must be a PositionScheme (make_scheme(...)) or None, got {type(scheme).__name__}")
            check_attention_call(self.d_model, x, kv, key_padding_mask, causal, need_weights, layer,
                                 None if scheme is None else scheme.num_layers)
        b, q_len, _ = x.shape
        want_weights = need_weights or self.keep_weights
        if kv is None and cache is not None and not want_weights and causal and (
                takes_self_step(self, x, key_padding_mask, scheme, cache, backends.TUNING.block_elements)):
            path = choose_attention_path(scheme, q_len=1, k_len=cached_len(cache) + 1, causal=True, padded=False)
            return self_attention_step(self, x, scheme, prep, layer, cache, path)  # a decoding step (attention/step.py)
        q, k, v = self._project(x, kv, scheme, prep, layer, cache)
        k_len = k.shape[2]
        if kv is not None and cache is not None and not want_weights and cross_step(q):
            out = cross_attention(q, cache, key_padding_mask, 1.0 / math.sqrt(self.head_dim))
            return self.out_proj(out.transpose(1, 2).reshape(b, q_len, self.d_model))
        path = choose_attention_path(scheme, q_len=q_len, k_len=k_len, causal=causal, padded=key_padding_mask is not None,
                                     need_weights=want_weights)  # fmt: skip
        q_pos, k_pos = (prep["q_pos"], prep["k_pos"]) if prep is not None else (None, None)
        if causal and q_pos is None:
            q_pos, k_pos = torch.arange(k_len - q_len, k_len, device=x.device), torch.arange(k_len, device=x.device)
        allowed = merge_masks(q_len, k_len, causal=path.causal_mask, q_pos=q_pos, k_pos=k_pos,
                              key_padding_mask=key_padding_mask)  # fmt: skip
        call = AttentionCall(q, k, v, allowed, scheme, prep, layer, self, path, scale_of(self.head_dim, scheme),
                             self.dropout if self.training else 0.0, want_weights, key_padding_mask=key_padding_mask,
                             self_attention=kv is None)  # fmt: skip
        out, probs = attend(call)
        out = self.out_proj(out.transpose(1, 2).reshape(b, q_len, self.d_model))
        if self.keep_weights:
            self.last_weights = probs.detach()
        return (out, probs) if need_weights else out

    def qkv_weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The q, k and v projections' weights ``(3 * d_model, d_model)`` and biases (or None) stacked in that order."""
        w = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
        b = self.q_proj.bias
        return w, None if b is None else torch.cat((b, self.k_proj.bias, self.v_proj.bias))

    def qkv_product(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, len, 3 * d_model)``: ``x``'s queries, keys and values in one product (gradients reach the three
        projections' own weights through the concatenation)."""
        return F.linear(x, *self.qkv_weights())

    def _project(self, x, kv, scheme, prep, layer: int, cache):
        """``(q, k, v)``, each ``(batch, heads, len, head_dim)``: self-attention's rotated by the scheme and its keys
        and values appended to the cache; cross-attention's keys and values projected once per cache (no positions)."""
        qkv = self.step_qkv(x) if kv is None and self.step_qkv is not None else None
        if qkv is None and kv is None and self.fused_qkv:
            qkv = self.qkv_product(x)
        if qkv is not None:  # q, k and v from one product (a cached decoding step, or fused_qkv)
            q, k, v = (self.split(t) for t in qkv.chunk(3, dim=-1))
        else:
            q = self.split(self.q_proj(x))
        if kv is None:  # self-attention
            if qkv is None:
                k, v = self.split(self.k_proj(x)), self.split(self.v_proj(x))
            if scheme is not None:
                q, k = scheme.rotate(q, k, prep, layer)
            if cache is not None:
                k, v = append_to_cache(cache, k, v)
        elif cache is not None and "k" in cache:  # cross-attention: the memory's keys and values, kept
            k, v = cache["k"], cache["v"]
        else:
            k, v = self.split(self.k_proj(kv)), self.split(self.v_proj(kv))
            if cache is not None:
                cache["k"], cache["v"] = k, v
        return q, k, v


class _TunedModule(types.ModuleType):
    """This module, with the thresholds of :data:`~posenc_lib.attention.backends.TUNING` as upper-case attributes
    (``layer.BLOCK_ELEMENTS``, ...), read from it and set through :func:`~posenc_lib.attention.backends.tune`."""


for _field in fields(backends.AttentionTuning):
    setattr(_TunedModule, _field.name.upper(), property(
        lambda self, name=_field.name: getattr(backends.TUNING, name),
        lambda self, value, name=_field.name: backends.tune(**{name: value}),
    ))  # fmt: skip
sys.modules[__name__].__class__ = _TunedModule
