"""The finale's pipeline: Transformers that differ only in their positional encoding, on WMT14 fr-en.

* ``data.py``: the shipped Europarl pairs and WMT14 test sets, or the hub's ``wmt14``;
* ``tokenizer.py``: joint BPE (or mBERT's WordPiece);
* ``train.py``: profiles (smoke, cpu, gpu), the training loop, checkpoints;
* ``fastpath.py``: the gpu profile's batches gathered on the device and its loss computed in chunks;
* ``evaluate.py``: decoding and BLEU, chrF, BERTScore, the paired bootstrap;
* ``pipeline.py``: a whole run (train, translate, score each model; collect; figures);
* ``calibrate.py``: time a few updates on this machine and fit a run to a budget;
* ``gpucheck.py``: time and profile one update per scheme (matrix FLOPs, TFLOP/s, the busiest kernels);
* ``cli.py`` / ``__main__.py``: ``python -m posenc_lib.experiments.wmt14 [score|make-data|calibrate]``.
"""
from .pipeline import (DEFAULT_PES, DIRECTIONS, TESTS, bleu_by_length, default_ckpt_dir, make_data, parse_pes,
                       parse_seeds, plot_bars, plot_bleu_by_length, plot_curves, prepare_data, resolve_jobs, run,
                       save_figures, score, summarize)


def main(argv: list[str] | None = None) -> int:
    """The command line (:func:`posenc_lib.experiments.wmt14.cli.main`)."""
    from .cli import main as cli_main

    return cli_main(argv)


__all__ = ["DEFAULT_PES", "DIRECTIONS", "TESTS", "bleu_by_length", "default_ckpt_dir", "main", "make_data",
           "parse_pes", "parse_seeds", "plot_bars", "plot_bleu_by_length", "plot_curves", "prepare_data",
           "resolve_jobs", "run", "save_figures", "score", "summarize"]
