"""The course's experiments: each trains models, writes one result file per model and resumes.

* ``runner.py``: the grid loop they all run (skip what is finished, write each result the moment it is made,
  worker processes), the one resume policy, result files read through their schema, the timing of a run.
* ``charlm.py``: the character language model the long-context experiments share (data, training, evaluation,
  the record format).

* ``extrapolation.py``: train short, test long on reversal (lesson 13);
  ``python -m posenc_lib.experiments.extrapolation``.
* ``long_context.py``: a character language model trained at 64, read at up to 512, with RoPE's
  rescalings (lessons 10 and 14); ``python -m posenc_lib.experiments.long_context``.
* ``long_context_extra.py``: two extra models beside that run (lessons 07 and 10).
* ``long_context_scaled.py``: that run's RoPE models read fairly: every rescaling at ``s = n / L``,
  static NTK, passkey retrieval, fine-tuning as a curve (lesson 14);
  ``python -m posenc_lib.experiments.long_context_scaled``.
* ``cope_counting.py``: the k-th word back, where position is counted in words, not tokens: CoPE against
  RoPE, ALiBi and no positions (lesson 11); ``python -m posenc_lib.experiments.cope_counting``.
* ``rope_variants.py``: partial rotary and RoPE:NoPE layers on that character model (lesson 15).
* ``inside.py``: what trained character models do with positions: probes, rotary bands, attention sinks
  (lesson 16), with the measurements in ``inside_tools.py``; ``python -m posenc_lib.experiments.inside``.
* ``wmt14/``: the finale, French-English translation (lesson 17): data, tokenizer, training,
  evaluation, calibration and the command line ``python -m posenc_lib.experiments.wmt14``.
"""
