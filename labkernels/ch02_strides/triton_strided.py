"""Copying a 2-D view into a contiguous tensor in Triton, three ways, and a stride-aware add+relu.

A kernel receives `data_ptr()` and nothing else about the layout unless we pass the strides. Three copies of
a (M, N) view `x` into a contiguous `out`, each moving the same bytes (read MN, write MN elements):

(a) `copy_flat`: reads M*N elements in a row from data_ptr. Right only for a contiguous x; for a transposed
    square matrix it reads the same storage in the wrong order and returns the wrong numbers, silently.
(b) `copy_2d_naive`: each program takes a block of *output* elements, splits each flat index into (m, n)
    and reads x at m*stride_xm + n*stride_xn. Correct for any view; writes are coalesced, but for a
    transposed x neighbouring threads read addresses M elements apart: one 32-byte sector per 4 bytes.
(c) `copy_2d_tiled`: each program copies a BLOCK_M x BLOCK_N tile. The load walks x's contiguous
    dimension and the store walks out's; on a GPU Triton gives the two a different register layout and
    swaps them through shared memory, so both reads and writes are coalesced.

`add_relu_2d` is (c) for relu(x + y) with its own strides for each input (an expanded bias has stride 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.ch02_strides.views import check_out, check_view, flat_read_overrun_bytes, storage_numel
from labkernels.lane import LANE, require_device
from labkernels.timing import autotune_bench


def reference(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of any view: torch reads it through its strides."""
    return x.clone(memory_format=torch.contiguous_format)  # read MN, write MN


def reference_add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y).contiguous()  # read 2MN, write MN


# --- checks shared by the launchers -------------------------------------------------------------------------

_INT32_MAX = 2**31 - 1


def _check_input(x: torch.Tensor, name: str, ndim: int | None = 2) -> None:
    check_view(x, name, ndim=ndim)
    require_device(x, name)
    _check_no_grad(x, name)


def _check_no_grad(x: torch.Tensor, name: str) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(
            f"{name} requires grad, but these Triton kernels record no backward: use "
            "labkernels.ch02_strides.ops (C++/CUDA, with a backward), or detach() / torch.no_grad()"
        )
    if x.dtype == torch.bfloat16 and LANE == "cpu":
        raise TypeError(f"{name} is bfloat16, which the Triton interpreter (CPU lane) computes wrongly")


def _needs_int64(*tensors: torch.Tensor) -> bool:
    """Element offsets computed in int32 wrap past 2**31 - 1: use int64 when any view reaches that far."""
    return any(storage_numel(t) + 2**16 > _INT32_MAX or t.numel() + 2**16 > _INT32_MAX for t in tensors)


# --- (a) contiguous-only ------------------------------------------------------------------------------------


@triton.jit
def _copy_flat_kernel(
    x_ptr,  # *Pointer* to x's first element (data_ptr): nothing else about its layout is known
    out_ptr,  # *Pointer* to the contiguous output
    n_elements,  # how many elements to copy
    BLOCK_SIZE: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)  # flat offsets: assumes x is contiguous
    tl.store(out_ptr + offs, x, mask=mask)


def copy_flat(
    x: torch.Tensor, out: torch.Tensor | None = None, *, check_contiguous: bool = True
) -> torch.Tensor:
    """(a) Copy x.numel() elements starting at x.data_ptr(). Correct only if x is contiguous.

    check_contiguous=False is the bug on purpose: it launches on any view whose flat read stays inside its
    storage (a wrong answer, never a stray read), and refuses, with the byte arithmetic, when it would not.
    """
    _check_input(x, "x", ndim=None)
    if check_contiguous and not x.is_contiguous():
        raise ValueError(
            f"copy_flat needs a contiguous x, got sizes {tuple(x.shape)} strides {tuple(x.stride())}: "
            "call x.contiguous() first or use a stride-aware kernel"
        )
    overrun = flat_read_overrun_bytes(x)
    if overrun:
        es = x.element_size()
        raise ValueError(
            f"a flat read of x would leave its storage: it reads bytes [{x.storage_offset() * es}, "
            f"{(x.storage_offset() + x.numel()) * es}) of a {storage_numel(x) * es}-byte storage, "
            f"{overrun} bytes past its end"
        )
    out = check_out(out, x.shape, x, {"x": x})
    n = x.numel()
    block = 1024 if LANE == "gpu" else 4096  # the interpreter pays per program: few, large blocks
    grid = (triton.cdiv(n, block),)
    _copy_flat_kernel[grid](x, out, n, BLOCK_SIZE=block, INDEX_64=_needs_int64(x, out))  # read n, write n
    return out


# --- (b) naive stride-aware ---------------------------------------------------------------------------------


@triton.jit
def _copy_2d_naive_kernel(
    x_ptr,
    out_ptr,
    n_elements,  # M * N, computed on the host: M * N in the kernel would be int32 and wrap past 2^31
    N,
    stride_xm,  # elements between x[m, n] and x[m + 1, n]
    stride_xn,  # elements between x[m, n] and x[m, n + 1]
    BLOCK_SIZE: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    pid = tl.program_id(0)
    if INDEX_64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # flat indices into the contiguous (M, N) output
    mask = offs < n_elements
    m = offs // N
    n = offs % N
    x = tl.load(x_ptr + m * stride_xm + n * stride_xn, mask=mask)  # x transposed: addresses M apart
    tl.store(out_ptr + offs, x, mask=mask)  # contiguous: coalesced


def copy_2d_naive(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """(b) Contiguous copy of any 2-D view; one flat block of output elements per program."""
    if _compiling((x,), out):
        return _copy_2d_naive_op(x)
    _check_input(x, "x")
    out = check_out(out, x.shape, x, {"x": x})
    M, N = x.shape
    block = 1024 if LANE == "gpu" else 4096
    grid = (triton.cdiv(M * N, block),)
    _copy_2d_naive_kernel[grid](
        x, out, M * N, N, x.stride(0), x.stride(1), BLOCK_SIZE=block, INDEX_64=_needs_int64(x, out)
    )  # read MN, write MN
    return out


# --- (c) tiled stride-aware ---------------------------------------------------------------------------------


@triton.jit
def _tile(M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, INDEX_64: tl.constexpr):
    """This program's (BLOCK_SIZE_M, BLOCK_SIZE_N) tile of an (M, N) output, tiles numbered row by row: its
    row and column indices (int64 when an offset could pass 2^31) and the mask of those inside the matrix."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    if INDEX_64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    return offs_m, offs_n, mask


@triton.jit
def _copy_2d_tiled_kernel(
    x_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_om,  # out is contiguous: stride_on == 1
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    offs_m, offs_n, mask = _tile(M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, INDEX_64)
    # (BLOCK_M, BLOCK_N) tile; a stride equal to 1 is specialised at compile time, so the load is laid out
    # (and vectorised) along whichever dimension of x is contiguous
    tile = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], tile, mask=mask)


def _tiled_configs() -> list[triton.Config]:
    if LANE != "gpu":  # one large tile: few program instances under the interpreter, no benchmarking
        return [triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64}, num_warps=4)]
    # Hopper: 4-64 KiB fp32 tiles; 4 or 8 warps (each thread keeps 8-64 elements in flight)
    shapes = [
        (32, 32, 4), (64, 64, 4), (64, 64, 8), (128, 32, 4), (32, 128, 4),
        (128, 64, 4), (64, 128, 4), (128, 64, 8), (64, 128, 8), (128, 128, 8),
    ]  # fmt: skip
    return [triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn}, num_warps=w) for bm, bn, w in shapes]


# the layout of x (which stride is 1) changes the best tile, so the strides are part of the key
_copy_2d_tiled_autotuned = triton.autotune(
    configs=_tiled_configs(), key=["M", "N", "stride_xm", "stride_xn"], do_bench=autotune_bench
)(_copy_2d_tiled_kernel)


def copy_2d_tiled(
    x: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """(c) Contiguous copy of any 2-D view, one BLOCK_M x BLOCK_N tile per program.

    Without block_m/block_n the tile is autotuned (GPU lane) per shape and layout; with them, that tile.
    """
    if _compiling((x,), out, block_m=block_m, block_n=block_n):
        return _copy_2d_tiled_op(x)
    _check_input(x, "x")
    out = check_out(out, x.shape, x, {"x": x})
    M, N = x.shape
    index_64 = _needs_int64(x, out)
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither (autotuned)")
    if block_m is None:
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)
        _copy_2d_tiled_autotuned[grid](
            x, out, M, N, x.stride(0), x.stride(1), out.stride(0), INDEX_64=index_64
        )
        return out
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b < 1 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two (tl.arange), got {b}")
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _copy_2d_tiled_kernel[grid](
        x,
        out,
        M,
        N,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        BLOCK_SIZE_M=block_m,
        BLOCK_SIZE_N=block_n,
        INDEX_64=index_64,
        num_warps=num_warps,
    )  # read MN, write MN
    return out


# --- stride-aware elementwise -------------------------------------------------------------------------------


@triton.jit
def _add_relu_2d_kernel(
    x_ptr,
    y_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_ym,  # 0 when y is a row expanded down (a bias)
    stride_yn,
    stride_om,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    offs_m, offs_n, mask = _tile(M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, INDEX_64)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xn, mask=mask)
    y = tl.load(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, mask=mask)
    z = x + y
    z = tl.where(z < 0.0, 0.0, z)  # keeps NaN like torch.relu; a GPU max may not
    tl.store(
        out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], z.to(out_ptr.dtype.element_ty), mask=mask
    )


def add_relu_2d(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """relu(x + y) for two 2-D views of the same shape and dtype, any strides; out is contiguous."""
    if _compiling((x, y), out):
        return _add_relu_2d_op(x, y)
    _check_input(x, "x")
    _check_input(y, "y")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise TypeError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    if x.device != y.device:
        raise ValueError(f"x is on {x.device} but y is on {y.device}")
    out = check_out(out, x.shape, x, {"x": x, "y": y})
    M, N = x.shape
    bm, bn = (64, 64) if LANE == "gpu" else (64, 128)
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    _add_relu_2d_kernel[grid](
        x,
        y,
        out,
        M,
        N,
        x.stride(0),
        x.stride(1),
        y.stride(0),
        y.stride(1),
        out.stride(0),
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        INDEX_64=_needs_int64(x, y, out),
        num_warps=4,
    )  # read 2MN (less for an expanded y: its cells hit in cache), write MN
    return out


# --- torch.compile: the launchers as custom ops -------------------------------------------------------------
# Dynamo cannot trace a launcher (it reads storages and launches a kernel), so under torch.compile each public
# function calls one of these instead: an opaque op that runs the launcher on the real tensors, with a fake
# that gives the output's metadata (contiguous, like x).


@torch.library.custom_op("labkernels::triton_copy_2d_naive", mutates_args=())
def _copy_2d_naive_op(x: torch.Tensor) -> torch.Tensor:
    return copy_2d_naive(x)


@torch.library.custom_op("labkernels::triton_copy_2d_tiled", mutates_args=())
def _copy_2d_tiled_op(x: torch.Tensor) -> torch.Tensor:
    return copy_2d_tiled(x)


@torch.library.custom_op("labkernels::triton_add_relu_2d", mutates_args=())
def _add_relu_2d_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return add_relu_2d(x, y)


def _fake_like_x(x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)  # contiguous, whatever x's strides


for _op in (_copy_2d_naive_op, _copy_2d_tiled_op, _add_relu_2d_op):
    _op.register_fake(_fake_like_x)


def _compiling(inputs: tuple, out, **tuning) -> bool:
    """True under torch.compile; refuses what the custom ops do not take (out=, a fixed tile, grad)."""
    if not torch.compiler.is_compiling():
        return False
    if out is not None or any(v is not None for v in tuning.values()):
        raise RuntimeError("under torch.compile these kernels take no out= and no tile sizes: leave them out")
    for name, t in zip(("x", "y")[: len(inputs)], inputs, strict=True):
        _check_no_grad(t, name)
    return True
