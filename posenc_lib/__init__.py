"""posenc_lib: positional encodings for Transformers, as the papers define them.

One module per idea (see the README's table); the names below are the public API
that the notebooks, tests, benchmarks and experiments import.
"""
from .schemes.absolute import (
    LearnedPositionalEmbedding,
    LearnedScheme,
    binary_positions,
    hierarchical_positions,
    integer_positions,
    normalized_positions,
)
from .schemes.alibi import ALiBi, alibi_bias, alibi_slopes
from .attention.layer import MultiHeadAttention, PositionScheme
from .models.decoding import greedy_decode
from .schemes.deberta import DebertaDisentangled, deberta_log_bucket, disentangled_scores
from .models.seq2seq import Seq2SeqTransformer, build_model
from .schemes.rotary import RotaryScheme, apply_rope, apply_rope_complex, rope_cos_sin, rotate_half
from .schemes.rope_scaling import ROPE_TYPES, scaled_rope_frequencies
from .schemes import registry as _registry
from .schemes.registry import canonical_pe, make_scheme, scheme_options
from .schemes.cope import CoPE
from .schemes.fire import FIRE
from .schemes.kerple import Kerple
from .schemes.xpos import XPos
from .schemes.shaw import ShawRelative, shaw_key_scores, shaw_value_term
from .schemes.sinusoidal import SinusoidalScheme, sinusoidal_shift_matrix, sinusoidal_table, sinusoidal_table_2d
from .schemes.t5 import T5Bias, t5_relative_bucket
from .seeds import set_seed
from .schemes.xlnet import XLNetRelative, rel_shift, xlnet_sinusoid
from . import kernels  # noqa: F401,E402 (registers the backends and FlexAttention forms of the schemes above)

__all__ = [
    "PE_TYPES", "PE_ALIASES", "PAPERS", "build_model", "Seq2SeqTransformer", "MultiHeadAttention",
    "PositionScheme", "make_scheme", "canonical_pe", "scheme_options", "greedy_decode", "set_seed",
    "integer_positions", "normalized_positions", "binary_positions", "LearnedPositionalEmbedding",
    "hierarchical_positions", "sinusoidal_table", "sinusoidal_table_2d", "sinusoidal_shift_matrix",
    "apply_rope", "apply_rope_complex", "rotate_half", "rope_cos_sin", "t5_relative_bucket",
    "deberta_log_bucket", "disentangled_scores", "alibi_slopes", "alibi_bias", "shaw_key_scores",
    "shaw_value_term", "rel_shift", "xlnet_sinusoid", "SinusoidalScheme", "LearnedScheme", "ShawRelative",
    "RotaryScheme", "scaled_rope_frequencies", "ROPE_TYPES", "T5Bias", "XLNetRelative", "DebertaDisentangled", "ALiBi",
    "SURVEY_TYPES", "ALL_TYPES", "XPos", "FIRE", "CoPE", "Kerple",
]  # fmt: skip


def __getattr__(attr: str):
    """``PE_TYPES``, ``SURVEY_TYPES``, ``ALL_TYPES``, ``PAPERS``, ``PE_ALIASES``: read from the registry when read."""
    if attr in ("ALL_TYPES", "PAPERS", "PE_ALIASES", "PE_TYPES", "SURVEY_TYPES"):
        return getattr(_registry, attr)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
