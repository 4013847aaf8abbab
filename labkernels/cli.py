"""`python -m labkernels <command>`: exercises, check-exercises, grade, bench, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _grade(args) -> int:
    from labkernels.grading.notebooks import grade_folder, score_table

    report_path = Path(args.json)
    try:
        # Before the (long) grading run: a report that cannot be written would lose every result.
        report_path.parent.mkdir(parents=True, exist_ok=True)
        if report_path.is_dir():
            raise IsADirectoryError(f"--json {report_path} is a folder, not a file")
        target = report_path if report_path.exists() else report_path.parent
        if not os.access(target, os.W_OK):
            raise PermissionError(f"{target} is not writable")
    except OSError as e:
        print(f"make grade: cannot write the report to {report_path}: {e}", file=sys.stderr)
        return 2
    try:
        reports = grade_folder(Path(args.dir), cell_timeout=args.cell_timeout)
    except FileNotFoundError as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    print(score_table(reports))
    report_path.write_text(json.dumps(reports, indent=1))
    print(f"details: {report_path}")
    earned = sum(r["earned"] for rep in reports for r in rep["exercises"])
    possible = sum(r["possible"] for rep in reports for r in rep["exercises"])
    if args.expect == "full" and (earned != possible or possible == 0):
        print(f"expected full marks, got {earned:g}/{possible:g}", file=sys.stderr)
        return 1
    if args.expect == "zero" and earned != 0:
        print(f"expected zero, got {earned:g}/{possible:g}", file=sys.stderr)
        return 1
    return 0


def _exercises(args) -> int:
    from labkernels.grading.notebooks import out_of_sync, unsafe_exercise_folder, write_exercises

    solutions, exercises = Path(args.solutions), Path(args.exercises)
    if not solutions.is_dir():
        print(f"exercises: no such folder of solutions: {solutions}", file=sys.stderr)
        return 2
    if args.check:
        if not exercises.is_dir():
            print(f"exercises: no such folder of exercises: {exercises}", file=sys.stderr)
            print("run `make exercises` to generate exercises/ from solutions/", file=sys.stderr)
            return 1
        problems = out_of_sync(solutions, exercises)
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run `make exercises` to regenerate exercises/ from solutions/", file=sys.stderr)
        return 1 if problems else 0
    refusal = unsafe_exercise_folder(solutions, exercises)
    if refusal:
        print(f"exercises: refusing to write: {refusal}", file=sys.stderr)
        return 2
    for path in write_exercises(solutions, exercises):
        print(f"wrote {path}")
    return 0


def _bench(args) -> int:
    from labkernels import bench

    bench.run(args.names or None)
    return 0


def _execute(args) -> int:
    """Execute notebooks in place (stores this lane's outputs); stops at the first failing notebook."""
    import nbformat
    from nbclient import NotebookClient

    for name in args.notebooks:
        path = Path(name)
        nb = nbformat.read(path, as_version=4)
        print(f"executing {path} ...", flush=True)
        NotebookClient(
            nb,
            timeout=args.cell_timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent.resolve())}},
        ).execute()
        nbformat.write(nb, path)
    return 0


def _report(_args) -> int:
    from labkernels.env import print_report

    print_report()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkernels")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="execute a folder of notebooks and score their exercises")
    g.add_argument("dir")
    g.add_argument("--json", default="grade-report.json")
    g.add_argument("--cell-timeout", type=int, default=600)
    g.add_argument("--expect", choices=["full", "zero"], help="exit non-zero unless the total is this")
    g.set_defaults(func=_grade)
    e = sub.add_parser("exercises", help="generate exercises/ from solutions/")
    e.add_argument("--solutions", default="solutions")
    e.add_argument("--exercises", default="exercises")
    e.add_argument("--check", action="store_true", help="only report whether exercises/ is up to date")
    e.set_defaults(func=_exercises)
    b = sub.add_parser("bench", help="record the GPU reference results shipped in labkernels/reference")
    b.add_argument("names", nargs="*")
    b.set_defaults(func=_bench)
    x = sub.add_parser("execute", help="execute notebooks in place, storing this lane's outputs")
    x.add_argument("notebooks", nargs="+")
    x.add_argument("--cell-timeout", type=int, default=1200)
    x.set_defaults(func=_execute)
    r = sub.add_parser("report", help="print the environment report")
    r.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
