"""What tuning a matmul costs, per way of timing its configs (an experiment; GPU, with a CPU smoke mode).

The matmul autotuners time each config in CUDA-graph replays (`timing.graph_autotune_bench`: Triton's
`do_bench_cudagraph`), because timed with L2 cleared before each run (`do_bench`) their picks moved between
processes. `torch.cuda.graph`, which `do_bench_cudagraph` captures with, synchronizes the device and
releases torch's cached GPU memory (`empty_cache()`) on every capture, once per config (and runs
`gc.collect()` where torch's `force_cudagraph_gc` is set), and after that change the GPU unit-test run
outlasted its time limit. This times, in one process, the first (tuning) call of chapter 03's tiled matmul
for a few shapes with three benchers, the autotuner's cache cleared before each:
- "do_bench": Triton's default, L2 cleared per run;
- "graph": `graph_autotune_bench`, as shipped;
- "graph, lean": the same replays, captured with `CUDAGraph.capture_begin/capture_end` (no cache release,
  no gc);
and prints each one's tuning wall time, its pick, and the pick's time in graph replays (against cuBLAS); then
the cost of one `gc.collect()` in this process.

    PYTHONPATH=$PWD python gpu_jobs/tuning_cost.py          # GPU
    PYTHONPATH=$PWD python gpu_jobs/tuning_cost.py --smoke  # CPU lane: the host bencher, one tiny shape
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import gc
import statistics
import sys
import time

import torch

import labkernels
from labkernels import timing
from labkernels.ch03_triton import matmul as ch03


def lean_graph_bench(kernel_call, quantiles=(0.5, 0.2, 0.8), rep_ms: float = 10.0):
    """`do_bench_cudagraph`'s measurement without `torch.cuda.graph`'s gc.collect() and empty_cache(): warm
    up, estimate one call, capture enough calls for `rep_ms`, replay ten times on a side stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        kernel_call()  # compiles this config, the first time
        start.record()
        for _ in range(5):
            kernel_call()
        end.record()
        end.synchronize()
        calls = max(1, int(rep_ms / max(start.elapsed_time(end) / 5, 1e-3)))
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        for _ in range(calls):
            kernel_call()
        graph.capture_end()
        per_call = []
        for _ in range(10):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / calls)
    torch.cuda.current_stream().wait_stream(stream)
    ranked = sorted(per_call)
    return [ranked[min(len(ranked) - 1, int(q * len(ranked)))] for q in quantiles]


def benchers() -> dict:
    if not labkernels.on_gpu():
        return {"host": timing.autotune_bench}
    import triton.testing

    return {
        "do_bench": lambda call, quantiles: triton.testing.do_bench(call, quantiles=list(quantiles)),
        "graph": timing.graph_autotune_bench,
        "graph, lean": lean_graph_bench,
    }


def tune_once(shape, bencher) -> tuple[float, str, float]:
    """(tuning wall seconds, the picked config, its time in ms in graph replays) for a fresh tuning."""
    m, n, k = shape
    dtype = torch.bfloat16 if labkernels.on_gpu() else torch.float32
    a = torch.randn(m, k, device=labkernels.DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=labkernels.DEVICE, dtype=dtype)
    ch03._matmul_kernel.cache.clear()
    ch03._matmul_kernel._do_bench = bencher
    ch03._tuned_launches.clear()
    if labkernels.on_gpu():
        torch.cuda.synchronize()
    started = time.perf_counter()
    ch03.matmul(a, b, kernel="tiled")
    if labkernels.on_gpu():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    config = ch03.tuned_config(a, b, kernel="tiled")[1]
    ms = timing.graph_ms(lambda: ch03.matmul(a, b, kernel="tiled"), rep=50)
    return seconds, str(config), ms


def gc_ms(times: int = 5) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        gc.collect()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def main(shapes) -> None:
    for shape in shapes:
        library = None
        if labkernels.on_gpu():
            a = torch.randn(shape[0], shape[2], device="cuda", dtype=torch.bfloat16)
            b = torch.randn(shape[2], shape[1], device="cuda", dtype=torch.bfloat16)
            library = timing.graph_ms(lambda a=a, b=b: a @ b, rep=50)
        for name, bencher in benchers().items():
            seconds, config, ms = tune_once(shape, bencher)
            vs = f", {library / ms:.3f} of cuBLAS" if library else ""
            print(f"{shape} {name:12}: tuning {seconds:6.2f} s; pick {config}; {ms * 1e3:.1f} us{vs}",
                  flush=True)  # fmt: skip
    print(f"gc.collect() in this process: {gc_ms():.1f} ms ({len(gc.get_objects())} objects)", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    if "--smoke" in sys.argv:
        main([(40, 48, 64)])
    else:
        main([(1024, 1024, 1024), (1536, 1536, 1536), (4096, 4096, 4096)])
