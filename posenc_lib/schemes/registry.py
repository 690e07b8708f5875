"""The registry of position schemes: canonical names, the seed report's aliases, options.

``PE_TYPES`` lists the nine classic schemes in the order the course teaches them (lessons 02-10).
``SURVEY_TYPES`` lists the schemes research since 2022 keeps returning to, taught in lesson 11:
xPos, FIRE, CoPE and Kerple.  ``ALL_TYPES = PE_TYPES + SURVEY_TYPES`` is every name the registry
knows: ``make_scheme``, ``canonical_pe`` (and so ``build_model`` and ``CausalLM``) accept all of them.

Why two tuples: committed outputs loop over ``PE_TYPES`` (lesson 11's side-by-side table, lesson 12's
cost tables, ``--pe all`` of the experiments, tests that assert its exact contents), so adding names
to it would silently change results that were measured for the nine.  A loop that should include the
newer schemes says so by using ``ALL_TYPES``.  ``PAPERS`` covers every name of ``ALL_TYPES``.

Two of the newer schemes are causal in their papers (xPos and CoPE).  Each defines a bidirectional
form of its own, stated in its module and not the paper's, so that the seq2seq model's encoder can
use it; the causal form (the decoder, ``CausalLM``) is the paper's.

``make_scheme(name, ...)`` builds one :class:`~posenc_lib.attention.layer.PositionScheme`
for one stack, and rejects unknown names or options with the valid choices.
"""
from __future__ import annotations

import inspect

from .absolute import LearnedScheme
from .alibi import ALiBi
from ..attention.layer import PositionScheme
from .cope import CoPE
from .deberta import DebertaDisentangled
from .fire import FIRE
from .kerple import Kerple
from .rotary import RotaryScheme
from .shaw import ShawRelative
from .sinusoidal import SinusoidalScheme
from .t5 import T5Bias
from .xlnet import XLNetRelative
from .xpos import XPos

#: the classic schemes, in course order (what committed tables and ``--pe all`` loop over)
PE_TYPES: tuple[str, ...] = ("none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi")
#: the newer schemes of lesson 11, registered beside the classics but not in ``PE_TYPES``
SURVEY_TYPES: tuple[str, ...] = ("xpos", "fire", "cope", "kerple")
#: every canonical name the registry accepts
ALL_TYPES: tuple[str, ...] = PE_TYPES + SURVEY_TYPES

#: the seed report's names (nonepe, sinpe, rpe, rope) and a few common spellings
PE_ALIASES: dict[str, str] = {
    "nonepe": "none",
    "nope": "none",
    "sinpe": "sinusoidal",
    "sin": "sinusoidal",
    "rpe": "shaw",
    "relative": "shaw",
    "rotary": "rope",
    "learnedpe": "learned",
}

SCHEMES: dict[str, type[PositionScheme]] = {
    "none": PositionScheme,
    "sinusoidal": SinusoidalScheme,
    "learned": LearnedScheme,
    "shaw": ShawRelative,
    "rope": RotaryScheme,
    "t5": T5Bias,
    "xlnet": XLNetRelative,
    "deberta": DebertaDisentangled,
    "alibi": ALiBi,
    "xpos": XPos,
    "fire": FIRE,
    "cope": CoPE,
    "kerple": Kerple,
}

#: the papers, for tables and docstrings: name -> (citation, arXiv id)
PAPERS: dict[str, tuple[str, str]] = {
    "none": ("no positional information (Haviv et al. 2022; Kazemnejad et al. 2023)", "2305.19466"),
    "sinusoidal": ("Vaswani et al. 2017, Attention Is All You Need", "1706.03762"),
    "learned": ("Gehring et al. 2017, Convolutional Sequence to Sequence Learning", "1705.03122"),
    "shaw": ("Shaw et al. 2018, Self-Attention with Relative Position Representations", "1803.02155"),
    "rope": ("Su et al. 2021, RoFormer: Rotary Position Embedding", "2104.09864"),
    "t5": ("Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5)", "1910.10683"),
    "xlnet": ("Dai et al. 2019, Transformer-XL; Yang et al. 2019, XLNet", "1901.02860"),
    "deberta": ("He et al. 2021, DeBERTa: Decoding-enhanced BERT with Disentangled Attention", "2006.03654"),
    "alibi": ("Press et al. 2022, Train Short, Test Long (ALiBi)", "2108.12409"),
    "xpos": ("Sun et al. 2023, A Length-Extrapolatable Transformer (xPos)", "2212.10554"),
    "fire": ("Li et al. 2024, Functional Interpolation for Relative Positions Improves Long Context Transformers (FIRE)",
             "2310.04418"),
    "cope": ("Golovneva et al. 2024, Contextual Position Encoding: Learning to Count What's Important (CoPE)",
             "2405.18719"),
    "kerple": ("Chi et al. 2022, KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation", "2205.09921"),
}


def canonical_pe(pe: str) -> str:
    """Map a name or alias to its canonical name; ``ValueError`` listing the valid names otherwise."""
    if not isinstance(pe, str):
        raise TypeError(f"pe must be a string naming a scheme, got {type(pe).__name__}")
    key = pe.strip().lower()
    key = PE_ALIASES.get(key, key)
    if key not in SCHEMES:
        raise ValueError(
            f"unknown positional encoding {pe!r}; valid choices: {', '.join(ALL_TYPES)} "
            f"(aliases: {', '.join(f'{a}={c}' for a, c in PE_ALIASES.items())})"
        )
    return key


def scheme_options(pe: str) -> dict[str, object]:
    """The options a scheme accepts, with their defaults."""
    cls = SCHEMES[canonical_pe(pe)]
    params = inspect.signature(cls.__init__).parameters
    skip = {"self", "d_model", "n_heads", "num_layers", "causal"}
    return {n: p.default for n, p in params.items() if n not in skip}


def make_scheme(pe: str, d_model: int, n_heads: int, num_layers: int, causal: bool = False, **options):
    """Build the scheme ``pe`` for one stack of ``num_layers`` attention layers."""
    name = canonical_pe(pe)
    valid = scheme_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for positional encoding {name!r}; "
            f"valid options: {sorted(valid) if valid else 'none'}"
        )
    return SCHEMES[name](d_model, n_heads, num_layers, causal, **options)
