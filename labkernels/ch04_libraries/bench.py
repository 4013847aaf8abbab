"""Chapter 04 benchmarks: `labkernels.bench` imports this module; it registers both halves of the chapter."""

import importlib

from labkernels.ch04_libraries import (
    bench_libraries,  # noqa: F401  (registers ch04_gemm_sweep, ...)
    profiles,  # noqa: F401  (registers ch04_profile)
)

try:  # the chapter's own kernels register ch04_matmul and ch04_conv
    importlib.import_module("labkernels.ch04_libraries.bench_kernels")
except ModuleNotFoundError as e:
    if e.name != "labkernels.ch04_libraries.bench_kernels":
        raise
