"""Chapter 01 measurements: the extension's add_relu against torch eager (and Triton on the GPU) in GB/s, and
how long the extension takes to build.

The measuring functions are plain (they return rows or a `Table`), so the notebook's sweep and widget call
them too; the `@benchmark` functions fix what `make bench` records in `labkernels/reference/`.

Every GB/s figure counts the bytes the implementation itself must move (`labkernels.traffic.add_relu`):
3n elements for a fused kernel, 5n for torch eager's two kernels (`fused=False`). `fraction_of_copy` divides
by the measured copy bandwidth, the ceiling a memory-bound op can reach.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import torch

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch01_jit import ops
from labkernels.lane import DEVICE, LANE
from labkernels.results import Table
from labkernels.roofline import measure_copy_bandwidth
from labkernels.sweep import sweep

GPU_SIZES = [1 << p for p in range(16, 29, 2)]  # 64 Ki .. 256 Mi elements (1 GiB per fp32 tensor)
CPU_SIZES = [1 << p for p in range(12, 25, 2)]  # 4 Ki .. 16 Mi elements


def triton_add_relu():
    """Chapter 03's Triton add_relu (`add_relu(x, y, out=None)`), or None where it is not available."""
    try:
        from labkernels.ch03_triton.add_relu import add_relu
    except ImportError:
        return None
    return add_relu


def impls(x: torch.Tensor, y: torch.Tensor) -> dict[str, tuple]:
    """name -> (callable, traffic) for every add_relu worth timing on this lane. The Triton kernel is timed
    on the GPU only: under the CPU lane's interpreter its time measures Python, not a kernel."""
    n, dtype = x.numel(), x.dtype
    fused, unfused = traffic.add_relu(n, dtype), traffic.add_relu(n, dtype, fused=False)
    out = torch.empty_like(x)
    if LANE == "gpu":
        found = {
            "cuda_naive": (lambda: ops.add_relu_naive(x, y), fused),
            "cuda_vectorized": (lambda: ops.add_relu_out(x, y, out), fused),
            "torch": (lambda: torch.relu(x + y), unfused),
        }
        triton_fn = triton_add_relu()
        if triton_fn is not None:
            found["triton"] = (lambda: triton_fn(x, y, out), fused)
        return found
    return {
        "cpp_serial": (lambda: ops.add_relu_naive(x, y), fused),
        "cpp_parallel": (lambda: ops.add_relu_out(x, y, out), fused),
        "torch": (lambda: torch.relu(x + y), unfused),
    }


def add_relu_rows(n: int, copy_gbps: float, dtype: torch.dtype = torch.float32) -> list[dict]:
    """One row per implementation at size n: ms, GB/s, fraction of copy, and speed-up over torch eager."""
    ops.load()
    x = torch.randn(n, device=DEVICE).to(dtype)
    y = torch.randn(n, device=DEVICE).to(dtype)
    rows = []
    for impl, (fn, t) in impls(x, y).items():
        fn()  # warm up (and autotune Triton) before timing
        ms = timing.time_ms(fn)
        gbps = timing.gbps(t.bytes, ms)
        rows.append(
            {
                "impl": impl,
                "n": n,
                "dtype": str(dtype).removeprefix("torch."),
                "ms": ms,
                "gbps": gbps,
                "fraction_of_copy": gbps / copy_gbps,
            }
        )
    torch_ms = next(r["ms"] for r in rows if r["impl"] == "torch")
    for r in rows:
        r["speedup_vs_torch"] = torch_ms / r["ms"]
    return rows


def add_relu_sweep(
    sizes: list[int], dtype: torch.dtype = torch.float32, copy_gbps: float | None = None
) -> Table:
    """add_relu_rows for every size, as one Table (what the notebook plots)."""
    copy_gbps = copy_gbps or measure_copy_bandwidth()
    rows = []
    for r in sweep(lambda n: {"rows": add_relu_rows(n, copy_gbps, dtype)}, {"n": sizes}, desc="add_relu"):
        rows += r["rows"]
    return Table(rows)


@benchmark("ch01_add_relu")
def bench_add_relu() -> list[dict]:
    return add_relu_sweep(GPU_SIZES, torch.float32).rows


_TIME_LOAD = """
import time
from labkernels.ch01_jit import build
start = time.perf_counter()
build.load()
print(time.perf_counter() - start)
"""


def _timed_load_in_new_process(extensions_dir: str) -> float:
    """Seconds for `build.load()` in a fresh Python process (a second load of a library whose ops are
    already registered in this process would fail, so the build is timed elsewhere)."""
    from labkernels.ch01_jit.build import child_env

    env = {**child_env(), "TORCH_EXTENSIONS_DIR": extensions_dir}
    done = subprocess.run(
        [sys.executable, "-c", _TIME_LOAD], capture_output=True, text=True, env=env, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the extension failed: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def measure_build(root: str | os.PathLike | None = None) -> list[dict]:
    """Cold build, then cached load (in a new process: ninja runs and finds nothing to do), of the course
    extension in a fresh extensions directory."""
    from labkernels.ch01_jit import build

    tmp = tempfile.mkdtemp(prefix="labkernels-build-") if root is None else str(root)
    try:
        cold = _timed_load_in_new_process(tmp)
        cached = _timed_load_in_new_process(tmp)
    finally:
        if root is None:
            shutil.rmtree(tmp, ignore_errors=True)
    flavour = "cpu+cuda" if build.with_cuda() else "cpu"
    cuda = build.cuda_host_sources() + build.cuda_sources() if build.with_cuda() else []
    sources = len(build.cpp_sources()) + len(cuda)
    return [
        {"step": "cold build", "flavour": flavour, "source_files": sources, "seconds": cold},
        {"step": "cached load", "flavour": flavour, "source_files": sources, "seconds": cached},
    ]


@benchmark("ch01_build")
def bench_build() -> list[dict]:
    return measure_build()
