"""Where a small warp-specialized GEMM's time goes on the H200: the host's cost per call, the kernel's own
time (CUDA-graph replays and the profiler's kernel duration), and a Python profile of the call.

The shipped bench times plain calls with L2 cleared before each (`timing.time_ms`); at 1024^3 it measured
0.13-0.25 ms against cuBLAS's 0.01 ms, far more than one tile per SM should take. This separates the host
from the kernel. Prints only; run on a Hopper GPU: `python experiments/ch08_gemm_small.py`.
"""

from __future__ import annotations

import cProfile
import pstats

import torch

from labkernels import timing
from labkernels.ch08_hopper import gemm as ch08_gemm

SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (16, 4096, 4096), (4096, 4096, 4096))


def kernel_us(fn, calls: int = 20) -> dict[str, float]:
    """name -> mean device time per call of each CUDA kernel `fn` launches, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key[:40]: e.device_time_total / calls for e in prof.key_averages() if e.device_time_total > 0}


def main() -> None:
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        calls = {"cublas": lambda a=a, b=b: a @ b, "ours": lambda a=a, b=b: ch08_gemm.gemm(a, b)}
        for name, fn in calls.items():
            fn()
            plain, graph = timing.time_ms(fn, warmup=10, rep=40), timing.graph_ms(fn, rep=40)
            host = timing.host_us(fn, calls=300)
            print(f"{m}x{n}x{k} {name}: time_ms {plain * 1e3:.1f} us, graph {graph * 1e3:.1f} us, "
                  f"host {host:.1f} us, kernels {kernel_us(fn)}", flush=True)  # fmt: skip
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    ch08_gemm.gemm(a, b)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(300):
        ch08_gemm.gemm(a, b)
    torch.cuda.synchronize()
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
