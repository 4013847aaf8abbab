"""Notebook tooling: `make exercises` (solutions/ → exercises/) and `make grade` (execute and score)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: replace this line with your solution")'


class ExercisesRefused(ValueError):
    """Writing exercises here would lose work (or the input cannot make exercises): the message says why and
    what to do instead."""


def strip_solutions(source: str, where: str = "") -> str:
    """Replace every BEGIN/END SOLUTION region with a stub at the region's indentation. `where` (a file and
    cell) starts any error message; its line numbers count from the cell's first line."""
    prefix = f"{where}: " if where else ""
    out, opened = [], None  # opened: the line number of the BEGIN whose END is still to come
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith(BEGIN):
            if opened is not None:
                raise ValueError(
                    f"{prefix}the {BEGIN} at line {opened} has no {END} before the next {BEGIN} at line "
                    f"{number}: close each region before opening another"
                )
            opened = number
            out.append(line[: len(line) - len(line.lstrip())] + STUB)
        elif stripped.startswith(END):
            if opened is None:
                raise ValueError(f"{prefix}line {number}: {END} without a BEGIN above it")
            opened = None
        elif opened is None:
            out.append(line)
    if opened is not None:
        raise ValueError(f"{prefix}line {opened}: {BEGIN} without an END (add {END} where the answer ends)")
    return "\n".join(out)


def make_exercise(nb: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """A copy of a solution notebook with solutions stubbed and every output cleared (`name`: the file, for
    error messages)."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            where = f"{name}, cell {index}" if name else f"cell {index}"
            cell.source = strip_solutions(cell.source, where)
            cell.outputs, cell.execution_count = [], None
    return nb


def read_solution(solution_path: Path, text: str | None = None) -> nbformat.NotebookNode:
    """The solution notebook at `solution_path` (or its `text`); an `ExercisesRefused` naming the file and
    the line where it is not a notebook."""
    try:
        if text is None:
            text = solution_path.read_text(encoding="utf-8")
        json.loads(text)  # first, for the line of a JSON error (nbformat's own error names none)
        return nbformat.reads(text, as_version=4)
    except json.JSONDecodeError as e:
        raise ExercisesRefused(
            f"{solution_path} is not a notebook: not JSON at line {e.lineno}, column {e.colno} ({e.msg})"
        ) from None
    except (
        UnicodeDecodeError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        nbformat.ValidationError,
    ) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise ExercisesRefused(f"{solution_path} is not a notebook: {first}") from None


def exercise_text(solution_path: Path, text: str | None = None) -> str:
    """What the generator writes for the solution notebook at `solution_path` (or for its `text`)."""
    try:
        nb = make_exercise(read_solution(solution_path, text), str(solution_path))
    except ExercisesRefused:
        raise
    except ValueError as e:
        raise ExercisesRefused(str(e)) from None
    return nbformat.writes(nb) + "\n"


def _committed(path: Path) -> str | None:
    """The text of `path` in the git commit checked out (HEAD), or None (no git, not committed)."""
    try:
        done = subprocess.run(
            ["git", "show", f"HEAD:./{path.name}"],
            cwd=path.parent,
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode("utf-8", errors="replace") if done.returncode == 0 else None


def generated_versions(src: Path) -> list[str]:
    """Texts an exercise of `src` has when nobody edited it: what the generator writes from `src` now, and
    from `src` as committed (the course's exercise, while `src` has edits not yet committed)."""
    versions = [exercise_text(src)]
    committed = _committed(src)
    if committed is not None:
        try:
            versions.append(exercise_text(src, committed))
        except ExercisesRefused:
            pass
    return versions


def _cell_sources(text: str) -> list[str]:
    """The cells' sources of a notebook's text ([] if it is not a notebook)."""
    try:
        cells = json.loads(text).get("cells") or []
        return ["".join(c["source"]) if isinstance(c["source"], list) else str(c["source"]) for c in cells]
    except (ValueError, AttributeError, TypeError, KeyError):
        return []


#: An exercise someone edited still has most of its cells as generated (the text, the checks); a chapter's
#: notebook of the same name shares none with the exercise.
KIN_FRACTION = 0.25


def is_exercise(text: str, versions: list[str]) -> bool:
    """Whether the notebook `text` is one of the generated `versions`, edited or not: at least
    `KIN_FRACTION` of some version's cells are in it, word for word."""
    if text in versions:
        return True
    cells = set(_cell_sources(text))
    for version in versions:
        generated = _cell_sources(version)
        if generated and sum(c in cells for c in generated) >= KIN_FRACTION * len(generated):
            return True
    return False


def unsafe_exercise_folder(solutions: Path, exercises: Path) -> str | None:
    """Why writing exercises from `solutions` into `exercises` would destroy work whatever the user says,
    or None: the same folder (every solution would become a stub), a file, or a folder holding notebooks
    that are not exercises generated from `solutions` (someone's solutions, the chapters' notebooks, a
    notebook of the user's own)."""
    if exercises.exists() and not exercises.is_dir():
        return f"{exercises} is a file, not a folder: give --exercises a folder (new, or of exercises)"
    if solutions.resolve() == exercises.resolve():
        return f"{exercises} is the solutions folder itself: its solutions would be replaced by stubs"
    if not exercises.is_dir():
        return None
    for dst in sorted(exercises.glob("*.ipynb")):
        try:
            text = dst.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return f"{dst} cannot be read as a notebook: it is not a generated exercise"
        if BEGIN in text:
            return f"{dst} holds solution regions ({BEGIN}): it is not a generated exercise"
        src = solutions / dst.name
        if not src.exists():
            return (
                f"{dst} has no solution notebook ({src}): this folder holds notebooks that are not "
                "generated exercises. Give --exercises a new folder, or the folder of exercises"
            )
        if not is_exercise(text, generated_versions(src)):
            return (
                f"{dst} is not the exercise of {src} (it shares almost no cell with it): this folder holds "
                "notebooks that are not generated exercises (the chapters' notebooks?). Give --exercises a "
                "new folder, or the folder of exercises"
            )
    return None


def edited_exercises(solutions: Path, exercises: Path) -> list[Path]:
    """The exercise notebooks in `exercises` that differ from every text the generator gave them (see
    `generated_versions`): someone edited them, e.g. a learner's answers."""
    edited = []
    for src in sorted(solutions.glob("*.ipynb")):
        dst = exercises / src.name
        if dst.exists() and dst.read_text(encoding="utf-8") not in generated_versions(src):
            edited.append(dst)
    return edited


def refresh_advice(exercises: Path) -> str:
    """How to get fresh stubs without losing the answers in `exercises`."""
    return (
        f"To keep the answers and get fresh stubs, write them to a new folder and copy your answers over: "
        f"`python -m labkernels exercises --exercises {exercises.name}-new`. To replace the edited notebooks "
        f"with stubs (their answers are lost): `python -m labkernels exercises --force`"
    )


def write_exercises(solutions: Path, exercises: Path, force: bool = False) -> list[Path]:
    """Write every solution notebook's exercise into `exercises`. Refused (`ExercisesRefused`, nothing
    written) where it would destroy work: see `unsafe_exercise_folder`, and an edited exercise unless
    `force`."""
    if not solutions.is_dir():
        raise FileNotFoundError(f"no such folder of solutions: {solutions}")
    refusal = unsafe_exercise_folder(solutions, exercises)
    if refusal:
        raise ExercisesRefused(f"refusing to write exercises: {refusal}")
    texts = {src.name: exercise_text(src) for src in sorted(solutions.glob("*.ipynb"))}  # every one parses
    edited = [] if force else edited_exercises(solutions, exercises)
    if edited:
        names = "\n".join(f"  {p}" for p in edited)
        raise ExercisesRefused(
            f"refusing to write exercises: these differ from every version the generator wrote (edited, "
            f"e.g. answers), and writing would replace them with stubs:\n{names}\n{refresh_advice(exercises)}"
        )
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in texts.items():
        dst = exercises / name
        dst.write_text(text)
        written.append(dst)
    return written


def out_of_sync(solutions: Path, exercises: Path) -> list[str]:
    """Names of exercise notebooks that are missing, stale (or edited), or have no solution notebook."""
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
    try:  # the notebook wrote this file: never follow a link it put in its place (to another student's file)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return answers, notes
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size > MAX_SUBMISSIONS_BYTES:
            return answers, ["the handed-in answers are too large to read"]
        text = f.read(MAX_SUBMISSIONS_BYTES).decode(errors="replace")
    for line in text.splitlines():
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


def _kernel_manager(run_dir: Path):
    """The notebook's kernel: in the sandbox (`isolation`) where grading uses one, reached over Unix sockets
    in the run's own folder (the sandbox has no network; no TCP port to take or to listen in on)."""
    from jupyter_client.manager import AsyncKernelManager

    from labkernels.grading import isolation
    from labkernels.grading.remote import PACKAGE_ROOT

    sandbox = []
    if isolation.enabled(PACKAGE_ROOT):
        (run_dir / "root").mkdir(exist_ok=True)
        sandbox = isolation.prefix([str(run_dir)], PACKAGE_ROOT, str(run_dir / "root"))

    class SandboxedKernelManager(AsyncKernelManager):
        def __init__(self, **kw):
            kw.update(
                transport="ipc", ip=str(run_dir / "kernel"), connection_file=str(run_dir / "kernel.json")
            )
            super().__init__(**kw)

        def format_kernel_cmd(self, extra_arguments=None):
            return sandbox + super().format_kernel_cmd(extra_arguments)

    return SandboxedKernelManager


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
            kernel_manager_class=_kernel_manager(submit_path.parent),
            resources={"metadata": {"path": str(workdir)}},
        )
        # The kernel's own log (start-up notices, its messaging errors when a cell is stopped) is not the
        # instructor's to read in every grading run: it goes to a file of the run's folder.
        with open(submit_path.parent / "kernel.log", "ab") as log:
            client.execute(env=_kernel_env(str(submit_path)), cwd=str(workdir), stdout=log, stderr=log)
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
    if answer["kind"] == "missing":
        return {"cases": [], "error": answer["error"]}
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
    from labkernels.grading import isolation
    from labkernels.grading.remote import PACKAGE_ROOT

    report = {"notebook": str(path), "problem": None, "exercises": [], "notes": []}
    report["sandbox"] = isolation.mode(PACKAGE_ROOT)  # how this notebook ran: the instructor reads it here
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
    ran = check_cells(nb) if nb is not None else {}
    for ex in expected:
        answer = answers.get(ex.ex_id) or ran.get(ex.ex_id)
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


CHECK_CALL = re.compile(r"""\bcheck(?:_speed)?\(\s*["'](\d+\.\d+)["']""")


def check_cells(nb) -> dict[str, dict]:
    """For exercises whose check cell ran without handing an answer in: why, as the executed notebook shows it
    (the cell raised, or ran and handed nothing in). Read from the outputs: never a score, only a reason."""
    why = {}
    for cell in nb.cells:
        if cell.get("cell_type") != "code" or cell.get("execution_count") is None:
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            reason = f"its check cell raised {errors[0].get('ename')}: {str(errors[0].get('evalue'))[:200]}"
        else:
            reason = "its check cell ran but handed nothing in (was `check` replaced?)"
        for ex_id in CHECK_CALL.findall(cell.get("source", "")):
            why.setdefault(ex_id, {"kind": "missing", "error": reason})
    return why


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
                skips = [c for c in rec["cases"] if c["status"] == "skip"]
                note = fails[0]["reason"][:90] if fails else (skips[0]["reason"][:90] if skips else "")
            lines.append(
                f"{name:<28} {rec['exercise']:<9} {part:<12} "
                f"{rec['earned']:>4g}/{rec['possible']:<4g}  {note}"
            )
            total += rec["earned"]
            possible += rec["possible"]
    lines.append(f"{'TOTAL':<28} {'':<9} {'':<12} {total:>4g}/{possible:<4g}")
    return "\n".join(lines)
