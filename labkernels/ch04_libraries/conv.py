"""Implicit-GEMM 2-D convolution in Triton: NHWC input, (K_out, R, S, C) weights, fp32 accumulation.

A convolution is a matmul in disguise. Output pixel (n, p, q), output channel k:
    y[n, p, q, k] = sum over r, s, c of x[n, p*stride - pad + r, q*stride - pad + s, c] * w[k, r, s, c]
so with M = N*P*Q output pixels, N_gemm = K_out and K_gemm = R*S*C it is Y (M, K_out) = A (M, R*S*C) @
W^T, where row m of A holds the R*S input patches under output pixel m. cuDNN's "implicit GEMM" never builds
A (an im2col copy would be R*S = 9 times the input for a 3x3 filter): each tile of A is loaded straight
from x, computing for each of its rows the input pixel (n, h, w) and masking the rows whose tap falls in
the padding. The K_gemm loop runs over the taps (r, s), and inside a tap over C in BLOCK_SIZE_K chunks, so
every row of an A tile is BLOCK_SIZE_K *contiguous* channels of one NHWC pixel: coalesced loads. In NCHW
the same channels sit H*W elements apart, which is why this kernel (and cuDNN's fastest) want NHWC.

Traffic at best: read x and w once, write y once: (N*H*W*C + K_out*R*S*C + N*P*Q*K_out) elements; the R*S
re-reads of each input pixel hit L2. FLOPs: 2 * N*P*Q * K_out * R*S*C.

Weights: (K_out, R, S, C) contiguous, so each output channel's R*S*C taps are contiguous (K-major B, what
the tensor cores want). torch stores them as (K_out, C, R, S): `weight_from_torch` converts, one copy of
the (small) weight tensor, worth doing once and keeping rather than per call.
Two kernels compute it (`kernel=`):
- "implicit_gemm" (`_conv_kernel`): any stride and padding; each thread computes the addresses of its part
  of the A tile and loads it with a mask that drops the padding taps.
- "tma_box" (`_conv_box_kernel`): stride 1 and "same" padding (P = H, Q = W), C a multiple of 64 (16 under
  the interpreter). The A tile is a box of IMG images x BH x BW pixels x BLOCK_SIZE_K channels, one TMA
  copy per (tap, channel step): the TMA unit computes the addresses, and the parts of the box that fall
  outside x (the padding) arrive as zeros, with no mask. "auto" takes it on the GPU wherever it applies,
  for filters larger than 1x1 (the shapes it was measured on).
Backward is not implemented: inputs that require grad are refused.
A call whose key (shapes, strides, dtypes, devices, alignment, options, grad mode) was seen before skips the
checks and Triton's per-call Python: it allocates y and launches through a cached launcher
(`labkernels.launch_cache`), as chapter 03's matmul does.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton.matmul import _tile_coordinates  # grouped program order, as chapter 03 teaches
from labkernels.ch03_triton.vector_add import BF16_ON_CPU
from labkernels.lane import LANE, on_gpu, require_device
from labkernels.timing import autotune_bench, graph_ms

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SHARED_MEMORY_BYTES = 227 * 1024
INT32_LIMIT = 2**31


def _config(m: int, n: int, k: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    meta = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# ResNet stages have K_out = 64 ... 512 and C a multiple of 64: BLOCK_SIZE_K 64 (one 128-byte line of fp16
# channels per pixel), tiles as wide as K_out allows (wider tiles are pruned when K_out is narrower).
GPU_CONFIGS = [
    _config(128, 64, 64, stages=4, warps=4),
    # C=64 at 56^2 (K_out = 64): 3 stages (72 KiB of shared memory) let three programs share an SM, 4 stages
    # (96 KiB) two; measured 0.94x cuDNN in graph replays against 0.83x (conv_variants.py --sweep-c 64)
    _config(128, 64, 64, stages=3, warps=4),
    _config(256, 64, 64, stages=3, warps=8),
    _config(128, 128, 64, stages=4, warps=8),
    _config(128, 256, 64, stages=3, warps=8),
    _config(256, 128, 64, stages=3, warps=8),
    # Few output pixels (C=256 at 14^2, C=512 at 7^2: M = 6272 / 1568): 128 x 128 tiles number 98 / 52 for
    # 132 SMs. Shorter tiles make 2x the programs, and at 64 x 64 two fit an SM. Kept only for shapes whose
    # 128 x 128 tiles make under two waves: C=128 at 28^2 (196 tiles, 1.5 waves) measured 0.77x cuDNN with
    # 256 x 128 tiles and 0.97x with 64 x 128 x 64, 3 stages (experiments/conv_variants.py).
    _config(64, 128, 64, stages=3, warps=4),
    _config(64, 128, 64, stages=4, warps=4),
    _config(64, 256, 64, stages=3, warps=8),
    _config(64, 64, 64, stages=5, warps=4),
]
SMALL_M_ROWS = 64  # configs with this BLOCK_SIZE_M run only where 128-row tiles make under two waves
CPU_CONFIGS = [_config(32, 16, 16, stages=1, warps=4, group=4)]


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output pixels along one axis: floor((size + 2*padding - kernel) / stride) + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def weight_from_torch(w: torch.Tensor) -> torch.Tensor:
    """torch's (K_out, C, R, S) weights as this kernel's (K_out, R, S, C), contiguous (one copy)."""
    if w.dim() != 4:
        raise ValueError(f"weight_from_torch: w must be 4-D (K_out, C, R, S), got shape {tuple(w.shape)}")
    return w.permute(0, 2, 3, 1).contiguous()


def reference(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, stride: int = 1, padding: int = 0
) -> torch.Tensor:
    """torch's conv2d in fp64 on NHWC x and (K_out, R, S, C) w; NHWC fp64 result."""
    y = torch.nn.functional.conv2d(
        x.double().permute(0, 3, 1, 2),
        w.double().permute(0, 3, 1, 2),
        None if bias is None else bias.double(),
        stride=stride,
        padding=padding,
    )
    return y.permute(0, 2, 3, 1)


@triton.jit
def _conv_kernel(
    x_ptr, w_ptr, bias_ptr, y_ptr,
    BATCH, H, W, C, P, Q, K_OUT,
    R: tl.constexpr, S: tl.constexpr, STRIDE: tl.constexpr, PADDING: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_C: tl.constexpr, BIG: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):  # fmt: skip
    M = BATCH * P * Q
    pid_m, pid_n = _tile_coordinates(
        tl.program_id(axis=0), M, K_OUT, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M
    )
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)  # output pixels (n, p, q), flattened
    row_valid = offs_m < M
    n_img = offs_m // (P * Q)
    h_top = (offs_m % (P * Q)) // Q * STRIDE - PADDING  # the input pixel under tap (0, 0)
    w_left = offs_m % Q * STRIDE - PADDING
    if BIG:
        n_img = n_img.to(tl.int64)
    pixel = (n_img * H + h_top) * W + w_left  # may be negative in the padding: masked, never loaded
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_wn = offs_n % K_OUT  # wrapped: valid filters, never stored
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    RSC = R * S * C
    w_rows = w_ptr + offs_wn[None, :] * RSC  # (1, BN): each filter's R*S*C taps are contiguous
    c_chunks = tl.cdiv(C, BLOCK_SIZE_K)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    # One flat loop over (tap, channel chunk): a single loop is what Triton software-pipelines.
    for step in range(R * S * c_chunks):
        tap = step // c_chunks
        c0 = (step % c_chunks) * BLOCK_SIZE_K
        r = tap // S
        s = tap % S
        h = h_top + r
        w = w_left + s
        inside = row_valid & (h >= 0) & (h < H) & (w >= 0) & (w < W)  # False in the padding
        a_ptrs = (
            x_ptr + (pixel + r * W + s)[:, None] * C + (c0 + offs_k)[None, :]
        )  # (BM, BK), rows contiguous
        b_ptrs = w_rows + (tap * C + c0 + offs_k)[:, None]  # (BK, BN)
        if EVEN_C:
            a = tl.load(a_ptrs, mask=inside[:, None], other=0.0)  # read BM x BK (L2 after the first tap)
            b = tl.load(b_ptrs)  # read BK x BN
        else:
            c_valid = c0 + offs_k < C
            a = tl.load(a_ptrs, mask=inside[:, None] & c_valid[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=c_valid[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # 16-bit on the GPU; exact fp32 under the interpreter

    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < K_OUT, other=0.0).to(tl.float32)[
            None, :
        ]  # read K_out
    offs_ym = offs_m.to(tl.int64) if BIG else offs_m
    y_ptrs = y_ptr + offs_ym[:, None] * K_OUT + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_valid[:, None] & (offs_n[None, :] < K_OUT))


@triton.jit
def _conv_box_kernel(
    x_desc, w_desc, bias_ptr, y_ptr,
    BATCH, H, W, C, K_OUT,
    R: tl.constexpr, S: tl.constexpr, PADDING: tl.constexpr, HAS_BIAS: tl.constexpr,
    IMG: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
    C_CHUNKS: tl.constexpr,  # C // BLOCK_SIZE_K, a constant: with a loop the compiler cannot prove runs,
    # ptxas serializes the MMAs (its warning C7515), as it did when this was computed from C
):  # fmt: skip
    """Stride 1, P = H, Q = W. x_desc: x as (N, H, W, C) in boxes (IMG, BH, BW, BLOCK_SIZE_K); w_desc: w as
    (K_out, R*S*C) in tiles (BLOCK_SIZE_N, BLOCK_SIZE_K). Program: one box of output pixels (its rows) x
    BLOCK_SIZE_N filters."""
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
        c0 = step % C_CHUNKS * BLOCK_SIZE_K
        # the box under tap (r, s): shifted by (r - pad, s - pad); where it leaves x the copy writes zeros
        a = x_desc.load([n0, h0 + tap // S - PADDING, w0 + tap % S - PADDING, c0])  # read BM x BK (L2 mostly)
        b = w_desc.load([pid_n * BLOCK_SIZE_N, tap * C + c0]).T  # read BK x BN (K-major, as wgmma wants)
        acc = tl.dot(a.reshape(BLOCK_SIZE_M, BLOCK_SIZE_K), b, acc, input_precision="ieee")
        # The reshaped box reaches the tensor cores from registers, and Triton (3.6 and 3.7) keeps a step's
        # MMAs running while the next step overwrites those registers: measured on the H200, some configs
        # then gave wrong outputs in some runs (experiments/conv_box_diagnose.py). Using acc here makes the
        # compiler wait for this step's MMAs; the next step's TMA copies are already in flight.
        acc = acc + 0.0
    if HAS_BIAS:
        offs_b = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        bias = tl.load(bias_ptr + offs_b, mask=offs_b < K_OUT, other=0.0)  # read K_out
        acc += bias.to(tl.float32)[None, :]
    rows = tl.arange(0, BLOCK_SIZE_M)
    n = n0 + rows // (BH * BW)
    h = h0 + rows // BW % BH
    w = w0 + rows % BW
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    pixel = (n.to(tl.int64) * H + h) * W + w  # 64-bit: N*H*W*K_out may pass 2^31
    inside = (n < BATCH) & (h < H) & (w < W)  # the last boxes may reach past x
    y_ptrs = y_ptr + pixel[:, None] * K_OUT + offs_n[None, :]
    mask = inside[:, None] & (offs_n[None, :] < K_OUT)
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)  # write BM x BN


def _box_channels() -> int:
    """The channel step of the box kernel's configs, so C must be a multiple of it."""
    return 64 if on_gpu() else 16


def _box_refusal(x, w, stride: int, padding: int) -> str | None:
    """Why the TMA box kernel cannot run this call, or None: it needs stride 1, "same" padding, C a multiple
    of the channel step, 16-bit data on the GPU (fp32 only under the interpreter) and 16-byte aligned x and
    w (TMA's rule)."""
    batch, H, W, C = x.shape
    k_out, R, S, _ = w.shape
    dtypes = (torch.float16, torch.bfloat16) if on_gpu() else (torch.float32,)
    if stride != 1:
        return f"stride 1 (got {stride})"
    if output_size(H, R, 1, padding) != H or output_size(W, S, 1, padding) != W:
        return f"'same' padding, output H x W = input H x W (padding {padding} with a {R}x{S} filter)"
    if C == 0 or C % _box_channels():
        return f"C a multiple of {_box_channels()} (got {C})"
    if x.dtype not in dtypes:
        return f"dtype {' or '.join(str(d) for d in dtypes)} on this lane (got {x.dtype})"
    if x.data_ptr() % 16 or w.data_ptr() % 16:
        return "x and w at 16-byte aligned addresses"
    return None


def _box_shape(batch: int, H: int, W: int, pixels: int) -> tuple[int, int, int]:
    """(IMG, BH, BW) of `pixels` output pixels, powers of two, that cover (batch, H, W) with the fewest
    pixels that do not exist (a box reaching past x computes them and does not store them); ties go to the
    widest box (longer contiguous rows)."""
    best = None
    for bh in (1, 2, 4, 8, 16, 32):
        for bw in (1, 2, 4, 8, 16, 32, 64):
            img = pixels // (bh * bw)
            if img < 1 or img * bh * bw != pixels:
                continue
            covered = triton.cdiv(batch, img) * img * triton.cdiv(H, bh) * bh * triton.cdiv(W, bw) * bw
            cand = (covered, -bw, (img, bh, bw))
            best = cand if best is None or cand < best else best
    return best[2]


# (pixels per box, BLOCK_SIZE_N, BLOCK_SIZE_K, stages, warps): measured on the H200 against cuDNN (fp16,
# ResNet-50 3x3 stages, experiments/conv_variants.py --tma); the tuner times those that fit each shape.
BOX_GPU_CONFIGS = [
    (64, 64, 64, 3, 4),
    (64, 128, 64, 3, 4),
    (64, 128, 128, 4, 4),
    (64, 256, 128, 3, 4),
    (64, 256, 64, 4, 4),
    (128, 64, 64, 3, 4),
    (128, 128, 64, 3, 8),
    (128, 128, 128, 3, 8),
]
BOX_CPU_CONFIGS = [(16, 16, 16, 1, 4), (32, 16, 16, 1, 4)]


def _box_metas(batch: int, H: int, W: int, C: int, k_out: int, element_size: int) -> list[dict]:
    """The box kernel's launch options worth timing for this shape: tiles no wider than K_out, channel
    steps that divide C, stages that fit shared memory."""
    metas = []
    configs = BOX_GPU_CONFIGS if on_gpu() else BOX_CPU_CONFIGS
    n_cap = max(min(c[1] for c in configs), triton.next_power_of_2(k_out))  # the narrowest tile always fits
    for pixels, bn, bk, stages, warps in configs:
        if bn > n_cap or C % bk or stages * (pixels + bn) * bk * element_size > SHARED_MEMORY_BYTES:
            continue
        img, bh, bw = _box_shape(batch, H, W, pixels)
        metas.append(dict(IMG=img, BH=bh, BW=bw, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8,
                          C_CHUNKS=C // bk, num_stages=stages, num_warps=warps))  # fmt: skip
    return metas


def _box_descriptors(x: torch.Tensor, w: torch.Tensor, meta: dict) -> tuple:
    """x's and w's TMA descriptors for `meta`'s box and tile (built on the host, per call: they hold the
    addresses)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bk = meta["BLOCK_SIZE_K"]
    k_out = w.shape[0]
    rsc = w.numel() // k_out
    return (
        TensorDescriptor(x, list(x.shape), list(x.stride()), [meta["IMG"], meta["BH"], meta["BW"], bk]),
        TensorDescriptor(w, [k_out, rsc], [rsc, 1], [meta["BLOCK_SIZE_N"], bk]),
    )


def _box_grid(batch: int, H: int, W: int, k_out: int, meta: dict) -> tuple[int]:
    boxes = triton.cdiv(batch, meta["IMG"]) * triton.cdiv(H, meta["BH"]) * triton.cdiv(W, meta["BW"])
    return (boxes * triton.cdiv(k_out, meta["BLOCK_SIZE_N"]),)


def _tune_box(x, w, bias_or_y, y, options: dict) -> dict:
    """Time each of `_box_metas` once per shape and keep the fastest; the winner's output is the call's.
    On the GPU each is timed in CUDA-graph replays, as chapter 04's matmul picks its kernel: the GPU time
    alone, L2 kept warm, as a network's layers run (Triton's autotuner clears L2 before each run, and its
    picks here moved from run to run by up to 1.3x)."""
    batch, H, W, C = x.shape
    k_out = w.shape[0]
    timed = {}
    for i, meta in enumerate(_box_metas(batch, H, W, C, k_out, x.element_size())):
        full = meta | options

        def call(full=full):
            _conv_box_kernel[_box_grid(batch, H, W, k_out, full)](
                *_box_descriptors(x, w, full), bias_or_y, y, batch, H, W, C, k_out, **full
            )

        call()  # compiles outside the timing (and outside a graph capture)
        timed[i] = (graph_ms(call, rep=20) if on_gpu() else autotune_bench(call)[0], full)
    best = min(timed.values(), key=lambda t: t[0])[1]
    _conv_box_kernel[_box_grid(batch, H, W, k_out, best)](
        *_box_descriptors(x, w, best), bias_or_y, y, batch, H, W, C, k_out, **best
    )  # read x, w; write y
    return best


@functools.cache
def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _prune(configs, named_args, **kwargs):
    """Drop tiles wider than K_out or deeper than C (wasted lanes), and configs too big for shared memory."""
    element_size = named_args["x_ptr"].element_size()
    n_cap = max(16, triton.next_power_of_2(named_args["K_OUT"]))
    k_cap = max(16, triton.next_power_of_2(named_args["C"]))

    def shared_bytes(c):
        m, n, k = c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"]
        return c.num_stages * (m * k + k * n) * element_size

    fits = [c for c in configs if shared_bytes(c) <= SHARED_MEMORY_BYTES]
    pixels = named_args["BATCH"] * named_args["P"] * named_args["Q"]
    if on_gpu() and triton.cdiv(pixels, 128) * triton.cdiv(named_args["K_OUT"], 128) >= 2 * _sms():
        fits = [c for c in fits if c.kwargs["BLOCK_SIZE_M"] != SMALL_M_ROWS] or fits  # two full waves or more
    snug = [c for c in fits if c.kwargs["BLOCK_SIZE_N"] <= n_cap and c.kwargs["BLOCK_SIZE_K"] <= k_cap]
    if snug:
        return snug
    smallest = min(configs, key=lambda c: c.kwargs["BLOCK_SIZE_N"] * c.kwargs["BLOCK_SIZE_K"])
    return [triton.Config(smallest.kwargs | {"BLOCK_SIZE_N": min(smallest.kwargs["BLOCK_SIZE_N"], n_cap),
                                             "BLOCK_SIZE_K": min(smallest.kwargs["BLOCK_SIZE_K"], k_cap)},
                          num_stages=smallest.num_stages, num_warps=smallest.num_warps)]  # fmt: skip


_conv_tuned = triton.autotune(
    configs=GPU_CONFIGS if LANE == "gpu" else CPU_CONFIGS,
    key=["BATCH", "H", "W", "C", "K_OUT", "R", "S", "STRIDE", "PADDING", "HAS_BIAS", "BIG"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=autotune_bench,
)(triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_SIZE_K"] == 0})(_conv_kernel))

_tuned_meta: dict[tuple, dict] = {}  # as chapter 03's matmul: the autotuner chooses once per key


def _int_pair(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"conv2d_nhwc: {name} must be an int (the same along H and W), got {value!r}")
    return value


def _check(x, w, bias, stride, padding) -> None:
    require_device(x, "conv2d_nhwc: x")
    require_device(w, "conv2d_nhwc: w")
    for name, t in (("x", x), ("w", w)):
        if t.dtype not in DTYPES:
            raise TypeError(f"conv2d_nhwc: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dim() != 4:
            raise ValueError(f"conv2d_nhwc: {name} must be 4-D, got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(
                f"conv2d_nhwc: {name} must be contiguous in its (N, H, W, C) / (K_out, R, S, C) order, got "
                f"strides {t.stride()}; NCHW x converts with x.permute(0, 2, 3, 1).contiguous()"
            )
    if x.dtype != w.dtype:
        raise TypeError(f"conv2d_nhwc: x and w must share one dtype, got {x.dtype} and {w.dtype}")
    if x.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"conv2d_nhwc: {BF16_ON_CPU}")
    if x.shape[3] != w.shape[3]:
        raise ValueError(
            f"conv2d_nhwc: channels differ, x (N, H, W, C) is {tuple(x.shape)} and w (K_out, R, S, C) is "
            f"{tuple(w.shape)}; torch's (K_out, C, R, S) weights convert with weight_from_torch(w)"
        )
    stride, padding = _int_pair(stride, "stride"), _int_pair(padding, "padding")
    if stride < 1 or padding < 0:
        raise ValueError(f"conv2d_nhwc: stride must be >= 1 and padding >= 0, got {stride} and {padding}")
    if x.shape[1] + 2 * padding < w.shape[1] or x.shape[2] + 2 * padding < w.shape[2]:
        raise ValueError(
            f"conv2d_nhwc: the {w.shape[1]}x{w.shape[2]} filter is larger than the padded input "
            f"{x.shape[1] + 2 * padding}x{x.shape[2] + 2 * padding}"
        )
    if bias is not None:
        require_device(bias, "conv2d_nhwc: bias")
        if bias.shape != (w.shape[0],):
            raise ValueError(f"conv2d_nhwc: bias must have shape ({w.shape[0]},), got {tuple(bias.shape)}")
        if bias.dtype not in DTYPES or (bias.dtype == torch.bfloat16 and not on_gpu()):
            raise TypeError(f"conv2d_nhwc: bias has unsupported dtype {bias.dtype}")
    if any(t is not None and t.requires_grad for t in (x, w, bias)) and torch.is_grad_enabled():
        raise ValueError(
            "conv2d_nhwc: has no backward; an input requires grad (call it under torch.no_grad(), or use "
            "torch.nn.functional.conv2d for training)"
        )


# What each plain call would recompute, kept per key: the checks passed, y's shape and the launcher
# (`labkernels.launch_cache`: a thin one calls the compiled kernel directly, as chapter 03's matmul does).
# The kernel takes a few tens of microseconds, about what Triton's per-call Python costs: without this, a
# plain call is host-bound.
class _Known(NamedTuple):
    shape: tuple[int, int, int, int]  # y's
    contiguous_bias: bool  # else bias is copied to a contiguous one first, as the checked call did
    launcher: object  # launcher(x, w, bias_or_y, y), or launcher(x_desc, w_desc, bias_or_y, y) with box_meta
    box_meta: dict | None = None  # the box kernel's options: its descriptors are built per call from them


_launches = launch_cache.KeyedLaunches()


def _launch_key(x, w, bias, stride, padding, kernel="auto") -> tuple:
    """Everything `_check` and Triton's specialization read from the arguments: shapes, strides, dtypes,
    devices, 16-byte alignment, the options with their types (stride=True is refused, not taken for 1), and
    whether autograd would need a backward (such a call raises, so its key is never kept)."""
    key = ()
    for t in (x, w) if bias is None else (x, w, bias):
        key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0)
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, w, bias) if t is not None)
    return (*key, wants_grad, type(stride), stride, type(padding), padding, kernel)


KERNELS = ("auto", "implicit_gemm", "tma_box")


def _pick_kernel(kernel, x, w, stride: int, padding: int) -> str:
    """The kernel a checked call runs: "auto" takes the box kernel on the GPU wherever it applies."""
    if kernel not in KERNELS:
        raise ValueError(f"conv2d_nhwc: kernel must be one of {KERNELS}, got {kernel!r}")
    refusal = _box_refusal(x, w, stride, padding)
    applies = refusal is None
    if kernel == "tma_box" and not applies:
        raise ValueError(f"conv2d_nhwc: kernel='tma_box' needs {refusal}")
    if kernel == "auto":  # measured against cuDNN for 3x3 filters (ch04_conv); 1x1 stays implicit GEMM
        return "tma_box" if applies and on_gpu() and w.shape[1] * w.shape[2] > 1 else "implicit_gemm"
    return kernel


def conv2d_nhwc(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    stride: int = 1,
    padding: int = 0,
    kernel: str = "auto",
) -> torch.Tensor:
    """2-D convolution of x (N, H, W, C) with w (K_out, R, S, C), both contiguous and of one dtype (float16,
    bfloat16 on the GPU; float32 anywhere), plus an optional bias (K_out,). Returns y (N, P, Q, K_out)
    contiguous (NHWC) in x's dtype, accumulated in fp32. The first call of a shape autotunes.
    kernel: "implicit_gemm", "tma_box" (stride 1 and "same" padding only; the module docstring says what
    each does) or "auto". No backward: inputs that require grad are refused. Registered as
    `torch.ops.labkernels.ch04_conv2d_nhwc`, so it compiles with torch.compile."""
    if torch.compiler.is_compiling():  # the registered op: its fake gives torch.compile the output's shape
        return torch.ops.labkernels.ch04_conv2d_nhwc(x, w, bias, stride, padding, kernel)
    try:
        fast_key = _launch_key(x, w, bias, stride, padding, kernel)
        known = _launches.get(fast_key)
    except Exception:  # not tensors, unhashable options, tensors without storage: the checks say so
        fast_key = known = None
    if known is not None:  # checked before: only allocate and launch
        y = x.new_empty(known.shape)  # x's dtype and device, without parsing them
        bias_or_y = y if bias is None else bias if known.contiguous_bias else bias.contiguous()
        if known.box_meta is None:
            known.launcher(x, w, bias_or_y, y)  # read x, w; write y
        else:
            known.launcher(*_box_descriptors(x, w, known.box_meta), bias_or_y, y)  # read x, w; write y
        return y
    _check(x, w, bias, stride, padding)
    chosen = _pick_kernel(kernel, x, w, stride, padding)
    batch, H, W, C = x.shape
    k_out, R, S, _ = w.shape
    P, Q = output_size(H, R, stride, padding), output_size(W, S, stride, padding)
    y = torch.empty((batch, P, Q, k_out), device=x.device, dtype=x.dtype)
    if y.numel() == 0:
        return y
    if C == 0:  # no channels: an empty sum, plus the bias
        return y.copy_((bias if bias is not None else torch.zeros(k_out, device=x.device)).expand_as(y))
    if chosen == "tma_box":
        return _box_call(x, w, bias, y, padding, fast_key)
    M = batch * P * Q
    big = max(x.numel(), w.numel(), y.numel()) + (H + W + 2) * C >= INT32_LIMIT  # margin: padded taps
    options = {"R": R, "S": S, "STRIDE": stride, "PADDING": padding, "HAS_BIAS": bias is not None, "BIG": big}
    args = (x, w, y if bias is None else bias.contiguous(), y, batch, H, W, C, P, Q, k_out)
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(k_out, meta["BLOCK_SIZE_N"]),)  # noqa: E731
    key = (batch, H, W, C, k_out, x.dtype, *options.values())
    meta = _tuned_meta.get(key)
    if meta is None:  # the first call of a key: times every config, launches and keeps the best
        _conv_tuned[grid](*args, **options)
        meta = _conv_tuned.best_config.all_kwargs() | options
        meta["EVEN_C"] = C % meta["BLOCK_SIZE_K"] == 0
        _tuned_meta[key] = meta
        return y
    launcher = launch_cache.launch(_conv_kernel, grid(meta), args, meta)  # read x, w; write y
    if fast_key is not None:
        _launches[fast_key] = _Known(y.shape, bias is None or bias.is_contiguous(), launcher)
    return y


@torch.library.custom_op(
    "labkernels::ch04_conv2d_nhwc",
    mutates_args=(),
    schema="(Tensor x, Tensor w, Tensor? bias=None, int stride=1, int padding=0, str kernel='auto') "
    "-> Tensor",
)
def _conv_op(x, w, bias=None, stride=1, padding=0, kernel="auto"):
    return conv2d_nhwc(x, w, bias, stride=stride, padding=padding, kernel=kernel)


@_conv_op.register_fake
def _(x, w, bias=None, stride=1, padding=0, kernel="auto"):
    _check(x, w, bias, stride, padding)
    if kernel not in KERNELS:  # whether "tma_box" can run depends on addresses: the real call says
        raise ValueError(f"conv2d_nhwc: kernel must be one of {KERNELS}, got {kernel!r}")
    (batch, H, W, _), (k_out, R, S, _) = x.shape, w.shape
    return x.new_empty((batch, output_size(H, R, stride, padding), output_size(W, S, stride, padding), k_out))


def _box_call(x, w, bias, y, padding: int, fast_key) -> torch.Tensor:
    """conv2d_nhwc by the box kernel (checked inputs): tuned on the first call of a shape, then launched
    with descriptors built for each call's x and w."""
    batch, H, W, C = x.shape
    k_out, R, S, _ = w.shape
    options = {"R": R, "S": S, "PADDING": padding, "HAS_BIAS": bias is not None}
    bias_or_y = y if bias is None else bias.contiguous()
    key = ("tma_box", batch, H, W, C, k_out, x.dtype, *options.values())
    meta = _tuned_meta.get(key)
    if meta is None:  # the first call of a key: times the configs, keeps the best; y is its output
        _tuned_meta[key] = _tune_box(x, w, bias_or_y, y, options)
        return y
    args = (*_box_descriptors(x, w, meta), bias_or_y, y, batch, H, W, C, k_out)
    launcher = launch_cache.launch(_conv_box_kernel, _box_grid(batch, H, W, k_out, meta), args, meta)
    if fast_key is not None:  # read x, w; write y (above); later calls only build descriptors and launch
        _launches[fast_key] = _Known(y.shape, bias is None or bias.is_contiguous(), launcher, meta)
    return y


def tuned_config(x: torch.Tensor, w: torch.Tensor, *, stride: int = 1, padding: int = 0) -> dict | None:
    """The launch options (tile, warps, stages) kept for this shape after a call, else None; the box
    kernel's (when a call ran it) with "kernel": "tma_box" and its BLOCK_SIZE_M (IMG x BH x BW) added."""
    k_out, R, S, _ = w.shape
    box = ("tma_box", *x.shape, k_out)
    for key, meta in _tuned_meta.items():
        if key[:6] == box and key[7:10] == (R, S, padding) and stride == 1:
            return meta | {"kernel": "tma_box", "BLOCK_SIZE_M": meta["IMG"] * meta["BH"] * meta["BW"]}
    for key, meta in _tuned_meta.items():
        if key[:5] == (x.shape[0], x.shape[1], x.shape[2], x.shape[3], k_out) and key[6:10] == (
            R,
            S,
            stride,
            padding,
        ):
            return meta
    return None
