"""`python -m labkernels <command>`: exercises, grade, bench, execute, release, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _check_report_path(report_path: Path, graded: Path) -> str | None:
    """Before the (long) grading run: a report that cannot be written would lose every result, and one written
    over a notebook or another file (not an earlier report) would destroy it."""
    resolved, graded = report_path.resolve(), graded.resolve()
    if report_path.suffix == ".ipynb" or resolved == graded or graded in resolved.parents:
        return f"--json {report_path} is a notebook or lies in the graded folder {graded}: write it elsewhere"
    if report_path.is_file():
        try:
            json.loads(report_path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            return f"--json {report_path} exists and is not a grading report: it is not replaced"
    try:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        if report_path.is_dir():
            raise IsADirectoryError(f"--json {report_path} is a folder, not a file")
        target = report_path if report_path.exists() else report_path.parent
        if not os.access(target, os.W_OK):
            raise PermissionError(f"{target} is not writable")
    except OSError as e:
        return f"cannot write the report to {report_path}: {e}"
    return None


def _expectation(args, reports: list[dict]) -> int:
    earned = sum(r["earned"] for rep in reports for r in rep["exercises"])
    possible = sum(r["possible"] for rep in reports for r in rep["exercises"])
    if args.expect == "full" and (earned != possible or possible == 0):
        print(f"expected full marks, got {earned:g}/{possible:g}", file=sys.stderr)
        return 1
    if args.expect == "zero" and earned != 0:
        print(f"expected zero, got {earned:g}/{possible:g}", file=sys.stderr)
        return 1
    return 0


def _chapters(args) -> list[str] | None:
    return [c.strip().zfill(2) for c in args.chapters.split(",") if c.strip()] if args.chapters else None


def _grade(args) -> int:
    import time

    from labkernels.grading.classroom import GraderChanged, PackageSeal, VenvManifest, is_class_folder
    from labkernels.grading.isolation import Unavailable, require
    from labkernels.grading.notebooks import grade_folder, score_table
    from labkernels.grading.remote import PACKAGE_ROOT

    if args.merge:
        return _merge(args)
    if args.record_manifest:
        VenvManifest().record()
        print(f"recorded the venv's known-good state: {VenvManifest().path}")
        return 0
    if not args.dir:
        print("make grade: name the folder to grade (one submission, or a class)", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("make grade: -j must be at least 1", file=sys.stderr)
        return 2
    try:
        mode = require(args.unsafe, PACKAGE_ROOT)
    except Unavailable as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    print(f"grading {mode}", file=sys.stderr)
    nb_timeout = args.notebook_timeout or None  # 0: no limit
    if is_class_folder(Path(args.dir)):
        return _grade_class(args, nb_timeout)
    class_only = [
        o for o, on in (("-j", args.jobs != 1), ("--force", args.force), ("--export", args.export)) if on
    ]
    if class_only or args.out:
        print(
            f"make grade: {', '.join(class_only + (['--out'] if args.out else []))} grade a class: a folder "
            f"of student folders; {args.dir} is one submission",
            file=sys.stderr,
        )
        return 2
    report_path = Path(args.json or "grade-report.json")
    problem = _check_report_path(report_path, Path(args.dir))
    if problem:
        print(f"make grade: {problem}", file=sys.stderr)
        return 2
    run_deadline = None if args.run_timeout is None else time.monotonic() + args.run_timeout
    try:
        reports = grade_folder(
            Path(args.dir),
            cell_timeout=args.cell_timeout,
            notebook_timeout=nb_timeout,
            run_deadline=run_deadline,
            seal=PackageSeal(venv=VenvManifest(), log=lambda m: print(m, file=sys.stderr)),
            chapters=_chapters(args),
        )
    except FileNotFoundError as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    except GraderChanged as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 3
    print(score_table(reports))
    report_path.write_text(json.dumps(reports, indent=1))
    print(f"details: {report_path}")
    return _expectation(args, reports)


def _merge(args) -> int:
    from labkernels.grading.classroom import RefusedOutput, merge_shards, summary

    if not args.out:
        print("make grade: --merge needs --out, the merged gradebook's new folder", file=sys.stderr)
        return 2
    try:
        results = merge_shards([Path(f) for f in args.merge], Path(args.out), args.export)
    except RefusedOutput as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    print(summary(results))
    print(f"gradebook: {Path(args.out) / 'gradebook.csv'} (merged from {len(args.merge)} shards)")
    return 0


def _grade_class(args, nb_timeout: float | None) -> int:
    from labkernels.grading.classroom import GraderChanged, RefusedOutput, grade_class, parse_shard, summary

    try:
        shard = parse_shard(args.shard) if args.shard else None
    except ValueError as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    out = Path(args.out or "grades")
    if args.json and (problem := _check_report_path(Path(args.json), Path(args.dir))):
        print(f"make grade: {problem}", file=sys.stderr)
        return 2
    try:
        results = grade_class(
            Path(args.dir),
            out,
            jobs=args.jobs,
            cell_timeout=args.cell_timeout,
            notebook_timeout=nb_timeout,
            run_timeout=args.run_timeout,
            force=args.force,
            chapters=_chapters(args),
            export=args.export,
            shard=shard,
        )
    except RefusedOutput as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 2
    except GraderChanged as e:
        print(f"make grade: {e}", file=sys.stderr)
        return 3
    print(summary(results))
    print(f"gradebook: {out / 'gradebook.csv'} (reasons per exercise; long form: gradebook-long.csv)")
    print(f"per student: {out / 'students'}/<student>.json")
    if args.export == "nbgrader":
        print(f"nbgrader export: {out / 'nbgrader.csv'}")
    reports = [rep for reps in results.values() for rep in reps]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return _expectation(args, reports)


def _exercises(args) -> int:
    from labkernels.grading.notebooks import ExercisesRefused, out_of_sync, write_exercises

    solutions, exercises = Path(args.solutions), Path(args.exercises)
    if not solutions.is_dir():
        print(f"exercises: no such folder of solutions: {solutions}", file=sys.stderr)
        return 2
    # `python -m labkernels exercises` replaces no edited notebook (it refuses and says how to keep them)
    refresh = f"python -m labkernels exercises --solutions {solutions} --exercises {exercises}"
    try:
        if args.check:
            if not exercises.is_dir():
                print(f"exercises: no such folder of exercises: {exercises}", file=sys.stderr)
                print(f"generate it from {solutions}: {refresh}", file=sys.stderr)
                return 1
            problems = out_of_sync(solutions, exercises)
            for p in problems:
                print(p, file=sys.stderr)
            if problems:
                print(
                    f"refresh the stubs: {refresh}\n(it replaces no notebook you edited: it lists them and "
                    "says how to get fresh stubs beside them)",
                    file=sys.stderr,
                )
            return 1 if problems else 0
        written = write_exercises(solutions, exercises, force=args.force)
    except ExercisesRefused as e:
        print(f"exercises: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def _bench(args) -> int:
    from labkernels import bench

    bench.run(args.names or None)
    return 0


# The kernelspec every notebook stores: the one ipykernel installs. JupyterLab writes the running kernel's
# spec into a notebook it opens, so any other stored spec marks the notebook modified before anything ran.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


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
        nb.metadata["kernelspec"] = dict(KERNELSPEC)
        nbformat.write(nb, path)
    return 0


def _release(args) -> int:
    from labkernels.grading.release import build

    try:
        path = build(Path(args.root), Path(args.out), force=args.force)
    except (ValueError, FileExistsError) as e:
        print(e, file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


def _report(_args) -> int:
    from labkernels.env import print_report

    print_report()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labkernels")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grade", help="execute a folder of notebooks and score their exercises")
    g.add_argument("dir", nargs="?", help="one submission (NN_*.ipynb) or a class: one folder per student")
    g.add_argument("--json", help="full report (one submission: default grade-report.json)")
    g.add_argument("--cell-timeout", type=int, default=600, help="seconds per cell")
    g.add_argument("--notebook-timeout", type=float, default=1800, help="seconds per notebook (0: none)")
    g.add_argument("--run-timeout", type=float, default=None, help="seconds for the whole run")
    g.add_argument("--chapters", help="grade only these chapters, e.g. 00,03 (default: every chapter)")
    g.add_argument("--expect", choices=["full", "zero"], help="exit non-zero unless the total is this")
    g.add_argument("-j", "--jobs", type=int, default=1, help="a class: students graded at once")
    g.add_argument("--out", help="a class: the gradebook's folder (default grades/)")
    g.add_argument("--force", action="store_true", help="a class: re-grade unchanged notebooks too")
    g.add_argument("--export", choices=["nbgrader"], help="a class: also write nbgrader.csv")
    g.add_argument("--unsafe", action="store_true", help="grade without the OS sandbox (where none starts)")
    g.add_argument("--shard", help="a class: grade shard K/N of its students (every Nth, from the Kth)")
    g.add_argument(
        "--merge", nargs="+", metavar="FOLDER", help="merge the --out folders of shards 1..N into --out"
    )
    g.add_argument(
        "--record-manifest", action="store_true", help="record the venv as it is now as its known-good state"
    )
    g.set_defaults(func=_grade)
    e = sub.add_parser("exercises", help="generate exercises/ from solutions/")
    e.add_argument("--solutions", default="solutions")
    e.add_argument("--exercises", default="exercises")
    e.add_argument("--check", action="store_true", help="only report whether exercises/ is up to date")
    e.add_argument(
        "--force",
        action="store_true",
        help="also replace exercise notebooks someone edited (answers are lost)",
    )
    e.set_defaults(func=_exercises)
    b = sub.add_parser("bench", help="record the GPU reference results shipped in labkernels/reference")
    b.add_argument("names", nargs="*")
    b.set_defaults(func=_bench)
    x = sub.add_parser("execute", help="execute notebooks in place, storing this lane's outputs")
    x.add_argument("notebooks", nargs="+")
    x.add_argument("--cell-timeout", type=int, default=1200)
    x.set_defaults(func=_execute)
    rel = sub.add_parser("release", help="the student bundle: chapters, exercises, package; no solutions")
    rel.add_argument("--root", default=".", help="the course checkout")
    rel.add_argument("--out", default="dist", help="the folder to write the .tar.gz into")
    rel.add_argument("--force", action="store_true", help="replace a bundle of the same revision")
    rel.set_defaults(func=_release)
    r = sub.add_parser("report", help="print the environment report")
    r.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
