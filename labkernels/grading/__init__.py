"""Graded exercises: `check("3.1", answer)` for instant feedback, `make grade` for a class.

`check` runs the correctness cases (same verdicts in both lanes); `check_speed` runs the performance cases
(GPU lane only). Both grade in a sandboxed child on fresh random inputs and print one line per case.
"""

from __future__ import annotations

import json
import os

from labkernels.grading.core import CaseFailed, Exercise, Grader, exercise

__all__ = ["CaseFailed", "Exercise", "Grader", "check", "check_speed", "exercise", "grade"]

LOG_ENV = "LABKERNELS_GRADE_LOG"  # `make grade` collects every check's result from this JSON-lines file


def grade(ex_id: str, answer, *, speed: bool = False, timeout_s: float | None = None) -> dict:
    """Grade `answer` for exercise `ex_id`; returns the score record (no printing)."""
    from labkernels.grading import sandbox
    from labkernels.grading.registry import get

    ex = get(ex_id)
    possible = ex.speed_points if speed else ex.points
    try:
        payload = sandbox.bundle(answer)
    except TypeError as e:
        outcome = {"cases": [], "error": f"cannot grade this answer: {e}"}
    else:
        outcome = sandbox.run(ex_id, payload, speed=speed, timeout_s=timeout_s or ex.timeout_s)
    cases = outcome["cases"]
    skipped = [c for c in cases if c["status"] == "skip"]
    if skipped and len(skipped) == len(cases):
        possible = 0
    earned = sum(c["earned"] for c in cases)
    if cases and not outcome["error"]:
        declared = sum(c["points"] for c in cases)
        if declared != (ex.speed_points if speed else ex.points) and not skipped:
            raise RuntimeError(
                f"exercise {ex_id}: its cases add up to {declared} points, not the declared total"
            )
    record = {
        "exercise": ex_id,
        "title": ex.title,
        "speed": speed,
        "earned": earned,
        "possible": possible,
        "cases": cases,
        "error": outcome["error"],
    }
    _log(record)
    return record


def _log(record: dict) -> None:
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def format_record(record: dict) -> str:
    kind = "speed" if record["speed"] else "correctness"
    lines = [f"Exercise {record['exercise']} · {record['title']} · {kind}"]
    for c in record["cases"]:
        mark = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}[c["status"]]
        why = f" — {c['reason']}" if c["reason"] else ""
        lines.append(f"  {mark}  {c['case']}{why}  [{c['earned']:g}/{c['points']:g}]")
    if record["error"]:
        lines.append(f"  STOPPED: {record['error']}")
    lines.append(f"  Score: {record['earned']:g}/{record['possible']:g}")
    return "\n".join(lines)


def check(ex_id: str, answer, timeout_s: float | None = None) -> None:
    """Grade the correctness cases of an exercise and print the verdicts."""
    print(format_record(grade(ex_id, answer, timeout_s=timeout_s)))


def check_speed(ex_id: str, answer, timeout_s: float | None = None) -> None:
    """Grade the performance cases (GPU lane; on the CPU lane they are skipped, and it says so)."""
    print(format_record(grade(ex_id, answer, speed=True, timeout_s=timeout_s)))
