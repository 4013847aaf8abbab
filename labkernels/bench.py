"""`make bench`: run every registered benchmark on the GPU and record the reference CSVs the package ships.

A chapter registers its benchmarks in `labkernels/<chapter>/bench.py` with `@benchmark("chNN_name")`; each
returns result rows. The rows are written with the environment columns by `results.record`.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Callable

import labkernels
from labkernels.results import REFERENCE_DIR, record

BENCHMARKS: dict[str, Callable[[], list[dict]]] = {}


def benchmark(name: str):
    def register(fn: Callable[[], list[dict]]):
        if name in BENCHMARKS and BENCHMARKS[name] is not fn:
            raise ValueError(f"benchmark {name!r} registered twice")
        BENCHMARKS[name] = fn
        return fn

    return register


def import_chapter_modules(module: str) -> None:
    """Import `labkernels.<chapter>.<module>` for every chapter package that has one (registration by import:
    `bench` for benchmarks, `profiles` for profiler cases)."""
    for info in pkgutil.iter_modules(labkernels.__path__):
        if info.ispkg:
            try:
                importlib.import_module(f"labkernels.{info.name}.{module}")
            except ModuleNotFoundError as e:
                if e.name != f"labkernels.{info.name}.{module}":
                    raise  # the module exists and one of its own imports failed


def discover() -> dict[str, Callable[[], list[dict]]]:
    """Import every `labkernels.<pkg>.bench` and `.profiles` module so its benchmarks register (a chapter's
    profiler tables are benchmarks too)."""
    import_chapter_modules("bench")
    import_chapter_modules("profiles")
    return BENCHMARKS


def run(names: list[str] | None = None, directory=REFERENCE_DIR) -> list[str]:
    """Run benchmarks (all, or those named) and record each; return the files written."""
    if not labkernels.on_gpu():
        raise RuntimeError("make bench records GPU reference results: it needs a CUDA device")
    found = discover()
    unknown = sorted(set(names or []) - set(found))
    if unknown:
        raise KeyError(f"unknown benchmarks {unknown}; known: {sorted(found)}")
    from labkernels.profile import ProfilerUnavailable

    written = []
    for name in names or sorted(found):
        start = time.perf_counter()
        try:
            rows = found[name]()
        except ProfilerUnavailable as e:  # a GPU without Nsight Compute: keep the shipped counter tables
            print(f"{name}: skipped, {e}", flush=True)
            continue
        path = record(name, rows, directory, replace=True)  # make bench rewrites the references
        print(f"{name}: {len(rows)} rows in {time.perf_counter() - start:.1f} s -> {path}", flush=True)
        written.append(str(path))
    return written
