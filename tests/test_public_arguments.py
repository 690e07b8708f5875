"""Every argument of the public API is checked, ids and targets included: a wrong type or dtype is a
``TypeError``, a value out of range a ``ValueError``, and the message names the argument and what is valid.
No raw torch error (``IndexError``, a ``RuntimeError`` about sizes) and no value silently read as another
(``use_cache="no"`` taken as True, a negative position wrapped to the end of a table).
"""
from __future__ import annotations

import math

import pytest
import torch

import posenc_lib as P
from posenc_lib import build_model, greedy_decode
from posenc_lib.attention.layer import MultiHeadAttention
from posenc_lib.models.beam import beam_search, length_penalty
from posenc_lib.models.causal_lm import CausalLM, MaskedLM
from posenc_lib.models.seq2seq import DecoderCache
from posenc_lib.schemes.absolute import LearnedPositionalEmbedding
from posenc_lib.schemes.rope_scaling import scaled_rope_cos_sin
from posenc_lib.schemes.rotary import RotaryCache, apply_rope_cos_sin, rotate_pairs
from posenc_lib.schemes.sinusoidal import sinusoidal_encode
from posenc_lib.schemes.t5 import t5_distance_index

V = 12
TINY = dict(d_model=8, n_heads=2, num_layers=1, dim_feedforward=8, dropout=0.0)
LM = dict(d_model=8, n_heads=2, num_layers=1, dim_feedforward=8)
NAN, INF = math.nan, math.inf
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32}


def _seq2seq():
    torch.manual_seed(0)
    return build_model("rope", V, **TINY).eval()


def _ids(*shape, seed=0):
    return torch.randint(1, V, shape, generator=torch.Generator().manual_seed(seed))


SRC, TGT = _ids(2, 5), _ids(2, 4, seed=1)
X = torch.randn(2, 5, 8)
POS = torch.arange(5)


def _cases():
    """id -> (call, exception type, regex the message must match: the argument and what is valid)."""
    m = _seq2seq()
    memory = m.encode(SRC)
    lm = CausalLM(V, "rope", **LM).eval()
    mlm = MaskedLM(V, "rope", **LM).eval()
    mha = MultiHeadAttention(8, 2).eval()
    rope = P.make_scheme("rope", 8, 2, 1)
    slopes = P.alibi_slopes(2)
    last_out = _ids(2, 5)
    last_out[:, -1] = 15  # only the last column is out of range: it is a target, never an input
    dec = dict(max_new_tokens=2, bos_id=1, eos_id=2)
    valid_tgt = r"valid ids 0\.\.11"
    return {
        # -- Seq2SeqTransformer.loss: targets and label smoothing
        "loss tgt_out >= vocab": (lambda: m.loss(SRC, TGT, torch.full((2, 4), V)), ValueError,
                                  rf"tgt_out holds target id 12 .*{valid_tgt}"),
        "loss tgt_out -100": (lambda: m.loss(SRC, TGT, torch.full((2, 4), -100)), ValueError,
                              rf"tgt_out holds target id -100 .*{valid_tgt}.*pad_id=0"),
        "loss tgt_out shape": (lambda: m.loss(SRC, TGT, TGT[:, :3]), ValueError,
                               r"tgt_out must have the shape of tgt_in, \(2, 4\), got \(2, 3\)"),
        "loss tgt_out batch": (lambda: m.loss(SRC, TGT, TGT[:1]), ValueError,
                               r"tgt_out must have the shape of tgt_in, \(2, 4\), got \(1, 4\)"),
        "loss label_smoothing nan": (lambda: m.loss(SRC, TGT, TGT, label_smoothing=NAN), ValueError,
                                     r"label_smoothing must be a finite number in \[0\.0, 1\.0\], got nan"),
        "loss label_smoothing -0.1": (lambda: m.loss(SRC, TGT, TGT, label_smoothing=-0.1), ValueError,
                                      r"label_smoothing must be a finite number in \[0\.0, 1\.0\]"),
        "loss label_smoothing 2": (lambda: m.loss(SRC, TGT, TGT, label_smoothing=2.0), ValueError,
                                   r"label_smoothing must be a finite number in \[0\.0, 1\.0\]"),
        "loss label_smoothing True": (lambda: m.loss(SRC, TGT, TGT, label_smoothing=True), TypeError,
                                      r"label_smoothing must be a finite number in \[0\.0, 1\.0\], got True"),
        # -- Seq2SeqTransformer.decode: the memory and the cache
        "decode memory ints": (lambda: m.decode(TGT, memory.long()), TypeError,
                               r"memory must be a floating-point tensor"),
        "decode memory list": (lambda: m.decode(TGT, [[0.0]]), TypeError, r"memory must be a torch\.Tensor"),
        "decode memory width": (lambda: m.decode(TGT, torch.randn(2, 5, 7)), ValueError,
                                r"memory must have shape \(batch, src_len, d_model\) = \(2, src_len, 8\), got \(2, 5, 7\)"),
        "decode memory dtype": (lambda: m.decode(TGT, memory.double()), TypeError,
                                r"memory has dtype torch\.float64 .*torch\.float32"),
        "decode cache dict": (lambda: m.decode(TGT, memory, cache={}), TypeError,
                              r"cache must be a DecoderCache \(model\.new_cache\(\)\) or None, got dict"),
        "reorder float index": (lambda: m.new_cache().reorder(torch.zeros(2)), TypeError,
                                r"index must hold integer row ids .*got dtype torch\.float32"),
        # -- greedy_decode and beam_search
        "forward states 'no'": (lambda: m(SRC, TGT, states="no"), TypeError, r"states must be True or False, got 'no'"),
        "greedy use_cache 'no'": (lambda: greedy_decode(m, SRC, use_cache="no", **dec), TypeError,
                                  r"use_cache must be True or False, got 'no'"),
        "greedy use_cache 0": (lambda: greedy_decode(m, SRC, use_cache=0, **dec), TypeError,
                               r"use_cache must be True or False, got 0"),
        "greedy model str": (lambda: greedy_decode("model", SRC, **dec), TypeError,
                             r"model must be a Seq2SeqTransformer .*got str"),
        "beam model None": (lambda: beam_search(None, SRC, **dec), TypeError,
                            r"model must be a Seq2SeqTransformer .*got NoneType"),
        "beam alpha inf": (lambda: beam_search(m, SRC, alpha=INF, **dec), ValueError,
                           r"alpha \(the length penalty exponent\) must be a finite number >= 0, got inf"),
        "beam alpha str": (lambda: beam_search(m, SRC, alpha="0.6", **dec), TypeError,
                           r"alpha \(the length penalty exponent\) must be a finite number >= 0, got '0\.6'"),
        "beam mask list": (lambda: beam_search(m, SRC, src_key_padding_mask=[[0] * 5] * 2, **dec), TypeError,
                           r"src_key_padding_mask must be a bool torch\.Tensor"),
        "length_penalty alpha nan": (lambda: length_penalty(3.0, NAN), ValueError,
                                     r"alpha \(the length penalty exponent\) must be a finite number >= 0, got nan"),
        "length_penalty length -10": (lambda: length_penalty(-10.0, 0.6), ValueError,
                                      r"length must be a finite number in \[0\.0, inf\), got -10\.0"),
        # -- CausalLM and MaskedLM
        "lm need_weights 'yes'": (lambda: lm(SRC, need_weights="yes"), TypeError,
                                  r"need_weights must be True or False, got 'yes'"),
        "lm d_model 8.0": (lambda: CausalLM(V, "none", **{**LM, "d_model": 8.0}), ValueError,
                           r"d_model must be a positive integer, got 8\.0"),
        "lm loss last column": (lambda: lm.loss(last_out), ValueError, rf"windows holds id 15 .*{valid_tgt}"),
        "lm loss floats": (lambda: lm.loss(SRC.float()), TypeError, r"windows must hold integer token ids"),
        "lm loss list": (lambda: lm.loss([[1, 2]]), TypeError, r"windows must be a torch\.Tensor"),
        "mlm loss mask id": (lambda: mlm.loss(torch.full((2, 5), V)), ValueError,
                             rf"windows holds id 12 .*{valid_tgt}.*mask_id=12"),
        "mlm mask_prob str": (lambda: MaskedLM(V, "rope", mask_prob="0.1", **LM), TypeError,
                              r"mask_prob must lie in \(0, 1\), got '0\.1'"),
        # -- MultiHeadAttention and the schemes' constructors
        "mha dropout nan": (lambda: MultiHeadAttention(8, 2, NAN), ValueError,
                            r"dropout must be a finite number in \[0\.0, 1\.0\), got nan"),
        "mha dropout 1.5": (lambda: MultiHeadAttention(8, 2, 1.5), ValueError,
                            r"dropout must be a finite number in \[0\.0, 1\.0\)"),
        "mha dropout True": (lambda: MultiHeadAttention(8, 2, True), TypeError,
                             r"dropout must be a finite number in \[0\.0, 1\.0\), got True"),
        "mha bias 'no'": (lambda: MultiHeadAttention(8, 2, bias="no"), TypeError, r"bias must be True or False"),
        "mha x 2-D": (lambda: mha(torch.randn(5, 8)), ValueError,
                      r"x must have shape \(batch, length, d_model=8\), got \(5, 8\)"),
        "mha x width": (lambda: mha(torch.randn(2, 5, 7)), ValueError,
                        r"x must have shape \(batch, length, d_model=8\), got \(2, 5, 7\)"),
        "mha x ints": (lambda: mha(torch.ones(2, 5, 8, dtype=torch.long)), TypeError,
                       r"x must be a floating-point tensor"),
        "mha kv batch": (lambda: mha(X, torch.randn(3, 5, 8)), ValueError,
                         r"kv must have shape \(batch=2, length, d_model=8\), got \(3, 5, 8\)"),
        "mha kv dtype": (lambda: mha(X, torch.ones(2, 5, 8, dtype=torch.long)), TypeError,
                         r"kv must be a floating-point tensor"),
        "mha mask float": (lambda: mha(X, key_padding_mask=torch.zeros(2, 5)), TypeError,
                           r"key_padding_mask must be a bool tensor"),
        "mha mask shape": (lambda: mha(X, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
                           r"key_padding_mask must have shape \(batch, length\) = \(2, 5\), got \(2, 4\)"),
        "mha causal 'yes'": (lambda: mha(X, causal="yes"), TypeError, r"causal must be True or False, got 'yes'"),
        "mha need_weights 'no'": (lambda: mha(X, need_weights="no"), TypeError,
                                  r"need_weights must be True or False, got 'no'"),
        "mha layer -1": (lambda: mha(X, scheme=rope, prep=rope.prepare(POS, POS), layer=-1), ValueError,
                         r"layer must be an integer in \[0, 0\], got -1"),
        "mha layer 1.0": (lambda: mha(X, scheme=rope, prep=rope.prepare(POS, POS), layer=1.0), TypeError,
                          r"layer must be an integer in \[0, 0\], got 1\.0"),
        "make_scheme causal 'no'": (lambda: P.make_scheme("t5", 8, 2, 1, causal="no"), TypeError,
                                    r"causal must be True or False, got 'no'"),
        "make_scheme num_layers 0": (lambda: P.make_scheme("t5", 8, 2, 0), ValueError,
                                     r"num_layers must be a positive integer, got 0"),
        "make_scheme num_layers True": (lambda: P.make_scheme("t5", 8, 2, True), ValueError,
                                        r"num_layers must be a positive integer, got True"),
        "rope interleaved 'no'": (lambda: P.make_scheme("rope", 8, 2, 1, interleaved="no"), TypeError,
                                  r"interleaved must be True or False, got 'no'"),
        # -- schemes' prepare: positions are 1-D integer tensors
        "rope prepare floats": (lambda: rope.prepare(torch.tensor([0.5]), torch.tensor([0.5])), TypeError,
                                r"q_pos must hold integer positions .*torch\.int64.*got dtype torch\.float32"),
        "t5 prepare floats": (lambda: P.make_scheme("t5", 8, 2, 1).prepare(POS.float(), POS.float()), TypeError,
                              r"q_pos must hold integer positions"),
        "deberta prepare floats": (lambda: P.make_scheme("deberta", 8, 2, 1).prepare(POS, POS.float()), TypeError,
                                   r"k_pos must hold integer positions"),
        "alibi prepare bools": (lambda: P.make_scheme("alibi", 8, 2, 1).prepare(POS.bool(), POS), TypeError,
                                r"q_pos must hold integer positions .*got dtype torch\.bool"),
        "shaw prepare 2-D": (lambda: P.make_scheme("shaw", 8, 2, 1).prepare(POS[None], POS), ValueError,
                             r"q_pos must be 1-D \(one position per token\), got shape \(1, 5\)"),
        "none prepare list": (lambda: P.make_scheme("none", 8, 2, 1).prepare([0, 1], [0, 1]), TypeError,
                              r"q_pos must be a torch\.Tensor of integer positions, got list"),
        "xpos prepare floats": (lambda: P.make_scheme("xpos", 8, 2, 1).prepare(POS.float(), POS.float()), TypeError,
                                r"q_pos must hold integer positions"),
        "learned embed floats": (lambda: P.make_scheme("learned", 8, 2, 1).embed(torch.tensor([0.5])), TypeError,
                                 r"positions must hold integer positions"),
        "sinusoidal embed bools": (lambda: P.make_scheme("sinusoidal", 8, 2, 1).embed(POS.bool()), TypeError,
                                   r"positions must hold real positions .*got dtype torch\.bool"),
        # -- the schemes' functions
        "alibi_bias bools": (lambda: P.alibi_bias(POS.bool(), POS, slopes), TypeError,
                             r"q_pos must hold real positions .*got dtype torch\.bool"),
        "alibi_bias 2-D": (lambda: P.alibi_bias(POS[None], POS, slopes), ValueError, r"q_pos must be 1-D"),
        "alibi_bias slopes 2-D": (lambda: P.alibi_bias(POS, POS, torch.ones(2, 2)), ValueError,
                                  r"slopes must have shape \(heads,\), got \(2, 2\)"),
        "alibi_bias slopes list": (lambda: P.alibi_bias(POS, POS, [0.5, 0.25]), TypeError,
                                   r"slopes must be a torch\.Tensor"),
        "alibi_bias split 'yes'": (lambda: P.alibi_bias(POS, POS, slopes, split="yes"), TypeError,
                                   r"split must be True or False, got 'yes'"),
        "rope_cos_sin 2-D": (lambda: P.rope_cos_sin(POS[None], 8), ValueError, r"positions must be 1-D"),
        "rope_cos_sin nan": (lambda: P.rope_cos_sin(torch.tensor([0.0, NAN]), 8), ValueError,
                             r"positions must hold finite positions, got nan at index 1"),
        "rope_cos_sin list": (lambda: P.rope_cos_sin([0, 1], 8), TypeError, r"positions must be a torch\.Tensor"),
        "rope_cos_sin interleaved 'no'": (lambda: P.rope_cos_sin(POS, 8, interleaved="no"), TypeError,
                                          r"interleaved must be True or False, got 'no'"),
        "apply_rope bools": (lambda: P.apply_rope(X, POS.bool()), TypeError,
                             r"positions must hold real positions .*got dtype torch\.bool"),
        "apply_rope inf": (lambda: P.apply_rope(X, torch.tensor([0.0, 1, 2, 3, INF])), ValueError,
                           r"positions must hold finite positions, got inf at index 4"),
        "apply_rope list": (lambda: P.apply_rope(X, [0, 1, 2, 3, 4]), TypeError, r"positions must be a torch\.Tensor"),
        "apply_rope interleaved 'no'": (lambda: P.apply_rope(X, interleaved="no"), TypeError,
                                        r"interleaved must be True or False"),
        "apply_rope x 1-D": (lambda: P.apply_rope(torch.randn(8)), ValueError,
                             r"x must have shape \(\.\.\., seq, head_dim\), got \(8,\)"),
        "apply_rope_complex bools": (lambda: P.apply_rope_complex(X, POS.bool()), TypeError,
                                     r"positions must hold real positions"),
        "rotate_half odd": (lambda: P.rotate_half(torch.randn(3, 5)), ValueError,
                            r"x must have an even last dimension \(rotation pairs\), got shape \(3, 5\)"),
        "rotate_half list": (lambda: P.rotate_half([1.0, 2.0]), TypeError, r"x must be a torch\.Tensor"),
        "rotate_pairs odd": (lambda: rotate_pairs(torch.randn(3, 5)), ValueError,
                             r"x must have an even last dimension"),
        "apply_rope_cos_sin odd": (lambda: apply_rope_cos_sin(torch.randn(3, 5), torch.randn(3, 5), torch.randn(3, 5)),
                                   ValueError, r"x must have an even last dimension"),
        "apply_rope_cos_sin cos width": (lambda: apply_rope_cos_sin(torch.randn(3, 4), torch.randn(3, 6), torch.randn(3, 6)),
                                         ValueError, r"cos must have the last dimension of x, 4, got shape \(3, 6\)"),
        "apply_rope_cos_sin ints": (lambda: apply_rope_cos_sin(torch.ones(3, 4, dtype=torch.long), torch.randn(3, 4),
                                                               torch.randn(3, 4)), TypeError, r"x must be a floating-point tensor"),
        "scaled_rope_cos_sin bools": (lambda: scaled_rope_cos_sin(torch.tensor([True]), 8), TypeError,
                                      r"positions must hold real positions"),
        "scaled_rope_cos_sin interleaved": (lambda: scaled_rope_cos_sin(POS, 8, interleaved="x"), TypeError,
                                            r"interleaved must be True or False, got 'x'"),
        "RotaryCache interleaved": (lambda: RotaryCache(8, interleaved="no"), TypeError,
                                    r"interleaved must be True or False, got 'no'"),
        "t5_relative_bucket floats": (lambda: P.t5_relative_bucket(torch.tensor([0.5, -1.5])), TypeError,
                                      r"relative_position must hold integer positions .*got dtype torch\.float32"),
        "t5_relative_bucket bidirectional 'no'": (lambda: P.t5_relative_bucket(POS, "no"), TypeError,
                                                  r"bidirectional must be True or False, got 'no'"),
        "t5_relative_bucket bidirectional 0": (lambda: P.t5_relative_bucket(POS, 0), TypeError,
                                               r"bidirectional must be True or False, got 0"),
        "t5_relative_bucket list": (lambda: P.t5_relative_bucket([0, 1]), TypeError,
                                    r"relative_position must be a torch\.Tensor"),
        "t5_distance_index floats": (lambda: t5_distance_index(torch.tensor([0.5]), 8), TypeError,
                                     r"relative_position must hold integer positions"),
        "deberta_log_bucket floats": (lambda: P.deberta_log_bucket(torch.tensor([0.5]), 32, 128), TypeError,
                                      r"relative_position must hold integer positions"),
        "xlnet_sinusoid nan": (lambda: P.xlnet_sinusoid(torch.tensor([NAN]), 8), ValueError,
                               r"distances must hold finite positions, got nan at index 0"),
        "xlnet_sinusoid 2-D": (lambda: P.xlnet_sinusoid(POS[None], 8), ValueError, r"distances must be 1-D"),
        "xlnet_sinusoid list": (lambda: P.xlnet_sinusoid([0, 1], 8), TypeError, r"distances must be a torch\.Tensor"),
        "sinusoidal_encode bools": (lambda: sinusoidal_encode(POS.bool(), 8), TypeError,
                                    r"positions must hold real positions"),
        "sinusoidal_encode nan": (lambda: sinusoidal_encode(torch.tensor([NAN]), 8), ValueError,
                                  r"positions must hold finite positions"),
        "sinusoidal_table_2d dim '8'": (lambda: P.sinusoidal_table_2d(3, 3, "8"), ValueError,
                                        r"dim must be a positive integer, got '8'"),
        "sinusoidal_table_2d dim 8.0": (lambda: P.sinusoidal_table_2d(3, 3, 8.0), ValueError,
                                        r"dim must be a positive integer, got 8\.0"),
        "sinusoidal_table_2d dim True": (lambda: P.sinusoidal_table_2d(3, 3, True), ValueError,
                                         r"dim must be a positive integer, got True"),
        "learned forward floats": (lambda: LearnedPositionalEmbedding(8, 4)(torch.tensor([0.5])), TypeError,
                                   r"positions must hold integer positions"),
        "learned forward list": (lambda: LearnedPositionalEmbedding(8, 4)([0, 1]), TypeError,
                                 r"positions must be a torch\.Tensor"),
        "integer_positions dtype": (lambda: P.integer_positions(4, "x"), TypeError,
                                    r"dtype must be a torch\.dtype .*got 'x'"),
        "hierarchical_positions list": (lambda: P.hierarchical_positions([[1.0, 2.0]]), TypeError,
                                        r"table must be a torch\.Tensor"),
    }


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_argument_is_named_with_its_valid_range(name):
    call, kind, match = CASES[name]
    with torch.no_grad(), pytest.raises(kind, match=match):
        call()


def test_a_negative_position_is_not_read_from_the_end_of_the_rope_table():
    """RotaryCache keeps rows for positions 0.. only; a negative position gets its own angles, not the last row's."""
    cache = RotaryCache(8)
    cache(torch.arange(4))  # a table of 64 rows
    pos = torch.tensor([-1, 2])
    cos, sin = cache(pos)
    ref_cos, ref_sin = scaled_rope_cos_sin(pos, 8)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)


def test_fractional_positions_still_work_where_they_mean_something():
    """RoPE, ALiBi and the sinusoids take real positions (position interpolation): only bools, NaN and inf are refused."""
    half = torch.tensor([0.0, 0.5, 1.5])
    assert torch.isfinite(P.rope_cos_sin(half, 8)[0]).all()
    assert torch.isfinite(P.apply_rope(torch.randn(3, 8), half)).all()
    assert torch.isfinite(P.alibi_bias(half, half, P.alibi_slopes(2))).all()
    assert torch.isfinite(sinusoidal_encode(half, 8)).all()
    cos, _ = RotaryCache(8)(half)
    assert torch.equal(cos, scaled_rope_cos_sin(half, 8)[0])


def test_valid_calls_still_work():
    """The checks refuse only what is wrong: the documented inputs pass, the pad id included in targets."""
    m = _seq2seq()
    tgt_out = TGT.clone()
    tgt_out[0, -1] = m.pad_id  # padding in the targets is ignored by the loss, not refused
    assert torch.isfinite(m.loss(SRC, TGT, tgt_out, label_smoothing=0.1))
    assert torch.isfinite(m.loss(SRC, TGT, tgt_out, label_smoothing=0))
    cache = m.new_cache()
    m.decode(TGT[:, :1], m.encode(SRC), cache=cache)
    cache.reorder(torch.tensor([1, 0]))
    assert greedy_decode(m, SRC, max_new_tokens=2, bos_id=1, eos_id=2, use_cache=False).shape[0] == 2
    assert beam_search(m, SRC, max_new_tokens=2, bos_id=1, eos_id=2, alpha=0).shape[0] == 2
    mha = MultiHeadAttention(8, 2, dropout=0, bias=False).eval()
    assert mha(X, X, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool)).shape == (2, 5, 8)
    assert P.t5_relative_bucket(torch.arange(-3, 4, dtype=torch.int32), False).dtype == torch.int64
    assert P.make_scheme("t5", 8, 2, 1, causal=True).prepare(POS, POS)["bias"].shape == (1, 2, 5, 5)
    lm = CausalLM(V, "rope", **LM)
    assert torch.isfinite(lm.loss(_ids(2, 5)))


@pytest.mark.parametrize("call, kind, match", [
    (lambda: P.scaled_rope_frequencies(8, 10000.0, DYNAMIC, seq_len="64"), TypeError,
     r"seq_len must be a finite number in \[0\.0, inf\), got '64'"),
    (lambda: P.scaled_rope_frequencies(8, 10000.0, DYNAMIC, seq_len=True), TypeError,
     r"seq_len must be a finite number in \[0\.0, inf\), got True"),
    (lambda: P.scaled_rope_frequencies(8, 10000.0, DYNAMIC, seq_len=-3), ValueError,
     r"seq_len must be a finite number in \[0\.0, inf\), got -3"),
    (lambda: P.scaled_rope_frequencies(8, 10000.0, DYNAMIC, seq_len=NAN), ValueError,
     r"seq_len must be a finite number in \[0\.0, inf\), got nan"),
    (lambda: P.scaled_rope_frequencies(8, 10000.0, DYNAMIC, seq_len=torch.tensor([64, 65])), TypeError,
     r"seq_len must be a number or a 0-d tensor .*shape \(2,\)"),
    (lambda: DecoderCache(0), ValueError,
     r"num_layers must be a positive integer, got 0"),
], ids=["seq_len str", "seq_len bool", "seq_len negative", "seq_len nan", "seq_len 1-D tensor", "DecoderCache num_layers 0"])
def test_lengths_and_counts_are_named(call, kind, match):
    with pytest.raises(kind, match=match):
        call()
