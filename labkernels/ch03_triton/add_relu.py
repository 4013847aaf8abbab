"""Fused add + ReLU: relu(x + y) in one pass, the chapter's first fusion.

Two torch calls (`x + y`, then `relu`) write the sum to HBM and read it back: 5n elements of traffic. One
Triton program keeps the sum in registers: read 2n, write n (`labkernels.traffic.add_relu`), so the fused
kernel should take ~3/5 of the time. The op is so memory-bound (0.17 FLOP/byte in fp32) that the goal is
simple: run at the device's copy bandwidth.

On the GPU lane `@triton.autotune` picks BLOCK_SIZE and num_warps per size: large blocks with several warps
keep enough loads in flight to saturate HBM. On the CPU lane one big block size keeps the interpreter quick.

ReLU is written `where(s < 0, 0, s)`, not `maximum(s, 0)`: compiled for a GPU, `tl.maximum` returns the
other operand when one is NaN (max(NaN, 0) = 0), while torch.relu keeps NaN. As vector_add: int64 offsets
only past 2^31 elements, and a registered op (`labkernels::ch03_add_relu`) with a backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.ch03_triton.vector_add import (
    check_block_size,
    check_elementwise,
    check_num_warps,
    needs_int64,
)
from labkernels.lane import LANE
from labkernels.timing import autotune_bench

CPU_BLOCK_SIZE = 16384  # the interpreter's cost is per program, not per element
GPU_CONFIGS = [
    triton.Config({"BLOCK_SIZE": block}, num_warps=warps)
    for block, warps in [(1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 16)]
]
MAX_TUNED_BLOCK = max(c.kwargs["BLOCK_SIZE"] for c in GPU_CONFIGS)


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y)  # two kernels: read 2n, write n, read n, write n


@triton.jit
def _add_relu_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr, INDEX_64: tl.constexpr):
    pid = tl.program_id(axis=0)
    if INDEX_64:
        pid = pid.to(tl.int64)  # past 2^31 elements pid * BLOCK_SIZE would wrap in int32
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)  # read 2n
    y = tl.load(y_ptr + offsets, mask=mask)
    s = x + y  # the sum never leaves registers
    out = tl.where(s < 0, 0.0, s)  # NaN < 0 is false: NaN stays NaN, as in torch.relu
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)  # write n


# One tuned config per size (the key); restore `out` after tuning runs in case it aliases x or y.
_add_relu_tuned = triton.autotune(
    configs=GPU_CONFIGS, key=["n_elements"], restore_value=["out_ptr"], do_bench=autotune_bench
)(_add_relu_kernel)


def _add_relu(x, y, out, block_size, num_warps) -> torch.Tensor:
    """Check, allocate, launch: the kernel's path without autograd."""
    check_elementwise("add_relu", x, y, out=out)
    if block_size is not None:
        block_size = check_block_size("add_relu", block_size)
    if num_warps is not None:
        num_warps = check_num_warps("add_relu", num_warps)
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if n == 0:
        return out  # nothing to launch
    if block_size is None and num_warps is None and LANE == "gpu":
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
        _add_relu_tuned[grid](x, y, out, n, INDEX_64=needs_int64(n, MAX_TUNED_BLOCK))
        return out
    block_size = block_size or (CPU_BLOCK_SIZE if LANE == "cpu" else 4096)
    grid = (triton.cdiv(n, block_size),)
    index_64 = needs_int64(n, block_size)
    _add_relu_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, INDEX_64=index_64, num_warps=num_warps or 4)
    return out


@torch.library.custom_op(
    "labkernels::ch03_add_relu",
    mutates_args=(),
    schema="(Tensor x, Tensor y, int? block_size=None, int? num_warps=None) -> Tensor",
)
def _add_relu_op(x, y, block_size=None, num_warps=None):
    return _add_relu(x, y, None, block_size, num_warps)


@_add_relu_op.register_fake
def _(x, y, block_size=None, num_warps=None):
    check_elementwise("add_relu", x, y)
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _add_relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    # torch.relu's own backward: the gradient passes where the output is > 0 (not at 0, not at NaN).
    g = torch.ops.aten.threshold_backward(grad, out, 0)
    return g, g, None, None


_add_relu_op.register_autograd(_add_relu_backward, setup_context=_setup_context)


def add_relu(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """relu(x + y) in one kernel. `out` may be given (e.g. x itself, in place; a partial overlap is refused).

    By default the GPU lane autotunes BLOCK_SIZE and num_warps; passing `block_size` (and optionally
    `num_warps`) launches that exact config instead, as the block-size sweep does. Differentiable, and
    compiles with torch.compile (without `out`).
    """
    try:
        wants_grad = (x.requires_grad or y.requires_grad) and torch.is_grad_enabled()
    except AttributeError:  # not tensors: the checks say so
        wants_grad = False
    if out is None and (wants_grad or torch.compiler.is_compiling()):
        return torch.ops.labkernels.ch03_add_relu(x, y, block_size, num_warps)
    return _add_relu(x, y, out, block_size, num_warps)
