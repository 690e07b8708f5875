"""Cached decoding keeps buffers and projected relative tables between steps: check them against the
full decoder over more steps than the first allocation holds (the buffers and tables grow)."""
import pytest
import torch

from posenc_lib import PE_TYPES, build_model, greedy_decode, set_seed

V = 29


@pytest.mark.parametrize("pe", ["xlnet", "deberta", "shaw", "rope", "t5"])
def test_cached_steps_equal_the_full_decoder_past_every_regrowth(pe):
    set_seed(0)
    m = build_model(pe, V, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0).eval()
    steps = 40  # > 16 (first key/value buffer) and > 32 (first XLNet table): both regrow
    src = torch.randint(3, V, (2, 5), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(3, V, (2, steps), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        memory = m.encode(src)
        full = m.decode(tgt, memory)
        cache = m.new_cache()
        out = [m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(steps)]
    torch.testing.assert_close(torch.cat(out, 1), full, atol=1e-5, rtol=1e-4)
    layer = cache.layers[0]["self"]
    assert layer["len"] == steps and layer["k_buf"].shape[2] >= steps
    if pe == "xlnet":
        (table,) = [t for key, t in cache.scheme_state.items() if key[0] == "xlnet_r"]
        assert table.shape[0] >= steps


def test_cache_reorder_keeps_rows_of_the_buffers():
    set_seed(0)
    m = build_model("xlnet", V, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0).eval()
    src = torch.randint(3, V, (3, 5), generator=torch.Generator().manual_seed(3))
    tgt = torch.randint(3, V, (3, 6), generator=torch.Generator().manual_seed(4))
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory = m.encode(src)
        cache = m.new_cache()
        for t in range(5):
            m.decode(tgt[:, t : t + 1], memory, cache=cache)
        cache.reorder(order)
        last = m.decode(tgt[order, 5:6], memory[order], cache=cache)
        full = m.decode(tgt[order], memory[order])
    torch.testing.assert_close(last[:, 0], full[:, 5], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pe", PE_TYPES)
def test_decoding_without_an_end_token_gives_exactly_max_new_tokens(pe):
    set_seed(0)
    m = build_model(pe, V, d_model=32, n_heads=4, num_layers=1, dim_feedforward=64, dropout=0.0)
    src = torch.randint(3, V, (2, 4), generator=torch.Generator().manual_seed(5))
    a = greedy_decode(m, src, max_new_tokens=9, bos_id=1, eos_id=None)
    b = greedy_decode(m, src, max_new_tokens=9, bos_id=1, eos_id=None, use_cache=False)
    assert a.shape == (2, 10) and torch.equal(a, b)


def _small(pe, **kw):
    set_seed(0)
    return build_model(pe, V, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0, **kw).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_packed_weights_give_the_plain_products_and_leave_the_model_as_it_was(tie, monkeypatch):
    """Inside decoding.packed_weights every decoder linear layer and the output product multiply few rows by weights
    laid out for oneDNN (the same sums, rounded in another order); more rows take the layer's own product; after
    the block nothing of it is left on the model."""
    from posenc_lib.models import decoding

    monkeypatch.setattr(decoding, "PACK_MIN_ELEMENTS", 0)  # the small model's weights are packed too
    m = _small("t5", tie_embeddings=tie)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    linears = [layer for layer in m.decoder.modules() if isinstance(layer, torch.nn.Linear)]
    few, many = torch.randn(8, 1, 32), torch.randn(4, 30, 32)  # 8 rows; 120 > FEW_ROWS
    with torch.no_grad():
        plain = [layer(few) for layer in linears if layer.in_features == 32], m.logits(few)
        with decoding.packed_weights(m, 8):
            assert decoding.packable(m) and all("forward" in layer.__dict__ for layer in linears)
            packed = [layer(few) for layer in linears if layer.in_features == 32], m.logits(few)
            assert all(torch.equal(layer(many), torch.nn.functional.linear(many, layer.weight, layer.bias))
                       for layer in linears if layer.in_features == 32)
    for a, b in zip(plain[0] + [plain[1]], packed[0] + [packed[1]]):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert not any("forward" in layer.__dict__ for layer in linears) and m.packed_logits is None
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())


def test_packed_weights_change_nothing_where_they_do_not_apply(monkeypatch):
    """A bfloat16 model, or PACK_WEIGHTS = False: the block leaves every layer's product as it is."""
    from posenc_lib.models import decoding

    for m in (_small("none").to(torch.bfloat16), _small("none")):
        with decoding.packed_weights(m, 8):
            assert not any("forward" in layer.__dict__ for layer in m.modules())
            assert getattr(m, "packed_logits", None) is None
        monkeypatch.setattr(decoding, "PACK_WEIGHTS", False)


@pytest.mark.parametrize("pe", ["none", "rope", "t5", "alibi", "shaw", "xlnet", "deberta"])
def test_cached_decoding_gives_the_same_tokens_with_packed_weights_and_without(pe, monkeypatch):
    """greedy_decode's cached loop on CPU multiplies by packed weights; its tokens are the plain loop's and the
    uncached decoder's."""
    from posenc_lib.models import decoding

    monkeypatch.setattr(decoding, "PACK_MIN_ELEMENTS", 0)  # the small model's weights are packed too
    m = _small(pe)
    src = torch.randint(4, V, (6, 9), generator=torch.Generator().manual_seed(7))
    run = lambda cache: greedy_decode(m, src, max_new_tokens=20, bos_id=1, eos_id=None, use_cache=cache)  # noqa: E731
    calls = []
    monkeypatch.setattr(decoding, "packed_linear", lambda *a, real=decoding.packed_linear: calls.append(1) or real(*a))
    monkeypatch.setattr(decoding, "packed_qkv", lambda *a, real=decoding.packed_qkv: calls.append(3) or real(*a))
    packed, full = run(True), run(False)
    # 20 steps x 2 layers x 6 products of the step's rows, self-attention's q, k and v in one of them
    assert decoding.packable(m) and calls.count(1) >= 20 * 2 * 5 and calls.count(3) >= 20 * 2
    monkeypatch.setattr(decoding, "PACK_WEIGHTS", False)
    assert torch.equal(packed, full) and torch.equal(run(True), full)


def test_decoded_ids_and_tables_grown_while_decoding_serve_training_afterwards():
    """greedy_decode's loop runs in inference mode; what it returns, and a rotary table it grew on the model, are used
    in a training step afterwards (an inference tensor saved for backward would be an error)."""
    m = _small("rope")
    src = torch.randint(4, V, (3, 5), generator=torch.Generator().manual_seed(8))
    ys = greedy_decode(m, src, max_new_tokens=70, bos_id=1, eos_id=None)  # > 64 positions: the table grows
    assert not ys.is_inference() and ys.shape == (3, 71)
    m.train()
    loss = m.loss(src, ys[:, :-1], ys[:, 1:])
    loss.backward()
    assert all(p.grad is not None for p in m.decoder.parameters())


def test_packed_copies_are_kept_between_loops_and_made_again_when_a_weight_changes(monkeypatch):
    """The laid-out weights of a model survive its decoding loop, are reused by the next one with the same rows, and
    are made again once a weight changes in place (an optimiser's step) or the rows differ; the tokens follow the
    changed weights (equal to the uncached decoder's)."""
    from posenc_lib.models import decoding

    monkeypatch.setattr(decoding, "PACK_MIN_ELEMENTS", 0)
    m = _small("t5")
    src = torch.randint(4, V, (4, 6), generator=torch.Generator().manual_seed(9))
    run = lambda cache=True, s=src: greedy_decode(m, s, max_new_tokens=12, bos_id=1, eos_id=None, use_cache=cache)  # noqa: E731
    run()
    first = decoding.PACKED[m]
    run()
    assert decoding.PACKED[m] is first  # reused
    with torch.no_grad():
        m.decoder[1].ff[0].weight.mul_(3.0)  # in place, as an optimiser steps
    after = run()
    assert decoding.PACKED[m] is not first and torch.equal(after, run(False))
    kept = decoding.PACKED[m]
    run(True, src[:3])  # another number of rows: laid out for 3
    assert decoding.PACKED[m] is not kept and decoding.PACKED[m].rows == 3
    decoding.release_packed_weights(m)
    assert m not in decoding.PACKED


def test_self_attention_projects_q_k_v_in_one_product_inside_a_decoding_loop(monkeypatch):
    """While the packed weights are in force a decoder self-attention layer computes its queries, keys and values in
    one product (``step_qkv``), the three projections' sums; afterwards it is gone."""
    from posenc_lib.models import decoding

    monkeypatch.setattr(decoding, "PACK_MIN_ELEMENTS", 0)
    m = _small("none")
    attn = m.decoder[0].self_attn
    x = torch.randn(8, 1, 32)
    with torch.no_grad():
        plain = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
        with decoding.packed_weights(m, 8):
            fused = attn.step_qkv(x)
            assert attn.step_qkv(torch.randn(4, 30, 32)) is None  # more rows than a step: the three products
    torch.testing.assert_close(fused, plain, atol=1e-5, rtol=1e-5)
    assert attn.step_qkv is None and "step_qkv" not in attn.__dict__


@pytest.mark.parametrize("padded", [False, True])
def test_cached_cross_attention_step_equals_the_fused_kernel(padded):
    """A cached step's cross-attention (two batched products against keys transposed once) gives the fused kernel's
    output, with a padded source too, and a row whose every source token is padding gets zeros as the kernel gives;
    after a reorder of the cache (beam search) the rows follow."""
    from posenc_lib.attention.layer import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    memory, x = torch.randn(3, 7, 32), torch.randn(3, 1, 32)
    pad = None
    if padded:
        pad = torch.zeros(3, 7, dtype=torch.bool)
        pad[0, 4:] = True
        pad[2, :] = True  # nothing to see
    with torch.no_grad():
        want = attn(x, memory, key_padding_mask=pad)  # no cache: the fused kernel
        cache = {}
        got = [attn(x, memory, key_padding_mask=pad, cache=cache) for _ in range(2)]  # the first fills the cache
        assert "k_t" in cache and ("pad_bias" in cache) == padded
        torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], want, atol=1e-5, rtol=1e-5)
        if padded:
            assert torch.equal(attn.out_proj(torch.zeros(1, 1, 32)), got[1][2:3])  # zeros through the output layer
        order = torch.tensor([2, 0, 0, 1])
        for key, value in list(cache.items()):
            cache[key] = value.index_select(0, order)
        again = attn(x[order], memory[order], key_padding_mask=None if pad is None else pad[order], cache=cache)
    torch.testing.assert_close(again, want[order], atol=1e-5, rtol=1e-5)


def test_only_weights_of_at_least_pack_min_elements_are_packed():
    """The decoding benchmark's model: its 256 x 256 projections multiply as they are (the plain product is as fast
    for a step's rows), the q/k/v triple (768 x 256), the feed-forward weights and the 8000-word output matrix packed."""
    from posenc_lib.models import decoding

    set_seed(0)
    m = build_model("none", 8000, d_model=256, n_heads=8, num_layers=2, dim_feedforward=1024, dropout=0.0).eval()
    with decoding.packed_weights(m, 8):
        patched = {tuple(layer.weight.shape) for layer in m.decoder.modules()
                   if isinstance(layer, torch.nn.Linear) and "forward" in layer.__dict__}
        assert patched == {(1024, 256), (256, 1024)} and m.packed_logits is not None
        assert all(block.self_attn.step_qkv is not None and block.cross_attn.step_qkv is None for block in m.decoder)


@pytest.mark.parametrize("pe", ["none", "rope", "t5", "alibi", "shaw", "xlnet", "deberta", "sinusoidal"])
def test_the_self_attention_step_gives_the_full_forward_pass(pe, monkeypatch):
    """attention/step.py's self-attention step (taken by every cached step of one query) gives the logits of the
    general forward pass, which a step takes once the step is switched off; and it is taken."""
    from posenc_lib.attention import layer as layer_module, step

    m = _small(pe)
    src = torch.randint(4, V, (3, 6), generator=torch.Generator().manual_seed(11))
    tgt = torch.randint(4, V, (3, 9), generator=torch.Generator().manual_seed(12))

    def steps():
        with torch.no_grad():
            memory, cache = m.encode(src), m.new_cache()
            return torch.cat([m.decode(tgt[:, t : t + 1], memory, cache=cache) for t in range(tgt.shape[1])], 1)

    taken = []
    monkeypatch.setattr(layer_module, "self_attention_step", lambda *a: taken.append(1) or step.self_attention_step(*a))
    fast = steps()
    assert len(taken) == 9 * 2  # every step, both layers
    monkeypatch.setattr(layer_module, "takes_self_step", lambda *a: False)
    torch.testing.assert_close(fast, steps(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("pe", ["t5", "deberta"])
def test_a_one_query_step_reads_its_row_of_the_stack_context_from_a_kept_table(pe):
    """T5's bias and DeBERTa's bucket index of a decoding step come from tables of every distance kept in the cache's
    state (made longer when a step needs it): equal to the row :meth:`prepare` builds, at every step past a regrowth."""
    m = _small(pe)
    scheme, state = m.dec_scheme, {}
    key = "bias" if pe == "t5" else "index"
    for t in (0, 1, 5, 31, 32, 40, 100):
        q_pos, k_pos = torch.tensor([t]), torch.arange(t + 1)
        with torch.no_grad():
            got, want = scheme.prepare_step(q_pos, k_pos, state)[key], scheme.prepare(q_pos, k_pos)[key]
        assert torch.equal(got, want), t
    assert state["t5_bias" if pe == "t5" else "deberta_index"].shape[0] >= 101


def test_decoder_layer_step_is_its_forward_pass():
    """DecoderLayer.step (a cached step in evaluation) computes forward's operations: the same output, to the bit,
    for the same cache state."""
    m = _small("t5")
    src = torch.randint(4, V, (3, 6), generator=torch.Generator().manual_seed(13))
    tok = torch.randint(4, V, (3, 1), generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        memory = m.encode(src)
        q_pos, k_pos = torch.tensor([0]), torch.tensor([0])
        x = m.embed_tokens(m.tgt_embed, tok, m.dec_scheme, q_pos)
        outs = []
        for run in ("step", "forward"):
            cache = m.new_cache()
            prep = m.dec_scheme.prepare_step(q_pos, k_pos, cache.scheme_state)
            layer = m.decoder[0]
            outs.append(layer.step(x, memory, None, m.dec_scheme, prep, 0, cache.layers[0]) if run == "step"
                        else layer(x, memory, None, None, m.dec_scheme, prep, 0, cache.layers[0]))
    assert torch.equal(outs[0], outs[1])
