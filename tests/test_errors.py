"""Bad input gets a clear error naming the bad value and the valid choices."""
import pytest
import torch

from posenc_lib import (
    LearnedPositionalEmbedding,
    alibi_slopes,
    apply_rope,
    build_model,
    deberta_log_bucket,
    greedy_decode,
    set_seed,
    sinusoidal_table,
    t5_relative_bucket,
)
from posenc_lib.xlnet import rel_shift


def test_unknown_scheme_lists_choices():
    with pytest.raises(ValueError, match=r"unknown positional encoding 'rotery'.*none, sinusoidal, learned"):
        build_model("rotery", 10)


def test_unknown_scheme_option_lists_valid_options():
    with pytest.raises(ValueError, match=r"max_relative_position"):
        build_model("shaw", 10, max_relative_positon=4)
    with pytest.raises(ValueError, match=r"valid options: none"):
        build_model("none", 10, num_buckets=4)


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match=r"n_heads=5 does not divide d_model=64.*\[1, 2, 4, 8, 16, 32, 64\]"):
        build_model("none", 10, n_heads=5)


@pytest.mark.parametrize("pe", ["rope", "sinusoidal"])
def test_odd_dimensions_rejected_where_pairs_are_needed(pe):
    with pytest.raises(ValueError, match=r"must be even.*got (9|36)|got 9"):
        build_model(pe, 10, d_model=36, n_heads=4) if pe == "rope" else sinusoidal_table(10, 9)
    with pytest.raises(ValueError, match="must be even"):
        apply_rope(torch.randn(2, 5, 7))


def test_learned_table_too_short():
    table = LearnedPositionalEmbedding(8, 4)
    with pytest.raises(ValueError, match=r"position 9 is beyond the learned table \(max_len=8"):
        table(torch.arange(10))
    m = build_model("learned", 10, d_model=16, n_heads=2, num_layers=1, max_len=6)
    with pytest.raises(ValueError, match="max_len=6"):
        m(torch.ones(1, 7, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_wrong_dtypes():
    m = build_model("none", 10, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(TypeError, match=r"src must hold integer token ids.*torch.float32"):
        m(torch.zeros(1, 4), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, length\)"):
        m(torch.ones(4, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="floating-point"):
        apply_rope(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="seed must be an int"):
        set_seed("0")


def test_bad_numbers():
    with pytest.raises(ValueError, match="n_heads must be a positive integer, got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="num_buckets must be even"):
        t5_relative_bucket(torch.arange(3), True, 31)
    with pytest.raises(ValueError, match="bucket_size"):
        deberta_log_bucket(torch.arange(3), 2, 10)
    with pytest.raises(ValueError, match="distance columns"):
        rel_shift(torch.randn(3, 5), 4)
    with pytest.raises(ValueError, match="dropout"):
        build_model("none", 10, dropout=1.5)
    m = build_model("none", 10, d_model=16, n_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(m, torch.ones(1, 3, dtype=torch.long), max_new_tokens=0, bos_id=1, eos_id=2)
