"""A class at a time: `python -m labkernels grade CLASS/` where CLASS holds one folder per student.

Writes, into `--out` (default `grades/`, never inside CLASS): `gradebook.csv` (one row per student, points and
reason per exercise), `gradebook-long.csv` (student, notebook, exercise, part, earned, possible, reason),
`students/<student>.json` (the full report) and, with `--export nbgrader`, `nbgrader.csv` (the columns of
`nbgrader export`, one row per student per chapter). Every file is written to a temporary name and renamed,
and only once every student has been graded and every process a submission started is dead.

How it runs:
- correctness: each student is graded by a fresh worker process (`-j N` at a time), which runs each notebook
  and grades its answers as `notebooks.grade_notebook` does for one folder; results come back over a pipe
  only this process holds (a notebook's kernel can print to the worker's stdout, so that is never read);
- speed (GPU lane): afterwards, one answer at a time, in this process, so timings do not interfere;
- a re-run skips a notebook whose student, bytes, chapter, grading package, venv and lane are unchanged
  (`.cache/` in the output folder; `--force` re-grades); an `--unsafe` run neither reads nor writes it. The
  cache is read before any submission runs and written after the last one is dead, so no submission can
  plant an entry;
- `PackageSeal`: the grading package (and the interpreter's start-up hooks) are hashed before any submission
  runs and checked after each one; `VenvManifest`: the venv is compared with its recorded known-good state
  before the run and after each student; a change refuses the whole run, naming the file.
- limits: `--notebook-timeout` per notebook (execution and grading; past it the notebook's exercises score
  zero) and `--run-timeout` for the whole run (what has not finished scores zero, saying so).

Every notebook's kernel and every answer's worker run in an OS sandbox (`isolation`): students graded at the
same time (`-j`) see neither each other, nor the grader, nor the instructor's files. Without one (`--unsafe`)
they run as the instructor's user, beside each other: grade an untrusted class that way only with `-j 1`, in
a container.
"""

from __future__ import annotations

import base64
import compileall
import contextlib
import csv
import hashlib
import io
import json
import os
import select
import signal
import site
import subprocess
import sys
import sysconfig
import time
from collections import Counter
from pathlib import Path

from labkernels.grading import notebooks as nbs

MARKER = ".labkernels-grades"  # marks a folder this command wrote: the only kind it writes into
CACHE = ".cache/notebooks.json"
GRACE_S = 60  # past a worker's own limits, before this process kills it
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


class GraderChanged(RuntimeError):
    """The grading package changed while submissions ran: no verdict of this run can be trusted."""


class RefusedOutput(ValueError):
    """The output folder is not one this command may write into."""


# --- the grading package cannot be rewritten by a submission unnoticed --------------------------------------


def _package_dir() -> Path:
    import labkernels

    return Path(labkernels.__file__).resolve().parent


def _startup_hooks() -> list[Path]:
    """Files every Python process runs at start-up (`.pth`, site/user customize): a submission could plant
    code there that later grading workers would run."""
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    with contextlib.suppress(AttributeError):
        dirs.add(site.getusersitepackages())
    found = []
    for d in sorted(dirs):
        folder = Path(d)
        if folder.is_dir():
            found += sorted(folder.glob("*.pth"))
            found += [folder / n for n in ("sitecustomize.py", "usercustomize.py") if (folder / n).exists()]
    return found


def _hash_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable: {type(e).__name__}"


class PackageSeal:
    """Content hashes of the grading package's files (the whole `labkernels` package: the references the
    exercises compare to live there too), taken before any submission runs."""

    def __init__(self, root: Path | None = None, venv: VenvManifest | None = None, log=None):
        self.venv = venv  # checked with the package, where given (against its record, not a snapshot)
        if venv is not None:
            venv.check("before this run", log)
        self.root = root or _package_dir()
        with contextlib.suppress(Exception):  # stale bytecode would be rewritten (legitimately) mid-run
            compileall.compile_dir(str(self.root), quiet=2)
        self.files = self.manifest()
        self.digest = hashlib.sha256(json.dumps(sorted(self.files.items())).encode()).hexdigest()

    def manifest(self) -> dict[str, str]:
        tag = f".{sys.implementation.cache_tag}.pyc"
        files = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_dir() or (path.parent.name == "__pycache__" and not path.name.endswith(tag)):
                continue  # bytecode of other interpreters is never loaded by this one
            files[str(path.relative_to(self.root.parent))] = _hash_file(path)
        for path in _startup_hooks():
            files[str(path)] = _hash_file(path)
        return files

    def changes(self) -> list[str]:
        now = self.manifest()
        out = [f"{p} (changed)" for p in self.files if p in now and now[p] != self.files[p]]
        out += [f"{p} (removed)" for p in self.files if p not in now]
        out += [f"{p} (added)" for p in now if p not in self.files]
        return out

    def check(self, when: str) -> None:
        if self.venv is not None:
            self.venv.check(when)
        changed = self.changes()
        if changed:
            raise GraderChanged(
                f"refusing this run: the grading package changed {when}: {', '.join(changed[:5])}"
                f"{' …' if len(changed) > 5 else ''}. A submission may have rewritten the grader (or someone "
                f"edited it meanwhile): restore the package and grade again"
            )


class VenvChanged(GraderChanged):
    """The interpreter's environment differs from the state recorded as known-good."""


class VenvManifest:
    """Size and modification/change times of every file of the venv and the standard library, recorded once
    (first grading on this venv, or `grade --record-manifest`) into the venv, and compared before and after
    every run: a file a submission added, removed or rewrote (a trojan in `nbclient/__init__.py`) refuses
    grading in this run and every later one, until someone who knows the change records it again. A file's
    change time cannot be set back by its owner. Bytecode (`__pycache__`) is written by imports and is not
    listed: a sandboxed submission cannot write any of it (read-only), an `--unsafe` one could, and could
    also rewrite this record; the manifest is a tripwire there, the sandbox is the wall. JupyterLab's
    settings (`share/jupyter/lab/settings`, written by `make lab-settings`) are not listed: no grader
    code reads them."""

    NAME = "labkernels-manifest.json"

    def __init__(self, path: Path | None = None, roots: list[Path] | None = None):
        self.path = path or Path(sys.prefix) / self.NAME
        self.roots = roots or sorted({Path(sys.prefix), Path(sysconfig.get_paths()["stdlib"])})

    def take(self) -> dict[str, list[int]]:
        files = {}
        for root in self.roots:
            # the stdlib's own site-packages is not this interpreter's (the venv's is), its tests never run
            skip = {"__pycache__"} | ({"site-packages", "test"} if root != Path(sys.prefix) else set())
            for folder, dirs, names in os.walk(root):
                dirs[:] = [d for d in dirs if d not in skip]
                if os.path.relpath(folder, root) == os.path.join("share", "jupyter", "lab"):
                    dirs[:] = [d for d in dirs if d != "settings"]  # JupyterLab's look (make lab-settings)
                for name in names:
                    path = os.path.join(folder, name)
                    with contextlib.suppress(OSError):
                        st = os.lstat(path)
                        files[path] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        files.pop(str(self.path), None)
        return files

    def record(self) -> None:
        _write(self.path, json.dumps(self.take()))

    def digest(self) -> str:
        return _hash_file(self.path)

    def check(self, when: str, log=None) -> None:
        try:
            known = json.loads(self.path.read_text())
        except FileNotFoundError:
            self.record()
            if log:
                log(f"recorded the venv's manifest (its known-good state): {self.path}")
            return
        except (OSError, ValueError) as e:
            raise VenvChanged(
                f"refusing to grade: cannot read the venv's manifest {self.path}: {e}"
            ) from None
        now = self.take()
        changed = [p for p in known if p in now and now[p] != known[p]]
        changed += [f"{p} (removed)" for p in known if p not in now]
        changed += [f"{p} (added)" for p in now if p not in known]
        if changed:
            raise VenvChanged(
                f"refusing to grade: the venv differs from its recorded known-good state {when}: "
                f"{', '.join(changed[:5])}{' …' if len(changed) > 5 else ''}. A submission may have planted "
                "code there. If you changed it yourself (pip install), record it again with "
                "`python -m labkernels grade --record-manifest`; otherwise reinstall the venv"
            )


class _ExpectedSeal(PackageSeal):
    """A worker's seal: checks against the manifest the class's process took (not one of its own)."""

    def __init__(self, root: Path, files: dict[str, str]):
        self.root, self.files, self.venv = root, files, None  # the class's process checks the venv


# --- finding the class --------------------------------------------------------------------------------------


def is_class_folder(folder: Path) -> bool:
    """A class folder holds no notebook itself and folders that hold chapter notebooks (NN_*.ipynb)."""
    if not folder.is_dir() or any(folder.glob("*.ipynb")):
        return False
    return any(any(nbs.CHAPTER.match(p.name) for p in sub.glob("*.ipynb")) for sub in _subfolders(folder))


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def check_output_folder(out: Path, class_dir: Path) -> None:
    """Refuse an output folder inside the class (or the class inside it), or one this command did not make."""
    o, c = out.resolve(), class_dir.resolve()
    if o == c or c in o.parents:
        raise RefusedOutput(f"--out {out} is inside the class folder {class_dir}: choose a folder outside it")
    if o in c.parents:
        raise RefusedOutput(f"--out {out} contains the class folder {class_dir}: choose a folder beside it")
    if o.exists() and not o.is_dir():
        raise RefusedOutput(f"--out {out} is a file, not a folder")
    if o.is_dir() and any(o.iterdir()) and not (o / MARKER).exists():
        raise RefusedOutput(
            f"--out {out} holds files this command did not write (no {MARKER}): choose a new or empty folder"
        )


def _write(path: Path, text: str) -> None:
    """Temporary file + rename: a reader never sees half a file, and a failure leaves the old one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the cache ----------------------------------------------------------------------------------------------


def cache_key(student: str, data: bytes, chapter: str, seal_digest: str, venv_digest: str, lane: str) -> str:
    """Who handed it in and everything the sandboxed run could read: the notebook, the package, the venv (its
    recorded state), the lane. Two students' identical notebooks are two entries: neither gets the other's."""
    h = hashlib.sha256()
    for part in (student, hashlib.sha256(data).hexdigest(), chapter, seal_digest, venv_digest, lane):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _cacheable(report: dict) -> bool:
    """Outcomes that depend on the machine's load (time limits) are graded again next time."""
    text = json.dumps([report.get("problem"), [r["error"] for r in report["exercises"]]])
    return not any(w in text for w in ("time limit", "timed out", "longer than", "run exceeded"))


def _load_cache(out: Path) -> dict:
    try:
        data = json.loads((out / CACHE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# --- one student, in a worker process -----------------------------------------------------------------------


def _grade_student(job: dict) -> list[dict]:
    """In the worker: grade the notebooks the job carries (bytes read by the class's process, before any
    submission ran), correctness only; speed answers are kept for the class's process."""
    from labkernels.grading.registry import discover

    discover()
    seal = _ExpectedSeal(Path(job["package"]), job["manifest"])
    seal.check("before this worker started")
    reports = []
    for item in job["notebooks"]:
        deadline = time.monotonic() + job["notebook_timeout"] if job["notebook_timeout"] else None
        reports.append(
            nbs.grade_notebook(
                Path(item["path"]),
                job["cell_timeout"],
                base64.b64decode(item["data"]),
                item["chapter"],
                deadline=deadline,
                seal=seal,
                defer_speed=True,
            )
        )
    return reports


def _worker_main(read_fd: int, write_fd: int) -> int:
    from multiprocessing.connection import Connection

    nbs._set_subreaper()
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    job = json.loads(conn_in.recv_bytes())
    try:
        result = {"reports": _grade_student(job)}
    except GraderChanged as e:
        result = {"grader_changed": str(e)}
    except Exception as e:  # noqa: BLE001  (a defect of the grader: reported, the run goes on)
        result = {"error": f"the grader failed: {type(e).__name__}: {e}"}
    finally:
        nbs.kill_descendants()
    conn_out.send_bytes(json.dumps(result).encode())
    return 0


class _Worker:
    def __init__(self, student: str, job: dict, limit_s: float | None):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        env = dict(os.environ, LABKERNELS_LANE=_lane())  # the class's lane, not the machine's guess
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "labkernels.grading.classroom", str(to_r), str(from_w)],
            pass_fds=(to_r, from_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        os.close(to_r)
        os.close(from_w)
        from multiprocessing.connection import Connection

        Connection(to_w, readable=False).send_bytes(json.dumps(job).encode())
        self.conn = Connection(from_r, writable=False)
        self.student = student
        self.deadline = None if limit_s is None else time.monotonic() + limit_s

    def poll(self) -> dict | None:
        """The worker's result once it has sent it (None while it runs)."""
        if self.conn.poll(0):
            try:
                return json.loads(self.conn.recv_bytes())
            except (EOFError, OSError, ValueError):
                return {"error": "the grading worker ended without a result"}
        if self.proc.poll() is not None and not self.conn.poll(0):
            return {"error": f"the grading worker ended without a result (exit {self.proc.returncode})"}
        return None

    def kill(self) -> None:
        """The worker and every process below it now (pids read fresh each time: never a reused one);
        those orphaned meanwhile come back to this process (subreaper) and `_kill_orphans` ends them."""
        for _ in range(20):
            pids = nbs._descendants(self.proc.pid)
            for pid in [*pids, self.proc.pid]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if not pids:
                break
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.conn.close()


def _lane() -> str:
    from labkernels.lane import LANE

    return LANE


def _kill_orphans(workers: list[_Worker]) -> None:
    """Children of this process that are no live worker: orphans of a killed worker's notebook."""
    live = {w.proc.pid for w in workers}
    for _ in range(5):
        stray = [p for p in nbs._descendants(os.getpid()) if p not in live and _parent(p) == os.getpid()]
        if not stray:
            return
        for pid in stray:
            for sub in [pid, *nbs._descendants(pid)]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(sub, signal.SIGKILL)
        time.sleep(0.05)
        for pid in stray:  # reap them: no zombie left behind
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


# --- the class ----------------------------------------------------------------------------------------------


def _zero_reports(todo: list[tuple[Path, str]], why: str) -> list[dict]:
    return [nbs.missing_chapter(chapter, why) | {"notebook": str(nb)} for nb, chapter in todo]


def grade_class(
    class_dir: Path,
    out: Path,
    *,
    jobs: int = 1,
    cell_timeout: int = 600,
    notebook_timeout: float | None = 1800,
    run_timeout: float | None = None,
    force: bool = False,
    chapters: list[str] | None = None,
    export: str | None = None,
    shard: tuple[int, int] | None = None,
    log=print,
) -> dict:
    """Grade every student of `class_dir` (or shard K of N of them, `shard=(K, N)`); write the gradebook into
    `out`. Returns {student: reports}."""
    check_output_folder(out, class_dir)
    start = time.monotonic()
    run_deadline = None if run_timeout is None else start + run_timeout
    nbs._set_subreaper()
    seal = PackageSeal(venv=VenvManifest(), log=log)
    lane = _lane()
    from labkernels.grading import isolation
    from labkernels.grading.remote import PACKAGE_ROOT

    # Unsandboxed, a run may read anything (another student's answers): what it decided is never reused.
    cacheable = isolation.enabled(PACKAGE_ROOT)
    cache = _load_cache(out) if cacheable and not force else {}
    everyone = [s.name for s in _subfolders(class_dir)]
    students = {name: class_dir / name for name in shard_of(everyone, shard)}
    plans, results, pending, used = {}, {}, [], {}
    for name, folder in students.items():  # read every notebook before any of them runs
        todo, extra = nbs.plan_submission(folder, chapters)
        items, reports = [], []
        for nb, chapter in todo:
            data = nb.read_bytes()
            key = cache_key(name, data, chapter, seal.digest, seal.venv.digest(), lane)
            if key in cache:
                reports.append(json.loads(json.dumps(cache[key])) | {"notebook": str(nb), "cached": True})
                used[key] = cache[key]
            else:
                item = {"path": str(nb), "chapter": chapter, "key": key}
                items.append(item | {"data": base64.b64encode(data).decode()})
        plans[name] = (todo, extra)
        results[name] = reports
        if items:
            pending.append((name, items))
    cached = sum(len(r) for r in results.values())
    log(f"grading {len(students)} students ({cached} notebooks unchanged since the last run, skipped)")
    new_entries = _run_workers(
        pending, results, plans, seal, jobs, cell_timeout, notebook_timeout, run_deadline
    )
    _speed_pass(results, seal, run_deadline, log)
    seal.check("during this run")
    for name, (_todo, extra) in plans.items():
        results[name] = _order(results[name]) + extra
    for key, report in new_entries.items():
        if cacheable and _cacheable(report):
            used[key] = report
    run = {"shard": list(shard or (1, 1)), "class_students": sorted(everyone)}
    _write_outputs(out, class_dir, results, used, export, time.monotonic() - start, run)
    return results


# --- a class over several machines: shards and their merge --------------------------------------------------


def parse_shard(text: str) -> tuple[int, int]:
    """ "K/N" -> (K, N), 1 <= K <= N; anything else is refused with the form expected."""
    k, slash, n = str(text).partition("/")
    if not (slash and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"--shard {text!r}: expected K/N with 1 <= K <= N, e.g. 2/4")
    return int(k), int(n)


def shard_of(names: list[str], shard: tuple[int, int] | None) -> list[str]:
    """Shard K of N: every Nth student of the sorted names, starting at the Kth. Every machine that sees the
    same class folder splits it the same way, and the N shards hold every student exactly once."""
    if shard is None:
        return sorted(names)
    k, n = shard
    return [name for i, name in enumerate(sorted(names)) if i % n == k - 1]


def merge_shards(folders: list[Path], out: Path, export: str | None = None) -> dict:
    """One gradebook in `out` from the `--out` folders of shards 1..N of one class: the files one run over the
    whole class writes. Refuses shards of different classes or splits, a shard missing or given twice, and
    a student graded twice. Returns {student: reports}."""
    runs = [_shard_run(f) for f in folders]
    n = runs[0]["shard"][1]
    got = sorted(r["shard"][0] for r in runs)
    if any(r["shard"][1] != n for r in runs) or got != list(range(1, n + 1)):
        raise RefusedOutput(
            f"shards {[f'{k}/{m}' for k, m in (r['shard'] for r in runs)]}: need 1/{n} .. {n}/{n}"
        )
    if any(r["class_students"] != runs[0]["class_students"] for r in runs):
        raise RefusedOutput("the shards graded different classes (their student lists differ)")
    for folder in folders:  # never inside a shard, never around one, never over files of its own
        check_output_folder(out, folder)
    results, cache = {}, {}
    for folder in folders:
        for path in sorted((folder / "students").glob("*.json")):
            body = json.loads(path.read_text())
            if body["student"] in results:
                raise RefusedOutput(f"{body['student']!r} is graded in two shards ({folder})")
            results[body["student"]] = body["notebooks"]
        cache |= _load_cache(folder)
    missing = sorted(set(runs[0]["class_students"]) - set(results))
    if missing:
        raise RefusedOutput(f"no shard holds the grades of {missing[:5]}")
    seconds = sum(json.loads((f / "run.json").read_text()).get("seconds", 0) for f in folders)
    run = {"shard": [1, 1], "class_students": runs[0]["class_students"], "merged": [str(f) for f in folders]}
    _write_outputs(out, folders[0], results, cache, export, seconds, run)
    return results


def _shard_run(folder: Path) -> dict:
    try:
        run = json.loads((folder / "run.json").read_text())
        if (folder / MARKER).exists() and "shard" in run and "class_students" in run:
            return run
    except (OSError, ValueError):
        pass
    raise RefusedOutput(
        f"{folder} is not the --out folder of a `grade --shard` run (no run.json with its shard)"
    )


def _order(reports: list[dict]) -> list[dict]:
    return sorted(reports, key=lambda r: Path(r["notebook"]).name)


def _run_workers(pending, results, plans, seal, jobs, cell_timeout, notebook_timeout, run_deadline) -> dict:
    """Correctness, `jobs` students at a time. Returns the new cache entries {key: report}."""
    entries: dict[str, dict] = {}
    running: list[_Worker] = []
    keys_of: dict[str, list[tuple[str, str]]] = {}
    queue = list(pending)
    try:
        while queue or running:
            now = time.monotonic()
            if run_deadline is not None and now >= run_deadline:
                for w in running:
                    w.kill()
                    results[w.student] += _zero_reports(_todo_of(w.student, plans, keys_of), nbs.RUN_LIMIT)
                for name, _items in queue:
                    results[name] += _zero_reports(_todo_of(name, plans, keys_of, _items), nbs.RUN_LIMIT)
                running, queue = [], []
                _kill_orphans([])
                break
            while queue and len(running) < max(1, jobs):
                name, items = queue.pop(0)
                keys_of[name] = [(i["path"], i["key"]) for i in items]
                job = {
                    "notebooks": [{k: i[k] for k in ("path", "chapter", "data")} for i in items],
                    "cell_timeout": cell_timeout,
                    "notebook_timeout": notebook_timeout,
                    "package": str(seal.root),
                    "manifest": seal.files,
                }
                limit = None if notebook_timeout is None else notebook_timeout * len(items) + GRACE_S
                running.append(_Worker(name, job, limit))
            for w in list(running):
                result = w.poll()
                if result is None and w.deadline is not None and time.monotonic() > w.deadline:
                    w.kill()
                    result = {"timeout": True}
                if result is None:
                    continue
                running.remove(w)
                with contextlib.suppress(Exception):
                    w.kill()  # it has answered: nothing of it may outlive it
                _kill_orphans(running)
                seal.check(f"while grading {w.student}")
                results[w.student] += _worker_reports(w.student, result, plans, keys_of, entries)
            _wait([w.conn for w in running])
    except BaseException:
        for w in running:
            w.kill()
        _kill_orphans([])
        raise
    return entries


def _todo_of(name, plans, keys_of, items=None) -> list[tuple[Path, str]]:
    paths = {p for p, _ in keys_of.get(name, [])} | {i["path"] for i in items or []}
    return [(nb, ch) for nb, ch in plans[name][0] if str(nb) in paths]


def _worker_reports(name, result, plans, keys_of, entries) -> list[dict]:
    todo = _todo_of(name, plans, keys_of)
    if "grader_changed" in result:
        raise GraderChanged(f"{result['grader_changed']} (while grading {name})")
    if result.get("timeout"):
        return _zero_reports(todo, nbs.TIME_LIMIT)
    if "error" in result or len(result.get("reports", [])) != len(todo):
        return _zero_reports(todo, result.get("error") or "the grading worker returned no report")
    for (path, key), report in zip(keys_of[name], result["reports"], strict=True):
        report["notebook"] = path
        entries[key] = report  # completed below, after the speed pass (same dict)
    return result["reports"]


def _wait(conns, timeout: float = 0.2) -> None:
    if conns:
        with contextlib.suppress(OSError, ValueError):
            select.select([c.fileno() for c in conns], [], [], timeout)
    else:
        time.sleep(0.01)


def _speed_pass(results: dict, seal: PackageSeal, run_deadline: float | None, log) -> None:
    """GPU lane: every deferred speed case, one answer at a time, nothing else running."""
    todo = [(s, r) for s, reps in results.items() for r in reps if r.get("answers")]
    if todo:
        log(f"speed cases: {len(todo)} notebooks, one at a time")
    for student, report in todo:
        nbs.grade_speed(report, run_deadline)
        nbs.kill_descendants()
        seal.check(f"while timing {student}'s answers")


# --- what is written ----------------------------------------------------------------------------------------


def _reason(rec: dict) -> str:
    if rec["error"]:
        return rec["error"]
    fails = [c for c in rec["cases"] if c["status"] == "fail"]
    return fails[0]["reason"] if fails else ""


def _cell(text) -> str:
    """Text a spreadsheet will not run as a formula (reasons quote the submission's own messages)."""
    text = str(text).replace("\n", " ")[:500]
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _part(rec: dict) -> str:
    return f"{rec['exercise']} speed" if rec["speed"] else rec["exercise"]


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def gradebook_rows(results: dict) -> list[list]:
    parts: dict[str, float] = {}
    for reports in results.values():
        for rep in reports:
            for rec in rep["exercises"]:
                if rec["possible"] > 0:
                    parts.setdefault(_part(rec), rec["possible"])
    order = sorted(parts, key=lambda p: ([int(x) for x in p.split()[0].split(".")], p))
    header = ["student", "earned", "possible", "problems"]
    for p in order:
        header += [f"{p} ({parts[p]:g})", f"{p} reason"]
    rows = [header]
    for student, reports in sorted(results.items()):
        recs = {_part(r): r for rep in reports for r in rep["exercises"]}
        problems = "; ".join(f"{Path(r['notebook']).name}: {r['problem']}" for r in reports if r["problem"])
        row = [_cell(student), _total(reports, "earned"), _total(reports, "possible"), _cell(problems)]
        for p in order:
            rec = recs.get(p)
            row += [f"{rec['earned']:g}", _cell(_reason(rec))] if rec else ["", "not graded"]
        rows.append(row)
    return rows


def long_rows(results: dict) -> list[list]:
    rows = [["student", "notebook", "exercise", "part", "earned", "possible", "reason"]]
    for student, reports in sorted(results.items()):
        for rep in reports:
            for rec in rep["exercises"]:
                part = "speed" if rec["speed"] else "correctness"
                rows.append(
                    [
                        _cell(student),
                        _cell(Path(rep["notebook"]).name),
                        rec["exercise"],
                        part,
                        f"{rec['earned']:g}",
                        f"{rec['possible']:g}",
                        _cell(_reason(rec)),
                    ]
                )
    return rows


def _total(reports: list[dict], key: str) -> str:
    return f"{sum(r[key] for rep in reports for r in rep['exercises']):g}"


def assignment_names(results: dict) -> dict[str, str]:
    """Chapter -> assignment name: the course's notebook name (exercises/ beside the package), else the
    name most students handed in, else the chapter number."""
    names: dict[str, str] = {}
    course = _package_dir().parent / "exercises"
    for nb in sorted(course.glob("*.ipynb")) if course.is_dir() else []:
        m = nbs.CHAPTER.match(nb.name)
        if m:
            names.setdefault(m.group(1), nb.stem)
    seen: dict[str, Counter] = {}
    for reports in results.values():
        for rep in reports:
            m = nbs.CHAPTER.match(Path(rep["notebook"]).name)
            if m and not rep["notebook"].endswith("_*.ipynb"):
                seen.setdefault(m.group(1), Counter())[Path(rep["notebook"]).stem] += 1
    for chapter, counts in seen.items():
        names.setdefault(chapter, counts.most_common(1)[0][0])
    return names


def nbgrader_rows(results: dict) -> list[list]:
    """`nbgrader export`'s CSV columns; one row per student per chapter (assignment = the chapter's
    notebook). A chapter not handed in has an empty timestamp and a score of 0, as nbgrader writes it."""
    names = assignment_names(results)
    rows = [list(NBGRADER_COLUMNS)]
    for student, reports in sorted(results.items()):
        earned: dict[str, float] = {}
        possible: dict[str, float] = {}
        stamps: dict[str, str] = {}
        for rep in reports:
            for rec in rep["exercises"]:
                ch = rec["exercise"].split(".")[0].zfill(2)
                earned[ch] = earned.get(ch, 0.0) + rec["earned"]
                possible[ch] = possible.get(ch, 0.0) + rec["possible"]
                if rep.get("timestamp"):
                    stamps.setdefault(ch, rep["timestamp"])
        for ch in sorted(earned):
            score = float(earned[ch])
            row = [names.get(ch, ch), "", stamps.get(ch, ""), _cell(student), "", "", ""]
            rows.append(row + [score, 0.0, score, float(possible[ch])])
    return rows


def _stamp(results: dict) -> None:
    """A graded notebook's timestamp (nbgrader's submission time): its file's modification time."""
    from datetime import datetime, timezone

    for reports in results.values():
        for rep in reports:
            path = Path(rep["notebook"])
            if rep["exercises"] and path.is_file() and "timestamp" not in rep:
                mtime = path.stat().st_mtime
                rep["timestamp"] = datetime.fromtimestamp(mtime, timezone.utc).isoformat(sep=" ")


def _write_outputs(
    out: Path, class_dir: Path, results: dict, cache: dict, export, seconds: float, run: dict
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _write(out / MARKER, f"written by `python -m labkernels grade {class_dir}`\n")
    _stamp(results)
    for student, reports in results.items():
        body = {
            "student": student,
            "earned": float(_total(reports, "earned")),
            "possible": float(_total(reports, "possible")),
            "notebooks": [{k: v for k, v in r.items() if k != "answers"} for r in reports],
        }
        _write(out / "students" / f"{_safe(student)}.json", json.dumps(body, indent=1))
    _write(out / "gradebook.csv", _csv(gradebook_rows(results)))
    _write(out / "gradebook-long.csv", _csv(long_rows(results)))
    if export == "nbgrader":
        _write(out / "nbgrader.csv", _csv(nbgrader_rows(results)))
    drop = ("answers", "cached", "timestamp")
    clean = {k: {x: y for x, y in v.items() if x not in drop} for k, v in cache.items()}
    _write(out / CACHE, json.dumps(clean))
    _write(out / "run.json", json.dumps({"students": len(results), "seconds": round(seconds, 1)} | run))


def _safe(name: str) -> str:
    """A file name for a student: the name itself where it is one; otherwise its safe characters and a hash of
    the name, so "anna smith" and "anna_smith" never share a file."""
    safe = "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name).lstrip(".") or "_"
    if safe == name:
        return name
    return f"{safe}~{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def summary(results: dict) -> str:
    lines = [f"{'student':<24} {'score':>11}  problems"]
    for student, reports in sorted(results.items()):
        probs = sum(1 for r in reports if r["problem"])
        note = f"{probs} notebook problem(s)" if probs else ""
        lines.append(
            f"{student[:24]:<24} {_total(reports, 'earned'):>5}/{_total(reports, 'possible'):<5}  {note}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_worker_main(int(sys.argv[1]), int(sys.argv[2])))
