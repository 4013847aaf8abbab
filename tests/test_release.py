"""`make release`: the student bundle carries the chapters, the exercises and the package, and no solution."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from labkernels.grading import release

ROOT = Path(__file__).resolve().parent.parent


def _members(bundle: Path) -> list[str]:
    with tarfile.open(bundle) as tar:
        return [m.name.split("/", 1)[1] for m in tar.getmembers()]


def test_bundle_has_the_course_and_no_solutions(tmp_path):
    bundle = release.build(ROOT, tmp_path)
    names = _members(bundle)
    chapters = sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
    assert sorted(n.split("/")[1] for n in names if n.startswith("exercises/")) == chapters
    assert {f"notebooks/{c}" for c in chapters} <= set(names)
    assert "labkernels/grading/core.py" in names and "Makefile" in names
    assert any(n.startswith("labkernels/reference/") and n.endswith(".csv") for n in names)
    assert not [n for n in names if n.startswith("solutions/") or "__pycache__" in n or n.endswith(".so")]
    with tarfile.open(bundle) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".ipynb"):
                assert b"### BEGIN SOLUTION" not in tar.extractfile(m).read(), m.name


def _course_copy(tmp_path: Path) -> Path:
    """The course's notebooks and build files, and an empty package: enough for release.build to judge."""
    copy = tmp_path / "course"
    copy.mkdir()
    for name in release.INCLUDE:
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, copy / name)
    for folder in ("notebooks", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, copy / folder)
    (copy / "labkernels").mkdir()
    (copy / "labkernels" / "__init__.py").write_text("")
    return copy


def test_a_solution_left_in_an_exercise_refuses_the_bundle(tmp_path):
    course = _course_copy(tmp_path)
    exercise = sorted((course / "exercises").glob("*.ipynb"))[0]
    exercise.write_text(exercise.read_text().replace("raise NotImplementedError", "### BEGIN SOLUTION", 1))
    with pytest.raises(ValueError, match="BEGIN/END SOLUTION region|out of date"):
        release.build(course, tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_an_existing_bundle_is_kept_unless_forced(tmp_path):
    first = release.build(ROOT, tmp_path)
    first.write_bytes(b"the instructor's copy")
    with pytest.raises(FileExistsError, match="--force"):
        release.build(ROOT, tmp_path)
    assert first.read_bytes() == b"the instructor's copy"
    assert release.build(ROOT, tmp_path, force=True) == first
    assert first.read_bytes() != b"the instructor's copy"
