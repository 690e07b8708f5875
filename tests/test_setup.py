"""The project's own setup files agree with each other."""
import re
import tomllib
from pathlib import Path

import yaml  # shipped with transformers/datasets

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in py["dependencies"]} | {_name(r) for r in py["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = {_name(r) for r in pip_section if not r.startswith("-e")}
    assert have == wanted, f"only in environment.yml: {have - wanted}; only in pyproject.toml: {wanted - have}"


def test_torch_pinned_in_constraints_and_environment():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text().split()
    assert "torch==2.13.0" in (ROOT / "environment.yml").read_text()
    assert "-c constraints.txt" in (ROOT / "Makefile").read_text()


def test_test_only_reference_pinned_in_constraints_and_environment():
    """x-transformers (the reference for xPos and CoPE) is pinned: its code is what the parity tests read."""
    assert "x-transformers==2.31.10" in (ROOT / "constraints.txt").read_text().split()
    assert "x-transformers==2.31.10" in (ROOT / "environment.yml").read_text()


def test_ci_calls_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_test_keeps_each_notebook_and_test_file_in_one_worker():
    """`make test` spreads files over pytest-xdist workers; a notebook's cells depend on the cells above them, so
    every file must run whole, in order, in one worker (``--dist loadfile``), for the unit tests and the notebooks."""
    make = (ROOT / "Makefile").read_text()
    pytest_line = next(line for line in make.splitlines() if line.startswith("PYTEST :="))
    assert "-n $(TEST_WORKERS)" in pytest_line and "--dist loadfile" in pytest_line
    test_target = make.split("\ntest: env\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert test_target == ["\t$(PYTEST) tests", "\t$(PYTEST) $(NBVAL)"]
    assert "pytest-xdist" in {_name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                              ["optional-dependencies"]["dev"]}
