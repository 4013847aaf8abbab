"""RMSNorm with the residual add fused in: a reduction and the pointwise ops around it, in one pass.

A transformer block computes `h = x + residual` and then `y = h / sqrt(mean(h^2) + eps) * weight`, and
passes both on (h is the next block's residual). Eager torch runs about nine kernels with fp32 intermediates
(`reference`); one program that holds its rows in registers reads x, residual and weight once and writes y
and h once: read 2MN + N, write 2MN (`labkernels.traffic.rmsnorm_residual`). The row's sum of squares is a
reduction *inside* the program (`tl.sum`), so nothing but the two outputs goes back to HBM.

What speed needs: the whole row in registers (BLOCK_SIZE_N = next_power_of_2(N)), 16-byte accesses (row
length and strides passed in whole vectors, as chapter 03's softmax does) and enough warps for the row width.
Cache hints (evict first for x and residual, evict last for the weight) were tried and made it slower.
Backward: the kernel runs the forward; `torch.autograd` gets the gradients from torch ops (recomputing the
normalisation from h), so the op is usable in training.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from labkernels.ch03_triton.vector_add import BF16_ON_CPU
from labkernels.hostmath import cdiv, next_power_of_2
from labkernels.lane import on_gpu, require_device

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_COLS = 65536  # a row must fit one program's registers


def reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h): the eager composition, statistics in fp32 as real models compute them. Kernels (M rows of N;
    fp32 intermediates; the casts are no-ops in fp32): see `labkernels.traffic.rmsnorm_residual`."""
    h = x + residual  # read 2MN, write MN
    hf = h.float()  # read MN, write MN fp32
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)  # pow: MN -> MN; mean: MN -> M; +eps, rsqrt
    y = (hf * rstd * weight.float()).to(h.dtype)  # read MN + M, write MN; read MN + N, write MN; cast
    return y, h


@triton.jit
def _rmsnorm_residual_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    y_ptr,
    h_ptr,
    n_rows,
    n_col_vecs,  # the row length in whole VEC-element vectors
    x_row_vecs,  # row strides, in vectors
    r_row_vecs,
    eps,
    BLOCK_SIZE_M: tl.constexpr,  # rows per program
    BLOCK_SIZE_N: tl.constexpr,  # next_power_of_2(N)
    VEC: tl.constexpr,
    INT64: tl.constexpr,
):
    n_cols = n_col_vecs * VEC  # multiplying by the constexpr VEC proves 16-byte alignment to the compiler
    rows = tl.program_id(axis=0) * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    if INT64:  # row * stride past 2^31 elements
        rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x_offs = rows[:, None] * (x_row_vecs * VEC) + cols[None, :]
    r_offs = rows[:, None] * (r_row_vecs * VEC) + cols[None, :]
    o_offs = rows[:, None] * n_cols + cols[None, :]  # outputs are contiguous
    # No cache hints: with evict_first on x and residual and evict_last on w it ran slower on the H200
    # (16384 x 4096, bf16 and fp32, in a sweep of launch configurations); w is 8 KB and stays in L2 anyway.
    x = tl.load(x_ptr + x_offs, mask=mask, other=0.0)  # read MN
    r = tl.load(r_ptr + r_offs, mask=mask, other=0.0)  # read MN
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0)  # read N (from L2 after the first rows)
    # h is rounded to the storage dtype before it is normalised, as eager torch does: y agrees with the h
    # that is handed on.
    h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + o_offs, h, mask=mask)  # write MN
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=1) / n_cols + eps)  # padded lanes add 0
    y = hf * rstd[:, None] * w.to(tl.float32)[None, :]
    tl.store(y_ptr + o_offs, y.to(y_ptr.dtype.element_ty), mask=mask)  # write MN


def _vector_width(n_cols: int, *tensors: torch.Tensor) -> int:
    """Elements per 16-byte vector that the row length, every row stride and every base address allow."""
    vec = 16 // tensors[0].element_size()
    while vec > 1 and any(
        n_cols % vec or (t.dim() == 2 and t.stride(0) % vec) or t.data_ptr() % (vec * t.element_size())
        for t in tensors
    ):
        vec //= 2
    return vec


@functools.lru_cache(maxsize=1024)
def launch_config(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps). On the GPU one row per program from 1024 columns up, with
    ~16 elements per thread (4096 columns: 8 warps); narrow rows are packed to ~2048 elements a program.
    The interpreter pays per program: big tiles."""
    block_n = next_power_of_2(n_cols)
    elements = 2048 if on_gpu() else 16384
    block_m = max(1, min(elements // block_n, next_power_of_2(n_rows)))
    num_warps = min(16, max(1, block_m * block_n // 512))
    return block_m, block_n, num_warps


def _check(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        require_device(t, f"rmsnorm_residual: {name}")
        if t.dtype not in DTYPES:
            raise TypeError(
                f"rmsnorm_residual: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32"
            )
        if t.dtype != x.dtype:
            raise TypeError(f"rmsnorm_residual: {name} is {t.dtype} but x is {x.dtype}; pass one dtype")
    if x.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"rmsnorm_residual: {BF16_ON_CPU}")
    if x.dim() != 2:
        raise ValueError(
            f"rmsnorm_residual: x must be 2-D (rows, N), got {tuple(x.shape)}; use x.reshape(-1, x.shape[-1])"
        )
    if residual.shape != x.shape:
        raise ValueError(f"rmsnorm_residual: residual is {tuple(residual.shape)} but x is {tuple(x.shape)}")
    if weight.shape != (x.shape[1],):
        raise ValueError(
            f"rmsnorm_residual: weight must have shape ({x.shape[1]},), got {tuple(weight.shape)}"
        )
    if x.numel() == 0:
        raise ValueError(f"rmsnorm_residual: x is empty, shape {tuple(x.shape)}")
    if x.shape[1] > MAX_COLS:
        raise ValueError(f"rmsnorm_residual: rows of {x.shape[1]} > {MAX_COLS} do not fit one program")
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        if t.stride(-1) != 1:
            raise ValueError(
                f"rmsnorm_residual: {name}'s rows are not contiguous (strides {t.stride()}); "
                "pass .contiguous()"
            )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"rmsnorm_residual: eps must be a Python float, got {type(eps).__name__} {eps!r}")
    if not 0 < eps < math.inf:
        raise ValueError(f"rmsnorm_residual: eps must be positive and finite, got {eps}")


def _forward(x, residual, weight, eps):
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), device=x.device, dtype=x.dtype)
    h = torch.empty_like(y)
    vec = _vector_width(n_cols, x, residual, weight, y, h)
    block_m, block_n, warps = launch_config(n_rows, n_cols)
    int64 = n_rows * max(x.stride(0), residual.stride(0), n_cols) + block_m * n_cols >= 2**31
    grid = (cdiv(n_rows, block_m),)
    _rmsnorm_residual_kernel[grid](
        x, residual, weight, y, h, n_rows, n_cols // vec, x.stride(0) // vec, residual.stride(0) // vec,
        eps, BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, VEC=vec, INT64=int64, num_warps=warps,
    )  # fmt: skip
    return y, h


# torch.library: the op torch.compile traces without a graph break, with its backward in torch ops.
@torch.library.custom_op(
    "labkernels::ch05_rmsnorm_residual",
    mutates_args=(),
    schema="(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
)
def _rmsnorm_op(x, residual, weight, eps):
    return _forward(x, residual, weight, eps)


@_rmsnorm_op.register_fake
def _(x, residual, weight, eps):
    _check(x, residual, weight, eps)
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    return y, torch.empty_like(y)


def _setup_context(ctx, inputs, output):
    _, _, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps


def _rmsnorm_backward(ctx, dy, dh_out):
    h, weight = ctx.saved_tensors
    hf = h.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + ctx.eps)
    normed = hf * rstd
    dy = dy.float()
    dw = (dy * normed).sum(0).to(weight.dtype)
    dn = dy * weight.float()
    dh = rstd * (dn - normed * (dn * normed).mean(-1, keepdim=True)) + dh_out.float()
    dh = dh.to(h.dtype)
    return dh, dh, dw, None  # h = x + residual: both get dh


_rmsnorm_op.register_autograd(_rmsnorm_backward, setup_context=_setup_context)


def rmsnorm_residual(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) with h = x + residual and y = h * rsqrt(mean(h^2, -1) + eps) * weight, in one kernel.

    x, residual: (M, N) with contiguous rows (any row stride); weight: (N,); one dtype. Outputs contiguous.
    Differentiable: the gradients come from torch ops in the backward. The op is
    `labkernels::ch05_rmsnorm_residual`, which torch.compile traces without a graph break."""
    _check(x, residual, weight, eps)
    wants_grad = torch.is_grad_enabled() and (
        x.requires_grad or residual.requires_grad or weight.requires_grad
    )
    if wants_grad or torch.compiler.is_compiling():
        return _rmsnorm_op(x, residual, weight, float(eps))  # torch.library: autograd, torch.compile
    return _forward(x, residual, weight, eps)
