"""`make release`: the student bundle carries the chapters, the exercises and the package as committed, and no
solution: not `solutions/`, not the grader's cases and references, not a solution region's code anywhere."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from labkernels.grading import release

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "01_jit_extensions.ipynb"  # the chapter the small course below is made of


def _members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _git(folder: Path, *args: str) -> str:
    command = ["git", "-C", str(folder), "-c", "user.name=course", "-c", "user.email=course@example.org"]
    return subprocess.run([*command, *args], check=True, capture_output=True, text=True).stdout


def _commit(folder: Path, message: str = "course") -> None:
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", message)


def _committed(path: str, root: Path = ROOT) -> bytes:
    """A file as committed in `root` (the course's working tree may hold edits in progress)."""
    show = ["git", "-C", str(root), "show", f"HEAD:{path}"]
    return subprocess.run(show, check=True, capture_output=True).stdout


@pytest.fixture
def course(tmp_path) -> Path:
    """A small course in a git checkout of its own: one chapter (as the course committed it), a package with a
    grader module and the grader's answers."""
    root = tmp_path / "course"
    for path in ("Makefile", "README.md", "pyproject.toml"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(_committed(path))
    for folder in ("notebooks", "exercises", "solutions"):
        (root / folder).mkdir()
        (root / folder / CHAPTER).write_bytes(_committed(f"{folder}/{CHAPTER}"))
    grading = root / "labkernels" / "grading"
    grading.mkdir(parents=True)
    (root / "labkernels" / "__init__.py").write_text("")
    (grading / "core.py").write_text("def check(ex_id, answer):\n    return ex_id\n")
    (grading / "exercises_ch01.py").write_text("REFERENCE = 'the answers live here'\n")
    _git(root, "init", "-q")
    _commit(root)
    return root


def test_bundle_ships_committed_files_and_never_the_answers(course, tmp_path):
    (course / "notebooks" / "scratch.ipynb").write_text("{}")  # untracked: stays out
    (course / "labkernels" / "grading" / "core.py").write_text("EDITED = True\n")  # not committed: stays out
    members = _members(release.build(course, tmp_path / "dist"))
    assert set(members) == {
        "Makefile",
        "README.md",
        "pyproject.toml",
        f"notebooks/{CHAPTER}",
        f"exercises/{CHAPTER}",
        "labkernels/__init__.py",
        "labkernels/grading/core.py",
    }
    assert members["labkernels/grading/core.py"] == _committed("labkernels/grading/core.py", course)
    for name, data in members.items():
        assert not name.endswith(".ipynb") or b"### BEGIN SOLUTION" not in data, name


def test_a_folder_that_is_not_a_git_checkout_is_refused(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "README.md").write_text("a course without git\n")
    with pytest.raises(release.NotACheckout, match="not a git checkout"):
        release.build(plain, tmp_path / "dist")
    assert not (tmp_path / "dist").exists()


def test_a_folder_inside_a_checkout_is_refused(course, tmp_path):
    with pytest.raises(release.NotACheckout, match="not the course's top folder"):
        release.build(course / "notebooks", tmp_path / "dist")


def test_a_solution_left_in_an_exercise_refuses_the_bundle(course, tmp_path):
    exercise = course / "exercises" / CHAPTER
    exercise.write_text(exercise.read_text().replace("raise NotImplementedError", "### BEGIN SOLUTION", 1))
    _commit(course, "a solution left in")
    with pytest.raises(ValueError, match="BEGIN/END SOLUTION region|out of date"):
        release.build(course, tmp_path / "dist")
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_a_solution_regions_code_in_a_shipped_module_refuses_the_bundle(course, tmp_path):
    """Three lines of 1.1's C++ copied into a module: the bundle is refused, naming both places."""
    answer = release.solution_runs(course / "solutions")
    run, place = next((r, p) for r, p in answer.items() if p.file == f"solutions/{CHAPTER}")
    (course / "labkernels" / "helpers.py").write_text('SOURCE = """\n' + "\n".join(run) + '\n"""\n')
    _commit(course, "a helper that holds an answer")
    with pytest.raises(ValueError, match="a solution's code ships") as refused:
        release.build(course, tmp_path / "dist")
    assert "labkernels/helpers.py, lines 2-4" in str(refused.value) and str(place) in str(refused.value)


def test_short_comment_and_argument_lines_do_not_count_as_a_leak():
    lines = ["# a comment", "return out", "", "    out.stride(0),", "    BLOCK_M=block_m,"]
    assert release._runs(lines) == []
    code = ["x = tl.load(x_ptr + offs, mask=mask)", "# why", "y = tl.load(y_ptr + offs, mask=mask)  # read"]
    code += ["tl.store(out_ptr + offs, x + y, mask=mask)"]
    assert [(first, last) for _, first, last in release._runs(code)] == [(1, 4)]


def test_an_existing_bundle_is_kept_unless_forced(course, tmp_path):
    first = release.build(course, tmp_path)
    first.write_bytes(b"the instructor's copy")
    with pytest.raises(FileExistsError, match="--force"):
        release.build(course, tmp_path)
    assert first.read_bytes() == b"the instructor's copy"
    assert release.build(course, tmp_path, force=True) == first
    assert first.read_bytes() != b"the instructor's copy"


# --- the course itself ------------------------------------------------------------------------------------


def test_the_course_bundle_lists_the_chapters_and_package_and_no_answers():
    names = {f.as_posix() for f in release.bundle_files(ROOT)}
    tracked = {f.as_posix() for f in release.tracked(ROOT)}
    chapters = {Path(n).name for n in tracked if n.startswith("exercises/") and n.endswith(".ipynb")}
    assert chapters and {f"exercises/{c}" for c in chapters} <= names
    assert {f"notebooks/{c}" for c in chapters} <= names
    assert {"labkernels/grading/core.py", "Makefile"} <= names and names <= tracked
    assert any(n.startswith("labkernels/reference/") and n.endswith(".csv") for n in names)
    assert "labkernels/grading/exercises_ch01.py" in tracked
    leaked = [n for n in names if n.startswith("solutions/") or "/exercises_ch" in n or n.endswith(".so")]
    assert not leaked


def test_no_solution_regions_code_ships_in_a_notebook_or_module():
    """Every BEGIN/END SOLUTION region of solutions/ (three non-trivial lines in a row) against every file the
    bundle ships, as committed: notebooks (sources and outputs), exercises, the package."""
    files = release.bundle_files(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        release.export(ROOT, Path(tmp), files)
        found = release.leaks(Path(tmp), files)
    assert not found, "solution code in the student bundle:\n" + "\n".join(found)
