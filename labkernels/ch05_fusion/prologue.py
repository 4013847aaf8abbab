"""Prologue fusion: int8 weights dequantised inside the matmul's loads.

Weight-only quantisation stores W as int8 with one scale per output column: W ≈ W_int8 * scale. Eager
torch first materialises the dequantised weights (`w.to(dtype) * scale`: two kernels, KN elements written
and read again) and then runs the matmul on them. Here each tile of W crosses HBM as int8, one byte per
element, and is converted and scaled in registers just before `tl.dot` (the *prologue* of the matmul):
read MK + KN/e + N, write MN elements (`labkernels.traffic.int8_matmul`). When M is small (decoding one
token per sequence) the weights are nearly all the traffic, so the matmul is memory-bound and reading half
the bytes of a 16-bit weight (a third or less of the eager path's) is the speed-up; when M is large the
matmul is compute-bound and fusing the prologue *costs* time: the conversion sits in the K loop and is
repeated for every row tile of A (M / BLOCK_SIZE_M times), and W must go through registers to be converted
instead of straight from the TMA unit into shared memory where the tensor cores read it.

So `int8_matmul` has two paths, chosen by M (`path="auto"`): the fused kernel for small M, and above
`FUSED_MAX_M` the one Inductor takes: dequantise W once (`dequantize`, one pass: read KN int8, write KN) and
run chapter 03's matmul on it. The fused kernel is chapter 03's tiled matmul with one change in the K loop;
it is written out here so the change is visible.

Up to `GEMV_MAX_M` rows (a decoding step) a matmul tile is the wrong shape: with 16-row tiles, 4096 columns
make a few dozen programs, too few for 132 SMs to stream W. `int8_gemv` picks a kernel by the weights' layout
and M (`gemv_design`): with W stored K-major (`quantize(w, k_major=True)`) every output's weights are one
contiguous run, streamed by a CUDA-core kernel at M = 1 and by a tl.dot kernel with W as the wide operand at
2-16 rows; with N contiguous, a 16-row tl.dot tile cut by columns *and* by K (split-K). The scale is applied
once per output, after the sum, as (x W_int8) s, not to every weight inside the K loop; the int8 conversion
uses integer adds instead of the GPU's slow int-to-float instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton.vector_add import BF16_ON_CPU
from labkernels.lane import LANE, on_gpu, require_device, sm_count
from labkernels.timing import autotune_bench, graph_autotune_bench

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _config(m, n, k, stages, warps, group=8):
    meta = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# Tiles by M, each list tried only in its range of M (`_prune`). Small M (a decoding step: memory-bound on W):
# 16-row tiles with long K steps, narrow enough that 4096 columns make ~128 programs for 132 SMs. Mid M (a
# batch of sequences): tiles of 32-128 rows and 64 columns; a 128 x 256 tile there leaves one row of 16
# programs for 132 SMs, and on the H200 it took 2-4x as long as the best of these (experiments/int8_tiles.py).
# Big M (compute-bound): big tiles.
SMALL_M_CONFIGS = [_config(16, 32, 256, 4, 4), _config(16, 64, 128, 4, 4), _config(16, 64, 256, 3, 4)]
MID_M_CONFIGS = [_config(32, 64, 128, 4, 4), _config(64, 64, 128, 4, 4), _config(128, 64, 64, 4, 4)]
BIG_M_CONFIGS = [_config(128, 256, 64, 3, 8), _config(128, 128, 64, 4, 8)]
GPU_CONFIGS = SMALL_M_CONFIGS + MID_M_CONFIGS + BIG_M_CONFIGS
SMALL_M, MID_M = 32, 512  # M up to SMALL_M tries the small tiles; up to MID_M the mid ones; above, the big
# path="auto" fuses up to this M and dequantises once above it: on the H200 the fused path was faster up to
# M = 128 in plain calls (labkernels/reference/ch05_int8_paths.csv) and in graph replays
# (ch05_int8_tiles.csv), and the dequantize path from M = 256 in graph replays. Re-measure with the
# `ch05_int8_paths` benchmark.
FUSED_MAX_M = 128
PATHS = ("auto", "gemv", "fused", "dequantize")


def _prune(configs, named_args, **kwargs):
    """Only the tiles made for this M are tuned: a few configs, not all, compile for a new shape."""
    m = named_args["M"]
    wanted = SMALL_M_CONFIGS if m <= SMALL_M else MID_M_CONFIGS if m <= MID_M else BIG_M_CONFIGS
    kept = [c for c in configs if c in wanted]
    return kept or configs


CPU_CONFIGS = [_config(32, 32, 32, 1, 4, group=4)]


def quantize(w: torch.Tensor, *, k_major: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-column int8: (w_int8 (K, N), scale (N,)) with w ≈ w_int8 * scale. `k_major=True` stores
    the same (K, N) values with K contiguous (strides (1, K)), as nn.Linear keeps its weight: each output's
    weights are one contiguous run of K bytes, the layout `int8_gemv` streams fastest at decode."""
    scale = w.abs().amax(dim=0).clamp(min=1e-8) / 127.0
    w_int8 = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    if k_major:
        w_int8 = w_int8.t().contiguous().t()
    return w_int8, scale.to(w.dtype)


def reference(a: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """In fp64: the higher-precision reference for the tests."""
    return a.double() @ (w_int8.double() * scale.double())


def eager(a: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    w = w_int8.to(a.dtype) * scale  # read KN int8, write KN; read KN + N, write KN
    return a @ w  # read MK + KN, write MN


@triton.jit
def _int8_matmul_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wk,
    stride_wn,
    stride_cm,
    stride_cn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    ALIGN: tl.constexpr = 1,  # N and the row strides are multiples of it (chapter 03's `row_alignment`)
):
    if ALIGN > 1:  # x // ALIGN * ALIGN is x, and the compiler now knows it: wide copies (chapter 03 says why)
        N = N // ALIGN * ALIGN
        stride_am = stride_am // ALIGN * ALIGN
        stride_wk = stride_wk // ALIGN * ALIGN
        stride_cm = stride_cm // ALIGN * ALIGN
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M  # wrapped rows: valid, never stored
    offs_wn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn
    scale = tl.load(scale_ptr + offs_wn).to(tl.float32)  # read N, once per program

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_SIZE_K):  # the full K-steps: unmasked loads (chapter 03's kernel says why)
        a = tl.load(a_ptrs)  # read BM x BK
        w = tl.load(w_ptrs)  # read BK x BN int8: half the bytes of a 16-bit weight
        # The prologue: dequantise in registers, rounded to a's dtype as `w.to(dtype) * scale` would be.
        b = (w.to(tl.float32) * scale[None, :]).to(a_ptr.dtype.element_ty)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        w_ptrs += BLOCK_SIZE_K * stride_wk
    if not EVEN_K:  # the ragged last step, once: masked lanes load 0 and add nothing
        k_remaining = K - (K // BLOCK_SIZE_K) * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        w = tl.load(w_ptrs, mask=offs_k[:, None] < k_remaining, other=0)
        b = (w.to(tl.float32) * scale[None, :]).to(a_ptr.dtype.element_ty)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)  # write MN


@triton.jit
def _dequantize_kernel(
    w_ptr, scale_ptr, out_ptr, K, N, stride_wk, stride_wn,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    offs_k = (tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)  # KN may pass 2^31
    offs_n = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # x a column stride of K
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    w = tl.load(w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn, mask=mask)  # read int8
    scale = tl.load(scale_ptr + offs_n, mask=offs_n < N).to(tl.float32)  # read N per program
    # rounded to the output dtype as eager's `w.to(dtype) * scale` is
    out = (w.to(tl.float32) * scale[None, :]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], out, mask=mask)  # write KN, contiguous


def _check_dequantize(w_int8: torch.Tensor, scale: torch.Tensor) -> None:
    require_device(w_int8, "dequantize: w_int8")
    require_device(scale, "dequantize: scale")
    if w_int8.dtype != torch.int8 or w_int8.dim() != 2:
        raise TypeError(
            f"dequantize: w_int8 must be a 2-D torch.int8 tensor, got {w_int8.dtype} {tuple(w_int8.shape)}"
        )
    if scale.dtype not in DTYPES or scale.shape != (w_int8.shape[1],):
        raise ValueError(
            f"dequantize: scale must be float16/bfloat16/float32 of shape ({w_int8.shape[1]},), "
            f"got {scale.dtype} {tuple(scale.shape)}"
        )
    if scale.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"dequantize: scale is bfloat16: {BF16_ON_CPU}")
    if torch.is_grad_enabled() and scale.requires_grad:
        raise RuntimeError("dequantize: scale requires grad, and this kernel has no backward")


@torch.library.custom_op(
    "labkernels::ch05_dequantize", mutates_args=(), schema="(Tensor w_int8, Tensor scale) -> Tensor"
)
def _dequantize_op(w_int8, scale):
    return dequantize(w_int8, scale)


@_dequantize_op.register_fake
def _(w_int8, scale):
    _check_dequantize(w_int8, scale)
    return torch.empty(w_int8.shape, device=w_int8.device, dtype=scale.dtype)


def dequantize(w_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w_int8 * scale in scale's dtype, (K, N) contiguous, in one pass (eager takes two: a cast, then a
    multiply). Any strides of w_int8."""
    _check_dequantize(w_int8, scale)
    if torch.compiler.is_compiling():  # the op: torch.compile traces it without a graph break
        return _dequantize_op(w_int8, scale)
    K, N = w_int8.shape
    out = torch.empty((K, N), device=w_int8.device, dtype=scale.dtype)
    if out.numel() == 0:
        return out
    block_k, block_n = (32, 32) if LANE == "cpu" else (64, 128)
    grid = (triton.cdiv(K, block_k), triton.cdiv(N, block_n))
    _dequantize_kernel[grid](
        w_int8, scale.contiguous(), out, K, N, *w_int8.stride(), BLOCK_K=block_k, BLOCK_N=block_n
    )
    return out


def _even_k(args: dict) -> bool:
    return args["K"] % args["BLOCK_SIZE_K"] == 0


_int8_matmul_tuned = triton.autotune(
    configs=GPU_CONFIGS if LANE == "gpu" else CPU_CONFIGS,
    key=["M", "N", "K", "INPUT_PRECISION"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=autotune_bench,
)(triton.heuristics({"EVEN_K": _even_k})(_int8_matmul_kernel))

# The winner per key, with its grid: after the first call a launch goes straight to the jitted kernel,
# without the autotuner's per-call bookkeeping on the host.
_tuned: dict[tuple, tuple[tuple, dict]] = {}


def _check(a, w_int8, scale, input_precision) -> None:
    require_device(a, "int8_matmul: a")
    require_device(w_int8, "int8_matmul: w_int8")
    require_device(scale, "int8_matmul: scale")
    if a.dtype not in DTYPES:
        raise TypeError(f"int8_matmul: a has dtype {a.dtype}; supported: float16, bfloat16, float32")
    if a.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"int8_matmul: {BF16_ON_CPU}")
    if w_int8.dtype != torch.int8:
        raise TypeError(f"int8_matmul: w_int8 must be torch.int8, got {w_int8.dtype} (see quantize())")
    if scale.dtype != a.dtype:
        raise TypeError(f"int8_matmul: scale is {scale.dtype} but a is {a.dtype}; pass one dtype")
    if a.dim() != 2 or w_int8.dim() != 2:
        raise ValueError(
            f"int8_matmul: a and w_int8 must be 2-D, got {tuple(a.shape)} and {tuple(w_int8.shape)}"
        )
    if a.shape[1] != w_int8.shape[0]:
        raise ValueError(f"int8_matmul: inner dimensions differ, a {tuple(a.shape)}, w {tuple(w_int8.shape)}")
    if scale.shape != (w_int8.shape[1],):
        raise ValueError(f"int8_matmul: scale must have shape ({w_int8.shape[1]},), got {tuple(scale.shape)}")
    if a.numel() == 0 or w_int8.numel() == 0:
        raise ValueError(f"int8_matmul: empty operand, a {tuple(a.shape)}, w {tuple(w_int8.shape)}")
    if input_precision not in ("ieee", "tf32"):
        raise ValueError(f"int8_matmul: input_precision must be 'ieee' or 'tf32', got {input_precision!r}")
    if torch.is_grad_enabled() and (a.requires_grad or scale.requires_grad):
        raise RuntimeError(
            "int8_matmul: inputs require grad, but this fused kernel has no backward; call it under "
            "torch.no_grad() or use `eager` for training"
        )


@torch.library.custom_op(
    "labkernels::ch05_int8_matmul",
    mutates_args=(),
    schema="(Tensor a, Tensor w_int8, Tensor scale, str input_precision='ieee', str path='auto') -> Tensor",
)
def _int8_matmul_op(a, w_int8, scale, input_precision="ieee", path="auto"):
    return int8_matmul(a, w_int8, scale, input_precision=input_precision, path=path)


@_int8_matmul_op.register_fake
def _(a, w_int8, scale, input_precision="ieee", path="auto"):
    _check(a, w_int8, scale, input_precision)
    if path not in PATHS:
        raise ValueError(f"int8_matmul: path must be one of {PATHS}, got {path!r}")
    return torch.empty((a.shape[0], w_int8.shape[1]), device=a.device, dtype=a.dtype)


def int8_matmul(
    a: torch.Tensor,
    w_int8: torch.Tensor,
    scale: torch.Tensor,
    *,
    input_precision: str = "ieee",
    path: str = "auto",
) -> torch.Tensor:
    """a @ (w_int8 * scale); a (M, K) float, w_int8 (K, N) int8, scale (N,) in a's dtype; any strides.
    Result (M, N) in a's dtype, accumulated in fp32.

    path: "gemv" (M <= GEMV_MAX_M) is `int8_gemv`; "fused" dequantises in the matmul's loads (W read once,
    as int8); "dequantize" writes the 16-bit weights once and runs chapter 03's matmul on them (read KN int8,
    write KN, then the matmul reads KN); "auto" fuses when M <= FUSED_MAX_M, where the matmul is
    memory-bound on W, and the offsets fit 32 bits. Under torch.compile it is the op
    `labkernels::ch05_int8_matmul`, traced without a graph break."""
    _check(a, w_int8, scale, input_precision)  # in both paths: the same clear error, compiled or not
    if torch.compiler.is_compiling():
        return _int8_matmul_op(a, w_int8, scale, input_precision, path)
    if path not in PATHS:
        raise ValueError(f"int8_matmul: path must be one of {PATHS}, got {path!r}")
    wide = matmul_mod.needs_int64(a, w_int8)  # the fused kernel's offsets are 32-bit
    gemv_fits = a.shape[0] <= GEMV_MAX_M and _gemv_reach(a, w_int8) < 2**31
    if path == "gemv" or (path == "auto" and GEMV_AUTO and gemv_fits):
        return int8_gemv(a, w_int8, scale, input_precision=input_precision)  # 64-bit offsets for W
    if path == "dequantize" or (path == "auto" and (a.shape[0] > FUSED_MAX_M or wide)):
        return matmul_mod.matmul(a, dequantize(w_int8, scale), input_precision=input_precision)
    if wide:
        raise ValueError(
            "int8_matmul: path='fused' indexes with 32-bit offsets and these operands (or C) reach past "
            "2^31 elements; use path='auto' or 'dequantize' (64-bit offsets)"
        )
    return _fused(a, w_int8, scale, input_precision)


def _fused(a: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, input_precision: str) -> torch.Tensor:
    """The prologue-fused kernel: the tuned config kept per shape, as chapter 03's matmul does."""
    (M, K), N = a.shape, w_int8.shape[1]
    scale = scale.contiguous()
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    precision = input_precision if a.dtype == torch.float32 else "tf32"  # ignored for 16-bit inputs
    strides = (*a.stride(), *w_int8.stride(), *c.stride())
    args = (a, w_int8, scale, c, M, N, K, *strides)
    align = matmul_mod.row_alignment(N, strides)  # per call: the key holds the sizes, not the strides
    key = (M, N, K, a.dtype, precision)
    tuned = _tuned.get(key)
    if tuned is not None:
        grid, meta = tuned
        _int8_matmul_kernel[grid](*args, INPUT_PRECISION=precision, ALIGN=align, **meta)
        return c

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)

    _int8_matmul_tuned[grid](*args, INPUT_PRECISION=precision, ALIGN=align)
    meta = _int8_matmul_tuned.best_config.all_kwargs()
    meta["EVEN_K"] = _even_k({"K": K, **meta})
    _tuned[key] = (grid(meta), meta)
    return c


# --- the GEMV for a few rows (a decoding step) ------------------------------------------------------------

GEMV_MAX_M = 16  # rows padded to tl.dot's minimum of 16
# path="auto" takes the GEMV up to GEMV_MAX_M rows: on the H200 (graph replays, M = 1 and 16, N x K = 4096 x
# 4096 and 14336 x 4096) it was faster than the fused matmul kernel at every point; on K-major weights it
# was 1.72-1.97x cuBLAS on bf16 weights at M = 1 and 1.17-1.43x at M = 16 (reference/ch05_int8_gemv.csv).
GEMV_AUTO = True
# (BLOCK_N, BLOCK_K, warps, stages, programs per SM): the split-K count is chosen so that the column tiles
# times the K slices give about that many programs an SM (0: one slice, no second kernel). The GPU lane
# times a design's candidates once per shape. Three designs, by the weights' layout and M:
# - "cols": W with N contiguous (`quantize`'s default): chapter 05's first GEMV, a 16-row tl.dot tile.
# - "row": W stored K-major (`quantize(w, k_major=True)`) and M = 1: the CUDA cores, no tensor core.
# - "rows_dot": W stored K-major and 2 to 16 rows: tl.dot, a times the converted weight tile transposed.
# The K-major candidates are the best of a sweep on the H200 (experiments/weight_gemv.py).
GEMV_GPU_CONFIGS = {
    "cols": [
        (64, 256, 4, 4, 2), (128, 128, 4, 4, 2), (32, 256, 4, 4, 4), (64, 128, 4, 5, 4), (32, 256, 4, 4, 0),
    ],
    "row": [(16, 512, 4, 3, 0), (32, 256, 4, 3, 0), (16, 512, 8, 1, 0)],
    "rows_dot": [(64, 128, 4, 3, 2), (64, 128, 4, 4, 0), (128, 256, 4, 4, 0)],
}
GEMV_CPU_CONFIG = {"cols": (32, 32, 4, 1, 2), "row": (16, 32, 4, 1, 2), "rows_dot": (16, 32, 4, 1, 2)}
# How each design converts int8 when `magic` is not given: integer adds (True) or the plain cast. On the H200
# the adds made "row" 1.27-1.28x faster (graph replays, bf16) and "rows_dot" 1.07-1.10x slower: where the MMA
# bounds the loop, the cast to bf16 is one instruction and the adds are three (reference/ch05_int8_gemv.csv).
GEMV_MAGIC = {"cols": True, "row": True, "rows_dot": False}


def gemv_design(a: torch.Tensor, w_int8: torch.Tensor) -> str:
    """Which GEMV kernel `int8_gemv` runs: "row" or "rows_dot" (W stored K-major), or "cols"."""
    k_major = w_int8.stride(0) == 1 and w_int8.stride(1) != 1
    if not k_major:
        return "cols"
    return "row" if a.shape[0] == 1 else "rows_dot"


@triton.jit
def _int8_gemv_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr,  # a (M, K); w (K, N) int8; scale (N,); out (M, N) or (splits, M, N)
    M, N, K, stride_am, stride_ak, stride_wk, stride_wn, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr, MAGIC: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)  # which BLOCK_N columns
    pid_k = tl.program_id(1)  # which slice of K: k_per_split rows of W, a multiple of BLOCK_K
    offs_m = tl.arange(0, BLOCK_M) % M  # wrapped rows: valid addresses, never stored
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = pid_k * k_per_split + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k.to(tl.int64)[:, None] * stride_wk + offs_n.to(tl.int64)[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = tl.minimum(pid_k * k_per_split + k_per_split, K)
    for k in range(pid_k * k_per_split, k_end, BLOCK_K):
        if EVEN_K:  # every step full: unmasked loads
            a = tl.load(a_ptrs)  # read M x BK (L2 serves it to every column tile)
            w = tl.load(w_ptrs)  # read BK x BN int8, once: nearly all the bytes
        else:  # only the last step of the last slice is ragged; masked lanes add 0
            a = tl.load(a_ptrs, mask=(k + tl.arange(0, BLOCK_K))[None, :] < K, other=0.0)
            w = tl.load(w_ptrs, mask=(k + tl.arange(0, BLOCK_K))[:, None] < K, other=0)
        if MAGIC and a.dtype == tl.float16:  # the half 0x6400 | (w + 128) is 1152 + w: one integer add
            b = (w.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
        elif MAGIC and a.dtype == tl.bfloat16:  # fp32 2^23 + 128 + w, minus 2^23 + 128: w, whose top 16 bits
            f = (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0  # are its bf16
            b = (f.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            b = w.to(a.dtype)  # exact: |w| <= 127 fits every float type
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)  # the scale is not here: once, at the end
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT:  # fp32 partial sums, one (M, N) slice per K slice; `_int8_gemv_sum_kernel` adds and scales them
        part = out_ptr + pid_k.to(tl.int64) * M * N + rows[:, None] * N + cols[None, :]
        tl.store(part, acc, mask=mask)  # write M x BN fp32 (it stays in L2 for the sum)
    else:
        scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)  # read BN, once
        out = acc * scale[None, :]  # the epilogue: (x W_int8) s
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _int8_gemv_sum_kernel(
    part_ptr, scale_ptr, out_ptr, n_elements, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr
):
    """out = (sum of the K slices' fp32 partials, in slice order: deterministic) * scale, in out's dtype."""
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # splits x MN may pass 2^31
    mask = offs < n_elements
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLITS):
        total += tl.load(part_ptr + s * n_elements + offs, mask=mask, other=0.0)  # read splits x MN fp32
    scale = tl.load(scale_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (total * scale).to(out_ptr.dtype.element_ty), mask=mask)  # write MN


@triton.jit
def _int8_as_f32(w, MAGIC: tl.constexpr):
    """int8 -> fp32, exact. MAGIC: 2^23 + 128 + w as float bits, minus 2^23 + 128 (an integer add and a float
    subtract, full-rate) instead of the int-to-float instruction, which runs at a quarter of the rate."""
    if MAGIC:
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
    return w.to(tl.float32)


@triton.jit
def _int8_gemv_row_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr,  # a (1, K); w (K, N) int8 stored K-major: w[k, n] at n * stride_wn + k
    N, K, stride_ak, stride_wn, k_per_split,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SPLIT: tl.constexpr,
    MAGIC: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    """One row of a: no tensor core. Each program streams BLOCK_N outputs' contiguous weight rows, converts
    them in registers and multiplies on the CUDA cores into a (BLOCK_N, BLOCK_K) tile of fp32 partial sums,
    summed across K once, after the loop (a reduction per step would cost shuffles in the loop)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped rows: valid addresses, never stored
    k_start = pid_k * k_per_split
    offs_k = k_start + tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    a_ptrs = a_ptr + offs_k * stride_ak
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k in tl.range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            w = tl.load(w_ptrs)  # read BN x BK int8: nearly all the bytes
            a = tl.load(a_ptrs)  # read BK (L1/L2 serve it to every program)
        else:  # masked lanes add 0
            in_k = (k + tl.arange(0, BLOCK_K)) < K
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0)
            a = tl.load(a_ptrs, mask=in_k, other=0.0)
        acc += _int8_as_f32(w, MAGIC) * a.to(tl.float32)[None, :]  # the scale is not here: once, at the end
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K * stride_ak
    total = tl.sum(acc, axis=1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if SPLIT:  # fp32 partial sums, one row of N a K slice; `_int8_gemv_sum_kernel` adds and scales them
        tl.store(out_ptr + pid_k.to(tl.int64) * N + cols, total, mask=cols < N)  # write BN fp32
    else:
        scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)  # read BN, once
        tl.store(out_ptr + cols, (total * scale).to(out_ptr.dtype.element_ty), mask=cols < N)  # write BN


@triton.jit
def _int8_gemv_rows_dot_kernel(
    a_ptr, w_ptr, scale_ptr, out_ptr,  # a (M, K), M <= 16; w (K, N) int8 stored K-major; out or partials
    M, N, K, stride_am, stride_ak, stride_wn, k_per_split,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, SPLIT: tl.constexpr,
    MAGIC: tl.constexpr, STAGES: tl.constexpr, INPUT_PRECISION: tl.constexpr,
):  # fmt: skip
    """2 to 16 rows on the tensor cores: a (padded to tl.dot's 16 rows) times the converted weight tile,
    transposed in registers. W is loaded as its K-major rows are stored (BN rows of BK contiguous bytes); on
    the H200 this orientation beat W as the MMA's left operand by 1.16-1.43x (experiments/weight_gemv.py)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N  # wrapped rows of W: valid addresses, never stored
    k_start = pid_k * k_per_split
    offs_k = k_start + tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, 16)
    m_ok = offs_m[:, None] < M
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for k in tl.range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            w = tl.load(w_ptrs)  # read BN x BK int8: nearly all the bytes
            a = tl.load(a_ptrs, mask=m_ok, other=0.0)  # read M x BK (L1/L2 serve it to every program)
        else:  # masked lanes add 0
            in_k = (k + tl.arange(0, BLOCK_K)) < K
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0)
            a = tl.load(a_ptrs, mask=m_ok & in_k[None, :], other=0.0)
        b = _int8_as_f32(w, MAGIC).to(a_ptr.dtype.element_ty)  # exact: |w| <= 127
        acc = tl.dot(a, tl.trans(b), acc, input_precision=INPUT_PRECISION)  # the scale is not here
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K * stride_ak
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = m_ok & (cols[None, :] < N)
    if SPLIT:  # fp32 partial sums (splits, M, N); `_int8_gemv_sum_kernel` adds and scales them
        tl.store(out_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + cols[None, :], acc, mask=mask)
    else:
        scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)  # read BN, once
        out = (acc * scale[None, :]).to(out_ptr.dtype.element_ty)  # the epilogue: (a W_int8) s
        tl.store(out_ptr + offs_m[:, None] * N + cols[None, :], out, mask=mask)  # write M x BN


def gemv_splits(
    n: int, k: int, block_n: int, block_k: int, programs_per_sm: int, sms: int
) -> tuple[int, int]:
    """(splits, k_per_split): K cut into slices of whole BLOCK_K steps until the column tiles times the slices
    give `programs_per_sm` programs an SM; one slice when the column tiles alone do."""
    tiles, steps = triton.cdiv(n, block_n), triton.cdiv(k, block_k)
    splits = max(1, min(triton.cdiv(programs_per_sm * sms, tiles), steps))
    steps_per_split = triton.cdiv(steps, splits)
    return triton.cdiv(steps, steps_per_split), steps_per_split * block_k  # no empty slice


def _gemv_launch(a, w_int8, scale, out, partials, precision, config, magic=None) -> tuple[int, object]:
    """Both launches of one config into `out` (and `partials`, (splits, M, N) fp32, when K is split):
    (splits, launcher(a, w_int8, scale, out, partials)) for later calls with the same key (`launch_cache`)."""
    (M, K), N = a.shape, w_int8.shape[1]
    block_n, block_k, warps, stages, per_sm = config
    splits, k_per_split = gemv_splits(N, K, block_n, block_k, per_sm, sm_count(a.device))
    target = partials[:splits] if splits > 1 else out
    design = gemv_design(a, w_int8)
    magic = GEMV_MAGIC[design] if magic is None else magic
    meta = dict(BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=K % block_k == 0, SPLIT=splits > 1, MAGIC=magic,
                num_warps=warps, num_stages=stages)  # fmt: skip
    if design == "cols":
        kernel = _int8_gemv_kernel
        args = (a, w_int8, scale, target, M, N, K, *a.stride(), *w_int8.stride(), k_per_split)
        meta |= dict(BLOCK_M=GEMV_MAX_M, INPUT_PRECISION=precision)
    elif design == "row":
        kernel = _int8_gemv_row_kernel
        args = (a, w_int8, scale, target, N, K, a.stride(1), w_int8.stride(1), k_per_split)
        meta |= dict(STAGES=stages)
    else:
        kernel = _int8_gemv_rows_dot_kernel
        args = (a, w_int8, scale, target, M, N, K, *a.stride(), w_int8.stride(1), k_per_split)
        meta |= dict(STAGES=stages, INPUT_PRECISION=precision)
    gemv = launch_cache.launch(kernel, (triton.cdiv(N, block_n), splits), args, meta)
    if splits == 1:
        return 1, lambda a, w_int8, scale, out, partials: gemv(a, w_int8, scale, out)
    block = 1024 if LANE == "gpu" else 256
    grid = (triton.cdiv(M * N, block),)
    add = launch_cache.launch(
        _int8_gemv_sum_kernel, grid, (target, scale, out, M * N, N), dict(SPLITS=splits, BLOCK=block)
    )

    def both(a, w_int8, scale, out, partials):
        gemv(a, w_int8, scale, partials)  # read KN int8 + MK, write splits x MN fp32
        add(partials, scale, out)  # read splits x MN fp32 + N, write MN

    return splits, both


def _candidates(design: str) -> list[tuple]:
    return GEMV_GPU_CONFIGS[design] if LANE == "gpu" else [GEMV_CPU_CONFIG[design]]


def _max_splits(N: int, K: int, device, design: str = "cols") -> int:
    return max(gemv_splits(N, K, c[0], c[1], c[4], sm_count(device))[0] for c in _candidates(design))


_gemv_configs: dict[tuple, tuple] = {}  # the fastest config per shape, timed once on the GPU lane


def _gemv_config(a, w_int8, scale, out, partials, precision) -> tuple:
    design = gemv_design(a, w_int8)
    key = (*a.shape, w_int8.shape[1], a.dtype, precision, design)
    if LANE != "gpu":
        return GEMV_CPU_CONFIG[design]
    if key not in _gemv_configs:

        def time_of(config):
            try:
                _, launcher = _gemv_launch(a, w_int8, scale, out, partials, precision, config)
            except triton.runtime.errors.OutOfResources:  # e.g. fp32 rows: the tile's stages outgrow shared
                return float("inf")  # memory; the first candidate of each design fits every dtype
            return graph_autotune_bench(lambda: launcher(a, w_int8, scale, out, partials))[0]

        _gemv_configs[key] = min(GEMV_GPU_CONFIGS[design], key=time_of)
    return _gemv_configs[key]


# Per key (shapes, strides, dtypes, alignment, options): (splits, launcher, scale contiguous); a known key
# skips the checks and the plan, and only allocates and launches.
_gemv_known = launch_cache.KeyedLaunches()


def _gemv_key(a, w_int8, scale, input_precision, config, magic) -> tuple:
    key = ()
    for t in (a, w_int8, scale):
        key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0, t.requires_grad)
    return (*key, torch.is_grad_enabled(), type(input_precision), input_precision, config, type(magic), magic)


def _check_gemv_config(config) -> tuple:
    """(BLOCK_N, BLOCK_K, warps, stages, programs per SM) as given, or a clear error: blocks are powers of two
    of at least 16 (tl.dot's least), warps a power of two, stages and programs per SM counts."""
    names = ("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "programs per SM")
    if not isinstance(config, (tuple, list)) or len(config) != 5 or not all(type(c) is int for c in config):
        raise ValueError(f"int8_gemv: config must be 5 ints {names}, got {config!r}")
    block_n, block_k, warps, stages, per_sm = config
    for name, value in zip(names[:3], (block_n, block_k, warps), strict=True):
        least = 1 if name == "num_warps" else 16
        if value < least or value & (value - 1):
            raise ValueError(f"int8_gemv: config's {name} must be a power of two >= {least}, got {value}")
    if stages < 1 or per_sm < 0:
        raise ValueError(f"int8_gemv: config needs num_stages >= 1 and programs per SM >= 0, got {config!r}")
    return tuple(config)


@torch.library.custom_op(
    "labkernels::ch05_int8_gemv",
    mutates_args=(),
    schema="(Tensor a, Tensor w_int8, Tensor scale, str input_precision='ieee', int[]? config=None, "
    "bool? magic=None) -> Tensor",
)
def _int8_gemv_op(a, w_int8, scale, input_precision="ieee", config=None, magic=None):
    return int8_gemv(a, w_int8, scale, input_precision=input_precision, config=config, magic=magic)


@_int8_gemv_op.register_fake
def _(a, w_int8, scale, input_precision="ieee", config=None, magic=None):
    _check_gemv(a, w_int8, scale, input_precision, config, magic)
    return torch.empty((a.shape[0], w_int8.shape[1]), device=a.device, dtype=a.dtype)


def _gemv_reach(a: torch.Tensor, w_int8: torch.Tensor) -> int:
    """The largest offset the GEMV kernels compute in 32 bits: into a (its strides), and into the (M, N)
    output and partials. W's offsets are 64-bit."""
    (m, k), n = a.shape, w_int8.shape[1]
    return max((m - 1) * a.stride(0) + (k - 1) * a.stride(1), m * n - 1)


def _check_gemv(a, w_int8, scale, input_precision, config, magic) -> None:
    _check(a, w_int8, scale, input_precision)
    if a.shape[0] > GEMV_MAX_M:
        raise ValueError(
            f"int8_gemv: a has {a.shape[0]} rows; the GEMV takes 1 to {GEMV_MAX_M} (use int8_matmul)"
        )
    if _gemv_reach(a, w_int8) >= 2**31:
        raise ValueError(
            f"int8_gemv: a {tuple(a.shape)} with strides {a.stride()} and an output of {a.shape[0]} x "
            f"{w_int8.shape[1]} reach past 2^31 elements, and the GEMV indexes them with 32-bit offsets; use "
            "int8_matmul(path='dequantize') (64-bit offsets)"
        )
    if magic is not None and not isinstance(magic, bool):
        raise TypeError(f"int8_gemv: magic must be True, False or None (the design's default), got {magic!r}")
    if config is not None:
        _check_gemv_config(config)


def int8_gemv(
    a: torch.Tensor, w_int8: torch.Tensor, scale: torch.Tensor, *, input_precision: str = "ieee", config=None,
    magic: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """a @ (w_int8 * scale) for a (M, K) with M <= GEMV_MAX_M, computed as (a @ w_int8) * scale: a
    GEMV/split-K kernel, then (when K is split) a kernel that adds the slices in order and scales. Same
    arguments as `int8_matmul`; `config` = (BLOCK_N, BLOCK_K, warps, stages, programs per SM; 0: one K slice)
    overrides the tuned one; `magic` picks how int8 is converted: by integer adds (True) or the plain
    cast (False; the GPU's int-to-float instruction); None takes the design's faster (`GEMV_MAGIC`).
    Under torch.compile it is the op `labkernels::ch05_int8_gemv`, traced without a graph break."""
    if torch.compiler.is_compiling():  # the same clear errors as a plain call, then the op
        _check_gemv(a, w_int8, scale, input_precision, config, magic)
        config = None if config is None else list(config)
        return _int8_gemv_op(a, w_int8, scale, input_precision, config, magic)
    try:
        key = _gemv_key(a, w_int8, scale, input_precision, config, magic)
        known = _gemv_known.get(key)
    except Exception:  # not tensors, unhashable options: the checks say so
        key = known = None
    if known is not None:
        splits, launcher, scale_contiguous = known
        out = a.new_empty((a.shape[0], w_int8.shape[1]))
        partials = a.new_empty((splits, *out.shape), dtype=torch.float32) if splits > 1 else out
        launcher(a, w_int8, scale if scale_contiguous else scale.contiguous(), out, partials)
        return out
    _check_gemv(a, w_int8, scale, input_precision, None, magic)
    (M, K), N = a.shape, w_int8.shape[1]
    contiguous_scale = scale.contiguous()
    precision = input_precision if a.dtype == torch.float32 else "tf32"  # ignored for 16-bit inputs
    out = torch.empty((M, N), device=a.device, dtype=a.dtype)
    if config is None:  # partials for the most slices any tuned config cuts K into
        splits = _max_splits(N, K, a.device, gemv_design(a, w_int8))
        partials = torch.empty((splits, M, N), device=a.device, dtype=torch.float32)
        chosen = _gemv_config(a, w_int8, contiguous_scale, out, partials, precision)
    else:  # partials for this config's slices: no launch writes past them
        chosen = _check_gemv_config(config)
        splits = gemv_splits(N, K, chosen[0], chosen[1], chosen[4], sm_count(a.device))[0]
        partials = torch.empty((splits, M, N), device=a.device, dtype=torch.float32)
    splits, launcher = _gemv_launch(a, w_int8, contiguous_scale, out, partials, precision, chosen, magic)
    if key is not None:
        _gemv_known[key] = (splits, launcher, scale.is_contiguous())
    return out
