"""Sphinx configuration of the course website (built by ``make book``, i.e. ``python -m book.build``).

Sphinx + myst-nb + sphinx-book-theme: registry packages only, notebooks rendered from their committed
outputs (``nb_execution_mode = "off"``), library pages by autodoc, source pages by viewcode. MathJax 3
is copied from the ``django-static-mathjax`` wheel (a plain copy of MathJax's own ``es5`` build) into
``_static/mathjax`` so that math renders with no network.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

project = "posenc"
author = "the posenc authors"
copyright = "posenc authors, MIT licence"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.viewcode", "sphinx.ext.mathjax"]
exclude_patterns = ["lessons.json", "**.ipynb_checkpoints"]
root_doc = "index"
smartquotes = False  # code-like prose (--profile, it's) stays as typed

# notebooks: committed outputs as they are
nb_execution_mode = "off"
nb_ipywidgets_js = {}  # no live kernel on a static page: no widget manager loaded from a CDN
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

# library pages
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False}

# MathJax from this site, never from a CDN
MATHJAX_BUNDLE = "tex-chtml-full.js"
mathjax_path = f"mathjax/{MATHJAX_BUNDLE}"
mathjax3_config = {"tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]]}}

html_theme = "sphinx_book_theme"
html_static_path = ["_static"]
html_css_files = ["posenc.css"]
html_title = "posenc: positional encodings in Transformers"
html_theme_options = {
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
}
html_context = {"default_mode": "light"}  # the theme logs a console error when no mode is set
html_favicon = "favicon.svg"  # also keeps the browser from asking the server for /favicon.ico
html_last_updated_fmt = None
html_copy_source = False
html_show_sourcelink = False


def _mathjax_es5() -> Path:
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MathJax not found: install the book extra (pip install -e '.[dev]')")
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (es5 / MATHJAX_BUNDLE).is_file():
        raise RuntimeError(f"{es5 / MATHJAX_BUNDLE} missing: the 'mathjax' package is not django-static-mathjax")
    return es5


def _copy_mathjax(app, exception) -> None:
    """After the build: MathJax's bundle plus the pieces it loads on demand (fonts, menu, a11y)."""
    if exception is not None or app.builder.format != "html":
        return
    es5, dest = _mathjax_es5(), Path(app.outdir) / "_static" / "mathjax"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy2(es5 / MATHJAX_BUNDLE, dest / MATHJAX_BUNDLE)
    for sub in ("output", "input", "ui", "a11y", "adaptors", "sre"):
        shutil.copytree(es5 / sub, dest / sub)


_ABS = re.compile(r"(?<![\\`|])\|(?=[^\s|`])([^|`\n]*?[^\s|`])\|(?![_|`])")
_LIST = re.compile(r"\s*([-*+] |\d+[.)] |\.\. |:\w[^:]*:|>>>)")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _plain_text_docstring(app, what, name, obj, options, lines) -> None:
    """Read the library's plain-text docstrings the way they are meant.

    * An indented block under a plain paragraph (a formula, a shape table) becomes a literal block, so
      its lines stay lines (reST would make it a block quote and join them).
    * Outside literal blocks, ``|i - j|`` is an absolute value, not a reST substitution.
    """
    out, literal_indent, para = [], None, []
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if literal_indent is not None and line.strip() and _indent(line) <= literal_indent:
            literal_indent = None
        if literal_indent is None and line.strip():
            line = line if line.lstrip().startswith("|") else _ABS.sub(r"\\|\1\\|", line)
        out.append(line)
        if line.strip():
            para.append(line)
            if literal_indent is None and line.rstrip().endswith("::"):
                literal_indent = _indent(line)
            continue
        # a blank line: does an indented block follow a plain paragraph?
        if (literal_indent is None and para and nxt.strip() and _indent(nxt) > _indent(para[-1])
                and _indent(para[0]) == _indent(para[-1]) and not any(_LIST.match(p) for p in para)
                and not _LIST.match(nxt)):
            out += [" " * _indent(para[-1]) + "::", ""]
            literal_indent = _indent(para[-1])
        para = []
    lines[:] = out


def setup(app):
    _mathjax_es5()  # fail early, before any page is written
    app.connect("autodoc-process-docstring", _plain_text_docstring)
    app.connect("build-finished", _copy_mathjax)
