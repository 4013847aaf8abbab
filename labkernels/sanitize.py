"""Every CUDA/Triton op of the course on small, odd shapes, checked, so `compute-sanitizer` can watch them.

`python -m labkernels.sanitize [--only REGEX] [--list]` runs the registry in one process and prints one line
per entry; each entry runs an op on shapes that reach its masks and tails (37 x 53, views, split paths) and
compares it with a float64 torch reference, so a clean sanitizer run also proves the kernels ran. Run it
under the sanitizer with `--tool memcheck` or `--tool racecheck` (racecheck: the shared-memory entries
only): it re-runs itself as `compute-sanitizer ... python -m labkernels.sanitize` with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, because torch's caching allocator sub-allocates from large cudaMalloc
blocks and memcheck only sees an access that leaves a cudaMalloc'd block: uncached, each tensor is its own.

Autotuners keep every config but time each one with a single call (`_one_call`): each config still runs
once under the sanitizer, without triton.testing.do_bench's hundreds of repetitions. On a machine whose
Triton cache is cold, `--jobs N` first runs each entry in its own process, N at a time, so the compiling
happens in parallel (`run_in_parallel`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import math
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

import labkernels
from labkernels.lane import DEVICE, on_gpu


@dataclass(frozen=True)
class Entry:
    name: str
    run: Callable[[], None]  # runs the op(s) and raises AssertionError on a wrong result
    covers: tuple[str, ...]  # the public functions it calls, "module:function" (module without labkernels.)
    shared_memory: bool  # its kernels use shared memory: racecheck runs it
    gpu_only: bool  # only the GPU lane has this kernel (CPU: skipped)


REGISTRY: dict[str, Entry] = {}


def entry(name: str, covers: tuple[str, ...], *, shared_memory: bool = False, gpu_only: bool = False):
    """Register the decorated function as the entry `name`."""

    def register(fn: Callable[[], None]) -> Callable[[], None]:
        if name in REGISTRY:
            raise ValueError(f"sanitizer entry {name!r} is registered twice")
        REGISTRY[name] = Entry(name, fn, tuple(covers), shared_memory, gpu_only)
        return fn

    return register


# --- helpers ------------------------------------------------------------------------------------------------

TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # atol = rtol, per input dtype
MATMUL_TOL = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 8e-2}  # sums of K products


def rand(*shape, dtype=torch.float32) -> torch.Tensor:
    """Fresh N(0, 1) values on this lane's device."""
    return torch.randn(*shape, device=DEVICE).to(dtype)


def poisoned(*shape, dtype=torch.float32) -> torch.Tensor:
    """An `out` full of NaN: an element the kernel forgets to write shows up in the comparison."""
    return torch.full(shape, float("nan"), device=DEVICE, dtype=dtype)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str, tol: float | None = None) -> None:
    """assert_close against a (float64) reference; `tol` (default: per actual's dtype) is atol and rtol."""
    tol = TOL[actual.dtype] if tol is None else tol
    torch.testing.assert_close(
        actual.double(), expected.double(), atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}"
    )


def half() -> torch.dtype:
    """The 16-bit dtype both lanes compute right (the interpreter's bfloat16 is broken)."""
    return torch.bfloat16 if on_gpu() else torch.float16


def transposed(rows: int, cols: int, dtype=torch.float32) -> torch.Tensor:
    """A (rows, cols) view with strides (1, rows): a transposed matrix."""
    return rand(cols, rows, dtype=dtype).t()


def grads(fn, *inputs: torch.Tensor, seed: torch.Tensor) -> list[torch.Tensor]:
    """d(sum(fn(*inputs) * seed))/d(inputs): one backward pass with a random upstream gradient."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    (out * seed).sum().backward()
    return [t.grad for t in leaves]


# --- ch01: the JIT extension (C++ on the CPU lane, csrc/cuda/*.cu on the GPU) ------------------------------


@entry("ch01.add_relu", ("ch01_jit.ops:add_relu", "ch01_jit.ops:add_relu_naive", "ch01_jit.ops:add_relu_out"))
def _ch01_add_relu():
    from labkernels.ch01_jit import ops

    for dtype in (torch.float32, torch.float16):
        # 37*53 = 1961: not a multiple of a 16-byte vector (scalar tail); x[1:] starts off 16-byte alignment
        x, y = rand(1962, dtype=dtype)[1:], rand(1962, dtype=dtype)[1:]
        expected = torch.relu(x.double() + y.double())
        close(ops.add_relu(x, y), expected, f"add_relu {dtype}")
        close(
            ops.add_relu_naive(x.view(37, 53), y.view(37, 53)).flatten(), expected, f"add_relu_naive {dtype}"
        )
        out = poisoned(1961, dtype=dtype)
        close(ops.add_relu_out(x, y, out), expected, f"add_relu_out {dtype}")
    gx, gy = grads(ops.add_relu, x, y, seed=(seed := rand(1961, dtype=x.dtype)))
    close(gx, torch.where(expected > 0, seed.double(), 0.0), "add_relu backward dx")
    close(gy, torch.where(expected > 0, seed.double(), 0.0), "add_relu backward dy")


@entry("ch01.scale_shift", ("ch01_jit.ops:scale_shift",))
def _ch01_scale_shift():
    from labkernels.ch01_jit import ops

    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        x = rand(37, 53, dtype=dtype)
        close(
            ops.scale_shift(x, 1.5, -0.25),
            x.double() * 1.5 - 0.25,
            f"scale_shift {dtype}",
            tol=TOL.get(dtype, 1e-9),
        )


# --- ch02: stride-aware copies (C++/CUDA and Triton) --------------------------------------------------------


def _views() -> list[torch.Tensor]:
    """Odd 2-D views: transposed, a row slice with an offset, a column slice, an expanded row."""
    return [
        transposed(37, 53),
        rand(40, 61)[2:39, 3:56],
        rand(37, 106)[:, ::2][:, :53],
        rand(1, 53).expand(37, 53),
    ]


@entry("ch02.copy_strided", ("ch02_strides.ops:copy_strided",))
def _ch02_copy_strided():
    from labkernels.ch02_strides import ops

    for x in [*_views(), rand(5, 7, 9).permute(2, 0, 1)[1:]]:
        close(ops.copy_strided(x), x, f"copy_strided {tuple(x.stride())}", tol=0)
        close(ops.copy_strided(x, out=poisoned(*x.shape)), x, "copy_strided out=", tol=0)


@entry("ch02.copy_2d_tiled_cuda", ("ch02_strides.ops:copy_2d_tiled",), shared_memory=True)
def _ch02_copy_2d_tiled_cuda():
    from labkernels.ch02_strides import ops

    for x in _views():  # transposed: the load-along-m branch of the shared-memory transpose; others: along n
        close(ops.copy_2d_tiled(x), x, f"copy_2d_tiled {tuple(x.stride())}", tol=0)
        close(ops.copy_2d_tiled(x, out=poisoned(*x.shape)), x, "copy_2d_tiled out=", tol=0)


@entry("ch02.add_relu_strided", ("ch02_strides.ops:add_relu_strided",))
def _ch02_add_relu_strided():
    from labkernels.ch02_strides import ops

    x, y = transposed(37, 53), rand(1, 53).expand(37, 53)  # an expanded bias: stride 0
    expected = torch.relu(x.double() + y.double())
    close(ops.add_relu_strided(x, y), expected, "add_relu_strided")
    close(ops.add_relu_strided(x, y, out=poisoned(37, 53)), expected, "add_relu_strided out=")


@entry(
    "ch02.triton_copies",
    ("ch02_strides.triton_strided:copy_flat", "ch02_strides.triton_strided:copy_2d_naive"),
)
def _ch02_triton_copies():
    from labkernels.ch02_strides import triton_strided as ts

    x = rand(37, 53)
    close(ts.copy_flat(x), x, "copy_flat", tol=0)
    close(ts.copy_flat(x, poisoned(37, 53)), x, "copy_flat out=", tol=0)
    for v in _views():
        close(ts.copy_2d_naive(v), v, f"copy_2d_naive {tuple(v.stride())}", tol=0)


@entry("ch02.triton_copy_2d_tiled", ("ch02_strides.triton_strided:copy_2d_tiled",), shared_memory=True)
def _ch02_triton_copy_2d_tiled():
    from labkernels.ch02_strides import triton_strided as ts

    for v in _views():  # autotuned (every config once), then one fixed small tile: more programs, more edges
        close(ts.copy_2d_tiled(v), v, f"copy_2d_tiled {tuple(v.stride())}", tol=0)
        close(ts.copy_2d_tiled(v, poisoned(37, 53), block_m=16, block_n=32), v, "copy_2d_tiled 16x32", tol=0)


@entry("ch02.triton_add_relu_2d", ("ch02_strides.triton_strided:add_relu_2d",))
def _ch02_triton_add_relu_2d():
    from labkernels.ch02_strides import triton_strided as ts

    x, y = transposed(37, 53), rand(1, 53).expand(37, 53)
    close(ts.add_relu_2d(x, y, poisoned(37, 53)), torch.relu(x.double() + y.double()), "add_relu_2d")


# --- ch03: Triton ------------------------------------------------------------------------------------------


@entry("ch03.vector_add", ("ch03_triton.vector_add:vector_add",))
def _ch03_vector_add():
    from labkernels.ch03_triton.vector_add import vector_add

    x, y = rand(1961), rand(1961)
    close(vector_add(x, y), x.double() + y.double(), "vector_add")
    close(vector_add(x, y, poisoned(1961), block_size=128), x.double() + y.double(), "vector_add block 128")
    gx, gy = grads(vector_add, x, y, seed=(seed := rand(1961)))
    close(gx, seed, "vector_add backward dx")
    close(gy, seed, "vector_add backward dy")


@entry("ch03.add_relu", ("ch03_triton.add_relu:add_relu",))
def _ch03_add_relu():
    from labkernels.ch03_triton.add_relu import add_relu

    x, y = rand(1961), rand(1961)
    expected = torch.relu(x.double() + y.double())
    close(add_relu(x, y), expected, "add_relu autotuned")
    close(add_relu(x, y, poisoned(1961), block_size=256, num_warps=2), expected, "add_relu block 256")
    (gx,) = grads(lambda a: add_relu(a, y), x, seed=(seed := rand(1961)))
    close(gx, torch.where(expected > 0, seed.double(), 0.0), "add_relu backward")


@entry("ch03.softmax", ("ch03_triton.softmax:softmax",), shared_memory=True)
def _ch03_softmax():
    from labkernels.ch03_triton.softmax import softmax

    x = rand(37, 64)[:, 3:56]  # 53 columns of a wider row: strided rows, a masked tail
    expected = torch.softmax(x.double(), dim=1)
    close(softmax(x), expected, "softmax")
    close(softmax(x, rows_per_program=4, num_warps=2), expected, "softmax 4 rows/program")
    close(softmax(x, persistent=True, num_stages=2), expected, "softmax persistent")
    xt = transposed(37, 53)  # column-major: strided columns
    close(softmax(xt), torch.softmax(xt.double(), dim=1), "softmax transposed")
    xh = x.to(half())
    close(softmax(xh), torch.softmax(xh.double(), dim=1), "softmax 16-bit")
    (gx,) = grads(softmax, x, seed=(seed := rand(37, 53)))
    (gr,) = grads(lambda t: torch.softmax(t.double(), 1), x, seed=seed)
    close(gx, gr, "softmax backward")


def _matmul_cases(matmul, kernel: str, dtype: torch.dtype, m: int, n: int, k: int) -> None:
    """Plain, bias + relu, bias + gelu, and a backward, against float64."""
    a, b, bias = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype), rand(n, dtype=dtype)
    ref = a.double() @ b.double()
    tol = MATMUL_TOL[dtype]
    close(matmul(a, b, kernel=kernel), ref, f"matmul {kernel} {dtype}", tol)
    close(
        matmul(a, b, bias=bias, activation="relu", kernel=kernel),
        torch.relu(ref + bias.double()),
        "relu",
        tol,
    )
    gelu = torch.nn.functional.gelu(ref + bias.double())
    close(matmul(a, b, bias=bias, activation="gelu", kernel=kernel), gelu, f"matmul {kernel} gelu", tol)
    seed = rand(m, n, dtype=dtype)
    da, db = grads(lambda x, y: matmul(x, y, kernel=kernel), a, b, seed=seed)
    close(da, seed.double() @ b.double().t(), f"matmul {kernel} backward da", tol)
    close(db, a.double().t() @ seed.double(), f"matmul {kernel} backward db", tol)


# Two entries, not one: each call shape compiles every autotune config, so a cold cache fills twice as fast
# when the two run in parallel (`--jobs`).
@entry("ch03.matmul_tiled_fp32", ("ch03_triton.matmul:matmul",), shared_memory=True)
def _ch03_matmul_tiled_fp32():
    from labkernels.ch03_triton.matmul import matmul

    _matmul_cases(matmul, "tiled", torch.float32, 37, 29, 53)  # no dim a multiple of any block: all masks
    a, b = transposed(37, 53), transposed(53, 29)  # column-major operands
    close(matmul(a, b, kernel="tiled"), a.double() @ b.double(), "matmul tiled transposed", 1e-3)


@entry("ch03.matmul_tiled_16bit", ("ch03_triton.matmul:matmul",), shared_memory=True)
def _ch03_matmul_tiled_16bit():
    from labkernels.ch03_triton.matmul import matmul

    _matmul_cases(matmul, "tiled", half(), 37, 29, 53)


@entry("ch03.matmul_tma", ("ch03_triton.matmul:matmul",), shared_memory=True)
def _ch03_matmul_tma():
    from labkernels.ch03_triton.matmul import matmul

    # TMA needs 16-byte rows: K and N multiples of 8 (16-bit); M odd, and no dim a multiple of the tile
    _matmul_cases(matmul, "tma_persistent", half(), 37, 40, 56)


# --- ch04: split-K, stream-K, K-major, implicit-GEMM convolution --------------------------------------------


@entry("ch04.matmul", ("ch04_libraries.splitk:matmul",), shared_memory=True)
def _ch04_matmul():
    from labkernels.ch04_libraries.splitk import matmul

    dtype = half()
    m, n, k = 37, 29, 600  # K = 2 full 256-chunks and a short one: the split tail
    a, b = rand(m, k, dtype=dtype), rand(k, n, dtype=dtype)
    ref, tol = a.double() @ b.double(), MATMUL_TOL[dtype] * 4  # K = 600: larger sums than ch03's
    a10, b10 = rand(m, 10 * 256 - 37, dtype=dtype), rand(10 * 256 - 37, n, dtype=dtype)
    ref10 = a10.double() @ b10.double()
    # 3 splits: partials added in order in one launch; 10: the same in two levels (deterministic), or fp32
    # atomics and a cast (not)
    for split, deterministic in ((3, False), (10, True), (10, False)):
        x, y, want = (a, b, ref) if split == 3 else (a10, b10, ref10)
        for call in ("first", "second"):  # the second: the kept plan, on what the first launch left reset
            got = matmul(x, y, kernel="split_k", split_k=split, deterministic=deterministic)
            close(got, want, f"split_k {split} deterministic={deterministic}, {call} call", tol * 2)
    close(matmul(a, b, kernel="stream_k"), ref, "stream_k", tol)
    close(matmul(a, b, kernel="wave_tail"), ref, "wave_tail", tol)  # one launch: fewer tiles than SMs
    close(matmul(a, b, kernel="k_major"), ref, "k_major", tol)
    af, bf = rand(m, 53), rand(53, n)  # fp32 TF32 goes K-major
    close(matmul(af, bf, kernel="k_major", allow_tf32=True), af.double() @ bf.double(), "k_major tf32", 2e-2)
    seed = rand(m, n, dtype=dtype)
    da, db = grads(lambda x, y: matmul(x, y, kernel="split_k", split_k=2), a, b, seed=seed)
    close(da, seed.double() @ b.double().t(), "split_k backward da", tol)
    close(db, a.double().t() @ seed.double(), "split_k backward db", tol)


WAVE_TAIL_OPS = ("ch04_libraries.wave_tail:launch", "ch04_libraries.wave_tail:run")


@entry("ch04.wave_tail", WAVE_TAIL_OPS, shared_memory=True)
def _ch04_wave_tail():
    from labkernels.ch04_libraries import wave_tail

    dtype = half()
    a, b = rand(45, 150, dtype=dtype).t(), rand(45, 170, dtype=dtype)  # A column-major; nothing tile-sized
    ref, tol = a.double() @ b.double(), MATMUL_TOL[dtype]
    config = triton.Config({"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 16, "GROUP_SIZE_M": 8})
    c = poisoned(150, 170, dtype=dtype)
    meta = wave_tail._meta(a, b, c, config, "ieee")
    rect, launcher = wave_tail.launch(a, b, c, meta, 4, 16)  # 12 whole tiles on 4 "SMs", 3 rows of narrow
    assert rect is not None, "no narrow tiles: the entry checks one branch only"
    close(c, ref, "wave_tail launch", tol)
    launcher(a, b, c.fill_(float("nan")))
    close(c, ref, "wave_tail launcher", tol)
    c = poisoned(150, 170, dtype=dtype)
    wave_tail.run(a, b, c, "ieee", 4)  # chapter 03's tuned tile, planned for 4 "SMs"
    close(c, ref, "wave_tail run", tol)


@entry("ch04.conv2d_nhwc", ("ch04_libraries.conv:conv2d_nhwc",), shared_memory=True)
def _ch04_conv():
    from labkernels.ch04_libraries.conv import conv2d_nhwc

    dtype = torch.float16 if on_gpu() else torch.float32
    x, w, bias = rand(2, 9, 11, 5, dtype=dtype), rand(7, 3, 3, 5, dtype=dtype), rand(7, dtype=dtype)
    for stride, padding in ((1, 0), (2, 1)):
        ref = torch.nn.functional.conv2d(
            x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), bias.double(), stride, padding
        ).permute(0, 2, 3, 1)
        got = conv2d_nhwc(x, w, bias, stride=stride, padding=padding)
        close(got, ref, f"conv2d_nhwc stride {stride} padding {padding}", MATMUL_TOL[dtype])
    # the TMA box kernel: boxes reach past x at every edge (7 x 11 pixels, 3 images)
    c = 64 if on_gpu() else 16
    x, w, bias = rand(3, 7, 11, c, dtype=dtype), rand(24, 3, 3, c, dtype=dtype), rand(24, dtype=dtype)
    ref = torch.nn.functional.conv2d(
        x.double().permute(0, 3, 1, 2), w.double().permute(0, 3, 1, 2), bias.double(), 1, 1
    ).permute(0, 2, 3, 1)
    for _ in range(2):  # tunes; then the launcher with descriptors built for the call
        got = conv2d_nhwc(x, w, bias, padding=1, kernel="tma_box")
        close(got, ref, "conv2d_nhwc tma_box", MATMUL_TOL[dtype])


# --- ch05: fusion ------------------------------------------------------------------------------------------


@entry("ch05.pointwise", ("ch05_fusion.pointwise:mul_add_sigmoid", "ch05_fusion.pointwise:chain"))
def _ch05_pointwise():
    from labkernels.ch05_fusion import pointwise

    x, a, b = rand(37, 53), rand(37, 53), rand(37, 53)
    expected = torch.sigmoid(x.double() * a.double() + b.double())
    close(pointwise.mul_add_sigmoid(x, a, b, poisoned(37, 53)), expected, "mul_add_sigmoid")
    for n_ops in (1, 6):
        expected = pointwise.reference_chain(x.double(), a.double(), n_ops)
        close(pointwise.chain(x, a, n_ops, poisoned(37, 53)), expected, f"chain {n_ops}")


@entry("ch05.rmsnorm_residual", ("ch05_fusion.rmsnorm:rmsnorm_residual",), shared_memory=True)
def _ch05_rmsnorm():
    from labkernels.ch05_fusion import rmsnorm

    x, r, w = rand(37, 64)[:, :53], rand(37, 53), rand(53)  # x: rows 64 apart
    y_ref, h_ref = rmsnorm.reference(x.double(), r.double(), w.double())
    y, h = rmsnorm.rmsnorm_residual(x, r, w)
    close(y, y_ref, "rmsnorm y")
    close(h, h_ref, "rmsnorm h")
    seed = rand(37, 53)
    got = grads(lambda *t: rmsnorm.rmsnorm_residual(*t)[0], x, r, w, seed=seed)
    want = grads(lambda *t: rmsnorm.reference(*(u.double() for u in t))[0], x, r, w, seed=seed)
    for name, g, gr in zip("xrw", got, want, strict=True):
        close(g, gr, f"rmsnorm backward d{name}", 1e-3)


@entry("ch05.epilogue", ("ch05_fusion.epilogue:matmul_bias_gelu",), shared_memory=True)
def _ch05_epilogue():
    from labkernels.ch05_fusion.epilogue import matmul_bias_gelu

    a, b, bias = rand(37, 53), rand(53, 29), rand(29)
    expected = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    close(matmul_bias_gelu(a, b, bias), expected, "matmul_bias_gelu", 1e-3)


@entry(
    "ch05.prologue",
    ("ch05_fusion.prologue:int8_matmul", "ch05_fusion.prologue:dequantize"),
    shared_memory=True,
)
def _ch05_prologue():
    from labkernels.ch05_fusion import prologue

    for m in (37, 70):  # M <= 64 and M > 64 take different config sets
        a, (w8, scale) = rand(m, 53), prologue.quantize(rand(53, 29))
        w8_columns = w8[:, :29].t().contiguous().t()  # column-major
        for path in ("fused", "auto"):  # auto: fused at M = 37, dequantise then matmul at M = 70
            got = prologue.int8_matmul(a, w8_columns, scale, path=path)
            close(got, prologue.reference(a, w8, scale), f"int8_matmul M={m} {path}", 1e-3)
    close(prologue.dequantize(w8_columns, scale), w8.double() * scale.double(), "dequantize", 1e-6)


@entry("ch05.int8_gemv", ("ch05_fusion.prologue:int8_gemv",), shared_memory=True)
def _ch05_int8_gemv():
    from labkernels.ch05_fusion import prologue

    a, (w8, scale) = rand(3, 300), prologue.quantize(rand(300, 45))  # K: a short last step; N: no whole tile
    w8_k_major = w8.t().contiguous().t()  # the row (M = 1) and rows_dot (M = 3) kernels
    for weights, rows in ((w8, a), (w8_k_major, a), (w8_k_major, a[:1])):
        for config in ((32, 64, 4, 1, 0), (32, 64, 4, 1, 8)):  # one K slice; K split, then the ordered sum
            for magic in (True, False):
                got = prologue.int8_gemv(rows, weights, scale, config=config, magic=magic)
                name = f"int8_gemv {prologue.gemv_design(rows, weights)} {config} magic={magic}"
                close(got, prologue.reference(rows, w8, scale), name, 1e-3)


@entry("ch05.sincos", ("ch05_fusion.horizontal:sincos",))
def _ch05_sincos():
    from labkernels.ch05_fusion.horizontal import sincos

    x = rand(37, 53)
    s, c = sincos(x)
    close(s, torch.sin(x.double()), "sin")
    close(c, torch.cos(x.double()), "cos")


# --- ch06: online softmax and FlashAttention ---------------------------------------------------------------


@entry("ch06.online_softmax", ("ch06_attention.online_softmax:online_softmax",), shared_memory=True)
def _ch06_online_softmax():
    from labkernels.ch06_attention import online_softmax as osm

    x = rand(37, 64)[:, :53]  # rows 64 apart
    expected = torch.softmax(x.double(), dim=1)
    close(osm.online_softmax(x), expected, "online_softmax one block")
    close(osm.online_softmax(x, poisoned(37, 53)), expected, "online_softmax out=")
    (g,) = grads(osm.online_softmax, x, seed=(seed := rand(37, 53)))
    (gr,) = grads(lambda t: torch.softmax(t.double(), 1), x, seed=seed)
    close(g, gr, "online_softmax backward")
    # The public path picks the looped and split modes only for wide rows; the launcher with 16-column blocks
    # reaches every mode on 5 rows of 301 columns: a masked last block, 19 chunks a row.
    x = rand(5, 301)
    for mode in ("one_block", "prefetch", "loop", "split"):
        out = poisoned(5, 301)
        _online_softmax_mode(osm, x, out, mode)
        close(out, torch.softmax(x.double(), dim=1), f"online_softmax {mode}")
    # 16-bit rows of whole 32-bit words (304 columns, 16-byte aligned) take the words kernel in prefetch mode.
    x = rand(5, 304, dtype=half())
    out = poisoned(5, 304, dtype=half())
    _online_softmax_mode(osm, x, out, "prefetch")
    close(out, torch.softmax(x.double(), dim=1), "online_softmax prefetch, 16-bit words")
    out = poisoned(5, 304, dtype=half())
    _online_softmax_mode(osm, x, out, "split_lean")  # the split kernel on the words, 19 chunks a row
    close(out, torch.softmax(x.double(), dim=1), "online_softmax split_lean, 16-bit words")
    out = poisoned(5, 304, dtype=half())
    _online_softmax_mode(osm, x, out, "split_hold")  # the words held across the wait, a register cap
    close(out, torch.softmax(x.double(), dim=1), "online_softmax split_hold, 16-bit words")


def _online_softmax_mode(osm, x: torch.Tensor, out: torch.Tensor, mode: str) -> None:
    """One launch of `mode`. The split modes wait for the other programs of their row, which the interpreter
    runs one after another: on the CPU lane they are skipped (the reference is copied in)."""
    if mode in ("one_block", "prefetch"):  # the whole row in one block
        osm._launch(x, out, triton.next_power_of_2(x.shape[1]), 4, mode)
    elif on_gpu() or not mode.startswith("split"):
        osm._launch(x, out, 16, 1, mode)
    else:
        out.copy_(torch.softmax(x, dim=1))  # GPU_ONLY_KERNELS


def _attention_inputs(head_dim: int, dtype: torch.dtype):
    return [rand(1, 2, 77, head_dim, dtype=dtype) for _ in range(3)]  # N = 77: a partial last block


@entry(
    "ch06.flash_attention",
    (
        "ch06_attention.flash_attention:flash_attention",
        "ch06_attention.flash_attention:flash_attention_with_lse",
    ),
    shared_memory=True,
)
def _ch06_flash_attention():
    from labkernels.ch06_attention import flash_attention as fa
    from labkernels.ch06_attention import naive

    dtype = torch.float16
    for head_dim in (64, 128):
        q, k, v = _attention_inputs(head_dim, dtype)
        for causal in (False, True):
            o, lse = fa.flash_attention_with_lse(q, k, v, causal)
            close(o, naive.reference(q, k, v, causal), f"flash fwd D={head_dim} causal={causal}", 2e-2)
            close(
                lse, naive.logsumexp_reference(q, k, causal), f"flash lse D={head_dim} causal={causal}", 2e-2
            )
            seed = rand(*q.shape, dtype=dtype)
            got = grads(lambda *t, c=causal: fa.flash_attention(*t, c), q, k, v, seed=seed)
            want = grads(lambda *t, c=causal: naive.reference(*t, c), q, k, v, seed=seed)
            for name, g, gr in zip("qkv", got, want, strict=True):
                close(g, gr, f"flash backward d{name} D={head_dim} causal={causal}", 5e-2)
    # Grouped heads, other lengths, a head dim padded to the next power of two: masked loads at every edge;
    # with more queries than keys, causal rows that see no key.
    for (heads, n_q), (kv_heads, n_kv), head_dim in (((4, 45), (2, 70), 80), ((2, 33), (1, 20), 160)):
        q = rand(1, heads, n_q, head_dim, dtype=dtype)
        k, v = (rand(1, kv_heads, n_kv, head_dim, dtype=dtype) for _ in range(2))
        what = f"flash Hq={heads} Hkv={kv_heads} N_q={n_q} N_kv={n_kv} D={head_dim} causal"
        close(fa.flash_attention(q, k, v, True), naive.reference(q, k, v, True), what, 2e-2)
        seed = rand(*q.shape, dtype=dtype)
        got = grads(lambda *t: fa.flash_attention(*t, True), q, k, v, seed=seed)
        want = grads(lambda *t: naive.reference(*t, True), q, k, v, seed=seed)
        for name, g, gr in zip("qkv", got, want, strict=True):
            close(g, gr, f"{what}: d{name}", 5e-2)


@entry(
    "ch06.flash_attention_tma",
    ("ch06_attention.flash_attention:flash_attention",),
    shared_memory=True,
    gpu_only=True,
)
def _ch06_flash_attention_tma():
    from labkernels.ch06_attention import flash_attention as fa
    from labkernels.ch06_attention import naive

    # Small inputs take the fixed pointer config; the TMA configs run only after tuning on large ones, so
    # launch each TMA config directly (a descriptor's boxes at the end of a head: the hardware clips).
    for cfg in (c for c in fa.GPU_CONFIGS if c[4]):
        for head_dim in (64, 128):
            if not fa._fits(cfg, head_dim, 2):
                continue
            q, k, v = _attention_inputs(head_dim, torch.float16)
            o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device=DEVICE)
            for causal in (False, True):
                fa._launch(q, k, v, o, lse, 1 / math.sqrt(head_dim), causal, cfg)
                close(
                    o, naive.reference(q, k, v, causal), f"flash TMA {cfg} D={head_dim} causal={causal}", 2e-2
                )


# --- ch07: decoding ---------------------------------------------------------------------------------------


def _decode_inputs(batch, q_heads, kv_heads, n_tokens, length, head_dim, dtype):
    q = rand(batch, q_heads, n_tokens, head_dim, dtype=dtype)
    return (
        q,
        rand(batch, kv_heads, length, head_dim, dtype=dtype),
        rand(batch, kv_heads, length, head_dim, dtype=dtype),
    )


@entry(
    "ch07.decode_attention",
    ("ch07_decode.decode_attention:decode_attention", "ch07_decode.decode_attention:launch"),
)
def _ch07_decode_attention():
    from labkernels.ch07_decode import decode_attention as dec

    dtype = half()
    q, k, v = _decode_inputs(2, 8, 2, 3, 77, 64, dtype)  # GQA 4, three new tokens, 77 keys
    want = dec.reference(q.double(), k.double(), v.double())
    for splits in (1, 3):  # one pass; three splits and the combine kernel
        out = torch.full_like(q, float("nan"))
        dec.launch(q, k, v, out, max_len=77, sm_scale=64**-0.5, splits=splits)
        close(out, want, f"decode launch splits={splits}")
    close(dec.decode_attention(q, k, v), want, "decode_attention")


@entry(
    "ch07.paged",
    ("ch07_decode.paged:paged_decode_attention", "ch07_decode.paged:paged_append"),
)
def _ch07_paged():
    from labkernels.ch07_decode import decode_attention as dec
    from labkernels.ch07_decode import paged

    dtype = half()
    q, k, v = _decode_inputs(3, 4, 2, 1, 45, 64, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, 16, spare_blocks=2)  # 45 tokens: the last page part-full
    lens = torch.full((3,), 45, device=DEVICE, dtype=torch.int32)
    want = dec.reference(q.double(), k.double(), v.double())
    for splits in (1, 2):
        got = paged.paged_decode_attention(q, k_pool, v_pool, table, lens, splits=splits)
        close(got, want, f"paged_decode_attention splits={splits}")
    positions = torch.tensor([0, 17, 44], device=DEVICE, dtype=torch.int32)  # first, mid-page, last slot
    k_new, v_new = rand(3, 2, 1, 64, dtype=dtype), rand(3, 2, 1, 64, dtype=dtype)
    paged.paged_append(k_pool, v_pool, table, positions, k_new, v_new)
    k_back, v_back = paged.gather(k_pool, v_pool, table, lens)
    rows = torch.arange(3, device=DEVICE)
    close(k_back[rows, :, positions.long()], k_new[:, :, 0], "paged_append k", 0)
    close(v_back[rows, :, positions.long()], v_new[:, :, 0], "paged_append v", 0)


@entry("ch07.rope_append", ("ch07_decode.rope_append:rope_append",))
def _ch07_rope_append():
    from labkernels.ch07_decode import paged, rope_append

    dtype, q_heads, kv_heads, head_dim = half(), 4, 2, 64
    qkv = rand(3, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype)
    positions = torch.tensor([0, 20, 31], device=DEVICE, dtype=torch.int32)
    inv_freq = rope_append.inv_frequencies(head_dim, 10000.0, DEVICE)
    pools = paged.paginate(*(rand(3, kv_heads, 32, head_dim, dtype=dtype) for _ in range(2)), 16)
    want_pools = [pool.clone() for pool in pools[:2]]
    want_q = rope_append.reference(qkv, positions, inv_freq, *want_pools, pools[2], q_heads)
    got_q = rope_append.rope_append(qkv, positions, inv_freq, *pools, q_heads)
    close(got_q, want_q.double(), "rope_append q")
    close(pools[0], want_pools[0].double(), "rope_append k pool")
    close(pools[1], want_pools[1].double(), "rope_append v pool", 0)


@entry("ch07.int4_matmul", ("ch07_decode.int4:int4_matmul",), shared_memory=True)
def _ch07_int4():
    from labkernels.ch07_decode import int4

    dtype = half()
    packed, scales = int4.quantize_int4(rand(45, 384, dtype=dtype))  # N: no whole tile; 3 groups of K
    for m in (1, 3, 7):  # the one-row kernel; fmas on the CUDA cores; tl.dot
        a = rand(m, 384, dtype=dtype)
        want = int4.reference(a, packed, scales)  # fp64 from q and the scales: no 16-bit rounding of W
        for splits in (1, 3):  # one K slice; three and the in-order sum
            close(
                int4.int4_matmul(a, packed, scales, splits=splits), want, f"int4 M={m} splits={splits}", 5e-2
            )


@entry("ch07.read_kernel", ())
def _ch07_read_kernel():
    from labkernels.ch07_decode import bench

    x = rand(3 * bench.READ_BLOCK + 5)  # a short last block: the mask
    for block, iters, warps in bench.READ_CONFIGS[:1]:
        programs = triton.cdiv(x.numel(), block * iters)
        out = torch.full((programs,), float("nan"), device=DEVICE)
        bench._read_kernel[(programs,)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps)
        close(out.sum(), x.double().sum(), "read kernel's sum", 1e-3)


# --- coverage: the public ops and kernels the registry must reach ------------------------------------------

# Public functions of the op modules that launch no kernel of their own (helpers, references, configs).
NOT_OPS = {
    "reference", "reference_add_relu", "scale_shift_reference", "reference_mul_add_sigmoid",
    "reference_chain", "eager", "load", "ensure_loaded", "quantize", "launch_config", "config",
    "tuned_config", "vector_width", "needs_int64", "registers", "chain_registers", "check_count",
    "check_block_size", "check_num_warps", "check_elementwise", "check_out_overlap", "check_operands",
    "split_for", "split_chunk", "auto_candidates", "num_sms", "chosen_kernel", "candidates", "output_size",
    "weight_from_torch", "grad_wanted", "row_alignment", "bwd_config", "snug_tiles", "filling_tiles",
    "tile_count", "leftover", "tail_block_n", "tile_coordinates", "planned", "check", "hold_registers",
    "check_sms", "gemv_splits", "gemv_design", "forward_hbm_bytes", "check_cache", "check_query",
    "num_splits", "traffic", "split_k", "pack_int4", "unpack_int4", "dequantize_int4", "inv_frequencies",
    "validate_block_table", "gather", "paginate", "quantize_int4", "row_config",
}  # fmt: skip

# Benchmark harnesses: their functions time and tabulate ops, they are not ops; their kernels (a read stream
# for the roof) still need an entry that launches them.
HARNESS_MODULES = {"labkernels.ch07_decode.bench"}


def op_modules() -> list[str]:
    """Chapter modules that launch kernels: those defining a @triton.jit function or calling the extension."""
    names = []
    for info in pkgutil.walk_packages([str(Path(labkernels.__file__).parent)], "labkernels."):
        if not re.match(r"labkernels\.ch\d\d_\w+\.\w+$", info.name):
            continue
        source = Path(importlib.util.find_spec(info.name).origin).read_text()
        if "@triton.jit" in source or re.search(r"torch\.ops\.labkernels\.\w+\.default\(", source):
            names.append(info.name)
    return sorted(names)


def public_ops() -> list[str]:
    """ "module:function" for every public function defined in an op module and not in NOT_OPS."""
    ops = []
    for name in op_modules():
        if name in HARNESS_MODULES:
            continue
        module = importlib.import_module(name)
        for fn_name, fn in vars(module).items():
            if fn_name.startswith("_") or fn_name in NOT_OPS or not inspect.isfunction(fn):
                continue
            if fn.__module__ == name:
                ops.append(f"{name.removeprefix('labkernels.')}:{fn_name}")
    return sorted(ops)


def _jit_functions(module) -> dict[str, object]:
    jit_types = tuple(t for t in (triton.runtime.JITFunction, _interpreted_type()) if t is not None)
    return {n: v for n, v in vars(module).items() if isinstance(v, jit_types)}


def _interpreted_type():
    from triton.runtime import interpreter

    return getattr(interpreter, "InterpretedFunction", None)


def kernels() -> list[str]:
    """ "module:kernel" of every @triton.jit launch target: the jit functions no other jit function calls or
    passes on (as `tl.reduce`'s combine function)."""
    found = []
    for name in op_modules():
        jitted = _jit_functions(importlib.import_module(name))
        sources = {n: inspect.getsource(f.fn) for n, f in jitted.items()}
        for n in jitted:
            used = rf"\b{n}\(|[(,]\s*{n}\s*[),]"  # called, or an argument of a call
            called = any(re.search(used, s) for other, s in sources.items() if other != n)
            if not called:
                found.append(f"{name.removeprefix('labkernels.')}:{n}")
    return sorted(found)


# Kernels the CPU lane cannot launch: their programs wait for each other; the interpreter runs them in turn.
GPU_ONLY_KERNELS = {
    "ch06_attention.online_softmax:_split_row_kernel",
    "ch06_attention.online_softmax:_split_lean_kernel",
}

LAUNCHED: set[str] = set()  # "module:kernel" of each Triton kernel launched in this process


@contextlib.contextmanager
def recording_launches():
    """Record every Triton launch (JITFunction.run on the GPU, InterpretedFunction.run under the
    interpreter): the autotuner, launch_cache's first launch and `kernel[grid]` all go through it."""
    patched = []
    for cls in (triton.runtime.JITFunction, _interpreted_type()):
        if cls is None or "run" not in vars(cls):
            continue
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            LAUNCHED.add(f"{self.fn.__module__.removeprefix('labkernels.')}:{self.fn.__name__}")
            return _original(self, *args, **kwargs)

        cls.run = run
        patched.append((cls, original))
    try:
        yield
    finally:
        for cls, original in patched:
            cls.run = original


def _one_call(kernel_call, quantiles=(0.5, 0.2, 0.8)):
    """An autotuner benchmark that runs the config once: every config meets the sanitizer, cheaply."""
    start = time.perf_counter()
    kernel_call()
    if on_gpu():
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    return [ms] * len(quantiles) if len(quantiles) > 1 else ms


def single_call_autotuning() -> None:
    """Give every autotuner of the op modules `_one_call` as its benchmark."""
    for name in op_modules():
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, triton.runtime.Autotuner):  # triton 3.6/3.7 keep it in `_do_bench`
                setattr(value, "_do_bench" if hasattr(value, "_do_bench") else "do_bench", _one_call)


# --- running ------------------------------------------------------------------------------------------------


def selected(only: str | None = None, shared_memory: bool = False) -> list[Entry]:
    """The entries this lane runs, filtered by a regex on their names and by shared-memory use."""
    entries = [e for e in REGISTRY.values() if on_gpu() or not e.gpu_only]
    if only:
        entries = [e for e in entries if re.search(only, e.name)]
    return [e for e in entries if e.shared_memory or not shared_memory]


def run_entries(entries: list[Entry], print_fn=print) -> list[tuple[str, float, str | None]]:
    """Run each entry; print `ok|FAIL name seconds [error]`; return (name, seconds, error or None)."""
    single_call_autotuning()
    results = []
    with recording_launches():
        for e in entries:
            torch.manual_seed(0)
            start = time.perf_counter()
            error = None
            try:
                e.run()
                if on_gpu():
                    torch.cuda.synchronize()  # an asynchronous kernel error surfaces here, in its entry
            except Exception as exc:  # noqa: BLE001  (reported per entry; the run goes on)
                error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            seconds = time.perf_counter() - start
            results.append((e.name, seconds, error))
            print_fn(
                f"{'ok  ' if error is None else 'FAIL'} {e.name:<28} {seconds:7.2f} s"
                + (f"  {error}" if error else "")
            )
    return results


_RESULT_LINE = re.compile(r"^(ok  |FAIL) (\S+)\s+([\d.]+) s(?:  (.*))?$", re.M)


def _package_env() -> dict[str, str]:
    """This environment, with the checkout that holds `labkernels` first on PYTHONPATH (it may not be
    installed: a child `python -m labkernels.sanitize` must import the same package)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(labkernels.__file__).parents[1]), env.get("PYTHONPATH")])
    )
    return env


def _run_alone(name: str, extra: list[str], timeout: float) -> tuple[str, float, str | None]:
    """One entry in a fresh process: (name, seconds, error or None)."""
    command = [sys.executable, "-m", "labkernels.sanitize", "--only", f"^{re.escape(name)}$"]
    command += [a for path in extra for a in ("--extra", path)]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, env=_package_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return name, time.perf_counter() - start, f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    line = next((m for m in _RESULT_LINE.finditer(done.stdout) if m.group(2) == name), None)
    if done.returncode == 0 and line is not None and line.group(1) == "ok  ":
        return name, seconds, None
    if line is not None and line.group(4):
        return name, seconds, line.group(4)
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
    return name, seconds, f"exit {done.returncode}: {tail[0]}"


def run_in_parallel(
    entries: list[Entry], jobs: int, extra: list[str] = (), timeout: float = 600, print_fn=print
) -> list[tuple[str, float, str | None]]:
    """Each entry in its own process, `jobs` at a time; prints and returns what `run_entries` does.

    Why: the first run on a machine compiles every autotune config of every kernel, one after another in one
    process (minutes, for the matmuls). Triton's on-disk cache is shared by processes, so compiling in
    parallel leaves a warm cache in the time of the slowest entry, and the sanitized runs that follow in one
    process measure the kernels, not the compiler."""
    from concurrent.futures import ThreadPoolExecutor

    # the slowest-compiling entries (the autotuned matmuls) first, so they do not start last
    order = sorted(entries, key=lambda e: "matmul" not in e.name)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(_run_alone, e.name, list(extra), timeout) for e in order]
        results = []
        for future in futures:
            name, seconds, error = future.result()
            results.append((name, seconds, error))
            print_fn(
                f"{'ok  ' if error is None else 'FAIL'} {name:<28} {seconds:7.2f} s"
                + (f"  {error}" if error else "")
            )
    return results


# --- under compute-sanitizer --------------------------------------------------------------------------------


def find_compute_sanitizer() -> str | None:
    """compute-sanitizer on PATH, in $CUDA_HOME/bin, or in /usr/local/cuda/bin; None if none is there."""
    candidates = [shutil.which("compute-sanitizer")]
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root:
            candidates.append(str(Path(root) / "bin" / "compute-sanitizer"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


SANITIZER_OPTIONS = {
    # exit 99 on any error; at most 20 reports; device-side backtraces only (host ones are Python's frames)
    "memcheck": ["--leak-check", "no", "--print-limit", "20", "--show-backtrace", "device"],
    "racecheck": ["--racecheck-report", "hazard", "--print-limit", "20", "--show-backtrace", "device"],
}
ERROR_EXITCODE = 99


def sanitizer_command(tool: str, python_args: list[str]) -> list[str]:
    exe = find_compute_sanitizer()
    if exe is None:
        raise FileNotFoundError(
            "compute-sanitizer not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin"
        )
    return [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), *SANITIZER_OPTIONS[tool],
            sys.executable, *python_args]  # fmt: skip


def run_under(tool: str, python_args: list[str], timeout: float = 600) -> tuple[int, str, float]:
    """Run `python <python_args>` under compute-sanitizer's `tool`, each tensor its own cudaMalloc.
    Returns (exit code, stdout + stderr, wall seconds)."""
    env = dict(_package_env(), PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    start = time.perf_counter()
    done = subprocess.run(
        sanitizer_command(tool, python_args), env=env, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def _load_extra(path: str) -> None:
    """Import a file that registers more entries (a test's planted bug)."""
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m labkernels.sanitize", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--only", help="run the entries whose name matches this regex")
    parser.add_argument("--list", action="store_true", help="list the entries and the ops each covers")
    parser.add_argument("--shared-memory", action="store_true", help="only the entries with shared memory")
    parser.add_argument(
        "--tool", choices=sorted(SANITIZER_OPTIONS), help="re-run this under compute-sanitizer"
    )
    parser.add_argument("--extra", action="append", default=[], help="a .py file registering more entries")
    parser.add_argument("--check-kernels", action="store_true", help="fail if a Triton kernel never launched")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="run each entry in its own process, this many at a time (no --tool)",
    )
    args = parser.parse_args(argv)
    if args.jobs > 1 and (args.tool or args.check_kernels):
        parser.error("--jobs runs entries in separate processes: use it without --tool and --check-kernels")
    for path in args.extra:
        _load_extra(path)
    entries = selected(args.only, args.shared_memory)
    if args.list:
        for e in entries:
            flags = " [shared memory]" if e.shared_memory else ""
            print(f"{e.name:<28}{flags} {', '.join(e.covers)}")
        return 0
    if args.tool:
        inner = ["-m", "labkernels.sanitize", *(a for a in (argv or sys.argv[1:]))]
        inner = [a for i, a in enumerate(inner) if a != "--tool" and (i == 0 or inner[i - 1] != "--tool")]
        rc, output, seconds = run_under(args.tool, inner)
        print(output, end="")
        print(f"compute-sanitizer --tool {args.tool}: exit {rc}, {seconds:.1f} s")
        return rc
    if args.jobs > 1:
        results = run_in_parallel(entries, args.jobs, args.extra)
        failed = [name for name, _, error in results if error]
        print(
            f"{len(results) - len(failed)}/{len(results)} entries ok, one process each, {args.jobs} at a time"
        )
        return 1 if failed else 0
    results = run_entries(entries)
    failed = [name for name, _, error in results if error]
    missed = sorted(set(kernels()) - LAUNCHED - (set() if on_gpu() else GPU_ONLY_KERNELS))
    missed = missed if args.check_kernels else []
    if missed:
        print(f"FAIL kernels never launched: {', '.join(missed)}")
    print(f"{len(results) - len(failed)}/{len(results)} entries ok, {sum(s for _, s, _ in results):.1f} s")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    # Run the imported module's main: `--extra` files register into `labkernels.sanitize.REGISTRY`, which is
    # not this `__main__` copy's.
    from labkernels import sanitize

    sys.exit(sanitize.main())
