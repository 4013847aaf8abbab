"""Build the course's C++/CUDA extension just in time, fast, into a project-local cache.

Every `labkernels/csrc/*.cpp`, `csrc/cuda/*.cpp` and `csrc/cuda/*.cu` belongs to the one extension (a
chapter adds an op by adding a file). What makes the cold build fast on a 2-core laptop:

* **one translation unit per compiler job.** The torch headers cost far more to compile than our kernels, so
  we generate `unity_cpu.cpp` in the build directory, `#include`-ing every `csrc/*.cpp`: the headers are
  parsed once instead of once per file. With CUDA, `unity_cuda_host.cpp` (the `csrc/cuda/*.cpp` glue) and
  `unity_cuda.cu` (the kernels) are two more; ninja runs the three compilers in parallel.
* **lean headers.** Sources include `<ATen/core/Tensor.h>` and the one `<ATen/ops/...>` header per op they
  call, not `<ATen/ATen.h>` (every op's declaration) or `<torch/extension.h>` (which adds pybind11, the
  Python C API and all of libtorch's C++ frontend).
* **no torch header in nvcc.** nvcc parses a file for the host and for the device, so torch's headers cost it
  several times what they cost g++. The `.cu` files take raw pointers and a stream (`csrc/cuda/launch.h`);
  checks, allocation and `TORCH_LIBRARY_IMPL` live in the host-compiled glue.
* **no Python module.** Ops are registered with `TORCH_LIBRARY_FRAGMENT` / `TORCH_LIBRARY_IMPL`, so the .so
  needs no `PYBIND11_MODULE`: we build with `is_python_module=False` and torch loads it with
  `torch.ops.load_library`. The ops appear under `torch.ops.labkernels`.
* **`-O2`**, and on CUDA only the GPU's own architecture (`TORCH_CUDA_ARCH_LIST` from its capability).

`-fopenmp` is not optional: `at::parallel_for` compiles to a serial loop without it.

**libstdc++ linked privately** (Linux): `-static-libstdc++ -Wl,--exclude-libs,ALL` puts the C++ runtime's code
the extension uses inside the .so and hides it. On the H200 image (torch 2.11+cu130) a `TORCH_CHECK` whose
message streamed a number killed the process (SIGSEGV): the default link left the extension exporting its
own copy of libstdc++'s stream and locale code next to the system's libstdc++.so.6, and a number, unlike
text, goes through the locale (`std::num_put`, looked up by facet id), so one stream could end up using
parts of both copies. With the copy private, the extension's streams use only its own copy. Without
`libstdc++.a` (no static runtime installed) the build warns and links the default way. `python -m
labkernels.ch01_jit.abi_probe` shows, on any machine, which loaded files provide those symbols and whether a
check with numbers raises with each link.

Rebuilds: torch's `load()` keeps an in-process hash of the source files' content (a change rebuilds under a
new name, `<name>_v1`), and in a new process it runs ninja, which rebuilds when a file's *mtime* is newer
than its object (ninja follows the `#include`s of the unity files into our sources). Chapter 01 measures it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

NAME = "labkernels_ext"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
CSRC = PACKAGE_DIR / "csrc"
CFLAGS = ["-O2"]
CUDA_CFLAGS = ["-O2"]


@dataclass(frozen=True)
class BuildInfo:
    """What the last `load()` in this process did."""

    path: str  # the shared library torch loaded
    seconds: float  # wall time of the whole load() call
    rebuilt: bool  # True if the library file was (re)written by this call


LAST_BUILD: BuildInfo | None = None


def cpp_sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp"))


def cuda_sources() -> list[Path]:
    """The kernels: compiled by nvcc, with no torch header (see csrc/cuda/launch.h)."""
    return sorted((CSRC / "cuda").glob("*.cu"))


def cuda_host_sources() -> list[Path]:
    """The torch side of the CUDA ops (checks, allocation, stream, registration): host compiler only."""
    return sorted((CSRC / "cuda").glob("*.cpp"))


#: Link flags that give an extension a private copy of libstdc++ (see the module docstring).
PRIVATE_LIBSTDCXX = ("-static-libstdc++", "-Wl,--exclude-libs,ALL")


def static_libstdcxx() -> str | None:
    """The path of the C++ compiler's `libstdc++.a` (torch compiles with `$CXX`, else `c++`), or None."""
    cxx = os.environ.get("CXX", "c++")
    try:
        found = subprocess.run(
            [cxx, "-print-file-name=libstdc++.a"], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # the compiler echoes the bare name when it has no such file
    return found if os.path.isabs(found) and os.path.exists(found) else None


@functools.cache
def private_libstdcxx_flags() -> tuple[str, ...]:
    """`PRIVATE_LIBSTDCXX` on Linux where `libstdc++.a` exists; else () and (on Linux) a warning, once."""
    if not sys.platform.startswith("linux"):
        return ()
    if static_libstdcxx() is None:
        warnings.warn(
            f"{os.environ.get('CXX', 'c++')} has no libstdc++.a (the static C++ runtime), so extensions link "
            "libstdc++ the default way. Where two copies of libstdc++'s stream code end up in one process, a "
            "TORCH_CHECK message that streams a number can then crash instead of raising: run "
            "`python -m labkernels.ch01_jit.abi_probe` to check this machine, or install the static runtime "
            "(Debian/Ubuntu: the libstdc++-<version>-dev package of your g++)",
            stacklevel=2,
        )
        return ()
    return PRIVATE_LIBSTDCXX


def child_env() -> dict[str, str]:
    """The environment for a child Python that imports labkernels: the repository (or site-packages) on
    PYTHONPATH ahead of anything else, and the PATH this process builds with. The child must find the same
    ninja as this process: a different ninja version does not read the other's build log and rebuilds all."""
    ensure_ninja_on_path()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH")) if p)
    return env


def with_cuda() -> bool:
    """CUDA sources compile only where torch was built with CUDA (a CPU wheel has no nvcc flags to give),
    nvcc is found, and there is a GPU to compile for or TORCH_CUDA_ARCH_LIST names one: pip's default torch
    on Linux is the CUDA build, and on a machine without a GPU torch's arch detection finds no device."""
    from torch.utils.cpp_extension import CUDA_HOME

    if torch.version.cuda is None or CUDA_HOME is None:
        return False
    return torch.cuda.is_available() or bool(os.environ.get("TORCH_CUDA_ARCH_LIST"))


def openmp_flags() -> list[str]:
    """`-fopenmp` where torch's parallel backend is OpenMP (Linux wheels); the linker then reuses the
    libgomp.so.1 torch already loaded (same soname), so there is one OpenMP thread pool, not two."""
    if sys.platform.startswith("linux") and "OpenMP" in torch.__config__.parallel_info():
        return ["-fopenmp"]
    return []


def extensions_root() -> Path:
    """`$TORCH_EXTENSIONS_DIR` if set, else `<repo>/.torch_extensions` in a source checkout, else torch's
    default (`~/.cache/torch_extensions`)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return Path(env)
    repo = PACKAGE_DIR.parent
    if (repo / "pyproject.toml").exists():
        return repo / ".torch_extensions"
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory("labkernels", verbose=False)).parent


def build_directory() -> Path:
    """One directory per torch version and build flavour: a library built for one torch never loads in
    another."""
    major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    flavour = f"cu{torch.version.cuda.replace('.', '')}" if with_cuda() else "cpu"
    return extensions_root() / f"{NAME}_torch{major_minor}_{flavour}"


def unity_source(paths: list[Path]) -> str:
    lines = ["// Generated by labkernels.ch01_jit.build: one translation unit for all these sources."]
    lines += [f'#include "{p.as_posix()}"' for p in paths]
    return "\n".join(lines) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write only if the content differs: rewriting would bump the mtime and make ninja rebuild."""
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def unity_files(directory: Path) -> list[Path]:
    """Write (if changed) the per-device unity files into `directory` and return them."""
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    cpp = cpp_sources()
    if not cpp:
        raise FileNotFoundError(f"no C++ sources in {CSRC}")
    unity_cpp = directory / "unity_cpu.cpp"
    write_if_changed(unity_cpp, unity_source(cpp))
    files.append(unity_cpp)
    cu = cuda_sources()
    if with_cuda() and cu:
        for name, paths in (("unity_cuda_host.cpp", cuda_host_sources()), ("unity_cuda.cu", cu)):
            if paths:
                unity = directory / name
                write_if_changed(unity, unity_source(paths))
                files.append(unity)
    return files


def ensure_ninja_on_path() -> None:
    """torch builds with `ninja` found on PATH. A notebook kernel started from a virtual environment that was
    not activated does not have the environment's bin/ (where pip put ninja) on PATH: add it."""
    if shutil.which("ninja"):
        return
    candidates = [os.path.dirname(sys.executable)]
    try:
        import ninja

        candidates.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for directory in candidates:
        if shutil.which("ninja", path=directory):
            os.environ["PATH"] = os.pathsep.join([directory, os.environ.get("PATH", "")])
            return


def cuda_arch() -> str | None:
    """'9.0' on an H200: the capability of the current GPU, so nvcc compiles for it alone."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


@contextlib.contextmanager
def _arch_list(arch: str | None):
    """Set TORCH_CUDA_ARCH_LIST for the build unless the user chose one."""
    if arch is None or "TORCH_CUDA_ARCH_LIST" in os.environ:
        yield
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    try:
        yield
    finally:
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)


def library_path(directory: Path | None = None, name: str = NAME) -> Path:
    from torch.utils.cpp_extension import LIB_EXT

    return (directory or build_directory()) / f"{name}{LIB_EXT}"


def load(verbose: bool = False) -> str:
    """Build (if needed) and load the extension; return the path of the shared library.

    The cache is checked first (`cache.guarded_load`): a damaged library is deleted and linked again, a lock
    left by a dead build is removed, and a live build of the same extension is waited on for a bounded time.
    """
    global LAST_BUILD
    from torch.utils import cpp_extension

    from labkernels.ch01_jit import cache

    ensure_ninja_on_path()
    cpp_extension.verify_ninja_availability()
    directory = build_directory()
    sources = unity_files(directory)
    before = _mtime(library_path(directory))
    start = time.perf_counter()

    def build() -> str:
        return cpp_extension.load(
            name=NAME,
            sources=[str(s) for s in sources],
            extra_cflags=CFLAGS + openmp_flags() + [f"-I{CSRC}"],
            extra_cuda_cflags=CUDA_CFLAGS + [f"-I{CSRC}"],
            extra_ldflags=openmp_flags() + list(private_libstdcxx_flags()),
            build_directory=str(directory),
            with_cuda=any(s.suffix == ".cu" for s in sources),
            is_python_module=False,
            verbose=verbose,
        )

    with _arch_list(cuda_arch() if with_cuda() else None):
        try:
            path = cache.guarded_load(build, library_path(directory))
        except RuntimeError as e:
            if "multiple times" not in str(e):
                raise
            raise RuntimeError(
                "the extension was rebuilt after a source changed, but this process already registered its "
                "ops, and an operator cannot be registered twice: restart the Python process (the kernel) to "
                "load the new build"
            ) from e
    seconds = time.perf_counter() - start
    LAST_BUILD = BuildInfo(str(path), seconds, _mtime(Path(path)) != before)
    return str(path)


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
