"""Issue 17: hostile submissions (tests/attacks/) score zero, each with a reason the learner can read.

Every attack here scored > 0 against the grader before its trust-model rewrite (forged records, answers that
shared the grading process, references computed after the answer from the same tensors, no kernel check,
possible totals depending on what was handed in, processes outliving the grading).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import labkernels
from labkernels.grading import format_record, grade, make_record, sandbox
from labkernels.grading.registry import get

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
os.environ["LABKERNELS_EXTRA_EXERCISES"] = "grading_fixtures"
# ... which the grading processes these tests start must be able to import, as test_grading's do
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
)

from attacks import answers as A  # noqa: E402
from attacks import notebooks as N  # noqa: E402
from attacks import weak_cases as W  # noqa: E402
from once import once_per_run  # noqa: E402


def _zero(ex_id, answer, reason):
    rec = grade(ex_id, answer)
    text = format_record(rec)
    assert rec["earned"] == 0, text
    assert reason in text, text
    return rec


@pytest.mark.parametrize(
    "name, reason",
    [
        ("forge_results_and_exit", "ended its process with exit code 1"),
        ("peek_caller_frames", "never written"),
        ("patch_comparison", "never written"),
        ("hard_exit_zero", "exit code 0 (os._exit?)"),
    ],
)
def test_answers_that_attack_the_grading_process_score_zero(name, reason):
    _zero("T.1", getattr(A, name), reason)


def test_code_run_at_definition_time_cannot_reach_the_grader():
    ex = get("T.1")
    rec = make_record(ex, False, sandbox.run(ex, A.PATCH_AT_DEFINITION, speed=False, timeout_s=60), "cpu")
    assert rec["earned"] == 0 and "wrong values" in format_record(rec), format_record(rec)


def test_sys_exit_midway_keeps_the_passed_case_and_says_why():
    rec = grade("T.1", A.exit_zero_midway)
    assert rec["earned"] == 1 and rec["error"] is None, format_record(rec)
    assert "sys.exit(0)" in format_record(rec)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("add_relu_zero_everything", "launched no Triton kernel"),
        ("add_relu_set_out", "replaced the memory of tensor argument 2"),
        ("add_relu_set_input", "replaced the memory of tensor argument 0"),
        ("add_relu_torch_ops", "aten::add"),
        (
            "add_relu_course_kernel",
            "labkernels.ch03_triton.add_relu._add_relu_kernel, a kernel that is not yours",
        ),
        ("add_relu_grader_reference", "aten::relu"),
    ],
)
def test_kernel_exercise_needs_the_learners_own_kernel(name, reason):
    _zero("3.1", getattr(A, name), reason)


def test_inputs_changed_by_the_answer_fail_even_without_a_kernel_requirement():
    def zero_input(x, out):
        x.zero_()
        out.fill_(1.0)

    # T.1 has no kernel requirement: the input check alone catches it.
    rec = grade("T.1", zero_input)
    assert rec["earned"] == 0 and "changed its input" in format_record(rec), format_record(rec)


def test_grouped_order_needs_ints_and_cannot_import_the_graders_reference():
    _zero("3.4", A.grouped_order_floats, "as two ints")
    _zero("3.4", A.grouped_order_from_grader, "is the grader's: an answer cannot import it")


def test_cpp_exercises_refuse_torch_ops_and_python_kernels():
    """Issue 42: `at::cpu::clamp` (ATen's kernel called without the dispatcher) went unseen and scored 6/6;
    the library's imports now say what it calls."""
    _zero("1.1", A.clamp_scale_with_at_clamp, "calls torch's at::cpu::clamp, at::cpu::mul")
    _zero("1.3", A.register_relu_sq_in_python, "registered from Python")


def test_a_kernel_that_only_the_interpreter_runs_is_refused():
    """Issue 42: under TRITON_INTERPRET=1 a kernel's body runs as Python, so host Python inside it passed the
    CPU lane (3/3); each launch is now also compiled for an sm_90 target. On a GPU its launch fails."""
    rec = grade("T.1", A.twice_plus_one_with_host_python)
    assert rec["earned"] == 0, format_record(rec)
    if not labkernels.on_gpu():
        assert "does not compile for a GPU" in format_record(rec), format_record(rec)


# --- issue 42: weak cases ----------------------------------------------------------------------------------


def _every_case_zero(ex_id: str, answer, reasons: tuple[str, ...]) -> dict:
    """Grade `answer` (a code bundle or plain data): no case earns a point, and each failed case says why in
    one of `reasons`."""
    ex = get(ex_id)
    payload = answer if isinstance(answer, dict) else sandbox.bundle(answer)
    rec = make_record(
        ex, False, sandbox.run(ex, payload, speed=False, timeout_s=ex.timeout_s), labkernels.LANE
    )
    text = format_record(rec)
    graded = [c for c in rec["cases"] if c["status"] != "skip"]
    assert rec["earned"] == 0 and graded, text
    assert all(c["status"] == "fail" and any(r in c["reason"] for r in reasons) for c in graded), text
    return rec


@pytest.mark.parametrize(
    "name, reasons",
    [
        # uninitialised memory: wrong, or NaN where a value belongs
        ("CLAMP_SCALE_GARBAGE", ("wrong values", "never written")),
        ("CLAMP_SCALE_ZEROES_INPUT", ("changed its input",)),
    ],
)
def test_an_op_that_only_checks_its_inputs_earns_neither_builds_nor_rejects(name, reasons):
    """Scored 3/6 at cf01c80: "builds" and "rejects bad input" counted without a right value."""
    _every_case_zero("1.1", getattr(W, name), reasons)


@pytest.mark.parametrize("answer", [W.WILL_REBUILD_ALWAYS, W.WILL_REBUILD_NEVER], ids=["True", "False"])
def test_the_same_rebuild_prediction_for_every_edit_earns_nothing(answer):
    """A constant True scored 1/4 at cf01c80 (the header in a new process rebuilds)."""
    _every_case_zero("1.2", answer, ("wrong prediction for",))


@pytest.mark.parametrize("name", list(W.settings_constants()))
def test_constant_settings_earn_nothing(name):
    """Constant settings scored 3/3 at cf01c80: IEEE float32 meets every tolerance."""
    _every_case_zero(
        "4.4", W.settings_constants()[name], ("relative error", "on the H200", "cudnn_benchmark=")
    )


def test_timed_repetitions_get_fresh_inputs_so_a_memo_fails():
    """Speed cases are skipped on the CPU lane: drive the timing (rotation + read-back check) directly."""
    import torch

    from labkernels.grading.core import Grader
    from labkernels.grading.remote import Student

    def timed(answer):
        g = Grader(lane="cpu")
        student = Student(
            sandbox.bundle(answer), requires=None, deadline=time.monotonic() + 120, lane="cpu", timeout_s=120
        )
        student.grader, g.student = g, student
        try:
            with g.case("timed", points=1):
                x = g.randn(2001)
                out = g.guarded_empty((2001,), torch.float32)
                g.time_answer(
                    lambda: student(x, out),
                    check=lambda x, out: g.check_close(out, 2 * x + 1, atol=1e-6, rtol=1e-6),
                )
        finally:
            student.close()
        return g.results[0]

    assert timed(A.memo_by_buffer)["status"] == "pass"
    bad = timed(A.memo_by_shape)
    assert bad["status"] == "fail" and "fresh inputs" in bad["reason"], bad


def test_variants_are_fresh_and_reproducible():
    import torch

    from labkernels.grading.core import make_variants

    x, out = torch.randn(8, 5).t(), torch.empty(5, 8)
    sets = make_variants([x, out], [False, True], 3, seed=7)
    assert sets[0][0].stride() == x.stride()
    assert not torch.equal(sets[0][0], sets[1][0])
    assert torch.equal(make_variants([x, out], [False, True], 3, seed=7, only=2)[0][0], sets[2][0])
    assert torch.isnan(sets[1][1]).all()


# --- make grade: notebooks --------------------------------------------------------------------------------


def _grade_folder(folder: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list]:
    out = tmp_path / f"{folder.name}.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "labkernels",
            "grade",
            str(folder),
            "--json",
            str(out),
            "--cell-timeout",
            "120",
        ]
        + list(extra),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    return proc, json.loads(out.read_text()) if out.exists() else []


def _earned(reports):
    return sum(r["earned"] for rep in reports for r in rep["exercises"])


def _possible(reports):
    return sum(r["possible"] for rep in reports for r in rep["exercises"])


@pytest.fixture(scope="module")
def graded_attacks(tmp_path_factory):
    """One class folder per notebook attack, graded once per test run (`once_per_run`)."""
    return once_per_run(tmp_path_factory, "attacks", _grade_the_attacks)


def _grade_the_attacks(tmp: Path) -> dict:
    results = {}
    for name in ["forge_log", "env_injection", "leftover", "only_3_4"]:
        folder = tmp / name
        folder.mkdir()
        N.write(name, folder)
        results[name] = _grade_folder(folder, tmp)
    return results


def test_records_written_by_the_notebook_are_not_scores(graded_attacks):
    proc, reports = graded_attacks["forge_log"]
    assert proc.returncode == 0, proc.stderr
    assert _earned(reports) == 0
    assert "its check cell did not run" in proc.stdout


def test_the_notebooks_environment_does_not_reach_the_grader(graded_attacks):
    proc, reports = graded_attacks["env_injection"]
    assert _earned(reports) == 0, proc.stdout
    assert "NotImplementedError" in proc.stdout


def test_processes_the_notebook_started_are_killed(graded_attacks):
    proc, _ = graded_attacks["leftover"]
    assert proc.returncode == 0, proc.stderr
    time.sleep(0.5)
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and N.LEFTOVER.encode() in (entry / "cmdline").read_bytes():
                alive.append(entry.name)
        except OSError:
            continue
    assert alive == [], f"left running: {alive}"


def test_possible_total_counts_every_chapter_whatever_was_handed_in(graded_attacks):
    from labkernels.grading import possible_points
    from labkernels.grading.registry import discover

    proc, reports = graded_attacks["only_3_4"]
    want = sum(
        possible_points(ex, speed, labkernels.LANE)
        for ex in discover().values()
        if ex.chapter.isdigit()
        for speed in (False, True)
    )
    assert _earned(reports) == 2 and _possible(reports) == want, proc.stdout
    assert "no notebook for chapter 00 was handed in" in proc.stdout


def test_duplicate_and_misnamed_notebooks_are_reported(tmp_path):
    folder = tmp_path / "dups"
    folder.mkdir()
    N.write("only_3_4", folder, "03_first.ipynb")
    N.write("only_3_4", folder, "03_second.ipynb")
    N.write("only_3_4", folder, "triton.ipynb")
    proc, reports = _grade_folder(folder, tmp_path)
    assert _earned(reports) == 2, proc.stdout  # counted once
    assert "a second chapter 03 notebook" in proc.stdout
    assert "must start with a chapter" in proc.stdout
