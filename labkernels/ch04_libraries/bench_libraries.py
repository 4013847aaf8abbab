"""Chapter 04 library benchmarks (`make bench`, GPU lane): cuBLAS per shape and precision, TF32 speed and
error, cuDNN's benchmark flag and layouts, and wave quantization. The notebook reads the CSVs they record.
"""

from __future__ import annotations

import torch

from labkernels import timing
from labkernels.bench import benchmark
from labkernels.ch04_libraries import gemm_model
from labkernels.ch04_libraries.libraries import (
    RESNET50_STAGES,
    conv_layout_rows,
    conv_operands,
    cudnn_conv_precision,
    first_calls,
    fp32_matmul_precision,
    gpu_kernels,
    parse_kernel_name,
    random_operands,
    time_matmul,
)

PRECISIONS = ["float32", "tf32", "float16", "bfloat16"]
SQUARES = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)]
K_SWEEP = [(4096, 4096, k) for k in (16, 64, 256, 512, 1024, 16384)]  # 4096^3 is among the squares
QUOTED_EXAMPLE = (100, 4096, 10)  # an often-quoted "M=100, K=10" (no N given: we take the square's 4096)
SKINNY = [(512, 4096, 4096), (16, 4096, 4096), (3000, 5000, 1000), QUOTED_EXAMPLE]
GEMM_SHAPES = SQUARES + K_SWEEP + SKINNY


def _kernel_columns(fn) -> dict:
    names = gpu_kernels(fn)
    main = max(names, key=len) if names else ""  # the GEMM's name is the long one; a split-K reduce is short
    parsed = parse_kernel_name(main)
    parsed["split_k"] = parsed["split_k"] or any("splitkreduce" in n.lower() for n in names)
    return {"kernels": len(names), **parsed, "kernel": main}


def gemm_rows(shapes, precisions) -> list[dict]:
    rows = []
    for m, n, k in shapes:
        for precision in precisions:
            row = {"m": m, "n": n, "k": k, "precision": precision, **time_matmul(m, n, k, precision)}
            a, b = random_operands(m, n, k, precision)
            with fp32_matmul_precision("tf32" if precision == "tf32" else "ieee"):
                row |= _kernel_columns(lambda a=a, b=b: a @ b)
            rows.append(row)
    return rows


@benchmark("ch04_gemm_sweep")
def bench_gemm_sweep() -> list[dict]:
    return gemm_rows(GEMM_SHAPES, PRECISIONS)


# --- wave quantization -------------------------------------------------------------------------------------

WAVE_M, WAVE_K = 2048, 4096
WAVE_NS = list(range(128, 8192 + 1, 128))


@benchmark("ch04_wave")
def bench_wave() -> list[dict]:
    """bf16 (2048, N) @ ... with K = 4096, N in steps of 128: time, and the tile cuBLAS used at each N."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in WAVE_NS:
        a, b = random_operands(WAVE_M, n, WAVE_K, "bfloat16")
        row = {"m": WAVE_M, "n": n, "k": WAVE_K, "precision": "bfloat16", "sms": sms}
        row |= time_matmul(WAVE_M, n, WAVE_K, "bfloat16")
        row |= _kernel_columns(lambda a=a, b=b: a @ b)
        rows.append(row)
    return rows


# --- TF32: speed and error against float64 -----------------------------------------------------------------

TF32_SIZES = [1024, 4096, 8192]


def _errors(out: torch.Tensor, exact: torch.Tensor) -> dict:
    diff = (out.double() - exact).abs()
    return {
        "rel_err": float(torch.linalg.norm(diff) / torch.linalg.norm(exact)),
        "max_abs_err": float(diff.max()),
        "max_rel_err": float(diff.max() / exact.abs().max()),
    }


def tf32_matmul_rows(size: int) -> list[dict]:
    a32, b32 = random_operands(size, size, size, "float32")
    exact = a32.double() @ b32.double()
    rows = []
    for precision in PRECISIONS:
        a, b = a32.to(gemm_model.dtype_of(precision)), b32.to(gemm_model.dtype_of(precision))
        with fp32_matmul_precision("tf32" if precision == "tf32" else "ieee"):
            ms = timing.time_ms(lambda a=a, b=b: a @ b)
            out = a @ b
        t = gemm_model.gemm(size, size, size, precision)
        rows.append(
            {"op": "matmul", "shape": f"{size}^3", "precision": precision, "ms": ms}
            | {"tflops": timing.tflops(t.flops, ms), **_errors(out, exact)}
        )
    return rows


def tf32_conv_rows(batch: int, channels: int, size: int) -> list[dict]:
    """A float32 3x3 convolution with cuDNN's TF32 on (its default) and off, against a float64 conv."""
    x, w = conv_operands(batch, channels, size, torch.float32, True)
    exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    t = gemm_model.conv2d(batch, channels, size, size, channels, dtype=torch.float32)
    rows = []
    for mode in ("ieee", "tf32"):
        with cudnn_conv_precision(mode):
            ms = timing.time_ms(lambda: torch.nn.functional.conv2d(x, w, padding=1))
            out = torch.nn.functional.conv2d(x, w, padding=1)
        rows.append(
            {"op": "conv3x3", "shape": f"{batch}x{channels}x{size}x{size}", "precision": mode, "ms": ms}
            | {"tflops": timing.tflops(t.flops, ms), **_errors(out, exact)}
        )
    return rows


@benchmark("ch04_tf32")
def bench_tf32() -> list[dict]:
    rows = []
    for size in TF32_SIZES:
        rows += tf32_matmul_rows(size)
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        rows += tf32_conv_rows(32, 256, 14)
    finally:
        torch.backends.cudnn.benchmark = old
    return rows


# --- cuDNN: the benchmark flag, layouts --------------------------------------------------------------------

CUDNN_BATCH = 32
CHANGING_BATCHES = [31, 30, 29, 28, 27, 26, 25, 24]  # eight new shapes, each called once


def first_call_rows() -> list[dict]:
    shapes = [(CUDNN_BATCH, c, s) for c, s in RESNET50_STAGES]
    rows = []
    for flag in (False, True):
        got = first_calls(shapes, benchmark=flag, dtype="float16", changing=CHANGING_BATCHES)
        for (batch, c, s), first, steady in zip(shapes, got["first_ms"], got["steady_ms"], strict=True):
            rows.append(
                {"kind": "first_call", "benchmark": flag, "batch": batch, "channels": c, "size": s}
                | {"precision": "float16", "first_ms": first, "steady_ms": steady}
            )
        c, s = shapes[0][1:]
        rows.append(
            {"kind": "changing_shapes", "benchmark": flag, "batch": len(CHANGING_BATCHES), "channels": c}
            | {"size": s, "precision": "float16", "first_ms": got["changing_ms"] / len(CHANGING_BATCHES)}
        )
    return rows


@benchmark("ch04_cudnn")
def bench_cudnn() -> list[dict]:
    rows = first_call_rows()
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        for precision in PRECISIONS:
            for channels, size in RESNET50_STAGES:
                layout = conv_layout_rows(CUDNN_BATCH, channels, size, precision)
                rows += [{"kind": "layout", **r} for r in layout]
    finally:
        torch.backends.cudnn.benchmark = old
    return rows
