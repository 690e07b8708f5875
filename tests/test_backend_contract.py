"""The backend contract: every attention backend (posenc_lib/attention/backends.py) computes the explicit softmax's
function, output and gradients, for every scheme it applies to; which one runs is a question of speed alone.

Each backend is reached the way the model reaches it, through ``select_backend`` under the tuning that sends a small
call to it (the fused CPU paths from one score element, blocks of 4 query rows), for the calls of a scheme it applies
to (encoder or causal, with or without padding); the reference is the same layer asked for its weights, which always
takes the explicit path.  FlexAttention has no backward pass on CPU in this torch: its outputs are compared alone."""
import contextlib
import functools

import pytest
import torch

from posenc_lib import ALL_TYPES, make_scheme, set_seed
from posenc_lib.attention import backends, flex
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.schemes import alibi, t5

D, H, N = 32, 4, 13
FUSED = dict(fused_min_elements=1, fused_block_rows=4, sided_block_rows=None)
#: what sends a small call to each backend: tuning fields, and whether T5's and ALiBi's biases are kept as values per
#: offset (``offsets``), FlexAttention is switched on (``flex``), gradients are taken (``grad``)
SETTINGS = {
    "sdpa": dict(tuning=dict(flush_min_elements=1)),  # with a bias: denormals flushed, in the fused CPU kernel
    "explicit": dict(tuning={}),
    "blocks": dict(tuning=dict(cpu_flash=False, block_elements=2 * H * 4 * N)),  # blocks of 4 query rows
    "flex": dict(tuning={}, flex=True, grad=False),
    # a padding query's row is its own (it sees the row's pads): the tokens' rows are compared, as the model reads them
    "varlen": dict(tuning=dict(varlen=True), token_rows=True),
    "cpu_mask": dict(tuning=FUSED),
    "cpu_mask_blocks": dict(tuning=FUSED),
    "cpu_values": dict(tuning=FUSED),
    "cpu_shared_parts": dict(tuning=FUSED),
    "cpu_parts": dict(tuning=FUSED),
    "cpu_whole_offsets": dict(tuning=FUSED, offsets=True),
    "cpu_offsets": dict(tuning=FUSED, offsets=True),
}
#: the calls tried for each scheme: (causal, padded, batch)
CALLS = [(False, False, 2), (False, True, 2), (True, False, 2), (True, True, 2), (False, False, 1)]
BIAS, SCORES = {"t5", "alibi", "fire", "kerple"}, {"shaw", "xlnet", "deberta", "cope"}
#: the schemes each backend applies to under its setting (for at least one of the calls): what the schemes declare
#: (a bias, learned or not; score terms; Shaw's value term and own kernel; parts; values per offset)
APPLIES = {
    "sdpa": set(ALL_TYPES) - SCORES,
    "explicit": SCORES,
    "blocks": (BIAS - {"alibi"}) | SCORES,  # score terms, or a bias with a gradient
    "flex": BIAS | SCORES,
    "varlen": set(ALL_TYPES) - BIAS - SCORES,  # padded calls of schemes that add nothing to the scores
    "cpu_mask": BIAS - {"alibi"},
    "cpu_mask_blocks": BIAS - {"alibi"},  # a padded batch: a mask per batch row
    "cpu_values": {"shaw"},
    "cpu_shared_parts": {"xlnet", "deberta"},
    "cpu_parts": {"cope"},
    "cpu_whole_offsets": {"t5"},
    "cpu_offsets": {"t5", "alibi"},
}
CASES = [(pe, backend) for backend in sorted(APPLIES) for pe in ALL_TYPES if pe in APPLIES[backend]]


def test_every_backend_has_a_setting_and_schemes():
    assert set(SETTINGS) == set(APPLIES) == set(backends.BACKENDS)
    assert all(APPLIES.values())


@contextlib.contextmanager
def _setting(backend: str):
    """The tuning, environment and scheme thresholds of ``SETTINGS[backend]``, undone on exit."""
    setting = SETTINGS[backend]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backends, "TUNING", backends.AttentionTuning(**setting["tuning"]))
        if setting.get("offsets"):
            patch.setattr(t5, "TOEPLITZ_MIN_ELEMENTS", 1)
            patch.setattr(alibi, "OFFSET_MIN_ELEMENTS", 1)
        if setting.get("flex"):
            patch.setenv(flex.ENV, "1")
        else:
            patch.delenv(flex.ENV, raising=False)
        yield


def _layer_and_inputs(pe: str, causal: bool, padded: bool, batch: int):
    set_seed(0)
    scheme = make_scheme(pe, D, H, 1, causal=causal)
    attn = MultiHeadAttention(D, H).train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, N, D, generator=g)
    pad = None
    if padded:
        pad = torch.zeros(batch, N, dtype=torch.bool)
        pad[-1, 9:] = True
    return scheme, attn, x, pad


def _run(scheme, attn, x, pad, causal: bool, need_weights: bool = False):
    prep = scheme.prepare(torch.arange(N), torch.arange(N))  # fresh: a context keeps the bias it lays out
    out = attn(x, causal=causal, scheme=scheme, prep=prep, key_padding_mask=pad, need_weights=need_weights)
    return out[0] if need_weights else out


def _chosen(scheme, attn, x, pad, causal: bool) -> list[str]:
    """The backends ``select_backend`` picked for one call of the layer."""
    seen, real = [], backends.select_backend

    def spy(*a, **kw):
        chosen = real(*a, **kw)
        seen.append(chosen.backend)
        return chosen

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backends, "select_backend", spy)
        _run(scheme, attn, x, pad, causal)
    return seen


@functools.lru_cache(maxsize=None)
def _calls_taking(pe: str, backend: str) -> tuple:
    """The calls of :data:`CALLS` for which ``select_backend`` picks ``backend`` under its setting."""
    found = []
    with _setting(backend), torch.set_grad_enabled(SETTINGS[backend].get("grad", True)):
        for causal, padded, batch in CALLS:
            scheme, attn, x, pad = _layer_and_inputs(pe, causal, padded, batch)
            if _chosen(scheme, attn, x, pad, causal) == [backend]:
                found.append((causal, padded, batch))
    return tuple(found)


def _output_and_grads(scheme, attn, x, pad, causal: bool, need_weights: bool, grad: bool, rows=None):
    """The layer's output and gradients; ``rows (batch, N)``: the query rows whose outputs the gradient is of."""
    x = x.clone().requires_grad_(grad)
    with torch.set_grad_enabled(grad):
        out = _run(scheme, attn, x, pad, causal, need_weights)
        if not grad:
            return out, {}
        params = {f"attn.{n}": p for n, p in attn.named_parameters()}
        params |= {f"scheme.{n}": p for n, p in scheme.named_parameters()}
        d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        if rows is not None:
            d_out = d_out * rows[..., None]
        grads = torch.autograd.grad(out, [x, *params.values()], d_out, allow_unused=True)
        return out.detach(), {name: g for name, g in zip(["x", *params], grads) if g is not None}


@pytest.mark.parametrize("pe, backend", CASES)
def test_backend_equals_the_explicit_softmax(pe, backend):
    calls = _calls_taking(pe, backend)
    assert calls, f"select_backend never picks {backend} for {pe}"
    grad = SETTINGS[backend].get("grad", True)
    for causal, padded, batch in calls:
        scheme, attn, x, pad = _layer_and_inputs(pe, causal, padded, batch)
        rows = ~pad if SETTINGS[backend].get("token_rows") and pad is not None else None
        ref, ref_grads = _output_and_grads(scheme, attn, x, pad, causal, need_weights=True, grad=grad, rows=rows)
        with _setting(backend):
            got, got_grads = _output_and_grads(scheme, attn, x, pad, causal, need_weights=False, grad=grad, rows=rows)
        if rows is not None:
            got, ref = got[rows], ref[rows]
        case = f"{pe} {backend} causal={causal} padded={padded} batch={batch}"
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4, msg=case)
        assert got_grads.keys() == ref_grads.keys(), case
        for name, g in ref_grads.items():
            torch.testing.assert_close(got_grads[name], g, atol=1e-5, rtol=1e-4, msg=f"{case}: d {name}")


@pytest.mark.parametrize("backend", sorted(APPLIES))
def test_a_backend_is_picked_for_the_schemes_it_applies_to_only(backend):
    taking = {pe for pe in ALL_TYPES if _calls_taking(pe, backend)}
    assert taking == APPLIES[backend]
