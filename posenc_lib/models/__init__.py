"""The models the experiments train, and how they decode.

* ``seq2seq.py``: :class:`Seq2SeqTransformer` (encoder-decoder) and :func:`build_model`.
* ``causal_lm.py``: :class:`CausalLM`, a small decoder-only language model, and :class:`MaskedLM`, the same
  stack with no causal mask, trained to fill in masked characters.
* ``decoding.py``: greedy decoding with a key/value cache; ``beam.py``: beam search.

Every model takes its positions from one scheme of :mod:`posenc_lib.schemes.registry` through the one
attention of :mod:`posenc_lib.attention.layer`.
"""
from .beam import beam_search
from .causal_lm import CausalLM, MaskedLM
from .decoding import greedy_decode
from .seq2seq import Seq2SeqTransformer, build_model

__all__ = ["CausalLM", "MaskedLM", "Seq2SeqTransformer", "beam_search", "build_model", "greedy_decode"]
