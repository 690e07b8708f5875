"""The registry: every list of scheme names derives from the schemes' own registrations.

A new scheme is one new module (a ``PositionScheme`` subclass under ``@register_scheme``) plus its test:
the test below writes such a module, imports it, and finds it in the derived lists, in ``build_model``
and in the command lines' choices; then it unregisters it.
"""
from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest
import torch

import posenc_lib
from benchmarks.common import check_schemes
from posenc_lib import build_model, greedy_decode, set_seed
from posenc_lib.attention.layer import PositionScheme
from posenc_lib.experiments.wmt14.pipeline import parse_pes
from posenc_lib.models.causal_lm import CausalLM
from posenc_lib.schemes import registry
from posenc_lib.schemes.registry import (
    KINDS, canonical_pe, make_scheme, register_scheme, registered_schemes, scheme_info, scheme_names, scheme_options,
    temporary_scheme, unregister_scheme,
)

SMALL = dict(d_model=16, n_heads=2, num_layers=1, dim_feedforward=32, dropout=0.0)
V = 19
PAPER = dict(paper="a linear distance penalty with one learned slope per head (this test's own)", arxiv="0000.00000",
             year=2025)

#: a whole scheme module, as a maintainer would add it under posenc_lib/schemes/
TINY_MODULE = textwrap.dedent('''
    import torch
    from torch import nn

    from posenc_lib.attention.layer import PositionScheme
    from posenc_lib.schemes.registry import register_scheme


    @register_scheme(kind="bias", year=2025, arxiv="0000.00000", aliases=("tiny",),
                     paper="a linear distance penalty with one learned slope per head (this test's own)")
    class TinyBias(PositionScheme):
        """-slope_h * |i - j| added to the scores of head h."""

        name = "tiny_bias"
        enters = "scores (bias)"

        def __init__(self, d_model, n_heads, num_layers, causal=False, slope: float = 0.5):
            super().__init__(d_model, n_heads, num_layers, causal)
            self.slope = nn.Parameter(torch.full((num_layers, n_heads), float(slope)))

        def bias(self, prep, layer):
            dist = (prep["q_pos"][:, None] - prep["k_pos"][None, :]).abs().float()
            return -(self.slope[layer][:, None, None] * dist)[None]
''')


@pytest.fixture
def tiny_module(tmp_path):
    """The new scheme's module, imported (which registers it); unregistered afterwards."""
    path = tmp_path / "tiny_bias.py"
    path.write_text(TINY_MODULE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tiny_bias_scheme", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        if "tiny_bias" in registered_schemes():
            unregister_scheme("tiny_bias")
        sys.modules.pop("tiny_bias_scheme", None)


SHIPPED = ("none", "sinusoidal", "learned", "shaw", "rope", "t5", "xlnet", "deberta", "alibi",
           "xpos", "fire", "cope", "kerple")


def test_importing_the_package_registers_every_shipped_scheme_in_order():
    assert tuple(registered_schemes()) == SHIPPED == registry.ALL_TYPES == posenc_lib.ALL_TYPES
    assert registry.PE_TYPES == scheme_names("classic") == SHIPPED[:9]
    assert registry.SURVEY_TYPES == scheme_names("survey") == SHIPPED[9:]
    assert list(registry.PAPERS) == list(SHIPPED)
    for name, info in registered_schemes().items():
        assert info.cls.name == name and make_scheme(name, 16, 2, 1).name == name
        assert registry.PAPERS[name] == (info.paper, info.arxiv) and str(info.year) in info.paper
        assert all(canonical_pe(a) == name for a in info.aliases)


def test_each_kind_matches_the_hooks_its_class_overrides():
    def overrides(cls, hook):
        return getattr(cls, hook) is not getattr(PositionScheme, hook)

    expect = {"none": set(), "absolute": {"embed"}, "rotary": {"rotate"}, "bias": {"bias"},
              "relative": {"scores"}, "contextual": {"scores"}}
    assert set(expect) == set(KINDS)
    for name, info in registered_schemes().items():
        used = {h for h in ("embed", "rotate", "bias", "scores") if overrides(info.cls, h)}
        assert used == expect[info.kind], (name, info.kind, used)


def test_a_new_module_is_all_a_new_scheme_needs(tiny_module):
    cls = tiny_module.TinyBias
    # the derived lists: a new scheme joins the newer group, after the shipped ones
    assert registry.SURVEY_TYPES == SHIPPED[9:] + ("tiny_bias",) and registry.PE_TYPES == SHIPPED[:9]
    assert posenc_lib.ALL_TYPES == SHIPPED + ("tiny_bias",) and posenc_lib.PE_ALIASES["tiny"] == "tiny_bias"
    assert posenc_lib.PAPERS["tiny_bias"] == (PAPER["paper"], PAPER["arxiv"])
    assert scheme_info("TINY").cls is cls and scheme_options("tiny_bias") == {"slope": 0.5}
    # build_model: a working seq2seq model whose attention reads the bias
    set_seed(0)
    flat = build_model("tiny_bias", V, slope=0.0, **SMALL).eval()
    set_seed(0)
    none = build_model("none", V, **SMALL).eval()
    set_seed(0)
    model = build_model("tiny", V, **SMALL).eval()
    assert model.pe == "tiny_bias"
    src, tgt = torch.randint(1, V, (2, 7)), torch.randint(1, V, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(flat(src, tgt), none(src, tgt), atol=1e-5, rtol=1e-4)  # slope 0: no position
        assert not torch.allclose(model(src, tgt), none(src, tgt), atol=1e-3)
        cached = greedy_decode(model, src, max_new_tokens=6, bos_id=1, eos_id=None)
        uncached = greedy_decode(model, src, max_new_tokens=6, bos_id=1, eos_id=None, use_cache=False)
    assert cached.shape == (2, 7) and torch.equal(cached, uncached)
    model.train().loss(src, tgt, tgt).backward()
    assert model.enc_scheme.slope.grad is not None and model.enc_scheme.slope.grad.abs().sum() > 0
    lm = CausalLM(V, "tiny_bias", d_model=16, n_heads=2, num_layers=1, dim_feedforward=32)
    assert lm(torch.randint(1, V, (2, 6))).shape == (2, 6, V)
    # the command lines' choices
    assert check_schemes(["tiny_bias"]) == ("none", "tiny_bias")  # benchmarks --schemes
    assert parse_pes("tiny,rope") == ["tiny_bias", "rope"]  # experiments --pe
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['width'\] .*'tiny_bias'.*\['slope'\]"):
        build_model("tiny_bias", V, width=3, **SMALL)
    # unregistered: gone from every list, and named as unknown
    unregister_scheme("tiny_bias")
    assert registry.ALL_TYPES == posenc_lib.ALL_TYPES == SHIPPED and "tiny" not in registry.PE_ALIASES
    with pytest.raises(ValueError, match=r"unknown positional encoding 'tiny_bias'; valid choices: none, .*kerple"):
        build_model("tiny_bias", V, **SMALL)
    with pytest.raises(ValueError, match=r"unknown scheme\(s\) \['tiny_bias'\]; valid choices: none,"):
        check_schemes(["tiny_bias"])


def test_importing_a_module_again_replaces_its_own_registration(tiny_module, tmp_path):
    first = tiny_module.TinyBias
    spec = importlib.util.spec_from_file_location("tiny_bias_scheme", tmp_path / "tiny_bias.py")
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)  # what importlib.reload does: the same module and class, defined anew
    assert again.TinyBias is not first and scheme_info("tiny").cls is again.TinyBias
    assert registry.ALL_TYPES == SHIPPED + ("tiny_bias",) and registry.PE_ALIASES["tiny"] == "tiny_bias"


def _scheme(name, base=PositionScheme):
    return type(f"Scheme_{name}", (base,), {"name": name})


def test_a_classic_joins_pe_types_for_the_with_block_only():
    with temporary_scheme(_scheme("plain"), kind="none", group="classic", **PAPER):
        assert registry.PE_TYPES == SHIPPED[:9] + ("plain",) == posenc_lib.PE_TYPES
        assert registry.ALL_TYPES == SHIPPED[:9] + ("plain",) + SHIPPED[9:]
        assert build_model("plain", V, **SMALL).pe == "plain"
    assert registry.ALL_TYPES == SHIPPED
    with pytest.raises(RuntimeError, match="boom"), temporary_scheme(_scheme("plain"), kind="none", **PAPER):
        raise RuntimeError("boom")
    assert "plain" not in registered_schemes()  # unregistered on the way out of a failing block too


@pytest.mark.parametrize("name,aliases,message", [
    ("alibi", (), r"name 'alibi' is already registered, by posenc_lib\.schemes\.alibi\.ALiBi"),
    ("rotary", (), r"name 'rotary' is already registered, by posenc_lib\.schemes\.rotary\.RotaryScheme"),
    ("fresh", ("sinpe",), r"name 'sinpe' is already registered, by posenc_lib\.schemes\.sinusoidal\.Sinusoidal"),
    ("fresh", ("kerple",), r"name 'kerple' is already registered"),
    ("fresh", ("f2", "f2"), r"aliases of 'fresh' repeat a name"),
    ("fresh", ("Fresh-2",), r"aliases of 'fresh' must be lower-case .*'Fresh-2'"),
    ("No Name", (), r"needs its own class attribute name.*'No Name'"),
])
def test_a_taken_or_bad_name_is_refused(name, aliases, message):
    with pytest.raises(ValueError, match=message):
        register_scheme(kind="bias", aliases=aliases, **PAPER)(_scheme(name))
    assert tuple(registered_schemes()) == SHIPPED and registry.PE_ALIASES == posenc_lib.PE_ALIASES


def test_bad_registrations_name_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"unknown kind 'sideways'; valid choices: none, absolute, relative, bias"):
        register_scheme(kind="sideways", **PAPER)
    with pytest.raises(ValueError, match=r"unknown group 'modern'; valid choices: classic, survey"):
        register_scheme(kind="bias", group="modern", **PAPER)
    with pytest.raises(ValueError, match=r"year must be an integer year.*'2025'"):
        register_scheme(kind="bias", paper="p", arxiv="1", year="2025")
    with pytest.raises(ValueError, match="paper must be a non-empty string"):
        register_scheme(kind="bias", paper=" ", arxiv="1", year=2025)
    with pytest.raises(TypeError, match="aliases must be a tuple of names, got the string 'tb'"):
        register_scheme(kind="bias", aliases="tb", **PAPER)
    with pytest.raises(TypeError, match="decorates a PositionScheme subclass"):
        register_scheme(kind="bias", **PAPER)(torch.nn.Linear)
    inherits = type("Inherits", (make_scheme("alibi", 8, 2, 1).__class__,), {})  # no name of its own
    with pytest.raises(ValueError, match="Inherits needs its own class attribute name"):
        register_scheme(kind="bias", **PAPER)(inherits)
    with pytest.raises(ValueError, match=r"unknown positional encoding 'nothing'; valid choices: none, sinusoidal"):
        unregister_scheme("nothing")
    with pytest.raises(ValueError, match=r"unknown group 'all'; valid choices: classic, survey"):
        scheme_names("all")
    assert tuple(registered_schemes()) == SHIPPED


def test_the_views_are_copies():
    registered_schemes().clear()
    registry.PE_ALIASES.clear()
    registry.PAPERS.clear()
    assert tuple(registered_schemes()) == SHIPPED and registry.PE_ALIASES["rpe"] == "shaw"
    assert set(registry.PAPERS) == set(SHIPPED)
