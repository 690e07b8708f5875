"""Positional encoding schemes, one module per idea, in course order, and the registry.

====================  =========================================================================  ==========
module                scheme                                                                     lesson
====================  =========================================================================  ==========
``absolute.py``       integer, normalised, binary, learned and hierarchical positions            02, 04
``sinusoidal.py``     Vaswani et al.'s sin/cos code (and its 2-D form)                           03
``shaw.py``           Shaw et al.'s clipped relative tables                                      05
``rotary.py``         RoPE                                                                       06
``rope_scaling.py``   RoPE's frequency rescalings: PI, NTK, YaRN, Llama 3, LongRoPE, p-RoPE      06, 14, 15
``t5.py``             T5's bucketed relative bias                                                07
``xlnet.py``          Transformer-XL / XLNet relative scores                                     08
``deberta.py``        DeBERTa's disentangled attention                                           09
``alibi.py``          ALiBi's linear biases                                                      10
``urpe.py``           Universal RPE                                                              11
``floater.py``        FLOATER                                                                    11
``complex_order.py``  complex-order embeddings                                                   11
``twod.py``           2-D positions for image patches                                            11
``xpos.py``           xPos: RoPE with a per-pair exponential decay                               11
``fire.py``           FIRE: an MLP of the log-warped, normalised distance                        11
``cope.py``           CoPE: positions counted by gates, in units the query chooses               11
``kerple.py``         Kerple's learned log and power kernels                                     11
``rope_spectrum.py``  partial rotary (NeoX vs p-RoPE), full turns, the base's bound              15
``rope_layers.py``    positions per layer: local/global bases, RoPE/NoPE, Llama 4's temperature  15
``mla.py``            multi-head latent attention with decoupled RoPE; KV-cache sizes            15
``mrope.py``          multimodal RoPE (Qwen2-VL chunked, Qwen3-VL interleaved)                   15
``shipped.py``        the RoPE settings released models ship (Gemma 3, DeepSeek-V3, Llama 4)     15
``registry.py``       ``register_scheme``, ``make_scheme``, ``PE_TYPES``: every scheme by name   all
====================  =========================================================================  ==========

Each scheme is a :class:`~posenc_lib.attention.layer.PositionScheme` that overrides only the hooks it needs,
and registers itself with :func:`~posenc_lib.schemes.registry.register_scheme` (README.md here: how to add one).
"""
# importing a scheme's module registers it: this order is the order of PE_TYPES, then of SURVEY_TYPES
from . import registry  # noqa: F401  (registers "none", the base class, first)
from . import sinusoidal, absolute, shaw, rotary, t5, xlnet, deberta, alibi  # noqa: F401
from . import xpos, fire, cope, kerple  # noqa: F401
from .registry import (
    canonical_pe, make_scheme, register_scheme, registered_schemes, scheme_info, scheme_names, scheme_options,
    temporary_scheme, unregister_scheme,
)

#: the lists derived from the registry, read from it when asked for (see registry.py)
_DERIVED = ("ALL_TYPES", "PAPERS", "PE_ALIASES", "PE_TYPES", "SURVEY_TYPES")


def __getattr__(attr: str):
    if attr in _DERIVED:
        return getattr(registry, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = [*_DERIVED, "canonical_pe", "make_scheme", "register_scheme", "registered_schemes", "scheme_info",
           "scheme_names", "scheme_options", "temporary_scheme", "unregister_scheme"]
