"""Graded exercises: `check("3.1", answer)` for instant feedback, `make grade` for a class.

`check` runs the correctness cases (same verdicts in both lanes); `check_speed` runs the performance cases
(GPU lane only). Both grade on fresh random inputs and print one line per case; the answer runs in a worker
process that never sees a reference or a score (see `remote` and `child`). Under `make grade` they only hand
the answer in: the grading process grades it itself (see `notebooks`).
"""

from __future__ import annotations

import json
import os

from labkernels.grading.core import CaseFailed, Exercise, Grader, exercise

__all__ = ["CaseFailed", "Exercise", "Grader", "check", "check_speed", "exercise", "grade"]

# Set by `make grade` in the notebook's kernel: `check` then only hands the answer in (as source, appended to
# this JSON-lines file); the grading process grades it later, itself. Nothing the kernel writes is a score.
SUBMIT_ENV = "LABKERNELS_GRADE_SUBMIT"


def grade(ex_id: str, answer, *, speed: bool = False, timeout_s: float | None = None) -> dict:
    """Grade `answer` for exercise `ex_id` here (the answer runs in a worker); returns the score record."""
    from labkernels.grading import sandbox
    from labkernels.grading.registry import get
    from labkernels.lane import LANE

    ex = get(ex_id)
    try:
        payload = sandbox.bundle(answer)
    except TypeError as e:
        outcome = {"cases": [], "error": f"cannot grade this answer: {e}"}
    else:
        outcome = sandbox.run(ex, payload, speed=speed, timeout_s=timeout_s or ex.timeout_s)
    return make_record(ex, speed, outcome, LANE)


def possible_points(ex, speed: bool, lane: str) -> float:
    """From the registry, whatever was handed in: speed points count on the GPU lane only."""
    if speed:
        return ex.speed_points if lane == "gpu" else 0
    return ex.points


def make_record(ex, speed: bool, outcome: dict, lane: str) -> dict:
    cases = outcome["cases"]
    possible = possible_points(ex, speed, lane)
    if not speed:  # correctness points this machine cannot grade (Hopper-only cases) are not possible here
        possible -= sum(c["points"] for c in cases if c["status"] == "skip" and not c.get("gpu_only", False))
    earned = min(sum(c["earned"] for c in cases if c["status"] == "pass"), possible)  # never above possible
    declared = sum(c["points"] for c in cases if c.get("gpu_only", False) == speed)
    error = outcome["error"]
    if cases and not error and declared != (ex.speed_points if speed else ex.points):
        skipped = any(c["status"] == "skip" for c in cases)
        if not skipped:  # a defect of the exercise's definition, not of the answer
            raise RuntimeError(
                f"exercise {ex.ex_id}: its cases add up to {declared} points, not the declared total"
            )
    return {
        "exercise": ex.ex_id,
        "title": ex.title,
        "speed": speed,
        "earned": earned,
        "possible": possible,
        "cases": cases,
        "error": error,
    }


def submit(ex_id: str, answer, path: str) -> None:
    from labkernels.grading import sandbox

    try:
        payload = sandbox.bundle(answer)
    except TypeError as e:
        payload = {"kind": "error", "error": f"cannot grade this answer: {e}"}
    with open(path, "a") as f:
        f.write(json.dumps({"exercise": str(ex_id), "answer": payload}) + "\n")


def format_record(record: dict) -> str:
    kind = "speed" if record["speed"] else "correctness"
    lines = [f"Exercise {record['exercise']} · {record['title']} · {kind}"]
    not_graded = 0.0
    for c in record["cases"]:
        mark = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[c["status"]]
        why = f" — {c['reason']}" if c["reason"] else ""
        if c["status"] == "skip":  # not graded here: no points lost, none counted
            not_graded += c["points"]
            lines.append(f"  {mark}  {c['case']}{why}  [not graded here: {_points(c['points'])}]")
        else:
            lines.append(f"  {mark}  {c['case']}{why}  [{c['earned']:g}/{c['points']:g}]")
    if record["error"]:
        lines.append(f"  STOPPED: {record['error']}")
    score = f"  Score: {record['earned']:g}/{record['possible']:g}"
    if not_graded:
        where = "a Hopper GPU" if any("Hopper" in c["reason"] for c in record["cases"]) else "a GPU"
        score += f" (and {_points(not_graded)} graded on {where}, not here)"
    lines.append(score)
    return "\n".join(lines)


def _points(points: float) -> str:
    return f"{points:g} point" + ("" if points == 1 else "s")


def check(ex_id: str, answer, timeout_s: float | None = None) -> None:
    """Grade the correctness cases of an exercise and print the verdicts (under `make grade`: hand it in)."""
    if os.environ.get(SUBMIT_ENV):
        submit(ex_id, answer, os.environ[SUBMIT_ENV])
        print(f"Exercise {ex_id}: handed in; `make grade` grades it after the notebook has run")
        return
    print(format_record(grade(ex_id, answer, timeout_s=timeout_s)))


def check_speed(ex_id: str, answer, timeout_s: float | None = None) -> None:
    """Grade the performance cases (GPU lane; on the CPU lane they are skipped, and it says so)."""
    if os.environ.get(SUBMIT_ENV):
        submit(ex_id, answer, os.environ[SUBMIT_ENV])
        print(f"Exercise {ex_id}: handed in; `make grade` grades its speed after the notebook has run")
        return
    print(format_record(grade(ex_id, answer, speed=True, timeout_s=timeout_s)))
