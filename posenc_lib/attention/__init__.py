"""The one attention of the course and the kernels it runs on.

* ``layer.py``: :class:`MultiHeadAttention` (project, rotate, cache, hand the call on) and the
  :class:`PositionScheme` hooks every scheme plugs into.
* ``backends.py``: the backends (fused SDPA, explicit scores, query blocks, FlexAttention, the fused CPU
  kernels, variable-length sequences) in one registry, the one function that picks among them, and the one tuning config it reads.
* ``cpu_flash.py``: PyTorch's fused CPU kernel with the gradient of an additive score term (T5's bias,
  Shaw's, XLNet's and DeBERTa's score terms), over blocks of query rows.
* ``flex.py``: FlexAttention with the generic ``score_mod`` forms and a registry of schemes' own forms.
* ``varlen.py``: a padded batch as variable-length sequences (its rows' tokens and pads), for flash's
  variable-length kernel on a GPU without a mask (``tune(varlen=True)``).
* ``blocks.py``, ``by_class.py``, ``inputs.py``, ``step.py``: rows of masks and batch chunks, entries kept by
  scheme class, argument checks and masks, cached decoding steps.

Nothing here imports a scheme: schemes import this package, never the reverse; the fast paths of particular
schemes live in :mod:`posenc_lib.kernels`.
"""
from .layer import MultiHeadAttention, PositionScheme

__all__ = ["MultiHeadAttention", "PositionScheme"]
