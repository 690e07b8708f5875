"""The library's layout: folders that name its parts, imports that run one way, no circles.

The import graph is read from the source with ``ast`` (nothing is imported), with every import
counted, including the ones inside functions: a circle that only closes at run time is still a
circle a reader has to untangle. Importing ``a.b.c`` also runs ``a/b/__init__.py``, so it counts as
importing the package ``a.b`` too (unless ``a.b`` contains the importing module): a package whose
``__init__`` imports a module that imports the package back is a circle as well.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "posenc_lib"

#: the parts, lowest first: a module may import from its own part or a lower one, never a higher one
LAYERS = ("utils", "attention", "schemes", "kernels", "models", "experiments", "course")
#: the top-level modules of the lowest part (checks, files, worker pool, command-line pieces, ...)
BASE = ("checks", "cli", "files", "pool", "seeds", "stats", "utils")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def library_modules(lib: Path = LIB) -> dict[str, Path]:
    return {module_name(p, lib.parent): p for p in sorted(lib.rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The library modules ``name`` imports (the module itself, or ``X.y`` when ``from X import y``
    names a submodule)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == name.split(".")[0]}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != name.split(".")[0]:
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            if subs and len(subs) == len(node.names):
                found |= set(subs)
            else:
                found.add(target)
                found |= set(subs)
    # importing a.b.c runs the __init__ of a.b first: a package the importer does not sit in is imported too
    parents = {".".join(m.split(".")[:k]) for m in found for k in range(2, m.count(".") + 1)}
    found |= {p for p in parents if not name.startswith(p + ".")}
    return {m for m in found if m in modules and m != name}


def import_graph(lib: Path = LIB) -> dict[str, set[str]]:
    modules = library_modules(lib)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in BASE:
        return 0
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_library_has_no_import_cycle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_cycle_finder_finds_a_circle():
    # the check above can fail: the two circles the flat layout had
    assert find_cycle({"a": {"c"}, "c": {"s"}, "s": {"a"}}) == ["a", "c", "s", "a"]
    assert find_cycle({"wmt14": {"calibrate"}, "calibrate": {"wmt14"}}) == ["calibrate", "wmt14", "calibrate"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_graph_finds_circles_in_source(tmp_path):
    """The graph built from source shows a circle closed by an import inside a function, and one closed by a
    package's ``__init__`` (importing ``pkg.sub.a`` runs ``pkg/sub/__init__.py``); a one-way package has none."""
    lazy = _package(tmp_path / "lazy", {"__init__.py": "", "a.py": "from .b import f\n",
                                        "b.py": "def f():\n    from .a import g\n"})
    assert find_cycle(import_graph(lazy)) == ["pkg.a", "pkg.b", "pkg.a"]
    through_init = _package(tmp_path / "init", {
        "__init__.py": "", "x.py": "def g():\n    from .sub.a import h\n",
        "sub/__init__.py": "from .b import k\n", "sub/a.py": "", "sub/b.py": "from ..x import g\n"})
    assert "pkg.sub" in import_graph(through_init)["pkg.x"]
    assert find_cycle(import_graph(through_init)) == ["pkg.sub", "pkg.sub.b", "pkg.x", "pkg.sub"]
    one_way = _package(tmp_path / "ok", {"__init__.py": "from .sub import b\n", "x.py": "",
                                         "sub/__init__.py": "from . import b\n", "sub/b.py": "from ..x import *\n"})
    assert find_cycle(import_graph(one_way)) is None


def test_imports_run_one_way():
    """utils <- attention <- schemes <- kernels <- models <- experiments <- course: nothing imports a higher part
    (in particular the attention package never imports a scheme; the scheme kernels register with it)."""
    wrong = []
    for module, targets in import_graph().items():
        here = layer_of(module)
        if here is None:
            continue
        wrong += [f"{module} imports {t}" for t in targets if (layer_of(t) or 0) > here]
    assert not wrong, wrong


def test_graph_reads_relative_imports():
    graph = import_graph()
    assert "posenc_lib.attention.cpu_flash" in graph["posenc_lib.schemes.shaw"]
    assert "posenc_lib.attention.layer" in graph["posenc_lib.schemes.rotary"]  # imported inside the module
    assert "posenc_lib.experiments.wmt14.pipeline" in graph["posenc_lib.experiments.wmt14.calibrate"]
    assert "posenc_lib.experiments.wmt14.pipeline" not in graph["posenc_lib.experiments.wmt14.train"]
    # the character LM reads the shipped text through wmt14.data, which runs the wmt14 package's __init__
    assert "posenc_lib.experiments.wmt14" in graph["posenc_lib.experiments.charlm"]
    # a module never counts the package it sits in
    assert "posenc_lib.experiments.wmt14" not in graph["posenc_lib.experiments.wmt14.calibrate"]


def test_folders_name_the_parts():
    """Every module sits in a part of the library (only the lowest part's modules and the package's ``__init__``
    at the top)."""
    top = sorted(p.name for p in LIB.glob("*.py"))
    assert top == ["__init__.py", *sorted(f"{m}.py" for m in BASE)]
    assert sorted(p.name for p in LIB.iterdir() if p.is_dir() and not p.name.startswith("__")) == sorted(LAYERS[1:])
    assert all((LIB / part / "__init__.py").is_file() for part in LAYERS[1:])  # each part a package


@pytest.mark.parametrize("name", ["attention.layer", "attention.cpu_flash", "schemes.rotary", "schemes.registry",
                                  "models.causal_lm", "experiments.wmt14.pipeline", "experiments.cope_counting",
                                  "course.scorecard"])
def test_modules_stay_small(name):
    lines = (LIB / (name.replace(".", "/") + ".py")).read_text(encoding="utf-8").count("\n")
    assert lines < 900, f"{name}: {lines} lines"


def _documents() -> list[Path]:
    """The files whose text names modules, commands and files: README, lessons, library, tests, tools, docs."""
    return [ROOT / "README.md", ROOT / "Makefile", ROOT / "data" / "SOURCES.md", *(ROOT / "notebooks").glob("*.ipynb"),
            *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("*.md"),
            *(ROOT / "scripts").iterdir(), *(ROOT / "book").glob("*.py"), *LIB.rglob("*.py")]


def test_results_hold_data_not_code():
    """Experiment entry points live in the library or scripts/, never under results/, and nothing points at a
    script there (a lesson names the ``python -m`` command that made its results)."""
    assert not [p.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("*.py")]
    pattern = re.compile(r"results/[\w./-]*\.py\b")
    bad = [f"{path.relative_to(ROOT)}:{i}: {m.group(0)}" for path in _documents() if path != Path(__file__)
           for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) for m in pattern.finditer(line)]
    assert not bad, bad


def test_readme_links_to_library_files_say_which_file():
    """A README link into posenc_lib is labelled with the file it opens (``layer.py`` or ``attention/layer.py``),
    not with the name of a module that moved (``attention.py`` for ``attention/layer.py``)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\[`?([^\]`]+?)`?\]\((posenc_lib/[\w/]+\.py)\)", readme)
    assert len(links) >= 20
    wrong = [f"[{label}]({target})" for label, target in links
             if label.endswith(".py") and not target.endswith("/" + label.removeprefix("posenc_lib/"))]
    assert not wrong, wrong


def test_public_names_still_import_from_the_package():
    import posenc_lib

    for name in posenc_lib.__all__:
        assert getattr(posenc_lib, name) is not None


def test_no_old_module_paths_in_the_tree():
    """Commands, imports and links name the new module paths (the flat modules are gone)."""
    flat = ("absolute|alibi|beam|calibrate|complex_order|cpu_flash|data|deberta|decoding|evaluate|explorers|extrapolation|"
            "flex|floater|longctx|model|notebook|rope_scaling|rotary|scorecard|shaw|sinusoidal|t5|tokenizer|train|twod|"
            "urpe|wmt14|xlnet")
    # attention and schemes are packages now: only their old file paths are stale
    pattern = re.compile(rf"posenc_lib[./](?:(?:{flat})\b(?!-)|(?:attention|schemes)\.py\b)")
    bad = []
    for path in _documents():
        if path == Path(__file__):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in pattern.finditer(line):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)}")
    assert not bad, bad[:20]


#: the folders of Python code whose imports of each other's names are checked
CODE_FOLDERS = ("posenc_lib", "benchmarks", "scripts", "tests")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _absolute(module: str | None, level: int, path: Path, root: Path) -> str:
    """The absolute module name of ``from <level dots><module> import ...`` written in ``path``."""
    if not level:
        return module or ""
    package = module_name(path, root).split(".")
    package = package if path.name == "__init__.py" else package[:-1]
    base = package[: len(package) - level + 1]
    return ".".join(base + ([module] if module else []))


def private_uses(path: Path, root: Path = ROOT, packages: tuple[str, ...] = CODE_FOLDERS) -> list[str]:
    """``file:line: what`` for each private name ``path`` takes from another module of ``packages``: ``from M import
    _x``, ``m._x`` (or ``setattr(m, "_x", ...)``, as monkeypatch does) where ``m`` was imported from one of them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = module_name(path, root)
    ours = lambda name: name.split(".")[0] in packages  # noqa: E731
    bound, found = set(), []
    report = lambda node, what: found.append(f"{path.relative_to(root)}:{node.lineno}: {what}")  # noqa: E731
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node.module, node.level, path, root)
            if not ours(source) or source == own:
                continue
            for a in node.names:
                if _private(a.name):
                    report(node, f"from {source} import {a.name}")
                else:
                    bound.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if ours(a.name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            while isinstance(value, ast.Attribute) and not _private(value.attr):  # posenc_lib.schemes.deberta._x
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                report(node, f"{ast.unparse(node.value)}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "setattr", "delattr", "setitem") and len(node.args) >= 2 and isinstance(node.args[0], ast.Name)
              and node.args[0].id in bound and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            report(node, f"{node.func.attr}({node.args[0].id}, {node.args[1].value!r})")
    return sorted(found, key=lambda use: int(use.split(":")[1]))


def test_no_private_name_is_taken_from_another_module():
    """Tests, benchmarks, scripts and the library use each other's public names only: what a test needs of a
    module is public (and documented), a private helper stays inside its module."""
    found = [use for folder in CODE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
             for use in private_uses(path)]
    assert not found, "private names used outside their module:\n" + "\n".join(found)


def test_private_uses_are_found(tmp_path):
    pkg = _package(tmp_path, {"posenc_lib/__init__.py": "", "posenc_lib/a.py": "def _x(): pass\n_y = 1\n"})
    test = pkg / "tests" / "test_a.py"
    test.parent.mkdir()
    test.write_text("from posenc_lib.a import _x\nfrom posenc_lib import a\nimport torch\n\n"
                    "def test(monkeypatch):\n    a._y, torch._C, a.__doc__\n    monkeypatch.setattr(a, '_y', 2)\n")
    lib = pkg / "posenc_lib" / "b.py"
    lib.write_text("from .a import _x\nfrom . import a as other\nother._y\n")
    assert private_uses(test, pkg) == ["tests/test_a.py:1: from posenc_lib.a import _x", "tests/test_a.py:6: a._y",
                                       "tests/test_a.py:7: setattr(a, '_y')"]
    assert private_uses(lib, pkg) == ["posenc_lib/b.py:1: from posenc_lib.a import _x", "posenc_lib/b.py:3: other._y"]
