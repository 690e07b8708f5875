"""GPU readiness of the model, checked on CPU: the fused-attention dispatch, no host syncs or
CPU-built tensors in a forward pass, float32 position biases under bf16, bf16 training steps,
out-of-vocabulary ids, and beam search against exhaustive search."""
import itertools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from posenc_lib import ALL_TYPES, PE_TYPES, build_model, greedy_decode, make_scheme, set_seed
from posenc_lib.models import decoding
from posenc_lib.attention.layer import MultiHeadAttention, choose_attention_path
from posenc_lib.models.beam import beam_search, length_penalty

SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)
V = 23


def small(pe, vocab=V, **kw):
    set_seed(0)
    return build_model(pe, vocab, **{**SMALL, **kw}).eval()


# ----------------------------------------------------------------------------- the dispatcher
@pytest.mark.parametrize(
    "pe,q_len,k_len,causal,padded,weights,expected",
    [
        # (fused, is_causal, causal_mask)
        ("none", 6, 6, True, False, False, (True, True, False)),  # decoder self-attention: flash-eligible
        ("rope", 6, 6, True, False, False, (True, True, False)),
        ("sinusoidal", 6, 6, True, True, False, (True, False, True)),  # padding: explicit boolean mask
        ("none", 1, 6, True, False, False, (True, False, False)),  # cached step: nothing to mask
        ("none", 3, 6, True, False, False, (True, False, True)),  # is_causal is top-left: never here
        ("none", 6, 6, False, False, False, (True, False, False)),  # encoder
        ("alibi", 6, 6, True, False, False, (True, False, True)),  # a bias rides in the float mask
        ("t5", 1, 6, True, False, False, (True, False, False)),
        ("shaw", 6, 6, True, False, False, (False, False, True)),  # score + value terms: explicit
        ("xlnet", 6, 6, False, False, False, (False, False, False)),
        ("deberta", 6, 6, True, False, False, (False, False, True)),
        ("rope", 6, 6, True, False, True, (False, False, True)),  # weights wanted: explicit
    ],
)
def test_choose_attention_path(pe, q_len, k_len, causal, padded, weights, expected):
    scheme = make_scheme(pe, 32, 4, 1, causal=causal)
    path = choose_attention_path(scheme, q_len=q_len, k_len=k_len, causal=causal, padded=padded,
                                 need_weights=weights)
    assert (path.fused, path.is_causal, path.causal_mask) == expected
    assert scheme.fused == (pe not in ("shaw", "xlnet", "deberta"))


def test_a_custom_scheme_declares_what_it_adds_through_its_hooks():
    from posenc_lib.attention.layer import PositionScheme

    class Bias(PositionScheme):
        def bias(self, prep, layer):
            return torch.zeros(1)

    class Scores(PositionScheme):
        def scores(self, q, k, prep, layer, attn):
            return None

    assert Bias.adds_bias and not Bias.adds_scores and Bias(8, 2, 1).fused
    assert Scores.adds_scores and not Scores(8, 2, 1).fused


def _spy_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append(dict(q_len=q.shape[2], k_len=k.shape[2], mask=attn_mask, is_causal=is_causal))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("pe", ["none", "sinusoidal", "learned", "rope"])
def test_decoder_self_attention_reaches_sdpa_as_is_causal_without_a_mask(pe, monkeypatch):
    m = small(pe)
    calls = _spy_sdpa(monkeypatch)
    src, tgt = torch.randint(3, V, (2, 5)), torch.randint(3, V, (2, 4))
    with torch.no_grad():
        m(src, tgt)
    dec_self = [c for c in calls if (c["q_len"], c["k_len"]) == (4, 4)]
    others = [c for c in calls if (c["q_len"], c["k_len"]) != (4, 4)]
    assert len(dec_self) == 2 and len(others) == 4  # 2 decoder self; 2 encoder self + 2 cross
    assert all(c["is_causal"] and c["mask"] is None for c in dec_self)
    assert all(not c["is_causal"] and c["mask"] is None for c in others)

    # a cached step (one query, every earlier key): no mask and *not* is_causal (top-left aligned)
    calls.clear()
    with torch.no_grad():
        memory, cache = m.encode(src), m.new_cache()
        for t in range(3):
            m.decode(tgt[:, t : t + 1], memory, cache=cache)
    steps = [c for c in calls if c["q_len"] == 1 and c["k_len"] in (1, 2, 3)]
    assert len(steps) == 3 * 2 and all(not c["is_causal"] and c["mask"] is None for c in steps)

    # with target padding the causal part goes into an explicit boolean mask
    calls.clear()
    with torch.no_grad():
        m(src, tgt, tgt_key_padding_mask=torch.tensor([[False] * 4, [False, False, True, True]]))
    dec_self = [c for c in calls if (c["q_len"], c["k_len"]) == (4, 4)]
    assert all(not c["is_causal"] and c["mask"].dtype == torch.bool for c in dec_self)
    allowed = dec_self[0]["mask"][0, 0]
    assert torch.equal(allowed, torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("pe", ["t5", "alibi"])
def test_bias_schemes_pass_one_float_mask(pe, monkeypatch):
    m = small(pe)
    calls = _spy_sdpa(monkeypatch)
    with torch.no_grad():
        m(torch.randint(3, V, (2, 5)), torch.randint(3, V, (2, 4)))
    self_calls = [c for c in calls if c["q_len"] == c["k_len"]]
    assert len(self_calls) == 4
    for c in self_calls:
        assert not c["is_causal"] and c["mask"].is_floating_point()
    dec = [c["mask"] for c in self_calls if c["q_len"] == 4]
    assert all(torch.isinf(mk[..., 0, 1:]).all() for mk in dec)  # the causal part is folded in


@pytest.mark.parametrize("pe", ["none", "rope", "t5", "shaw"])
def test_is_causal_path_equals_the_explicit_masked_path(pe):
    """The fused is_causal call and the explicit softmax give the same decoder outputs."""
    m = small(pe)
    src, tgt = torch.randint(3, V, (2, 5)), torch.randint(3, V, (2, 6))
    with torch.no_grad():
        fused = m(src, tgt)
        for _, attn in m.attention_layers():
            attn.keep_weights = True  # forces the explicit path everywhere
        explicit = m(src, tgt)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------- no host syncs
class _NonMetaTensors(TorchDispatchMode):
    """Records every op that touches a tensor not on the meta device (a CPU-built tensor)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.seen.append((str(func), t.device.type, tuple(t.shape)))
        return out


@pytest.mark.parametrize("pe", ALL_TYPES)
def test_forward_and_cached_steps_read_nothing_back_and_build_nothing_on_the_cpu(pe):
    """On the meta device any ``.item()``/``int(tensor)``/``bool(tensor)`` raises, and the
    dispatch spy sees every tensor built on the CPU: the stand-in for "no host sync on a GPU"."""
    m = small(pe).to("meta")
    src = torch.ones(2, 5, dtype=torch.long, device="meta")
    tgt = torch.ones(2, 4, dtype=torch.long, device="meta")
    with torch.no_grad(), _NonMetaTensors() as spy:
        out = m(src, tgt, src_key_padding_mask=torch.zeros(2, 5, dtype=torch.bool, device="meta"))
        memory, cache = m.encode(src), m.new_cache()
        for t in range(3):
            m.decode(tgt[:, t : t + 1], memory, cache=cache)
    assert out.shape == (2, 4, V) and out.device.type == "meta"
    assert spy.seen == []


@pytest.mark.parametrize("pe", ALL_TYPES)
def test_training_step_on_meta_reads_nothing_back(pe):
    m = small(pe).to("meta").train()
    src = torch.ones(2, 5, dtype=torch.long, device="meta")
    tgt = torch.ones(2, 4, dtype=torch.long, device="meta")
    loss = m.loss(src, tgt, tgt, label_smoothing=0.1)
    loss.backward()
    assert all(p.grad is not None and p.grad.device.type == "meta" for p in m.parameters())


@pytest.mark.parametrize("every", [2, 5])
def test_decoding_checks_for_the_end_every_few_steps_with_the_same_result(every, monkeypatch):
    """What an accelerator does (read "all finished" every few steps) equals checking every step."""
    set_seed(2)
    drift = torch.zeros(12, 12)
    drift[:, 2] = 0.3 + torch.rand(12)  # each sentence drifts towards EOS at its own rate
    model = _MarkovModel(torch.randn(12, 12), drift)
    src = torch.randint(3, 12, (16, 5))
    kw = dict(max_new_tokens=24, bos_id=1, eos_id=2)
    ref_g = greedy_decode(model, src, **kw)
    ref_b = beam_search(model, src, beam=3, **kw)
    ends = [(row == 2).nonzero()[0].item() for row in ref_g if (row == 2).any()]
    assert len(ends) == 16 and len(set(ends)) > 2 and ref_g.shape[1] < 25  # all finish, at different steps
    monkeypatch.setattr(decoding, "sync_every", lambda device: every)
    assert torch.equal(greedy_decode(model, src, **kw), ref_g)
    assert torch.equal(beam_search(model, src, beam=3, **kw), ref_b)


# ----------------------------------------------------------------------------- float32 biases
@pytest.mark.parametrize("n_heads", [8, 6])
def test_alibi_bias_is_float32_under_bf16_for_distances_beyond_256(n_heads):
    pos = torch.arange(700)
    ref = make_scheme("alibi", 48, n_heads, 1, causal=True)
    bias = lambda scheme: scheme.bias(scheme.prepare(pos, pos), 0)  # noqa: E731 (laid out from offsets or not)
    expected = bias(ref)
    assert expected.dtype == torch.float32
    # exact: -m_h * distance in float32 (m_h from the paper's rule in float64)
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 8) for h in range(8)], dtype=torch.float64).float()
    if n_heads == 8:
        torch.testing.assert_close(expected[0, :, 699, 0], -(slopes * 699), rtol=0, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(bias(ref), expected, rtol=0, atol=0)
    cast = make_scheme("alibi", 48, n_heads, 1, causal=True).to(torch.bfloat16)  # parameter dtype bf16
    got = bias(cast)
    assert got.dtype == torch.float32
    far = (pos[None, :] - pos[:, None]).abs() > 256
    torch.testing.assert_close(got[0][:, far], expected[0][:, far], rtol=0, atol=0)


def test_t5_bias_is_float32_whatever_the_parameter_dtype():
    pos = torch.arange(400)
    scheme = make_scheme("t5", 32, 4, 1, causal=False)
    ref = scheme.prepare(pos, pos)["bias"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(scheme.prepare(pos, pos)["bias"], ref, rtol=0, atol=0)
    scheme.to(torch.bfloat16)
    got = scheme.prepare(pos, pos)["bias"]
    assert got.dtype == torch.float32
    w = scheme.relative_attention_bias.weight.float()
    torch.testing.assert_close(got[0], w[scheme.buckets(pos, pos)].permute(2, 0, 1), rtol=0, atol=0)


def test_sinusoidal_frequencies_stay_float32_in_a_bf16_model():
    m = small("sinusoidal")
    pos = torch.arange(600)
    ref = m.dec_scheme.embed(pos)
    m.to(torch.bfloat16)
    assert m.dec_scheme.encoding.freqs.dtype == torch.float32
    torch.testing.assert_close(m.dec_scheme.embed(pos), ref, rtol=0, atol=0)


# ----------------------------------------------------------------------------- bf16 training
@pytest.mark.parametrize("pe", ALL_TYPES)
def test_bf16_autocast_training_step_on_cpu(pe):
    m = small(pe).train()
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    src, tgt = torch.randint(3, V, (4, 9)), torch.randint(3, V, (4, 7))
    src[1, 6:] = 0
    masks = dict(src_key_padding_mask=src == 0)
    with torch.no_grad():
        fp32 = m.loss(src, tgt, tgt, **masks).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = m.loss(src, tgt, tgt, label_smoothing=0.1, **masks)
    assert torch.isfinite(loss)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = m.loss(src, tgt, tgt, **masks).item()
    assert abs(bf16 - fp32) < 0.05 * fp32, (bf16, fp32)
    loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert len(grads) == sum(1 for p in m.parameters() if p.requires_grad)
    assert all(torch.isfinite(g).all() for g in grads)
    before = [p.detach().clone() for p in m.parameters()]
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, m.parameters()))


# ----------------------------------------------------------------------------- bad token ids
@pytest.mark.parametrize("side", ["src", "tgt"])
@pytest.mark.parametrize("bad", [25, 20, -1])
def test_out_of_vocabulary_ids_name_the_id_the_input_and_the_vocabulary(side, bad):
    m = build_model("none", 20, d_model=16, n_heads=2, num_layers=1)
    ok = torch.tensor([[1, 5, 7]])
    wrong = torch.tensor([[1, bad, 7]])
    src, tgt = (wrong, ok) if side == "src" else (ok, wrong)
    with pytest.raises(ValueError, match=rf"{side} holds token id {bad} .*position 1.*vocab_size=20, valid ids 0\.\.19"):
        m(src, tgt)


def test_out_of_vocabulary_id_in_decoding_is_refused_before_decoding():
    m = build_model("rope", 20, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="src holds token id 25"):
        greedy_decode(m, torch.tensor([[1, 25]]), max_new_tokens=3, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match="src holds token id 25"):
        beam_search(m, torch.tensor([[1, 25]]), max_new_tokens=3, bos_id=1, eos_id=2)


# ----------------------------------------------------------------------------- beam search
def _exhaustive(model, src, *, max_new_tokens, bos_id, eos_id, alpha):
    """Score every hypothesis (ends with EOS, or runs to max_new_tokens without it) exactly."""
    vocab = model.vocab_size
    best = []
    with torch.no_grad():
        for row in range(src.shape[0]):
            memory = model.encode(src[row : row + 1])
            full = torch.tensor(list(itertools.product(range(vocab), repeat=max_new_tokens)))
            tgt_in = torch.cat((torch.full((len(full), 1), bos_id), full[:, :-1]), 1)
            logp = torch.log_softmax(model.decode(tgt_in, memory.expand(len(full), -1, -1)).double(), -1)
            tok_logp = logp.gather(-1, full[:, :, None])[..., 0]  # (N, T)
            top, top_seq = -math.inf, None
            for seq, lp in zip(full.tolist(), tok_logp):
                for n in range(1, max_new_tokens + 1):
                    if eos_id in seq[: n - 1]:
                        break
                    if seq[n - 1] != eos_id and n < max_new_tokens:
                        continue
                    score = lp[:n].sum().item() / length_penalty(float(n), alpha)
                    if score > top + 1e-9:
                        top, top_seq = score, [bos_id] + seq[:n]
            best.append(top_seq)
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_as_wide_as_every_hypothesis_equals_exhaustive_search(alpha):
    vocab, steps = 5, 3
    m = small("rope", vocab=vocab, d_model=16, n_heads=2, num_layers=1, dim_feedforward=32)
    m.embed.weight.data *= 3  # sharper distributions: no near-ties between hypotheses
    src = torch.randint(3, vocab, (3, 4))
    kw = dict(max_new_tokens=steps, bos_id=1, eos_id=2)
    got = beam_search(m, src, beam=vocab**steps, alpha=alpha, **kw)
    for row, expected in enumerate(_exhaustive(m, src, alpha=alpha, **kw)):
        hyp = got[row].tolist()
        assert hyp[: len(expected)] == expected and all(t == 0 for t in hyp[len(expected) :]), (alpha, row)


@pytest.mark.parametrize("pe", ["none", "shaw", "rope", "alibi"])
def test_beam_one_without_length_penalty_is_greedy(pe):
    m = small(pe)
    src = torch.randint(3, V, (5, 8))
    src[3, 6:] = 0
    kw = dict(max_new_tokens=10, bos_id=1, eos_id=2, src_key_padding_mask=src == 0)
    assert torch.equal(beam_search(m, src, beam=1, alpha=0.0, **kw), greedy_decode(m, src, **kw))


class _MarkovModel(torch.nn.Module):
    """A stand-in decoder: next-token logits from a lookup table on the last token, plus
    ``step * by_source[first source token]`` (a per-sentence drift, e.g. towards EOS)."""

    pad_id = 0

    def __init__(self, table, by_source=None):
        super().__init__()
        self.table = table
        self.by_source = torch.zeros_like(table) if by_source is None else by_source
        self.vocab_size = table.shape[0]

    def encode(self, src, mask=None):
        return self.by_source[src[:, :1]]  # (B, 1, V)

    def decode(self, tgt, memory, memory_key_padding_mask=None, cache=None):
        step = cache.offset if cache is not None else tgt.shape[1] - 1
        if cache is not None:
            cache.offset += 1
        return (self.table[tgt[:, -1]] + step * memory[:, 0])[:, None, :]

    def new_cache(self):
        class _Cache:
            offset = 0

            def reorder(self, index):
                pass

        return _Cache()


def test_a_finished_hypothesis_leaves_the_beam_and_frees_its_slot():
    """At step 1 EOS ranks first, then a, then b; only b -> EOS is good.  With beam 2 a finished
    hypothesis that kept its slot would push b out; here it leaves, and b wins after the length
    penalty (GNMT, alpha=1) -- the same answer as exhaustive search."""
    pad, bos, eos, a, b = range(5)
    table = torch.full((5, 5), -10.0)
    table[bos, eos], table[bos, a], table[bos, b] = 0.0, -0.01, -0.02
    table[a] = 0.0  # after a: every token equally (un)likely
    table[b, eos] = 10.0  # after b: almost surely EOS
    model = _MarkovModel(table)
    src = torch.ones(1, 3, dtype=torch.long)
    got = beam_search(model, src, max_new_tokens=3, bos_id=bos, eos_id=eos, beam=2, alpha=1.0)
    assert got.tolist() == [[bos, b, eos]]
    logp = torch.log_softmax(table.double(), -1)
    scores = {"eos": logp[bos, eos] / length_penalty(1.0, 1.0),
              "b eos": (logp[bos, b] + logp[b, eos]) / length_penalty(2.0, 1.0)}
    assert scores["b eos"] > scores["eos"]  # the normalised optimum
    # with alpha = 0 the single EOS is the most probable hypothesis
    assert beam_search(model, src, max_new_tokens=3, bos_id=bos, eos_id=eos, beam=2, alpha=0.0).tolist() == [[bos, eos]]


def test_beam_search_rejects_a_negative_length_penalty_and_a_bad_eos():
    m = small("none")
    with pytest.raises(ValueError, match="alpha"):
        beam_search(m, torch.randint(3, V, (1, 4)), max_new_tokens=3, bos_id=1, eos_id=2, alpha=-0.5)
    with pytest.raises(ValueError, match=rf"eos_id must be an integer in \[0, {V - 1}\], got {V}"):
        beam_search(m, torch.randint(3, V, (1, 4)), max_new_tokens=3, bos_id=1, eos_id=V)
