"""Notebook tooling: `make exercises` (solutions/ → exercises/) and `make grade` (execute and score)."""

from __future__ import annotations

import json
import os
import re
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
#
# Trust model: the notebook runs in its own kernel, in a fresh temporary folder, with an environment built
# here; `check(...)` there only hands the answer in (its source, appended to a file). After the notebook has
# run and every process it started has been killed, *this* process grades each exercise of the chapter from
# what was handed in (the answer runs in a worker, see `remote`); the possible points come from the registry.

CHAPTER = re.compile(r"^(\d\d)_")
MAX_SUBMISSIONS_BYTES = 50_000_000


def _set_subreaper() -> None:
    """Orphans of the notebook (double forks, new sessions) become our children, so they can be killed."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # not Linux: process groups only
        pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_descendants() -> int:
    """SIGKILL every process below this one (repeatedly: a dying parent's orphans come back to us)."""
    import signal

    killed = 0
    for _ in range(20):
        pids = _descendants(os.getpid())
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        import time

        time.sleep(0.05)
    return killed


def _kernel_env(submit_path: str) -> dict:
    from labkernels.grading import SUBMIT_ENV
    from labkernels.grading.remote import PACKAGE_ROOT, PASS_ENV
    from labkernels.lane import LANE

    env = {k: os.environ[k] for k in (*PASS_ENV, "MPLBACKEND") if k in os.environ}
    env.update({SUBMIT_ENV: submit_path, "LABKERNELS_LANE": LANE, "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    # The notebook imports the package the grader runs, installed or not (a checkout run from its root).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


def _read_submissions(path: Path, chapter: str) -> tuple[dict[str, dict], list[str]]:
    """The last answer handed in for each exercise of `chapter` (answers for other chapters are ignored)."""
    answers, notes = {}, []
    if not path.exists():
        return answers, notes
    if path.stat().st_size > MAX_SUBMISSIONS_BYTES:
        return answers, ["the handed-in answers are too large to read"]
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
            ex_id, answer = str(rec["exercise"]), rec["answer"]
            if not isinstance(answer, dict) or answer.get("kind") not in ("code", "data", "error"):
                continue
        except (ValueError, KeyError, TypeError):
            continue
        if ex_id.split(".")[0].zfill(2) != chapter:
            notes.append(f"check({ex_id!r}) in a chapter {chapter} notebook is not graded here")
            continue
        answers[ex_id] = answer
    return answers, notes


TIME_LIMIT = "the notebook exceeded its time limit"
# A kernel that dies before it answers (several starting at once under -j, a port taken between its choice
# and its bind) has run nothing of the notebook: it is started again, at most this many times in all.
KERNEL_STARTS = 3


def execute_notebook(
    nb, workdir: Path, cell_timeout: int, submit_path: Path, deadline: float | None = None
) -> str | None:
    """Run every cell (errors allowed); no cell runs past `cell_timeout` nor past `deadline` (monotonic).
    Returns None, or the problem that stopped the run. A kernel that failed to start is started again."""
    for _ in range(KERNEL_STARTS):
        problem = _execute_once(nb, workdir, cell_timeout, submit_path, deadline)
        if problem is None or _any_cell_ran(nb):
            return problem
    return problem


def _any_cell_ran(nb) -> bool:
    """Whether a kernel ran one of the notebook's code cells (it numbers every cell it executes)."""
    return any(c.get("cell_type") == "code" and c.get("execution_count") is not None for c in nb.cells)


def _execute_once(nb, workdir: Path, cell_timeout: int, submit_path: Path, deadline) -> str | None:
    import time

    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    def timeout_for(_cell) -> int:
        left = cell_timeout if deadline is None else min(cell_timeout, deadline - time.monotonic())
        return max(1, int(left))

    try:
        client = NotebookClient(
            nb,
            timeout=cell_timeout,
            timeout_func=timeout_for,
            allow_errors=True,
            kernel_name="python3",
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute(env=_kernel_env(str(submit_path)), cwd=str(workdir))
    except CellTimeoutError:
        if deadline is not None and time.monotonic() >= deadline - 1:
            return TIME_LIMIT
        return f"a cell ran longer than {cell_timeout} s and was stopped"
    except DeadKernelError:
        return "the notebook's kernel died"
    except Exception as e:  # noqa: BLE001
        return f"execution failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        kill_descendants()
    return None


def _outcome(ex, answer: dict | None, speed: bool, lane: str, deadline: float | None, defer: bool) -> dict:
    import time

    from labkernels.grading import sandbox

    if answer is None:
        return {"cases": [], "error": "its check cell did not run"}
    if answer["kind"] == "error":
        return {"cases": [], "error": str(answer.get("error"))[:300]}
    if speed and lane != "gpu":
        return {"cases": [], "error": "skipped on the CPU lane"}
    if speed and defer:
        return {"cases": [], "error": "speed cases not graded yet", "deferred": True}
    timeout_s = ex.timeout_s if deadline is None else min(ex.timeout_s, deadline - time.monotonic())
    if timeout_s <= 0:
        return {"cases": [], "error": TIME_LIMIT}
    return sandbox.run(ex, answer, speed=speed, timeout_s=timeout_s)


def grade_notebook(
    path: Path,
    cell_timeout: int,
    data: bytes | None = None,
    chapter: str | None = None,
    *,
    deadline: float | None = None,
    seal=None,
    defer_speed: bool = False,
) -> dict:
    """Execute one notebook (errors allowed) in a fresh folder, then grade what it handed in, here.

    `deadline` (monotonic) bounds execution and grading: past it every exercise scores zero (TIME_LIMIT).
    `seal` (a `classroom.PackageSeal`) is checked once the notebook's processes are dead and again after
    grading: a changed grading package raises `GraderChanged` (the run must be refused, not scored).
    `defer_speed`: speed cases are left for `grade_speed` (a class grades them one at a time, afterwards);
    the answers they need are kept in report["answers"].
    """
    import tempfile
    import time

    from labkernels.grading import make_record
    from labkernels.grading.registry import for_chapter
    from labkernels.lane import LANE

    match = CHAPTER.match(path.name)
    chapter = chapter or (match.group(1) if match else None)
    expected = for_chapter(chapter) if chapter else []
    report = {"notebook": str(path), "problem": None, "exercises": [], "notes": []}
    data = path.read_bytes() if data is None else data
    try:
        nb = nbformat.reads(data.decode(), as_version=4)
    except Exception as e:  # noqa: BLE001
        report["problem"] = f"not a readable notebook: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        nb = None
    answers: dict[str, dict] = {}
    if nb is not None:
        with tempfile.TemporaryDirectory(prefix="labkernels-submission-") as tmp:
            workdir = Path(tmp) / "work"
            workdir.mkdir()
            submit_path = Path(tmp) / "handed-in.jsonl"
            report["problem"] = execute_notebook(nb, workdir, cell_timeout, submit_path, deadline)
            answers, report["notes"] = _read_submissions(submit_path, chapter or "")
        if seal is not None:
            seal.check(f"after running {path}")
    if report["problem"] == TIME_LIMIT:
        answers = {}
    for ex in expected:
        answer = answers.get(ex.ex_id)
        if report["problem"] == TIME_LIMIT:
            answer = {"kind": "error", "error": TIME_LIMIT}
        correctness = None
        for speed in (False, True):
            if (ex.speed_points if speed else ex.points) == 0:
                continue
            if speed and LANE == "gpu" and skip_timing(correctness):
                outcome = {"cases": [], "error": NOT_TIMED}
            else:
                outcome = _outcome(ex, answer, speed, LANE, deadline, defer_speed)
            record = make_record(ex, speed, outcome, LANE)
            correctness = correctness or record
            report["exercises"].append(record | _deferred(outcome))
    if deadline is not None and time.monotonic() > deadline:
        _zero(report, TIME_LIMIT)
    elif defer_speed and any(r.get("deferred") for r in report["exercises"]):
        report["answers"] = {k: v for k, v in answers.items() if v.get("kind") != "error"}
    if seal is not None:
        seal.check(f"after grading {path}")
    return report


NOT_TIMED = "not timed: none of its correctness cases passed"


def skip_timing(correctness: dict | None) -> bool:
    """Time an answer only if it passed a correctness case. A wrong kernel earns no speed points anyway, and a
    class's speed cases run one notebook at a time on the GPU: each skipped one saves a worker's start-up,
    its compile and its timing (stubs and broken answers are a third of a class or more)."""
    return correctness is not None and correctness["possible"] > 0 and correctness["earned"] == 0


def _deferred(outcome: dict) -> dict:
    return {"deferred": True} if outcome.get("deferred") else {}


def _zero(report: dict, why: str) -> None:
    """Every exercise of the report scores zero, saying why (a time limit: nothing it decided counts)."""
    report["problem"] = report["problem"] or why
    report.pop("answers", None)
    for rec in report["exercises"]:
        rec.pop("deferred", None)
        rec.update(earned=0, error=why)
        for case in rec["cases"]:
            if case["status"] == "pass":
                case.update(status="fail", earned=0, reason=f"not counted: {why}")


def grade_speed(report: dict, deadline: float | None = None) -> None:
    """The speed cases `grade_notebook(defer_speed=True)` left: graded now, from the kept answers."""
    import time

    from labkernels.grading import make_record, sandbox
    from labkernels.grading.registry import get
    from labkernels.lane import LANE

    answers = report.pop("answers", {})
    for i, rec in enumerate(report["exercises"]):
        if not rec.pop("deferred", False):
            continue
        ex = get(rec["exercise"])
        left = ex.timeout_s if deadline is None else min(ex.timeout_s, deadline - time.monotonic())
        if left <= 0:
            outcome = {"cases": [], "error": "the run exceeded its time limit"}
        else:
            outcome = sandbox.run(ex, answers[rec["exercise"]], speed=True, timeout_s=left)
        report["exercises"][i] = make_record(ex, True, outcome, LANE)


def missing_chapter(chapter: str, why: str) -> dict:
    from labkernels.grading import make_record
    from labkernels.grading.registry import for_chapter
    from labkernels.lane import LANE

    report = {"notebook": f"{chapter}_*.ipynb", "problem": why, "exercises": [], "notes": []}
    for ex in for_chapter(chapter):
        for speed in (False, True):
            if (ex.speed_points if speed else ex.points) == 0:
                continue
            report["exercises"].append(make_record(ex, speed, {"cases": [], "error": why}, LANE))
    return report


def course_chapters() -> list[str]:
    from labkernels.grading.registry import discover

    return sorted({ex.chapter for ex in discover().values() if ex.chapter.isdigit()})


def plan_submission(
    folder: Path, chapters: list[str] | None = None
) -> tuple[list[tuple[Path, str]], list[dict]]:
    """(notebooks to grade with their chapter, reports for what is missing, duplicated or misnamed).
    `chapters`: the chapters graded (the instructor's choice; default every chapter of the course)."""
    every = course_chapters()
    chapters = sorted(chapters) if chapters else every
    by_chapter: dict[str, list[Path]] = {}
    extra: list[dict] = []
    for nb in sorted(folder.glob("*.ipynb")):
        m = CHAPTER.match(nb.name)
        if m and m.group(1) in every and m.group(1) not in chapters:
            continue  # a chapter this run does not grade
        if not m or m.group(1) not in chapters:
            extra.append(
                {
                    "notebook": str(nb),
                    "problem": "not graded: a notebook's name must start with a chapter "
                    f"number ({', '.join(c + '_' for c in chapters)})",
                    "exercises": [],
                    "notes": [],
                }
            )
            continue
        by_chapter.setdefault(m.group(1), []).append(nb)
    todo = []
    for chapter in chapters:
        found = by_chapter.get(chapter, [])
        if not found:
            extra.append(missing_chapter(chapter, f"no notebook for chapter {chapter} was handed in"))
            continue
        todo.append((found[0], chapter))
        for dup in found[1:]:
            extra.append(
                {
                    "notebook": str(dup),
                    "problem": f"not graded: a second chapter {chapter} notebook ({found[0].name} is graded)",
                    "exercises": [],
                    "notes": [],
                }
            )
    return todo, extra


def grade_folder(
    folder: Path,
    cell_timeout: int = 600,
    *,
    notebook_timeout: float | None = None,
    run_deadline: float | None = None,
    seal=None,
    chapters: list[str] | None = None,
) -> list[dict]:
    """Grade one submission folder, a notebook at a time, in this process (see `classroom` for a class)."""
    import time

    if not folder.is_dir():
        raise FileNotFoundError(f"no such folder of notebooks: {folder}")
    if not list(folder.glob("*.ipynb")):
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {folder}")
    _set_subreaper()
    todo, extra = plan_submission(folder, chapters)
    data = {nb: nb.read_bytes() for nb, _ in todo}  # read before any notebook runs: none can rewrite another
    reports = []
    for nb, chapter in todo:
        now = time.monotonic()
        deadline = None if notebook_timeout is None else now + notebook_timeout
        if run_deadline is not None:
            if now >= run_deadline:
                reports.append(missing_chapter(chapter, RUN_LIMIT) | {"notebook": str(nb)})
                continue
            deadline = run_deadline if deadline is None else min(deadline, run_deadline)
        reports.append(grade_notebook(nb, cell_timeout, data[nb], chapter, deadline=deadline, seal=seal))
    return reports + extra


RUN_LIMIT = "the run exceeded its time limit"


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
            if not note:
                fails = [c for c in rec["cases"] if c["status"] == "fail"]
                note = fails[0]["reason"][:90] if fails else ""
            lines.append(
                f"{name:<28} {rec['exercise']:<9} {part:<12} "
                f"{rec['earned']:>4g}/{rec['possible']:<4g}  {note}"
            )
            total += rec["earned"]
            possible += rec["possible"]
    lines.append(f"{'TOTAL':<28} {'':<9} {'':<12} {total:>4g}/{possible:<4g}")
    return "\n".join(lines)
