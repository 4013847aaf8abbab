"""Why a compiled pointwise chain costs more host time per call as the chain grows (chapter 05, 2^20 elements).

Inductor fuses the whole chain into one kernel at every length, and that kernel's GPU time stays flat; the
time per call still grows with the number of ops. This script finds where: for each chain length and for
`dynamic` False / True it records the host time per call (`timing.host_us`), the GPU kernels per call and
their time (torch.profiler), the Python calls per call and the functions that own the time (cProfile), and
the graphs compiled (Dynamo's counters: a recompile would show here).

    python experiments/compile_host.py --out DIR   # DIR/ch05_compile_host.csv, the profiles on stdout
    python experiments/compile_host.py --smoke     # CPU lane: the same records at 4096 elements
"""

from __future__ import annotations  # noqa: I001

import argparse
import cProfile
import os
import pstats
import sys

import labkernels  # noqa: F401
import torch

from labkernels import timing
from labkernels.ch05_fusion import pointwise
from labkernels.lane import on_gpu
from labkernels.results import record


def kernel_stats(fn, calls: int = 50) -> tuple[float, float]:
    """(GPU kernels per call, their microseconds per call) from torch.profiler."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if on_gpu():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, acc_events=True) as prof:
        for _ in range(calls):
            fn()
        if on_gpu():
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels) / calls, sum(e.device_time for e in kernels) / calls


def python_profile(fn, calls: int = 500) -> tuple[float, list[tuple[str, float, float]]]:
    """(Python calls per call, [(function, calls per call, own microseconds per call)] largest first)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = [(f"{os.path.basename(f)}:{name}", v[1] / calls, 1e6 * v[2] / calls)
            for (f, _, name), v in stats.stats.items()]  # fmt: skip
    return stats.total_calls / calls, sorted(rows, key=lambda r: -r[2])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    device = "cuda" if on_gpu() and not args.smoke else "cpu"
    n = (1 << 20) if device == "cuda" else 4096
    x, y = torch.randn(n, device=device), torch.randn(n, device=device)
    rows, profiles = [], {}
    for rnd, dynamic, n_ops in [(r, d, k) for r in (1, 2) for d in (False, True) for k in (2, 4, 8, 15)]:
        if True:
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            compiled = torch.compile(pointwise.reference_chain, dynamic=dynamic)
            fn = lambda c=compiled, k=n_ops: c(x, y, k)  # noqa: E731
            for _ in range(3):
                fn()
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            kernels, gpu_us = kernel_stats(fn)
            py_calls, funcs = python_profile(fn)
            host = timing.host_us(fn, calls=1000 if device == "cuda" else 200)
            profiles[(dynamic, n_ops)] = {f: (c, us) for f, c, us in funcs}
            rows.append(dict(round=rnd, dynamic=dynamic, n_ops=n_ops, n=n, host_us=round(host, 2), kernels=kernels,
                             gpu_us=round(gpu_us, 2), py_calls=round(py_calls, 1), graphs=graphs))  # fmt: skip
            print(rows[-1], flush=True)
            print("   top own time:", [(f, round(c, 1), round(us, 2)) for f, c, us in funcs[:8]], flush=True)
    for dynamic in (False, True):
        short, long_ = profiles[(dynamic, 2)], profiles[(dynamic, 15)]
        grew = sorted(((f, long_[f][1] - short.get(f, (0, 0))[1], long_[f][0] - short.get(f, (0, 0))[0])
                       for f in long_), key=lambda r: -r[1])  # fmt: skip
        print(f"dynamic={dynamic}: own time grown from 2 to 15 ops:",
              [(f, round(us, 2), round(c, 1)) for f, us, c in grew[:8]], flush=True)  # fmt: skip
    if args.out:  # with its types sidecar: `dynamic` reads back as a bool
        print(record("ch05_compile_host", rows, args.out, replace=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
