"""Ahead-of-time (AOT) build of the course extension: the same sources `labkernels.ch01_jit.build` compiles
just in time, compiled once by setuptools into `labkernels/_C*.so`.

    LABKERNELS_BUILD_EXTENSION=1 pip install --no-build-isolation -e .     # install, building the extension
    LABKERNELS_BUILD_EXTENSION=1 python setup.py build_ext --inplace        # only the extension, in place
    LABKERNELS_BUILD_EXTENSION=1 TORCH_CUDA_ARCH_LIST="9.0" python setup.py build_ext --inplace   # CUDA arch

The build is opt-in (LABKERNELS_BUILD_EXTENSION=1): a plain `pip install -e .` installs the package without
it, and the course builds the extension just in time instead. `--no-build-isolation` matters: the build must
see the torch you will run with (the extension is compiled against its headers and ABI).

Load the AOT library with `torch.ops.load_library(<path of labkernels/_C*.so>)`; its ops are the same
`torch.ops.labkernels.*`. (JIT vs AOT: JIT builds on the learner's machine at first use and rebuilds when a
source changes, which suits a course; AOT builds once when the package is built, so users need no compiler,
which suits a library you distribute as wheels.)

`sources()` lists what is compiled: every `labkernels/csrc/*.cpp`, plus every `labkernels/csrc/cuda/*.cpp`
(the torch side of the CUDA ops) and `*.cu` (the kernels) where torch has CUDA. Here each file is its own
translation unit (setuptools compiles them in parallel); the JIT build instead concatenates them into one per
device, which is faster on two cores.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "labkernels" / "csrc"


def sources(with_cuda: bool) -> list[str]:
    """The extension's source files, relative to the repository root (what setuptools wants)."""
    files = sorted(CSRC.glob("*.cpp"))
    if with_cuda:
        files += sorted((CSRC / "cuda").glob("*.cpp")) + sorted((CSRC / "cuda").glob("*.cu"))
    return [str(p.relative_to(ROOT)) for p in files]


LINUX = sys.platform.startswith("linux")
PRIVATE_LIBSTDCXX = ["-static-libstdc++", "-Wl,--exclude-libs,ALL"] if LINUX else []


def ext_modules() -> list:
    if os.environ.get("LABKERNELS_BUILD_EXTENSION") != "1":
        return []
    try:
        import torch
        from torch.utils.cpp_extension import CppExtension, CUDAExtension
    except ImportError:
        return []
    with_cuda = torch.version.cuda is not None
    openmp = ["-fopenmp"] if sys.platform.startswith("linux") else []
    kwargs = dict(
        name="labkernels._C",
        sources=sources(with_cuda),
        include_dirs=[str(CSRC)],
        extra_compile_args={"cxx": ["-O2", *openmp], "nvcc": ["-O2"]},
        # libstdc++ linked privately, as the JIT build does (labkernels.ch01_jit.build): a second copy of its
        # stream code in the process crashes TORCH_CHECK messages that stream numbers.
        extra_link_args=openmp + PRIVATE_LIBSTDCXX,
    )
    return [CUDAExtension(**kwargs) if with_cuda else CppExtension(**kwargs)]


def cmdclass() -> dict:
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError:
        return {}
    # No Python module inside: the library registers torch ops, so build a plain shared object.
    return {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}


if __name__ == "__main__":
    setup(ext_modules=ext_modules(), cmdclass=cmdclass())
