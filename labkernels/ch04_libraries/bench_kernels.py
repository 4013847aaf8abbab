"""Chapter 04 kernel benchmarks (`make bench`, GPU lane): this chapter's matmul (split-K, stream-K, TF32
K-major) against cuBLAS, and its implicit-GEMM convolution against cuDNN in both layouts.

Every implementation is timed twice: as a user calls it (`timing.time_ms`, plain calls, host cost included
where the GPU cannot hide it) and as CUDA-graph replays (`timing.graph_ms`, the host taken out). Rounds
alternate between implementations, median of each: the clock follows the card's power draw, so whichever
ran first would otherwise get the cooler, faster card.
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton import matmul as ch03
from labkernels.ch04_libraries import conv as conv_mod
from labkernels.ch04_libraries import splitk
from labkernels.lane import DEVICE
from labkernels.roofline import tf32_matmuls

ROUNDS = 2
MATMUL_SHAPES = [  # the six first, then skinny and wave-quantized ones
    (1024, 1024, 1024),
    (4096, 512, 4096),
    (512, 4096, 4096),
    (4096, 4096, 512),
    (3000, 5000, 1000),
    (8192, 8192, 8192),
    (16, 4096, 4096),
    (4096, 16, 4096),
    (128, 128, 65536),
    (1536, 1536, 1536),
    (2048, 2048, 2048),
    (6144, 6144, 6144),
]
MODES = {
    "plain": lambda fn: timing.time_ms(fn, warmup=10, rep=30),
    "graph": lambda fn: timing.graph_ms(fn, rep=10),
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _time_rounds(impls: dict, context=contextlib.nullcontext) -> dict[tuple[str, str], float]:
    """Median ms per (impl, mode), over ROUNDS alternating rounds."""
    samples = {(impl, mode): [] for impl in impls for mode in MODES}
    with context():
        for fn in impls.values():
            fn()  # tuning and first-call work stay outside the timed region
        for _ in range(ROUNDS):
            for impl, fn in impls.items():
                for mode, timer in MODES.items():
                    samples[impl, mode].append(timer(fn))
    return {key: statistics.median(values) for key, values in samples.items()}


def _rows(times: dict, params: dict, flops: float, baseline: str, extra: dict) -> list[dict]:
    rows = []
    for (impl, mode), ms in times.items():
        row = {**params, "impl": impl, "mode": mode, "ms": ms, "tflops": timing.tflops(flops, ms)}
        if impl != baseline:
            row["ratio_vs_" + baseline] = times[baseline, mode] / ms
        rows.append(row | extra.get(impl, {}))
    return rows


def _variant_name(kernel: str, a, b) -> str:
    return ch03.tuned_config(a, b)[0] if kernel == "ch03" else kernel


def matmul_rows(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """auto, each kernel auto considered for this shape (split-K also in its deterministic mode), cuBLAS."""
    a = torch.randn(m, k, device=DEVICE).to(dtype)
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    chosen = splitk.chosen_kernel(a, b)  # times the candidates, the first time
    impls = {"labkernels": lambda: splitk.matmul(a, b)}
    for candidate in splitk.auto_candidates(m, n, k, splitk.num_sms(), dtype):
        name = _variant_name(candidate, a, b)
        impls[name] = lambda name=name: splitk.matmul(a, b, kernel=name)
        if name == "split_k":
            impls["split_k_deterministic"] = lambda: splitk.matmul(a, b, kernel="split_k", deterministic=True)
    impls["cublas"] = lambda: a @ b
    times = _time_rounds(impls)
    split = splitk.split_for(m, n, k, splitk.num_sms())
    params = {"m": m, "n": n, "k": k, "dtype": _dtype_name(dtype), "auto_kernel": chosen}
    extra = {"split_k": {"split": split}, "split_k_deterministic": {"split": split}}
    return _rows(times, params, traffic.matmul(m, n, k, dtype).flops, "cublas", extra)


def tf32_rows(size: int = 4096) -> list[dict]:
    """fp32 with TF32 on both sides. "labkernels" copies B to K-major inside the call (counted);
    "k_major_view" gets a B that already is (as `w.t()` of a row-major weight), so it copies nothing."""
    a, b = torch.randn(size, size, device=DEVICE), torch.randn(size, size, device=DEVICE)
    b_view = b.t().contiguous().t()
    impls = {
        "labkernels": lambda: splitk.matmul(a, b, allow_tf32=True),
        "k_major_view": lambda: splitk.matmul(a, b_view, allow_tf32=True),
        "ch03_tiled": lambda: ch03.matmul(a, b, input_precision="tf32", kernel="tiled"),
        "cublas": lambda: a @ b,
    }
    times = _time_rounds(impls, lambda: tf32_matmuls(True))
    params = {
        "m": size,
        "n": size,
        "k": size,
        "dtype": "tf32",
        "auto_kernel": splitk.chosen_kernel(a, b, allow_tf32=True),
    }
    return _rows(times, params, traffic.matmul(size, size, size).flops, "cublas", {})


@benchmark("ch04_matmul")
def bench_matmul() -> list[dict]:
    rows = []
    for shape in MATMUL_SHAPES:
        shape_rows = matmul_rows(*shape)
        rows += shape_rows
        _print_matmul(shape_rows)
    tf32 = tf32_rows()
    _print_matmul(tf32)
    return rows + tf32


def _print_matmul(rows: list[dict]) -> None:
    ours = {r["mode"]: r for r in rows if r["impl"] == "labkernels"}
    r = ours["graph"]
    print(
        f"  matmul {r['m']}x{r['n']}x{r['k']} {r['dtype']}: auto={r['auto_kernel']} ratio vs cuBLAS "
        f"plain {ours['plain']['ratio_vs_cublas']:.2f} graph {r['ratio_vs_cublas']:.2f}",
        flush=True,
    )


# --- convolution -------------------------------------------------------------------------------------------

# (batch, C, size, K_out, R, stride, padding): ResNet-50's 3x3 stages, a 1x1 reduction, a stride-2 3x3.
CONV_SHAPES = [
    (32, 64, 56, 64, 3, 1, 1),
    (32, 128, 28, 128, 3, 1, 1),
    (32, 256, 14, 256, 3, 1, 1),
    (32, 512, 7, 512, 3, 1, 1),
    (32, 256, 56, 64, 1, 1, 0),
    (32, 128, 56, 128, 3, 2, 1),
]


def conv_rows(batch, c, size, k_out, r, stride, padding, dtype=torch.float16) -> list[dict]:
    """labkernels (NHWC) against cuDNN with channels_last and with NCHW, cudnn.benchmark on."""
    x_nchw = torch.randn(batch, c, size, size, device=DEVICE).to(dtype)
    w_torch = torch.randn(k_out, c, r, r, device=DEVICE).to(dtype)
    x_nhwc, w_nhwc = x_nchw.permute(0, 2, 3, 1).contiguous(), conv_mod.weight_from_torch(w_torch)
    x_cl = x_nchw.contiguous(memory_format=torch.channels_last)
    w_cl = w_torch.contiguous(memory_format=torch.channels_last)
    conv = torch.nn.functional.conv2d
    impls = {
        "labkernels": lambda: conv_mod.conv2d_nhwc(x_nhwc, w_nhwc, stride=stride, padding=padding),
        "cudnn_channels_last": lambda: conv(x_cl, w_cl, stride=stride, padding=padding),
        "cudnn_nchw": lambda: conv(x_nchw, w_torch, stride=stride, padding=padding),
    }
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        times = _time_rounds(impls)
    finally:
        torch.backends.cudnn.benchmark = old
    p = conv_mod.output_size(size, r, stride, padding)
    flops = 2 * batch * p * p * k_out * r * r * c
    params = {
        "batch": batch,
        "c": c,
        "size": size,
        "k_out": k_out,
        "r": r,
        "stride": stride,
        "padding": padding,
    }
    params["dtype"] = _dtype_name(dtype)
    rows = _rows(times, params, flops, "cudnn_channels_last", {})
    for row in rows:  # both baselines, per mode
        row["ratio_vs_cudnn_nchw"] = times["cudnn_nchw", row["mode"]] / row["ms"]
    return rows


@benchmark("ch04_conv")
def bench_conv() -> list[dict]:
    rows = []
    for shape in CONV_SHAPES:
        shape_rows = conv_rows(*shape)
        rows += shape_rows
        ours = {r["mode"]: r for r in shape_rows if r["impl"] == "labkernels"}
        print(
            f"  conv C={shape[1]} {shape[2]}^2 K={shape[3]} {shape[4]}x{shape[4]} s{shape[5]}: "
            f"{ours['graph']['tflops']:.0f} TFLOP/s, vs cuDNN NHWC "
            f"plain {ours['plain']['ratio_vs_cudnn_channels_last']:.2f} "
            f"graph {ours['graph']['ratio_vs_cudnn_channels_last']:.2f}",
            flush=True,
        )
    return rows
