"""The registry of position schemes: each scheme registers itself, and every list of names derives from it.

A scheme's module registers its class with :func:`register_scheme`, a decorator that records the
class's ``name``, its kind, its paper (citation, arXiv id, year), its aliases and its group.
Its options are its constructor's keyword arguments (:func:`scheme_options`).  Registration order is
the order every list below keeps; ``posenc_lib.schemes`` imports the shipped modules in course order.

Derived, read from the registry on every access (so a scheme registered later appears in them too):

* ``PE_TYPES``: the nine classic schemes (group ``"classic"``), in the order the course teaches them
  (lessons 02-10);
* ``SURVEY_TYPES``: the schemes research since 2022 keeps returning to (group ``"survey"``), taught in
  lesson 11: xPos, FIRE, CoPE and Kerple;
* ``ALL_TYPES = PE_TYPES + SURVEY_TYPES``: every name the registry knows; ``make_scheme``,
  ``canonical_pe`` (and so ``build_model`` and ``CausalLM``) accept all of them;
* ``PAPERS``: name -> (citation, arXiv id); ``PE_ALIASES``: alias -> name (the seed report's names
  nonepe, sinpe, rpe, rope and a few common spellings); ``SCHEMES``: name -> class.

Why two groups: committed outputs loop over ``PE_TYPES`` (lesson 11's side-by-side table, lesson 12's
cost tables, ``--pe all`` of the experiments, tests that assert its exact contents), so adding names
to it would silently change results that were measured for the nine.  A new scheme joins ``"survey"``
(the default); a loop that should include it says so by using ``ALL_TYPES``.

Two of the newer schemes are causal in their papers (xPos and CoPE).  Each defines a bidirectional
form of its own, stated in its module and not the paper's, so that the seq2seq model's encoder can
use it; the causal form (the decoder, ``CausalLM``) is the paper's.

``make_scheme(name, ...)`` builds one :class:`~posenc_lib.attention.layer.PositionScheme`
for one stack, and rejects unknown names or options with the valid choices.
"""
from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass
from typing import Iterator

from ..attention.layer import PositionScheme

#: where a scheme's position enters, in the words of the course
KINDS: tuple[str, ...] = ("none", "absolute", "relative", "bias", "rotary", "contextual")
#: the groups, and the list of names each one makes
GROUPS: dict[str, str] = {"classic": "PE_TYPES", "survey": "SURVEY_TYPES"}
#: a name or alias: what ``--pe`` lists split on commas and ``canonical_pe`` lower-cases
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class SchemeInfo:
    """One registered scheme: what every list of names and the papers table read."""

    name: str
    cls: type[PositionScheme]
    kind: str
    group: str
    paper: str
    arxiv: str
    year: int
    aliases: tuple[str, ...] = ()


_REGISTRY: dict[str, SchemeInfo] = {}
_ALIASES: dict[str, str] = {}


def _where(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _choice(what: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(valid)}")


def register_scheme(*, kind: str, paper: str, arxiv: str, year: int, group: str = "survey",
                    aliases: tuple[str, ...] = ()):
    """Class decorator: register a :class:`PositionScheme` subclass under its ``name`` class attribute.

    ``kind``: one of :data:`KINDS`; ``group``: ``"classic"`` (joins ``PE_TYPES``) or ``"survey"``
    (joins ``SURVEY_TYPES``); ``paper``, ``arxiv``, ``year``: the citation for ``PAPERS``; ``aliases``:
    other spellings ``canonical_pe`` maps to the name.  A name or alias already taken is refused.
    """
    _choice("kind", kind, KINDS)
    _choice("group", group, tuple(GROUPS))
    if isinstance(aliases, str):
        raise TypeError(f"aliases must be a tuple of names, got the string {aliases!r}")
    for what, text in (("paper", paper), ("arxiv", arxiv)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{what} must be a non-empty string, got {text!r}")
    if isinstance(year, bool) or not isinstance(year, int) or not 1900 <= year <= 2100:
        raise ValueError(f"year must be an integer year such as 2022, got {year!r}")

    def register(cls):
        if not (isinstance(cls, type) and issubclass(cls, PositionScheme)):
            raise TypeError(f"register_scheme decorates a PositionScheme subclass, got {cls!r}")
        name = cls.__dict__.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{cls.__qualname__} needs its own class attribute name, lower-case letters, digits "
                             f"and _ (it is what --pe and build_model take), got {name!r}")
        if len(set(aliases)) != len(aliases) or name in aliases:
            raise ValueError(f"aliases of {name!r} repeat a name: {aliases!r}")
        bad = [a for a in aliases if not isinstance(a, str) or not _NAME.fullmatch(a)]
        if bad:
            raise ValueError(f"aliases of {name!r} must be lower-case letters, digits and _, got {bad}")
        # its own module imported again (importlib.reload): the new class takes the old one's place
        old = _REGISTRY.get(name)
        own = {name, *old.aliases} if old and _where(old.cls) == _where(cls) else set()
        for key in (name, *aliases):
            if key not in own and (key in _REGISTRY or key in _ALIASES):
                taken = _REGISTRY[key] if key in _REGISTRY else _REGISTRY[_ALIASES[key]]
                raise ValueError(f"positional encoding name {key!r} is already registered, by "
                                 f"{_where(taken.cls)}; choose another name")
        for alias in own - {name}:
            del _ALIASES[alias]
        _REGISTRY[name] = SchemeInfo(name, cls, kind, group, paper, arxiv, year, tuple(aliases))
        _ALIASES.update(dict.fromkeys(aliases, name))
        return cls

    return register


def unregister_scheme(name: str) -> SchemeInfo:
    """Remove a registered scheme and its aliases (for tests and notebooks); returns what was registered."""
    info = _REGISTRY.pop(canonical_pe(name))
    for alias in info.aliases:
        del _ALIASES[alias]
    return info


@contextlib.contextmanager
def temporary_scheme(cls: type[PositionScheme], **registration) -> Iterator[type[PositionScheme]]:
    """Register ``cls`` (``registration``: the arguments of :func:`register_scheme`) for a ``with`` block only."""
    register_scheme(**registration)(cls)
    try:
        yield cls
    finally:
        unregister_scheme(cls.name)


def registered_schemes() -> dict[str, SchemeInfo]:
    """Every registered scheme, name -> :class:`SchemeInfo`, in registration order (a copy)."""
    return dict(_REGISTRY)


def scheme_names(group: str | None = None) -> tuple[str, ...]:
    """The names of one group (``"classic"``, ``"survey"``), or of all groups in turn (``ALL_TYPES``)."""
    if group is not None:
        _choice("group", group, tuple(GROUPS))
    return tuple(n for g in ((group,) if group else GROUPS) for n, info in _REGISTRY.items() if info.group == g)


def __getattr__(attr: str):
    """The derived lists, computed from the registry when read (module attributes that stay current)."""
    if attr in ("PE_TYPES", "SURVEY_TYPES"):
        return scheme_names({v: k for k, v in GROUPS.items()}[attr])
    if attr == "ALL_TYPES":
        return scheme_names()
    if attr == "PAPERS":
        return {n: (_REGISTRY[n].paper, _REGISTRY[n].arxiv) for n in scheme_names()}
    if attr == "PE_ALIASES":
        return dict(_ALIASES)
    if attr == "SCHEMES":
        return {n: _REGISTRY[n].cls for n in scheme_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


#: the base class is the ``none`` scheme (attention sees no position at all)
register_scheme(kind="none", group="classic", year=2022, arxiv="2305.19466", aliases=("nonepe", "nope"),
                paper="no positional information (Haviv et al. 2022; Kazemnejad et al. 2023)")(PositionScheme)


def canonical_pe(pe: str) -> str:
    """Map a name or alias to its canonical name; ``ValueError`` listing the valid names otherwise."""
    if not isinstance(pe, str):
        raise TypeError(f"pe must be a string naming a scheme, got {type(pe).__name__}")
    key = pe.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise ValueError(
            f"unknown positional encoding {pe!r}; valid choices: {', '.join(scheme_names())} "
            f"(aliases: {', '.join(f'{a}={c}' for a, c in _ALIASES.items())})"
        )
    return key


def scheme_info(pe: str) -> SchemeInfo:
    """What the registry holds for the scheme ``pe`` (a name or an alias)."""
    return _REGISTRY[canonical_pe(pe)]


def scheme_options(pe: str) -> dict[str, object]:
    """The options a scheme accepts, with their defaults."""
    cls = scheme_info(pe).cls
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
    return _REGISTRY[name].cls(d_model, n_heads, num_layers, causal, **options)
