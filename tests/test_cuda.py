"""Checks that need a CUDA GPU (skipped without one).

One command on a GPU machine, from the repository root::

    python tests/test_cuda.py          # or: python -m pytest -q tests/test_cuda.py -rA

It prints the GPU and torch version, one line per check with the number it measured, and the
pytest summary.  What it checks, for every position scheme (``ALL_TYPES``: the classics and lesson 11's):

* the forward pass and the gradients on the GPU equal the CPU's (float32, tolerance 1e-4);
* no host synchronisation in a training forward pass or a cached decoding step
  (``torch.cuda.set_sync_debug_mode("error")``), and only a few in a whole greedy decoding;
* cached greedy decoding equals uncached decoding, and beam 1 equals greedy;
* a bf16-autocast training step gives a finite loss close to float32 and finite gradients;
* the flash kernel really runs for none/sinusoidal/learned/rope/xpos: forward, backward and cached
  steps under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` (which raises if SDPA gets a mask);
* a padded batch as variable-length sequences (``tune(varlen=True)``, posenc_lib/attention/varlen.py): flash's
  variable-length kernel equals its reference, outputs and gradients; a padded bf16 model of every scheme without
  score terms trains with only the flash kernel allowed, no host sync in its forward pass, and gives the padded
  path's logits;
* translating on the GPU as a run does (large batches, each sentence with its CPU budget, the compiled step) gives
  the CPU's translations in their order, and the step compiles; the time a `gpu`-profile model takes for the
  shipped test sets as a run translates them is reported (the goal: at most 10 s for both);
* a training run killed and resumed on the GPU follows the uninterrupted run, also on the gpu profile's path
  (batches gathered on the device, the chunked loss, fused Adam);
* that path's pieces on the device: batches equal ``collate``'s without a host sync, the chunked loss equals
  the full one in bf16, and a run of updates reads the device no more often for more updates.

``POSENC_TEST_DEVICE=cpu`` runs the same file on the CPU, a dry run of the checks themselves
(the GPU-only parts are skipped).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the resume check

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from posenc_lib import ALL_TYPES, build_model, greedy_decode, set_seed  # noqa: E402
from posenc_lib.models.beam import beam_search  # noqa: E402
from posenc_lib.models.decoding import SYNC_EVERY  # noqa: E402
from posenc_lib.schemes.registry import registered_schemes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEVICE = os.environ.get("POSENC_TEST_DEVICE", "cuda")
ON_CUDA = DEVICE.startswith("cuda")
pytestmark = pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="needs a CUDA GPU")
gpu_only = pytest.mark.skipif(not ON_CUDA, reason="checks a CUDA-only behaviour")

# head_dim 16: every SDPA kernel (flash included) accepts it
SMALL = dict(d_model=64, n_heads=4, num_layers=2, dim_feedforward=128, dropout=0.0)
V = 50
#: the registered schemes without score or value terms or a bias (the flash kernel takes no mask)
FLASH_SCHEMES = tuple(pe for pe, info in registered_schemes().items()
                      if not (info.cls.adds_bias or info.cls.adds_scores or info.cls.adds_values))


@pytest.fixture(autouse=True)
def _full_float32():
    """No TF32 in float32 matmuls: the CUDA == CPU comparison is about the code, not the format."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(old)


def small(pe, **kw):
    set_seed(0)
    return build_model(pe, V, **{**SMALL, **kw})


def batch(seed=0, b=3, s=9, t=7):
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, V, (b, s), generator=g), torch.randint(3, V, (b, t), generator=g)
    src[1, s - 3 :] = 0  # one padded source row
    return src, tgt


def report(msg: str) -> None:
    print(f"[{DEVICE}] {msg}")


# ----------------------------------------------------------------------------- CUDA == CPU
@pytest.mark.parametrize("pe", ALL_TYPES)
def test_forward_and_gradients_match_cpu(pe):
    cpu = small(pe).eval()
    dev = small(pe).eval().to(DEVICE)
    src, tgt = batch()
    masks = dict(src_key_padding_mask=src == 0)
    out_cpu = cpu(src, tgt, **masks)
    out_dev = dev(src.to(DEVICE), tgt.to(DEVICE), **{k: m.to(DEVICE) for k, m in masks.items()})
    diff = (out_dev.cpu() - out_cpu).abs().max().item()
    torch.testing.assert_close(out_dev.cpu(), out_cpu, atol=1e-4, rtol=1e-4)
    cpu.loss(src, tgt, tgt, **masks).backward()
    dev.loss(src.to(DEVICE), tgt.to(DEVICE), tgt.to(DEVICE), src_key_padding_mask=(src == 0).to(DEVICE)).backward()
    gdiff = 0.0
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-3, msg=name)
            gdiff = max(gdiff, (q.grad.cpu() - p.grad).abs().max().item())
    report(f"{pe}: max |logits gpu - cpu| = {diff:.1e}, max |grad gpu - cpu| = {gdiff:.1e}")


# ----------------------------------------------------------------------------- no host syncs
@gpu_only
@pytest.mark.parametrize("pe", ALL_TYPES)
def test_no_host_sync_in_forward_and_cached_steps(pe):
    """Any ``.item()``, ``int(tensor)`` or blocking copy in a forward pass raises here.  The loss
    and the backward pass are torch's own code; their syncs (if any) are counted and reported only."""
    model = small(pe, dropout=0.1).to(DEVICE)
    src, tgt = (x.to(DEVICE) for x in batch())
    mask = src == 0
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = model(src, tgt, src_key_padding_mask=mask)  # training mode: dropout on
        model.eval()
        with torch.no_grad():
            memory, cache = model.encode(src, mask), model.new_cache()
            for t in range(4):
                model.decode(tgt[:, t : t + 1], memory, memory_key_padding_mask=mask, cache=cache)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), label_smoothing=0.1).backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    report(f"{pe}: training forward and 4 cached steps without a host sync; loss + backward: {syncs} sync(s)")


@gpu_only
def test_greedy_decoding_reads_the_device_only_every_few_steps():
    model = small("rope").eval().to(DEVICE)
    src = batch()[0].to(DEVICE)
    steps = 32
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            greedy_decode(model, src, max_new_tokens=steps, bos_id=1, eos_id=2, src_key_padding_mask=src == 0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    report(f"greedy decoding of {steps} tokens: {syncs} host syncs")
    assert syncs <= steps // SYNC_EVERY + 2


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("pe", ALL_TYPES)
def test_cached_greedy_equals_uncached_and_beam_one(pe):
    model = small(pe).eval().to(DEVICE)
    src = batch(seed=1)[0].to(DEVICE)
    kw = dict(max_new_tokens=16, bos_id=1, eos_id=2, src_key_padding_mask=src == 0)
    cached = greedy_decode(model, src, use_cache=True, **kw)
    assert torch.equal(cached, greedy_decode(model, src, use_cache=False, **kw))
    assert torch.equal(cached, beam_search(model, src, beam=1, alpha=0.0, **kw))
    assert beam_search(model, src, beam=4, **kw).shape[0] == src.shape[0]
    report(f"{pe}: cached == uncached greedy == beam 1 ({cached.shape[1] - 1} tokens)")


# ----------------------------------------------------------------------------- bf16 training
@pytest.mark.parametrize("pe", ALL_TYPES)
def test_bf16_autocast_training_step(pe):
    if ON_CUDA and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    model = small(pe, dropout=0.1).to(DEVICE).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    src, tgt = (x.to(DEVICE) for x in batch(seed=2))
    mask = src == 0
    with torch.no_grad():
        model.eval()
        fp32 = model.loss(src, tgt, tgt, src_key_padding_mask=mask).item()
        with torch.autocast(device_type=torch.device(DEVICE).type, dtype=torch.bfloat16):
            bf16 = model.loss(src, tgt, tgt, src_key_padding_mask=mask).item()
        model.train()
    with torch.autocast(device_type=torch.device(DEVICE).type, dtype=torch.bfloat16):
        loss = model.loss(src, tgt, tgt, label_smoothing=0.1, src_key_padding_mask=mask)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    assert abs(bf16 - fp32) < 0.05 * fp32
    report(f"{pe}: bf16 loss {bf16:.4f} vs fp32 {fp32:.4f}, gradients finite")


# ----------------------------------------------------------------------------- flash attention
@pytest.mark.parametrize("pe", FLASH_SCHEMES)
def test_flash_kernel_runs_for_schemes_without_score_terms(pe):
    # CUDA's flash kernel takes dropout; the CPU's fused kernels do not (dry run: no dropout)
    model = small(pe, dropout=0.1 if ON_CUDA else 0.0).to(DEVICE, torch.bfloat16).train()
    src, tgt = batch(seed=3)
    src = src.clamp(min=3).to(DEVICE)  # no padding: nothing but the future to mask
    tgt = tgt.to(DEVICE)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        loss = model.loss(src, tgt, tgt)
        loss.backward()
        model.eval()
        with torch.no_grad():
            memory, cache = model.encode(src), model.new_cache()
            for t in range(4):
                model.decode(tgt[:, t : t + 1], memory, cache=cache)
    assert torch.isfinite(loss)
    if ON_CUDA:  # the check is real: the flash kernel refuses a mask (CPU's flash kernel takes one)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(RuntimeError):
            model(src, tgt, src_key_padding_mask=torch.zeros_like(src, dtype=torch.bool))
    report(f"{pe}: forward, backward and cached steps ran with only the flash kernel allowed")


# ----------------------------------------------------------------------------- padded batches as variable lengths
@gpu_only
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_flash_kernel_equals_its_reference(causal):
    from posenc_lib.attention import varlen

    if not varlen.flash_device(torch.device(DEVICE).index or 0):
        pytest.skip("this GPU runs no flash kernel")
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([13, 9, 0, 1, 5])  # every row cut in two: empty pieces on both sides
    cu = varlen.row_segments(lengths, 13).to(DEVICE)
    q, k, v = (torch.randn(5 * 13, 4, 16, generator=g).to(DEVICE, torch.bfloat16).requires_grad_() for _ in range(3))
    d_out = torch.randn(5 * 13, 4, 16, generator=g).to(DEVICE, torch.bfloat16)
    got = varlen.flash(q, k, v, cu, cu, 13, 13, causal=causal, scale=0.25)
    grads = torch.autograd.grad(got, (q, k, v), d_out)
    f32 = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = varlen.reference(*f32, cu, cu, causal=causal, scale=0.25)
    ref_grads = torch.autograd.grad(ref, f32, d_out.float())
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a.float(), b, atol=5e-2, rtol=5e-2, msg=f"d{name}")
    # cross-attention's cut: every row's queries one piece, the pads' pieces without queries
    cu_q = varlen.row_segments(torch.full((5,), 7), 7).to(DEVICE)
    qc = q[: 5 * 7].detach().requires_grad_()
    got = varlen.flash(qc, k, v, cu_q, cu, 7, 13, causal=False, scale=0.25)
    ref = varlen.reference(qc.detach().float(), *(t.detach().float() for t in (k, v)), cu_q, cu, causal=False,
                           scale=0.25)  # fmt: skip
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)
    got.sum().backward()
    assert torch.isfinite(qc.grad).all()
    report(f"varlen flash (causal={causal}) == reference; max |out diff| {(got.float() - ref).abs().max():.1e}")


@gpu_only
@pytest.mark.parametrize("pe", FLASH_SCHEMES)
def test_padded_batches_run_flash_as_variable_lengths(pe):
    from posenc_lib.attention import backends, varlen

    if not varlen.flash_device(torch.device(DEVICE).index or 0):
        pytest.skip("this GPU runs no flash kernel")
    model = small(pe, dropout=0.1).to(DEVICE, torch.bfloat16).eval()
    src, tgt = (x.to(DEVICE) for x in batch(seed=4, b=4, s=11, t=9))
    src[2, 4:] = 0
    tgt[1, 6:] = 0
    masks = dict(src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0)
    old = backends.TUNING
    try:
        with torch.no_grad():
            padded = model(src, tgt, **masks)
        backends.tune(varlen=True)
        with torch.no_grad():
            got = model(src, tgt, **masks)
        real = ~masks["tgt_key_padding_mask"]
        torch.testing.assert_close(got[real].float(), padded[real].float(), atol=5e-2, rtol=5e-2)
        model.train()  # dropout in attention too: flash's own
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # a masked SDPA call would raise here
                logits = model(src, tgt, **masks)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=0)
            loss.backward()
    finally:
        backends.TUNING = old
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    report(f"{pe}: padded bf16 batch through flash's variable-length kernel, no host sync in the forward pass, "
           f"max |logits - padded path's| {(got[real].float() - padded[real].float()).abs().max():.1e}")


# ----------------------------------------------------------------------------- scoring at GPU speed
class _Words:
    """Words to ids and back: what ``translate`` needs of a tokenizer."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def encode(self, lines):
        return [[3 + sum(map(ord, w)) % (V - 3) for w in line.split()] for line in lines]

    def decode(self, rows):
        return [" ".join(f"w{i}" for i in row[: row.index(2) if 2 in row else len(row)] if i) for row in rows]


@gpu_only
def test_translation_on_the_gpu_gives_the_cpus():
    import time

    from posenc_lib.experiments.wmt14 import evaluate as ev

    model = small("rope", tie_embeddings=False).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)  # translations that differ, some ending early
    g = torch.Generator().manual_seed(0)
    sources = [" ".join(f"x{int(t)}" for t in torch.randint(0, 500, (int(n),), generator=g))
               for n in torch.randint(1, 40, (300,), generator=g)]  # fmt: skip
    cpu = ev.translate(model, _Words(), sources)
    model.to(DEVICE)
    plan = ev.decoding_plan(DEVICE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = time.perf_counter()
        gpu = ev.translate(model, _Words(), sources, device=DEVICE)
        first = time.perf_counter() - t
        t = time.perf_counter()
        ev.translate(model, _Words(), sources, device=DEVICE)
        again = time.perf_counter() - t
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]
    same = sum(a == b for a, b in zip(cpu, gpu))
    report(f"translate on the GPU (batches of {plan[0]} tokens, budgets of {plan[1]}, compiled={plan[2]}): "
           f"{same}/{len(sources)} translations equal the CPU's; {first:.1f} s with compiling, {again:.2f} s after")
    assert same >= 0.97 * len(sources)  # another device may round a near tie the other way


@gpu_only
def test_scoring_time_of_a_gpu_profile_model():
    """What one model of the `gpu` profile takes to translate the shipped test sets as a run does (held-out, its
    shuffled copy, newstest2014), measured and reported, not asserted: untrained weights never end a sentence, so
    every batch runs to its budget (the longest decoding can take), and words stand in for BPE tokens (about 1.3x
    fewer).  The goal is at most 10 s for both test sets."""
    import time
    import zlib

    from posenc_lib.experiments.wmt14 import evaluate as ev
    from posenc_lib.experiments.wmt14.data import read_parallel
    from posenc_lib.experiments.wmt14.train import PROFILES

    prof = PROFILES["gpu"]

    class Words(_Words):
        def encode(self, lines):
            return [[3 + zlib.crc32(w.encode()) % (prof.vocab_size - 3) for w in line.split()] for line in lines]

    set_seed(0)
    model = build_model("rope", prof.vocab_size, **prof.model_kwargs()).to(DEVICE).eval()
    tests = {name: read_parallel(ROOT / "data" / "wmt14-fr-en", name)[0] for name in ("heldout", "newstest2014")}
    tests["heldout shuffled"] = ev.shuffle_words(tests["heldout"], 0)
    t = time.perf_counter()
    ev.translate(model, Words(), tests["heldout"][:64], device=DEVICE)  # the step's compiling, apart
    torch.cuda.synchronize()
    warm = time.perf_counter() - t
    times = {}
    for name, sources in tests.items():
        t = time.perf_counter()
        ev.translate(model, Words(), sources, device=DEVICE)
        torch.cuda.synchronize()
        times[name] = time.perf_counter() - t
    plan = ev.decoding_plan(DEVICE)
    report(f"gpu-profile model, every sentence to its budget (batches of {plan[0]} tokens, compiled={plan[2]}): "
           + ", ".join(f"{name} {len(tests[name])} sentences {s:.1f} s" for name, s in times.items())
           + f"; total {sum(times.values()):.1f} s, plus {warm:.1f} s for the first call (compiling)")


# ----------------------------------------------------------------------------- resume
def _tiny_data(tmp_path: Path) -> Path:
    from posenc_lib.experiments.wmt14.data import read_parallel

    d = tmp_path / "data"
    d.mkdir()
    for split, n in (("train", 300), ("newstest2013", 40), ("newstest2014", 30), ("heldout", 30)):
        fr, en = read_parallel(ROOT / "data" / "wmt14-fr-en", split, n)
        (d / f"{split}.fr").write_text("\n".join(fr) + "\n", encoding="utf-8")
        (d / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return d


FAST = dict(device_data=True, loss_chunk=100, bucket="both")  # the gpu profile's path on the smoke model


@pytest.mark.parametrize("precision,tol,fast", [("fp32", 1e-4, False), ("auto", 2e-2, False), ("auto", 2e-2, True)])
def test_resume_equals_uninterrupted(tmp_path, precision, tol, fast):
    from posenc_lib.experiments.wmt14.train import get_profile
    from posenc_lib.experiments.wmt14 import run

    prof = get_profile("smoke", dict(vocab_size=300, max_train_pairs=None, max_steps=8, log_every=2, val_every=4,
                                     ckpt_every=4, val_pairs=8, eval_limit=4, bertscore=False,
                                     bootstrap_samples=20, batch_tokens=300, precision=precision,
                                     **(FAST if fast else {})))
    kw = dict(data_dir=_tiny_data(tmp_path), source="files", progress=False, log=lambda m: None, device=DEVICE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        run(prof, ["rope"], [1], tmp_path / "full", **kw)
        assert run(prof, ["rope"], [1], tmp_path / "cut", stop_after=5, **kw) is None  # "killed" after update 5
        run(prof, ["rope"], [1], tmp_path / "cut", resume=True, **kw)  # continues from the update-4 checkpoint
    finally:
        torch.use_deterministic_algorithms(False)
    a = json.loads((tmp_path / "full" / "rope-seed1" / "result.json").read_text())
    b = json.loads((tmp_path / "cut" / "rope-seed1" / "result.json").read_text())
    ca = [(r["step"], r["train_loss"], r["val_loss"]) for r in a["curve"]]
    cb = [(r["step"], r["train_loss"], r["val_loss"]) for r in b["curve"]]
    assert [c[0] for c in ca] == [c[0] for c in cb]
    worst = 0.0
    for ra, rb in zip(ca, cb):
        for x, y in zip(ra[1:], rb[1:]):
            assert (x is None) == (y is None)
            if x is not None:
                worst = max(worst, abs(x - y))
    assert worst <= tol, (ca, cb)
    wa = torch.load(tmp_path / "full-ckpt" / "rope-seed1" / "checkpoint.pt", map_location="cpu", weights_only=False)
    wb = torch.load(tmp_path / "cut-ckpt" / "rope-seed1" / "checkpoint.pt", map_location="cpu", weights_only=False)
    for k in wa["model"]:
        torch.testing.assert_close(wb["model"][k], wa["model"][k], atol=tol, rtol=tol)
    report(f"resume ({a.get('precision', precision)}{', gpu path' if fast else ''}): curves differ by at most "
           f"{worst:.1e} after 8 updates")


# ----------------------------------------------------------------------------- the gpu profile's path
def _pairs(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 30, (2, n), generator=g).tolist()
    return ([torch.randint(4, V, (k,), generator=g).tolist() for k in lens[0]],
            [torch.randint(4, V, (k,), generator=g).tolist() for k in lens[1]])


def test_device_batches_equal_collate_without_a_host_sync():
    from posenc_lib.experiments.wmt14.fastpath import DeviceData
    from posenc_lib.experiments.wmt14.train import collate, make_batches

    src, tgt = _pairs()
    store = DeviceData(src, tgt, 0, 1, 2, DEVICE)
    batches = make_batches([len(r) + 1 for r in src], [len(r) + 1 for r in tgt], 400, 0)
    on_dev = store.upload_batches(batches)
    if ON_CUDA:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        got = [store.gather(*x) for x in on_dev]
    finally:
        if ON_CUDA:
            torch.cuda.set_sync_debug_mode(0)
    for b, new in zip(batches, got):
        old = collate([src[i] for i in b], [tgt[i] for i in b], 0, 1, 2)
        assert all(torch.equal(x, y.cpu()) for x, y in zip(old, new))
    report(f"{len(batches)} batches gathered on {DEVICE} equal collate's" + (", no host sync" if ON_CUDA else ""))


def test_chunked_loss_equals_the_full_loss_in_bf16():
    from posenc_lib.experiments.wmt14.fastpath import chunked_cross_entropy

    model = small("rope").to(DEVICE)
    src, tgt = (x.to(DEVICE) for x in batch(seed=4, b=6, s=20, t=17))
    mask = src == 0
    dev = torch.device(DEVICE).type
    with torch.autocast(device_type=dev, dtype=torch.bfloat16):
        logits = model(src, tgt, src_key_padding_mask=mask)
    ref = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=0,
                                            label_smoothing=0.1)
    ref.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with torch.autocast(device_type=dev, dtype=torch.bfloat16):
        states = model(src, tgt, src_key_padding_mask=mask, states=True)
        loss = chunked_cross_entropy(states, model.output_weight(), tgt, ignore_index=0, label_smoothing=0.1, chunk=32)
    loss.backward()
    worst = 0.0
    for n, p in model.named_parameters():
        if n in want and not n.endswith("k_proj.bias"):
            rel = ((p.grad - want[n]).abs().max() / (want[n].abs().max() + 1e-12)).item()
            worst = max(worst, rel)
    assert abs(loss.item() - ref.item()) < 1e-2 * ref.item() and worst < 5e-2
    report(f"chunked loss {loss.item():.4f} vs full {ref.item():.4f} (bf16); worst relative gradient gap {worst:.1e}")


@gpu_only
def test_the_gpu_path_reads_the_device_no_more_often_for_more_updates(tmp_path):
    """Host syncs in a whole training run (fused Adam, batches and loss on the device), counted with
    ``set_sync_debug_mode("warn")``: 12 updates between the same log lines may make at most two more than 4
    (one-off first uses), not one or more per update."""
    from posenc_lib.experiments.wmt14 import prepare_data
    from posenc_lib.experiments.wmt14.train import get_profile, train_model

    base = dict(vocab_size=300, max_train_pairs=None, val_pairs=8, batch_tokens=300, ckpt_every=0, **FAST)
    tok, data, _ = prepare_data(get_profile("smoke", base), tmp_path / "r", data_dir=_tiny_data(tmp_path),
                                source="files", log=lambda m: None)
    counts = []
    for steps in (4, 12):
        prof = get_profile("smoke", dict(base, max_steps=steps, log_every=steps, val_every=steps))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                train_model("rope", 0, prof, data, tok, tmp_path / f"m{steps}", device=DEVICE, progress=False,
                            log=lambda m: None)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    report(f"gpu path: {counts[0]} host syncs in a run of 4 updates, {counts[1]} in one of 12")
    assert counts[1] <= counts[0] + 2, counts


@gpu_only
def test_compiled_training_equals_eager_with_inductor(tmp_path):
    """The gpu profile's compile=true and fused_qkv=true built by inductor: the curve of the same path uncompiled
    (fp32, no dropout), one graph for batches of every shape; the time per update of both is reported."""
    import torch._dynamo

    from posenc_lib.experiments.wmt14 import prepare_data
    from posenc_lib.experiments.wmt14.train import get_profile, train_model

    base = dict(vocab_size=300, max_train_pairs=None, val_pairs=8, batch_tokens=300, ckpt_every=0, max_steps=12,
                log_every=4, val_every=4, dropout=0.0, precision="fp32", fused_qkv=True, **FAST)
    tok, data, _ = prepare_data(get_profile("smoke", base), tmp_path / "r", data_dir=_tiny_data(tmp_path),
                                source="files", log=lambda m: None)
    runs = {}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for compiled in (False, True):
        prof = get_profile("smoke", dict(base, compile=compiled))
        runs[compiled] = train_model("rope", 0, prof, data, tok, tmp_path / f"c{compiled}", device=DEVICE,
                                     progress=False, log=lambda m: None)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert runs[True]["compiled"] is True and graphs == 1, graphs
    worst = max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(runs[False]["curve"][1:], runs[True]["curve"][1:]))
    assert worst < 2e-3, worst
    report(f"inductor: 12 updates compiled ({runs[True]['wall_s']} s with the build) vs eager "
           f"({runs[False]['wall_s']} s); curves differ by at most {worst:.1e}; {graphs} graph")


@gpu_only
def test_peak_memory_is_each_models_own(tmp_path):
    """A worker process trains several models in turn: an earlier, larger peak must not be reported."""
    from posenc_lib.experiments.wmt14.train import get_profile
    from posenc_lib.experiments.wmt14 import run

    prof = get_profile("smoke", dict(vocab_size=300, max_train_pairs=None, max_steps=2, log_every=2, val_every=2,
                                     ckpt_every=2, val_pairs=8, eval_limit=4, bertscore=False,
                                     bootstrap_samples=20, batch_tokens=300))
    big = torch.empty(2**30, dtype=torch.uint8, device=DEVICE)  # 1 GiB allocated before the model trains
    del big
    run(prof, ["none"], [0], tmp_path / "run", data_dir=_tiny_data(tmp_path), source="files", progress=False,
        log=lambda m: None, device=DEVICE)
    peak = json.loads((tmp_path / "run" / "none-seed0" / "result.json").read_text())["peak_mem_gib"]
    assert 0 <= peak < 0.5  # without the reset: >= 1
    report(f"peak memory of a tiny model after a 1 GiB allocation: {peak} GiB (its own)")


@gpu_only
def test_training_starts_in_a_fresh_process(tmp_path):
    """The pipeline's workers are new processes: the first CUDA call of one is train_model's (resetting the peak
    memory before CUDA is initialised raised 'Invalid device argument' there, never in a test process that had
    used CUDA already)."""
    code = (
        "import sys; from pathlib import Path\n"
        "from posenc_lib.experiments.wmt14 import run\n"
        "from posenc_lib.experiments.wmt14.train import get_profile\n"
        "prof = get_profile('smoke', dict(vocab_size=300, max_train_pairs=None, max_steps=2, log_every=2, val_every=2,"
        " ckpt_every=2, val_pairs=8, eval_limit=4, bertscore=False, bootstrap_samples=20, batch_tokens=300))\n"
        "run(prof, ['none'], [0], Path(sys.argv[1]) / 'run', data_dir=sys.argv[2], source='files', progress=False,"
        " log=lambda m: None, device=sys.argv[3])\n")
    data = _tiny_data(tmp_path)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(data), DEVICE], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "none-seed0" / "result.json").is_file()


if __name__ == "__main__":
    device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    print(f"posenc GPU checks: torch {torch.__version__}, {device_name}, device under test: {DEVICE}")
    sys.exit(pytest.main([__file__, "-q", "-rA", "-p", "no:cacheprovider"]))
