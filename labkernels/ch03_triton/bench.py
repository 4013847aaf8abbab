"""Chapter 03 benchmarks (`make bench`, GPU lane): the H200 references the notebook shows beside your numbers.

The measuring functions are plain (they return a `Table`), so the notebook's widgets call them too; the
`@benchmark` functions fix the sizes recorded in `labkernels/reference/`.
"""

from __future__ import annotations

import functools
import statistics

import torch
import triton
from triton.runtime.errors import OutOfResources

from labkernels import launch_cache, timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import profiles  # noqa: F401  (registers ch03_profile, ch03_grouping)
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch03_triton.matmul import matmul, tuned_config
from labkernels.ch03_triton.softmax import softmax
from labkernels.lane import DEVICE, on_gpu
from labkernels.results import Table
from labkernels.roofline import measure_copy_bandwidth, tf32_matmuls
from labkernels.sweep import sweep


def _random(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _timed_rows(impls, params: dict, copy_gbps: float) -> list[dict]:
    """One row per (impl, fn, traffic): ms, GB/s from the traffic model, fraction of copy; the first impl's
    speed-up over the second (torch) is added to its row."""
    rows = []
    for impl, fn, t in impls:
        ms = timing.time_ms(fn)
        gbps = timing.gbps(t.bytes, ms)
        rows.append({**params, "impl": impl, "ms": ms, "gbps": gbps, "fraction_of_copy": gbps / copy_gbps})
    rows[0]["speedup_vs_torch"] = rows[1]["ms"] / rows[0]["ms"]
    return rows


# --- add + relu ------------------------------------------------------------------------------------------


def add_relu_rows(n: int, copy_gbps: float, dtype: torch.dtype = torch.float32) -> list[dict]:
    """Triton's fused kernel against torch eager (two kernels) at one size."""
    x, y = _random(n, dtype=dtype), _random(n, dtype=dtype)
    out = torch.empty_like(x)
    impls = [
        ("triton", lambda: add_relu(x, y, out), traffic.add_relu(n, dtype)),
        ("torch", lambda: torch.relu(x + y), traffic.add_relu(n, dtype, fused=False)),
    ]
    return _timed_rows(impls, {"n": n, "dtype": _dtype_name(dtype)}, copy_gbps)


@benchmark("ch03_add_relu")
def bench_add_relu() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    return [row for p in range(16, 29, 2) for row in add_relu_rows(1 << p, copy_gbps)]


def block_sweep(sizes: list[int], block_sizes: list[int], num_warps: list[int], copy_gbps: float) -> Table:
    """add_relu at fixed (BLOCK_SIZE, num_warps): GB/s and the fraction of copy bandwidth it reaches."""
    buffers = {}

    def measure(n, block_size, num_warps):
        if num_warps * 32 > block_size:  # more threads than elements: lanes would sit idle
            return {"ms": float("nan"), "gbps": float("nan"), "fraction_of_copy": float("nan")}
        if n not in buffers:
            buffers.clear()
            buffers[n] = (_random(n), _random(n), torch.empty(n, device=DEVICE))
        x, y, out = buffers[n]
        ms = timing.time_ms(lambda: add_relu(x, y, out, block_size=block_size, num_warps=num_warps))
        gbps = timing.gbps(traffic.add_relu(n).bytes, ms)
        return {"ms": ms, "gbps": gbps, "fraction_of_copy": gbps / copy_gbps}

    grid = {"n": sizes, "block_size": block_sizes, "num_warps": num_warps}
    return Table(r for r in sweep(measure, grid, desc="BLOCK_SIZE x num_warps") if r["ms"] == r["ms"])


@benchmark("ch03_block_sweep")
def bench_block_sweep() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    blocks = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    return block_sweep([1 << 20, 1 << 24, 1 << 28], blocks, [1, 2, 4, 8, 16], copy_gbps).rows


# --- softmax -----------------------------------------------------------------------------------------------


def softmax_rows(
    n_rows: int, n_cols: int, dtype: torch.dtype, copy_gbps: float, naive: bool = True, copy: bool = False
) -> list[dict]:
    """Triton's fused softmax against torch.softmax (also one kernel) and the naive five-kernel reference.

    copy=True adds a copy of the same number of bytes: the ceiling at this size, which for tensors of a
    hundred MB or so sits a few percent below the big-copy bandwidth (copy_gbps) the fractions are of."""
    x = _random(n_rows, n_cols, dtype=dtype)
    fused = traffic.softmax(n_rows, n_cols, dtype)
    impls = [("triton", lambda: softmax(x), fused), ("torch", lambda: torch.softmax(x, dim=1), fused)]
    if naive:
        impls.append(
            ("naive", lambda: softmax_mod.reference(x), traffic.softmax(n_rows, n_cols, dtype, fused=False))
        )
    if copy:
        out = torch.empty_like(x)
        impls.append(("copy", lambda: out.copy_(x), traffic.copy(x.numel(), dtype)))  # read MN, write MN
    params = {"rows": n_rows, "cols": n_cols, "dtype": _dtype_name(dtype)}
    return _timed_rows(impls, params, copy_gbps)


@benchmark("ch03_softmax")
def bench_softmax() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    rows = []
    for shape in [(8192, 8192), (8192, 5000)]:
        for dtype in (torch.float32, torch.bfloat16):
            rows += [{"sweep": "headline", **r} for r in softmax_rows(*shape, dtype, copy_gbps, copy=True)]
    for n_cols in [128, 256, 512, 1000, 1024, 2048, 3000, 4096, 5000, 8192, 12000, 16384, 32768]:
        rows += [{"sweep": "width", **r} for r in softmax_rows(4096, n_cols, torch.float32, copy_gbps)]
    return rows


def softmax_configs(shapes, num_warps: list[int], copy_gbps: float) -> Table:
    """The fused softmax at fixed num_warps, one row block per program vs persistent programs, and (at the
    default warps) without 16-byte vectors: what the default choice (`default` = True) leaves on the table.
    On the GPU each row also has the compiled kernel's registers per thread."""
    rows = []
    for n_rows, n_cols, dtype in shapes:
        x = _random(n_rows, n_cols, dtype=dtype)
        nbytes = traffic.softmax(n_rows, n_cols, dtype).bytes
        auto_warps = softmax_mod._tile(n_rows, n_cols)[2]
        variants = [(w, p, True) for w in num_warps for p in (False, True)] + [(auto_warps, False, False)]
        for warps, persistent, vectorize in variants:
            row = {"rows": n_rows, "cols": n_cols, "dtype": _dtype_name(dtype), "num_warps": warps}
            row |= {"persistent": persistent, "vectorize": vectorize}
            row["default"] = warps == auto_warps and not persistent and vectorize
            try:
                options = {"num_warps": warps, "persistent": persistent, "vectorize": vectorize}
                ms = timing.time_ms(lambda x=x, options=options: softmax(x, **options))
            except OutOfResources as e:  # too many registers or too much shared memory for this config
                rows.append({**row, "ms": float("nan"), "error": str(e)[:80]})
                continue
            gbps = timing.gbps(nbytes, ms)
            row |= {"ms": ms, "gbps": gbps, "fraction_of_copy": gbps / copy_gbps}
            if on_gpu():  # what the compiler chose to hold, per thread (the interpreter compiles nothing)
                row["registers"] = softmax_mod.registers(x, **options)
            rows.append(row)
    return Table(rows)


def summarize_softmax_configs(configs: Table) -> Table:
    """Per shape, from a `softmax_configs` table (or its CSV): the best fraction of copy bandwidth over
    num_warps with one row block per program (and that kernel's registers per thread) and with persistent
    programs, and the fraction without 16-byte accesses."""

    def flag(value) -> bool:  # True/False, or "True"/"False" when read back from a CSV
        return str(value) == "True"

    def best(group: list[dict], persistent: bool, vectorize: bool) -> dict:
        fraction = lambda r: r.get("fraction_of_copy", float("nan"))  # noqa: E731  (NaN: config did not fit)
        wanted = (persistent, vectorize)
        chosen = [r for r in group if (flag(r["persistent"]), flag(r["vectorize"])) == wanted]
        return max((r for r in chosen if fraction(r) == fraction(r)), key=fraction)

    rows = []
    for n_rows, n_cols, dtype in dict.fromkeys((r["rows"], r["cols"], r["dtype"]) for r in configs.rows):
        group = configs.where(rows=n_rows, cols=n_cols, dtype=dtype).rows
        one_block, persistent = best(group, False, True), best(group, True, True)
        rows.append(
            {
                "shape": f"{n_rows}x{n_cols}",
                "dtype": dtype,
                "one_block": round(one_block["fraction_of_copy"], 2),
                "its_warps": one_block["num_warps"],
                "its_registers": one_block.get("registers", ""),  # per thread; absent from CPU-lane tables
                "persistent": round(persistent["fraction_of_copy"], 2),
                "persistent_warps": persistent["num_warps"],
                "no_16_byte_access": round(best(group, False, False)["fraction_of_copy"], 2),
            }
        )
    return Table(rows)


@benchmark("ch03_softmax_configs")
def bench_softmax_configs() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    shapes = [(8192, c, d) for c in (8192, 5000) for d in (torch.float32, torch.bfloat16)]
    shapes += [(4096, c, torch.float32) for c in (1000, 2048, 12000)]
    return softmax_configs(shapes, [4, 8, 16, 32], copy_gbps).rows


# --- matmul ------------------------------------------------------------------------------------------------


MATMUL_ROUNDS = 3


def _config_label(config) -> str:
    tile = " ".join(f"{k.removeprefix('BLOCK_SIZE_')}={v}" for k, v in config.kwargs.items())
    return f"{tile} warps={config.num_warps} stages={config.num_stages}"


def matmul_rows(m: int, n: int, k: int, dtype: torch.dtype, precision: str = "ieee") -> list[dict]:
    """Triton's autotuned matmul against cuBLAS (torch.matmul, with TF32 on or off to match `precision`).
    Row "triton" is what matmul() launches by default (kernel="auto"); where the TMA kernel can run, rows
    "triton_tiled" and "triton_tma_persistent" time each kernel, so the two can be compared.

    Timed from CUDA-graph replays (`timing.graph_ms`): a 1024^3 matmul runs for less time than Python needs
    to launch it, so eager timing would compare the libraries' host costs (`launch_rows` measures those)."""
    a, b = _random(m, k, dtype=dtype), _random(k, n, dtype=dtype)
    t = traffic.matmul(m, n, k, dtype)
    label = precision if dtype == torch.float32 else _dtype_name(dtype)
    kernels = {"triton": "auto", "triton_tiled": "tiled", "triton_tma_persistent": "tma_persistent"}
    chosen = {}  # impl -> (kernel, config), autotuned outside the timed region
    for impl, kernel in kernels.items():
        try:
            chosen[impl] = tuned_config(a, b, input_precision=precision, kernel=kernel)
        except ValueError:  # no TMA here (GPU or operands): "auto" is the tiled kernel, and is timed once
            del chosen["triton_tiled"]
    impls = {
        impl: functools.partial(matmul, a, b, input_precision=precision, kernel=kernels[impl])
        for impl in chosen
    }
    impls["cublas"] = lambda: a @ b
    times = {impl: [] for impl in impls}
    with tf32_matmuls(precision == "tf32"):
        # Alternating rounds, median of each: the card's clock follows its power draw, which a long run of
        # big matmuls raises, so whichever ran first would otherwise get the cooler, faster card.
        for _ in range(MATMUL_ROUNDS):
            for impl, fn in impls.items():
                times[impl].append(timing.graph_ms(fn))
    cublas_ms = statistics.median(times["cublas"])
    rows = []
    for impl, samples in times.items():
        ms = statistics.median(samples)
        row = {
            "m": m,
            "n": n,
            "k": k,
            "dtype": _dtype_name(dtype),
            "precision": label,
            "impl": impl,
            "ms": ms,
        }
        row |= {"tflops": timing.tflops(t.flops, ms), "intensity": t.intensity}
        if impl in chosen:
            kernel, config = chosen[impl]
            row |= {
                "ratio_vs_cublas": cublas_ms / ms,
                "kernel": kernel,
                "config": _config_label(config),
            }
        rows.append(row)
    return rows


MATMUL_SHAPES = [
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (512, 4096, 4096),
    (4096, 4096, 512),
    (4096, 512, 4096),
]


@benchmark("ch03_matmul")
def bench_matmul() -> list[dict]:
    rows = []
    for shape in MATMUL_SHAPES:
        rows += matmul_rows(*shape, torch.bfloat16)
    rows += matmul_rows(4096, 4096, 4096, torch.float16)
    for precision in ("tf32", "ieee"):
        rows += matmul_rows(4096, 4096, 4096, torch.float32, precision)
    return rows


# --- launch cost -------------------------------------------------------------------------------------------


def launch_rows() -> list[dict]:
    """Host time per call (`timing.host_us`) on inputs so small that the GPU is never the slower side: what a
    call costs before any kernel work, ours against torch's."""
    x = _random(64, 256)
    a, b = _random(64, 64, dtype=torch.float16), _random(64, 64, dtype=torch.float16)
    ops = {
        "labkernels softmax": lambda: softmax(x),
        "torch.softmax": lambda: torch.softmax(x, dim=-1),
        "labkernels matmul, tiled": lambda: matmul(a, b, kernel="tiled"),
        "labkernels matmul, tma_persistent": lambda: matmul(a, b, kernel="tma_persistent"),
        "torch.matmul (cuBLAS)": lambda: a @ b,
    }
    if not (on_gpu() and matmul_mod._has_tma()):
        del ops["labkernels matmul, tma_persistent"]
    return [{"section": "headline", "op": op, "host_us": timing.host_us(fn)} for op, fn in ops.items()]


def _steps_rows(op: str, steps: dict) -> list[dict]:
    """One row per step, each timed on its own, back to back (`launch_cache.host_us_per_step`)."""
    times = launch_cache.host_us_per_step(steps)
    return [{"section": "breakdown", "op": f"{op}: {step}", "host_us": us} for step, us in times.items()]


def softmax_breakdown_rows() -> list[dict]:
    """softmax(x) at 64 x 256 taken apart. A known shape costs about the dispatch check, the key lookup, the
    allocation and the cached launcher; the first call of a shape also pays the checks + plan and Triton's
    launch path, which is what every call paid before launches were cached."""
    x = _random(64, 256)
    softmax(x)
    softmax(x)  # the launcher of this key is cached now
    launcher = softmax_mod._launches[softmax_mod._launch_key(x, None, None, False, None, True)]
    out, plan = softmax_mod._prepare(x, None, None, False, None, True)
    args, meta = softmax_mod._launch_arguments(x, out, plan)
    grid = (triton.cdiv(x.shape[0], plan.block_m),)
    contiguous = torch.contiguous_format

    def checks_and_plan():
        softmax_mod._check(x)
        vec = softmax_mod.vector_width(x, out)
        return softmax_mod._plan(*x.shape, vec, None, None, False, None, softmax_mod.needs_int64(x))

    steps = {
        "dispatch check (autograd? compiling?)": lambda: (
            (x.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling()
        ),
        "launch-cache key and lookup": lambda: softmax_mod._launches.get(
            softmax_mod._launch_key(x, None, None, False, None, True)
        ),
        "checks + plan (first call of a shape)": checks_and_plan,
        "allocate the output (torch.empty_like)": lambda: torch.empty_like(x, memory_format=contiguous),
        "allocate the output, torch.empty(shape, device=, dtype=)": lambda: torch.empty(
            x.shape, device=x.device, dtype=x.dtype
        ),
        "Triton's launch (kernel[grid](...))": lambda: softmax_mod._softmax_kernel[grid](*args, **meta),
        f"cached launcher alone ({launcher.kind})": lambda: launcher(out, x),
        "full call": lambda: softmax(x),
        "full call, thin launch through compiled.run": launch_cache.through_run(lambda: softmax(x)),
        "full call, Triton's launch (LABKERNELS_THIN_LAUNCH=0)": launch_cache.thin_off(lambda: softmax(x)),
        "torch.softmax": lambda: torch.softmax(x, dim=-1),
    }
    return _steps_rows("softmax", steps)


def matmul_breakdown_rows(kernel: str = "tiled") -> list[dict]:
    """matmul(a, b, kernel=kernel) at 64^3 fp16 taken apart, as `softmax_breakdown_rows`."""
    a, b = _random(64, 64, dtype=torch.float16), _random(64, 64, dtype=torch.float16)
    matmul(a, b, kernel=kernel)  # tunes
    c, key = matmul_mod._matmul(a, b, None, None, "ieee", kernel)  # the launcher of this key is cached now
    known = matmul_mod._launches[matmul_mod._launch_key(a, b, None, None, "ieee", kernel)]
    tuned = matmul_mod._tuned_launches[key]
    jitted = matmul_mod._matmul_tiles if key[0] == "tiled" else matmul_mod._matmul_tma_persistent
    (M, K), N = a.shape, b.shape[1]
    strides = (*a.stride(), *b.stride(), *c.stride()) if key[0] == "tiled" else (K, N, N)
    args = (a, b, c, c, M, N, K, *strides)

    def call():
        return matmul(a, b, kernel=kernel)

    def checks_and_choice():
        matmul_mod._check(a, b, None, None, "ieee", kernel)
        return matmul_mod._pick_kernel(kernel, a, b), matmul_mod.needs_int64(a, b)

    steps = {
        "dispatch check (autograd? compiling?)": lambda: (
            (a.requires_grad or b.requires_grad) and torch.is_grad_enabled() or torch.compiler.is_compiling()
        ),
        "launch-cache key and lookup": lambda: matmul_mod._launches.get(
            matmul_mod._launch_key(a, b, None, None, "ieee", kernel)
        ),
        "checks + kernel choice (first call of a shape)": checks_and_choice,
        "allocate the output (new_empty)": lambda: a.new_empty((M, N)),
        "Triton's launch (kernel[grid](...))": lambda: jitted[tuned.grid](*args, **tuned.meta),
        f"cached launcher alone ({known.launcher.kind})": lambda: known.launcher(a, b, c, c),
        "full call": call,
        "full call, thin launch through compiled.run": launch_cache.through_run(lambda: call()),
        "full call, Triton's launch (LABKERNELS_THIN_LAUNCH=0)": launch_cache.thin_off(lambda: call()),
        "torch.matmul (cuBLAS)": lambda: a @ b,
    }
    return _steps_rows(f"matmul {key[0]}", steps)


@benchmark("ch03_launch")
def bench_launch() -> list[dict]:
    rows = launch_rows() + softmax_breakdown_rows() + matmul_breakdown_rows("tiled")
    if on_gpu() and matmul_mod._has_tma():
        rows += matmul_breakdown_rows("tma_persistent")
    return rows
