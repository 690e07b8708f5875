"""Denormal floats flushed where they cost (posenc_lib.attention.cpu_flash.flush_denormals), and T5's bias laid
out along its diagonals (posenc_lib.utils.toeplitz_bias) for long windows: the same function and gradients as
before, the mode restored afterwards, and the course's small calls left bit for bit as they were."""
import os

import pytest
import torch

from posenc_lib import build_model, set_seed
from posenc_lib.attention import cpu_flash
from posenc_lib.attention import layer as attention
from posenc_lib.schemes import t5 as t5_module
from posenc_lib.schemes.t5 import T5Bias
from posenc_lib.utils import consecutive, table_bias, toeplitz_bias

needs_mode = pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU has no flush-to-zero mode")


@needs_mode
def test_flush_denormals_is_on_inside_and_restored_after():
    assert not cpu_flash.flushing()
    tiny = torch.tensor([2.0**-120])
    assert (tiny * 2.0**-10).item() > 0  # a denormal result survives
    with cpu_flash.flush_denormals():
        assert cpu_flash.flushing()
        assert (tiny * 2.0**-10).item() == 0.0
    assert not cpu_flash.flushing()
    torch.set_flush_denormal(True)  # a caller who had it on keeps it on
    try:
        with cpu_flash.flush_denormals():
            pass
        assert cpu_flash.flushing()
    finally:
        torch.set_flush_denormal(False)


@needs_mode
def test_an_exception_inside_restores_the_mode():
    with pytest.raises(RuntimeError):
        with cpu_flash.flush_denormals():
            raise RuntimeError("boom")
    assert not cpu_flash.flushing()


@needs_mode
def test_the_fused_kernel_flushes_in_its_forward_pass():
    """Values 2**-128 times weights of 1/8: the exact output is a denormal, which the kernel under
    :func:`flush_denormals` returns as 0 while SDPA outside it keeps it; the mode is off again afterwards."""
    q = torch.zeros(1, 1, 2, 4)
    k = torch.zeros(1, 1, 8, 4)
    v = torch.full((1, 1, 8, 4), 2.0**-128)
    mask = torch.zeros(1, 1, 2, 8)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (plain > 0).all()
    assert (cpu_flash.flash_attention(q, k, v, mask, 0.5) == 0).all()
    assert not cpu_flash.flushing()


def _step(pe: str, *, seq: int, batch: int, padded: bool):
    set_seed(0)
    model = build_model(pe, vocab_size=50, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0)
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 50, (batch, seq), generator=g)
    tgt = torch.randint(3, 50, (batch, seq + 1), generator=g)
    if padded:
        src[0, seq - 5 :] = model.pad_id
    loss = model.loss(src, tgt[:, :-1], tgt[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("padded", [False, True])
def test_alibi_through_the_flushing_kernel_gives_the_same_loss_and_gradients(padded, monkeypatch):
    """ALiBi's fused calls above FLUSH_MIN_ELEMENTS go through cpu_flash (a mask without gradient): loss and
    every gradient as with SDPA itself, with and without padding (encoder, causal decoder, cross-attention)."""
    calls = []
    real = cpu_flash.flash_attention
    monkeypatch.setattr(cpu_flash, "flash_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention, "FLUSH_MIN_ELEMENTS", None)
    ref_loss, ref = _step("alibi", seq=24, batch=2, padded=padded)
    assert not calls
    monkeypatch.setattr(attention, "FLUSH_MIN_ELEMENTS", 1)
    loss, got = _step("alibi", seq=24, batch=2, padded=padded)
    assert len(calls) == 2  # the encoder's and the decoder's self-attention (cross-attention has no bias)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-6, rtol=1e-5, msg=name)


def test_calls_below_the_threshold_and_without_a_bias_keep_sdpa(monkeypatch):
    """The course's small models and the schemes without a bias never reach the flushing route."""
    monkeypatch.setattr(cpu_flash, "flash_attention", lambda *a, **k: pytest.fail("flushing route taken"))
    _step("alibi", seq=24, batch=2, padded=True)  # 2 * 4 * 24 * 24 elements, far below 2**20
    monkeypatch.setattr(attention, "FLUSH_MIN_ELEMENTS", 1)
    for pe in ("none", "rope", "sinusoidal"):
        _step(pe, seq=24, batch=2, padded=True)


def test_flushing_route_without_gradients_matches_sdpa(monkeypatch):
    set_seed(0)
    model = build_model("alibi", vocab_size=50, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0)
    src = torch.randint(3, 50, (2, 20), generator=torch.Generator().manual_seed(2))
    outs = []
    for least in (None, 1):
        monkeypatch.setattr(attention, "FLUSH_MIN_ELEMENTS", least)
        with torch.no_grad():
            outs.append(model.encode(src, None))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 8), (8, 3), (1, 1)])
def test_toeplitz_bias_equals_the_table_lookup(q_len, k_len):
    g = torch.Generator().manual_seed(3)
    values = torch.randn(q_len + k_len - 1, 4, generator=g, requires_grad=True)
    index = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None] + q_len - 1
    d_bias = torch.randn(1, 4, q_len, k_len, generator=g)
    ref = table_bias(values, index)
    (ref_grad,) = torch.autograd.grad(ref, values, d_bias)
    got = toeplitz_bias(values, q_len, k_len)
    (grad,) = torch.autograd.grad(got, values, d_bias)
    assert got.shape == (1, 4, q_len, k_len) and got.is_contiguous()
    assert torch.equal(got, ref)
    torch.testing.assert_close(grad, ref_grad)


def test_toeplitz_bias_names_a_wrong_number_of_rows():
    with pytest.raises(ValueError, match=r"values must have q_len \+ k_len - 1 = 7 rows, got 6"):
        toeplitz_bias(torch.zeros(6, 2), 3, 5)


def test_consecutive():
    assert consecutive(torch.arange(4, 9)) and consecutive(torch.tensor([7]))
    assert not consecutive(torch.tensor([0, 2, 4])) and not consecutive(torch.tensor([3, 2, 1]))
    assert not consecutive(torch.tensor([0, 1, 1, 3])) and not consecutive(torch.tensor([], dtype=torch.long))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_start,q_len,k_start,k_len", [(0, 40, 0, 40), (7, 30, 0, 50), (0, 1, 0, 60), (60, 20, 2, 70)])
def test_t5_bias_along_its_diagonals_equals_the_bucket_lookup(causal, q_start, q_len, k_start, k_len, monkeypatch):
    set_seed(0)
    scheme = T5Bias(32, 4, 1, causal=causal, num_buckets=16, max_distance=24)
    q_pos, k_pos = torch.arange(q_start, q_start + q_len), torch.arange(k_start, k_start + k_len)
    d_bias = torch.randn(1, 4, q_len, k_len, generator=torch.Generator().manual_seed(4))
    results = []
    for least in (None, 1):
        monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", least)
        scheme.zero_grad()
        bias = scheme.compute_bias(q_pos, k_pos)
        bias.backward(d_bias)
        results.append((bias.detach(), scheme.relative_attention_bias.weight.grad.clone()))
    assert torch.equal(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])


def test_t5_keeps_the_lookup_for_small_biases_and_scattered_positions(monkeypatch):
    """Below TOEPLITZ_MIN_ELEMENTS (the course's models) and for positions that are not one window, the
    bias is the bucket lookup, gradient bit for bit."""
    monkeypatch.setattr(t5_module, "toeplitz_bias", lambda *a: pytest.fail("diagonal layout used"))
    set_seed(0)
    scheme = T5Bias(32, 4, 1)
    pos = torch.arange(64)
    assert 4 * 64 * 64 < t5_module.TOEPLITZ_MIN_ELEMENTS
    scheme.compute_bias(pos, pos)
    monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", 1)
    scheme.compute_bias(torch.tensor([0, 2, 5]), pos)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@needs_mode
@pytest.mark.skipif((os.cpu_count() or 1) < 2 or cpu_flash.gomp_parallel() is None,
                    reason="needs torch's OpenMP workers (2 cores or more)")
def test_the_mode_reaches_torchs_worker_threads(two_threads):
    """An elementwise product of 2**22 denormals is split over torch's threads: inside the block every part
    is flushed (the workers too, whose mode torch.set_flush_denormal alone leaves as it was), after it none."""
    x = torch.full((2**22,), 2.0**-130)
    x * 1.0  # the workers exist before the mode is set
    torch.set_flush_denormal(True)  # the calling thread only: a worker's part stays denormal
    try:
        partial = x * 1.0
    finally:
        torch.set_flush_denormal(False)
    assert (partial > 0).any() and (partial == 0).any()
    with cpu_flash.flush_denormals():
        assert ((x * 1.0) == 0).all()
    assert ((x * 1.0) > 0).all()


@pytest.mark.parametrize("block", [3, 128])
@pytest.mark.parametrize("rows,n", [(8, 5), (5, 8), (1, 4), (7, 1)])
def test_diagonal_sums_add_each_diagonal(rows, n, block, monkeypatch):
    """diagonal_sums (in blocks of DIAGONAL_ROWS rows) equals the sum of every entry with the same j - i."""
    from posenc_lib import utils

    monkeypatch.setattr(utils, "DIAGONAL_ROWS", block)
    grad = torch.randn(3, rows, n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected = torch.zeros(3, rows + n - 1, dtype=torch.float64)
    for i in range(rows):
        for j in range(n):
            expected[:, j - i + rows - 1] += grad[:, i, j]
    torch.testing.assert_close(utils.diagonal_sums(grad), expected)


@pytest.mark.parametrize("start,rows,n", [(0, 4, 4), (5, 3, 8), (120, 8, 128)])
def test_a_causal_block_fills_only_its_last_keys_and_matches_masked_fill(start, rows, n):
    """open_keys: a causal block of queries start:start + rows sees every key up to its first query, so the keys
    from start + 1 on need a mask; fill_closed_ writes what masked_fill_ does (padding and an all-open mask too)."""
    from posenc_lib import utils

    causal = (torch.arange(n)[None, :] <= torch.arange(start, start + rows)[:, None] + (n - start - rows))[None, None]
    padded = causal & (torch.arange(n) < n - 2)[None, None, None, :].expand(2, 1, rows, n).clone()
    padded[0, ..., n - 2 :] = causal[0, ..., n - 2 :]  # one row of the batch unpadded
    assert utils.open_keys(causal) == n - rows + 1
    assert utils.open_keys(torch.ones(1, 1, rows, n, dtype=torch.bool)) == n
    assert utils.open_keys(padded) == min(n - rows + 1, n - 2)
    for allowed, lead in ((causal, 1), (padded, 2), (torch.ones(1, 1, rows, n, dtype=torch.bool), 1)):
        t = torch.randn(lead, 3, rows, n, generator=torch.Generator().manual_seed(2))
        expected = t.masked_fill(~allowed, float("-inf"))
        assert torch.equal(utils.fill_closed_(t, allowed, float("-inf")), expected) and torch.equal(t, expected)


def test_t5_lays_out_its_bias_once_per_stack(monkeypatch):
    """Over consecutive positions T5's context holds one value per offset; the first layer that asks lays out
    the bias and every other layer of the stack reuses it."""
    calls = []
    monkeypatch.setattr(t5_module, "toeplitz_bias", lambda *a, real=t5_module.toeplitz_bias: calls.append(1) or real(*a))
    monkeypatch.setattr(t5_module, "TOEPLITZ_MIN_ELEMENTS", 1)
    set_seed(0)
    model = build_model("t5", 31, d_model=32, n_heads=4, num_layers=3, dim_feedforward=64, dropout=0.0)
    with torch.no_grad():
        model.encode(torch.randint(4, 31, (2, 13), generator=torch.Generator().manual_seed(0)), None)
    assert len(calls) == 1
