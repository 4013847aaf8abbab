"""Chapter 04's implicit-GEMM convolution against cuDNN (channels_last, fp16, cudnn.benchmark on).

1. every shape of the ch04_conv benchmark: cuDNN, `conv2d_nhwc` with thin launches (`labkernels.launch_cache`)
   and with them off (Triton's own per-call Python), each in plain calls (do_bench, as a user calls it) and
   CUDA-graph replays (the GPU time alone), plus the host time of one call into an idle queue;
2. for the two shapes furthest behind in graph replays (C=512 at 7^2: 52 tiles of 128 x 128 for 132 SMs; C=128
   at 28^2: 196 tiles, 1.48 waves): a sweep of `_conv_kernel` configs launched directly (tiles 64/128 x
   64/128, BLOCK_SIZE_K 64/128, 3-6 stages, 4/8 warps; those that fit shared memory);
3. split-K for C=512 at 7^2 (K_gemm = 9 x 512 = 4608 is deep, the tiles few): program (tile, split) sums
   the K-steps [split x steps / SPLIT, (split + 1) x steps / SPLIT) of its tile, then
   - "last": stores its fp32 partial, counts itself in with an atomic; the tile's last program adds the
     SPLIT partials in split order (bitwise the same whoever is last), stores y, resets the count: one launch;
   - "partials": stores its partial; a second kernel adds them in split order and casts (chapter 04's
     deterministic split-K);
   - "atomic": fp32 atomics into a workspace; a second kernel casts it and zeroes it for the next call.
4. --tma, instead of 2 and 3: A's tiles by TMA copies, for every 3x3 stride-1 "same" shape, in two kernels:
   `_conv_tma_kernel` (x as (N*H*W, C): one copy per tap, the padding rows zeroed in registers) and
   `_conv_box_kernel` (x as (N, H, W, C): a box of pixels per tap, the padding zero-filled by the copy).
   Found on the H200 (triton 3.6): the box kernel with descriptors built on the host was the fastest
   convolution, but some of its configs gave wrong results in some runs and not in others (whole boxes of
   outputs off, no NaN), in every variant of descriptors, store and filter layout. The reshaped box reaches
   wgmma from registers, and Triton leaves a step's MMAs running while the next step loads new values into
   those registers; with SYNC (a use of acc each step, so the compiler waits for the MMAs) every config was
   right in every run (`conv_box_diagnose.py`). The package's `conv._conv_box_kernel` is this kernel with
   that wait, host descriptors and pointer stores. The register kernel is slower than the box kernel
   everywhere and is no longer timed.
Every result is checked against the fp64 reference (`conv.reference`): rel_err = max |y - ref| / max |ref|,
ok = within atol 2e-2 x sqrt(fan-in), rtol 5e-3 (the tests' fp16 tolerance). Table on stdout, CSV in
$OUT/conv_variants/results.csv. The sweep's kernels are compiled first, in parallel worker processes (a cold
Triton cache would otherwise spend most of the budget compiling one kernel after another).

    python experiments/conv_variants.py            # GPU
    python experiments/conv_variants.py --smoke    # CPU lane (interpreter): tiny fp32 shapes, checks only
    python experiments/conv_variants.py --tma      # GPU: the TMA kernels' configs (item 4)
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import concurrent.futures
import csv
import multiprocessing
import os
import statistics
import sys
import time
import traceback

import torch

import labkernels  # noqa: F401
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton.matmul import _tile_coordinates
from labkernels.ch04_libraries import conv
from labkernels.ch04_libraries.bench_kernels import CONV_SHAPES, MODES
from labkernels.lane import DEVICE, on_gpu

SWEEP_SHAPES = [(32, 512, 7, 512, 3, 1, 1), (32, 128, 28, 128, 3, 1, 1)]  # furthest behind cuDNN in graphs
SPLIT_SHAPES = [(32, 512, 7, 512, 3, 1, 1)]
TOL = {torch.float16: (2e-2, 5e-3), torch.float32: (1e-4, 1e-5)}  # atol (x sqrt(fan-in)), rtol
_empty = torch.empty  # the outputs' allocator: --smoke fills them with NaN, so a skipped tile shows
FIELDS = [
    "batch", "c", "size", "k_out", "r", "stride", "padding", "impl", "config",
    "ms_plain", "ms_graph", "host_us", "x_cudnn_plain", "x_cudnn_graph", "rel_err", "ok", "error",
]  # fmt: skip


# --- TMA loads (stride 1, "same" padding) -------------------------------------------------------------------
# With stride 1 and P = H, Q = W, output pixel m and its input pixel under tap (r, s) differ by a constant in
# the flattened NHWC index: m + (r - pad) * W + (s - pad). So the A tile of tap (r, s) is BLOCK_SIZE_M
# *consecutive* rows of x viewed as (N*H*W, C): one TMA copy, no per-row addresses. Rows whose tap falls in
# the padding read a neighbouring pixel (or zeros, past either end of x); `tl.where` zeroes them in registers,
# so wgmma takes A from registers and B (the filters, K-major) from shared memory.


@triton.jit
def _filter_descriptor(w_ptr, K_OUT, RSC, B_KN: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                       BLOCK_SIZE_K: tl.constexpr):  # fmt: skip
    """B_KN: the filters transposed to (R*S*C, K_out), B's tiles loaded as the matmul's TMA kernel loads
    them; otherwise (K_out, R*S*C), each tile turned around (a transposed view, no copy)."""
    if B_KN:
        desc = tl.make_tensor_descriptor(w_ptr, [RSC, K_OUT], [K_OUT, 1], [BLOCK_SIZE_K, BLOCK_SIZE_N])
    else:
        desc = tl.make_tensor_descriptor(w_ptr, [K_OUT, RSC], [RSC, 1], [BLOCK_SIZE_N, BLOCK_SIZE_K])
    return desc


@triton.jit
def _filter_tile(w_desc, n0, k0, B_KN: tl.constexpr):
    if B_KN:
        b = w_desc.load([k0, n0])
    else:
        b = w_desc.load([n0, k0]).T
    return b


@triton.jit
def _conv_tma_kernel(
    x_ptr, w_ptr, y_ptr,
    BATCH, H, W, C, K_OUT,
    R: tl.constexpr, S: tl.constexpr, PADDING: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, C_CHUNKS: tl.constexpr, B_KN: tl.constexpr,
):  # fmt: skip
    # C_CHUNKS = cdiv(C, BLOCK_SIZE_K) as a constexpr: with a trip count the compiler cannot prove nonzero,
    # ptxas serializes the wgmmas (warning C7515: the zero-trip path sets the accumulator with plain moves)
    M = BATCH * H * W
    RSC = R * S * C
    x_desc = tl.make_tensor_descriptor(x_ptr, [M, C], [C, 1], [BLOCK_SIZE_M, BLOCK_SIZE_K])
    w_desc = _filter_descriptor(w_ptr, K_OUT, RSC, B_KN, BLOCK_SIZE_N, BLOCK_SIZE_K)
    y_desc = tl.make_tensor_descriptor(y_ptr, [M, K_OUT], [K_OUT, 1], [BLOCK_SIZE_M, BLOCK_SIZE_N])
    pid_m, pid_n = _tile_coordinates(
        tl.program_id(axis=0), M, K_OUT, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M
    )
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    h = offs_m % (H * W) // W
    w = offs_m % W
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for step in range(R * S * C_CHUNKS):
        tap = step // C_CHUNKS
        c0 = (step % C_CHUNKS) * BLOCK_SIZE_K
        dh = tap // S - PADDING
        dw = tap % S - PADDING
        a = x_desc.load([pid_m * BLOCK_SIZE_M + dh * W + dw, c0])  # read BM x BK (L2 after the first tap)
        inside = (h + dh >= 0) & (h + dh < H) & (w + dw >= 0) & (w + dw < W)
        a = tl.where(inside[:, None], a, tl.zeros_like(a))
        b = _filter_tile(w_desc, pid_n * BLOCK_SIZE_N, tap * C + c0, B_KN)  # read BK x BN
        acc = tl.dot(a, b, acc, input_precision="ieee")
    y = acc.to(y_ptr.dtype.element_ty)
    y_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], y)  # write BM x BN, clipped at the edges


# The same with the padding done by the TMA unit: x as a 4-D (N, H, W, C) tensor and A's tile a box of
# IMG images x BH x BW pixels x BLOCK_SIZE_K channels, at (n0, h0 + r - pad, w0 + s - pad, c0). The box's
# parts outside x (the padding) arrive as zeros, so A goes from shared memory to wgmma untouched. The price: a
# box is a power of two along each axis, so where H or W is not a multiple of BH or BW, part of the last
# boxes computes pixels that do not exist (the store clips them).


@triton.jit
def _conv_box_kernel(
    x_ptr, w_ptr, y_ptr,
    BATCH, H, W, C, K_OUT,
    R: tl.constexpr, S: tl.constexpr, PADDING: tl.constexpr,
    IMG: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    C_CHUNKS: tl.constexpr, B_KN: tl.constexpr, STORE_TMA: tl.constexpr, SYNC: tl.constexpr,
):  # fmt: skip
    """Descriptors built by each program, on the device."""
    x_desc = tl.make_tensor_descriptor(
        x_ptr, [BATCH, H, W, C], [H * W * C, W * C, C, 1], [IMG, BH, BW, BLOCK_SIZE_K]
    )
    w_desc = _filter_descriptor(w_ptr, K_OUT, R * S * C, B_KN, BLOCK_SIZE_N, BLOCK_SIZE_K)
    y_desc = tl.make_tensor_descriptor(
        y_ptr, [BATCH, H, W, K_OUT], [H * W * K_OUT, W * K_OUT, K_OUT, 1], [IMG, BH, BW, BLOCK_SIZE_N]
    )
    _box_program(
        x_desc, w_desc, y_desc, y_ptr, BATCH, H, W, C, K_OUT, R, S, PADDING, IMG, BH, BW,
        BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, C_CHUNKS, B_KN, STORE_TMA, SYNC,
    )  # fmt: skip


@triton.jit
def _conv_box_host_kernel(
    x_desc, w_desc, y_desc, y_ptr,
    BATCH, H, W, C, K_OUT,
    R: tl.constexpr, S: tl.constexpr, PADDING: tl.constexpr,
    IMG: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    C_CHUNKS: tl.constexpr, B_KN: tl.constexpr, STORE_TMA: tl.constexpr, SYNC: tl.constexpr,
):  # fmt: skip
    """Descriptors built on the host (`TensorDescriptor`), passed as kernel parameters."""
    _box_program(
        x_desc, w_desc, y_desc, y_ptr, BATCH, H, W, C, K_OUT, R, S, PADDING, IMG, BH, BW,
        BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, C_CHUNKS, B_KN, STORE_TMA, SYNC,
    )  # fmt: skip


@triton.jit
def _box_program(
    x_desc, w_desc, y_desc, y_ptr,
    BATCH, H, W, C, K_OUT,
    R: tl.constexpr, S: tl.constexpr, PADDING: tl.constexpr,
    IMG: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    C_CHUNKS: tl.constexpr, B_KN: tl.constexpr, STORE_TMA: tl.constexpr, SYNC: tl.constexpr,
):  # fmt: skip
    BLOCK_SIZE_M: tl.constexpr = IMG * BH * BW
    boxes_h = tl.cdiv(H, BH)
    boxes_w = tl.cdiv(W, BW)
    boxes = tl.cdiv(BATCH, IMG) * boxes_h * boxes_w
    box, pid_n = _tile_coordinates(
        tl.program_id(axis=0), boxes * BLOCK_SIZE_M, K_OUT, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M
    )
    n0 = box // (boxes_h * boxes_w) * IMG
    h0 = box // boxes_w % boxes_h * BH
    w0 = box % boxes_w * BW
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for step in range(R * S * C_CHUNKS):
        tap = step // C_CHUNKS
        c0 = (step % C_CHUNKS) * BLOCK_SIZE_K
        a = x_desc.load([n0, h0 + tap // S - PADDING, w0 + tap % S - PADDING, c0])  # read IMG x BH x BW x BK
        b = _filter_tile(w_desc, pid_n * BLOCK_SIZE_N, tap * C + c0, B_KN)  # read BK x BN
        acc = tl.dot(a.reshape(BLOCK_SIZE_M, BLOCK_SIZE_K), b, acc, input_precision="ieee")
        if SYNC:  # a use of acc outside the MMAs: the compiler waits for this step's MMAs before it
            acc = acc + 0.0
    y = acc.to(y_ptr.dtype.element_ty)
    if STORE_TMA:
        y = y.reshape(IMG, BH, BW, BLOCK_SIZE_N)
        y_desc.store([n0, h0, w0, pid_n * BLOCK_SIZE_N], y)  # write BM x BN, clipped at the edges
    else:
        rows = tl.arange(0, BLOCK_SIZE_M)
        n = n0 + rows // (BH * BW)
        h = h0 + rows // BW % BH
        w = w0 + rows % BW
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        pixel = ((n * H + h) * W + w).to(tl.int64)
        inside = (n < BATCH) & (h < H) & (w < W)
        y_ptrs = y_ptr + pixel[:, None] * K_OUT + offs_n[None, :]
        tl.store(y_ptrs, y, mask=inside[:, None] & (offs_n[None, :] < K_OUT))  # write BM x BN


def boxes_for(shape, gpu: bool = True) -> list[tuple]:
    """(IMG, BH, BW) boxes of 64 / 128 / 256 pixels (16 / 32 under the interpreter) that waste least."""
    batch, c, size, k_out, r, stride, padding = shape
    out = []
    for pixels in (64, 128) if gpu else (16, 32):
        cands = []
        for bh in (1, 2, 4, 8, 16):
            for bw in (1, 2, 4, 8, 16, 32):
                img = pixels // (bh * bw)
                if img < 1 or img * bh * bw != pixels or img > triton.next_power_of_2(batch):
                    continue
                rows, cols = triton.cdiv(size, bh) * bh, triton.cdiv(size, bw) * bw
                padded = triton.cdiv(batch, img) * img * rows * cols
                cands.append((padded / (batch * size * size), -bw, (img, bh, bw)))
        out += [box for _, _, box in sorted(cands)[:2]]
    return out


BOX_MODES = (("device", True), ("device", False), ("host", True), ("host", False))  # descriptors, TMA store


def box_configs(shape, gpu: bool = True) -> list[tuple]:
    """(img, bh, bw, bn, bk, stages, warps, b_kn, descriptors, store_tma) for the box kernel: the tiles the
    last run found fastest or wrong, in every combination of the filters' layout, where the descriptors
    are built, and how y is stored."""
    if not gpu:
        tiles = [(*box, 16, 16, 1, 4) for box in boxes_for(shape, gpu=False)][:1]
    else:
        tiles = BOX_TILES.get(shape[1], [])
    return [(*t, kn, *mode) for t in tiles for kn in (False, True) for mode in BOX_MODES]


BOX_TILES = {  # C -> (img, bh, bw, bn, bk, stages, warps)
    64: [(2, 8, 8, 64, 64, 3, 4), (4, 4, 8, 64, 64, 3, 4), (2, 8, 8, 64, 64, 3, 8)],
    128: [(8, 4, 4, 128, 64, 3, 4), (16, 2, 4, 128, 64, 3, 4), (8, 4, 4, 128, 64, 3, 8),
          (4, 4, 4, 128, 64, 3, 4)],
    256: [(32, 1, 2, 256, 64, 4, 4), (16, 2, 2, 256, 64, 3, 4), (32, 2, 2, 256, 64, 3, 8),
          (32, 1, 2, 256, 128, 3, 4), (32, 2, 2, 128, 64, 3, 8)],
    512: [(16, 1, 4, 128, 128, 4, 4), (8, 1, 8, 128, 128, 4, 4), (16, 1, 4, 128, 64, 4, 4),
          (16, 1, 8, 256, 64, 3, 8), (16, 1, 4, 256, 128, 3, 4)],
}  # fmt: skip


def _box_meta(
    shape, img, bh, bw, bn, bk, stages, warps, b_kn=False, descriptors="device", store_tma=True, sync=False
):
    batch, c, size, k_out, r, stride, padding = shape
    return dict(
        R=r, S=r, PADDING=padding, IMG=img, BH=bh, BW=bw, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
        C_CHUNKS=triton.cdiv(c, bk), B_KN=b_kn, STORE_TMA=store_tma, SYNC=sync, HOST=descriptors == "host",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def box_call(x, w, shape, meta):
    batch, c, size, k_out, r, stride, padding = shape
    w_for = filters_for(w, meta)
    boxes = (
        triton.cdiv(batch, meta["IMG"]) * triton.cdiv(size, meta["BH"]) * triton.cdiv(size, meta["BW"])
    )
    grid = (boxes * triton.cdiv(k_out, meta["BLOCK_SIZE_N"]),)
    options = {k: v for k, v in meta.items() if k != "HOST"}

    def call():
        y = _empty((batch, size, size, k_out), device=x.device, dtype=x.dtype)
        if meta["HOST"]:
            descs = _host_descriptors(x, w_for, y, meta)
            _conv_box_host_kernel[grid](*descs, y, batch, size, size, c, k_out, **options)
        else:
            _conv_box_kernel[grid](x, w_for, y, batch, size, size, c, k_out, **options)
        return y

    return call


def _host_descriptors(x, w_for, y, meta) -> tuple:
    from triton.tools.tensor_descriptor import TensorDescriptor

    box, bn, bk = [meta["IMG"], meta["BH"], meta["BW"]], meta["BLOCK_SIZE_N"], meta["BLOCK_SIZE_K"]
    w_block = [bk, bn] if meta["B_KN"] else [bn, bk]
    return (
        TensorDescriptor.from_tensor(x, box + [bk]),
        TensorDescriptor.from_tensor(w_for.reshape(w_for.shape[0], -1), w_block),
        TensorDescriptor.from_tensor(y, box + [bn]),
    )


def _fmt_box(meta: dict) -> str:
    return (
        f"{meta['IMG']}x{meta['BH']}x{meta['BW']} n{meta['BLOCK_SIZE_N']} k{meta['BLOCK_SIZE_K']} "
        f"s{meta['num_stages']} w{meta['num_warps']}" + (" kn" if meta["B_KN"] else " nk")
        + (" host" if meta["HOST"] else " dev") + (" tma-st" if meta["STORE_TMA"] else " ptr-st")
    )


def _fmt_tma(meta: dict) -> str:
    return _fmt(meta) + (" kn" if meta["B_KN"] else " nk")


def poisoned_checks(call, ref, fan_in: int, times: int = 5) -> None:
    """Run `call` `times` times with its output poisoned (NaN) first; raise if any result is wrong."""
    global _empty
    saved, _empty = _empty, lambda *a, **k: torch.full(*a[:1], float("nan"), **k)
    try:
        bad = sum(not close(call(), ref, fan_in) for _ in range(times))
    finally:
        _empty = saved
    if bad:
        raise RuntimeError(f"wrong result in {bad} of {times} poisoned runs: not timed")


def tma_supported(shape) -> bool:
    batch, c, size, k_out, r, stride, padding = shape
    return stride == 1 and conv.output_size(size, r, stride, padding) == size


def _fits(bm: int, bn: int, bk: int, stages: int) -> bool:
    return stages * (bm + bn) * bk * 2 <= conv.SHARED_MEMORY_BYTES - 16 * 1024  # room for A's or y's copy


def _depths(shape) -> list[tuple]:
    """(bk, stages): 64-channel steps in 3 or 4 stages; for C >= 256 (the long K loops) also 5, and
    128-channel steps in 3 or 4."""
    if shape[1] < 256:
        return [(64, 3), (64, 4)]
    return [(64, 3), (64, 4), (64, 5), (128, 3), (128, 4)]


def tma_configs(shape, gpu: bool = True) -> list[tuple]:
    """(bm, bn, bk, stages, warps, b_kn) for the TMA kernel: tiles no wider than K_out."""
    if not gpu:
        return [(16, 16, 16, 1, 4, kn) for kn in (False, True)] + [(32, 16, 16, 1, 4, False)]
    # measured slower than the box kernel on every shape (0.44-0.78x cuDNN): not run any more on the GPU
    return []


def _tma_meta(shape, bm, bn, bk, stages, warps, b_kn=False) -> dict:
    batch, c, size, k_out, r, stride, padding = shape
    return dict(
        R=r, S=r, PADDING=padding, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
        C_CHUNKS=triton.cdiv(c, bk), B_KN=b_kn, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def filters_for(w: torch.Tensor, meta: dict) -> torch.Tensor:
    """(K_out, R, S, C) filters, or (R*S*C, K_out) for B_KN (a copy made once, outside the timed call)."""
    return w.reshape(w.shape[0], -1).T.contiguous() if meta["B_KN"] else w


def tma_call(x, w, shape, meta):
    batch, c, size, k_out, r, stride, padding = shape
    w_for = filters_for(w, meta)
    tiles_m = triton.cdiv(batch * size * size, meta["BLOCK_SIZE_M"])
    grid = (tiles_m * triton.cdiv(k_out, meta["BLOCK_SIZE_N"]),)

    def call():
        y = _empty((batch, size, size, k_out), device=x.device, dtype=x.dtype)
        _conv_tma_kernel[grid](x, w_for, y, batch, size, size, c, k_out, **meta)
        return y

    return call


# --- split-K ------------------------------------------------------------------------------------------------


@triton.jit
def _conv_steps(
    x_ptr, w_ptr, offs_m, offs_n, lo, hi, H, W, C, P, Q, K_OUT, M,
    R: tl.constexpr, S: tl.constexpr, STRIDE: tl.constexpr, PADDING: tl.constexpr, EVEN_C: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
):  # fmt: skip
    """fp32 sum over the flat (tap, channel chunk) steps [lo, hi) of one tile: `_conv_kernel`'s loop."""
    row_valid = offs_m < M
    n_img = offs_m // (P * Q)
    h_top = (offs_m % (P * Q)) // Q * STRIDE - PADDING
    w_left = offs_m % Q * STRIDE - PADDING
    pixel = (n_img * H + h_top) * W + w_left
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    w_rows = w_ptr + (offs_n % K_OUT)[None, :] * (R * S * C)
    c_chunks = tl.cdiv(C, BLOCK_SIZE_K)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for step in range(lo, hi):
        tap = step // c_chunks
        c0 = (step % c_chunks) * BLOCK_SIZE_K
        r = tap // S
        s = tap % S
        h = h_top + r
        w = w_left + s
        inside = row_valid & (h >= 0) & (h < H) & (w >= 0) & (w < W)
        a_ptrs = x_ptr + (pixel + r * W + s)[:, None] * C + (c0 + offs_k)[None, :]  # (BM, BK)
        b_ptrs = w_rows + (tap * C + c0 + offs_k)[:, None]  # (BK, BN)
        if EVEN_C:
            a = tl.load(a_ptrs, mask=inside[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            c_valid = c0 + offs_k < C
            a = tl.load(a_ptrs, mask=inside[:, None] & c_valid[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=c_valid[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def _conv_split_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, count_ptr,
    BATCH, H, W, C, P, Q, K_OUT,
    R: tl.constexpr, S: tl.constexpr, STRIDE: tl.constexpr, PADDING: tl.constexpr, EVEN_C: tl.constexpr,
    SPLIT: tl.constexpr, MODE: tl.constexpr,  # "last", "partials" or "atomic"
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):  # fmt: skip
    M = BATCH * P * Q
    tile = tl.program_id(axis=0)
    split = tl.program_id(axis=1)
    pid_m, pid_n = _tile_coordinates(tile, M, K_OUT, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    steps = R * S * tl.cdiv(C, BLOCK_SIZE_K)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    acc = _conv_steps(
        x_ptr, w_ptr, offs_m, offs_n, split * steps // SPLIT, (split + 1) * steps // SPLIT,
        H, W, C, P, Q, K_OUT, M, R, S, STRIDE, PADDING, EVEN_C, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
    )  # fmt: skip
    mask = (offs_m < M)[:, None] & (offs_n < K_OUT)[None, :]
    out = offs_m[:, None] * K_OUT + offs_n[None, :]
    if MODE == "atomic":
        tl.atomic_add(ws_ptr + out, acc, mask=mask, sem="relaxed")  # read + write MN fp32 in L2
    else:
        tl.store(ws_ptr + split * (M * K_OUT) + out, acc, mask=mask)  # write the partial, MN fp32 per split
        if MODE == "last":
            tl.debug_barrier()  # every thread's part of the partial is written before the count says so
            arrived = tl.atomic_add(
                count_ptr + tile, 1
            )  # acq_rel: the earlier programs' partials are visible
            if arrived == SPLIT - 1:
                total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for s in range(SPLIT):  # in split order: bitwise the same whichever program is last
                    total += tl.load(
                        ws_ptr + s * (M * K_OUT) + out, mask=mask, other=0.0, cache_modifier=".cg"
                    )
                tl.store(y_ptr + out, total.to(y_ptr.dtype.element_ty), mask=mask)  # write MN
                tl.atomic_xchg(count_ptr + tile, 0)  # counted out: ready for the next launch (graph replays)


@triton.jit
def _sum_splits_kernel(ws_ptr, c_ptr, MN, SPLIT, BLOCK: tl.constexpr):
    """C = ws[0] + ws[1] + ... in that order (bitwise reproducible), cast to C's dtype; C contiguous. (The
    second kernel of chapter 04's first split-K, which now adds its partials in the same launch.)"""
    offs = tl.program_id(axis=0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):
        acc += tl.load(ws_ptr + s * MN + offs, mask=mask, other=0.0)  # read split x MN fp32
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)  # write MN


@triton.jit
def _cast_and_zero_kernel(ws_ptr, y_ptr, MN, BLOCK: tl.constexpr):
    """y = ws cast to y's dtype; ws = 0 again, so the next call's atomics need no memset launch."""
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    tl.store(y_ptr + offs, tl.load(ws_ptr + offs, mask=mask).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(ws_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=mask)


class SplitConv:
    """y = conv(x, w) (stride 1, no bias) by `_conv_split_kernel`; workspaces kept across calls."""

    def __init__(self, x, w, shape, bm, bn, bk, stages, warps, split, mode):
        self.x, self.w, self.ints = x, w, _ints(shape)
        batch, H, W, C, P, Q, k_out = self.ints
        self.y_shape, M = (batch, P, Q, k_out), batch * P * Q
        self.meta = self.launch_meta(shape, bm, bn, bk, stages, warps, split, mode)
        tiles = triton.cdiv(M, bm) * triton.cdiv(k_out, bn)
        self.grid = (tiles, split)
        self.mode, self.split = mode, split
        slots = 1 if mode == "atomic" else split
        self.ws = torch.zeros((slots, M, k_out), device=x.device, dtype=torch.float32)
        self.count = torch.zeros(tiles, device=x.device, dtype=torch.int32)

    @staticmethod
    def launch_meta(shape, bm, bn, bk, stages, warps, split, mode) -> dict:
        batch, c, size, k_out, r, stride, padding = shape
        assert stride == 1, "the split-K variant is written for stride 1"
        return dict(
            R=r, S=r, STRIDE=1, PADDING=padding, EVEN_C=c % bk == 0, SPLIT=split, MODE=mode,
            BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
            num_warps=warps, num_stages=stages,
        )  # fmt: skip

    def __call__(self):
        y = _empty(self.y_shape, device=self.x.device, dtype=self.x.dtype)
        args = (self.x, self.w, y, self.ws, self.count, *self.ints)
        _conv_split_kernel[self.grid](*args, **self.meta)  # read x, w; write (+ read) split x MN fp32
        block = 1024 if on_gpu() else 4096
        if self.mode == "partials":
            _sum_splits_kernel[(triton.cdiv(y.numel(), block),)](
                self.ws, y, y.numel(), self.split, BLOCK=block
            )
        elif self.mode == "atomic":
            _cast_and_zero_kernel[(triton.cdiv(y.numel(), block),)](self.ws, y, y.numel(), BLOCK=block)
        return y


# --- the direct launch of `_conv_kernel` with explicit constexprs -----------------------------------------


SWEEP_TILES = ((64, 64), (64, 128), (128, 64), (128, 128))
SPLITS = True  # run the split-K variants (off with --sweep-c)
TMA = False  # --tma: the TMA kernel's configs on every shape it supports, instead of the sweep and split-K


def sweep_configs(element_size: int, tiles=None) -> list[tuple]:
    """(bm, bn, bk, stages, warps) whose pipelined tiles fit shared memory."""
    tiles = SWEEP_TILES if tiles is None else tiles
    out = []
    for bm, bn in tiles:
        for bk in (64, 128):
            for stages in (3, 4, 5, 6):
                if stages * (bm * bk + bk * bn) * element_size > conv.SHARED_MEMORY_BYTES:
                    continue
                out += [(bm, bn, bk, stages, warps) for warps in (4, 8)]
    return out


def _direct_meta(shape, bm, bn, bk, stages, warps) -> dict:
    batch, c, size, k_out, r, stride, padding = shape
    return dict(
        R=r, S=r, STRIDE=stride, PADDING=padding, HAS_BIAS=False, EVEN_C=c % bk == 0, BIG=False,
        BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _ints(shape) -> tuple:
    batch, c, size, k_out, r, stride, padding = shape
    p = conv.output_size(size, r, stride, padding)
    return (batch, size, size, c, p, p, k_out)


def direct_call(x, w, shape, meta):
    batch, c, size, k_out, r, stride, padding = shape
    ints = _ints(shape)
    grid = (
        triton.cdiv(batch * ints[4] * ints[5], meta["BLOCK_SIZE_M"])
        * triton.cdiv(k_out, meta["BLOCK_SIZE_N"]),
    )

    def call():
        y = _empty((batch, ints[4], ints[5], k_out), device=x.device, dtype=x.dtype)
        conv._conv_kernel[grid](x, w, y, y, *ints, **meta)
        return y

    return call


def _autotune_metas(shape) -> list[dict]:
    """The launch options of every config the autotuner will time for this shape (after its pruning)."""
    batch, c, size, k_out, r, stride, padding = shape
    ints = _ints(shape)
    named = dict(zip(("BATCH", "H", "W", "C", "P", "Q", "K_OUT"), ints, strict=True))
    named["x_ptr"] = torch.empty(1, device=DEVICE, dtype=torch.float16)
    options = dict(R=r, S=r, STRIDE=stride, PADDING=padding, HAS_BIAS=False, BIG=False)
    metas = []
    for cfg in conv._prune(conv.GPU_CONFIGS, named):
        meta = cfg.all_kwargs() | options
        meta["EVEN_C"] = c % meta["BLOCK_SIZE_K"] == 0
        metas.append(meta)
    return metas


# --- compiling ahead, in worker processes (they only fill Triton's on-disk cache) ---------------------------


def _warm(job) -> str | None:
    kind, ints, meta = job
    f16 = torch.float16
    try:
        if kind == "conv":
            conv._conv_kernel.warmup(f16, f16, f16, f16, *ints, grid=(1,), **meta)
        elif kind == "tma":
            _conv_tma_kernel.warmup(f16, f16, f16, *ints, grid=(1,), **meta)
        elif kind == "box" and not meta["HOST"]:
            options = {k: v for k, v in meta.items() if k != "HOST"}
            _conv_box_kernel.warmup(f16, f16, f16, *ints, grid=(1,), **options)
        else:
            _conv_split_kernel.warmup(f16, f16, f16, torch.float32, torch.int32, *ints, grid=(1, 1), **meta)
        return None
    except Exception as exc:
        return f"{kind} {meta}: {type(exc).__name__}: {exc}"[:300]


def _error_of(future) -> str | None:
    try:
        return future.result()
    except Exception as exc:  # a worker died: its kernels compile here, when launched
        return f"{type(exc).__name__}: {exc}"[:300]


def _tma_ints(shape) -> tuple:
    batch, c, size, k_out, r, stride, padding = shape
    return (batch, size, size, c, k_out)


def _compile_jobs() -> list[tuple]:
    jobs = [("conv", _ints(shape), meta) for shape in CONV_SHAPES for meta in _autotune_metas(shape)]
    if TMA:
        tma_shapes = [s for s in CONV_SHAPES if tma_supported(s) and s[4] == 3]
        jobs += [("tma", _tma_ints(s), _tma_meta(s, *cfg)) for s in tma_shapes for cfg in tma_configs(s)]
        jobs += [("box", _tma_ints(s), _box_meta(s, *cfg)) for s in tma_shapes for cfg in box_configs(s)]
        return _unique(jobs)
    for shape in SWEEP_SHAPES:
        jobs += [("conv", _ints(shape), _direct_meta(shape, *cfg)) for cfg in sweep_configs(2)]
    for v in split_variants() if SPLITS else ():
        jobs += [("split", _ints(shape), SplitConv.launch_meta(shape, *v)) for shape in SPLIT_SHAPES]
    return _unique(jobs)


def _unique(jobs: list[tuple]) -> list[tuple]:
    unique = {}
    for job in jobs:
        unique.setdefault((job[0], job[1], tuple(sorted(job[2].items(), key=str))), job)
    return list(unique.values())


def split_variants(gpu: bool = True) -> list[tuple]:
    """(bm, bn, bk, stages, warps, split, mode): the one-launch "last" over several tiles, the two-launch
    modes on 128 x 128 tiles."""
    if not gpu:
        return [(16, 16, 16, 1, 4, s, m) for s in (2, 3) for m in ("last", "partials", "atomic")] + [
            (32, 16, 16, 1, 4, 4, "last")
        ]
    tiles = (
        (128, 128, 64, 3, 8),
        (128, 128, 64, 4, 8),
        (64, 128, 64, 4, 4),
        (64, 128, 64, 3, 4),
        (128, 64, 64, 4, 4),
    )
    out = [(*t, s, "last") for t in tiles for s in (2, 3, 4)]
    # 64 x 128 tiles in 3 or 2 stages (72 / 48 KiB): three or four programs per SM, so up to ~400 programs of
    # (tile, split) run at once and a split count can fill the SMs evenly
    out += [(64, 128, 64, 3, 4, s, "last") for s in (5, 6)]
    out += [(64, 128, 64, 2, 4, s, "last") for s in (2, 3, 4, 5, 6)]
    # big tiles re-read less of x and w through L2; the partials summed by a second kernel over every SM
    out += [(*t, s, "partials") for t in ((128, 256, 64, 3, 8), (256, 128, 64, 3, 8)) for s in (2, 3, 4)]
    out += [(128, 128, 64, 3, 8, s, m) for m in ("partials", "atomic") for s in (2, 3, 4)]
    return out


# --- checks and timings -------------------------------------------------------------------------------------


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def close(y: torch.Tensor, ref: torch.Tensor, fan_in: int) -> bool:
    atol, rtol = TOL[y.dtype]
    return bool(torch.allclose(y.double(), ref, atol=atol * fan_in**0.5, rtol=rtol)) and not y.isnan().any()


def host_us(fn, calls: int = 200) -> float:
    """Host time of one call into an idle queue (synchronized before each): the Python and launch cost."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


class Thin:
    """Thin launches on or off inside the block (every cached launcher dropped on each switch)."""

    def __init__(self, flag: bool):
        self.flag = flag

    def __enter__(self):
        launch_cache.set_enabled(self.flag)

    def __exit__(self, *exc):
        launch_cache.set_enabled(launch_cache.enabled_from_env())


def measure(row: dict, fn, ref, fan_in, timed: bool, plain: bool = True) -> torch.Tensor | None:
    """Check fn() against ref; then (timed) the plain and graph medians, and the host time."""
    y = fn()
    if on_gpu():
        torch.cuda.synchronize()
    row["rel_err"] = rel_err(y, ref)
    row["ok"] = close(y, ref, fan_in)
    if not timed:
        return y
    if not row["ok"]:
        raise RuntimeError(f"wrong result (rel_err {row['rel_err']:.2e}): not timed")
    # as the ch04_conv benchmark: two rounds for the comparisons with cuDNN, one for the sweep and split-K
    modes, rounds = (("plain", "graph"), 2) if plain else (("graph",), 1)
    times = {mode: statistics.median(MODES[mode](fn) for _ in range(rounds)) for mode in modes}
    row["ms_graph"] = times["graph"]
    if plain:
        row["ms_plain"] = times["plain"]
        row["host_us"] = host_us(fn)
    return y


def _print_header() -> None:
    print(
        f"{'shape':24} {'impl':20} {'config':26} {'plain ms':>9} {'graph ms':>9} {'host us':>8} "
        f"{'x plain':>7} {'x graph':>7} {'rel_err':>8}  ok",
        flush=True,
    )


def _print_row(row: dict) -> None:
    def num(key, spec):
        value = row.get(key)
        return format(value, spec) if isinstance(value, float) else format("-", spec.split(".")[0] + "s")

    shape = f"C={row['c']} {row['size']}^2 K={row['k_out']} {row['r']}x{row['r']} s{row['stride']}"
    line = (
        f"{shape:24} {row['impl']:20} {row.get('config', ''):26.26} {num('ms_plain', '9.4f')} "
        f"{num('ms_graph', '9.4f')} {num('host_us', '8.1f')} {num('x_cudnn_plain', '7.3f')} "
        f"{num('x_cudnn_graph', '7.3f')} {num('rel_err', '8.1e')}  {row.get('ok', '-')}"
    )
    if row.get("error"):
        line += f" ERROR {row['error']}"
    print(line, flush=True)


class Table:
    def __init__(self, path: str):
        self.file = open(path, "w", newline="")  # noqa: SIM115  (kept open for the run, flushed per row)
        self.writer = csv.DictWriter(self.file, fieldnames=FIELDS, extrasaction="ignore")
        self.writer.writeheader()
        self.rows: list[dict] = []
        self.cudnn: dict[tuple, dict] = {}

    def add(self, row: dict) -> None:
        base = self.cudnn.get(tuple(row[k] for k in FIELDS[:7]), {})
        for mode in ("plain", "graph"):
            if isinstance(row.get(f"ms_{mode}"), float) and isinstance(base.get(f"ms_{mode}"), float):
                row[f"x_cudnn_{mode}"] = base[f"ms_{mode}"] / row[f"ms_{mode}"]
        if row["impl"] == "cudnn_channels_last":
            self.cudnn[tuple(row[k] for k in FIELDS[:7])] = row
        self.rows.append(row)
        self.writer.writerow(row)
        self.file.flush()
        _print_row(row)


def run_variant(table: Table, shape, impl: str, config: str, body) -> None:
    """One row: body(row) fills it; an exception is recorded, and the run goes on."""
    row = dict(zip(FIELDS[:7], shape, strict=True)) | {"impl": impl, "config": config, "error": ""}
    try:
        body(row)
    except Exception as exc:
        row["ok"] = False
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        traceback.print_exc(limit=2)
    table.add(row)


def operands(shape, dtype):
    batch, c, size, k_out, r, stride, padding = shape
    x_nchw = torch.randn(batch, c, size, size, device=DEVICE).to(dtype)
    w_torch = torch.randn(k_out, c, r, r, device=DEVICE).to(dtype)
    x, w = x_nchw.permute(0, 2, 3, 1).contiguous(), conv.weight_from_torch(w_torch)
    ref = conv.reference(x, w, stride=stride, padding=padding)
    return x, w, x_nchw, w_torch, ref


def _fmt(meta: dict | None) -> str:
    if not meta:
        return "?"
    return (
        f"{meta['BLOCK_SIZE_M']}x{meta['BLOCK_SIZE_N']}x{meta['BLOCK_SIZE_K']} "
        f"s{meta['num_stages']} w{meta['num_warps']}"
    )


# --- the runs ---------------------------------------------------------------------------------------------


def main_shapes(table: Table, prepared: dict, timed: bool) -> dict:
    """cuDNN channels_last and conv2d_nhwc with thin launches on and off, per shape of `prepared` (shape ->
    `operands`); returns (x, w, ref) per shape."""
    kept = {}
    for shape, (x, w, x_nchw, w_torch, ref) in prepared.items():
        batch, c, size, k_out, r, stride, padding = shape
        kept[shape] = (x, w, ref)
        fan_in = c * r * r
        x_cl = x_nchw.contiguous(memory_format=torch.channels_last)
        w_cl = w_torch.contiguous(memory_format=torch.channels_last)

        def cudnn(row, x_cl=x_cl, w_cl=w_cl, stride=stride, padding=padding, ref=ref, fan_in=fan_in):
            def fn():
                return torch.nn.functional.conv2d(x_cl, w_cl, stride=stride, padding=padding).permute(
                    0, 2, 3, 1
                )

            old = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = True
            try:
                measure(row, fn, ref, fan_in, timed)
            finally:
                torch.backends.cudnn.benchmark = old

        run_variant(table, shape, "cudnn_channels_last", "cudnn.benchmark", cudnn)
        for impl, flag in (("labkernels", True), ("labkernels_no_thin", False)):

            def ours(row, flag=flag, x=x, w=w, stride=stride, padding=padding, ref=ref, fan_in=fan_in):
                with Thin(flag):
                    fn = lambda: conv.conv2d_nhwc(x, w, stride=stride, padding=padding)  # noqa: E731
                    fn()  # tunes, the first time
                    fn()  # keeps the launcher
                    known = conv._launches.get(conv._launch_key(x, w, None, stride, padding))
                    row["config"] = f"{_fmt(conv.tuned_config(x, w, stride=stride, padding=padding))} " + (
                        known.launcher.kind if known is not None else "uncached"
                    )
                    measure(row, fn, ref, fan_in, timed)

            run_variant(table, shape, impl, "", ours)
    return kept


def sweep(table: Table, kept: dict, timed: bool, deadline: float) -> None:
    configs = sweep_configs(2) if on_gpu() else [(16, 16, 16, 1, 4), (32, 16, 16, 1, 4), (16, 32, 32, 1, 4)]
    for shape in SWEEP_SHAPES:
        x, w, ref = kept[shape]
        fan_in = shape[1] * shape[4] ** 2
        skipped = 0
        for cfg in configs:
            if time.perf_counter() > deadline:
                skipped += 1
                continue
            meta = _direct_meta(shape, *cfg)
            call = direct_call(x, w, shape, meta)

            def body(row, call=call, ref=ref, fan_in=fan_in):
                measure(row, call, ref, fan_in, timed, plain=False)

            run_variant(table, shape, "sweep", _fmt(meta), body)
        if skipped:
            print(f"budget spent: {skipped} sweep configs of C={shape[1]} {shape[2]}^2 not run", flush=True)


def splits(table: Table, kept: dict, timed: bool, deadline: float) -> None:
    for shape in SPLIT_SHAPES:
        splits_of(table, kept, timed, deadline, shape)


def splits_of(table: Table, kept: dict, timed: bool, deadline: float, shape) -> None:
    x, w, ref = kept[shape]
    fan_in = shape[1] * shape[4] ** 2
    for v in split_variants(on_gpu()):
        if time.perf_counter() > deadline:
            print("budget spent: the remaining split-K variants not run", flush=True)
            break
        bm, bn, bk, stages, warps, split, mode = v

        def body(row, v=v):
            run = SplitConv(x, w, shape, *v)
            y1 = measure(row, run, ref, fan_in, timed, plain=False)
            if v[-1] != "atomic":  # the others claim bitwise reproducibility
                row["ok"] = row["ok"] and torch.equal(y1, run())

        run_variant(table, shape, f"splitk_{mode}", f"{bm}x{bn}x{bk} s{stages} w{warps} split{split}", body)


def tma_sweep(table: Table, kept: dict, timed: bool, deadline: float) -> None:
    shapes = [s for s in kept if tma_supported(s) and (s[4] == 3 or not on_gpu())]
    for shape in sorted(shapes, key=lambda s: -s[1]):  # the shapes furthest behind cuDNN first
        x, w, ref = kept[shape]
        fan_in = shape[1] * shape[4] ** 2
        for cfg in tma_configs(shape, on_gpu()):
            if time.perf_counter() > deadline:
                print(f"budget spent: TMA configs of C={shape[1]} {shape[2]}^2 not run", flush=True)
                break
            meta = _tma_meta(shape, *cfg)

            def body(row, meta=meta, x=x, w=w, shape=shape, ref=ref, fan_in=fan_in):
                call = tma_call(x, w, shape, meta)
                poisoned_checks(call, ref, fan_in)
                measure(row, call, ref, fan_in, timed, plain=False)

            run_variant(table, shape, "tma", _fmt_tma(meta), body)
        for cfg in box_configs(shape, on_gpu()):
            if time.perf_counter() > deadline:
                print(f"budget spent: box configs of C={shape[1]} {shape[2]}^2 not run", flush=True)
                break
            meta = _box_meta(shape, *cfg)

            def body(row, meta=meta, x=x, w=w, shape=shape, ref=ref, fan_in=fan_in):
                call = box_call(x, w, shape, meta)
                poisoned_checks(call, ref, fan_in)
                measure(row, call, ref, fan_in, timed, plain=False)

            run_variant(table, shape, "box", _fmt_box(meta), body)


def summary(table: Table) -> None:
    print("\nsummary (graph replays; x = cuDNN time / ours):")
    shapes = SWEEP_SHAPES + (SPLIT_SHAPES if SPLITS else [])
    if TMA:
        shapes = [s for s in CONV_SHAPES if tma_supported(s) and s[4] == 3]
    for shape in dict.fromkeys(shapes):
        mine = [r for r in table.rows if tuple(r[k] for k in FIELDS[:7]) == shape and r.get("ok")]
        graph = [r for r in mine if isinstance(r.get("x_cudnn_graph"), float)]
        tuned = [r for r in graph if r["impl"] == "labkernels"]
        for impl in ("sweep", "splitk_last", "splitk_partials", "splitk_atomic", "tma", "box"):
            cands = [r for r in graph if r["impl"] == impl]
            if cands:
                best = max(cands, key=lambda r: r["x_cudnn_graph"])
                now = f"; autotuned {tuned[0]['config']} {tuned[0]['x_cudnn_graph']:.3f}x" if tuned else ""
                us = best["ms_graph"] * 1e3
                print(
                    f"  C={shape[1]} {shape[2]}^2: best {impl} {best['config']} {us:.1f} us "
                    f"{best['x_cudnn_graph']:.3f}x{now}"
                )
    print("plain calls (x = cuDNN plain / ours), thin vs no thin, host us per call:")
    for shape in CONV_SHAPES:
        mine = {r["impl"]: r for r in table.rows if tuple(r[k] for k in FIELDS[:7]) == shape}
        parts = []
        for impl in ("cudnn_channels_last", "labkernels", "labkernels_no_thin"):
            r = mine.get(impl, {})
            if isinstance(r.get("ms_plain"), float):
                ratio = f" {r['x_cudnn_plain']:.2f}x" if isinstance(r.get("x_cudnn_plain"), float) else ""
                parts.append(f"{impl} {r['ms_plain'] * 1e3:.1f} us{ratio} (host {r['host_us']:.0f} us)")
        print(f"  C={shape[1]} {shape[2]}^2 r{shape[4]} s{shape[5]}: " + "; ".join(parts))


def gpu_main(out_dir: str, budget_s: float, workers: int) -> int:
    start = time.perf_counter()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(DEVICE)
    print(
        f"{props.name}, {props.multi_processor_count} SMs, "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    jobs = _compile_jobs()
    pool = None
    futures = []
    if workers > 0:  # compile ahead while this process builds operands and references
        pool = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")
        )
        futures = [pool.submit(_warm, job) for job in jobs]
    prepared = {shape: operands(shape, torch.float16) for shape in CONV_SHAPES}  # fp64 references included
    if futures:  # timings want the CPU to themselves
        done, pending = concurrent.futures.wait(
            futures, timeout=max(5.0, 0.5 * budget_s - (time.perf_counter() - start))
        )
        errors = [_error_of(f) for f in done if _error_of(f)]
        print(
            f"compiled {len(done)} of {len(jobs)} kernels ahead in {time.perf_counter() - start:.0f} s "
            f"({workers} processes); {len(errors)} failed" + (f", first: {errors[0]}" if errors else ""),
            flush=True,
        )
        pool.shutdown(wait=False, cancel_futures=True)
    os.makedirs(out_dir, exist_ok=True)
    table = Table(os.path.join(out_dir, "results.csv"))
    _print_header()
    kept = main_shapes(table, prepared, timed=True)
    deadline = start + budget_s
    if TMA:
        tma_sweep(table, kept, timed=True, deadline=deadline)
    else:
        sweep(table, kept, timed=True, deadline=deadline - 15)  # leave time for the split-K rows
    if SPLITS and not TMA:
        splits(table, kept, timed=True, deadline=deadline)
    summary(table)
    print(f"wrote {table.file.name} in {time.perf_counter() - start:.0f} s")
    return 0


def smoke(out_dir: str) -> int:
    """The interpreter: every code path on tiny fp32 shapes (ragged tiles, C not a multiple of BLOCK_SIZE_K,
    stride 2), checked against the fp64 reference; no timings."""
    torch.manual_seed(0)
    shapes = [(2, 40, 7, 24, 3, 1, 1), (1, 24, 9, 20, 3, 2, 1), (2, 32, 6, 24, 3, 1, 1)]
    shapes += [(1, 16, 5, 16, 1, 1, 0)]
    global SWEEP_SHAPES, SPLIT_SHAPES, _empty
    SWEEP_SHAPES, SPLIT_SHAPES = shapes, shapes[:1]
    _empty = lambda *args, **kwargs: torch.empty(*args, **kwargs).fill_(float("nan"))  # noqa: E731
    os.makedirs(out_dir, exist_ok=True)
    table = Table(os.path.join(out_dir, "smoke.csv"))
    _print_header()
    kept = main_shapes(table, {shape: operands(shape, torch.float32) for shape in shapes}, timed=False)
    sweep(table, kept, timed=False, deadline=float("inf"))
    splits(table, kept, timed=False, deadline=float("inf"))
    tma_sweep(table, kept, timed=False, deadline=float("inf"))
    bad = [r for r in table.rows if not r.get("ok")]
    print(f"smoke: {len(table.rows)} rows, {len(bad)} not ok")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="CPU lane: tiny fp32 shapes, checks only")
    parser.add_argument("--budget-s", type=float, default=95.0, help="start no new variant after this")
    parser.add_argument("--workers", type=int, default=min(14, max(1, (os.cpu_count() or 2) - 2)))
    parser.add_argument(
        "--sweep-c",
        type=int,
        nargs="+",
        help="sweep the 3x3 stride-1 shapes with these C instead (and wider tiles: 64/128 x 256, 256 x 128); "
        "no split-K rows unless --split-c",
    )
    parser.add_argument(
        "--split-c", type=int, nargs="+", help="the split-K rows on the 3x3 stride-1 shapes with these C"
    )
    parser.add_argument(
        "--tma", action="store_true", help="the TMA kernel's configs on every stride-1 'same' shape instead"
    )
    args = parser.parse_args()
    if args.tma:
        global TMA
        TMA = True
    if args.sweep_c:
        global SWEEP_SHAPES, SWEEP_TILES, SPLITS
        SWEEP_SHAPES = [s for s in CONV_SHAPES if s[1] in args.sweep_c and s[4] == 3 and s[5] == 1]
        SWEEP_TILES = SWEEP_TILES + ((64, 256), (128, 256), (256, 128))
        SPLITS = False
    if args.split_c:
        global SPLIT_SHAPES
        SPLIT_SHAPES = [s for s in CONV_SHAPES if s[1] in args.split_c and s[4] == 3 and s[5] == 1]
        SPLITS = True
    out_dir = os.path.join(os.environ.get("OUT", "/tmp"), "conv_variants")
    if args.smoke:
        return smoke(out_dir)
    if not on_gpu():
        print("no GPU: use --smoke")
        return 2
    return gpu_main(out_dir, args.budget_s, args.workers)


if __name__ == "__main__":
    sys.exit(main())
