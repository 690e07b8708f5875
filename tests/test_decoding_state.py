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
