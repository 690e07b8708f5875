"""The fast paths of particular position schemes, kept beside the attention backends they serve so that each scheme's
own module reads as its paper.

* ``flex_forms.py``: FlexAttention ``score_mod`` forms (and Shaw's value term) of Shaw, DeBERTa and Transformer-XL,
  registered by scheme class with :func:`posenc_lib.attention.flex.register`.

A module here may import schemes; :mod:`posenc_lib.attention` never imports this package's scheme forms itself
(``posenc_lib`` imports them once, after the schemes).
"""
