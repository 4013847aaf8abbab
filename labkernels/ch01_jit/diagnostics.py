"""Learner-friendly failures of JIT builds.

Two things go wrong with `torch.utils.cpp_extension` that cost a learner an afternoon:

1. **A compile error is a wall of text.** torch raises `RuntimeError("Error building extension ...")` with
   the whole ninja log: every command line (hundreds of `-I` flags) and every note the compiler adds.
   `build_inline()` builds a `load_inline` source and, on failure, raises a `CompileError` that shows the
   compiler's *first* error with its line in *your* source, the line itself, and a caret.
2. **A build that hangs forever.** torch serialises builds of one extension with a `lock` file in its build
   directory (`FileBaton`). A build interrupted the hard way (kernel restarted or killed mid-build) leaves
   the file behind, and every later build waits on it, silently, forever. `check_lock()` tells a live
   build (some process still holds the file open) from a stale lock (nobody does) and says how to fix it.
   From torch 2.14 the `lock` file is an OS lock (`filelock`): the kernel releases it when its holder dies,
   and the file stays behind after every build. There no lock is ever stale; a build runs while some
   process holds the lock (`os_lock_held`).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

# ----------------------------------------------------------------------------------------------------------
# Stale lock files
# ----------------------------------------------------------------------------------------------------------

#: A lock younger than this is never called stale: torch closes its file a moment before deleting it.
MIN_STALE_SECONDS = 5.0
#: Where we cannot see which processes hold the lock (no /proc), a lock older than this is called stale.
#: A cold CUDA build with heavy headers takes minutes, so this is generous.
FALLBACK_STALE_SECONDS = 900.0


class StaleLockError(RuntimeError):
    """A `lock` file left by an interrupted build: torch would wait on it forever."""

    def __init__(self, status: LockStatus):
        self.status = status
        super().__init__(status.explain())


def torch_builds_hold_an_os_lock() -> bool:
    """True from torch 2.14, whose builds lock `lock` with an OS lock (filelock) and leave the file behind;
    False for torch's FileBaton (up to 2.13), whose file exists only while a build runs."""
    from torch.utils import cpp_extension

    return "FileBaton" not in vars(cpp_extension)


def os_lock_held(lock: Path) -> bool:
    """Whether some process holds an OS lock (`flock`, as filelock takes it) on `lock`: asked by trying to
    take it without waiting, and letting go at once."""
    try:
        import fcntl

        fd = os.open(lock, os.O_RDWR)
    except (ImportError, OSError):  # no fcntl, or the file is gone: nobody holds it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LockStatus:
    lock: Path
    age_seconds: float
    holders: tuple[int, ...] | None  # pids with the lock open; None where that cannot be known
    os_lock: bool = False  # torch >= 2.14: `lock` is an OS lock, and its file outlives every build

    @property
    def stale(self) -> bool:
        if self.os_lock:  # released by the kernel when its holder dies: a file left behind blocks nothing
            return False
        if self.age_seconds < MIN_STALE_SECONDS:
            return False
        if self.holders is None:
            return self.age_seconds > FALLBACK_STALE_SECONDS
        return not self.holders

    @property
    def building(self) -> bool:
        """Whether a build of this extension is running now (it writes the library)."""
        if self.os_lock:
            return os_lock_held(self.lock)
        return not self.stale

    def explain(self) -> str:
        if not self.stale:
            who = f"process {', '.join(map(str, self.holders))}" if self.holders else "another process"
            return (
                f"{self.lock} is held by {who}: a build of this extension is running; torch waits for it "
                "to finish, then loads the result."
            )
        why = (
            "no running process holds it"
            if self.holders is not None
            else f"it is older than {FALLBACK_STALE_SECONDS:.0f} s"
        )
        return (
            f"Stale build lock: {self.lock} is {self.age_seconds:.0f} s old and {why}, so an earlier "
            "build of this extension was interrupted (a kernel restarted or killed mid-build). torch's "
            "FileBaton would wait on it forever, so the build looks like it hangs.\n"
            f"Fix: delete the file, then run again:\n"
            f"    from labkernels.ch01_jit.diagnostics import clear_stale_lock; "
            f"clear_stale_lock({str(self.lock.parent)!r})\n"
            f"or in a shell: rm {self.lock}"
        )


def lock_holders(lock: Path) -> tuple[int, ...] | None:
    """The pids that have `lock` open (Linux: read from /proc/<pid>/fd), or None where /proc is missing.

    torch's FileBaton keeps the lock file open from `try_acquire()` until `release()`, so a live build
    always shows up here; a build killed mid-way does not.
    """
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(lock)
    holders = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    holders.append(int(entry.name))
                    break
            except OSError:
                continue
    return tuple(holders)


def lock_status(build_directory: str | os.PathLike) -> LockStatus | None:
    """The state of `build_directory/lock`, or None if there is no lock file."""
    lock = Path(build_directory) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None
    return LockStatus(lock, max(age, 0.0), lock_holders(lock), torch_builds_hold_an_os_lock())


def check_lock(build_directory: str | os.PathLike, *, fix: bool = False) -> LockStatus | None:
    """Raise `StaleLockError` (explaining the fix) if a stale lock would block a build here.

    With `fix=True` a stale lock is deleted instead. A lock held by a live build is returned, not raised:
    waiting for it is right.
    """
    status = lock_status(build_directory)
    if status is None or not status.stale:
        return status
    if fix:
        status.lock.unlink(missing_ok=True)
        return status
    raise StaleLockError(status)


def clear_stale_lock(build_directory: str | os.PathLike) -> bool:
    """Delete `build_directory/lock` if it is stale. Returns True if a file was deleted."""
    status = lock_status(build_directory)
    if status is None:
        return False
    if not status.stale:
        raise RuntimeError(status.explain() + " It is not stale: leave it.")
    status.lock.unlink(missing_ok=True)
    return True


def find_stale_locks(root: str | os.PathLike | None = None) -> list[LockStatus]:
    """Every stale lock in the extension directories under `root` (default: the course's extensions root
    and torch's default cache), e.g. to run after a crashed kernel."""
    from labkernels.ch01_jit.build import extensions_root

    roots = [Path(root)] if root is not None else [extensions_root(), _torch_default_root()]
    found = []
    for r in roots:
        if not r.is_dir():
            continue
        for lock in r.glob("**/lock"):
            status = lock_status(lock.parent)
            if status is not None and status.stale:
                found.append(status)
    return found


def _torch_default_root() -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("x", verbose=False)).parent


# ----------------------------------------------------------------------------------------------------------
# Compile errors: the first one, in the learner's own lines
# ----------------------------------------------------------------------------------------------------------

# g++/clang: "path:12:5: error: msg" (also "fatal error:"); nvcc: "path(12): error: msg".
_GCC_ERROR = re.compile(
    r"^(?P<file>[^\s:][^:\n]*?):(?P<line>\d+):(?:(?P<col>\d+):)? (?:fatal )?error: (?P<msg>.+)$"
)
_NVCC_ERROR = re.compile(r"^(?P<file>[^\s(][^(\n]*)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<msg>.+)$")
_INCLUDED_FROM = re.compile(r"(?:In file included|from) (?:from )?(?P<file>[^\s:]+):(?P<line>\d+)")
#: The files load_inline writes the learner's strings to.
USER_FILES = ("main.cpp", "cuda.cu")
_LINK_ERROR = re.compile(r"(undefined reference to .+|ld returned \d+ exit status|cannot find -l\S+)")


@dataclass(frozen=True)
class CompilerMessage:
    file: str
    line: int | None
    column: int | None
    message: str


def first_compiler_error(log: str) -> CompilerMessage | None:
    """The first `error:` in a ninja/g++/nvcc log (the one to fix first: later ones often follow from it).

    An error inside a header is reported at the line of the learner's file that included it
    (`In file included from .../main.cpp:12`), with the header's own message.
    """
    included_from: tuple[str, int] | None = None
    for raw in log.splitlines():
        line = raw.strip()
        inc = _INCLUDED_FROM.search(line)
        if inc and Path(inc["file"]).name in USER_FILES:
            included_from = (inc["file"], int(inc["line"]))
        for pattern in (_GCC_ERROR, _NVCC_ERROR):
            m = pattern.match(line)
            if m:
                col = m.groupdict().get("col")
                message = m["msg"].strip()
                if Path(m["file"]).name not in USER_FILES and included_from is not None:
                    header = m["file"]
                    return CompilerMessage(
                        included_from[0], included_from[1], None, f"{message} (in {header})"
                    )
                return CompilerMessage(m["file"], int(m["line"]), int(col) if col else None, message)
    m = _LINK_ERROR.search(log)
    if m:
        return CompilerMessage("<linker>", None, None, m.group(1))
    return None


class CompileError(RuntimeError):
    """A learner's source did not compile. `str(err)` is the first error only; `.log` has everything."""

    def __init__(
        self, name: str, message: CompilerMessage | None, source: str | None, log: str, line_offset: int = 0
    ):
        if message is not None and message.line is not None and line_offset:
            message = CompilerMessage(
                message.file, message.line - line_offset, message.column, message.message
            )
        self.name = name
        self.first = message
        self.log = log
        super().__init__(_format_compile_error(name, message, source, log))


def _format_compile_error(name: str, msg: CompilerMessage | None, source: str | None, log: str) -> str:
    if msg is None:
        tail = "\n".join(log.strip().splitlines()[-5:])
        return f"extension {name!r} failed to build (no compiler error found; last lines of the log):\n{tail}"
    if msg.file == "<linker>":
        return f"extension {name!r} failed to link: {msg.message}"
    user_file = Path(msg.file).name in USER_FILES
    where = f"line {msg.line}" if user_file else f"{msg.file}:{msg.line}"
    lines = source.splitlines() if source is not None else []
    if user_file and msg.line is not None and lines and msg.line > len(lines):
        where = (
            "after the end of your source, in the lines added for `functions` (is every function named there "
            "defined? is a { or ( left open?)"
        )
    out = [f"extension {name!r} failed to compile: {where}: error: {msg.message}"]
    if user_file and msg.line is not None:
        if 1 <= msg.line <= len(lines):
            text = lines[msg.line - 1]
            out.append(f"    {msg.line} | {text}")
            if msg.column:
                out.append("    " + " " * len(str(msg.line)) + " | " + " " * (msg.column - 1) + "^")
    out.append("(first compiler error only; the full log is in the exception's .log attribute)")
    return "\n".join(out)


#: Appended after a learner's source when `functions` asks for pybind bindings: what load_inline's generated
#: `PYBIND11_MODULE` needs (pybind11, the Tensor type caster, torch::wrap_pybind_function), and no more.
BINDING_INCLUDES = "#include <torch/csrc/Exceptions.h>"


def supports_no_implicit_headers() -> bool:
    from torch.utils.cpp_extension import load_inline

    return "no_implicit_headers" in inspect.signature(load_inline).parameters


def inline_name(prefix: str, *parts: object) -> str:
    """`prefix_<hash>`: a name unique to the content, so two sources never share (and lock) one build
    directory, and building the same source twice reuses the first build."""
    digest = hashlib.sha256(repr(parts).encode()).hexdigest()[:12]
    return f"{prefix}_{digest}"


def build_inline(
    name: str,
    cpp_source: str,
    *,
    functions: list[str] | None = None,
    cuda_source: str | None = None,
    extra_cflags: list[str] | None = None,
    extra_ldflags: list[str] | None = None,
    build_root: str | os.PathLike | None = None,
    unique: bool = True,
    private_libstdcxx: bool = True,
    verbose: bool = False,
):
    """Build a learner's `load_inline` source and load it; raise `CompileError` with the first error.

    The source must include the headers it uses (`<ATen/ATen.h>`, `<ATen/Dispatch.h>`, `<torch/library.h>`):
    torch's `load_inline` would prepend `<torch/extension.h>`, which doubles the build time, so we ask it
    not to. With `functions`, the pybind11 module torch generates for them is added after the source (so line
    numbers in errors are the learner's own). Without `functions` the library is loaded with
    `torch.ops.load_library` (for sources that register ops with `TORCH_LIBRARY`) and its path is returned.

    `unique=True` appends a hash of the source and flags to `name`. `private_libstdcxx=True` links libstdc++
    into the library privately, as the course extension does (`build.private_libstdcxx_flags`: on the H200
    image, without it a TORCH_CHECK message that streamed a number crashed the process).
    """
    from torch.utils.cpp_extension import load_inline

    from labkernels.ch01_jit.build import (
        ensure_ninja_on_path,
        extensions_root,
        openmp_flags,
        private_libstdcxx_flags,
    )

    ensure_ninja_on_path()
    flags = ["-O2", *openmp_flags(), *(extra_cflags or [])]
    private = private_libstdcxx_flags() if private_libstdcxx else ()
    ldflags = [*openmp_flags(), *private, *(extra_ldflags or [])]
    if unique:
        name = inline_name(name, cpp_source, cuda_source, functions, flags, ldflags)
    root = Path(build_root) if build_root is not None else extensions_root() / "inline"
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    check_lock(directory)
    cpp_sources = [cpp_source]
    kwargs = {}
    line_offset = 1  # the `#include <torch/extension.h>` line torch prepends by default
    if supports_no_implicit_headers():
        line_offset = 0
        kwargs["no_implicit_headers"] = True
        if functions:
            cpp_sources.append(BINDING_INCLUDES)
    try:
        return load_inline(
            name=name,
            cpp_sources=cpp_sources,
            cuda_sources=[cuda_source] if cuda_source else None,
            functions=functions,
            extra_cflags=flags,
            extra_cuda_cflags=["-O2"],
            extra_ldflags=ldflags,
            build_directory=str(directory),
            is_python_module=bool(functions),
            verbose=verbose,
            **kwargs,
        )
    except RuntimeError as err:
        text = str(err)
        if not text.startswith("Error building extension"):
            raise
        message = first_compiler_error(text)
        in_cuda = message is not None and message.file.endswith("cuda.cu")
        source = cuda_source if in_cuda else cpp_source
        offset = 0 if in_cuda or "no_implicit_headers" in kwargs else line_offset
        raise CompileError(name, message, source, text, offset) from None
