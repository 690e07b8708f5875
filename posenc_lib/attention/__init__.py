"""The one attention of the course and the kernels it runs on.

* ``layer.py``: :class:`MultiHeadAttention`, the :class:`PositionScheme` hooks every scheme plugs into,
  and the dispatcher that picks a path (fused SDPA, explicit scores, query blocks) from what a scheme
  declares.
* ``cpu_flash.py``: PyTorch's fused CPU kernel with the gradient of an additive score term (T5's bias,
  Shaw's, XLNet's and DeBERTa's score terms), over blocks of query rows.
* ``flex.py``: FlexAttention ``score_mod`` functions for the same terms on a GPU.

Nothing here imports a scheme: schemes import this package, never the reverse.
"""
from .layer import MultiHeadAttention, PositionScheme

__all__ = ["MultiHeadAttention", "PositionScheme"]
