"""The running scorecard (posenc_lib/course/scorecard.py): every checked verdict agrees with the code."""
import pytest
import torch

from posenc_lib.course import scorecard
from posenc_lib.course.scorecard import REQUIREMENTS, Entry, Verdict


def test_every_check_confirms_its_verdict():
    results = scorecard.run_checks()
    assert len(results) >= 25                       # most measurable cells are checked
    failed = [key for key, ok in results.items() if not ok]
    assert not failed, failed


def test_every_scheme_has_a_verdict_for_every_requirement_and_lessons_are_ordered():
    rows = scorecard.entries()
    assert [e.lesson for e in rows] == sorted(e.lesson for e in rows)
    assert {e.scheme for e in rows} >= {"integer t", "binary bits", "sinusoidal", "learned table", "Shaw relative", "RoPE"}
    for e in rows:
        assert set(e.verdicts) == set(REQUIREMENTS)


def test_no_scheme_claims_to_generalise_beyond_the_training_length_without_qualification():
    # "defined at every position" is not "the model generalises there": no ✓ in that column
    assert all(e.verdicts["beyond training length"].mark != "✓" for e in scorecard.entries())


def test_markdown_table_grows_lesson_by_lesson():
    t2, t6 = scorecard.scorecard_markdown(upto=2), scorecard.scorecard_markdown(upto=6)
    assert "binary bits" in t2 and "sinusoidal" not in t2
    assert "RoPE (L06)" in t6 and t6.count("\n") == len(scorecard.entries(6)) + 1
    assert t6.splitlines()[0].count("|") == len(REQUIREMENTS) + 2


def test_a_wrong_verdict_is_caught_by_its_check():
    # the measurement functions can fail: integer positions are not bounded
    assert scorecard.max_norm_growth(lambda n: torch.arange(n, dtype=torch.float64)[:, None]) > 9
    assert not scorecard.is_unique(torch.zeros(3, 2))
    assert scorecard.toeplitz_error(torch.randn(6, 6)) > 1e-3
    bad = Entry("bad", 1, {r: Verdict("✓", "claimed", lambda: False) for r in REQUIREMENTS})
    scorecard.ENTRIES.append(bad)
    try:
        with pytest.raises(AssertionError, match="bad"):
            scorecard.show()
    finally:
        scorecard.ENTRIES.remove(bad)


def test_bad_input_is_refused_with_clear_errors():
    with pytest.raises(ValueError, match="mark must be one of"):
        Verdict("yes", "reason")
    with pytest.raises(ValueError, match="missing"):
        Entry("x", 1, {"unique": Verdict("✓", "r")})
    with pytest.raises(ValueError, match="already on the scorecard"):
        scorecard.register(scorecard.entries()[0])
    with pytest.raises(TypeError, match="scorecard.Entry"):
        scorecard.register("RoPE")
    with pytest.raises(ValueError, match="upto"):
        scorecard.entries(upto=0)
    with pytest.raises(ValueError, match="codes must be"):
        scorecard.is_unique(torch.zeros(4))


def test_running_the_checks_leaves_the_random_state_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    scorecard.run_checks()
    assert torch.equal(torch.rand(3), expected)


def test_show_displays_html_and_prints_markdown():
    view = scorecard.show(upto=3)
    html = view._repr_html_()
    assert html.startswith('<table class="scorecard">') and html.count("<tr>") == len(scorecard.entries(3)) + 1
    assert "<td>sinusoidal (L03)</td>" in html and "RoPE" not in html
    assert repr(view).startswith("| scheme | unique |") and "† checked by code" in repr(view)
