"""Fused add + ReLU: relu(x + y) in one pass, the chapter's first fusion.

Two torch calls (`x + y`, then `relu`) write the sum to HBM and read it back: 5n elements of traffic. One
Triton program keeps the sum in registers: read 2n, write n (`labkernels.traffic.add_relu`), so the fused
kernel should take ~3/5 of the time. The op is so memory-bound (0.17 FLOP/byte in fp32) that the goal is
simple: run at the device's copy bandwidth.

On the GPU lane `@triton.autotune` picks BLOCK_SIZE and num_warps per size: large blocks with several warps
keep enough loads in flight to saturate HBM. On the CPU lane one big block size keeps the interpreter quick.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.ch03_triton.vector_add import check_elementwise
from labkernels.lane import LANE
from labkernels.timing import autotune_bench

CPU_BLOCK_SIZE = 16384  # the interpreter's cost is per program, not per element
GPU_CONFIGS = [
    triton.Config({"BLOCK_SIZE": block}, num_warps=warps)
    for block, warps in [(1024, 4), (2048, 4), (4096, 4), (4096, 8), (8192, 8), (16384, 16)]
]


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y)  # two kernels: read 2n, write n, read n, write n


@triton.jit
def _add_relu_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)  # read 2n
    y = tl.load(y_ptr + offsets, mask=mask)
    out = tl.maximum(x + y, 0.0)  # the sum never leaves registers
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)  # write n


# One tuned config per size (the key); restore `out` after tuning runs in case it aliases x or y.
_add_relu_tuned = triton.autotune(
    configs=GPU_CONFIGS, key=["n_elements"], restore_value=["out_ptr"], do_bench=autotune_bench
)(_add_relu_kernel)


def add_relu(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """relu(x + y) in one kernel. `out` may be given (e.g. x itself, in place).

    By default the GPU lane autotunes BLOCK_SIZE and num_warps; passing `block_size` (and optionally
    `num_warps`) launches that exact config instead, as the block-size sweep does.
    """
    check_elementwise("add_relu", x, y, out=out)
    if block_size is not None and (block_size <= 0 or block_size & (block_size - 1)):
        raise ValueError(f"add_relu: block_size must be a positive power of two, got {block_size}")
    if num_warps is not None and (num_warps <= 0 or num_warps & (num_warps - 1) or num_warps > 32):
        raise ValueError(f"add_relu: num_warps must be a power of two in 1..32, got {num_warps}")
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if block_size is None and num_warps is None and LANE == "gpu":
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)
        _add_relu_tuned[grid](x, y, out, n)
        return out
    block_size = block_size or (CPU_BLOCK_SIZE if LANE == "cpu" else 4096)
    grid = (triton.cdiv(n, block_size),)
    _add_relu_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps or 4)
    return out
