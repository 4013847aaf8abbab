"""Timing that is right for each lane.

GPU lane: `triton.testing.do_bench`, which warms up, clears L2 between runs and times with CUDA events;
we take its median. CPU lane: a wall-clock timer around synchronous calls, also a median. Triton kernels in
the CPU lane run under the interpreter: their timings measure Python, not a GPU, and are never reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

from labkernels.lane import LANE


def cpu_bench(fn: Callable[[], object], warmup: int = 2, rep: int = 10) -> float:
    """Median wall time of `fn()` in milliseconds, measured on the host."""
    if warmup < 0 or rep < 1:
        raise ValueError(f"warmup must be >= 0 and rep >= 1, got warmup={warmup}, rep={rep}")
    for _ in range(warmup):
        fn()
    return statistics.median(_host_ms_each(fn, rep))


def _host_ms_each(fn: Callable[[], object], calls: int, before: Callable[[], object] | None = None) -> list:
    """Wall time of each of `calls` calls of `fn()` in milliseconds; `before()` runs untimed ahead of each."""
    samples = []
    for _ in range(calls):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def autotune_bench(kernel_call: Callable[[], object], quantiles: Sequence[float] = (0.5, 0.2, 0.8)):
    """A benchmarker with the signature `@triton.autotune(do_bench=...)` expects.

    triton's default benchmarker needs a GPU driver ("0 active drivers" under the interpreter). On the GPU
    lane this defers to `do_bench`; on the CPU lane it times on the host, so autotuning *works* there (the
    per-key cache, the first-call cost) even though the winner it picks means nothing about a GPU.
    """
    if LANE == "gpu":
        import triton.testing

        return triton.testing.do_bench(kernel_call, quantiles=list(quantiles))
    samples = sorted(_host_ms_each(kernel_call, 3))
    pick = [samples[min(len(samples) - 1, int(q * len(samples)))] for q in quantiles]
    return pick if len(pick) > 1 else pick[0]


# The most launches one graph-replay timing captures. Capturing costs host time per launch and instantiating
# per node, once per config; a few hundred launches already time a 3-microsecond kernel to a fraction of a
# percent, since a replay's events resolve about half a microsecond.
GRAPH_TUNE_MAX_CALLS = 500


def graph_autotune_bench(kernel_call: Callable[[], object], quantiles: Sequence[float] = (0.5, 0.2, 0.8)):
    """`autotune_bench` for kernels of a few microseconds (the matmuls): on the GPU lane each config is timed
    in CUDA-graph replays of many launches (GPU time only, L2 not cleared), so the autotuner's pick does not
    move with the host or the cleared cache; timed the default way, with L2 cleared before each run, the
    pick for a 1536^3 matmul changed between processes on the H200. On the CPU lane it is `autotune_bench`."""
    if LANE == "gpu":
        return _graph_replay_quantiles(kernel_call, quantiles)
    return autotune_bench(kernel_call, quantiles)


def _graph_replay_quantiles(kernel_call, quantiles, rep_ms: float = 10.0, replays: int = 10) -> list[float]:
    """Quantiles of a call's time in ms over `replays` replays of one captured graph of enough calls to last
    about `rep_ms` (at most GRAPH_TUNE_MAX_CALLS). `triton.testing.do_bench_cudagraph` measures the same, but
    captures through `torch.cuda.graph`, which synchronizes and empties torch's memory cache at every capture
    (and may run gc.collect()): the memory a process had cached was given back once per config. Tuning takes
    as long either way (`experiments/tuning_cost.py`: 1.1-1.2 s a shape on the H200, once compiled)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs were written on the current stream
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        kernel_call()  # compiles the config the first time, outside the capture
        start.record()
        for _ in range(5):
            kernel_call()
        end.record()
        end.synchronize()
        estimate_ms = max(start.elapsed_time(end) / 5, 1e-4)  # launches included: errs towards fewer calls
        calls = max(1, min(GRAPH_TUNE_MAX_CALLS, int(rep_ms / estimate_ms)))
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        try:
            for _ in range(calls):
                kernel_call()
        finally:
            graph.capture_end()
        per_call = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / calls)
    torch.cuda.current_stream().wait_stream(stream)
    return torch.tensor(per_call).quantile(torch.tensor(list(quantiles))).tolist()


def time_ms(fn: Callable[[], object], *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of `fn()` in ms on this lane. On the GPU, `warmup`/`rep` are milliseconds (do_bench's
    convention); on the CPU they are call counts, scaled down because host runs are long."""
    if LANE == "gpu":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    return cpu_bench(fn, warmup=min(warmup, 2), rep=max(3, min(rep, 10)))


def alternating_ms(calls: dict[str, Callable[[], object]], *, rounds: int = 5, **options) -> dict[str, float]:
    """name -> median `time_ms` over `rounds` rounds that each time every call once, in turn: the GPU's clock
    follows its power draw, so a call timed all at once before another would get a different card."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            samples[name].append(time_ms(fn, **options))
    return {name: statistics.median(times) for name, times in samples.items()}


def graph_ms(fn: Callable[[], object], *, rep: int = 100) -> float:
    """Median GPU time of `fn()` in ms with the host taken out: on the GPU lane the calls are captured in a
    CUDA graph and replayed (`do_bench_cudagraph`), so launches cost no Python. L2 is *not* cleared between
    calls: inputs that fit in L2 stay there. Use it to compare kernels whose run time is near the host's cost
    per call; `host_us` measures that cost. On the CPU lane it is `time_ms`."""
    if LANE == "gpu":
        import triton.testing

        return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))
    return time_ms(fn, rep=rep)


def rotating(calls: Sequence[Callable[[], object]]) -> Callable[[], None]:
    """One call that runs the next of `calls` each time, in turn. Under `graph_ms` the graph captures the
    whole cycle: give each call its own copy of the operands, with the copies together larger than L2, and
    every replay reads HBM, as a model's next layer does (one matrix replayed can stay in L2)."""
    if not calls:
        raise ValueError("rotating needs at least one call")
    calls = list(calls)
    state = {"next": 0}

    def call() -> None:
        calls[state["next"] % len(calls)]()
        state["next"] += 1

    return call


def host_us(fn: Callable[[], object], *, calls: int = 2000, warmup: int = 100, blocks: int = 5) -> float:
    """Host time per call of `fn()` in microseconds: `calls` back-to-back calls, with no wait for the GPU in
    between, timed in `blocks` runs of consecutive calls; the median of the runs' per-call times. This is the
    Python and launch cost, as long as each call's GPU work is shorter than it (use small inputs); otherwise
    the launch queue fills up and this times the GPU instead. The median, because one run can catch a pause
    that is not the call's (a garbage collection, another thread's work) and a mean would carry it."""
    if calls < 1 or warmup < 0 or blocks < 1:
        raise ValueError(f"calls and blocks must be >= 1 and warmup >= 0, got {calls}, {blocks}, {warmup}")
    for _ in range(warmup):
        fn()
    _synchronize()
    blocks = min(blocks, calls)
    per_call = []
    for b in range(blocks):
        n = calls // blocks + (b < calls % blocks)
        start = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - start) / n * 1e6)
    _synchronize()
    return statistics.median(per_call)


def host_us_idle(fn: Callable[[], object], *, calls: int = 300, warmup: int = 20) -> float:
    """Host time of one call of `fn()` in microseconds, into an idle GPU queue: before each call the GPU is
    waited for, so the call never waits on a full launch queue, however long its kernels run (where
    `host_us` would time the GPU instead). The median over `calls` calls."""
    if calls < 1 or warmup < 0:
        raise ValueError(f"calls must be >= 1 and warmup >= 0, got {calls}, {warmup}")
    for _ in range(warmup):
        fn()
    per_call_ms = _host_ms_each(fn, calls, before=_synchronize)  # the wait for the GPU is not timed
    _synchronize()
    return statistics.median(per_call_ms) * 1e3


def _synchronize() -> None:
    if LANE == "gpu":
        import torch

        torch.cuda.synchronize()


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second) for `nbytes` moved in `ms` milliseconds."""
    if ms <= 0:
        raise ValueError(f"time must be positive, got {ms} ms")
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    if ms <= 0:
        raise ValueError(f"time must be positive, got {ms} ms")
    return flops / (ms * 1e-3) / 1e12
