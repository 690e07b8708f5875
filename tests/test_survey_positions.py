"""Lesson 11's newer schemes (xPos, FIRE, CoPE, Kerple) in the one attention: parity with x-transformers (xPos,
CoPE) and with the papers' equations written out naively (FIRE, Kerple), FIRE's special cases, gradients,
blocked == unblocked, fused CPU == explicit, cached == uncached decoding, and clear errors."""
import math
from importlib.util import find_spec

import pytest
import torch

from posenc_lib import ALL_TYPES, PAPERS, PE_TYPES, SURVEY_TYPES, build_model, greedy_decode, make_scheme, set_seed
from posenc_lib.attention import cpu_flash, flex
from posenc_lib.attention import backends
from posenc_lib.attention import layer as attention
from posenc_lib.attention.layer import MultiHeadAttention, choose_attention_path
from posenc_lib.models.causal_lm import CausalLM
from posenc_lib.schemes import cope, fire, kerple
from posenc_lib.schemes.alibi import alibi_bias, alibi_slopes
from posenc_lib.schemes.registry import canonical_pe, scheme_options
from posenc_lib.schemes.t5 import t5_relative_bucket

V = 31
SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)
NEED_XT = pytest.mark.skipif(
    find_spec("x_transformers") is None,
    reason="x-transformers, the test-only reference for xPos and CoPE, is not installed "
    "(pip install -c constraints.txt x-transformers==2.31.10, or pip install -e '.[dev]')",
)


# -- the registry ---------------------------------------------------------------------------------------
def test_registry_keeps_the_classics_and_adds_the_survey_schemes():
    assert PE_TYPES == ("none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi")
    assert SURVEY_TYPES == ("xpos", "fire", "cope", "kerple") and ALL_TYPES == PE_TYPES + SURVEY_TYPES
    assert set(PAPERS) == set(ALL_TYPES)
    assert {pe: PAPERS[pe][1] for pe in SURVEY_TYPES} == {
        "xpos": "2212.10554", "fire": "2310.04418", "cope": "2405.18719", "kerple": "2205.09921"}
    for pe in SURVEY_TYPES:
        assert canonical_pe(pe.upper()) == pe and make_scheme(pe, 32, 4, 2, causal=True).name == pe
    assert scheme_options("kerple") == {"kernel": "log"} and scheme_options("cope") == {"max_pos": 64}
    with pytest.raises(ValueError, match=r"valid choices: none, .*alibi, xpos, fire, cope, kerple"):
        canonical_pe("fir")


@pytest.mark.parametrize("pe", SURVEY_TYPES)
def test_models_take_each_scheme_and_every_parameter_learns(pe):
    set_seed(0)
    model = build_model(pe, V, **SMALL).train()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, V, (2, 9), generator=g), torch.randint(3, V, (2, 8), generator=g)
    if pe == "cope":  # the paper's zero start gives the gates no gradient at the first step: start elsewhere
        for scheme in (model.enc_scheme, model.dec_scheme):
            torch.nn.init.normal_(scheme.pos_emb, std=0.5)
    model.loss(src, tgt[:, :-1], tgt[:, 1:]).backward()
    lm = CausalLM(V, pe, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64)
    lm.loss(torch.randint(0, V, (2, 10), generator=g)).backward()
    params = [(f"model.{n}", p) for n, p in model.named_parameters()] + [(f"lm.{n}", p) for n, p in lm.named_parameters()]
    silent = [n for n, p in params if p.grad is None or not bool(p.grad.abs().sum() > 0)]
    assert not silent
    scheme_params = [n for n, _ in params if ".enc_scheme." in n or ".dec_scheme." in n or ".scheme." in n]
    assert bool(scheme_params) == (pe != "xpos")


def test_each_scheme_takes_the_path_its_hooks_ask_for():
    """xPos rotates (fused, SDPA's own causal mask); FIRE and Kerple add a learned bias (fused, a float mask);
    CoPE adds score terms (explicit softmax; the fused CPU kernel only over query blocks)."""
    paths = {}
    for pe in SURVEY_TYPES:
        s = make_scheme(pe, 32, 4, 1, causal=True)
        p = choose_attention_path(s, q_len=8, k_len=8, causal=True, padded=False)
        paths[pe] = (s.enters, p.fused, p.is_causal, s.adds_bias, s.adds_scores, s.fused, s.splits_queries)
    assert paths == {
        "xpos": ("q,k", True, True, False, False, True, True),
        "fire": ("scores (bias)", True, False, True, False, True, True),
        "cope": ("scores", False, False, False, True, False, True),
        "kerple": ("scores (bias)", True, False, True, False, True, True),
    }


# -- xPos -------------------------------------------------------------------------------------------------
def _copy_into_ours(xa, d, h):
    ours = MultiHeadAttention(d, h, bias=False)
    with torch.no_grad():
        for mine, theirs in ((ours.q_proj, xa.to_q), (ours.k_proj, xa.to_k), (ours.v_proj, xa.to_v), (ours.out_proj, xa.to_out)):
            mine.weight.copy_(theirs.weight)
    return ours


@NEED_XT
@pytest.mark.parametrize("rotary_dim,scale_base", [(8, 512.0), (4, 8.0), (8, 4.0)])
def test_xpos_equals_x_transformers_rotary_xpos(rotary_dim, scale_base):
    from x_transformers.x_transformers import Attention, RotaryEmbedding

    torch.manual_seed(0)
    d, h, dh, n = 32, 4, 8, 40
    xa = Attention(d, dim_head=dh, heads=h, causal=True)
    rotary = RotaryEmbedding(rotary_dim, use_xpos=True, scale_base=scale_base)
    ours = _copy_into_ours(xa, d, h)
    scheme = make_scheme("xpos", d, h, 1, causal=True, scale_base=scale_base, rotary_dim=rotary_dim)
    x = torch.randn(2, n, d, requires_grad=True)
    pos = torch.arange(n)
    ref = xa(x, rotary_pos_emb=rotary(pos))
    ref = ref[0] if isinstance(ref, tuple) else ref
    got = ours(x, causal=True, scheme=scheme, prep=scheme.prepare(pos, pos))
    diff = (got - ref).abs().max().item()
    assert diff < 2e-6, diff  # measured: about 1e-7
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    (g_got,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(g_got, g_ref, atol=1e-5, rtol=1e-4)


def test_xpos_scores_decay_with_distance_only():
    """q~_n . k~_m = sum_k zeta_k^((n-m)/B) (pair k of q^T R_{m-n} k): a function of n - m, damped per pair."""
    torch.manual_seed(0)
    s = make_scheme("xpos", 16, 2, 1, causal=True, scale_base=4.0)
    q, k = torch.randn(16 // 2), torch.randn(16 // 2)
    pos = torch.arange(30)
    prep = s.prepare(pos, pos)
    qs, ks = s.rotate(q.expand(1, 1, 30, 8), k.expand(1, 1, 30, 8), prep, 0)
    scores = (qs @ ks.transpose(-1, -2))[0, 0]
    for delta in (0, 3, 11):
        diag = scores.diagonal(-delta)  # query n, key n - delta
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-5, rtol=1e-5)
    # the decay: with the rotation removed (q, k in the low-frequency pair only), scores fall as zeta^(delta/B)
    zeta = s.zeta[-1]
    e = torch.zeros(8)
    e[-2] = 1.0
    qs, ks = s.rotate(e.expand(1, 1, 30, 8), e.expand(1, 1, 30, 8), prep, 0)
    rope = make_scheme("rope", 16, 2, 1, causal=True)
    qr, kr = rope.rotate(e.expand(1, 1, 30, 8), e.expand(1, 1, 30, 8), rope.prepare(pos, pos), 0)
    ratio = ((qs @ ks.transpose(-1, -2)) / (qr @ kr.transpose(-1, -2)))[0, 0]
    torch.testing.assert_close(ratio[20, 12], zeta ** (8 / 4.0), atol=1e-5, rtol=1e-5)


def test_xpos_bidirectional_form_is_the_rotation_without_decay():
    torch.manual_seed(0)
    xpos, rope = make_scheme("xpos", 32, 4, 1, causal=False), make_scheme("rope", 32, 4, 1, causal=False)
    q, k = torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    pos = torch.arange(9)
    for a, b in zip(xpos.rotate(q, k, xpos.prepare(pos, pos), 0), rope.rotate(q, k, rope.prepare(pos, pos), 0)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert "no decay" in repr(xpos)


# -- CoPE -------------------------------------------------------------------------------------------------
@NEED_XT
@pytest.mark.parametrize("max_pos", [4, 16])
def test_cope_equals_x_transformers_cope(max_pos):
    from x_transformers.x_transformers import Attention

    torch.manual_seed(0)
    d, h, dh, n = 32, 4, 8, 20
    xa = Attention(d, dim_head=dh, heads=h, causal=True, use_cope=True, cope_max_pos=max_pos)
    with torch.no_grad():
        xa.attend.cope.pos_emb.normal_()
    ours = _copy_into_ours(xa, d, h)
    scheme = make_scheme("cope", d, h, 1, causal=True, max_pos=max_pos)
    with torch.no_grad():
        scheme.pos_emb[0].copy_(xa.attend.cope.pos_emb)
    x = torch.randn(2, n, d, requires_grad=True)
    pos = torch.arange(n)
    ref = xa(x)
    ref = ref[0] if isinstance(ref, tuple) else ref
    got = ours(x, causal=True, scheme=scheme, prep=scheme.prepare(pos, pos))
    diff = (got - ref).abs().max().item()
    assert diff < 2e-6, diff  # measured: about 1e-7
    g_ref = torch.autograd.grad(ref.square().sum(), (x, xa.attend.cope.pos_emb))
    g_got = torch.autograd.grad(got.square().sum(), (x, scheme.pos_emb))
    torch.testing.assert_close(g_got[0], g_ref[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g_got[1][0], g_ref[1], atol=1e-5, rtol=1e-4)


def _cope_naive(q, k, table, max_pos, causal):
    """The paper's equations, one (query, key) pair at a time, in float64."""
    q, k, table = q.double(), k.double(), table.double()
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, n, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                gate = [torch.sigmoid(q[bi, hi, i] @ k[bi, hi, m] / d**0.5) for m in range(n)]
                for j in range(n):
                    if j <= i:
                        p, rows = sum(gate[j : i + 1]), table[:max_pos]
                    elif causal:
                        continue
                    else:
                        p, rows = sum(gate[i : j + 1]), table[max_pos:]
                    p = min(float(p), max_pos - 1)
                    lo, hi_ = int(p // 1), int(-(-p // 1))
                    e = (p - lo) * rows[hi_] + (1 - p + lo) * rows[lo]
                    out[bi, hi, i, j] = q[bi, hi, i] @ e
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_cope_term_equals_the_papers_equations(causal):
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    table = torch.randn(6 if causal else 12, 4)
    pos = torch.arange(9)
    got = cope.cope_term(q, k, table, pos, pos, 0.5, 6, causal)
    ref = _cope_naive(q, k, table, 6, causal)
    keep = torch.ones(9, 9).tril().bool() if causal else torch.ones(9, 9, dtype=torch.bool)
    torch.testing.assert_close(got.double()[..., keep], ref[..., keep], atol=1e-5, rtol=1e-5)


def _cope_autograd(q, k, table, pos, scale, max_pos, causal):
    """The paper's code (its appendix B; x-transformers' CoPE), vectorised, differentiated by autograd."""
    s = (q @ k.transpose(-1, -2)) * scale
    left = pos[None, :] <= pos[:, None]
    gates = torch.sigmoid(s)
    p = gates.masked_fill(~left, 0).flip(-1).cumsum(-1).flip(-1)
    if not causal:
        p = torch.where(left, p, gates.masked_fill(pos[None, :] < pos[:, None], 0).cumsum(-1))
    p = p.clamp(max=max_pos - 1)
    z = q @ table.t()
    lo, hi = p.floor().long(), p.ceil().long()
    if not causal:
        lo, hi = lo + (~left).long() * max_pos, hi + (~left).long() * max_pos
    w = p - p.floor()
    return z.gather(-1, hi) * w + z.gather(-1, lo) * (1 - w)


@pytest.mark.parametrize("causal", [True, False])
def test_cope_written_out_gradient_equals_autograd_and_finite_differences(causal):
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 7, 4, generator=g, dtype=torch.float64), torch.randn(2, 2, 7, 4, generator=g, dtype=torch.float64)
    table = torch.randn(3 if causal else 6, 4, generator=g, dtype=torch.float64)  # max_pos 3: some positions clipped
    pos = torch.arange(7)
    args = [t.clone().requires_grad_() for t in (q, k, table)]
    got = cope.cope_term(*args, pos, pos, 0.7, 3, causal)
    ref_args = [t.clone().requires_grad_() for t in (q, k, table)]
    ref = _cope_autograd(*ref_args, pos, 0.7, 3, causal)
    keep = torch.ones(7, 7).tril().bool() if causal else torch.ones(7, 7, dtype=torch.bool)
    torch.testing.assert_close(got[..., keep], ref[..., keep])
    d_out = torch.randn(got.shape, generator=g, dtype=torch.float64) * keep
    for a, b in zip(torch.autograd.grad(got, args, d_out), torch.autograd.grad(ref, ref_args, d_out)):
        torch.testing.assert_close(a, b)
    fn = lambda q_, k_, t_: cope.cope_term(q_, k_, t_, pos, pos, 0.7, 3, causal) * keep  # noqa: E731
    assert torch.autograd.gradcheck(fn, [t.clone().requires_grad_() for t in (q, k, table)])


def test_cope_counts_what_its_gates_choose():
    """Gates that fire on one symbol only make p_ij the number of those symbols between key j and query i."""
    seq = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 1])  # 1 = a "full stop"
    k = torch.zeros(1, 1, 9, 2)
    k[0, 0, :, 0] = torch.where(seq == 1, 50.0, -50.0)  # q . k = +-50: gate 1 on a stop, 0 elsewhere
    q = torch.tensor([1.0, 0.0]).expand(1, 1, 9, 2)
    pos = torch.arange(9)
    p = cope.cope_positions(q, k, pos, pos, 1.0)[0, 0]
    stops = torch.cat((torch.zeros(1, dtype=torch.long), seq.cumsum(0)))
    counted = (stops[1:, None] - stops[None, :-1]).float().tril()  # stops among keys j .. i
    torch.testing.assert_close(p, counted, atol=1e-6, rtol=0)
    assert p[8, 0] > 4.99 and p[6, 3] < 1.01  # 5 stops in the whole row; 1 stop between keys 3 and 6


# -- FIRE -------------------------------------------------------------------------------------------------
def _fire_naive(scheme, layer, q_pos, k_pos):
    """b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), f = W2 relu(w1 x + b1) + b2, one pair at a
    time in float64 (the bidirectional form: the input times sign(i - j))."""
    i_ = 0 if scheme.shared_layers else layer
    first, last = scheme.mlps[i_][0], scheme.mlps[i_][2]
    w1, b1, w2, b2 = (t.detach().double() for t in (first.weight[:, 0], first.bias, last.weight, last.bias))
    c = abs(float(scheme.c[i_].detach()))
    big_l = abs(float(scheme.L_multiplier[i_].detach()) * scheme.init_L)
    out = torch.zeros(scheme.n_heads, len(q_pos), len(k_pos), dtype=torch.float64)
    for a, i in enumerate(q_pos.tolist()):
        for b, j in enumerate(k_pos.tolist()):
            x = math.log(c * abs(i - j) + 1) / (math.log(c * max(big_l, i) + 1) + fire.EPS)
            if not scheme.causal and i < j:
                x = -x
            out[:, a, b] = w2 @ torch.relu(w1 * x + b1) + b2
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("init_L", [512.0, 10.0, 3.0])  # every row under L, rows on both sides, most rows over L
def test_fire_bias_equals_the_papers_equation(causal, init_L, monkeypatch):
    set_seed(0)
    scheme = make_scheme("fire", 32, 4, 2, causal=causal, init_L=init_L, init_c=0.3)
    with torch.no_grad():
        scheme.L_multiplier[1] = 0.7
    q_pos, k_pos = torch.arange(3, 17), torch.arange(0, 17)
    for layer in (0, 1):
        ref = _fire_naive(scheme, layer, q_pos, k_pos)
        got = scheme.compute_bias(q_pos, k_pos, layer)
        assert got.shape == (1, 4, 14, 17) and got.dtype == torch.float32
        torch.testing.assert_close(got[0].double(), ref, atol=2e-6, rtol=1e-5)
        monkeypatch.setattr(fire, "on_host", lambda t: False)  # the device path: every pair, no table
        torch.testing.assert_close(scheme.compute_bias(q_pos, k_pos, layer)[0].double(), ref, atol=2e-6, rtol=1e-5)
        monkeypatch.undo()


def test_fire_table_and_recomputed_hidden_layer_give_the_same_gradients(monkeypatch):
    set_seed(0)
    scheme = make_scheme("fire", 32, 4, 1, causal=True, init_L=6.0)
    pos = torch.arange(20)
    w = torch.randn(1, 4, 20, 20)
    grads = []
    for setting in ("table", "grid", "grid, recomputed"):
        monkeypatch.setattr(fire, "on_host", (lambda t: True) if setting == "table" else (lambda t: False))
        monkeypatch.setattr(fire, "RECOMPUTE_ELEMENTS", 1 if "recomputed" in setting else 2**22)
        scheme.zero_grad(set_to_none=True)
        (scheme.compute_bias(pos, pos, 0) * w).sum().backward()
        grads.append({n: p.grad.clone() for n, p in scheme.named_parameters()})
    assert set(grads[0]) == {"mlps.0.0.weight", "mlps.0.0.bias", "mlps.0.2.weight", "mlps.0.2.bias", "c", "L_multiplier"}
    for other in grads[1:]:
        for name, g in grads[0].items():
            torch.testing.assert_close(other[name], g, atol=1e-5, rtol=1e-4, msg=name)


def _fire_with(values, c, threshold):
    """A causal one-layer FIRE whose MLP interpolates ``values (D + 1, heads)`` at the integer distances."""
    scheme = make_scheme("fire", 32, values.shape[1], 1, causal=True, mlp_width=values.shape[0], init_c=c,
                         init_L=threshold)  # fmt: skip
    scheme.mlps[0] = fire.interpolating_mlp(values, c, threshold, width=values.shape[0])
    return scheme


def _causal_close(got, ref, atol):
    keep = torch.ones(got.shape[-2:], dtype=torch.bool).tril()
    torch.testing.assert_close(got[..., keep], ref.float()[..., keep], atol=atol, rtol=1e-5)


def test_fire_represents_t5_alibi_and_kerple():
    """FIRE's special cases (the paper's expressiveness theorem), numerically, for queries within L."""
    torch.manual_seed(0)
    n, heads, c, big_l = 48, 4, 0.1, 64.0
    pos = torch.arange(n)
    rel = pos[None, :] - pos[:, None]  # j - i
    d = torch.arange(n)
    # T5, causal buckets (32 buckets, max distance 128): a step function of the distance
    table = torch.randn(32, heads)
    t5 = table[t5_relative_bucket(rel, bidirectional=False)].permute(2, 0, 1)[None]
    t5_values = table[t5_relative_bucket(-d, bidirectional=False)]
    _causal_close(_fire_with(t5_values, c, big_l).compute_bias(pos, pos, 0), t5, atol=1e-4)
    # ALiBi: linear in the distance
    slopes = alibi_slopes(heads)
    alibi = alibi_bias(pos, pos, slopes)
    _causal_close(_fire_with(-slopes[None, :] * d[:, None], c, big_l).compute_bias(pos, pos, 0), alibi, atol=1e-4)
    # Kerple, power kernel: interpolated
    k_power = make_scheme("kerple", 32, heads, 1, causal=True, kernel="power")
    r1, r2 = k_power.coefficients(0)
    values = kerple.kerple_kernel(d, r1, r2, "power").detach()
    _causal_close(_fire_with(values, c, big_l).compute_bias(pos, pos, 0), k_power.compute_bias(pos, pos, 0).detach(),
                  atol=1e-4)  # fmt: skip
    # Kerple, log kernel with one r2 for every head: FIRE exactly, with c = r2 and a linear f (one ReLU unit)
    k_log = make_scheme("kerple", 32, heads, 1, causal=True, kernel="log")
    with torch.no_grad():
        k_log.r2.fill_(0.37)
    r1, _ = k_log.coefficients(0)
    scheme = make_scheme("fire", 32, heads, 1, causal=True, mlp_width=1, init_c=0.37, init_L=big_l)
    with torch.no_grad():
        scheme.mlps[0][0].weight.fill_(1.0)
        scheme.mlps[0][0].bias.zero_()
        scheme.mlps[0][2].weight.copy_(-(r1 * (fire.fire_psi(torch.tensor(big_l), torch.tensor(0.37)) + fire.EPS))[:, None])
        scheme.mlps[0][2].bias.zero_()
    _causal_close(scheme.compute_bias(pos, pos, 0).detach(), k_log.compute_bias(pos, pos, 0).detach(), atol=1e-5)


@pytest.mark.parametrize("pe", ["fire", "kerple"])
def test_learned_biases_are_float32_under_autocast_and_in_a_bf16_model(pe, monkeypatch):
    set_seed(0)
    pos = torch.arange(40)
    scheme = make_scheme(pe, 32, 4, 1, causal=True, **({"init_L": 20.0} if pe == "fire" else {}))  # fire: both parts
    ref = scheme.bias(scheme.prepare(pos, pos), 0)
    assert ref.dtype == torch.float32
    monkeypatch.setattr(fire, "RECOMPUTE_ELEMENTS", 64)  # chunks of rows beyond L
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(scheme.bias(scheme.prepare(pos, pos), 0), ref, rtol=0, atol=0)
    scheme.to(torch.bfloat16)
    got = scheme.bias(scheme.prepare(pos, pos), 0)
    assert got.dtype == torch.float32 and (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_fire_shared_layers_builds_one_bias_per_stack():
    set_seed(0)
    s = make_scheme("fire", 32, 4, 3, causal=True, shared_layers=True)
    assert len(s.mlps) == 1 and s.c.shape == (1,)
    pos = torch.arange(7)
    prep = s.prepare(pos, pos)
    assert s.bias(prep, 0) is s.bias(prep, 2)
    torch.testing.assert_close(s.bias(prep, 2)[0].double(), _fire_naive(s, 2, pos, pos), atol=2e-6, rtol=1e-5)


# -- Kerple ------------------------------------------------------------------------------------------------
def _kerple_naive(r1, r2, kernel, n):
    out = torch.zeros(len(r1), n, n, dtype=torch.float64)
    for h in range(len(r1)):
        for i in range(n):
            for j in range(n):
                d = abs(i - j)
                out[h, i, j] = -r1[h] * (torch.log(torch.tensor(1.0 + r2[h] * d)) if kernel == "log" else d ** r2[h])
    return out


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_bias_equals_the_papers_formulas(kernel, monkeypatch):
    set_seed(0)
    s = make_scheme("kerple", 32, 4, 2, causal=True, kernel=kernel)
    with torch.no_grad():
        s.r1[1] = torch.tensor([0.5, 1.0, 0.005, 3.0])  # 0.005: clamped to 0.01 as in the authors' code
        s.r2[1] = torch.tensor([0.2, 2.5, 1.0, 0.001])  # 2.5: the power kernel keeps its exponent <= 2
    pos = torch.arange(12)
    for layer in (0, 1):
        r1 = [max(float(v), kerple.EPS) for v in s.r1[layer].detach()]
        r2 = [max(float(v), kerple.EPS) for v in s.r2[layer].detach()]
        if kernel == "power":
            r2 = [min(v, 2.0) for v in r2]
        ref = _kerple_naive(r1, r2, kernel, 12)
        torch.testing.assert_close(s.compute_bias(pos, pos, layer)[0].double(), ref, atol=1e-5, rtol=1e-5)
        monkeypatch.setattr(kerple, "on_host", lambda t: False)  # the device path, no table
        torch.testing.assert_close(s.compute_bias(pos, pos, layer)[0].double(), ref, atol=1e-5, rtol=1e-5)
        monkeypatch.undo()
    # straight-through clamp: the gradient of a clamped parameter is still there (and finite at distance 0)
    (s.compute_bias(pos, pos, 1) * torch.randn(1, 4, 12, 12)).sum().backward()
    assert torch.isfinite(s.r1.grad).all() and torch.isfinite(s.r2.grad).all() and (s.r1.grad[1] != 0).all()


# -- query blocks, the fused CPU kernel, cached decoding -------------------------------------------------
def _loss_and_grads(model, src, tgt, pads):
    model.zero_grad(set_to_none=True)
    loss = model.loss(src, tgt[:, :-1], tgt[:, 1:], **pads)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _model_and_batch(pe):
    set_seed(0)
    model = build_model(pe, V, **SMALL).train()
    if pe == "cope":
        for scheme in (model.enc_scheme, model.dec_scheme):
            torch.nn.init.normal_(scheme.pos_emb, std=0.5)
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, V, (3, 13), generator=g), torch.randint(4, V, (3, 12), generator=g)
    src_pad = torch.zeros(3, 13, dtype=torch.bool)
    src_pad[0, 9:] = True
    tgt_pad = torch.zeros(3, 11, dtype=torch.bool)
    tgt_pad[1, 7:] = True
    return model, src, tgt, dict(src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad)


def _spy_blocks(monkeypatch):
    seen = []
    real = backends.query_blocks

    def spy(*a, **kw):
        blocks = real(*a, **kw)
        if blocks is not None:
            seen.append(len(blocks))
        return blocks

    monkeypatch.setattr(backends, "query_blocks", spy)
    return seen


@pytest.mark.parametrize("pe", SURVEY_TYPES)
@pytest.mark.parametrize("padded", [False, True])
def test_blocks_give_the_same_loss_and_gradients(pe, padded, monkeypatch):
    model, src, tgt, pads = _model_and_batch(pe)
    pads = pads if padded else {}
    monkeypatch.setattr(attention, "CPU_FLASH", False)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", None)
    loss_1, grads_1 = _loss_and_grads(model, src, tgt, pads)
    seen = _spy_blocks(monkeypatch)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 3 * 4 * 4 * 13)  # blocks of 4 query rows
    loss_b, grads_b = _loss_and_grads(model, src, tgt, pads)
    assert bool(seen) == (pe != "xpos") and all(n >= 3 for n in seen)  # xpos: fused, nothing kept to block
    torch.testing.assert_close(loss_b, loss_1, atol=1e-6, rtol=1e-5)
    assert grads_b.keys() == grads_1.keys()
    for name in grads_1:
        torch.testing.assert_close(grads_b[name], grads_1[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("pe", ["fire", "kerple", "cope"])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_cpu_kernel_gives_the_same_loss_and_gradients(pe, padded, monkeypatch):
    """Blocked calls on CPU: FIRE and Kerple as T5 (one fused call with the bias's gradient), CoPE as DeBERTa
    (its term rebuilt from q, k and the table in the backward pass), each against the explicit blocks."""
    model, src, tgt, pads = _model_and_batch(pe)
    pads = pads if padded else {}
    calls = {"flash_attention": [], "flash_scores": []}
    for name, seen in calls.items():
        real = getattr(cpu_flash, name)
        monkeypatch.setattr(cpu_flash, name, lambda *a, real=real, seen=seen, **kw: seen.append(a) or real(*a, **kw))
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 3 * 4 * 4 * 13)
    results = {}
    for fused in (False, True):
        monkeypatch.setattr(attention, "CPU_FLASH", fused)
        results[fused] = _loss_and_grads(model, src, tgt, pads)
        used = {name for name, seen in calls.items() if seen}
        assert used == ({"flash_scores" if pe == "cope" else "flash_attention"} if fused else set())
    torch.testing.assert_close(results[True][0], results[False][0], atol=1e-6, rtol=1e-5)
    assert results[True][1].keys() == results[False][1].keys()
    for name, grad in results[False][1].items():
        torch.testing.assert_close(results[True][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    if pe == "cope":  # a causal block of the decoder sees only the keys up to its last query
        assert {a[1].shape[2] for a in calls["flash_scores"]} >= {4, 8, 11}
    elif not padded:  # a bias shared over the batch: one fused call per layer, causal blocks trimmed
        assert all(a[3].shape[0] == 1 for a in calls["flash_attention"])
        assert any(a[5] == [(0, 4, 4), (4, 8, 8), (8, 11, 11)] for a in calls["flash_attention"])


@pytest.mark.parametrize("pe", SURVEY_TYPES)
def test_cached_steps_equal_the_full_decoder(pe):
    set_seed(0)
    m = build_model(pe, V, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0).eval()
    if pe == "cope":
        torch.nn.init.normal_(m.dec_scheme.pos_emb, std=0.5)
    if pe == "xpos":
        m.dec_scheme = make_scheme("xpos", 32, 4, 2, causal=True, scale_base=16.0)  # a decay felt within 40 steps
    if pe == "fire":
        with torch.no_grad():
            m.dec_scheme.L_multiplier.fill_(20 / 512)  # L = 20: rows on both sides of the threshold
    steps = 40
    src = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(3, V, (2, steps), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        memory = m.encode(src)
        full = m.decode(tgt, memory)
        cache = m.new_cache()
        out = [m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(steps)]
    torch.testing.assert_close(torch.cat(out, 1), full, atol=1e-5, rtol=1e-4)
    a = greedy_decode(m, src, max_new_tokens=30, bos_id=1, eos_id=None)
    b = greedy_decode(m, src, max_new_tokens=30, bos_id=1, eos_id=None, use_cache=False)
    assert a.shape == (2, 31) and torch.equal(a, b)


@pytest.mark.skipif(not flex.available(), reason="this torch has no FlexAttention")
@pytest.mark.parametrize("causal", [False, True])
def test_cope_runs_through_flex_attention_too(causal, monkeypatch):
    set_seed(0)
    scheme = make_scheme("cope", 32, 4, 1, causal=causal)
    torch.nn.init.normal_(scheme.pos_emb, std=0.5)
    attn = MultiHeadAttention(32, 4).eval()
    pos, x = torch.arange(16), torch.randn(2, 16, 32)
    with torch.no_grad():
        monkeypatch.delenv(flex.ENV, raising=False)
        ref = attn(x, causal=causal, scheme=scheme, prep=scheme.prepare(pos, pos))
        monkeypatch.setenv(flex.ENV, "1")
        got = attn(x, causal=causal, scheme=scheme, prep=scheme.prepare(pos, pos))
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)


# -- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pe,options,error,message", [
    ("xpos", {"scale_base": 0}, ValueError, r"scale_base must be a finite number in \(0.0, inf\), got 0"),
    ("xpos", {"gamma": -1.0}, ValueError, r"gamma must be a finite number in \(0.0, inf\)"),
    ("xpos", {"rotary_dim": 3}, ValueError, r"rotary_dim must be an even number in \[2, head_dim=8\], got 3"),
    ("xpos", {"rotary_dim": 16}, ValueError, r"rotary_dim must be an even number in \[2, head_dim=8\], got 16"),
    ("xpos", {"interleaved": "yes"}, TypeError, r"interleaved must be True or False"),
    ("fire", {"mlp_width": 0}, ValueError, r"mlp_width must be a positive integer, got 0"),
    ("fire", {"init_c": -0.1}, ValueError, r"init_c must be a finite number in \(0.0, inf\)"),
    ("fire", {"init_L": float("nan")}, ValueError, r"init_L must be a finite number"),
    ("fire", {"shared_layers": "no"}, TypeError, r"shared_layers must be True or False"),
    ("cope", {"max_pos": 0}, ValueError, r"max_pos must be a positive integer, got 0"),
    ("kerple", {"kernel": "cubic"}, ValueError, r"unknown kernel 'cubic'; valid choices: 'log', 'power'"),
    ("kerple", {"max_pos": 3}, ValueError, r"unknown option\(s\) \['max_pos'\] for positional encoding 'kerple'; "
                                            r"valid options: \['kernel'\]"),
])  # fmt: skip
def test_bad_options_give_one_clear_error(pe, options, error, message):
    with pytest.raises(error, match=message):
        build_model(pe, V, **SMALL, **options)


def test_xpos_refuses_positions_beyond_float32():
    s = make_scheme("xpos", 32, 4, 1, causal=True, scale_base=2.0)
    assert s.max_position == 127  # 80 * 2 / -log(zeta_0), zeta_0 = 0.4 / 1.4
    prep = s.prepare(torch.arange(128), torch.arange(128))  # positions 0 .. 127
    assert all(torch.isfinite(prep[key]).all() for key in ("cos_q", "sin_q", "cos_k", "sin_k"))
    with pytest.raises(ValueError, match=r"xpos: position 200 is beyond position 127, the last whose .* scale_base=2;"):
        s.prepare(torch.arange(201), torch.arange(201))
    make_scheme("xpos", 32, 4, 1, causal=False, scale_base=2.0).prepare(torch.arange(201), torch.arange(201))
