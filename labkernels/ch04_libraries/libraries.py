"""Measuring what cuBLAS and cuDNN do: time per dtype, the kernel each library picked, TF32 settings,
`cudnn.benchmark`'s first-call cost, and channels_last against NCHW.

Everything here *measures* (or reads a setting); the cost model is `gemm_model`. On the CPU lane the same
functions time the CPU's own BLAS and oneDNN, and report what cannot be seen there (no cuBLAS kernel names,
no cudnn.benchmark).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import statistics
import subprocess
import sys
import time

import torch

from labkernels import timing
from labkernels.ch04_libraries import gemm_model
from labkernels.lane import DEVICE, LANE
from labkernels.results import Table
from labkernels.roofline import Ceilings

# --- TF32: the format and the settings ---------------------------------------------------------------------


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """`x` (float32) rounded to TF32's 10 mantissa bits (round to nearest, ties to even), kept in float32.

    TF32 keeps fp32's sign and 8 exponent bits and drops the low 13 of its 23 mantissa bits.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"TF32 rounding takes float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1  # the last mantissa bit TF32 keeps: ties go to even
    rounded = (bits + 0x0FFF + lsb) & ~0x1FFF
    finite = torch.isfinite(x)
    return torch.where(finite, rounded.view(torch.float32), x)


def float_bits(value: float, dtype: str) -> str:
    """The bits of `value` stored as `dtype` ("float32", "tf32", "bfloat16", "float16"):
    sign, exponent and mantissa, separated by spaces."""
    layout = {"float32": (8, 23), "tf32": (8, 10), "bfloat16": (8, 7), "float16": (5, 10)}
    if dtype not in layout:
        raise ValueError(f"unknown format {dtype!r}; choose one of {sorted(layout)}")
    exp_bits, man_bits = layout[dtype]
    if dtype in ("float32", "tf32"):
        x = torch.tensor([value], dtype=torch.float32)
        x = round_to_tf32(x) if dtype == "tf32" else x
        raw = int(x.view(torch.int32).item()) & 0xFFFFFFFF
        text = f"{raw:032b}"[: 1 + exp_bits + man_bits]
    else:
        raw = int(torch.tensor([value]).to(getattr(torch, dtype)).view(torch.int16).item()) & 0xFFFF
        text = f"{raw:016b}"
    return f"{text[0]} {text[1 : 1 + exp_bits]} {text[1 + exp_bits :]}"


def tf32_api() -> str:
    """Which TF32 switch this torch has: "fp32_precision" (current) or "allow_tf32" (legacy)."""
    return "fp32_precision" if hasattr(torch.backends.cuda.matmul, "fp32_precision") else "allow_tf32"


def _resolve(chain: list[str]) -> str:
    """The first setting in `chain` that is not "none" (a "none" inherits from its parent)."""
    return next((value for value in chain if value != "none"), "none")


def tf32_defaults() -> dict:
    """Whether float32 matmuls and cuDNN convolutions may use TF32, read through the API this torch has
    (reading the legacy flags after the new API was used raises in torch >= 2.9, so we read one of them)."""
    if tf32_api() == "fp32_precision":
        b = torch.backends
        matmul = _resolve([b.cuda.matmul.fp32_precision, b.fp32_precision])
        conv = _resolve([b.cudnn.conv.fp32_precision, b.cudnn.fp32_precision, b.fp32_precision])
        return {"matmul_tf32": matmul == "tf32", "cudnn_conv_tf32": conv == "tf32"}
    return {
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_conv_tf32": torch.backends.cudnn.allow_tf32,
    }


def tf32_settings() -> dict:
    """The raw settings, as this torch spells them."""
    if tf32_api() == "fp32_precision":
        b = torch.backends
        return {
            "torch.backends.fp32_precision": b.fp32_precision,
            "torch.backends.cuda.matmul.fp32_precision": b.cuda.matmul.fp32_precision,
            "torch.backends.cudnn.conv.fp32_precision": b.cudnn.conv.fp32_precision,
            "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        }
    return {
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
    }


@contextlib.contextmanager
def fp32_matmul_precision(mode: str):
    """Inside the block, float32 matmuls run as "tf32" or "ieee"; the old setting comes back after it
    (restored exactly, so code that reads the legacy flag afterwards does not see a mix of APIs)."""
    if mode not in ("tf32", "ieee"):
        raise ValueError(f"mode must be 'tf32' or 'ieee', got {mode!r}")
    m = torch.backends.cuda.matmul
    name = "fp32_precision" if tf32_api() == "fp32_precision" else "allow_tf32"
    old = getattr(m, name)
    setattr(m, name, mode if name == "fp32_precision" else mode == "tf32")
    try:
        yield
    finally:
        setattr(m, name, old)


@contextlib.contextmanager
def cudnn_conv_precision(mode: str):
    """Inside the block, float32 cuDNN convolutions run as "tf32" or "ieee"."""
    if mode not in ("tf32", "ieee"):
        raise ValueError(f"mode must be 'tf32' or 'ieee', got {mode!r}")
    new = tf32_api() == "fp32_precision"
    owner, name = (
        (torch.backends.cudnn.conv, "fp32_precision") if new else (torch.backends.cudnn, "allow_tf32")
    )
    old = getattr(owner, name)
    setattr(owner, name, mode if new else mode == "tf32")
    try:
        yield
    finally:
        setattr(owner, name, old)


# --- timing a library matmul -------------------------------------------------------------------------------


def random_operands(m: int, n: int, k: int, precision: str):
    dtype = gemm_model.dtype_of(precision)
    a = torch.randn(m, k, device=DEVICE).to(dtype)  # random data: zeros run faster than real data
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    return a, b


def time_matmul(m: int, n: int, k: int, precision: str) -> dict:
    """torch.matmul (cuBLAS on the GPU, the CPU's BLAS on the CPU) at one shape and precision: ms, TFLOP/s,
    intensity. "tf32" is float32 storage with TF32 products (a GPU setting; on a CPU it is plain fp32)."""
    a, b = random_operands(m, n, k, precision)
    with fp32_matmul_precision("tf32" if precision == "tf32" else "ieee"):
        a @ b  # the first call of a shape may pick and load a kernel: keep it out of the timing
        ms = timing.time_ms(lambda: a @ b)
    t = gemm_model.gemm(m, n, k, precision)
    return {"ms": ms, "tflops": timing.tflops(t.flops, ms), "intensity": t.intensity}


def gemm_sweep(shapes: list[tuple[int, int, int]], precisions: list[str]) -> Table:
    """`time_matmul` over shapes × precisions."""
    from labkernels.sweep import sweep

    def one(shape, precision):
        m, n, k = shape
        return {"m": m, "n": n, "k": k, **time_matmul(m, n, k, precision)}

    table = sweep(one, {"shape": shapes, "precision": precisions}, desc="matmul")
    return Table({k: v for k, v in r.items() if k != "shape"} for r in table.rows)


def roof_at_least(ceilings: Ceilings, table: Table) -> tuple[Ceilings, str]:
    """(ceilings that no product of `table` (a `gemm_sweep`) passes, a note saying how the roof was measured).

    A peak is the best the library reaches. On a busy machine (two cores shared, say) the ceilings' own run
    and the sweep's products are timed at different moments, and a product may then beat the peak measured
    before it: each precision's peak is raised to the fastest product timed. Likewise the bandwidth, for the
    products whose bytes do not fit the cache (those that do may pass the memory roof: they never left it)."""
    peaks = dict(ceilings.peak_tflops)
    bandwidth = ceilings.bandwidth_gbps
    raised = []
    for r in table:
        t = gemm_model.gemm(r["m"], r["n"], r["k"], r["precision"])
        tflops = timing.tflops(t.flops, r["ms"])
        if tflops > peaks.get(r["precision"], float("inf")):
            peaks[r["precision"]] = tflops
            raised.append("peak")
        in_cache = ceilings.cache_bytes is not None and t.bytes <= ceilings.cache_bytes
        needed_gbps = timing.gbps(t.bytes, r["ms"])
        if not in_cache and tflops > t.intensity * bandwidth / 1e3 and needed_gbps > bandwidth:
            bandwidth = needed_gbps
            raised.append("bandwidth")
    note = "roof: the peak and copy bandwidth measured in this cell"
    if raised:
        note += " (" + ", ".join(sorted(set(raised))) + " raised to the fastest product timed beside it)"
    return dataclasses.replace(ceilings, peak_tflops=peaks, bandwidth_gbps=bandwidth), note


# --- which kernel the library ran --------------------------------------------------------------------------


def gpu_kernels(fn, *, calls: int = 1) -> list[str]:
    """Names of the GPU kernels `fn()` launches, in order (torch.profiler). Empty on the CPU lane: the CPU's
    BLAS and oneDNN run inside aten ops and expose no kernel names."""
    if LANE != "gpu":
        return []
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm: first calls may also run a search (cudnn.benchmark) or load a module
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:  # older profilers tag kernels only in the averages: keep what ran on the device
        names = [e.key for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
        names = [n for n in names if not n.startswith(("aten::", "cuda"))]
    return [n for n in dict.fromkeys(names) if not n.startswith(("Memcpy", "Memset"))]


# The tile follows "tilesize" (xmma) or "_tst_" (nvjet: nvjet_sm90_tst_64x8_64x16_... is a 64x8 tile, then
# the K step x stages) where the name has them; elsewhere the first AxB of two- or three-digit numbers.
_TILE_NAMED = re.compile(r"(?:tilesize|_tst_)(\d{1,3})x(\d{1,3})(?:x(\d{1,3}))?")
_TILE = re.compile(r"(\d{2,3})x(\d{2,3})(?:x(\d{2,3}))?")


def parse_kernel_name(name: str) -> dict:
    """What a cuBLAS/CUTLASS kernel name says, where it says it: the tile, split-K, stream-K, the library
    family. Names are not an API: unknown parts stay empty."""
    low = name.lower()
    tile = _TILE_NAMED.search(name) or _TILE.search(name)
    if "nvjet" in low:
        family = "cuBLAS nvjet"
    elif "xmma" in low or "cublas" in low:
        family = "cuBLAS xmma"
    elif "cutlass" in low:
        family = "CUTLASS"
    elif "gemm" in low or "sgemm" in low:
        family = "cuBLAS (other)"
    else:
        family = "other"
    return {
        "family": family,
        "tile": "x".join(g for g in tile.groups() if g) if tile else "",
        "split_k": "splitk" in low or "split_k" in low or "segment_k_on" in low,
        "stream_k": "streamk" in low or "stream_k" in low,
    }


def conv_algorithm(names: list[str]) -> str:
    """The convolution algorithm a cuDNN kernel name shows: implicit GEMM, Winograd, FFT, or 'unknown'."""
    text = " ".join(names).lower()
    for key, label in (("winograd", "Winograd"), ("fft", "FFT"), ("implicit", "implicit GEMM")):
        if key in text:
            return label
    if "fprop" in text or "conv" in text:
        return "direct/other"
    return "unknown"


def kernel_table(cases: dict[str, object]) -> Table:
    """For each label → callable: the kernels it launched and what their names say."""
    rows = []
    for label, fn in cases.items():
        names = gpu_kernels(fn)
        main = max(names, key=len) if names else ""
        rows.append({"case": label, "kernels": len(names), **parse_kernel_name(main), "kernel": main[:60]})
    return Table(rows)


# --- cuDNN: convolutions -----------------------------------------------------------------------------------

# The 3x3 convolutions of ResNet-50's four stages (input channels = output channels, stride 1, padding 1).
RESNET50_STAGES = [(64, 56), (128, 28), (256, 14), (512, 7)]


def conv_operands(batch: int, channels: int, size: int, dtype: torch.dtype, channels_last: bool):
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(batch, channels, size, size, device=DEVICE).to(dtype).contiguous(memory_format=fmt)
    w = torch.randn(channels, channels, 3, 3, device=DEVICE).to(dtype).contiguous(memory_format=fmt)
    return x, w


def conv_layout_rows(batch: int, channels: int, size: int, precision: str) -> list[dict]:
    """A 3x3 convolution in NCHW and in channels_last (NHWC) at `precision` ("float32" is IEEE, "tf32" is
    float32 storage with cuDNN's TF32, its default): time and TFLOP/s of each, the cost of converting the
    input to channels_last, and after how many uses that conversion has paid for itself."""
    dtype = gemm_model.dtype_of(precision)
    t = gemm_model.conv2d(batch, channels, size, size, channels, dtype=dtype)
    rows, times = [], {}
    with cudnn_conv_precision("tf32" if precision == "tf32" else "ieee"):
        for layout in ("nchw", "channels_last"):
            x, w = conv_operands(batch, channels, size, dtype, layout == "channels_last")
            conv = functools.partial(torch.nn.functional.conv2d, x, w, padding=1)
            conv()  # with cudnn.benchmark on, a first call runs the search: keep it out of the timing
            times[layout] = ms = timing.time_ms(conv)
            names = gpu_kernels(conv)
            main = max(names, key=len) if names else ""
            rows.append(
                {"layout": layout, "ms": ms, "tflops": timing.tflops(t.flops, ms)}
                | {"algorithm": conv_algorithm(names), "kernel": main}
            )
    x, _ = conv_operands(batch, channels, size, dtype, False)
    convert_ms = timing.time_ms(lambda: x.contiguous(memory_format=torch.channels_last))  # read n, write n
    gain = times["nchw"] - times["channels_last"]
    break_even = convert_ms / gain if gain > 0 else float("inf")
    common = {"batch": batch, "channels": channels, "size": size, "precision": precision}
    for row in rows:
        row.update(speedup_vs_nchw=times["nchw"] / row["ms"], convert_ms=convert_ms)
        row.update(break_even_uses=break_even)
    return [{**common, **row} for row in rows]


# --- cudnn.benchmark: first calls, in a fresh process ------------------------------------------------------

_CHILD = "from labkernels.ch04_libraries.libraries import _first_calls_child; _first_calls_child()"


def first_calls(
    shapes: list[tuple[int, int, int]], *, benchmark: bool, dtype: str = "float16", changing: list[int]
) -> dict:
    """Run in a fresh Python process (so no cuDNN cache exists yet), with `cudnn.benchmark=benchmark`:
    - `first_ms`: wall time of the first call of each shape (batch, channels, size), channels_last, after a
      warm-up convolution of an unrelated shape has paid cuDNN's one-time start-up;
    - `steady_ms`: the median time of later calls of the same shape;
    - `changing_ms`: wall time of one call each at the batch sizes `changing` (every call a new shape)."""
    spec = {"shapes": shapes, "benchmark": benchmark, "dtype": dtype, "changing": changing}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], input=json.dumps(spec), capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"the first-call process failed: {last}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _wall_ms(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _first_calls_child() -> None:
    spec = json.loads(sys.stdin.read())
    if not torch.cuda.is_available():
        raise SystemExit("cudnn.benchmark is measured on a GPU")
    torch.backends.cudnn.benchmark = spec["benchmark"]
    dtype = getattr(torch, spec["dtype"])
    conv = torch.nn.functional.conv2d
    x, w = conv_operands(2, 8, 9, dtype, True)
    _wall_ms(lambda: conv(x, w, padding=1))  # cuDNN handle, library load: paid once, whatever the flag
    result = {"first_ms": [], "steady_ms": [], "changing_ms": 0.0}
    for batch, channels, size in spec["shapes"]:
        x, w = conv_operands(batch, channels, size, dtype, True)
        result["first_ms"].append(_wall_ms(lambda x=x, w=w: conv(x, w, padding=1)))
        steady = [_wall_ms(lambda x=x, w=w: conv(x, w, padding=1)) for _ in range(20)]
        result["steady_ms"].append(statistics.median(steady))
    channels, size = spec["shapes"][0][1:]
    for batch in spec["changing"]:
        x, w = conv_operands(batch, channels, size, dtype, True)
        result["changing_ms"] += _wall_ms(lambda x=x, w=w: conv(x, w, padding=1))
    print(json.dumps(result))
