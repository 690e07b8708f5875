"""Build the course website from the committed, executed notebooks (no notebook is re-run).

    python -m book.build            # or: make book
    python -m book.build --out DIR  # default: build/book

Steps: (1) write a Sphinx source tree under ``OUT/src``: the README as the home page, one page per
notebook in ``notebooks/*.ipynb`` (a copy with a "Run it" box after its title and links to the
library pages it uses), one page per ``posenc_lib`` module from its docstrings, grouped in the sidebar by
the library's parts (schemes, attention, models, experiments, course helpers), and the Markdown
files the README links to; (2) run Sphinx with ``book/conf.py`` into ``OUT/html``, a static folder
ready for GitHub Pages (it contains ``.nojekyll``; MathJax is served from the site itself, so the
pages render offline).

Every build starts ``OUT/src`` and ``OUT/html`` from scratch, so it replaces them: only when they were
made by an earlier build (``OUT/.posenc-book`` records that), never a folder of something else, unless
``--overwrite``.  ``OUT`` is locked while the build writes it.
"""
from __future__ import annotations

import ast
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
DEFAULT_OUT = ROOT / "build" / "book"
#: the file that marks a folder as a book build's output (what a rebuild may replace)
MARKER = ".posenc-book"
#: what a build writes in OUT (and so replaces on a rebuild)
OUTPUTS = ("src", "html", "doctrees", "warnings.txt")

#: Markdown files outside the notebooks that the README or the lessons link to: repo path -> page name.
WIDGET = "application/vnd.jupyter.widget-view+json"
EXTRA_PAGES = {"benchmarks/README.md": "benchmarks", "benchmarks/results/table.md": "benchmarks_table",
               "results/README.md": "results", "scripts/README.md": "scripts", "data/SOURCES.md": "data_sources"}
NBVAL = ".venv/bin/python -m pytest -q --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg"
# offline, as make test runs them
EXECUTE = ("HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/jupyter nbconvert --to notebook --execute --inplace "
           "--ExecutePreprocessor.timeout=1800")


def lessons(root: Path = ROOT) -> list[Path]:
    """Every lesson notebook, in course order (by file name)."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


#: the library's parts in the order the sidebar lists them (a folder of posenc_lib, or a top-level module)
PARTS = ("schemes", "attention", "kernels", "models", "experiments", "course", "checks", "seeds", "files", "pool", "cli",
         "stats", "utils")


def modules(root: Path = ROOT) -> list[str]:
    """Dotted names of the library's modules below ``posenc_lib`` (``"schemes.rotary"``; no ``__init__`` or
    ``__main__``), sorted."""
    lib = root / "posenc_lib"
    return sorted(".".join(p.relative_to(lib).with_suffix("").parts) for p in lib.rglob("*.py")
                  if p.stem not in ("__init__", "__main__"))


def module_path(name: str, root: Path = ROOT) -> Path:
    """``"schemes.rotary"`` -> ``posenc_lib/schemes/rotary.py``."""
    return root / "posenc_lib" / (name.replace(".", "/") + ".py")


def parts(root: Path = ROOT) -> list[tuple[str, str, list[str]]]:
    """``(part, one-line purpose, modules)`` for each part of the library, in sidebar order; a part's modules
    in course order (the first lesson a module's docstring names), then by name."""
    names = modules(root)
    out = []
    for part in PARTS:
        mods = [m for m in names if m == part or m.startswith(part + ".")]
        init = root / "posenc_lib" / part / "__init__.py"
        summary = module_summary(init if init.is_file() else module_path(part, root))
        first = {m: (lessons_of_module(module_path(m, root)) or ["99"])[0] for m in mods}
        out.append((part, summary, sorted(mods, key=lambda m: (first[m], m))))
    missing = set(names) - {m for _, _, mods in out for m in mods}
    if missing:
        raise ValueError(f"modules outside every part of PARTS: {sorted(missing)}")
    return out


def module_summary(path: Path) -> str:
    """First line of a module's docstring (empty if it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def lessons_of_module(path: Path) -> list[str]:
    """Lesson numbers (``"06"``) a module's docstring names as ``notebooks/NN…``."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    found = set()
    for first, last in re.findall(r"notebooks/(\d\d)(?:[-\u2013](\d\d)\b)?", doc):  # "notebooks/05-10" is a range
        found.update(f"{n:02d}" for n in range(int(first), int(last or first) + 1))
    return sorted(found)


def _rewrite_links(text: str, prefix: str, names: set[str], base: str | None = None) -> str:
    """Point Markdown links at repository files to their pages in the site.

    ``prefix`` is the path from the page to the site's root (``""`` or ``"../"``); links are given
    relative to the page's repository folder, so ``../posenc_lib/x.py`` (a lesson) and
    ``posenc_lib/x.py`` (the README) both become the page for module ``x``.  ``base``, the page's folder
    in the repository (``"results"`` for ``results/README.md``), resolves a link exactly; without it a
    link is read from the repository's root once its leading ``../`` are dropped.
    """

    def repl(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        path, _, anchor = target.partition("#")
        if base is None:
            norm = re.sub(r"^(\.\./)+|^\./", "", path)
        else:
            norm = os.path.normpath(os.path.join(base, path)).replace(os.sep, "/") if path else ""
        if re.match(r"posenc_lib/[\w/]+\.py$", norm):
            mod = norm[len("posenc_lib/"):-3].replace("/", ".")
            if mod in names:
                return f"[{label}]({prefix}api/{mod}.md)"
        if re.match(r"notebooks/\d\d_\w+\.ipynb$", norm):
            return f"[{label}]({prefix}lessons/{norm[len('notebooks/'):]})"
        if norm in EXTRA_PAGES:
            return f"[{label}]({prefix}{EXTRA_PAGES[norm]}.md{'#' + anchor if anchor else ''})"
        return m.group(0)

    return re.sub(r"\[([^\]\n]*)\]\(([^)\s]+)\)", repl, text)


# spans where no link may be added: headings, code, math, existing links and images, HTML
_PROTECTED = re.compile(r"(^[ \t]*#[^\n]*$|```.*?```|`[^`\n]*`|\$\$.*?\$\$|\$[^$\n]*\$|!?\[[^\]\n]*\]\([^)\n]*\)"
                        r"|<a\b.*?</a>|<[^>\n]*>)", re.S | re.M)  # fmt: skip


def _link_lesson_mentions(text: str, pages: dict[str, str], prefix: str) -> str:
    """Turn "lesson 06" in prose into a link to lesson 06's page (not in headings, code, math or links)."""

    def link(m: re.Match) -> str:
        page = pages.get(m.group(2))
        return f"[{m.group(1)} {m.group(2)}]({prefix}{page})" if page else m.group(0)

    parts = _PROTECTED.split(text)  # odd items are the protected spans
    return "".join(p if i % 2 else re.sub(r"\b([Ll]esson) (\d\d)\b", link, p) for i, p in enumerate(parts))


def _reproduce_commands(nb: dict) -> list[str]:
    """Experiment commands (``python -m posenc_lib.…``) quoted in a notebook's Markdown."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            line = line.strip().strip("`")
            if line.startswith("python -m posenc_lib.") and line not in found:
                found.append(line)
    return found


def _modules_used(nb: dict, names: set[str]) -> list[str]:
    """Library modules a notebook's code imports, in order of first use (not the setup helpers)."""
    used = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            for dotted in re.findall(r"posenc_lib\.([\w.]+)", "".join(cell["source"])):
                mod = _known_prefix(dotted, names)
                if mod and mod not in used and mod not in ("course.notebook", "utils"):
                    used.append(mod)
    return used


def _known_prefix(dotted: str, names: set[str]) -> str | None:
    """The longest prefix of ``dotted`` that names a module page (``"schemes.urpe.URPE"`` -> ``"schemes.urpe"``);
    a package (``"experiments.wmt14"``) stands for its ``pipeline`` module when it has one."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in names:
            return head
        if f"{head}.pipeline" in names:
            return f"{head}.pipeline"
    return None


def run_it_box(name: str, nb: dict, names: set[str], teaching: dict[str, list[str]]) -> str:
    """The box at the top of each lesson page: how to open it and reproduce its committed outputs."""
    lines = [
        "````{admonition} Run it",
        ":class: tip",
        "",
        f"`make lab` → `notebooks/{name}`",
        "",
        "Reproduce the committed outputs (from the repository root; `make lab` or `make env` creates `.venv`):",
        "",
        "```bash",
        "# re-run it top to bottom in a fresh kernel",
        f"{EXECUTE} \\\n    notebooks/{name}",
        "# compare a fresh run with the committed outputs",
        f"{NBVAL} \\\n    notebooks/{name}",
    ]
    for cmd in _reproduce_commands(nb):
        lines += ["# the experiment whose committed results it shows", f".venv/bin/{cmd}"]
    lines.append("```")
    used = _modules_used(nb, names)
    number = name[:2]
    for mod, nums in teaching.items():
        if number in nums and mod not in used:
            used.append(mod)
    if used:
        lines += ["", "Library: " + ", ".join(f"[{m.replace('.', '/')}.py](../api/{m}.md)" for m in used)]
    lines += ["````"]  # the box holds a fenced block, so its own fence has four backticks
    return "\n".join(lines) + "\n"


def write_lesson(src: Path, dst: Path, names: set[str], teaching: dict[str, list[str]], pages: dict[str, str]) -> str:
    """Copy one notebook to the site with its "Run it" box; returns its title."""
    nb = json.loads(src.read_text(encoding="utf-8"))
    first = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    text = "".join(first["source"])
    title_line, _, rest = text.partition("\n")
    if not title_line.startswith("# "):
        raise ValueError(f"{src.name}: the first Markdown cell must start with a '# ' title, got {title_line!r}")
    box = run_it_box(src.name, nb, names, teaching)
    first["source"] = title_line + "\n\n" + box + "\n" + rest
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = _rewrite_links("".join(cell["source"]), "../", names)
            if cell is not first:  # the title and the Run it box stay as they are
                text = _link_lesson_mentions(text, pages, "")
            cell["source"] = _link_repo_files(text, dst.parent.parent, src.parent, "../")
    nb.get("metadata", {}).pop("widgets", None)  # no live kernel on a static site
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET in data:  # an explorer: say what it offers instead of an empty widget
                text = html.escape("".join(data.get("text/plain", "")))
                out["data"] = {"text/html": f'<p class="explorer-note"><em>{text}</em>: sliders when you run this '
                               "notebook (<code>make lab</code>); the figure above shows the default setting.</p>"}
    dst.write_text(json.dumps(nb, ensure_ascii=False, indent=1), encoding="utf-8")
    return title_line[2:].strip()


def foreign_outputs(out: Path) -> list[Path]:
    """What a build would replace in ``out`` that no earlier build made: ``src``, ``html``, ``doctrees`` and
    ``warnings.txt`` of a folder without the marker (or, for a build made before the marker, without its
    traces: ``src/lessons.json``, ``html/.nojekyll``)."""
    out = Path(out)
    if (out / MARKER).is_file():
        return []
    legacy = (out / "src" / "lessons.json").is_file() and (out / "html" / ".nojekyll").is_file()
    return [] if legacy else [out / name for name in OUTPUTS if os.path.lexists(out / name)]


def write_sources(out: Path) -> Path:
    """Write the Sphinx source tree under ``out/src`` and return it."""
    src = out / "src"
    if src.exists():
        shutil.rmtree(src)  # build() has checked that an earlier build made it
    (src / "lessons").mkdir(parents=True)
    (src / "api").mkdir()
    names = set(modules())
    teaching = {m: lessons_of_module(module_path(m)) for m in sorted(names)}

    pages = {nb.name[:2]: nb.name for nb in lessons()}
    titles = [write_lesson(nb, src / "lessons" / nb.name, names, teaching, pages) for nb in lessons()]
    for m in sorted(names):
        nums = teaching[m]
        taught = {p.name[:2]: p for p in lessons()}
        links = [f"[lesson {n}](../lessons/{taught[n].name})" for n in nums if n in taught]
        path = m.replace(".", "/")
        page = [f"# {path}.py", ""]
        if links:
            page += ["Taught in " + ", ".join(links) + ".", ""]
        page += [
            f'Source: <a href="../_modules/posenc_lib/{path}.html"><code>posenc_lib/{path}.py</code></a> '
            "(highlighted, with links back to each documented name).",
            "",
            f"```{{eval-rst}}\n.. automodule:: posenc_lib.{m}\n   :members:\n   :show-inheritance:\n```",
            "",
        ]
        (src / "api" / f"{m}.md").write_text("\n".join(page), encoding="utf-8")

    for repo_path, page in EXTRA_PAGES.items():
        text = _rewrite_links((ROOT / repo_path).read_text(encoding="utf-8"), "", names, os.path.dirname(repo_path))
        text = _link_repo_files(text, src, (ROOT / repo_path).parent, "")
        (src / f"{page}.md").write_text(text, encoding="utf-8")

    readme = _rewrite_links((ROOT / "README.md").read_text(encoding="utf-8"), "", names, "")
    readme = _link_lesson_mentions(_link_repo_files(readme, src), pages, "lessons/")
    toc = ["", "```{toctree}", ":hidden:", ":caption: Lessons", ""]
    toc += [f"lessons/{nb.stem}" for nb in lessons()]
    for part, summary, mods in parts():
        label = f"posenc_lib/{part}/" if (ROOT / "posenc_lib" / part).is_dir() else f"posenc_lib/{part}.py"
        toc += ["```", "", "```{toctree}", ":hidden:", f":caption: {label} · {summary.rstrip('.')}", ""]
        toc += [f"api/{m}" for m in mods]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: More", ""]
    toc += list(EXTRA_PAGES.values()) + ["```", ""]
    (src / "index.md").write_text(readme + "\n" + "\n".join(toc), encoding="utf-8")
    (src / "lessons.json").write_text(json.dumps({nb.stem: t for nb, t in zip(lessons(), titles)}, indent=1))
    return src


def _link_repo_files(text: str, src: Path, base: Path = ROOT, prefix: str = "") -> str:
    """Copy repository files a page links to (figures, results, tests) into the site so the links resolve.

    ``base`` is the folder the links are relative to (the page's folder in the repository) and
    ``prefix`` the path from the page to the site's root.
    """

    def repl(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"[a-z]+:|#|/", target) or target.split("#")[0].endswith((".md", ".ipynb")):
            return m.group(0)
        path = (base / target.split("#")[0]).resolve()
        if path.is_file() and ROOT in path.parents:
            rel = path.relative_to(ROOT).as_posix()
            dest = src / "files" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
            return f"{m.group(1)}({prefix}files/{rel})"
        return m.group(0)

    return re.sub(r"(!?\[[^\]\n]*\])\(([^)\s]+)\)", repl, text)


def build(out: Path = DEFAULT_OUT, quiet: bool = True, overwrite: bool = False) -> Path:
    """Write the sources and run Sphinx; returns the HTML folder (``out/html``).

    ``FileExistsError`` (before anything is written) if ``out`` holds a ``src``, ``html``, ``doctrees`` or
    ``warnings.txt`` that no earlier build made, unless ``overwrite``.
    """
    from posenc_lib.files import FolderLock

    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder")
    foreign = [] if overwrite else foreign_outputs(out)
    if foreign:
        raise FileExistsError(f"--out {out} holds {', '.join(p.name for p in foreign)}, not made by python -m "
                              "book.build, which a build replaces; give a new or empty folder, or pass --overwrite")
    with FolderLock(out, what="--out folder"):
        (out / MARKER).write_text("made by python -m book.build: src/, html/, doctrees/ and warnings.txt are "
                                  "replaced by the next build\n", encoding="utf-8")
        return _build(out, quiet)


def _build(out: Path, quiet: bool) -> Path:
    t0 = time.perf_counter()
    src = write_sources(out)
    html = out / "html"
    if html.exists():
        shutil.rmtree(html)  # every build from scratch: nothing stale is published
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-E", "-a", "-c", str(BOOK), "-d", str(out / "doctrees"),
           str(src), str(html), "-w", str(out / "warnings.txt")]
    if quiet:
        cmd.append("-q")
    subprocess.run(cmd, check=True, cwd=ROOT)
    (html / ".nojekyll").touch()
    print(f"book: {html} ({time.perf_counter() - t0:.0f} s)")
    return html


def main(argv: list[str] | None = None) -> None:
    from posenc_lib.cli import CliParser  # a bad flag is one line, exit status 2

    ap = CliParser(prog="python -m book.build", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: build/book)")
    ap.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    ap.add_argument("--overwrite", action="store_true", help="replace OUT/src, OUT/html, OUT/doctrees and "
                                                            "OUT/warnings.txt even if no earlier build made them")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        ap.error(f"--out {args.out} is a file; give a folder")
    try:
        build(args.out, quiet=not args.verbose, overwrite=args.overwrite)
    except (FileExistsError, ValueError) as err:
        ap.error(str(err))
    except KeyboardInterrupt:
        print(f"interrupted: {args.out} holds a partial build; run the same command again to build it",
              file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
