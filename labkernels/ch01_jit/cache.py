"""Guards around torch's extension cache, for the two ways it fails without a word.

1. **A damaged library.** In a new process torch runs ninja, which relinks only when a source is newer than
   the `.so`. A library truncated or zeroed after its build (a full disk, a killed copy) is newer than its
   sources: ninja keeps it, and loading it kills every later process (SIGBUS/SIGSEGV). `sound_library()`
   checks the file before torch sees it: its ELF header and that every segment and section it declares lies
   inside the file; a library this code has not loaded before is also loaded once in a child process.
   A damaged one is deleted, so ninja links it again from its objects.
2. **A lock whose owner died.** torch serialises builds with a `lock` file and waits for it to vanish,
   forever. `bounded_lock_wait()` makes that wait look at the lock: a lock no live process holds is removed
   and the build retried; a live one is waited on for at most `wait_seconds`, then an error names it. (From
   torch 2.14 the lock is an OS lock, which dies with its holder: its file stays and is never removed here.)

And one way it fails under processes at once: **a load meeting a relink.** The linker removes the library and
writes the new one over seconds, its ELF header last. A process arriving then found a half-written file,
judged it damaged and deleted it, and every process that had built or waited for that build failed to load
it (`cannot open shared object file`): `make test-gpu` on a fresh machine, its suites side by side.
`guarded_load` therefore holds a lock of its own (`flock` on `LOAD_LOCK` in the build directory) around the
check, the build and the load: a process that arrives meanwhile waits, then finds the library whole. The
kernel releases a `flock` when its process dies, so this lock is never stale.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from labkernels.ch01_jit import diagnostics

#: How long a build waits for another live process's build of the same extension.
WAIT_SECONDS = float(os.environ.get("LABKERNELS_BUILD_WAIT_S", "900"))
_POLL_SECONDS = 0.2


class BuildLockTimeout(RuntimeError):
    """Another process held the build lock for longer than we were willing to wait."""


class DamagedBuildError(RuntimeError):
    """The cached build could not be repaired by relinking: its directory must be deleted."""


class _LockRecovered(Exception):
    """A stale lock was removed while waiting: the build must be tried again."""


# --- damaged libraries --------------------------------------------------------------------------------------


def elf_problem(path: Path) -> str | None:
    """Why the shared library at `path` cannot be a whole ELF file, or None if it looks whole."""
    data_size = path.stat().st_size
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF":
            return f"{path} is not an ELF shared library (no ELF header: truncated or zeroed?)"
        if header[4] != 2 or header[5] != 1:
            return None  # not a 64-bit little-endian file: leave it to the loader
        phoff, shoff = struct.unpack_from("<QQ", header, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
        if phoff + phnum * phentsize > data_size or shoff + shnum * shentsize > data_size:
            return f"{path} is truncated: its headers point past its {data_size} bytes"
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    for k in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, k * phentsize)
        if p_type == 1 and p_offset + p_filesz > data_size:  # PT_LOAD: mapped from the file
            return f"{path} is truncated: a segment ends at byte {p_offset + p_filesz} of {data_size}"
    return None


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mark_verified(path: Path) -> None:
    """Record that `path`, as it is now, loaded in a process (written atomically: builds run in parallel)."""
    tmp = _stamp(path).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"size": path.stat().st_size, "sha256": _digest(path)}))
    os.replace(tmp, _stamp(path))


def is_verified(path: Path) -> bool:
    try:
        stamp = json.loads(_stamp(path).read_text())
        return stamp["size"] == path.stat().st_size and stamp["sha256"] == _digest(path)
    except (OSError, ValueError, KeyError):
        return False


def child_load_problem(path: Path, timeout: float = 300.0) -> str | None:
    """Load the library in a fresh Python (with torch) and report a crash or an error, or None."""
    code = "import sys, torch; torch.ops.load_library(sys.argv[1])"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None  # slow, not broken: let the real load decide
    if done.returncode < 0:
        return f"loading {path} in a fresh process killed it with signal {-done.returncode}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        return f"loading {path} in a fresh process failed: {last}"
    return None


def sound_library(path: Path) -> str | None:
    """Check a cached library before torch loads it; delete it if damaged and say why (None: kept).

    Not while a live build holds torch's lock: that build is writing the library (torch then waits for it and
    loads the result)."""
    if not path.exists() or not sys.platform.startswith("linux"):
        return None
    lock = diagnostics.lock_status(path.parent)
    if lock is not None and lock.building:
        return None
    problem = elf_problem(path)
    if problem is None and not is_verified(path):
        problem = child_load_problem(path)
    if problem is None:
        return None
    path.unlink(missing_ok=True)
    _stamp(path).unlink(missing_ok=True)
    warnings.warn(f"{problem}; deleted it, so the build links it again", stacklevel=3)
    return problem


# --- build locks --------------------------------------------------------------------------------------------


def _lock_timeout_message(lock: Path, waited: float) -> str:
    status = diagnostics.lock_status(lock.parent)
    who = f"process {', '.join(map(str, status.holders))}" if status and status.holders else "another process"
    return (
        f"waited {waited:.0f} s for {lock}, held by {who}: another build of this extension is still running. "
        f"Wait for it (or stop it), then run again; if no such build should be running, stop that process "
        f"and delete the file: rm {lock}"
    )


def _bounded_baton_class(wait_seconds: float):
    from torch.utils.file_baton import FileBaton

    class BoundedBaton(FileBaton):
        """torch's FileBaton whose wait() gives up on a dead owner at once and on a live one in time."""

        def wait(self) -> None:
            lock = Path(self.lock_file_path)
            start = time.monotonic()
            while lock.exists():
                status = diagnostics.lock_status(lock.parent)
                if status is not None and status.stale:
                    lock.unlink(missing_ok=True)
                    warnings.warn(f"removed a stale build lock: {status.explain()}", stacklevel=2)
                    raise _LockRecovered
                waited = time.monotonic() - start
                if waited > wait_seconds:
                    raise BuildLockTimeout(_lock_timeout_message(lock, waited))
                time.sleep(_POLL_SECONDS)

    return BoundedBaton


@contextlib.contextmanager
def bounded_lock_wait(wait_seconds: float = WAIT_SECONDS):
    """Within this block, torch's extension builds wait on a lock as `BoundedBaton.wait` does. From torch 2.14
    builds hold an OS lock (filelock) instead, which the kernel releases when its holder dies: no stale lock
    to recover, and the block changes nothing."""
    from torch.utils import cpp_extension

    if diagnostics.torch_builds_hold_an_os_lock():
        yield
        return
    original = cpp_extension.FileBaton
    cpp_extension.FileBaton = _bounded_baton_class(wait_seconds)
    try:
        yield
    finally:
        cpp_extension.FileBaton = original


#: The file `guarded_load` locks in the build directory (not torch's `lock`: that one only guards the build).
LOAD_LOCK = "labkernels-load.lock"


def _load_lock_message(path: Path, waited: float) -> str:
    holders = diagnostics.lock_holders(path)
    who = f"process {', '.join(map(str, holders))}" if holders else "another process"
    return (
        f"waited {waited:.0f} s for {who} to finish building and loading the extension in {path.parent} "
        f"(it holds {path}): wait for it or stop it, then run again"
    )


@contextlib.contextmanager
def one_loader_at_a_time(directory: Path, wait_seconds: float = WAIT_SECONDS):
    """Hold an exclusive `flock` on `directory/LOAD_LOCK` for the block, waiting at most `wait_seconds` for
    another process's. Where no such lock can be taken (no `fcntl`, a read-only cache), the block runs
    unlocked, as before."""
    try:
        import fcntl

        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOAD_LOCK, os.O_RDWR | os.O_CREAT, 0o666)  # not inherited by children
    except (ImportError, OSError):
        yield
        return
    try:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > wait_seconds:
                    raise BuildLockTimeout(_load_lock_message(directory / LOAD_LOCK, waited)) from None
                time.sleep(_POLL_SECONDS)
        yield
    finally:
        os.close(fd)  # releases the lock


def guarded_load(
    load: Callable[[], str], library: Path, *, wait_seconds: float = WAIT_SECONDS, attempts: int = 3
) -> str:
    """Run `load()` (a torch `load`/`load_inline` call building into `library.parent`) with the guards: one
    process at a time checks, builds and loads (others wait, at most `wait_seconds`); a damaged `library`
    is deleted first (ninja links it again), a stale lock is removed and the build retried, a live one
    waited on for at most `wait_seconds`. Returns what `load()` returns."""
    with one_loader_at_a_time(library.parent, wait_seconds):
        return _guarded_load(load, library, wait_seconds, attempts)


def _guarded_load(load: Callable[[], str], library: Path, wait_seconds: float, attempts: int) -> str:
    from torch.utils import cpp_extension

    damaged = sound_library(library)
    stale = diagnostics.check_lock(library.parent, fix=True)  # a lock left by a dead build: remove it now
    if stale is not None and stale.stale:
        warnings.warn(f"removed a stale build lock: {stale.explain()}", stacklevel=2)
    versions = cpp_extension.JIT_EXTENSION_VERSIONER.entries
    before = versions.get(library.stem)
    for _ in range(attempts):
        try:
            with bounded_lock_wait(wait_seconds):
                path = load()
        except _LockRecovered:
            # torch noted this build's source hash before waiting and would now skip the build: forget it
            if before is None:
                versions.pop(library.stem, None)
            else:
                versions[library.stem] = before
            continue
        except RuntimeError as e:
            if damaged is None or "Error building extension" not in str(e):
                raise
            raise DamagedBuildError(
                f"{damaged}; linking it again failed too, so the cached build is damaged. Delete the "
                f"directory and run again (a full rebuild): rm -r {library.parent}"
            ) from e
        if Path(path).exists():
            mark_verified(Path(path))
        return path
    raise BuildLockTimeout(f"the build lock in {library.parent} kept going stale; delete it and run again")
