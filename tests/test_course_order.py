"""The course order: lessons 01-16, then the finale as 17, and every reference to a lesson.

Reads the notebooks and the README as text; nothing is executed. Three kinds of checks:

* the notebook files are exactly the lessons of the course order, each titled with its own number, and the
  README's lesson table lists the same lessons (a lesson listed in ``COMING`` is marked as coming there, with no
  notebook yet; none is today);
* every Markdown link to a notebook, and every notebook file name quoted in the notebooks, the README or the
  tests, names a file that exists;
* every "lesson NN" / "notebook NN" / "lessons NN-MM" in the notebooks and the README names a lesson that
  exists (a coming one only where the sentence says it is coming), and a sentence that names a lesson and a
  topic of another lesson (say "lesson 11" next to a reversal task, which lesson 13 trains) must name that
  lesson too: that is how a number left over from an older course order shows up. The same check reads the
  other Markdown pages of the site; the code, stored outputs, tests and scripts are checked for numbers of
  lessons that do not exist.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

COURSE = [
    "01_why_position",
    "02_integer_and_binary",
    "03_sinusoidal",
    "04_learned_positions",
    "05_relative_shaw",
    "06_rope",
    "07_t5_bias",
    "08_transformer_xl_xlnet",
    "09_deberta",
    "10_alibi",
    "11_beyond_the_classics",
    "12_cost",
    "13_length_extrapolation",
    "14_long_context",
    "15_rope_in_llms",
    "16_inside_a_trained_model",
    "17_finale_wmt14",
]
#: lessons announced in the README but not written yet: number -> title (none today; lesson 16 was the last)
COMING: dict[int, str] = {}
FINALE = 17

#: Words that belong to one lesson's topic (matched case-insensitively). A sentence that names some lesson
#: and one of these words must also name the lesson the word belongs to (or sit in that lesson's notebook).
TOPICS = {
    11: ("URPE", "Universal RPE", "FLOATER", "complex-order", "complex order", "axial RoPE", "2-D grid",
         "2-D positions", "image patches", "Kerple", "contextual position", "cope_counting"),
    12: ("benchmark", "make bench", "cpu_flash", "what each scheme costs", "what each costs"),
    13: ("extrapolation", "reversal task", "reversal trained", "solve reversal", "reverse sequences", "train short, test long", "exact match", "unseen lengths",
         "past the lengths", "on longer ones"),
    14: ("long context", "long-context", "YaRN", "NTK", "Position Interpolation", "rope_scaling", "longctx", "rescaling"),
    15: ("p-RoPE", "M-RoPE", "LongRoPE", "latent attention"),
    16: ("attention sink", "StreamingLLM", "rolling cache", "linear probe"),
    17: ("WMT14", "finale", "BLEU", "translation"),
}

MENTION = re.compile(r"\b(?:[Ll]essons?|[Nn]otebooks?)\s+(\d\d(?:(?:\s*(?:,|–|-|\bto\b|\band\b|\bor\b)\s*)+\d\d)*)\b")
LINK = re.compile(r"\]\(([^)\s]*?\.ipynb)(?:#[^)\s]*)?\)")
FILE_NAME = re.compile(r"\b\d\d_[A-Za-z0-9_]+\.ipynb\b")


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _markdown(path: Path) -> str:
    return "\n\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")


def _readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def _existing() -> set[int]:
    return {int(p.name[:2]) for p in _notebooks() if re.match(r"\d\d_", p.name)}


def mentioned(text: str) -> list[set[int]]:
    """The lessons each "lesson(s)/notebook(s) NN ..." in ``text`` names: "lessons 02–04" is 2, 3, 4."""
    found = []
    for m in MENTION.finditer(text):
        tokens = re.findall(r"\d\d|–|-|\bto\b", m.group(1))
        numbers, i = set(), 0
        while i < len(tokens):
            if i + 2 < len(tokens) and tokens[i + 1] in ("–", "-", "to"):
                numbers.update(range(int(tokens[i]), int(tokens[i + 2]) + 1))
                i += 3
            else:
                numbers.add(int(tokens[i]))
                i += 1
        found.append(numbers)
    return found


def sentences(text: str) -> list[str]:
    """Split Markdown into sentences: every line of a code block, every table row, heading and list item on
    its own, prose at sentence ends."""
    out = []
    parts = re.split(r"(```.*?```)", text, flags=re.S)
    for i, part in enumerate(parts):
        if i % 2:  # a fenced code block
            out += part.splitlines()
            continue
        for block in re.split(r"\n(?=\s*(?:#|\||[-*]\s|\d+\.\s))|\n\s*\n", part):
            out += re.split(r"(?<=[.!?])\s+(?=[A-Z*(\[`\"])", block)
    return [" ".join(s.split()) for s in out if s.strip()]


def topic_errors(text: str, own: int | None = None) -> list[str]:
    """Sentences whose lesson numbers do not fit what they talk about (see the module docstring)."""
    existing = _existing()
    errors = []
    for sentence in sentences(text):
        groups = mentioned(sentence)
        if not groups:
            continue
        named = set().union(*groups)
        for n in sorted(named - existing):
            if n in COMING and "coming" in sentence.lower():
                continue
            errors.append(f"lesson {n:02d} does not exist: {sentence!r}")
        present = named | ({own} if own else set())
        for lesson, words in TOPICS.items():
            hits = [w for w in words if w.lower() in sentence.lower()]
            if hits and lesson not in present:
                errors.append(f"names lesson(s) {sorted(named)} but talks about {hits[0]!r} (lesson {lesson}) "
                              f"without naming lesson {lesson}: {sentence!r}")
    return errors


# ---------------------------------------------------------------- (a) the course order


def test_notebooks_are_lessons_01_to_16_then_the_finale():
    names = [p.stem for p in _notebooks()]
    assert names == COURSE, f"notebooks/ holds {names}"
    numbers = [int(n[:2]) for n in names]
    assert numbers == list(range(1, FINALE + 1))
    assert "finale" in names[-1] and numbers[-1] == max(numbers)
    assert not set(COMING) & set(numbers), f"lessons {sorted(COMING)} are coming: no notebook yet"


@pytest.mark.parametrize("name", COURSE)
def test_each_lesson_is_titled_with_its_number(name):
    cells = _cells(NOTEBOOKS / f"{name}.ipynb")
    title = "".join(cells[0]["source"]).splitlines()[0]
    assert cells[0]["cell_type"] == "markdown" and title.startswith(f"# {name[:2]} · "), title
    headings = [line for c in cells if c["cell_type"] == "markdown" for line in "".join(c["source"]).splitlines()
                if line.startswith("## ")]
    for needed in ("## Summary", "## Exercises"):
        assert any(h.startswith(needed) for h in headings), f"{name}: no {needed!r}"
    assert "Solutions" in json.dumps(cells), f"{name}: no solutions"


def _lesson_rows() -> dict[int, str]:
    section = _readme().split("\n## Lessons\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d\d)\s*\|", line)
        if m:
            rows[int(m.group(1))] = line
    return rows


def test_readme_lists_every_lesson_and_the_coming_ones():
    rows = _lesson_rows()
    assert list(rows) == list(range(1, FINALE + 1)), f"README lesson table rows: {list(rows)}"
    for name in COURSE:
        row = rows[int(name[:2])]
        assert f"](notebooks/{name}.ipynb)" in row, f"README row {name[:2]} does not link {name}.ipynb: {row}"
        assert "coming" not in row.lower(), row
    for n, title in COMING.items():
        assert "coming" in rows[n].lower() and title in rows[n] and ".ipynb" not in rows[n], rows[n]
    intro = " ".join(_readme().split("\n## ", 1)[0].split())
    if COMING:
        assert "coming" in intro and all(title in intro for title in COMING.values()), "the README's intro"
    else:
        assert "coming" not in intro, "the README's intro announces a lesson that is here"


# ---------------------------------------------------------------- (b) links and file names


def _texts_with_links():
    for path in _notebooks():
        yield path.name, NOTEBOOKS, _markdown(path)
    yield "README.md", ROOT, _readme()


def test_every_markdown_link_to_a_notebook_resolves():
    checked = 0
    for name, base, text in _texts_with_links():
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://")):
                continue
            assert (base / target).resolve().is_file(), f"{name} links to missing {target}"
            checked += 1
    assert checked >= len(COURSE)  # the README's table alone links every lesson


def test_every_quoted_notebook_file_name_exists():
    sources = [(p.name, p.read_text(encoding="utf-8")) for p in _notebooks()]
    sources.append(("README.md", _readme()))
    sources += [(p.name, p.read_text(encoding="utf-8")) for p in sorted((ROOT / "tests").glob("*.py"))]
    existing = {p.name for p in _notebooks()}
    for name, text in sources:
        missing = sorted(set(FILE_NAME.findall(text)) - existing)
        assert not missing, f"{name} names notebooks that do not exist: {missing}"


# ---------------------------------------------------------------- (c) lesson numbers in prose


@pytest.mark.parametrize("name", COURSE)
def test_lesson_mentions_in_a_notebook_fit_the_course_order(name):
    errors = topic_errors(_markdown(NOTEBOOKS / f"{name}.ipynb"), own=int(name[:2]))
    assert not errors, "\n".join(errors)


def test_lesson_mentions_in_the_readme_fit_the_course_order():
    errors = topic_errors(_readme())
    assert not errors, "\n".join(errors)


LESSON_PATH = re.compile(r"notebooks/(\d\d)_\w+\.ipynb")


def _library_files() -> list[Path]:
    return sorted((ROOT / "posenc_lib").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))


def test_lesson_mentions_in_the_other_pages_fit_the_course_order():
    from book.build import EXTRA_PAGES  # the site's Markdown pages besides the README

    errors = []
    for page in EXTRA_PAGES:
        errors += [f"{page}: {e}" for e in topic_errors((ROOT / page).read_text(encoding="utf-8"))]
    assert not errors, "\n".join(errors)


def _code_and_outputs(path: Path) -> str:
    parts = []
    for cell in _cells(path):
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts += ["".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/")]
    return "\n\n".join(parts)


def test_lesson_numbers_in_code_outputs_tests_and_scripts_exist():
    texts = [(p.name, _code_and_outputs(p)) for p in _notebooks()]
    files = [*_library_files(), *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "scripts").iterdir())]
    texts += [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in files if p != Path(__file__)]
    existing = _existing()
    missing = [f"{name}: lesson(s) {sorted(group - existing)}" for name, text in texts
               for group in mentioned(LESSON_PATH.sub(lambda m: f"lesson {m.group(1)}", text)) if group - existing]
    assert not missing, missing


def test_the_mention_check_catches_old_numbers():
    """The checks above, on sentences written for an older order of the course."""
    assert mentioned("lessons 02–04 try candidates; lesson 03's code; notebooks 13, 14 and 17") == \
        [{2, 3, 4}, {3}, {13, 14, 17}]
    assert topic_errors("Lesson 11 trains both forms on a reversal task.")
    assert topic_errors("The long-context experiment of lessons 10 and 13 also trained a T5 model.")
    assert topic_errors("Notebook 12 shows the BLEU curves of the four schemes.")
    assert topic_errors("Lesson 10's note on Universal RPE returns to what that costs.")
    assert topic_errors("Lesson 18 is about something else.")
    assert topic_errors("Lesson 18 looks inside a trained model.")
    assert not topic_errors("Lesson 16 looks inside a trained model.")
    assert topic_errors("Lesson 14 also builds LongRoPE.")
    assert not topic_errors("Lessons 14 and 15 rescale frequencies: YaRN and LongRoPE.")
    assert not topic_errors("Lesson 13 trains both forms on a reversal task.")
    assert not topic_errors("Lesson 11's note on Universal RPE returns to what that costs.")
    # a path names a lesson by its notebook too
    doc = "Used by the length-extrapolation experiment (notebooks/11_length_extrapolation" + ".ipynb)."  # an old name
    assert topic_errors(LESSON_PATH.sub(lambda m: f"lesson {m.group(1)}", doc))
    assert mentioned(LESSON_PATH.sub(lambda m: f"lesson {m.group(1)}", "see notebooks/18_more" + ".ipynb")) == [{18}]


def test_a_coming_lesson_may_be_named_only_as_coming(monkeypatch):
    monkeypatch.setitem(COMING, 18, "something later")
    assert topic_errors("Lesson 18 is about something later.")
    assert not topic_errors("Lesson 18, something later, is coming.")
