"""The grader cannot be fooled, and its notebook tooling (exercise generation, make grade) works."""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

import labkernels  # noqa: F401
from labkernels.grading import format_record, grade
from labkernels.grading.notebooks import out_of_sync, strip_solutions, write_exercises

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
os.environ["LABKERNELS_EXTRA_EXERCISES"] = "grading_fixtures"
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
)

import submissions  # noqa: E402


def test_correct_submission_gets_full_marks():
    rec = grade("T.1", submissions.correct)
    assert rec["error"] is None, rec
    assert (rec["earned"], rec["possible"]) == (3, 3), format_record(rec)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("raises", "RuntimeError: something went wrong"),
        ("wrong_answer", "wrong values"),
        ("partial_write", "never written"),
        ("out_of_bounds", "wrote outside the output"),
        ("stale_cache", ""),
        ("returns_earlier_result", "NameError"),
    ],
)
def test_wrong_submissions_lose_every_point(name, reason):
    submissions.EARLIER_RESULT = torch.ones(10)
    rec = grade("T.1", getattr(submissions, name))
    assert rec["earned"] == 0, format_record(rec)
    assert rec["possible"] == 3
    assert all(c["status"] == "fail" for c in rec["cases"]), format_record(rec)
    assert reason in format_record(rec)


@pytest.mark.parametrize(
    "ex_id, name, module",
    [
        ("5.3", "read_program_with_the_course_reader", "labkernels.ch05_fusion.inductor"),
        ("4.1", "predict_with_the_course_roofline", "labkernels.ch04_libraries.gemm_model"),
    ],
)
def test_answers_that_call_the_course_s_own_answer_are_refused(ex_id, name, module):
    """5.3's reader and 4.1's formulas are in the package: an answer that calls them scores nothing, and the
    record says which function it called."""
    rec = grade(ex_id, getattr(submissions, name))
    assert rec["possible"] > 0 and rec["earned"] == 0, format_record(rec)
    assert f"your answer called {module}." in format_record(rec)


@pytest.mark.parametrize(
    "name, said",
    [
        ("read_program_after_switching_off_the_hook", "switched off the grader's record of calls"),
        ("read_program_in_a_thread", "called labkernels.ch05_fusion.inductor."),
        ("read_program_with_a_copy_of_the_course_reader", "called labkernels.ch05_fusion.inductor."),
        ("softmax_by_a_copy_of_the_course_kernel", "called labkernels.ch03_triton.softmax."),
    ],
)
def test_ways_around_the_call_record_are_refused(name, said):
    """Issue 42: the call record was a profile hook in the answer's thread, keyed by file name. Switching it
    off, calling from a thread, or running the course's source under another file name each scored 5.3's
    points with the course's own reader (3/3), and chapter 03's softmax copied into the answer 3.2's."""
    rec = grade("3.2" if name.startswith("softmax") else "5.3", getattr(submissions, name))
    assert rec["possible"] > 0 and rec["earned"] == 0, format_record(rec)
    assert said in format_record(rec), format_record(rec)


def test_stale_result_fails_on_fresh_inputs():
    rec = grade("T.1", submissions.stale_cache)
    assert rec["earned"] == 0, format_record(rec)


def test_hanging_submission_is_stopped_and_scores_zero():
    rec = grade("T.1", submissions.hangs, timeout_s=15)
    assert rec["earned"] == 0
    assert "timed out" in rec["error"] and "small" in rec["error"]


def test_crashing_submission_is_reported_and_scores_zero():
    rec = grade("T.1", submissions.crashes)
    assert rec["earned"] == 0
    assert "crashed (SIGABRT)" in format_record(rec)  # each case says so; the worker restarts for the next


def test_lambdas_and_non_answers_are_refused_with_a_reason():
    rec = grade("T.1", lambda x, out: None)
    assert rec["earned"] == 0 and "lambda" in rec["error"]
    rec = grade("T.1", object())
    assert rec["earned"] == 0 and "plain data" in rec["error"]


def test_speed_cases_are_skipped_on_the_cpu_lane_and_said_so():
    if labkernels.on_gpu():
        pytest.skip("CPU-lane behaviour")
    rec = grade("T.1", submissions.correct, speed=True)
    assert rec["possible"] == 0
    assert [c["status"] for c in rec["cases"]] == ["skip"]
    text = format_record(rec)
    assert "CPU lane" in text and "no GPU to time" in text  # true of every speed case: kernels, cuBLAS, cuDNN
    # Before: "SKIP ... [0/1]", then "Score: 0/0", read as a point lost. A skipped case shows no score.
    points = rec["cases"][0]["points"]
    assert f"[0/{points:g}]" not in text and "[not graded here: " in text
    assert "graded on a GPU, not here)" in text.splitlines()[-1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_speed_case_runs_on_the_gpu():
    rec = grade("T.1", submissions.correct, speed=True)
    assert (rec["earned"], rec["possible"]) == (1, 1), format_record(rec)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["correct", "two_launches_and_scratch"])
def test_a_triton_answer_is_timed_by_the_grader_s_replay_of_its_kernels(name):
    rec = grade("T.2", getattr(submissions, name), speed=True)
    assert (rec["earned"], rec["possible"]) == (1, 1), format_record(rec)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["slow_with_a_patched_clock", "slow_with_a_patched_worker_timer"])
def test_a_clock_patched_in_the_answer_s_process_moves_no_replayed_time(name):
    """The attacks have teeth where the answer's own worker holds the clock (T.1), and none where the grader
    replays its kernels (T.2)."""
    own_clock = grade("T.1", getattr(submissions, name), speed=True)
    assert own_clock["earned"] == 1, format_record(own_clock)
    replayed = grade("T.2", getattr(submissions, name), speed=True)
    assert replayed["earned"] == 0, format_record(replayed)
    assert "of the measured copy bandwidth" in format_record(replayed)


def test_an_answer_that_reads_a_dunder_attribute_keeps_its_own_module_name():
    """`type(w).__name__` puts `__name__` among the function's names: shipping the test module's `__name__`
    with it renamed the answer's module, and its own kernel was refused as "not yours"."""
    from labkernels.grading.sandbox import bundle

    assert "\n__name__ = " not in bundle(submissions.slow_with_a_patched_worker_timer)["source"]
    rec = grade("T.2", submissions.slow_with_a_patched_worker_timer)
    assert (rec["earned"], rec["possible"]) == (1, 1), format_record(rec)


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(KeyError, match="no exercise '9.9'"):
        grade("9.9", submissions.correct)


def test_strip_solutions_keeps_indentation_and_rejects_unbalanced_markers():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    assert (
        strip_solutions(src)
        == 'def f(x):\n    raise NotImplementedError("Exercise: replace this line with your solution")'
    )
    with pytest.raises(ValueError, match="without an END"):
        strip_solutions("### BEGIN SOLUTION\nx = 1\n")
    with pytest.raises(ValueError, match="without a BEGIN"):
        strip_solutions("x = 1\n### END SOLUTION\n")


def test_committed_exercises_are_in_sync_with_solutions():
    assert out_of_sync(ROOT / "solutions", ROOT / "exercises") == []


def _notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_make_grade_survives_broken_hanging_and_failing_notebooks(tmp_path):
    sub = tmp_path / "class"
    sub.mkdir()
    (sub / "00_roofline_broken.ipynb").write_text("{ this is not json")
    _notebook(sub / "01_jit_hangs.ipynb", ["import time\ntime.sleep(120)"])
    _notebook(sub / "02_strides_raises.ipynb", ["raise ValueError('oops')", "x = 1"])
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "labkernels", "grade", str(sub), "--json", str(out), "--cell-timeout", "10"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "not a readable notebook" in proc.stdout
    assert "longer than 10 s" in proc.stdout
    assert "its check cell did not run" in proc.stdout
    reports = json.loads(out.read_text())
    chapters = len(list((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")))
    assert len(reports) == chapters  # one per chapter: those not handed in score zero and say so
    assert "no notebook for chapter 06 was handed in" in proc.stdout
    assert all(r["earned"] == 0 for rep in reports for r in rep["exercises"])


def test_make_grade_on_a_missing_folder_says_so(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "labkernels", "grade", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no such folder" in proc.stderr


def test_write_exercises_round_trip(tmp_path):
    sol = tmp_path / "solutions"
    sol.mkdir()
    _notebook(sol / "00_x.ipynb", ["def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"])
    ex = tmp_path / "exercises"
    write_exercises(sol, ex)
    assert out_of_sync(sol, ex) == []
    assert "NotImplementedError" in (ex / "00_x.ipynb").read_text()
    (sol / "00_x.ipynb").write_text((sol / "00_x.ipynb").read_text().replace("def f()", "def g()"))
    assert out_of_sync(sol, ex) == [f"{ex / '00_x.ipynb'} is stale"]


# --- 3.5 and 3.6: reading a profile ------------------------------------------------------------------------


def test_occupancy_formula_agrees_with_ncu_on_the_shipped_profiles():
    """The arithmetic 3.5 teaches, min(limits) x warps per block / 64, is what ncu reports on the H200."""
    from labkernels.grading.exercises_ch03 import PROFILE_TABLES, _occupancy_reference, occupancy_rows_of
    from labkernels.results import load_reference

    checked = 0
    for table in PROFILE_TABLES:
        limiters = {r["case"]: r.get("occupancy_limiter") for r in load_reference(table).rows}
        for case, row, theoretical in occupancy_rows_of(table):
            tied, fraction = _occupancy_reference(row)
            assert tied == set(limiters[case].split("=")), (case, row, limiters[case])
            if theoretical is None:
                continue
            assert abs(fraction - theoretical / 100) <= 0.01, (case, row, fraction, theoretical)
            checked += 1
    assert checked >= 5, f"only {checked} shipped rows have the occupancy limits and ncu's occupancy"


def test_bound_rule_reads_the_shipped_ch04_rows():
    from labkernels.grading.exercises_ch03 import _bound_reference, bound_rows_of

    rows = bound_rows_of("ch04_profile")
    assert rows, "ch04_profile has no row with both DRAM and SM throughput"
    for case, row in rows:
        assert _bound_reference(row) <= {"memory", "compute", "latency"}, case


def read_profile_occupancy(row):
    limits = {k: row["limit_" + k] for k in ("registers", "shared_mem", "blocks", "warps")}
    limiter = min(limits, key=limits.get)
    return limiter, min(1.0, limits[limiter] * row["warps_per_block"] / row["max_warps_per_sm"])


def read_profile_occupancy_percent(row):
    limiter, fraction = read_profile_occupancy(row)
    return limiter, 100 * fraction


def read_profile_occupancy_h200_only(row):
    limits = {k: row["limit_" + k] for k in ("registers", "shared_mem", "blocks", "warps")}
    limiter = min(limits, key=limits.get)
    return limiter, limits[limiter] * row["warps_per_block"] / 64


def read_profile_occupancy_constant(row):
    return "registers", 0.5


def read_profile_bound(row):
    dram, sm = row["dram_pct"], row["sm_pct"]
    if max(dram, sm) < 60:
        return "latency"
    return "memory" if dram >= sm else "compute"


def read_profile_bound_strict_threshold(row):
    dram, sm = row["dram_pct"], row["sm_pct"]
    if max(dram, sm) <= 60:
        return "latency"
    return "memory" if dram >= sm else "compute"


def read_profile_bound_latency(row):
    return "latency"


def read_profile_bound_never_latency(row):
    return "memory" if row["dram_pct"] >= row["sm_pct"] else "compute"


@pytest.mark.parametrize(
    "ex_id, name, earned, reason",
    [
        ("3.5", "read_profile_occupancy", 2, ""),
        ("3.5", "read_profile_occupancy_percent", 1, "is a percentage"),
        ("3.5", "read_profile_occupancy_h200_only", 1, "theoretical occupancy"),
        ("3.5", "read_profile_occupancy_constant", 0, "expected"),
        ("3.6", "read_profile_bound", 1, ""),
        ("3.6", "read_profile_bound_strict_threshold", 0, "exactly at the threshold"),
        ("3.6", "read_profile_bound_latency", 0, "'latency', expected"),
        ("3.6", "read_profile_bound_never_latency", 0, "expected 'latency'"),
    ],
)
def test_read_a_profile_grades_the_rule_not_a_constant(ex_id, name, earned, reason):
    rec = grade(ex_id, globals()[name])
    assert rec["error"] is None, format_record(rec)
    assert rec["earned"] == earned, format_record(rec)
    assert reason in format_record(rec)


def test_speed_cases_are_timed_only_after_a_passed_correctness_case():
    from labkernels.grading import notebooks

    def record(earned, possible=3):
        return {"earned": earned, "possible": possible}

    assert notebooks.skip_timing(record(0))  # wrong everywhere: timing it would earn nothing
    assert not notebooks.skip_timing(record(1))  # partly right: its speed is graded
    assert not notebooks.skip_timing(record(0, possible=0))  # no correctness part on this lane
    assert not notebooks.skip_timing(None)  # a speed-only exercise


def test_timed_calls_start_their_clock_behind_gpu_work_so_launch_latency_is_not_timed():
    """The worker busies the GPU before recording the start event: on the GPU the event then runs once the
    host has launched the answer's kernels (simulated here: the order of the calls is what matters)."""
    from labkernels.grading import child

    order = []

    names = iter(["start", "end"])  # the worker makes its start event first

    class Event:
        def __init__(self, enable_timing):
            self.name = next(names)

        def record(self):
            order.append(f"record {self.name}")

        def elapsed_time(self, other):
            return 0.05

    worker = object.__new__(child.Worker)
    worker.event, worker.synchronize = Event, lambda: order.append("synchronize")
    worker.gpu_busy = lambda cycles: order.append(f"busy {cycles}")
    ms = worker._timed(lambda x: order.append("answer"), (1,), {})
    assert ms == 0.05
    assert order == [f"busy {child.GPU_BUSY_CYCLES}", "record start", "answer", "record end", "synchronize"]


class _KernelClient:
    """A stand-in for nbclient's NotebookClient: fails per `script` ("start": before any cell runs, "cell":
    after the first cell ran), then runs every code cell."""

    script: list = []
    starts = 0

    def __init__(self, nb, **_):
        self.nb = nb

    def execute(self, **_):
        type(self).starts += 1
        failure = self.script.pop(0) if self.script else None
        if failure == "start":
            raise RuntimeError("Kernel died before replying to kernel_info")
        for i, cell in enumerate(c for c in self.nb.cells if c.cell_type == "code"):
            cell.execution_count = i + 1
            if failure == "cell":
                raise RuntimeError("the kernel stopped answering")


@pytest.mark.parametrize(
    ("script", "starts", "problem"),
    [
        (["start"], 2, None),  # a kernel that never started: started again, and the notebook runs
        (["start"] * 5, 3, "Kernel died before replying"),  # at most KERNEL_STARTS attempts
        (["cell"], 1, "the kernel stopped answering"),  # a cell ran: never run twice
    ],
)
def test_a_kernel_that_fails_to_start_is_started_again(tmp_path, monkeypatch, script, starts, problem):
    import nbclient

    from labkernels.grading import notebooks

    monkeypatch.setattr(nbclient, "NotebookClient", _KernelClient)
    monkeypatch.setattr(_KernelClient, "script", list(script))
    monkeypatch.setattr(_KernelClient, "starts", 0)
    monkeypatch.setattr(notebooks, "kill_descendants", lambda: 0)  # this process's children are pytest's
    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("y = 2")]
    nb = nbformat.v4.new_notebook(cells=cells)
    got = notebooks.execute_notebook(nb, tmp_path, 10, tmp_path / "submitted.jsonl")
    assert _KernelClient.starts == starts
    assert (got is None) if problem is None else (problem in got)


def _in_a_worker(answer, arg):
    """answer(arg), run in a grading worker of the CPU lane, which is then closed."""
    import time

    from labkernels.grading import sandbox
    from labkernels.grading.remote import Student

    student = Student(
        sandbox.bundle(answer), requires=None, deadline=time.monotonic() + 120, lane="cpu", timeout_s=120
    )
    try:
        return student.map([(arg,)])[0]
    finally:
        student.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="workers are forked from a zygote only without CUDA")
def test_forked_workers_start_as_fresh_ones_would_and_a_killed_zygote_is_replaced():
    from labkernels.grading.remote import worker_env

    first, second = (_in_a_worker(submissions.worker_facts, 0) for _ in range(2))
    sandbox_env = {"TRITON_INTERPRET", "HOME", "TMPDIR", "TRITON_CACHE_DIR"}  # set by labkernels, a sandbox
    for folder, own_session, env_names, isolated, _ in (first, second):
        assert Path(folder).name.startswith("labkernels-worker-") and own_session and isolated
        assert set(env_names) - sandbox_env == set(worker_env("cpu")) - sandbox_env  # nothing else
    assert first[0] != second[0], "each worker has a folder of its own"
    zygote, area = first[4], Path(first[0]).parent  # a zygote's workers have their folders in its area
    assert Path(second[0]).parent == area and zygote == second[4] != os.getpid(), "both from one zygote"
    _in_a_worker(submissions.kills, zygote)  # an answer may end the zygote (outside a sandbox, it can) ...
    after = _in_a_worker(submissions.worker_facts, 0)
    assert after[4] != os.getpid() and Path(after[0]).name.startswith("labkernels-worker-")  # ... fine
    if zygote != 1:  # not sandboxed (where the zygote is PID 1 of its namespace, which no member can kill)
        assert Path(after[0]).parent != area, "the next worker forks from a new zygote"


def test_check_without_grading_cases_says_why(monkeypatch):
    """The class bundle leaves the grading cases out: `check` there says so instead of 'known: none'."""
    from labkernels.grading import registry

    monkeypatch.setattr(registry, "discover", lambda: {})
    with pytest.raises(KeyError, match="holds no grading cases"):
        registry.get("3.1")
    monkeypatch.setattr(registry, "discover", lambda: {"3.2": object()})
    with pytest.raises(KeyError, match="no exercise '3.1'; known: 3.2"):
        registry.get("3.1")
