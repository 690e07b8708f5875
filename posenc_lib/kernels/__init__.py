"""The fast paths of particular position schemes, kept beside the attention backends they serve so that each scheme's
own module reads as its paper.  Each module registers what it provides with the attention package, which never
imports this one (``posenc_lib`` imports it once, after the schemes):

* ``offsets.py``: a bias of one value per offset (T5, ALiBi) laid out block by block in the fused CPU kernel
  (the backend ``cpu_offsets``);
* ``parts.py``: score terms built per query block from parts (DeBERTa, Transformer-XL, CoPE) in the fused CPU
  kernel (``cpu_shared_parts``, ``cpu_parts``);
* ``xlnet.py``: Transformer-XL's block mask (terms (b)+(d) as a strided view) and the kernel's queries ``q + u``,
  its own block mask for ``cpu_shared_parts``;
* ``shaw.py``: Shaw's both terms in the fused CPU kernel (its kernel for the backend ``cpu_values``);
* ``flex_forms.py``: FlexAttention ``score_mod`` forms (and Shaw's value term) of Shaw, DeBERTa and Transformer-XL,
  registered by scheme class (:func:`posenc_lib.attention.flex.register`).
"""
from . import flex_forms, offsets, parts, shaw, xlnet  # noqa: F401 (each registers its backends or forms)
