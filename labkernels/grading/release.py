"""`make release`: the bundle a class gets — the chapters, the exercises and the package, never the solutions.

The bundle is a `.tar.gz` of the files a learner needs to run `make lab` and every notebook: the README, the
build files, `labkernels/` (the grader included, so `check(...)` gives feedback at home; the instructor grades
with the course's own copy, see `make grade`), `notebooks/` and `exercises/`. Before it writes, it refuses a
bundle that would carry a solution: a `solutions/` path, a notebook with a `### BEGIN SOLUTION` region, or
`exercises/` out of step with `solutions/` (exercises made from old solutions would teach the wrong task).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

from labkernels.env import git_revision
from labkernels.grading.notebooks import out_of_sync

INCLUDE = ("README.md", "Makefile", "pyproject.toml", "setup.py", "environment.yml")
INCLUDE_DIRS = ("labkernels", "notebooks", "exercises")
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}
SKIP_SUFFIXES = {".pyc", ".so", ".o"}  # build products: a learner's machine builds its own
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def bundle_files(root: Path) -> list[Path]:
    """The files of the bundle, relative to `root`, sorted."""
    files = [Path(name) for name in INCLUDE if (root / name).is_file()]
    for folder in INCLUDE_DIRS:
        for path in (root / folder).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and not SKIP_DIRS & set(relative.parts) and path.suffix not in SKIP_SUFFIXES:
                files.append(relative)
    return sorted(files)


def problems(root: Path, files: list[Path]) -> list[str]:
    """Why these files must not go to a class (empty when they may)."""
    found = [f"{f}: a solution file" for f in files if f.parts[0] == "solutions"]
    for f in files:
        if f.suffix == ".ipynb" and any(m in (root / f).read_text(encoding="utf-8") for m in MARKERS):
            found.append(f"{f}: holds a BEGIN/END SOLUTION region")
    if not any(f.parts[0] == "exercises" for f in files):
        found.append("exercises/: no exercise notebooks (run `make exercises`)")
    elif (root / "solutions").is_dir():
        found += [f"exercises/ out of date: {p}" for p in out_of_sync(root / "solutions", root / "exercises")]
    return found


def build(root: Path, out_dir: Path, *, force: bool = False) -> Path:
    """Write `out_dir/labkernels-student-<revision>.tar.gz` and return its path. An existing bundle of that
    name is replaced only with `force` (it is not this tool's to delete otherwise)."""
    root, out_dir = Path(root).resolve(), Path(out_dir)
    files = bundle_files(root)
    found = problems(root, files)
    if found:
        raise ValueError("make release: refusing to write the bundle:\n  " + "\n  ".join(found))
    target = out_dir / f"labkernels-student-{git_revision()}.tar.gz"
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
                tar.add(root / f, arcname=f"{prefix}/{f}", recursive=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(partial, 0o666 & ~umask)  # mkstemp makes it private; a bundle is for handing out
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
