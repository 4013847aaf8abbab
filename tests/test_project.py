"""The course's set-up files agree with each other."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _pins(lines):
    pins = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s#]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_yml_and_pyproject_pin_the_same_packages():
    course = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        "course"
    ]
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


def test_every_ignored_cell_says_why():
    """nbval ignores a cell's output through its `nbval-ignore-output` tag; the first line of the cell says
    so to the reader, with the reason: `# NBVAL_IGNORE_OUTPUT — <reason>`. Neither goes without the other."""
    import nbformat

    for folder in ("notebooks", "solutions"):
        for path in (ROOT / folder).glob("*.ipynb"):
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type != "code":
                    continue
                tagged = "nbval-ignore-output" in cell.metadata.get("tags", [])
                marker = [ln for ln in cell.source.splitlines() if "NBVAL_IGNORE_OUTPUT" in ln]
                assert tagged == bool(marker), f"{path.name}: tag and comment disagree: {cell.source[:60]!r}"
                for line in marker:
                    reason = line.strip().removeprefix("# NBVAL_IGNORE_OUTPUT").strip(" —-:")
                    assert len(reason) > 8, f"{path.name}: an ignored cell must say why: {line!r}"
