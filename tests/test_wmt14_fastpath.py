"""The gpu profile's training path, checked on the CPU: batches gathered from device-resident ids equal collate's,
the chunked loss equals the full one (value and gradients), training with both equals the plain loop, checkpoints
on a signal resume on the same curve, the fused optimizer's state loads either way, and the CPU profiles keep
every one of these off."""
import json
import signal
import sys

import pytest
import torch
import torch.nn.functional as F

import posenc_lib.experiments.wmt14.fastpath as fast_mod
import posenc_lib.experiments.wmt14.train as train_mod
from posenc_lib import build_model, set_seed
from posenc_lib.schemes.registry import PE_TYPES
from posenc_lib.experiments.wmt14 import prepare_data
from posenc_lib.experiments.wmt14.fastpath import (DeviceData, chunked_cross_entropy, matmul_flops_per_token,
                                                   padding_fraction)
from posenc_lib.experiments.wmt14.train import (PROFILES, Profile, collate, get_profile, load_checkpoint, make_batches,
                                                set_fused, split_batch, train_model)
from test_wmt14 import tiny_profile
from test_wmt14_pipeline import _one_thread, quiet, strip, tiny_dir  # noqa: F401 (_one_thread: autouse)

FAST = dict(device_data=True, loss_chunk=7)  # a chunk that does not divide the rows: the last part is short


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fast")
    tok, data, _ = prepare_data(tiny_profile(), tmp / "r", data_dir=tiny_dir(tmp), source="files", log=quiet)
    return tok, data


def test_the_cpu_profiles_keep_the_plain_path():
    """The committed laptop run must stay reproducible: every new behaviour is off outside the gpu profile."""
    plain = Profile()
    for name in ("smoke", "cpu", "laptop"):
        p = PROFILES[name]
        assert (p.device_data, p.loss_chunk, p.bucket, p.ckpt_on_signal) == (False, None, "target", False), name
        assert p.ckpt_every >= 1
    assert PROFILES["laptop"].ckpt_every == 250 and (plain.device_data, plain.loss_chunk) == (False, None)
    gpu = PROFILES["gpu"]
    assert gpu.device_data and gpu.loss_chunk and gpu.ckpt_on_signal and gpu.ckpt_every == 0 and gpu.bucket == "both"
    assert gpu.fused_qkv and gpu.compile
    assert not any(PROFILES[n].fused_qkv or PROFILES[n].compile for n in ("smoke", "cpu", "laptop"))
    with pytest.raises(ValueError, match="profile field compile='maybe' is invalid; allowed: true or false"):
        get_profile("gpu", {"compile": "maybe"})
    lens = [3, 9, 4, 12, 7, 5, 8, 2, 11, 6] * 30
    assert make_batches(lens, lens[::-1], 40, 5) == make_batches(lens, lens[::-1], 40, 5, bucket="target")
    with pytest.raises(ValueError, match="bucket 'rows'.*'target', 'both'"):
        make_batches(lens, lens, 40, 0, bucket="rows")
    with pytest.raises(ValueError, match="profile field bucket.*'target', 'both'"):
        get_profile("smoke", {"bucket": "source"})
    with pytest.raises(ValueError, match="loss_chunk=0 is out of range; allowed: an integer >= 1"):
        get_profile("smoke", {"loss_chunk": "0"})


def test_device_batches_equal_collate_for_the_laptop_batch_plan(prepared):
    tok, data = prepared
    tr = data["train"]
    src_lens, tgt_lens = [len(r) + 1 for r in tr["src"]], [len(r) + 1 for r in tr["tgt"]]
    store = DeviceData(tr["src"], tr["tgt"], tok.pad_id, tok.bos_id, tok.eos_id)
    laptop = PROFILES["laptop"]
    n = 0
    for epoch in range(2):  # the training loop's plan: seed * 100003 + epoch, the laptop's batch size
        batches = make_batches(src_lens, tgt_lens, laptop.batch_tokens, 0 * 100003 + epoch)
        for b, on_dev in zip(batches, store.upload_batches(batches)):
            old = collate([tr["src"][i] for i in b], [tr["tgt"][i] for i in b], tok.pad_id, tok.bos_id, tok.eos_id)
            new = store.gather(*on_dev)
            for x, y in zip(old, new):
                assert x.dtype == y.dtype and torch.equal(x, y)
            n += 1
        for b in batches[:5]:  # a batch in micro-batch parts: one gather per part
            for part in split_batch(b, tgt_lens, 60):
                old = collate([tr["src"][i] for i in part], [tr["tgt"][i] for i in part], tok.pad_id, tok.bos_id,
                              tok.eos_id)
                new = store.gather(torch.tensor(part), *store.widths(part))
                assert all(torch.equal(x, y) for x, y in zip(old, new))
    assert n > 2
    with pytest.raises(ValueError, match="as many sources as targets"):
        DeviceData(tr["src"], tr["tgt"][:-1], 0, 1, 2)


def test_bucketing_on_both_sides_cuts_source_padding_and_keeps_the_budget():
    import random

    rng = random.Random(0)
    tgt = [rng.randrange(2, 60) for _ in range(4000)]
    src = [max(2, round(t * rng.uniform(0.6, 1.6))) for t in tgt]
    a, b = (make_batches(src, tgt, 1500, 1, bucket=k) for k in ("target", "both"))
    for batches in (a, b):
        assert sorted(i for x in batches for i in x) == list(range(4000))
        assert all(len(x) * max(tgt[i] for i in x) <= 1500 for x in batches)
    pa, pb = padding_fraction(a, src, tgt), padding_fraction(b, src, tgt)
    assert pb["source"] < pa["source"] and pa["target_tokens"] == pb["target_tokens"] == sum(tgt)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_chunked_loss_equals_cross_entropy_and_its_gradients(smoothing):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y = torch.randint(1, 50, (2, 37), generator=g)
    y[1, 30:] = 0  # padding
    ref = F.cross_entropy((h @ w.t()).float().reshape(-1, 50), y.reshape(-1), ignore_index=0, label_smoothing=smoothing)
    gh, gw = torch.autograd.grad(ref, (h, w))
    for chunk in (1, 5, 64, 10_000):
        out = chunked_cross_entropy(h, w, y, ignore_index=0, label_smoothing=smoothing, chunk=chunk)
        ch, cw = torch.autograd.grad(out * 3.0, (h, w))  # a scaled loss (fp16's gradient scaler) scales both
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ch, 3 * gh, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(cw, 3 * gw, atol=1e-6, rtol=1e-5)
    total = chunked_cross_entropy(h, w, y, ignore_index=0, label_smoothing=smoothing, reduction="sum")
    torch.testing.assert_close(total / (y != 0).sum(), ref)
    with torch.no_grad():  # validation: no gradients made
        torch.testing.assert_close(chunked_cross_entropy(h, w, y, ignore_index=0, label_smoothing=smoothing), ref)
    with pytest.raises(ValueError, match="unknown reduction 'none'; valid choices: 'mean', 'sum'"):
        chunked_cross_entropy(h, w, y, ignore_index=0, reduction="none")
    with pytest.raises(ValueError, match="chunk"):
        chunked_cross_entropy(h, w, y, ignore_index=0, chunk=0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_chunked_loss_through_the_model_equals_the_logits_path(dtype, tol):
    """The model's decoder states times the tied embedding, in parts, under autocast as in training."""
    set_seed(0)
    model = build_model("rope", 60, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0)
    src, tgt = torch.randint(3, 60, (4, 9)), torch.randint(3, 60, (4, 8))
    src[2, 6:] = 0
    tgt[3, 5:] = 0
    mask = src == 0
    auto = dict(device_type="cpu", dtype=dtype, enabled=dtype != torch.float32)
    with torch.autocast(**auto):
        logits = model(src, tgt, src_key_padding_mask=mask)
    ref = F.cross_entropy(logits.float().reshape(-1, 60), tgt.reshape(-1), ignore_index=0, label_smoothing=0.1)
    ref.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with torch.autocast(**auto):
        states = model(src, tgt, src_key_padding_mask=mask, states=True)
        loss = chunked_cross_entropy(states, model.output_weight(), tgt, ignore_index=0, label_smoothing=0.1, chunk=5)
    loss.backward()
    with torch.no_grad(), torch.autocast(**auto):  # the states are what forward feeds the output layer
        torch.testing.assert_close(model.logits(states), logits)
    assert abs(loss.item() - ref.item()) <= tol * ref.item()
    for n, p in model.named_parameters():
        if n in grads and not n.endswith("k_proj.bias"):  # softmax ignores a key bias: its gradient is rounding noise
            scale = grads[n].abs().max().item() + 1e-12
            assert (p.grad - grads[n]).abs().max().item() <= tol * scale * 5, n


def test_fast_path_training_equals_the_plain_loop(tmp_path, prepared):
    tok, data = prepared
    base = dict(max_steps=6, log_every=2, val_every=2, ckpt_every=2, dropout=0.0)
    plain = train_model("shaw", 0, tiny_profile(**base), data, tok, tmp_path / "a", progress=False, log=quiet)
    fast = train_model("shaw", 0, tiny_profile(**base, **FAST), data, tok, tmp_path / "b", progress=False, log=quiet)
    for ra, rb in zip(plain["curve"], fast["curve"]):
        for key in ("train_loss", "val_loss"):
            assert (ra[key] is None and rb[key] is None) or abs(ra[key] - rb[key]) < 2e-4, (ra, rb)
    for (name, pa), pb in zip(plain["model"].named_parameters(), fast["model"].parameters()):
        if name.endswith("k_proj.bias"):  # rounding noise that Adam scales up (see the micro-batch test)
            continue
        torch.testing.assert_close(pb, pa, atol=5e-5, rtol=1e-4, msg=name)
    # micro-batch parts on the fast path: one gather per part, the same update
    parts = train_model("shaw", 0, tiny_profile(**base, **FAST, micro_batch_tokens=60), data, tok, tmp_path / "c",
                        progress=False, log=quiet)
    assert [r["train_loss"] for r in parts["curve"]] == pytest.approx([r["train_loss"] for r in fast["curve"]],
                                                                       abs=2e-4)


def test_fast_path_reads_the_device_once_per_log_line(tmp_path, prepared, monkeypatch):
    tok, data = prepared
    calls = []
    files = {train_mod.__file__, fast_mod.__file__}

    def spy(name):
        orig = getattr(torch.Tensor, name)

        def wrapper(self, *a, **k):
            if sys._getframe(1).f_code.co_filename in files:
                calls.append(name)
            return orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    for name in ("item", "__float__", "__int__", "__bool__", "tolist"):
        spy(name)
    counts = []
    for steps in (4, 12):
        prof = tiny_profile(max_steps=steps, log_every=steps, val_every=steps, ckpt_every=0, **FAST)
        calls.clear()
        train_model("rope", 0, prof, data, tok, tmp_path / f"m{steps}", progress=False, log=quiet)
        counts.append(len(calls))
    assert counts[0] == counts[1] and counts[0] <= 4, (counts, calls)


def test_ckpt_every_0_writes_only_the_last_checkpoint(tmp_path, prepared):
    tok, data = prepared
    prof = tiny_profile(max_steps=6, log_every=2, val_every=2, ckpt_every=0)
    train_model("none", 0, prof, data, tok, tmp_path / "cut", progress=False, log=quiet, stop_after=4)
    assert not (tmp_path / "cut" / "checkpoint.pt").exists()
    train_model("none", 0, prof, data, tok, tmp_path / "full", progress=False, log=quiet)
    assert load_checkpoint(tmp_path / "full" / "checkpoint.pt")["state"]["step"] == 6


def test_a_signal_writes_a_checkpoint_and_the_run_resumes_on_the_same_curve(tmp_path, prepared):
    """SIGUSR1: checkpoint and go on; SIGTERM: checkpoint, stop, and hand the signal to the handler before."""
    tok, data = prepared
    prof = tiny_profile(max_steps=9, log_every=3, val_every=3, ckpt_every=0, ckpt_on_signal=True, **FAST)
    full = train_model("rope", 1, prof, data, tok, tmp_path / "full", progress=False, log=quiet)
    seen, logged = [], []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        def on_update(state):
            if state["step"] == 2:
                signal.raise_signal(signal.SIGUSR1)
            if state["step"] == 5:  # between two log lines: the window's loss goes into the checkpoint
                signal.raise_signal(signal.SIGTERM)

        cut = train_model("rope", 1, prof, data, tok, tmp_path / "cut", progress=False, log=logged.append,
                          on_update=on_update)
        assert signal.getsignal(signal.SIGTERM) is not None and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == [signal.SIGTERM] and not cut["finished"] and cut["updates"] == 5
    assert any("SIGUSR1: checkpoint at update 2" in m for m in logged)
    assert any("SIGTERM: checkpoint at update 5 written; stopping" in m for m in logged)
    ck = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    assert ck["state"]["step"] == 5 and ck["state"]["window"]["n"] == 2 and not ck["finished"]
    again = train_model("rope", 1, prof, data, tok, tmp_path / "cut", resume=True, progress=False, log=quiet)
    assert again["finished"] and strip(again["curve"]) == strip(full["curve"])
    assert "window" not in load_checkpoint(tmp_path / "cut" / "checkpoint.pt")["state"]
    rows = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 3, 6, 9]


def test_a_checkpoint_loads_into_a_fused_optimizer_and_back():
    set_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    plain = torch.optim.Adam([w], lr=0.1)
    w.grad = torch.ones_like(w)
    plain.step()
    saved = plain.state_dict()
    fused = torch.optim.Adam([torch.nn.Parameter(w.detach().clone())], lr=0.1, fused=True)
    fused.load_state_dict(saved)
    assert not fused.param_groups[0]["fused"]  # the writer's flag came with the state
    set_fused(fused, True)
    assert fused.param_groups[0]["fused"] and fused.state[fused.param_groups[0]["params"][0]]["step"].item() == 1
    set_fused(fused, False)
    assert fused.param_groups[0]["fused"] is None


def test_flop_count_of_the_gpu_profile():
    p = PROFILES["gpu"]
    f = matmul_flops_per_token(p.d_model, p.dim_feedforward, p.num_layers, p.num_decoder_layers, p.vocab_size,
                               src_per_tgt=25.0 / 23.5)
    # ~324 MFLOP of matrix work per target token of a training update
    assert 3.1e8 < f["total"] < 3.3e8
    assert f["total"] == pytest.approx(f["decoder"] + f["output_layer"] + f["encoder_and_cross_kv"])
    assert matmul_flops_per_token(8, 16, 1, 1, 10, train=False)["total"] == 2 * (6 * 64 + 2 * 8 * 16 + 80 + 4 * 64
                                                                                 + 2 * 8 * 16 + 2 * 64)


def test_committed_run_folders_accept_the_profiles_with_the_new_fields(tmp_path):
    """A field added since a run began counts as unchanged at its default: the laptop run resumes as it is; the
    committed GPU runs (target bucketing) take the gpu profile with --set bucket=target and refuse other batches."""
    from dataclasses import asdict

    from posenc_lib.experiments.wmt14.pipeline import check_config
    from test_wmt14_pipeline import ROOT

    def folder(name):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text((ROOT / "results" / name / "config.json").read_text())
        return d, json.loads((d / "config.json").read_text())

    def config(old, prof):
        return {"profile": asdict(prof), "direction": old["direction"], "tokenizer_source": old["tokenizer_source"]}

    d, old = folder("wmt14-laptop")
    check_config(d, config(old, get_profile("laptop")))
    d, old = folder("wmt14-gpu-500")
    gpu = {"max_steps": "500", "warmup": "125"}
    check_config(d, config(old, get_profile("gpu", {**gpu, "bucket": "target"})))
    check_config(d, config(old, get_profile("gpu", {**gpu, "bucket": "target", "device_data": "false",
                                                    "loss_chunk": "none", "ckpt_every": "400"})))
    with pytest.raises(ValueError, match=r"bucket 'target' \(now 'both'\)"):
        check_config(d, config(old, get_profile("gpu", gpu)))


# -- q/k/v in one product, and the compiled step ---------------------------------------------------------------------
def test_one_qkv_product_equals_three():
    """fused_qkv: the same attention output and the same gradients for each projection's own weights."""
    from posenc_lib.attention.layer import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4)
    x, mem = torch.randn(3, 7, 16, requires_grad=True), torch.randn(3, 5, 16)
    grads = []
    for fused in (False, True):
        attn.fused_qkv = fused
        attn.zero_grad(set_to_none=True)
        x.grad = None
        out = attn(x) + attn(x, mem)  # cross-attention (kv given) is never fused: its keys come from the memory
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        grads.append((out.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in attn.named_parameters()}))
    torch.testing.assert_close(grads[1][0], grads[0][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[1][1], grads[0][1], atol=1e-6, rtol=1e-5)
    for n, g in grads[0][2].items():
        torch.testing.assert_close(grads[1][2][n], g, atol=1e-6, rtol=1e-5, msg=n)


@pytest.fixture
def traced(monkeypatch):
    """torch.compile with the "aot_eager" backend: dynamo's graphs and the autograd graph, no C++ build (the CUDA
    tests compile with inductor); the compile counters start at zero."""
    import logging

    import torch._dynamo

    monkeypatch.setitem(train_mod.COMPILE_BACKENDS, "cpu", "aot_eager")
    # pytest's log capture would switch on torch's structured trace of every graph (minutes of formatting)
    monkeypatch.setattr(logging.getLogger("torch.__trace"), "disabled", True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


@pytest.mark.parametrize("pe", ["rope", "xlnet", "deberta"])  # the schemes with host-side shortcuts
def test_compiled_fused_training_equals_the_eager_loop(tmp_path, prepared, traced, pe):
    """The gpu profile's compile and fused_qkv on the tiny model (no dropout, whose compiled masks differ): the curve
    of the plain loop, the weights of the same path uncompiled, and one graph for batches of many shapes."""
    tok, data = prepared
    base = dict(max_steps=6, log_every=2, val_every=2, ckpt_every=2, dropout=0.0)
    plain = train_model(pe, 0, tiny_profile(**base), data, tok, tmp_path / "a", progress=False, log=quiet)
    eager = train_model(pe, 0, tiny_profile(**base, **FAST, fused_qkv=True), data, tok, tmp_path / "b",
                        progress=False, log=quiet)
    prof = tiny_profile(**base, **FAST, fused_qkv=True, compile=True)
    fast = train_model(pe, 0, prof, data, tok, tmp_path / "c", progress=False, log=quiet)
    assert fast["compiled"] is True and "compiled" not in eager
    for ra, rb, rc in zip(plain["curve"], eager["curve"], fast["curve"]):
        for key in ("train_loss", "val_loss"):
            assert ra[key] is None or abs(ra[key] - rc[key]) < 2e-4, (ra, rc)
            assert rb[key] is None or abs(rb[key] - rc[key]) < 2e-5, (rb, rc)  # the same path, compiled
    for (name, pb), pc in zip(eager["model"].named_parameters(), fast["model"].parameters()):
        if name.endswith("k_proj.bias"):  # rounding noise that Adam scales up (see the micro-batch test)
            continue
        # XLNet's position projection gets small gradients whose rounding Adam scales up too (measured: 4e-4)
        torch.testing.assert_close(pc, pb, atol=1e-3 if name.endswith("r_proj") else 5e-5, rtol=1e-4, msg=name)
    # six batches of different shapes: one graph, no break and no recompile (sizes are symbolic from the start)
    assert traced["stats"]["unique_graphs"] == 1 and not traced["graph_break"], (dict(traced["stats"]),
                                                                                 dict(traced["graph_break"]))


def test_a_compiler_that_fails_leaves_the_eager_loop(tmp_path, prepared, traced, monkeypatch):
    """A backend that raises: the update is redone uncompiled, the run says so once and ends on the eager curve."""

    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    monkeypatch.setitem(train_mod.COMPILE_BACKENDS, "cpu", broken)
    tok, data = prepared
    base = dict(max_steps=4, log_every=2, val_every=2, ckpt_every=2, dropout=0.0)
    plain = train_model("rope", 0, tiny_profile(**base), data, tok, tmp_path / "a", progress=False, log=quiet)
    said = []
    fell = train_model("rope", 0, tiny_profile(**base, compile=True), data, tok, tmp_path / "b", progress=False,
                       log=said.append)
    assert fell["compiled"] is False
    assert [m for m in said if "torch.compile failed at update 1" in m and "no compiler here" in m] == said[-1:]
    assert [r["train_loss"] for r in fell["curve"]] == [r["train_loss"] for r in plain["curve"]]
    monkeypatch.setitem(train_mod.COMPILE_BACKENDS, "cpu", None)  # the default: the CPU trains uncompiled, and says so
    said.clear()
    plain_too = train_model("rope", 0, tiny_profile(**base, compile=True), data, tok, tmp_path / "c", progress=False,
                            log=said.append)
    assert plain_too["compiled"] is False and any("compile=true is not used on cpu" in m for m in said)
    assert [r["train_loss"] for r in plain_too["curve"]] == [r["train_loss"] for r in plain["curve"]]


@pytest.mark.parametrize("pe", [pe for pe in PE_TYPES if pe not in ("rope", "xlnet", "deberta")])
def test_every_other_scheme_compiles_to_one_graph(tmp_path, prepared, traced, pe):
    """The schemes the test above does not train: three updates of different shapes, one graph, no break."""
    tok, data = prepared
    prof = tiny_profile(max_steps=3, log_every=3, val_every=3, ckpt_every=3, **FAST, fused_qkv=True, compile=True)
    assert train_model(pe, 0, prof, data, tok, tmp_path, progress=False, log=quiet)["compiled"] is True
    assert traced["stats"]["unique_graphs"] == 1 and not traced["graph_break"], (dict(traced["stats"]),
                                                                                 dict(traced["graph_break"]))
