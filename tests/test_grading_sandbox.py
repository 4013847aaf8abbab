"""Issue 42: every submission runs in an OS sandbox; the class cache, the venv's known-good state, reports and
gradebook files that never overwrite or collide. Each attack of the issue the sandbox closes scores 0 here.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from labkernels.grading import isolation
from labkernels.grading.classroom import VenvChanged, VenvManifest, _safe, cache_key
from labkernels.grading.remote import PACKAGE_ROOT

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from once import once_per_run  # noqa: E402

SOLUTION = ROOT / "solutions" / "00_roofline.ipynb"
EXERCISE = ROOT / "exercises" / "00_roofline.ipynb"
needs_sandbox = pytest.mark.skipif(
    isolation.why_unavailable(PACKAGE_ROOT) is not None, reason="no sandbox starts on this machine"
)

# What a submission inside the sandbox can see and do, as a JSON dict (run by `_inside`).
FACTS = r"""
import json, os, socket
facts = {"pid": os.getpid(), "parent": os.getppid(), "home": os.listdir(os.environ["HOME"])}
facts["root"] = sorted(os.listdir("/"))
facts["checkout"] = sorted(os.listdir(os.environ["CHECKOUT"]))
facts["reference"] = open(os.path.join(os.environ["CHECKOUT"], "labkernels/grading/exercises_ch03.py")).read()
facts["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
facts["writable"] = []
for folder in [os.environ["CHECKOUT"] + "/labkernels", os.path.dirname(os.__file__), "/usr", "/"]:
    try:
        open(os.path.join(folder, "planted.py"), "w").write("raise SystemExit")
        facts["writable"].append(folder)
    except OSError:
        pass
try:
    socket.create_connection(("127.0.0.1", 22), timeout=2)
    facts["network"] = "connected"
except OSError as e:
    facts["network"] = type(e).__name__
print(json.dumps(facts))
"""


def _inside(tmp_path: Path, code: str) -> dict:
    shared, root = tmp_path / "shared", tmp_path / "root"
    shared.mkdir()
    root.mkdir()
    cmd = isolation.prefix([str(shared)], PACKAGE_ROOT, str(root)) + [sys.executable, "-I", "-c", code]
    env = dict(os.environ, CHECKOUT=PACKAGE_ROOT)
    proc = subprocess.run(cmd, cwd=shared, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_sandbox
def test_inside_the_sandbox_the_machine_is_out_of_reach(tmp_path):
    facts = _inside(tmp_path, FACTS)
    # its own PID namespace: no grader to attach to, only the sandbox's init (PID 1) above it
    assert (facts["parent"], facts["pid"], facts["processes"]) == (1, 2, [1, 2])
    assert facts["home"] == []  # a fresh, empty $HOME: no start-up file, no Jupyter runtime folder
    venv = [Path(sys.prefix).name] if Path(sys.prefix).parent == ROOT else []
    assert facts["checkout"] == sorted(["labkernels", *venv])  # no solutions/, tests/, exercises/
    assert facts["reference"] == ""  # the grader's references: empty files in the sandbox
    assert facts["writable"] == []  # package, stdlib, /usr and the root: read-only
    assert facts["network"] != "connected"
    assert not (ROOT / "labkernels" / "planted.py").exists()


@needs_sandbox
@pytest.mark.parametrize("ending", ["os.abort()", "os.kill(os.getpid(), signal.SIGTERM)"])
def test_a_process_in_the_sandbox_dies_of_its_own_signal(tmp_path, ending):
    """As PID 1 of its namespace a process ignored the signals it sent itself: abort() ended in SIGSEGV (the
    grader on the H200 reported a crashed answer as the wrong signal) and SIGTERM did nothing. Under the
    sandbox's init it dies of its signal, reported as 128 + N."""
    shared, root = tmp_path / "shared", tmp_path / "root"
    shared.mkdir()
    root.mkdir()
    code = f"import os, signal, time; {ending}; time.sleep(30)"
    cmd = isolation.prefix([str(shared)], PACKAGE_ROOT, str(root)) + [sys.executable, "-I", "-c", code]
    proc = subprocess.run(cmd, cwd=shared, capture_output=True, text=True, timeout=60)
    expected = signal.SIGABRT if "abort" in ending else signal.SIGTERM
    assert proc.returncode == 128 + expected, (proc.returncode, proc.stderr)


@needs_sandbox
def test_the_sandboxs_mounts_cannot_be_undone_from_inside(tmp_path):
    code = (
        "import os, subprocess\n"
        "p = '/work/main/labkernels/grading/exercises_ch03.py'\n"
        "cmd = f'umount {p}; unshare --user --map-root-user --mount umount {p}; mount -o remount,rw /usr'\n"
        "subprocess.run(['sh', '-c', cmd], capture_output=True)\n"
        "print(__import__('json').dumps([open(p).read() if os.path.exists(p) else '', os.access('/usr', 2)]))"
    ).replace("/work/main", PACKAGE_ROOT)
    assert _inside(tmp_path, code) == ["", False]


@needs_sandbox
def test_packages_on_pythonpath_are_shown_but_not_the_course_folder(tmp_path, monkeypatch):
    """The GPU image installs Jupyter's packages with `pip --target` into a folder on PYTHONPATH: the sandbox
    showed none of them, so no notebook kernel started there (every sandboxed grading test failed on the
    H200). A PYTHONPATH folder is shown read-only; one that holds the course (and solutions/) is not."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "lk_probe_module.py").write_text("ANSWER = 42\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    code = (
        "import json, os, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "import lk_probe_module\n"
        f"print(json.dumps([lk_probe_module.ANSWER, os.path.exists({str(ROOT / 'solutions')!r}), "
        f"os.access({str(site)!r}, os.W_OK)]))"
    )
    assert _inside(tmp_path, code) == [42, False, False]
    assert str(ROOT) not in isolation.python_path_dirs(PACKAGE_ROOT)
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))  # inside the course: its tests hold answers too
    monkeypatch.setenv("LD_LIBRARY_PATH", str(ROOT / "tests"))
    assert isolation.python_path_dirs(PACKAGE_ROOT) == []
    # the compilers stay (the GPU image's /opt/gcc), the folder inside the course does not
    assert not [d for d in isolation.toolchain_dirs(PACKAGE_ROOT) if d.startswith(str(ROOT))]


@needs_sandbox
def test_a_compiler_outside_usr_is_shown_so_kernels_build_inside(tmp_path, monkeypatch):
    """The GPU image's gcc is /opt/gcc/bin/gcc: the sandbox showed only /usr, so Triton could not build its
    launcher and no C++ extension built (every Triton and C++ exercise scored 0 on the H200)."""
    import shutil as sh

    prefix = tmp_path / "opt" / "gcc"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "gcc").symlink_to(sh.which("gcc") or sh.which("cc"))
    monkeypatch.setenv("CC", str(prefix / "bin" / "gcc"))
    assert str(prefix) in isolation.toolchain_dirs(PACKAGE_ROOT)
    code = (
        "import json, os, subprocess\n"
        "out = subprocess.run([os.environ['CC'], '--version'], capture_output=True, text=True).stdout\n"
        "print(json.dumps([bool(out), os.access(os.environ['CC'], os.W_OK)]))"
    )
    assert _inside(tmp_path, code) == [True, False]


@needs_sandbox
def test_a_tree_with_mounts_below_it_is_shown_whole_and_read_only(tmp_path, monkeypatch):
    """The GPU lane shows /sys (CUDA reads the PCI tree), whose cgroup mounts came into the namespace locked
    with it: binding its top alone failed with EINVAL on the H200 machine, so no GPU run was sandboxed."""
    spec = isolation.spec
    monkeypatch.setattr(
        isolation, "spec", lambda rw, root: spec(rw, root) | {"ro": [*spec(rw, root)["ro"], "/sys"]}
    )
    below = sorted(p for p in isolation._mounts_under("/sys") if p != "/sys")
    code = (
        "import json, os\n"
        f"points = {[p for p in below if os.path.isdir(p)][:3] + ['/sys/kernel']!r}\n"
        "wrote = []\n"
        "for p in points:\n"
        "    try:\n"
        "        os.mkdir(p + '/labkernels-probe'); wrote.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps([os.path.isdir('/sys/devices'), wrote]))"
    )
    assert _inside(tmp_path, code) == [True, []]  # /sys there, read-only down to its submounts


def test_grading_refuses_without_a_sandbox_unless_unsafe(monkeypatch):
    monkeypatch.setitem(isolation._probed, PACKAGE_ROOT, "no namespaces here (a test)")
    monkeypatch.delenv(isolation.ENV, raising=False)
    with pytest.raises(isolation.Unavailable, match="--unsafe"):
        isolation.require(False, PACKAGE_ROOT)
    assert isolation.require(True, PACKAGE_ROOT) == isolation.UNSAFE
    assert isolation.mode(PACKAGE_ROOT) == isolation.UNSAFE


def test_identical_notebooks_of_two_students_are_two_cache_entries():
    same = b'{"cells": []}'
    assert cache_key("anna", same, "00", "pkg", "venv", "cpu") != cache_key(
        "bob", same, "00", "pkg", "venv", "cpu"
    )
    assert cache_key("anna", same, "00", "pkg", "venv", "cpu") != cache_key(
        "anna", same, "00", "pkg", "v2", "cpu"
    )


def test_student_file_names_never_collide():
    names = ["anna smith", "anna_smith", "anna/smith", "anna_smith~x", ".hidden", "Anna"]
    files = [_safe(n) for n in names]
    assert len(set(files)) == len(names), files
    assert _safe("anna_smith") == "anna_smith"
    assert all("/" not in f and not f.startswith(".") for f in files)


def test_a_changed_venv_refuses_this_run_and_every_later_one(tmp_path):
    venv = tmp_path / "venv"
    (venv / "nbclient").mkdir(parents=True)
    target = venv / "nbclient" / "__init__.py"
    target.write_text("version = 1\n")
    manifest = VenvManifest(tmp_path / "manifest.json", roots=[venv])
    manifest.check("first")  # recorded: the known-good state
    manifest.check("again")
    stat = target.stat()
    target.write_text("version = 2\n")  # the same size, the old modification time put back
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(VenvChanged, match="nbclient/__init__.py"):
        manifest.check("after a run")
    with pytest.raises(VenvChanged, match="known-good"):
        VenvManifest(tmp_path / "manifest.json", roots=[venv]).check("in the next run")
    (venv / "sitecustomize.py").write_text("")
    manifest.record()  # the instructor records a change they made
    manifest.check("after recording")


def test_jupyterlab_settings_in_the_venv_are_not_a_change(tmp_path):
    """`make lab-settings` (run by `make lab` and `make test-browser`) writes JupyterLab's settings into the
    venv: every later `make grade` refused, as if a submission had planted code there."""
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    manifest = VenvManifest(tmp_path / "manifest.json", roots=[venv])
    manifest.check("first")
    settings = venv / "share" / "jupyter" / "lab" / "settings" / "overrides.d"
    settings.mkdir(parents=True)
    (settings / "labkernels.json").write_text("{}")
    manifest.check("after make lab-settings")
    (venv / "share" / "jupyter" / "lab" / "planted.py").write_text("")  # beside the settings: still seen
    with pytest.raises(VenvChanged, match="planted.py"):
        manifest.check("after a run")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "labkernels", "grade", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )


def test_a_report_never_overwrites_a_notebook_or_another_file(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copy(EXERCISE, sub / "00_roofline.ipynb")
    before = (sub / "00_roofline.ipynb").read_bytes()
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    for target in [sub / "00_roofline.ipynb", sub / "report.json", other]:
        proc = _cli(str(sub), "--json", str(target), "--unsafe")
        assert proc.returncode == 2 and "--json" in proc.stderr, proc.stderr
    assert (sub / "00_roofline.ipynb").read_bytes() == before and other.read_text() == "keep me"
    assert not (sub / "report.json").exists()


# --- hostile students, graded as a class --------------------------------------------------------------------

# Each hostile notebook: the exercise (no answer), with a cell of its attack before everything else.
ATTACKS = {
    # issue 42: a notebook that knows no answer imports solutions/' code, check cells included (91/91 before)
    "a_reader": (
        "import glob, json, os, sys\n"
        "code = []\n"
        f"for path in glob.glob({str(ROOT / 'solutions' / '00_*.ipynb')!r}):\n"
        "    for cell in json.load(open(path))['cells']:\n"
        "        if cell['cell_type'] == 'code':\n"
        "            lines = ''.join(cell['source']).splitlines()\n"
        "            code += [ln for ln in lines if not ln.startswith(('%', '!'))]\n"
        "open('stolen.py', 'w').write('\\n'.join(code))\n"
        "sys.path.insert(0, os.getcwd())\n"
        "import stolen\n"
    ),
    # issue 42: an IPython start-up file in $HOME that breaks every later kernel (an honest student: 0/91)
    "b_saboteur": (
        "import os\n"
        "d = os.path.expanduser('~/.ipython/profile_default/startup')\n"
        "os.makedirs(d, exist_ok=True)\n"
        "open(os.path.join(d, '00-sabotage.py'), 'w').write('import os\\nos._exit(1)\\n')\n"
    ),
    # issue 42: a trojan appended to the venv's nbclient (outside the package's seal)
    "c_trojan": (
        "import nbclient, os\n"
        "try:\n"
        "    open(nbclient.__file__, 'a').write('\\n# planted by a submission\\n')\n"
        "except OSError as e:\n"
        "    print('refused:', e)\n"
    ),
}


def _with_first_cell(src: Path, dst: Path, first: str) -> None:
    nb = nbformat.read(src, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(first))
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)


@pytest.fixture(scope="module")
def hostile_class(tmp_path_factory):
    return once_per_run(tmp_path_factory, "hostile", _grade_hostile_class)


def _grade_hostile_class(tmp: Path):
    klass, out = tmp / "class", tmp / "grades"
    for name, attack in ATTACKS.items():
        _with_first_cell(EXERCISE, klass / name / "00_roofline.ipynb", attack)
    nb = nbformat.read(klass / "a_reader" / "00_roofline.ipynb", as_version=4)
    nb.cells = nb.cells[:1]  # the reader is its attack alone
    nbformat.write(nb, klass / "a_reader" / "00_roofline.ipynb")
    (klass / "d_honest").mkdir(parents=True)
    shutil.copy(SOLUTION, klass / "d_honest" / "00_roofline.ipynb")  # graded after the saboteur (-j 1)
    import nbclient

    before = Path(nbclient.__file__).read_text()
    start = time.monotonic()
    proc = _cli(str(klass), "--chapters", "00", "--cell-timeout", "120", "--out", str(out))
    seconds = time.monotonic() - start
    students = {p.stem.split("~")[0]: json.loads(p.read_text()) for p in (out / "students").glob("*.json")}
    return proc, students, Path(nbclient.__file__).read_text() == before, seconds


@needs_sandbox
def test_hostile_students_score_zero_and_the_honest_one_full(hostile_class):
    proc, students, venv_intact, seconds = hostile_class
    assert proc.returncode == 0, proc.stderr
    print(f"graded 4 students of chapter 00 in {seconds:.1f} s")
    for name in ATTACKS:
        assert students[name]["earned"] == 0, (name, students[name])
    assert students["d_honest"]["earned"] == students["d_honest"]["possible"] > 0, students["d_honest"]
    assert venv_intact
    reports = [rep for s in students.values() for rep in s["notebooks"]]
    assert all(rep["sandbox"] == isolation.SANDBOXED for rep in reports)


@needs_sandbox
def test_hostile_students_are_told_why(hostile_class):
    _, students, _, _ = hostile_class

    def reasons(name):
        recs = [r for rep in students[name]["notebooks"] for r in rep["exercises"]]
        return " ".join(str(r["error"]) + " ".join(c["reason"] for c in r["cases"]) for r in recs)

    assert "its check cell did not run" in reasons("a_reader")  # solutions/ is not there: nothing to import
    assert "NotImplementedError" in reasons("b_saboteur") and "NotImplementedError" in reasons("c_trojan")
