"""The course's set-up files agree with each other."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_yml_and_pyproject_pin_the_same_packages():
    course = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["course"]
    conda = [ln.strip().removeprefix("- ") for ln in (ROOT / "environment.yml").read_text().splitlines()]
    assert _pins(course) == _pins(conda)
    assert "-e ." in conda


def test_package_requirements_are_lower_bounds_only():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any("==" in d for d in deps), "pin exact versions only in the course extra"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme


def test_every_stored_notebook_cell_that_is_ignored_says_why():
    for folder in ("notebooks", "solutions"):
        for nb in (ROOT / folder).glob("*.ipynb"):
            for line in nb.read_text().splitlines():
                if "NBVAL_IGNORE_OUTPUT" in line:
                    assert "—" in line or " - " in line, f"{nb.name}: NBVAL_IGNORE_OUTPUT without a reason: {line}"
