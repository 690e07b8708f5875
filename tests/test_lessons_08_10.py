"""Properties taught in notebooks 08-10 (Transformer-XL/XLNet, DeBERTa, ALiBi)."""
import pytest
import torch

from posenc_lib.schemes.alibi import alibi_bias, alibi_slopes
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.schemes.deberta import deberta_index, deberta_log_bucket, disentangled_scores
from posenc_lib.schemes.registry import make_scheme
from posenc_lib.schemes.xlnet import rel_shift


@pytest.mark.parametrize("bucket_size,max_position", [(44, 128), (70, 128), (76, 256), (84, 512), (4, 8), (174, 512)])
def test_deberta_log_bucket_edge_matches_transformers(bucket_size, max_position):
    """At |r| = max_position - 1 the log ratio is exactly 1; float64 rounding once pushed it a bucket too far."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = torch.arange(-2 * max_position - 100, 2 * max_position + 101)
    ref = make_log_bucket_position(rel, bucket_size, max_position).long()
    got = deberta_log_bucket(rel, bucket_size, max_position)
    assert torch.equal(got, ref)
    assert int(got[rel == max_position - 1]) == bucket_size - 1


def test_deberta_log_bucket_is_odd_and_monotone():
    rel = torch.arange(-300, 301)
    b = deberta_log_bucket(rel, 16, 64)
    assert torch.equal(b, -deberta_log_bucket(-rel, 16, 64))
    assert bool((b[1:] >= b[:-1]).all())
    assert torch.equal(b[(rel.abs() <= 8)], rel[(rel.abs() <= 8)])


def test_disentangled_scores_match_explicit_loops():
    torch.manual_seed(0)
    lq, lk, span, d = 5, 5, 3, 4
    q, k = torch.randn(1, 1, lq, d), torch.randn(1, 1, lk, d)
    pos_q, pos_k = torch.randn(1, 2 * span, d), torch.randn(1, 2 * span, d)
    index = deberta_index(torch.arange(lq), torch.arange(lk), span, None, None)
    got = disentangled_scores(q, k, pos_q, pos_k, index)[0, 0]
    for i in range(lq):
        for j in range(lk):
            delta = min(max(i - j + span, 0), 2 * span - 1)
            ref = q[0, 0, i] @ pos_k[0, delta] + k[0, 0, j] @ pos_q[0, delta]
            assert torch.allclose(got[i, j], ref, atol=1e-5)


@pytest.mark.parametrize("q_start,lq,lk", [(0, 10, 40), (20, 12, 40), (30, 10, 33)])
def test_disentangled_scores_of_a_long_block_match_the_loops_with_gradients(q_start, lq, lk):
    """Far from the diagonal every key falls in a clipped bucket: there the terms are built as a broadcast
    sum, a gather only in the band between; values and gradients match the explicit loops."""
    from posenc_lib.schemes.deberta import clipped_ends

    torch.manual_seed(1)
    span, d = 4, 3
    q, k = torch.randn(2, 2, lq, d, requires_grad=True), torch.randn(2, 2, lk, d, requires_grad=True)
    pos_q, pos_k = torch.randn(2, 2 * span, d, requires_grad=True), torch.randn(2, 2 * span, d, requires_grad=True)
    index = deberta_index(torch.arange(q_start, q_start + lq), torch.arange(lk), span, 2 * span, 12)
    left, right = clipped_ends(index)
    assert left > 0 or right < lk  # the broadcast pieces are used
    ref = torch.einsum("bhid,hijd->bhij", q, pos_k[:, index]) + torch.einsum("bhjd,hijd->bhij", k, pos_q[:, index])
    got = disentangled_scores(q, k, pos_q, pos_k, index)
    torch.testing.assert_close(got, ref)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, pos_q, pos_k))
    g_got = torch.autograd.grad((got * w).sum(), (q, k, pos_q, pos_k))
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)  # sums over many keys, in another order


@pytest.mark.parametrize("q_at,lk", [(0, 1), (5, 6), (39, 40), (12, 30)])
def test_disentangled_scores_of_one_query_match_the_loops_with_gradients(q_at, lk):
    """A cached decoding step has one query: each key meets only its own bucket's position query."""
    torch.manual_seed(2)
    span, d = 4, 3
    q, k = torch.randn(2, 2, 1, d, requires_grad=True), torch.randn(2, 2, lk, d, requires_grad=True)
    pos_q, pos_k = torch.randn(2, 2 * span, d, requires_grad=True), torch.randn(2, 2 * span, d, requires_grad=True)
    index = deberta_index(torch.tensor([q_at]), torch.arange(lk), span, 2 * span, 12)
    ref = torch.einsum("bhid,hijd->bhij", q, pos_k[:, index]) + torch.einsum("bhjd,hijd->bhij", k, pos_q[:, index])
    got = disentangled_scores(q, k, pos_q, pos_k, index)
    assert got.shape == (2, 2, 1, lk)
    torch.testing.assert_close(got, ref)
    w = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * w).sum(), (q, k, pos_q, pos_k))
    g_got = torch.autograd.grad((got * w).sum(), (q, k, pos_q, pos_k))
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("k_len", [1, 7, 33])
def test_xlnet_one_query_terms_equal_the_shifted_product(k_len):
    """A cached step's terms (c) + (b)+(d), from the kept table of distances 0, 1, ..., equal the last query row
    of the general computation (every distance, then the relative shift)."""
    from posenc_lib.schemes.xlnet import XLNetRelative

    torch.manual_seed(3)
    scheme = XLNetRelative(16, 4, 1, causal=True)
    q_all, k = torch.randn(2, 4, k_len, 4), torch.randn(2, 4, k_len, 4)
    pos = torch.arange(k_len)
    full = scheme.scores(q_all, k, scheme.prepare(pos, pos), 0, None)[:, :, -1:]
    step = scheme.prepare_step(pos[-1:], pos, {})
    assert "R" not in step  # one query: the table kept in the step state serves
    got = scheme.scores(q_all[:, :, -1:], k, step, 0, None)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lq,lk", [(1, 1), (3, 3), (2, 6), (4, 9)])
def test_rel_shift_puts_distance_i_minus_j_in_column_j(lq, lk):
    offset = lk - lq  # query i sits at absolute position offset + i
    dmax = offset + lq - 1
    dist = torch.arange(dmax, dmax - (lq + lk - 1), -1).float().expand(lq, -1)
    got = rel_shift(dist, lk)
    i = torch.arange(lq)[:, None] + offset
    j = torch.arange(lk)[None, :]
    assert torch.equal(got, (i - j).float())


def test_xlnet_scores_are_translation_invariant():
    torch.manual_seed(0)
    scheme = make_scheme("xlnet", 16, 2, 1)
    attn = MultiHeadAttention(16, 2)
    x = torch.randn(2, 6, 16)
    outs = []
    for start in (0, 37):
        pos = torch.arange(start, start + 6)
        outs.append(attn(x, scheme=scheme, prep=scheme.prepare(pos, pos), need_weights=True)[1])
    torch.testing.assert_close(outs[0], outs[1])


def test_alibi_slopes_non_power_of_two_rule():
    s12 = alibi_slopes(12)
    ref = [2 ** (-8 * h / 8) for h in range(1, 9)] + [2 ** (-8 * h / 16) for h in range(1, 16, 2)][:4]
    torch.testing.assert_close(s12, torch.tensor(ref))
    assert len(set(s12.tolist())) == 12


def test_bidirectional_alibi_encoder_cannot_tell_left_from_right():
    """|i - j| is symmetric: reversing the input reverses the output of an ALiBi-only attention layer."""
    torch.manual_seed(0)
    scheme = make_scheme("alibi", 16, 4, 1)
    attn = MultiHeadAttention(16, 4)
    x = torch.randn(1, 7, 16)
    pos = torch.arange(7)
    prep = scheme.prepare(pos, pos)
    out = attn(x, scheme=scheme, prep=prep)
    out_rev = attn(x.flip(1), scheme=scheme, prep=prep)
    torch.testing.assert_close(out_rev, out.flip(1))


def test_causal_alibi_equals_key_only_bias():
    """Under a causal mask, -m (i - j) and +m j differ by a per-row constant: same softmax."""
    slopes = alibi_slopes(4)
    pos = torch.arange(6)
    mask = pos[None, :] > pos[:, None]
    s = torch.randn(1, 4, 6, 6)
    a = torch.softmax((s + alibi_bias(pos, pos, slopes)).masked_fill(mask, float("-inf")), -1)
    b = torch.softmax((s + slopes[:, None, None] * pos.float()[None, None, :]).masked_fill(mask, float("-inf")), -1)
    torch.testing.assert_close(a, b)


def _segment_outputs(layers, scheme, x, seg_len):
    """Transformer-XL's recurrence: layer n's memory is the previous segment's detached layer-(n-1) input."""
    mems, outs = [None] * len(layers), [[] for _ in layers]
    for s in range(x.shape[1] // seg_len):
        h = x[:, s * seg_len:(s + 1) * seg_len]
        for n, attn in enumerate(layers):
            mem, mems[n] = mems[n], h.detach()
            m = 0 if mem is None else mem.shape[1]
            prep = scheme.prepare(torch.arange(s * seg_len, (s + 1) * seg_len), torch.arange(s * seg_len - m, (s + 1) * seg_len))
            cache = None if mem is None else {"k": attn.split(attn.k_proj(mem)), "v": attn.split(attn.v_proj(mem))}
            h = h + attn(h, causal=True, scheme=scheme, prep=prep, layer=n, cache=cache)
            outs[n].append(h)
    return [torch.cat(o, dim=1) for o in outs]


def test_transformer_xl_memory_reach_grows_one_segment_per_layer_without_gradient():
    torch.manual_seed(0)
    d, L, S, N = 8, 3, 4, 3
    layers = [MultiHeadAttention(d, 2) for _ in range(N)]
    scheme = make_scheme("xlnet", d, 2, num_layers=N, causal=True)
    x = torch.randn(1, S * L, d, requires_grad=True)
    with torch.no_grad():
        base = _segment_outputs(layers, scheme, x, L)
        reach = []
        for n in range(N):
            moved = []
            for p in range(S * L):
                x2 = x.clone()
                x2[0, p] += 1.0
                moved.append(bool(((_segment_outputs(layers, scheme, x2, L)[n] - base[n])[0, -1].abs() > 1e-6).any()))
            reach.append(S * L - 1 - moved.index(True))
    assert reach == [(n + 2) * L - 1 for n in range(N)]          # layer n+1 reaches n+1 segments back
    _segment_outputs(layers, scheme, x, L)[-1][0, -1].sum().backward()
    assert torch.equal((x.grad[0].abs().sum(-1) > 0).nonzero().flatten(), torch.arange((S - 1) * L, S * L))


def test_xlnet_two_stream_attention_matches_transformers_with_library_scores():
    # lesson 08: content stream under the content mask, query stream (queries from mask_emb, keys and values from
    # the content stream) under the query mask; scores from the library's XLNetRelative
    import torch.nn.functional as F
    from transformers import XLNetConfig, XLNetModel

    torch.manual_seed(0)
    d_model, heads, L = 16, 4, 5
    xl = XLNetModel(XLNetConfig(vocab_size=11, d_model=d_model, n_layer=1, n_head=heads, d_inner=32, dropout=0.0)).eval()
    for p in xl.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ref, layer = xl.layer[0].rel_attn, xl.layer[0]
    attn, scheme = MultiHeadAttention(d_model, heads, bias=False), make_scheme("xlnet", d_model, heads, num_layers=1)
    with torch.no_grad():
        for ours, theirs in [(attn.q_proj, ref.q), (attn.k_proj, ref.k), (attn.v_proj, ref.v)]:
            ours.weight.copy_(theirs.reshape(d_model, d_model).T)
        scheme.r_proj[0].copy_(ref.r.reshape(d_model, d_model))
        scheme.u[0].copy_(ref.r_w_bias)
        scheme.v[0].copy_(ref.r_r_bias)
    z = torch.randperm(L)
    rank = torch.empty_like(z)
    rank[z] = torch.arange(L)
    content, query = rank[None, :] <= rank[:, None], rank[None, :] < rank[:, None]
    targets = z[1:]
    ids = torch.randint(0, 11, (1, L))
    pos = torch.arange(L)
    prep = scheme.prepare(pos, pos)
    with torch.no_grad():
        h0, g0 = xl.word_embedding(ids), xl.mask_emb.expand(1, L, d_model)
        kh, vh = attn.split(attn.k_proj(h0)), attn.split(attn.v_proj(h0))

        def stream(x, allowed):
            qx = attn.split(attn.q_proj(x))
            s = (qx @ kh.transpose(-1, -2) + scheme.scores(qx, kh, prep, 0, attn)) * (d_model // heads) ** -0.5
            vec = torch.softmax(s.masked_fill(~allowed, float("-inf")), -1) @ vh
            return layer.ff(layer.rel_attn.post_attention(x.transpose(0, 1), vec.permute(2, 0, 1, 3))).transpose(0, 1)

        h_ref, g_ref = xl(ids, perm_mask=(~query).float()[None], target_mapping=F.one_hot(targets, L).float()[None],
                          output_hidden_states=True).hidden_states[-2:]
        assert torch.allclose(stream(h0, content), h_ref, atol=1e-5)
        assert torch.allclose(stream(g0, query)[:, targets], g_ref, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_deberta_position_terms_of_zero_content_are_a_prior_only_through_projection_biases(bias):
    # lesson 09: c2p + p2c carry a content-free per-distance prior only through b_q, b_k
    torch.manual_seed(0)
    scheme = make_scheme("deberta", 32, 4, num_layers=1, position_buckets=4, max_relative_positions=16)
    attn = MultiHeadAttention(32, 4, bias=bias)
    prep = scheme.prepare(torch.arange(10), torch.arange(10))
    zero = torch.zeros(1, 10, 32)
    with torch.no_grad():
        terms = scheme.scores(attn.split(attn.q_proj(zero)), attn.split(attn.k_proj(zero)), prep, 0, attn)
    if bias:
        assert torch.allclose(terms[..., 1:, 1:], terms[..., :-1, :-1], atol=1e-6) and terms.abs().max() > 1e-3
    else:
        assert torch.equal(terms, torch.zeros_like(terms))


def test_relative_layer_gives_identical_tokens_identical_outputs_until_one_token_differs():
    # lesson 09: position-free values average equal vectors; one distinct token lets the position leak in
    torch.manual_seed(0)
    scheme = make_scheme("deberta", 32, 4, num_layers=1, position_buckets=4, max_relative_positions=16)
    attn = MultiHeadAttention(32, 4)
    pos = torch.arange(12)
    prep = scheme.prepare(pos, pos)
    same = torch.randn(1, 1, 32).expand(1, 12, 32).clone()
    with torch.no_grad():
        out = attn(same, scheme=scheme, prep=prep)
        assert torch.allclose(out, out[:, :1].expand_as(out), atol=1e-5)
        same[0, 0] = torch.randn(32)
        out = attn(same, scheme=scheme, prep=prep)[0, 1:]
    assert torch.cdist(out, out).add(torch.eye(11)).min() > 1e-4


def test_symmetric_alibi_seq2seq_tells_a_source_from_its_reversal_once_an_end_token_anchors_it():
    # lesson 10: reversal blindness holds only when nothing marks an end of the source
    from posenc_lib import build_model

    torch.manual_seed(0)
    model = build_model("alibi", 50, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64).eval()
    src, tgt, eos = torch.tensor([[5, 9, 17, 23, 31]]), torch.tensor([[1, 7, 8]]), torch.tensor([[2]])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), model(src.flip(1), tgt))
        a = model(torch.cat([src, eos], 1), tgt)
        b = model(torch.cat([src.flip(1), eos], 1), tgt)
    assert (a - b).abs().max() > 1e-3
