"""Properties taught in notebooks/06_rope.ipynb and 07_t5_bias.ipynb, checked against transformers."""
import math

import pytest
import torch

from posenc_lib import build_model, greedy_decode
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.schemes.rotary import apply_rope, apply_rope_complex, interleaved_to_half_permutation
from posenc_lib.schemes.t5 import T5Bias, t5_relative_bucket


def test_rope_matches_llama_half_split():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    cfg = LlamaConfig(hidden_size=24, num_attention_heads=3, head_dim=8, max_position_embeddings=64)
    cos, sin = LlamaRotaryEmbedding(cfg)(q, torch.arange(16)[None])
    q_l, k_l = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(q_l, apply_rope(q, interleaved=False), atol=1e-6)
    assert torch.allclose(k_l, apply_rope(k, interleaved=False), atol=1e-6)


def test_rope_matches_roformer_interleaved():
    from transformers.models.roformer.modeling_roformer import (
        RoFormerSelfAttention,
        RoFormerSinusoidalPositionalEmbedding,
    )

    q, k = torch.randn(2, 3, 16, 8), torch.randn(2, 3, 16, 8)
    table = RoFormerSinusoidalPositionalEmbedding(64, 8)
    with torch.no_grad():
        table.weight.copy_(table.create_weight())
    q_r, k_r = RoFormerSelfAttention.apply_rotary_position_embeddings(table(torch.Size([1, 16]))[None, None], q, k)
    assert torch.allclose(q_r, apply_rope(q), atol=1e-5) and torch.allclose(k_r, apply_rope(k), atol=1e-5)
    assert torch.allclose(apply_rope_complex(q), apply_rope(q), atol=1e-6)


def test_rope_permutation_and_relative_scores():
    x = torch.randn(5, 16)
    p = interleaved_to_half_permutation(16)
    assert torch.allclose(apply_rope(x[:, p], interleaved=False), apply_rope(x)[:, p], atol=1e-6)
    assert not torch.allclose(apply_rope(x, interleaved=False), apply_rope(x), atol=1e-3)
    qv, kv, pos = torch.randn(1, 16).expand(20, 16), torch.randn(1, 16).expand(20, 16), torch.arange(20)
    s = apply_rope(qv, pos) @ apply_rope(kv, pos).T
    assert torch.allclose(s[1:, 1:], s[:-1, :-1], atol=1e-4)
    assert torch.allclose(apply_rope(qv, pos).norm(dim=-1), qv.norm(dim=-1), atol=1e-5)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_greedy_decode_cache_equals_recompute(interleaved):
    model = build_model("rope", 40, d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0,
                        interleaved=interleaved)  # fmt: skip
    with torch.no_grad():
        for name, w in model.named_parameters():
            if w.dim() > 1 and "embed" not in name:
                w.normal_(0.0, 0.3)
    src = torch.randint(3, 40, (3, 9))
    a = greedy_decode(model, src, max_new_tokens=12, bos_id=1, eos_id=2, use_cache=True)
    b = greedy_decode(model, src, max_new_tokens=12, bos_id=1, eos_id=2, use_cache=False)
    assert torch.equal(a, b)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (64, 256)])
def test_t5_buckets_match_transformers(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-1000, 1001)
    ref = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(t5_relative_bucket(rel, bidirectional, num_buckets, max_distance), ref)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_attention_layer_parity(is_decoder):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    cfg = T5Config(d_model=32, d_kv=8, num_heads=4, is_decoder=is_decoder)
    cfg._attn_implementation = "eager"
    ref = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0, is_causal=is_decoder).eval()
    ours = T5Bias(32, 4, 1, causal=is_decoder)
    mha = MultiHeadAttention(32, 4, bias=False).eval()
    with torch.no_grad():
        ours.relative_attention_bias.weight.copy_(ref.relative_attention_bias.weight)
        mha.q_proj.weight.copy_(ref.q.weight * math.sqrt(8))
        mha.k_proj.weight.copy_(ref.k.weight)
        mha.v_proj.weight.copy_(ref.v.weight)
        mha.out_proj.weight.copy_(ref.o.weight)
    pos = torch.arange(9)
    assert torch.equal(ref.compute_bias(9, 9), ours.compute_bias(pos, pos))
    assert torch.equal(ref.compute_bias(1, 6, past_seen_tokens=5), ours.compute_bias(torch.tensor([5]), torch.arange(6)))
    x = torch.randn(2, 9, 32)
    mask = torch.full((9, 9), float("-inf")).triu(1) if is_decoder else None
    out_ref = ref(x, mask=mask)[0]
    assert torch.allclose(mha(x, causal=is_decoder, scheme=ours, prep=ours.prepare(pos, pos)), out_ref, atol=1e-5)


def test_t5_bias_as_float_attn_mask_equals_explicit_softmax():
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    scheme = T5Bias(32, 4, 1)
    with torch.no_grad():
        scheme.relative_attention_bias.weight.normal_()
    bias = scheme.compute_bias(torch.arange(12), torch.arange(12))
    explicit = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias, -1) @ v
    fused = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert torch.allclose(fused, explicit, atol=1e-5)


def test_rope_rotation_is_lesson_03_shift_matrix_transposed():
    # lesson 06's box: T_delta (sin, cos pairs) equals R_delta^T (interleaved RoPE pairs), same frequencies
    import math

    from posenc_lib import sinusoidal_shift_matrix
    from posenc_lib.schemes.rotary import rope_frequencies

    d = 8
    for delta in [1, 7, -3]:
        blocks = [torch.tensor([[math.cos(delta * t), -math.sin(delta * t)], [math.sin(delta * t), math.cos(delta * t)]])
                  for t in rope_frequencies(d).tolist()]
        assert torch.allclose(sinusoidal_shift_matrix(delta, d), torch.block_diag(*blocks).T, atol=1e-6)


def test_rope_all_ones_score_is_lesson_03_cosine_sum():
    from posenc_lib.schemes.sinusoidal import sinusoidal_frequencies

    ones = torch.ones(1, 128)
    r = torch.arange(300)
    score = (apply_rope(ones, torch.tensor([0])) @ apply_rope(ones.expand(300, 128), r).T)[0] / 2
    expected = torch.cos(r[:, None].double() * sinusoidal_frequencies(128, dtype=torch.float64)).sum(-1)
    assert torch.allclose(score.double(), expected, atol=1e-2)


def test_t5_bias_fused_at_inference_but_not_when_it_needs_a_gradient():
    """Lesson 07: the flash kernel takes a fixed float mask, not one whose gradient training needs."""
    import warnings

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = k = v = torch.randn(1, 2, 8, 4)
    bias = T5Bias(8, 2, 1).compute_bias(torch.arange(8), torch.arange(8))

    def flash(mask):
        try:
            with warnings.catch_warnings(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                warnings.simplefilter("ignore")
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return True
        except RuntimeError:
            return False

    assert bias.requires_grad                      # a learned table: training needs this gradient
    assert flash(bias.detach()) and not flash(bias)


def test_rope_score_of_independent_vectors_does_not_decay_but_aligned_ones_do():
    # lesson 06: the long-range "decay" is a bound; for independent q, k the mean |score| is flat in the distance
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4096, 64, generator=g), torch.randn(4096, 64, generator=g)

    def mean_score(a, b, r):
        s = (apply_rope(a, torch.zeros(len(a))) * apply_rope(b, torch.full((len(b),), float(r)))).sum(-1)
        return s.abs().mean().item(), s.mean().item()

    flat = [mean_score(q, k, r)[0] for r in (0, 50, 500, 2000)]
    assert max(flat) - min(flat) < 0.05 * max(flat)                 # rotation invariance of a random key
    aligned = [mean_score(q, q, r)[1] for r in (0, 500)]
    assert aligned[1] < 0.5 * aligned[0]                              # q = k: the phases drift apart


def test_rope_angles_stay_float32_under_bfloat16_autocast():
    # lesson 06: a bfloat16 product m * theta breaks relativity; the library forms the angles in float32
    q, k = torch.randn(1, 64), torch.randn(1, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pairs = [(apply_rope(q, torch.tensor([m])), apply_rope(k, torch.tensor([m + 1]))) for m in range(4084, 4092)]
    scores = [(a.double() @ b.double().T).item() for a, b in pairs]  # the dot product itself outside autocast
    assert max(scores) - min(scores) < 0.01
