"""What tuning a matmul costs, per way of timing its configs (an experiment; GPU, with a CPU smoke mode).

The matmul autotuners time each config in CUDA-graph replays (`timing.graph_autotune_bench`), because timed
with L2 cleared before each run (`do_bench`) their picks moved between processes. `torch.cuda.graph`, which
Triton's `do_bench_cudagraph` captures with, synchronizes the device and releases torch's cached GPU memory
(`empty_cache()`) on every capture, once per config (and runs `gc.collect()` where torch's
`force_cudagraph_gc` is set). Was that why the GPU unit-test run outlasted its limit? On the H200, no: all
three took 1.1-1.2 s a shape once compiled; compiling the configs of each new shape (1-7 s a config) was
the time, one test file on one worker. This times, in one process, the first (tuning) call of chapter 03's
tiled matmul for a few shapes with three benchers, the autotuner's cache cleared before each:
- "do_bench": Triton's default, L2 cleared per run;
- "graph, triton": Triton's `do_bench_cudagraph` (rep=10 ms), which captures through `torch.cuda.graph`;
- "graph, shipped": `graph_autotune_bench`: the same replays, captured with `CUDAGraph.capture_begin/
  capture_end` (no cache release, no gc), at most `GRAPH_TUNE_MAX_CALLS` launches per capture;
and prints each one's tuning wall time, its pick, and the pick's time in graph replays (against cuBLAS); then
the cost of one `gc.collect()` in this process.

Then the ranks: each config the pruning keeps, launched alone, timed in ROUNDS alternating rounds (config 1,
2, ..., 1, 2, ...) by `graph_ms` and by the shipped bencher. If a config's times hold from round to round
while the tuned pick moves between processes (gpu_jobs/matmul_picks.sh), the tuning's single timing is the
noise; if the rounds themselves reorder the configs, the GPU's state drifts within a tuning.

    PYTHONPATH=$PWD python experiments/tuning_cost.py          # GPU
    PYTHONPATH=$PWD python experiments/tuning_cost.py --smoke  # CPU lane: the host bencher twice, tiny
    PYTHONPATH=$PWD python experiments/tuning_cost.py --ranks [--smoke]  # the ranks alone (GPU; CPU lane)
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


def benchers() -> dict:
    if not labkernels.on_gpu():  # twice: the second tuning must start from nothing, like the first
        return {"host": timing.autotune_bench, "host, again": timing.graph_autotune_bench}
    import triton.testing

    return {
        "do_bench": lambda call, quantiles: triton.testing.do_bench(call, quantiles=list(quantiles)),
        "graph, triton": lambda call, quantiles: triton.testing.do_bench_cudagraph(
            call, rep=10, quantiles=list(quantiles)
        ),
        "graph, shipped": timing.graph_autotune_bench,
    }


def tune_once(shape, bencher) -> tuple[float, str, float]:
    """(tuning wall seconds, the picked config, its time in ms in graph replays) for a fresh tuning."""
    m, n, k = shape
    dtype = torch.bfloat16 if labkernels.on_gpu() else torch.float32
    a = torch.randn(m, k, device=labkernels.DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=labkernels.DEVICE, dtype=dtype)
    ch03._matmul_kernel.cache.clear()
    ch03._matmul_kernel._do_bench = bencher
    for cache in (ch03._tuned_launches, ch03._launches, ch03._auto_choices):  # every cache of the key
        cache.clear()
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


ROUNDS = 3


def _launch_alone(config, a, b) -> None:
    """Chapter 03's tiled matmul with one config: the autotuner has nothing to time and launches it."""
    ch03._matmul_kernel.configs = [config]
    ch03._matmul_kernel.cache.clear()
    for cache in (ch03._tuned_launches, ch03._launches, ch03._auto_choices):
        cache.clear()
    ch03.matmul(a, b, kernel="tiled")


# Beside the list, at 1536^3: configs near the one picked there (64 x 128 x 64, 3 stages, 4 warps), for a tile
# that beats it. 64 x 128 and 128 x 64 make 288 tiles, 64 x 64 576, 64 x 256 144.
EXTRA_1536 = [
    ch03._config(64, 128, 64, stages=s, warps=w, group=g)
    for s, w, g in ((2, 4, 8), (5, 4, 8), (3, 8, 8), (4, 8, 8), (3, 4, 4), (3, 4, 16))
] + [
    ch03._config(64, 128, 128, stages=2, warps=4),
    ch03._config(64, 128, 128, stages=3, warps=4),
    ch03._config(128, 64, 128, stages=3, warps=4),
    ch03._config(64, 64, 64, stages=4, warps=4),
    ch03._config(64, 64, 128, stages=3, warps=4),
    ch03._config(64, 256, 64, stages=3, warps=8),
]


def _name(config) -> str:
    kw = config.kwargs
    tile = f"{kw['BLOCK_SIZE_M']}x{kw['BLOCK_SIZE_N']}x{kw['BLOCK_SIZE_K']}"
    return f"{tile} g{kw['GROUP_SIZE_M']} s{config.num_stages} w{config.num_warps}"


def ranks(shape, rounds: int = ROUNDS, extra=()) -> None:
    """Per kept config (and each of `extra`), its time in each round by both timers (us), the configs
    alternating, and cuBLAS's in graph replays once per round."""
    m, n, k = shape
    dtype = torch.bfloat16 if labkernels.on_gpu() else torch.float32
    a = torch.randn(m, k, device=labkernels.DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=labkernels.DEVICE, dtype=dtype)
    every = list(ch03._matmul_kernel.configs)
    kept = ch03._prune(every, {"a_ptr": a, "M": m, "N": n}) + list(extra)
    times = {_name(c): {"graph_ms": [], "shipped": []} for c in kept}
    call = lambda: ch03.matmul(a, b, kernel="tiled")  # noqa: E731
    library = []
    try:
        for _ in range(rounds):
            if labkernels.on_gpu():
                library.append(timing.graph_ms(lambda: a @ b, rep=20) * 1e3)
            for config in kept:
                _launch_alone(config, a, b)
                times[_name(config)]["graph_ms"].append(timing.graph_ms(call, rep=20) * 1e3)
                times[_name(config)]["shipped"].append(timing.graph_autotune_bench(call)[0] * 1e3)
    finally:
        ch03._matmul_kernel.configs = every
    print(f"{shape} cuBLAS, graph_ms per round: " + " ".join(f"{t:7.2f}" for t in library), "us", flush=True)
    for config, by in times.items():
        cells = "  ".join(f"{name} " + " ".join(f"{t:7.2f}" for t in ts) for name, ts in by.items())
        print(f"{shape} ranks: {config}: {cells} us", flush=True)


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


def main_ranks(shapes) -> None:
    for shape in shapes:
        ranks(shape, extra=EXTRA_1536 if shape == (1536, 1536, 1536) else ())


if __name__ == "__main__":
    torch.manual_seed(0)
    if "--ranks" in sys.argv:  # the ranks alone
        main_ranks([(40, 48, 64)] if "--smoke" in sys.argv else [(1536, 1536, 1536), (4096, 512, 4096)])
    elif "--smoke" in sys.argv:
        main([(40, 48, 64)])
    else:
        main([(1024, 1024, 1024), (1536, 1536, 1536), (4096, 4096, 4096)])
