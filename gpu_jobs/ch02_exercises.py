"""Exercises 2.2 and 2.3 on the GPU lane: the solutions notebook's answers graded (2.3's speed case: a
(4, 4096, 4096) fp32 batch with its matrices transposed, >= 60% of measured copy), and the records written to
$OUT/ch02_exercises/grades.csv with labkernels.results."""

import os
import sys
import tempfile
from pathlib import Path

import labkernels  # noqa: F401  (first: it picks the lane)

# isort: split
import nbformat

from labkernels.grading import format_record, grade
from labkernels.results import record

ROOT = Path(__file__).resolve().parent.parent
dest = Path(os.environ.get("OUT", "/tmp/out")) / "ch02_exercises"
dest.mkdir(parents=True, exist_ok=True)

# The solution's code cells (not the check cells) as a module: the grader ships answers from source files.
cells = nbformat.read(ROOT / "solutions/02_strides.ipynb", as_version=4).cells
code = [c.source for c in cells[1:] if c.cell_type == "code" and "check(" not in c.source]
code = [c for c in code if "check_speed(" not in c]
folder = Path(tempfile.mkdtemp())
(folder / "ch02_solution.py").write_text("\n\n\n".join(["import torch", *code]) + "\n")
sys.path.insert(0, str(folder))
import ch02_solution  # noqa: E402

rows, ok = [], True
for ex_id, answer, speed in [
    ("2.2", ch02_solution.predict_view, False),
    ("2.3", ch02_solution.copy_3d, False),
    ("2.3", ch02_solution.copy_3d, True),
]:
    rec = grade(ex_id, answer, speed=speed)
    print(format_record(rec))
    ok = ok and rec["earned"] == rec["possible"]
    for c in rec["cases"]:
        rows.append({"exercise": ex_id, "speed": speed, "case": c["case"], "status": c["status"],
                     "earned": c["earned"], "points": c["points"], "reason": c["reason"]})  # fmt: skip
record("ch02_exercises_grades", rows, dest)
print("solutions full on 2.2 and 2.3 (speed included):", ok)
sys.exit(0 if ok else 1)
