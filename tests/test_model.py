"""The seq2seq model with every scheme: shapes, symmetry, causality, caching, learning."""
import pytest
import torch

import posenc_lib
from posenc_lib import PE_TYPES, build_model, greedy_decode, set_seed
from posenc_lib.schemes.registry import make_scheme

SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)
V = 23


def small(pe, **kw):
    set_seed(0)
    return build_model(pe, V, **{**SMALL, **kw}).eval()


def test_public_names():
    for name in ["PE_TYPES", "build_model", "sinusoidal_table", "apply_rope", "t5_relative_bucket",
                 "deberta_log_bucket", "alibi_slopes", "set_seed", "greedy_decode"]:
        assert hasattr(posenc_lib, name), name
    assert PE_TYPES == ("none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi")


@pytest.mark.parametrize("alias,canonical", [("nonepe", "none"), ("sinpe", "sinusoidal"), ("rpe", "shaw"),
                                             ("rope", "rope")])
def test_seed_report_aliases(alias, canonical):
    assert build_model(alias, V, **SMALL).pe == canonical


def test_default_sizes_follow_the_seed_report():
    m = build_model("sinusoidal", 100)
    assert m.config["d_model"] == 64 and m.config["n_heads"] == 8 and len(m.encoder) == 6 and len(m.decoder) == 6
    assert m.encoder[0].ff[0].out_features == 2048


@pytest.mark.parametrize("pe", PE_TYPES)
def test_forward_shape_and_padding(pe):
    m = small(pe)
    src, tgt = torch.randint(1, V, (3, 9)), torch.randint(1, V, (3, 6))
    out = m(src, tgt)
    assert out.shape == (3, 6, V) and torch.isfinite(out).all()
    # right padding: appending pad tokens (masked) to the source does not change the output
    pad = torch.zeros(3, 4, dtype=torch.long)
    src_p = torch.cat((src, pad), 1)
    mask = src_p == 0
    out_p = m(src_p, tgt, src_key_padding_mask=mask)
    torch.testing.assert_close(out_p, out, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_encoder_permutation_equivariance_only_without_positions(pe):
    m = small(pe)
    src = torch.randint(1, V, (2, 10))
    perm = torch.randperm(10)
    with torch.no_grad():
        a = m.encode(src)[:, perm]
        b = m.encode(src[:, perm])
    equal = torch.allclose(a, b, atol=1e-5)
    assert equal == (pe == "none"), f"{pe}: permutation-equivariant={equal}"


@pytest.mark.parametrize("pe", PE_TYPES)
def test_decoder_is_causal(pe):
    m = small(pe)
    src, tgt = torch.randint(1, V, (2, 7)), torch.randint(1, V, (2, 8))
    tgt2 = tgt.clone()
    tgt2[:, 5:] = torch.randint(1, V, (2, 3))
    with torch.no_grad():
        a, b = m(src, tgt), m(src, tgt2)
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5:], b[:, 5:])


@pytest.mark.parametrize("pe", PE_TYPES)
def test_cached_greedy_equals_uncached(pe):
    m = small(pe)
    src = torch.randint(3, V, (4, 9))
    kw = dict(max_new_tokens=15, bos_id=1, eos_id=2)
    a = greedy_decode(m, src, use_cache=True, **kw)
    b = greedy_decode(m, src, use_cache=False, **kw)
    assert torch.equal(a, b)
    assert a[:, 0].eq(1).all() and a.shape[1] <= 16


@pytest.mark.parametrize("pe", PE_TYPES)
def test_cached_logits_equal_full_decoder(pe):
    m = small(pe)
    src, tgt = torch.randint(1, V, (2, 6)), torch.randint(1, V, (2, 7))
    with torch.no_grad():
        memory = m.encode(src)
        full = m.decode(tgt, memory)
        cache = m.new_cache()
        steps = [m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("rows", [(1, 1), (8, 1), (4, 16), (5, 13), (2, 40)])
def test_logits_of_few_rows_equal_the_plain_product(tie, rows):
    """Up to FEW_ROWS rows the vocabulary matrix goes on the left of the product (a view comes back): the
    same scores as ``x @ W^T``, in the same shape, up to rounding; more rows take the plain product."""
    from posenc_lib.models.seq2seq import FEW_ROWS

    m = small("none", tie_embeddings=tie)
    weight = m.embed.weight if tie else m.out_proj.weight
    x = torch.randn(*rows, SMALL["d_model"])
    with torch.no_grad():
        got = m.logits(x)
    assert got.shape == (*rows, V)
    torch.testing.assert_close(got, x @ weight.t(), atol=1e-6, rtol=1e-5)
    if rows[0] * rows[1] > 1:  # (one row is contiguous either way)
        assert got.is_contiguous() == (rows[0] * rows[1] > FEW_ROWS)


def test_fused_kernel_used_where_the_scheme_allows(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append(((q.shape[2], k.shape[2]), attn_mask, is_causal))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    for pe in PE_TYPES:
        m = small(pe)
        calls.clear()
        with torch.no_grad():
            m(torch.randint(1, V, (1, 5)), torch.randint(1, V, (1, 4)))
        by_kind = {kind: [c for c in calls if c[0] == shape] for kind, shape in
                   (("enc", (5, 5)), ("dec", (4, 4)), ("cross", (4, 5)))}
        assert len(by_kind["cross"]) == 2 and all(mk is None and not c for _, mk, c in by_kind["cross"])
        if pe in ("shaw", "xlnet", "deberta"):  # explicit scores: only cross-attention is fused
            assert len(calls) == 2 and not m.enc_scheme.fused
        elif pe in ("t5", "alibi"):  # the bias (and the causal part) as one float mask
            assert all(mk.is_floating_point() and not c for _, mk, c in by_kind["enc"] + by_kind["dec"])
            assert len(calls) == 6 and m.enc_scheme.fused
        else:  # nothing to add: no mask, and the decoder's causal mask is SDPA's own is_causal
            assert all(mk is None and not c for _, mk, c in by_kind["enc"]), pe
            assert all(mk is None and c for _, mk, c in by_kind["dec"]), pe
            assert len(calls) == 6 and m.enc_scheme.fused


def _copy_batch(b=32, n=8):
    body = torch.randint(3, V, (b, n))
    bos = torch.full((b, 1), 1)
    eos = torch.full((b, 1), 2)
    return body, torch.cat((bos, body), 1), torch.cat((body, eos), 1)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_every_scheme_learns_a_copy_task(pe):
    set_seed(0)
    m = build_model(pe, V, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    losses = []
    for step in range(80):
        src, tgt_in, tgt_out = _copy_batch()
        loss = m.loss(src, tgt_in, tgt_out)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.7 * first, f"{pe}: loss {first:.3f} -> {last:.3f}"


def test_post_norm_and_untied_variants():
    m = build_model("rope", V, **SMALL, norm_first=False, tie_embeddings=False)
    out = m(torch.randint(1, V, (2, 5)), torch.randint(1, V, (2, 3)))
    assert out.shape == (2, 3, V)


def test_symmetric_alibi_encoder_cannot_tell_a_source_from_its_reversal_split_can():
    src, tgt = torch.randint(3, V, (2, 9)), torch.randint(3, V, (2, 5))
    for option, blind in [("symmetric", True), ("split", False), ("directional", False)]:
        m = small("alibi", bidirectional=option)
        with torch.no_grad():
            a, b = m(src, tgt), m(src.flip(1), tgt)
        assert torch.allclose(a, b, atol=1e-5) == blind, option


def test_split_alibi_bias_hides_one_side_per_head():
    from posenc_lib.schemes.alibi import alibi_bias

    pos = torch.arange(5)
    bias = alibi_bias(pos, pos, torch.tensor([0.5, 0.25]), split=True)[0]
    right = pos[None, :] > pos[:, None]  # key right of the query
    left = pos[None, :] < pos[:, None]
    assert torch.isinf(bias[0][right]).all() and torch.isfinite(bias[0][~right]).all()
    assert torch.isinf(bias[1][left]).all() and torch.isfinite(bias[1][~left]).all()
    torch.testing.assert_close(bias[1, 0, 3], torch.tensor(-0.75))


def test_directional_alibi_bias_has_its_own_slope_on_each_side():
    """Closed form: -m_h (j - i) for keys right of the query, -m_{n+1-h} (i - j) left of it; a reversed sequence
    sees each head's bias transposed with the head order reversed, and the causal (decoder) form is the paper's."""
    pos = torch.arange(7)
    enc = make_scheme("alibi", 16, 4, 1, causal=False, bidirectional="directional")
    bias = enc.bias(enc.prepare(pos, pos), 0)[0]
    m = enc.slopes
    i, j = pos[:, None], pos[None, :]
    for h in range(4):
        want = torch.where(j >= i, -m[h] * (j - i), -m[3 - h] * (i - j))
        torch.testing.assert_close(bias[h], want.float(), rtol=0, atol=0)
    torch.testing.assert_close(bias.flip(0).transpose(1, 2), bias, rtol=0, atol=0)
    assert not torch.equal(bias, bias.transpose(1, 2))  # left and right differ
    dec = make_scheme("alibi", 16, 4, 1, causal=True, bidirectional="directional")
    paper = make_scheme("alibi", 16, 4, 1, causal=True)
    assert torch.equal(dec.bias(dec.prepare(pos, pos), 0), paper.bias(paper.prepare(pos, pos), 0))


@pytest.mark.parametrize("options", [dict(pe="alibi", bidirectional="split"), dict(pe="alibi", bidirectional="directional"),
                                     dict(pe="none")])
def test_padding_never_produces_nan(options):
    m = small(**options)
    src = torch.randint(3, V, (2, 8))
    src[0, 5:] = 0
    mask = src == 0
    out = m(src, torch.randint(3, V, (2, 4)), src_key_padding_mask=mask)
    assert torch.isfinite(out).all()
    tgt = torch.randint(3, V, (1, 4))
    unpadded = m(src[:1, :5], tgt)
    padded = m(src[:1], tgt, src_key_padding_mask=mask[:1])
    torch.testing.assert_close(padded, unpadded, atol=1e-5, rtol=1e-4)


def test_keep_weights_stores_attention_maps_without_changing_outputs():
    m = small("rope")
    src, tgt = torch.randint(3, V, (2, 6)), torch.randint(3, V, (2, 4))
    with torch.no_grad():
        before = m(src, tgt)
        for _, attn in m.attention_layers():
            attn.keep_weights = True
        after = m(src, tgt)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-4)
    w = m.decoder[0].self_attn.last_weights
    assert w.shape == (2, 4, 4, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 4))
    assert torch.all(w.triu(1) == 0)  # causal


def _renamed(state: dict, renames: dict[str, str], prefix: str = "") -> dict:
    out = {}
    for key, value in state.items():
        for new, old in renames.items():
            if key.startswith(prefix + new + "."):
                key = prefix + old + key[len(prefix + new):]
                break
        out[key] = value
    return out


@pytest.mark.parametrize("pe", ["t5", "learned"])
def test_checkpoints_with_the_old_scheme_keys_still_load(pe):
    """The schemes were ``enc_pos``/``dec_pos`` (Seq2SeqTransformer) and ``pos`` (CausalLM) in checkpoints saved
    before they were renamed ``enc_scheme``/``dec_scheme``/``scheme``: such a state dict loads, strictly, with every
    value where it was, also as part of a larger module."""
    from posenc_lib.models.causal_lm import CausalLM

    dims = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64)
    makers = ((lambda: build_model(pe, 31, dropout=0.0, **dims), {"enc_scheme": "enc_pos", "dec_scheme": "dec_pos"}),
              (lambda: CausalLM(31, pe, **dims), {"scheme": "pos"}))
    for make, renames in makers:
        set_seed(0)
        model = make()
        state = model.state_dict()
        old = _renamed(state, renames)
        assert any(k.split(".")[0] in renames.values() for k in old) and old.keys() != state.keys()
        fresh = make()
        fresh.load_state_dict(old)
        assert all(torch.equal(v, state[k]) for k, v in fresh.state_dict().items())
        outer = torch.nn.ModuleDict({"inner": make()})
        outer.load_state_dict(_renamed({f"inner.{k}": v for k, v in state.items()}, renames, "inner."))
        assert all(torch.equal(v, state[k]) for k, v in outer["inner"].state_dict().items())
        fresh.load_state_dict(state)  # the new keys load as before
