"""Notebook tooling: `make exercises` (solutions/ → exercises/) and `make grade` (execute and score)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: replace this line with your solution")'


def strip_solutions(source: str) -> str:
    """Replace every BEGIN/END SOLUTION region with a stub at the region's indentation."""
    out, inside = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if inside:
                raise ValueError("nested ### BEGIN SOLUTION")
            inside = True
            out.append(line[: len(line) - len(line.lstrip())] + STUB)
        elif stripped.startswith(END):
            if not inside:
                raise ValueError("### END SOLUTION without a BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without an END")
    return "\n".join(out)


def make_exercise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of a solution notebook with solutions stubbed and every output cleared."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs, cell.execution_count = [], None
    return nb


def exercise_text(solution_path: Path) -> str:
    nb = make_exercise(nbformat.read(solution_path, as_version=4))
    return nbformat.writes(nb) + "\n"


def unsafe_exercise_folder(solutions: Path, exercises: Path) -> str | None:
    """Why writing exercises from `solutions` into `exercises` would destroy work, or None if it is safe:
    the same folder (every solution would become a stub), or an exercises folder whose notebooks hold
    solution regions (someone's solutions, which a stub must not replace)."""
    if solutions.resolve() == exercises.resolve():
        return f"{exercises} is the solutions folder itself: its solutions would be replaced by stubs"
    if not exercises.is_dir():
        return None
    for dst in sorted(exercises.glob("*.ipynb")):
        try:
            text = dst.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if BEGIN in text:
            return f"{dst} holds solution regions ({BEGIN}): it is not a generated exercise"
    return None


def write_exercises(solutions: Path, exercises: Path) -> list[Path]:
    refusal = unsafe_exercise_folder(solutions, exercises)
    if refusal:
        raise ValueError(f"refusing to write exercises: {refusal}")
    if not solutions.is_dir():
        raise FileNotFoundError(f"no such folder of solutions: {solutions}")
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(solutions.glob("*.ipynb")):
        dst = exercises / src.name
        dst.write_text(exercise_text(src))
        written.append(dst)
    return written


def out_of_sync(solutions: Path, exercises: Path) -> list[str]:
    """Names of exercise notebooks that are missing, stale, or have no solution notebook."""
    problems = []
    for src in sorted(solutions.glob("*.ipynb")):
        dst = exercises / src.name
        if not dst.exists():
            problems.append(f"{dst} is missing")
        elif dst.read_text() != exercise_text(src):
            problems.append(f"{dst} is stale")
    for dst in sorted(exercises.glob("*.ipynb")):
        if not (solutions / dst.name).exists():
            problems.append(f"{dst} has no solution notebook")
    return problems


# --- grading a folder of notebooks ---------------------------------------------------------------------

CHAPTER = re.compile(r"^(\d\d)_")


def grade_notebook(path: Path, cell_timeout: int) -> dict:
    """Execute one notebook (errors allowed) and collect the `check` records it logged."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    from labkernels.grading import LOG_ENV
    from labkernels.grading.registry import for_chapter

    match = CHAPTER.match(path.name)
    expected = for_chapter(match.group(1)) if match else []
    report = {"notebook": str(path), "problem": None, "exercises": []}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:
        report["problem"] = f"not a readable notebook: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        nb = None
    records: dict[tuple[str, bool], dict] = {}
    if nb is not None:
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as log:
            log_path = log.name
        old = os.environ.get(LOG_ENV)
        os.environ[LOG_ENV] = log_path
        try:
            client = NotebookClient(
                nb,
                timeout=cell_timeout,
                allow_errors=True,
                kernel_name="python3",
                resources={"metadata": {"path": str(path.parent.resolve())}},
            )
            client.execute()
        except CellTimeoutError:
            report["problem"] = f"a cell ran longer than {cell_timeout} s and was stopped"
        except DeadKernelError:
            report["problem"] = "the notebook's kernel died"
        except Exception as e:
            report["problem"] = f"execution failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        finally:
            if old is None:
                os.environ.pop(LOG_ENV, None)
            else:
                os.environ[LOG_ENV] = old
        for line in Path(log_path).read_text().splitlines():
            rec = json.loads(line)
            records[(rec["exercise"], rec["speed"])] = rec
        os.unlink(log_path)
    for ex in expected:
        for speed, possible in ((False, ex.points), (True, ex.speed_points)):
            if possible == 0:
                continue
            rec = records.get((ex.ex_id, speed))
            if rec is None:
                rec = {
                    "exercise": ex.ex_id,
                    "title": ex.title,
                    "speed": speed,
                    "earned": 0,
                    "possible": possible,
                    "cases": [],
                    "error": "its check cell did not run",
                }
            report["exercises"].append(rec)
    return report


def grade_folder(folder: Path, cell_timeout: int = 600) -> list[dict]:
    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder of notebooks: {folder}")
    notebooks = sorted(folder.glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {folder}")
    return [grade_notebook(nb, cell_timeout) for nb in notebooks]


def score_table(reports: list[dict]) -> str:
    lines = [f"{'notebook':<28} {'exercise':<9} {'part':<12} {'score':>9}  note"]
    total = possible = 0.0
    for rep in reports:
        name = Path(rep["notebook"]).name
        if rep["problem"]:
            lines.append(f"{name:<28} {'-':<9} {'-':<12} {'':>9}  {rep['problem']}")
        for rec in rep["exercises"]:
            part = "speed" if rec["speed"] else "correctness"
            note = rec["error"] or ""
            if rec["possible"] == 0 and rec["cases"]:
                note = note or "skipped on the CPU lane"
            lines.append(
                f"{name:<28} {rec['exercise']:<9} {part:<12} "
                f"{rec['earned']:>4g}/{rec['possible']:<4g}  {note}"
            )
            total += rec["earned"]
            possible += rec["possible"]
    lines.append(f"{'TOTAL':<28} {'':<9} {'':<12} {total:>4g}/{possible:<4g}")
    return "\n".join(lines)
