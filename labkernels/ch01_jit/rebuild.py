"""What makes `torch.utils.cpp_extension` rebuild an extension? Measured, not assumed.

torch decides in two places:

* **in the process**, `load()` and `load_inline()` keep a hash of the source files' *content* and the build
  arguments (`ExtensionVersioner`). A different hash means a rebuild under a new name (`name_v1`), because
  Python cannot re-import a changed module under its old name. The same hash skips the build entirely.
* **in a new process**, there is no hash yet, so torch runs ninja, and ninja rebuilds a file whose *mtime* is
  newer than its object, or whose compile command changed.

`load_inline` writes your string to `main.cpp` only when the text differs, so for it "content" is what
counts everywhere. `load` reads your files: touching one (same content, new mtime) rebuilds in the next
process but not in this one. The hash covers the files you list, not the headers they include; ninja, told
by the compiler which headers each object read (a depfile), watches those too.

`measure_rebuilds()` builds tiny extensions (no torch headers: about a second each) and reports, for each
API and edit, whether the shared library was written again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labkernels.results import Table

APIS = ("load", "load_inline")
#: The edits: nothing changed; the source file's mtime bumped with the same content (`load` only: a string
#: has no mtime); a comment added (content changed, same code); a -D flag added to extra_cflags; the header
#: the source includes changed (`load` only: its source is `#include "tiny.h"` and a function).
EDITS = ("nothing", "touch", "comment", "flag", "header")
#: The edits chapter 01 measures in front of the learner; exercise 1.2 also asks about `header`.
CHAPTER_EDITS = ("nothing", "touch", "comment", "flag")
LOAD_ONLY = ("touch", "header")
PROCESSES = ("same", "new")

_SOURCE = 'extern "C" int labkernels_answer() { return 42; }\n'
_SOURCE_WITH_HEADER = '#include "tiny.h"\nextern "C" int labkernels_answer() { return LABKERNELS_ANSWER; }\n'
_HEADER = "#define LABKERNELS_ANSWER 42\n"
_COMMENT = "// an edit that changes no code\n"
_FLAG = "-DLABKERNELS_REBUILD_DEMO=1"


def scenarios(edits=EDITS) -> list[tuple[str, str, str]]:
    """(api, edit, process) for every meaningful combination of `edits`: 16 of them for all five."""
    return [
        (a, e, p)
        for a in APIS
        for e in edits
        for p in PROCESSES
        if not (a == "load_inline" and e in LOAD_ONLY)
    ]


def _build(api: str, directory: Path, name: str, source: str, flags: list[str]) -> Path:
    """Build (or not) the tiny extension; return the library path torch loaded."""
    from torch.utils import cpp_extension

    from labkernels.ch01_jit.build import ensure_ninja_on_path

    ensure_ninja_on_path()
    directory.mkdir(parents=True, exist_ok=True)
    common = dict(name=name, extra_cflags=flags, build_directory=str(directory), is_python_module=False)
    if api == "load":
        path = cpp_extension.load(sources=[str(directory / "tiny.cpp")], **common)
    else:
        kwargs = {"no_implicit_headers": True} if _has_no_implicit_headers() else {}
        path = cpp_extension.load_inline(cpp_sources=[source], **common, **kwargs)
    return Path(path)


def _has_no_implicit_headers() -> bool:
    import inspect

    from torch.utils.cpp_extension import load_inline

    return "no_implicit_headers" in inspect.signature(load_inline).parameters


def _first_source(api: str) -> str:
    return _SOURCE_WITH_HEADER if api == "load" else _SOURCE


def _later(path: Path) -> None:
    """Set path's mtime later than the object file's, whatever the clock's resolution."""
    future = time.time() + 2
    os.utime(path, (future, future))


def _apply(api: str, edit: str, directory: Path) -> tuple[str, list[str]]:
    """Make `edit` and return the (source, flags) of the next call."""
    source, flags = _first_source(api), []
    if edit == "touch":
        _later(directory / "tiny.cpp")
    elif edit == "comment":
        source = _COMMENT + source
    elif edit == "flag":
        flags = [_FLAG]
    elif edit == "header":
        (directory / "tiny.h").write_text(_COMMENT + _HEADER)
        _later(directory / "tiny.h")
    if api == "load":
        from labkernels.ch01_jit.build import write_if_changed

        write_if_changed(directory / "tiny.cpp", source)
    return source, flags


def _signature(path: Path) -> list:
    return [str(path), path.stat().st_mtime_ns]


def _second_calls(jobs: list[dict]) -> list[list]:
    """Run the second call of each job in this process and return (path, mtime) of what it loaded."""
    return [_signature(_build(j["api"], Path(j["dir"]), j["name"], j["source"], j["flags"])) for j in jobs]


def measure_rebuilds(root: str | os.PathLike | None = None, edits=EDITS) -> Table:
    """Build each scenario's tiny extension, make the edit, call again (in this process, or in a fresh one)
    and record whether the library was written again. Takes ~10-20 s on a laptop (16 tiny builds)."""
    if root is None:
        with tempfile.TemporaryDirectory(prefix="labkernels-rebuild-") as tmp:
            return measure_rebuilds(tmp, edits)
    root = Path(root)
    tag = f"{os.getpid()}_{time.monotonic_ns() % 10**9}"  # fresh names: this process has never seen them
    jobs = []
    for api, edit, process in scenarios(edits):
        name = f"tiny_{api}_{edit}_{process}_{tag}"
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        if api == "load":
            (directory / "tiny.h").write_text(_HEADER)
            (directory / "tiny.cpp").write_text(_SOURCE_WITH_HEADER)
        first = _signature(_build(api, directory, name, _first_source(api), []))
        source, flags = _apply(api, edit, directory)
        jobs.append(
            dict(
                api=api,
                edit=edit,
                process=process,
                dir=str(directory),
                name=name,
                source=source,
                flags=flags,
                first=first,
            )
        )
    same = [j for j in jobs if j["process"] == "same"]
    new = [j for j in jobs if j["process"] == "new"]
    for job, second in zip(same, _second_calls(same), strict=True):
        job["second"] = second
    if new:
        for job, second in zip(new, _in_new_process(new), strict=True):
            job["second"] = second
    rows = [
        {"api": j["api"], "edit": j["edit"], "process": j["process"], "rebuilt": j["second"] != j["first"]}
        for j in jobs
    ]
    return Table(rows)


def _in_new_process(jobs: list[dict]) -> list[list]:
    from labkernels.ch01_jit.build import child_env

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(jobs, f)
        spec = f.name
    try:
        done = subprocess.run(
            [sys.executable, "-m", "labkernels.ch01_jit.rebuild", spec],
            capture_output=True,
            text=True,
            timeout=600,
            env=child_env(),
        )
    finally:
        os.unlink(spec)
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rebuild_facts(table: Table) -> dict[tuple[str, str, str], bool]:
    return {(r["api"], r["edit"], r["process"]): bool(r["rebuilt"]) for r in table.rows}


if __name__ == "__main__":  # the fresh process of `measure_rebuilds`
    print(json.dumps(_second_calls(json.loads(Path(sys.argv[1]).read_text()))))
