"""Greedy decoding with a key/value cache (and without, for comparison).

With ``use_cache=True`` each step feeds only the newest token: every decoder
layer appends its key and value to a cache (RoPE keys rotated once, at their
own absolute position) and the position scheme builds its bias or relative
indices for the one new query row against all cached keys.  With
``use_cache=False`` the whole prefix is re-run at every step, as the seed
report did; both must give identical tokens.

Stopping early once every row has finished needs one read from the device.
On CPU that read is free and happens after every step; on an accelerator it
happens every :data:`SYNC_EVERY` steps, so the device is not stalled at each
token, and the extra columns (padding only) are cut off at the end, so the
result is the same either way.

On CPU (float32, where torch has oneDNN) the cached loop multiplies its few rows by weights laid out once for
oneDNN's product (:func:`packed_weights`, what :func:`torch.compile`'s freezing does for CPU inference): the
decoder's linear layers of at least :data:`PACK_MIN_ELEMENTS` weights, each self-attention's three projections as
one, and the output matrix, made when the first loop starts and kept for later loops while the weights stay as they
were.  The loop runs in inference mode, and each step of one query takes the short paths of
:mod:`posenc_lib.attention.step` and :meth:`~posenc_lib.models.seq2seq.DecoderLayer.step`.

``compile=True`` runs each cached step as one graph compiled by :func:`torch.compile` (the step's
embedding, decoder layers, output product and argmax), which removes most of the time a step spends
between operators (Python, module calls, dispatch: a quarter to a third of a step at batch 8 on CPU,
``benchmarks/decode_profile.py``).  The first call for a model compiles (tens of seconds on 2 CPU
cores; compiled graphs are cached on disk for later processes), so it pays for long or repeated
decoding, not for one sentence.  The tokens are those of the uncompiled step (checked for every scheme
by ``tests/test_decoding_compiled.py`` and by the decoding benchmark).  Where no compiler works, the
step runs uncompiled with a warning.

Taught in notebooks/06_rope.ipynb (the cache) and used by notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import contextlib
import functools
import numbers
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .seq2seq import FEW_ROWS, Seq2SeqTransformer
from ..checks import check_bool, check_positive_int, check_token_tensor

#: on an accelerator, decoding loops check "has every row finished?" once per this many steps
SYNC_EVERY = 8


def check_token_id(name: str, value, vocab_size: int) -> int:
    """``value`` if it is a token id of a vocabulary of ``vocab_size``, i.e. an int in ``[0, vocab_size)``.

    A non-integer is a ``TypeError``, an id outside the vocabulary a ``ValueError``; both name
    the argument, the value and the valid range.
    """
    allowed = f"an integer in [0, {vocab_size - 1}]"
    detail = f"a token id in [0, vocab_size) with vocab_size={vocab_size}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__}): {detail}")
    if not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be {allowed}, got {value!r}: {detail}")
    return int(value)


def check_model(model) -> None:
    """``model`` can be decoded: a :class:`Seq2SeqTransformer`, or a model of its own with its ``encode``, ``decode``,
    ``new_cache``, ``vocab_size`` and ``pad_id``."""
    if not all(hasattr(model, a) for a in ("encode", "decode", "new_cache", "vocab_size", "pad_id")):
        raise TypeError(f"model must be a Seq2SeqTransformer (build_model(...)) or have its encode, decode, new_cache, "
                        f"vocab_size and pad_id, got {type(model).__name__}")  # fmt: skip


#: the largest number of graphs :func:`torch.compile` keeps for the decoding step's code: a model needs two (the
#: first step and the others, the cache being sized for the whole loop), but every model has its own and all share
#: the one limit (torch's default, 8, would send the fifth model of a process back to the uncompiled step unnoticed)
COMPILED_GRAPHS_LIMIT = 512

#: the :func:`torch.compile` backend of the decoding step, and inductor's options for it: a C++ wrapper calls
#: the step's kernels, so the Python left between them is gone too (a step at batch 8 is made of many small calls)
COMPILE_BACKEND = "inductor"
COMPILE_OPTIONS = {"cpp_wrapper": True}

#: the compiled :func:`greedy_step` of each model (weakly: it goes with the model)
COMPILED_STEPS: "weakref.WeakKeyDictionary[Seq2SeqTransformer, object]" = weakref.WeakKeyDictionary()


def greedy_step(model: Seq2SeqTransformer, inp, memory, memory_key_padding_mask, cache, done, pad_id: int):
    """One cached greedy step: the next token of every row (``pad_id`` where the row has finished)."""
    logits = model.decode_unchecked(inp, memory, memory_key_padding_mask, None, cache)
    return logits[:, -1].argmax(-1).masked_fill(done, pad_id)


def _compiled_step(model: Seq2SeqTransformer):
    """:func:`greedy_step` compiled for ``model`` (made once per model, kept while the model lives)."""
    step = COMPILED_STEPS.get(model)
    if step is None:
        options = dict(COMPILE_OPTIONS) if COMPILE_BACKEND == "inductor" else None
        step = COMPILED_STEPS[model] = torch.compile(greedy_step, dynamic=True, backend=COMPILE_BACKEND,
                                                     options=options)
    return step


#: lay out the decoder's weights for oneDNN during a cached decoding loop on CPU (:func:`packed_weights`); ``False``
#: multiplies by the weights as they are
PACK_WEIGHTS = True


#: the smallest weight (in elements) whose layer multiplies by a packed copy: below it the matrix library's own
#: product of a step's few rows is as fast (measured: benchmarks/README.md)
PACK_MIN_ELEMENTS = 2**17


def packable(model: Seq2SeqTransformer) -> bool:
    """Whether :func:`packed_weights` lays out ``model``'s weights (a float32 CPU Seq2SeqTransformer, oneDNN there)."""
    if not isinstance(model, Seq2SeqTransformer):  # a model of its own with decode/encode: left as it is
        return False
    weight = model.embed.weight
    return (PACK_WEIGHTS and weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packed_linear(layer: nn.Linear, packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` through oneDNN's product with the weight laid out for it (``packed``), for at most
    :data:`~posenc_lib.models.seq2seq.FEW_ROWS` rows; more rows (the cross-attention's keys of the whole source)
    take the layer's own product."""
    if x.numel() > FEW_ROWS * x.shape[-1]:
        return F.linear(x, layer.weight, layer.bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")


def packed_qkv(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """A self-attention's queries, keys and values of few rows ``x`` in one product with their three weights laid
    out together (``packed``); ``None`` for more rows (the layer then projects them one by one)."""
    if x.numel() > FEW_ROWS * x.shape[-1]:
        return None
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class _Packs:
    """The laid-out weights of one model for products of ``rows`` rows, and what they were made from."""

    def __init__(self, model: Seq2SeqTransformer, rows: int):
        self.rows, self.stamp = rows, _stamp(model)
        self.linears = []  # (layer, packed weight): every linear layer of the decoder
        self.qkv = []  # (self-attention, packed [W_q; W_k; W_v], [b_q; b_k; b_v]): their three projections in one
        with torch.no_grad():
            for layer in model.decoder.modules():
                if isinstance(layer, nn.Linear) and layer.weight.numel() >= PACK_MIN_ELEMENTS:
                    self.linears.append((layer, torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), rows)))
            for block in model.decoder:
                attn = block.self_attn
                with torch.no_grad():
                    weight, bias = attn.qkv_weights()
                if weight.numel() >= PACK_MIN_ELEMENTS:
                    self.qkv.append((attn, torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias))
            out = model.embed.weight if model.out_proj is None else model.out_proj.weight
            small = out.numel() < PACK_MIN_ELEMENTS  # then Seq2SeqTransformer.logits' own product
            self.logits = None if small else torch.ops.mkldnn._reorder_linear_weight(out.detach(), rows)


def _stamp(model: Seq2SeqTransformer) -> tuple:
    """What packed copies of ``model``'s weights depend on: each parameter's storage, version (any change in place,
    an optimiser's step or ``load_state_dict``, raises it), shape and dtype, for the decoder and the output matrix."""
    params = list(model.decoder.parameters()) + [model.embed.weight if model.out_proj is None else model.out_proj.weight]
    return tuple((p.data_ptr(), p._version, tuple(p.shape), p.dtype) for p in params)


#: the packed copies of each model, kept between decoding loops while its weights stay as they were (weakly: they go
#: with the model); :func:`release_packed_weights` drops them
PACKED: "weakref.WeakKeyDictionary[Seq2SeqTransformer, _Packs]" = weakref.WeakKeyDictionary()


def release_packed_weights(model: Seq2SeqTransformer) -> None:
    """Drop the copies of ``model``'s weights that cached decoding laid out (:func:`packed_weights`), if any."""
    PACKED.pop(model, None)


@contextlib.contextmanager
def packed_weights(model: Seq2SeqTransformer, rows: int):
    """While the block runs, the decoder's linear layers and the output product of ``model`` (CPU, float32) multiply
    by copies of their weights laid out once for oneDNN's product of ``rows`` rows, instead of by the weights as
    they are: the matrix library then need not rearrange each weight at every call.  A cached step at batch 8
    multiplies 8 rows by every weight of the decoder and by the output matrix; those products, as in the decoding
    benchmark's model (17 weights, 8 rows, 2 threads, weights cycled as in a step), took 757 us instead of 2109 us.
    Each self-attention's three projections run as one product with their weights laid out together.
    The sums are the same, rounded in another order.  Elsewhere (a GPU, another dtype, ``PACK_WEIGHTS = False``)
    nothing changes.  When the block ends the model is as it was; the copies are kept for the next block of the
    same ``rows`` (laying them out took about 10 ms for that model) and made again once any weight of the decoder or
    the output matrix has changed (:func:`_stamp`), or dropped by :func:`release_packed_weights`."""
    if not packable(model):
        yield
        return
    packs = PACKED.get(model)
    if packs is None or packs.rows != rows or packs.stamp != _stamp(model):
        packs = PACKED[model] = _Packs(model, rows)
    patched = []
    try:
        for layer, packed in packs.linears:
            if "forward" not in layer.__dict__:
                layer.forward = functools.partial(packed_linear, layer, packed)
                patched.append(layer)
        for attn, packed, bias in packs.qkv:
            attn.step_qkv = functools.partial(packed_qkv, packed, bias)
        model.packed_logits = packs.logits
        yield
    finally:
        for layer in patched:
            del layer.forward
        for attn, _, _ in packs.qkv:
            attn.__dict__.pop("step_qkv", None)
        model.packed_logits = None


def sync_every(device: torch.device) -> int:
    """Steps between reads of the "all finished" flag: 1 on CPU (free), :data:`SYNC_EVERY` elsewhere."""
    return 1 if device.type == "cpu" else SYNC_EVERY


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqTransformer,
    src: torch.Tensor,
    *,
    max_new_tokens: int,
    bos_id: int,
    eos_id: int | None,
    use_cache: bool = True,
    src_key_padding_mask: torch.Tensor | None = None,
    pad_id: int | None = None,
    compile: bool = False,
) -> torch.Tensor:
    """Decode ``src (B, S)`` greedily; returns ``(B, <= max_new_tokens + 1)`` ids starting with ``bos_id``.

    Rows that produced ``eos_id`` are filled with ``pad_id`` (default: the
    model's) afterwards; decoding stops early once every row has finished.
    ``eos_id=None``: no token ends a row, exactly ``max_new_tokens`` are decoded.
    ``bos_id``, ``eos_id`` and ``pad_id`` must be token ids of the model, in ``[0, vocab_size)``.
    ``compile=True`` (with the cache only) runs each step compiled (see the module's notes).
    """
    check_model(model)
    check_token_tensor("src", src)
    max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
    check_token_id("bos_id", bos_id, model.vocab_size)
    if eos_id is not None:  # None: no end token, always decode max_new_tokens (benchmarks)
        check_token_id("eos_id", eos_id, model.vocab_size)
    pad_id = model.pad_id if pad_id is None else check_token_id("pad_id", pad_id, model.vocab_size)
    check_bool("use_cache", use_cache)
    check_bool("compile", compile)
    if compile and not use_cache:
        raise ValueError("compile=True needs use_cache=True: only the cached step is compiled")
    was_training = model.training
    model.eval()
    # the compiled step keeps two graphs per model, all models under one limit: allow many models
    graphs = torch._dynamo.config.patch(recompile_limit=COMPILED_GRAPHS_LIMIT) if compile else contextlib.nullcontext()
    few = use_cache and not compile and 0 < src.shape[0] <= FEW_ROWS  # a cached step's rows: one per sequence
    # uncompiled, the loop runs in inference mode (no autograd bookkeeping at all: a step of many small operations
    # at batch 8 took about 9% less time than under no_grad); the ids returned are an ordinary tensor
    mode = contextlib.nullcontext() if compile else torch.inference_mode()
    with graphs, mode, (packed_weights(model, src.shape[0]) if few else contextlib.nullcontext()):
        try:
            memory = model.encode(src, src_key_padding_mask)
            b = src.shape[0]
            ys = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)
            done = torch.zeros(b, dtype=torch.bool, device=src.device)
            # columns needed: 1 + the step at which the last row finished (kept on the device)
            width = torch.full((), max_new_tokens + 1, dtype=torch.long, device=src.device)
            every = sync_every(src.device)
            can_stop = eos_id is not None or b == 0  # without an end token only an empty batch is done at once
            # compiled: buffers sized for the whole loop at once (one more than it fills, never exactly full), so
            # no step needs a graph of its own for a grown or a full buffer
            capacity = max_new_tokens + 1 if compile else None
            cache = (model.new_cache() if capacity is None else model.new_cache(capacity)) if use_cache else None
            step_fn = _compiled_step(model) if compile else None
            own = isinstance(model, Seq2SeqTransformer)  # the library's model (not a duck-typed one): unchecked steps
            inp = ys
            for step in range(max_new_tokens):
                if step_fn is None:
                    inp = ys[:, -1:] if use_cache else ys
                    if step == 0 or not own:
                        logits = model.decode(inp, memory, memory_key_padding_mask=src_key_padding_mask, cache=cache)
                    else:  # ids from the argmax, masks checked at the first step: only the length is left to check
                        model.check_length(model.dec_scheme, step + 1, "a target")
                        logits = model.decode_unchecked(inp, memory, src_key_padding_mask, None, cache)
                    nxt = logits[:, -1].argmax(-1).masked_fill(done, pad_id)
                else:  # ids and masks checked above, new ids from the argmax: only the length is left to check
                    model.check_length(model.dec_scheme, step + 1, "a target")
                    try:
                        nxt = step_fn(model, inp, memory, src_key_padding_mask, cache, done, pad_id)
                    except Exception as err:  # noqa: BLE001 (no working compiler: decode uncompiled)
                        if step > 0 or not _compile_failure(err):
                            raise
                        warnings.warn(f"greedy_decode(compile=True): torch.compile failed ({type(err).__name__}: "
                                      f"{str(err).splitlines()[0] if str(err) else ''}); decoding without it", stacklevel=3)
                        step_fn, cache = None, model.new_cache()  # nothing of the failed step is kept
                        logits = model.decode(inp, memory, memory_key_padding_mask=src_key_padding_mask, cache=cache)
                        nxt = logits[:, -1].argmax(-1).masked_fill(done, pad_id)
                ys = torch.cat((ys, nxt[:, None]), dim=1)
                inp = nxt[:, None]  # the compiled step's next input: always the same strides
                if eos_id is not None:
                    done |= nxt == eos_id
                if every > 1:  # the columns to keep, read once after the loop
                    width = torch.where(done.all() & (width > step + 2), step + 2, width)
                if can_stop and (step + 1) % every == 0 and bool(done.all()):
                    break
            if ys.shape[1] > 1 and every > 1:
                ys = ys[:, : int(width)]  # one read, after the loop
        finally:
            model.train(was_training)
    return ys.clone() if ys.is_inference() else ys  # a copy made outside inference mode is an ordinary tensor


def _compile_failure(err: BaseException) -> bool:
    """True for an error of :func:`torch.compile` itself (a missing or failing compiler, an unsupported
    operation), not one of the model (a bad input raises the same error uncompiled)."""
    names = {type(e).__module__.split(".")[:2][-1] for e in (err, err.__cause__) if e is not None}
    return bool(names & {"_dynamo", "_inductor"}) or "CppCompileError" in type(err).__name__
