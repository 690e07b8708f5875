"""Lesson 15's statements, checked against what they describe: the library's ladders and bounds for the numbers the
text quotes, and the committed results (results/long_context, results/rope_variants) for what the experiments
found. Each test names the section whose sentences it keeps true; when a result changes, the failing assert says
which sentence to rewrite. The parity of each variant with `transformers` is tested in tests/test_llm_rope.py."""
import math
from pathlib import Path

import pytest
import torch

from posenc_lib.experiments import long_context as lc
from posenc_lib.experiments import rope_variants as rv
from posenc_lib.schemes.mla import kv_cache_elements
from posenc_lib.schemes.mrope import mrope_axes, mrope_position_ids
from posenc_lib.schemes.rope_layers import NoPETemperature, layers_from_config, llama4_attention_scale
from posenc_lib.schemes.rope_scaling import wavelengths
from posenc_lib.schemes.rope_spectrum import (base_bound_interval, failing_base_windows, first_negative_margin,
                                              full_turn_pairs, partial_rotary_ladder, rotary_pairs)
from posenc_lib.schemes.rotary import rope_frequencies
from posenc_lib.files import read_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def _longest(ladder):
    return round(wavelengths(ladder[ladder > 0]).max().item())


def test_section1_two_partial_rotary_ladders():
    """'Partial rotary': 4 of 16 pairs rotate in the sweep's head at p = 1/4; the same fastest pair, then NeoX's
    ladder slower; on a 128-dimensional head 16 pairs each, 13 of NeoX's turn fully within 8192 (longest 35,333),
    all 16 of p-RoPE's (longest 54)."""
    d, p = 32, 0.25
    pairs = rotary_pairs(p, d)
    neox, prope = partial_rotary_ladder("neox", p, d, 10000.0), partial_rotary_ladder("proportional", p, d, 10000.0)
    assert pairs == 4 and (neox[pairs:] == 0).all() and (prope[pairs:] == 0).all()
    assert torch.equal(neox[0], prope[0]) and (neox[1:pairs] < prope[1:pairs]).all()
    counts = {}
    for kind in ("neox", "proportional"):
        lad = partial_rotary_ladder(kind, 0.25, 128)
        counts[kind] = (int((lad > 0).sum()), int((8191 * lad >= 2 * math.pi).sum()), _longest(lad))
    assert counts == {"neox": (16, 13, 35333), "proportional": (16, 16, 54)}


def test_section2_base_and_context():
    """'The base and the context length': pairs turning fully per base and length; where Men et al.'s margin
    first turns negative."""
    lengths = (4096, 8192, 32768, 131072)
    turns = {b: [full_turn_pairs(128, b, n) for n in lengths] for b in (1e4, 5e5, 1e6)}
    assert turns == {1e4: [46, 50, 60, 64], 5e5: [32, 35, 42, 49], 1e6: [31, 34, 40, 47]}
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    qwen_yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    first = [first_negative_margin(128, b, 2**18, sc) for b, sc in
             ((1e4, None), (5e5, None), (1e6, None), (5e5, llama31), (1e6, qwen_yarn))]
    assert first == [1707, 18438, 27115, 85133, 66234]


PAPER = {1: 4.3e3, 2: 1.6e4, 4: 2.7e4, 8: 8.4e4, 16: 3.1e5, 32: 6.4e5, 64: 2.1e6, 128: 7.8e6}   # Men et al., d = 128
SU = {1: 4.3e3, 2: 1.2e4, 4: 2.7e4, 8: 8.4e4, 16: 2.3e5, 32: 6.3e5, 64: 2.1e6, 128: 4.9e6}


def test_section2_smallest_base_for_a_context():
    """'The smallest base for a context L': the grid of 0.002 decade finds passing bases below the 0.01 grid's
    failing ones at 1k, 2k, 16k, 32k, 64k (4,296 vs 5,599 at 1k), a 0.0005 grid 26,953 at 4k; at 32k 10^5.8
    passes, the 0.005 grid fails from 637,456 to 976,000 while 963,579 passes, a million fails at 27,115; the
    finest search matches the paper's two digits at 1k, 4k, 8k, 64k and Su's lower values at 2k, 16k, 128k."""
    two = lambda x: f"{x:.1e}"
    bracket = {k: [base_bound_interval(1024 * k, 128, low=1024 * k, step=s) for s in (0.01, 0.002)] for k in PAPER}
    for k, (coarse, fine) in bracket.items():
        for r in (coarse, fine):
            assert first_negative_margin(128, r.upper, 1024 * k) is None and r.upper <= r.lower * 1.001
            assert first_negative_margin(128, r.lower, 1024 * k) is not None
        assert (fine.upper < coarse.lower) == (k in (1, 2, 16, 32, 64))
    assert (round(bracket[1][1].upper), round(bracket[1][0].lower)) == (4296, 5599)
    finest = base_bound_interval(4096, 128, low=4096, step=0.0005)
    assert round(finest.upper) == 26953 and finest.upper < bracket[4][1].lower
    fine = {k: (finest if k == 4 else b[1]).upper for k, b in bracket.items()}
    assert [k for k in PAPER if two(fine[k]) == two(PAPER[k])] == [1, 4, 8, 64]
    assert all(two(fine[k]) == two(SU[k]) and fine[k] < PAPER[k] for k in (2, 16, 128))
    assert bracket[32][1].lower < 10**5.8 < bracket[32][1].upper * 1.012
    assert first_negative_margin(128, 10**5.8, 32768) is None
    windows = failing_base_windows(32768, 128, bracket[32][1].upper, 1.2e6, step=0.005)
    assert [round(x) for x in windows[0]] == [637456, 976000] and round(bracket[32][0].upper) == 963579
    assert windows[0][0] < bracket[32][0].upper < windows[0][1] and first_negative_margin(128, 1e6, 32768) == 27115
    assert two(bracket[128][1].upper) == "4.9e+06"


def test_section2_lesson14_head():
    """'And lesson 14?': its head turns 3 of 8 pairs in 64 positions, its margin turns negative at 91, and its
    committed plain and half-rotary perplexities are the ones quoted."""
    assert full_turn_pairs(16, 1e4, 64) == 3 and first_negative_margin(16, 1e4, 10**4) == 91
    summary = lc.summarize(lc.load_results(RESULTS / "long_context"))
    assert [round(v, 2) for v in summary[("pretrain", "rope", "none")]["mean"]] == [4.08, 4.59, 11.24, 20.84]
    assert [round(v, 2) for v in summary[("pretrain", "rope-partial", "none")]["mean"]] == [4.1, 4.03, 4.03, 9.99]


def _label(entry):
    scheme, options = entry
    if scheme is NoPETemperature:
        return "NoPE + temperature"
    return "NoPE" if scheme == "none" else f"RoPE, base {options['base']:,.0f}"


def test_section3_layer_patterns_and_temperature():
    """'Layers that differ in their positions': each family's default pattern; Llama 4's temperature leaves the
    entropy at 4096 keys alone and lowers it beyond, so it grows more slowly with the number of keys."""
    from transformers import Cohere2Config, Gemma3TextConfig, Llama4TextConfig, SmolLM3Config

    tiny = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, intermediate_size=32)
    configs = {"gemma3": Gemma3TextConfig(num_hidden_layers=12, head_dim=16, **tiny),
               "cohere2": Cohere2Config(num_hidden_layers=12, **tiny),
               "llama4": Llama4TextConfig(num_hidden_layers=12, head_dim=16, **tiny),
               "smollm3": SmolLM3Config(num_hidden_layers=12, **tiny)}
    patterns = {name: [_label(e) for e in layers_from_config(cfg)] for name, cfg in configs.items()}
    assert patterns["gemma3"][:6] == ["RoPE, base 10,000"] * 5 + ["RoPE, base 1,000,000"]
    assert patterns["cohere2"][:4] == ["RoPE, base 10,000"] * 3 + ["NoPE"]
    assert patterns["llama4"][:4] == ["RoPE, base 500,000"] * 3 + ["NoPE + temperature"]
    assert patterns["smollm3"][:4] == ["RoPE, base 2,000,000"] * 3 + ["NoPE"]
    g = torch.Generator().manual_seed(0)  # the lesson's draws, in its order
    ent = {}
    for n in (4096, 65536, 524288):
        logits = 2.0 * torch.randn(8, n, generator=g)
        t = llama4_attention_scale(torch.tensor([n - 1])).item()
        ent[n] = [float(-(p * p.log()).sum(-1).mean()) for p in (torch.softmax(logits, -1), torch.softmax(t * logits, -1))]
    assert ent[4096][0] == ent[4096][1] and all(ent[n][1] < ent[n][0] for n in (65536, 524288))
    assert ent[524288][1] - ent[4096][1] < ent[524288][0] - ent[4096][0]


def test_section4_what_mla_saves():
    """'What it saves': 82.2% smaller than DeepSeek 67B's cache, 93.3% with 6-bit elements, 98% smaller than the
    same heads with MHA; the rotary key is a ninth of 576 numbers."""
    mla = kv_cache_elements("mla", layers=60, kv_rank=512, rope_dim=64)
    gqa = kv_cache_elements("gqa", layers=95, n_kv_heads=8, head_dim=128)
    mha = kv_cache_elements("mha", layers=60, n_heads=128, head_dim=128)
    assert (round(1 - mla / gqa, 3), round(1 - mla * 6 / (gqa * 16), 3)) == (0.822, 0.933)
    assert round(1 - mla / mha, 3) == 0.982 and mla == 60 * (512 + 64) and 64 / 576 == 1 / 9
    assert round(gqa / mla, 1) == 5.6  # "a 5.6 times shorter bar"


def test_section5_mrope_layouts():
    """'Multimodal RoPE': the ids of text, a 2 x 3 image and text; chunked gives time wavelengths 6-160 and width
    35,333 to about 5 million; interleaved gives every axis pairs under 10 and over a million (base 1M)."""
    ids = mrope_position_ids([("text", 3), ("image", (2, 3)), ("text", 2)])
    assert ids.tolist() == [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7], [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
                            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]
    theta = rope_frequencies(128, 1e6)
    chunked, inter = mrope_axes(128, (16, 24, 24), "chunked"), mrope_axes(128, (24, 20, 20), "interleaved")

    def span(a, i):
        w = wavelengths(theta[a == i])
        return round(w.min().item()), round(w.max().item())

    assert chunked[:16].eq(0).all() and chunked[16:40].eq(1).all() and chunked[40:].eq(2).all()
    assert torch.bincount(inter).tolist() == [24, 20, 20] and inter[:6].tolist() == [0, 1, 2, 0, 1, 2]
    assert span(chunked, 0) == (6, 160) and span(chunked, 2) == (35333, 5063256)
    assert all(wavelengths(theta[inter == i]).min() < 10 and wavelengths(theta[inter == i]).max() > 10**6 for i in range(3))


def test_section7_timing():
    """'What it costs': the timed models are the sweep's, 1500 updates, 45-53 ms of CPU per update, about 36 CPU
    minutes, nearly twice that in wall time on the shared cores; the slowest wavelengths the section quotes."""
    timing = read_json(RESULTS / "rope_variants" / "timing.json")
    per_update = sorted(round(r["cpu_per_update"] * 1000) for r in timing["per_model"].values())
    assert list(timing["per_model"]) == list(rv.models(rv.COURSE)) and timing["steps"] == rv.COURSE.steps == 1500
    assert round(timing["cpu_seconds_3_seeds"] / 60) == 36 and (per_update[0], per_update[-1]) == (45, 53)
    assert 1.5 < timing["wall_seconds_3_seeds"] / timing["cpu_seconds_3_seeds"] < 2.0
    slowest = [_longest(partial_rotary_ladder(kind, f, 32)) for kind, f in
               (("proportional", 0.25), ("proportional", 0.5), ("neox", 0.25))]
    assert slowest == [35, 353, 6283]


@pytest.fixture(scope="module")
def sweep():
    records = lc.load_results(RESULTS / "rope_variants")
    layered = lc.summarize(records)[("pretrain", "rope3-nope1", "none")]
    return records, rv.table(records), layered


def test_section7_the_sweep(sweep):
    """'What the sweep shows': equal at the training length from a quarter on; one pair not enough; NeoX's quarter
    flat to 4x; p-RoPE's quarter close to full RoPE; every model degrades at 8x; NeoX's half worst at 4x and 8x;
    the 3:1 stack within all-RoPE's seed range."""
    records, cells, layered = sweep
    assert records[0]["profile"] == "rope-variants"
    assert len(records) == 27 and sorted({r["seed"] for r in records}) == [0, 1, 2]
    assert len(cells) == 10 and [len(c["mean"]) for c in cells.values()] == [len(rv.COURSE.eval_lengths)] * 10

    def at(kind, f, k):
        return cells[(kind, f)]["mean"][k]

    quarter_up = [(kind, f) for kind in rv.KINDS for f in (0.25, 0.5, 1.0)]
    at64 = [at(kind, f, 0) for kind, f in quarter_up] + [layered["mean"][0]]
    assert 3.72 <= min(at64) and max(at64) <= 3.77  # "3.73-3.76"
    assert [round(at(kind, 0.1, 0), 2) for kind in rv.KINDS] == [4.35, 4.45] and round(at("neox", 0.0, 0), 2) == 4.79
    assert abs(at("neox", 0.1, 0) - at("prope", 0.1, 0)) < min(cells[(kind, 0.1)]["max"][0] - cells[(kind, 0.1)]["min"][0]
                                                               for kind in rv.KINDS)
    flat = cells[("neox", 0.25)]
    assert max(flat["max"][1:3]) <= 3.70 and max(flat["mean"][1:3]) <= flat["mean"][0]
    assert all(at(kind, f, 1) > 4.3 for kind, f in quarter_up if (kind, f) != ("neox", 0.25)) and layered["mean"][1] > 4.3
    assert (round(at("prope", 0.25, 1), 2), round(at("prope", 0.25, 2), 2)) == (4.81, 8.67)
    assert (round(at("neox", 0.0, 1), 2), round(at("neox", 0.0, 2), 2)) == (5.67, 9.45)
    best512 = min(c["mean"][3] for c in cells.values())
    assert best512 == flat["mean"][3] and round(best512, 2) == 9.88 and round(best512 / flat["mean"][0], 1) == 2.6
    assert all(cells[("neox", 0.5)]["mean"][k] >= max([c["mean"][k] for c in cells.values()] + [layered["mean"][k]])
               for k in (2, 3))
    full = cells[("neox", 1.0)]
    assert all(max(layered["min"][k], full["min"][k]) <= min(layered["max"][k], full["max"][k])
               for k in range(len(rv.COURSE.eval_lengths)))


def test_section7_where_the_sweep_breaks(sweep):
    """'What the sweep shows', by position: p-RoPE's quarter and full RoPE break over 96-127, NoPE from 64 on;
    NeoX's quarter holds to 255 and fails from about 320; p-RoPE meets no new angle, NeoX's pair 2 four times
    its arc by 256."""
    records = sweep[0]
    lengths = list(rv.COURSE.eval_lengths)

    def bins(model, n):
        rows = [r["eval"]["none"][lengths.index(n)]["nll_by_position"] for r in records if r["model"] == model]
        return [round(sum(v) / len(v), 2) for v in zip(*rows)]

    b128 = {m: bins(m, 128)[4:] for m in ("prope-0.25", "rope", "nope")}
    q512 = bins("neox-0.25", 512)
    assert b128 == {"prope-0.25": [1.29, 1.29, 2.15, 2.62], "rope": [1.30, 1.39, 2.09, 2.46], "nope": [1.61, 1.79, 2.03, 2.21]}
    assert set(q512[:4]) <= {1.29, 1.30, 1.31} and q512[4] == 1.83 and min(q512[5:]) >= 3.5
    prope_q = partial_rotary_ladder("proportional", 0.25, 32)
    assert ((rv.COURSE.train_len - 1) * prope_q[prope_q > 0] >= 2 * math.pi).all()
    neox_q = partial_rotary_ladder("neox", 0.25, 32)
    assert round(neox_q[2].item(), 4) == 0.01 and round(256 * neox_q[2].item(), 2) == 2.56
