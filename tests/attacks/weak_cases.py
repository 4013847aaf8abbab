"""Answers that know nothing of the task, which weak cases let score (issue 42, measured at cf01c80): 4.4 with
constant settings 3/3, 1.1 with an op that only checks its inputs 3/6, 1.2 answering a constant 1/4.

Each is built from the solutions notebook's own answer where it has something to take (1.1's input checks,
4.4's settings for the chapter's workloads), so the attacks follow the exercises when they change. Each is a
code bundle (`{"kind": "code", ...}` or plain data), the way the grader receives a notebook's answer.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def solution_cell(chapter: str, name: str) -> str:
    """The source of the cell of solutions/`chapter`_*.ipynb that defines the function `name`."""
    (path,) = SOLUTIONS.glob(f"{chapter}_*.ipynb")
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and re.search(rf"^def {name}\(", cell.source, re.MULTILINE):
            return cell.source
    raise LookupError(f"{path.name} defines no {name}()")


def solution(chapter: str, name: str):
    """The function `name` of solutions/`chapter`_*.ipynb, defined by running its cell alone."""
    namespace: dict = {}
    exec(solution_cell(chapter, name), namespace)  # noqa: S102  (the course's own solution cell)
    return namespace[name]


def constant(entry: str, params: str, value) -> dict:
    """A function `entry(params)` that returns `value` whatever it is asked."""
    return {"kind": "code", "entry": entry, "source": f"def {entry}({params}):\n    return {value!r}\n"}


# --- 1.1: the solution's checks, then no computation --------------------------------------------------------


def clamp_scale_checks_only(body: str) -> str:
    """The solution's clamp_scale up to its last TORCH_CHECK statement, then `body` instead of the work: it
    builds, and rejects every bad input the task names."""
    lines = solution("01", "clamp_scale_source")().splitlines()
    last = max(i for i, line in enumerate(lines) if line.lstrip().startswith("TORCH_CHECK"))
    while not lines[last].rstrip().endswith(");"):  # a statement over several lines
        last += 1
    return "\n".join(["#include <cstring>", *lines[: last + 1], f"  {body}", "}", ""])


# Returns uninitialised memory of the right shape and dtype.
CLAMP_SCALE_GARBAGE = clamp_scale_checks_only("return at::empty_like(x);")
# Zeroes its input in place (no ATen op: plain memory), then returns an uninitialised tensor.
CLAMP_SCALE_ZEROES_INPUT = clamp_scale_checks_only(
    "std::memset(x.data_ptr(), 0, x.nbytes());\n  return at::empty_like(x);"
)

# --- 1.2: the same prediction for every edit ----------------------------------------------------------------

WILL_REBUILD_ALWAYS = constant("will_rebuild", "api, edit, process", True)
WILL_REBUILD_NEVER = constant("will_rebuild", "api, edit, process", False)

# --- 4.4: one workload's settings for every workload --------------------------------------------------------


# IEEE float32 and no flags: within every tolerance, whatever the workload.
SETTINGS_SAFEST = constant(
    "settings", "task_name, task", {"precision": "float32", "channels_last": False, "cudnn_benchmark": False}
)


def settings_constants() -> dict[str, dict]:
    """The safest constant, and for each workload of the chapter an answer that gives the solution's settings
    for it to every task."""
    from labkernels.grading.exercises_ch04 import TASKS

    settings = solution("04", "settings")
    answers = {"float32, no flags": SETTINGS_SAFEST}
    for name, task in TASKS.items():
        answers[f"{name}'s settings"] = constant("settings", "task_name, task", settings(name, dict(task)))
    return answers
