"""`make release`: the bundle a class gets — the chapters, the exercises and the package, never the solutions.

The bundle is a `.tar.gz` of the files a learner needs to run `make lab` and every notebook: the README, the
build files, `labkernels/`, `notebooks/` and `exercises/`. It is built through git from the commit checked out
(HEAD), as committed: a file git does not track, or an edit not yet committed, never ships (commit it first),
and a folder that is not a git checkout is refused. Two kinds of file never ship: `solutions/`, and the
grader's cases and references (`labkernels/grading/exercises_chNN.py`), which hold answers; the grader's
machinery does ship, and grading uses the course's own copy (`make grade`).

Before it writes, it refuses a bundle that would carry a solution: a notebook with a `### BEGIN SOLUTION`
region, `exercises/` out of step with `solutions/` (exercises made from old solutions would teach the wrong
task), or a solution region's code found in a file it ships (`leaks`: three non-trivial lines in a row).
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import nbformat

from labkernels.grading.notebooks import BEGIN, END, out_of_sync

INCLUDE = ("README.md", "Makefile", "pyproject.toml", "setup.py", "environment.yml")
INCLUDE_DIRS = ("labkernels", "notebooks", "exercises")
# The grader's cases and references: they compute the answers (issue 42). Never shipped, wherever tracked.
NEVER = ("solutions/*", "labkernels/grading/exercises_ch*.py")
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}
SKIP_SUFFIXES = {".pyc", ".so", ".o"}  # build products: a learner's machine builds its own
MARKERS = (BEGIN, END)
LEAK_RUN = 3  # this many non-trivial lines of a solution region in a row, found in a shipped file, is a leak
MIN_LINE = 12  # shorter lines (`return out`, `else:`) say nothing about an answer


class NotACheckout(ValueError):
    """The course folder is not a git checkout (or git cannot read it): the bundle is built from git."""


def _git(root: Path, *args: str) -> bytes:
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NotACheckout(f"make release: cannot run git in {root}: {e}") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()
        raise NotACheckout(
            f"make release: {root} is not a git checkout with a commit (git {args[0]}: "
            f"{why[-1] if why else f'exit {proc.returncode}'}); the bundle is built from the commit checked "
            "out, so that only tracked, committed files ship"
        )
    return proc.stdout


def tracked(root: Path) -> list[Path]:
    """The files of the commit checked out (HEAD), relative to `root`, the top of a git checkout."""
    top = Path(_git(root, "rev-parse", "--show-toplevel").decode().strip())
    if top.resolve() != Path(root).resolve():
        raise NotACheckout(
            f"make release: {root} is a folder inside the git checkout {top}, not the course's top folder"
        )
    names = _git(root, "ls-tree", "-r", "-z", "--name-only", "--full-tree", "HEAD").split(b"\0")
    return [Path(n.decode()) for n in names if n]


def revision(root: Path) -> str:
    return _git(root, "rev-parse", "--short", "HEAD").decode().strip()


def is_shipped(path: Path) -> bool:
    """Whether a tracked file (relative path) goes into the bundle."""
    posix = PurePosixPath(*path.parts).as_posix()
    if any(fnmatch.fnmatchcase(posix, pattern) for pattern in NEVER):
        return False
    if SKIP_DIRS & set(path.parts) or path.suffix in SKIP_SUFFIXES:
        return False
    return posix in INCLUDE or (len(path.parts) > 1 and path.parts[0] in INCLUDE_DIRS)


def bundle_files(root: Path) -> list[Path]:
    """The files of the bundle, relative to `root`, sorted: tracked in HEAD and shipped."""
    return sorted(f for f in tracked(root) if is_shipped(f))


def export(root: Path, dest: Path, files: list[Path]) -> None:
    """Write `files` (and `solutions/`, to check the exercises against) as committed in HEAD under `dest`."""
    wanted = {PurePosixPath(*f.parts).as_posix() for f in files}
    solutions = {PurePosixPath(*f.parts).as_posix() for f in tracked(root) if f.parts[0] == "solutions"}
    data = _git(root, "archive", "--format=tar", "HEAD")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name in wanted | solutions]
        tar.extractall(dest, members=members, filter="data")


# --- solution regions found in shipped files ----------------------------------------------------------------

_TRAILING_COMMENT = re.compile(r"\s+(#|//)\s.*$")
# One argument of a call on its own line, a name or a plain call (`out.stride(0),`, `BLOCK_M=block_m,`): every
# launch of a kernel has them.
_PLAIN_ARGUMENT = re.compile(r"^(\w+=)?[\w.]+(\([\w.]*\))?,$")


def _meaningful(line: str) -> str | None:
    """The line as compared (no indentation, trailing comment or repeated spaces), or None for a line that
    says nothing about an answer: blank, a comment, shorter than MIN_LINE, or a plain argument."""
    text = " ".join(_TRAILING_COMMENT.sub("", line).split())
    if len(text) < MIN_LINE or text.startswith(("#", "//", "/*", "*")) or _PLAIN_ARGUMENT.match(text):
        return None
    return text


@dataclass(frozen=True)
class Place:
    """Lines of a file (1-based, of a cell's source or output where `cell` is set)."""

    file: str
    cell: int | None
    part: str  # "source", "output" or "" for a plain file
    first: int
    last: int

    def __str__(self) -> str:
        where = f", cell {self.cell} ({self.part})" if self.cell is not None else ""
        return f"{self.file}{where}, lines {self.first}-{self.last}"


def _runs(lines: list[str]) -> list[tuple[tuple[str, ...], int, int]]:
    """Each LEAK_RUN meaningful lines in a row (blank, comment, short lines skipped): (run, first, last)."""
    kept = [(text, number) for number, line in enumerate(lines, start=1) if (text := _meaningful(line))]
    return [
        (tuple(t for t, _ in kept[i : i + LEAK_RUN]), kept[i][1], kept[i + LEAK_RUN - 1][1])
        for i in range(len(kept) - LEAK_RUN + 1)
    ]


def solution_runs(solutions: Path) -> dict[tuple[str, ...], Place]:
    """LEAK_RUN meaningful lines in a row inside a BEGIN/END SOLUTION region of solutions/*.ipynb."""
    found: dict[tuple[str, ...], Place] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        for index, cell in enumerate(cells):
            lines = cell.source.splitlines()
            start = None
            for number, line in enumerate(lines, start=1):
                if line.strip().startswith(BEGIN):
                    start = number
                elif line.strip().startswith(END) and start is not None:
                    region = [""] * start + lines[start : number - 1]  # numbered as in the cell
                    for run, first, last in _runs(region):
                        found.setdefault(run, Place(f"solutions/{path.name}", index, "source", first, last))
                    start = None
    return found


def _texts(root: Path, f: Path):
    """(place without lines, lines) for each text of a shipped file: a module whole, a notebook's cells'
    sources and their outputs' text (a cell may print a function's source)."""
    name = PurePosixPath(*f.parts).as_posix()
    if f.suffix == ".ipynb":
        for index, cell in enumerate(nbformat.read(root / f, as_version=4).cells):
            yield (name, index, "source"), cell.source.splitlines()
            output = []
            for out in cell.get("outputs", []):
                text = out.get("text", "") if out.get("output_type") == "stream" else ""
                text += "".join(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
                output += (text if isinstance(text, str) else "".join(text)).splitlines()
            yield (name, index, "output"), output
    elif f.suffix in (".py", ".md", ".cpp", ".cu", ".h", ".cuh", ".txt"):
        yield (name, None, ""), (root / f).read_text(encoding="utf-8", errors="replace").splitlines()


def leaks(root: Path, files: list[Path]) -> list[str]:
    """Where a solution region's code (LEAK_RUN meaningful lines in a row) appears in a shipped file."""
    answers = solution_runs(root / "solutions")
    found = []
    for f in files:
        for (name, cell, part), lines in _texts(root, f):
            for run, first, last in _runs(lines):
                if run in answers:
                    found.append(f"{Place(name, cell, part, first, last)} repeat {answers[run]}")
    return found


def problems(root: Path, files: list[Path]) -> list[str]:
    """Why these files must not go to a class (empty when they may)."""
    found = [f"{f}: a solution file or the grader's answers" for f in files if not is_shipped(f)]
    for f in files:
        if f.suffix == ".ipynb" and any(m in (root / f).read_text(encoding="utf-8") for m in MARKERS):
            found.append(f"{f}: holds a BEGIN/END SOLUTION region")
    if not any(f.parts[0] == "exercises" for f in files):
        found.append("exercises/: no exercise notebooks (run `make exercises`)")
    elif (root / "solutions").is_dir():
        found += [f"exercises/ out of date: {p}" for p in out_of_sync(root / "solutions", root / "exercises")]
    if (root / "solutions").is_dir():
        found += [f"a solution's code ships: {leak}" for leak in leaks(root, files)]
    return found


def build(root: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Write `out_dir/labkernels-student-<revision>.tar.gz` (the files of HEAD) and return its path. An
    existing bundle of that name is replaced only with `force` (it is not this tool's to delete otherwise)."""
    root, out_dir = Path(root).resolve(), Path(out_dir)
    files = bundle_files(root)
    target = out_dir / f"labkernels-student-{revision(root)}.tar.gz"
    with tempfile.TemporaryDirectory(prefix="labkernels-release-") as tmp:
        committed = Path(tmp)
        export(root, committed, files)
        found = problems(committed, files)
        if found:
            raise ValueError("make release: refusing to write the bundle:\n  " + "\n  ".join(found))
        if target.exists() and not force:
            raise FileExistsError(f"make release: {target} exists; remove it or pass --force")
        out_dir.mkdir(parents=True, exist_ok=True)
        prefix = target.name.removesuffix(".tar.gz")
        # Written beside the target and renamed over it: a failed write never leaves half a bundle.
        handle, partial = tempfile.mkstemp(dir=out_dir, prefix=".release-", suffix=".tar.gz")
        os.close(handle)
        try:
            with tarfile.open(partial, "w:gz") as tar:
                for f in files:
                    tar.add(committed / f, arcname=f"{prefix}/{PurePosixPath(*f.parts)}", recursive=False)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(partial, 0o666 & ~umask)  # mkstemp makes it private; a bundle is for handing out
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return target
