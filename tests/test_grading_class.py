"""`make grade DIR=class/`: a class graded at once into a gradebook (issue 17), on chapter 00 (fast to grade).

The class: alice hands in the solution, bob the untouched exercise, carol a solution whose 0.2 raises, dave
only a misnamed notebook. Every run is a real `python -m labkernels grade` in a subprocess.
"""

import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from once import once_per_run  # noqa: E402

SOLUTION = ROOT / "solutions" / "00_roofline.ipynb"
EXERCISE = ROOT / "exercises" / "00_roofline.ipynb"
# `nbgrader export`'s CSV columns (nbgrader/plugins/export.py, CsvExportPlugin), written out here on purpose.
NBGRADER_COLUMNS = [
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
]


def _grade(
    folder: Path, out: Path, *extra: str, cwd: Path = ROOT
) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [
        sys.executable,
        "-m",
        "labkernels",
        "grade",
        str(folder),
        "--chapters",
        "00",
        "--cell-timeout",
        "120",
    ]
    start = time.monotonic()
    proc = subprocess.run(
        cmd + (["--out", str(out)] if out else []) + list(extra),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )
    return proc, time.monotonic() - start


def _with_cells(src: Path, dst: Path, before: dict[str, str] | None = None, end: str | None = None) -> None:
    """Copy a notebook, adding a cell before each cell whose source is a key of `before`, and at the end."""
    nb = nbformat.read(src, as_version=4)
    cells = []
    for cell in nb.cells:
        if before and cell.cell_type == "code" and cell.source.strip() in before:
            cells.append(nbformat.v4.new_code_cell(before[cell.source.strip()]))
        cells.append(cell)
    if end:
        cells.append(nbformat.v4.new_code_cell(end))
    nb.cells = cells
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class graded with -j 2, then again unchanged, then again with bob's notebook changed: once per
    test run (`once_per_run`)."""
    return once_per_run(tmp_path_factory, "class", _grade_the_class)


def _grade_the_class(tmp: Path):
    klass, out = tmp / "class", tmp / "grades"
    # alice's notebook cannot leave a trace outside its sandbox: the skipped counts and her report's "cached"
    # flag say whether it ran again
    _with_cells(SOLUTION, klass / "alice" / "00_roofline.ipynb", end="print('alice was here')")
    shutil.copy(EXERCISE, (klass / "bob").mkdir(parents=True) or klass / "bob" / "00_roofline.ipynb")
    broken = {'check("0.2", bound)': "def bound(*args):\n    raise ValueError('the bound is broken')\n"}
    _with_cells(SOLUTION, klass / "carol" / "00_roofline.ipynb", before=broken)
    shutil.copy(EXERCISE, (klass / "dave").mkdir(parents=True) or klass / "dave" / "roofline.ipynb")
    runs = {}
    runs["first"] = _grade(klass, out, "-j", "2", "--export", "nbgrader")
    assert runs["first"][0].returncode == 0, runs["first"][0].stderr
    snapshot = {p.name: p.read_text() for p in [out / "gradebook.csv", out / "nbgrader.csv"]}
    snapshot["alice"] = json.loads((out / "students" / "alice.json").read_text())
    runs["again"] = _grade(klass, out, "--export", "nbgrader")
    snapshot["again"] = {p.name: p.read_text() for p in [out / "gradebook.csv", out / "nbgrader.csv"]}
    snapshot["alice_again"] = json.loads((out / "students" / "alice.json").read_text())
    shutil.copy(SOLUTION, klass / "bob" / "00_roofline.ipynb")
    runs["bob_changed"] = _grade(klass, out)
    for name, (proc, seconds) in runs.items():
        print(f"{name}: {seconds:.1f} s (rc {proc.returncode})")
    return tmp, out, runs, snapshot


def test_gradebook_has_a_row_per_student_with_points_and_reasons(graded):
    _, _, _, snap = graded
    rows = {r["student"]: r for r in csv.DictReader(snap["gradebook.csv"].splitlines())}
    assert sorted(rows) == ["alice", "bob", "carol", "dave"]
    assert (rows["alice"]["earned"], rows["alice"]["possible"]) == ("12", "12")
    assert [rows["alice"][f"0.{i} ({p})"] for i, p in [(1, 6), (2, 3), (3, 3)]] == ["6", "3", "3"]
    assert rows["bob"]["earned"] == "0" and "NotImplementedError" in rows["bob"]["0.1 reason"]
    assert (rows["carol"]["0.1 (6)"], rows["carol"]["0.2 (3)"], rows["carol"]["0.3 (3)"]) == ("6", "0", "3")
    assert "the bound is broken" in rows["carol"]["0.2 reason"]
    assert rows["dave"]["earned"] == "0" and rows["dave"]["possible"] == "12"
    assert "no notebook for chapter 00" in rows["dave"]["0.1 reason"]
    assert "must start with a chapter" in rows["dave"]["problems"]


def test_long_gradebook_and_per_student_json_agree(graded):
    _, out, _, snap = graded
    long = _rows(out / "gradebook-long.csv")
    assert set(long[0]) == {"student", "notebook", "exercise", "part", "earned", "possible", "reason"}
    carol = [r for r in long if r["student"] == "carol"]
    assert [(r["exercise"], r["earned"], r["possible"]) for r in carol] == [
        ("0.1", "6", "6"),
        ("0.2", "0", "3"),
        ("0.3", "3", "3"),
    ]
    for name in ["bob", "carol", "dave"]:
        body = json.loads((out / "students" / f"{name}.json").read_text())
        rows = [r for r in long if r["student"] == name]
        assert body["student"] == name
        assert body["earned"] == sum(float(r["earned"]) for r in rows)
        assert body["possible"] == sum(float(r["possible"]) for r in rows) == 12
    alice = snap["alice"]
    assert (alice["earned"], alice["possible"]) == (12, 12)
    (report,) = [r for r in alice["notebooks"] if r["exercises"]]
    assert all(case["status"] == "pass" for rec in report["exercises"] for case in rec["cases"])


def test_unchanged_notebooks_are_not_run_again_and_score_the_same(graded):
    _, _, runs, snap = graded
    assert runs["again"][0].returncode == 0, runs["again"][0].stderr
    assert "3 notebooks unchanged since the last run, skipped" in runs["again"][0].stdout
    assert snap["again"] == {k: snap[k] for k in ("gradebook.csv", "nbgrader.csv")}
    (report,) = [r for r in snap["alice_again"]["notebooks"] if r["exercises"]]
    assert report.get("cached") is True


def test_a_changed_notebook_is_graded_again_and_only_it(graded):
    _, out, runs, snap = graded
    proc = runs["bob_changed"][0]
    assert proc.returncode == 0, proc.stderr
    assert "2 notebooks unchanged since the last run, skipped" in proc.stdout  # alice's and carol's
    rows = {r["student"]: r for r in _rows(out / "gradebook.csv")}
    assert rows["bob"]["earned"] == "12"


def test_nbgrader_export_has_nbgraders_columns_and_a_row_per_student_and_chapter(graded):
    _, _, _, snap = graded
    lines = snap["nbgrader.csv"].splitlines()
    assert lines[0].split(",") == NBGRADER_COLUMNS
    rows = {r["student_id"]: r for r in csv.DictReader(lines)}
    assert sorted(rows) == ["alice", "bob", "carol", "dave"] and len(lines) == 5
    assert {r["assignment"] for r in rows.values()} == {"00_roofline"}
    assert [float(rows[s]["score"]) for s in ["alice", "bob", "carol", "dave"]] == [12, 0, 9, 0]
    assert {float(r["max_score"]) for r in rows.values()} == {12}
    assert rows["dave"]["timestamp"] == "" and rows["alice"]["timestamp"] != ""


def test_shards_graded_apart_merge_into_the_gradebook_of_one_run(graded, tmp_path):
    """`--shard K/N` on N machines, then `--merge`: the same gradebook and long form as one run over the whole
    class (its last run, after bob's change), and nbgrader's export of every student."""
    tmp, out, _, _ = graded
    shards = [tmp_path / f"shard{k}" for k in (1, 2)]
    for k, folder in enumerate(shards, 1):
        proc, _ = _grade(tmp / "class", folder, "--shard", f"{k}/2", "--export", "nbgrader")
        assert proc.returncode == 0, proc.stderr
        assert json.loads((folder / "run.json").read_text())["students"] == 2  # 4 students, 2 a shard
    merged = tmp_path / "merged"
    cmd = [sys.executable, "-m", "labkernels", "grade", "--merge", *map(str, shards), "--out", str(merged)]
    proc = subprocess.run(
        cmd + ["--export", "nbgrader"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("gradebook.csv", "gradebook-long.csv"):
        assert (merged / name).read_text() == (out / name).read_text(), name
    exported = sorted(r["student_id"] for r in _rows(merged / "nbgrader.csv"))
    assert exported == ["alice", "bob", "carol", "dave"]
    # refused: a shard missing, a shard twice, the merge written over a shard, a split that is not K/N
    for args, says in (
        ([str(shards[0])], "need 1/2"),
        ([str(shards[0]), str(shards[0])], "need 1/2"),
        ([*map(str, shards), "--out", str(shards[1])], "inside"),
    ):
        out_args = [] if "--out" in args else ["--out", str(tmp_path / "refused")]
        proc = subprocess.run(
            [sys.executable, "-m", "labkernels", "grade", "--merge", *args, *out_args],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)
    proc, _ = _grade(tmp / "class", tmp_path / "bad", "--shard", "3/2")
    assert proc.returncode == 2 and "K/N" in proc.stderr


def test_output_folder_inside_the_class_or_holding_other_files_is_refused(graded, tmp_path):
    tmp, _, _, _ = graded
    proc, _ = _grade(tmp / "class", tmp / "class" / "alice" / "grades")
    assert proc.returncode == 2 and "inside the class folder" in proc.stderr
    (tmp_path / "mine.txt").write_text("keep me")
    proc, _ = _grade(tmp / "class", tmp_path)
    assert proc.returncode == 2 and "did not write" in proc.stderr
    assert (tmp_path / "mine.txt").read_text() == "keep me" and not (tmp_path / "gradebook.csv").exists()


def test_a_notebook_past_its_time_limit_scores_zero_and_says_so(tmp_path):
    klass = tmp_path / "class"
    _with_cells(
        SOLUTION,
        klass / "eve" / "00_roofline.ipynb",
        before={'check("0.1", count)': "import time\ntime.sleep(300)"},
    )
    proc, _ = _grade(klass, tmp_path / "out", "--notebook-timeout", "10")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "out" / "gradebook-long.csv")
    assert [r["earned"] for r in rows] == ["0", "0", "0"]
    assert all("exceeded its time limit" in r["reason"] for r in rows), rows


@pytest.fixture
def package_copy(tmp_path):
    """A copy of the package to grade with: the attack rewrites the copy, never the repository's files."""
    shutil.copytree(
        ROOT / "labkernels", tmp_path / "pkg" / "labkernels", ignore=shutil.ignore_patterns("__pycache__")
    )
    target = tmp_path / "pkg" / "labkernels" / "traffic.py"
    klass = tmp_path / "class"
    attack = f"open({str(target)!r}, 'a').write('\\ndef copy(*a):  # planted\\n    return None\\n')"
    _with_cells(EXERCISE, klass / "mallory" / "00_roofline.ipynb", end=attack)
    _with_cells(EXERCISE, klass / "trent" / "00_roofline.ipynb")
    return tmp_path, klass, target


def test_a_sandboxed_submission_cannot_rewrite_the_grader(package_copy):
    tmp, klass, target = package_copy
    before = target.read_text()
    proc, _ = _grade(klass, tmp / "out", cwd=tmp / "pkg")
    if "--unsafe" in proc.stderr:
        pytest.skip("no sandbox starts on this machine")
    assert proc.returncode == 0 and target.read_text() == before, proc.stderr  # read-only in the sandbox
    assert (tmp / "out" / "gradebook.csv").exists()


def test_a_submission_that_rewrites_the_grader_refuses_an_unsafe_run(package_copy):
    tmp, klass, target = package_copy
    before = target.read_text()
    proc, _ = _grade(klass, tmp / "out", "-j", "2", "--unsafe", cwd=tmp / "pkg")
    assert "# planted" in target.read_text() and "# planted" not in before  # the attack did happen
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "refusing this run" in proc.stderr and "labkernels/traffic.py (changed)" in proc.stderr
    assert not (tmp / "out" / "gradebook.csv").exists()


def test_one_submission_that_rewrites_the_grader_refuses_an_unsafe_run(package_copy):
    tmp, klass, target = package_copy
    proc, _ = _grade(klass / "mallory", None, "--json", str(tmp / "r.json"), "--unsafe", cwd=tmp / "pkg")
    assert "# planted" in target.read_text()
    assert proc.returncode == 3 and "labkernels/traffic.py (changed)" in proc.stderr, proc.stderr
    assert not (tmp / "r.json").exists()
