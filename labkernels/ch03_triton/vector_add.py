"""Vector add: the first Triton kernel, and the block programming model in twelve lines.

A CUDA kernel is written for one *thread*; a Triton kernel is written for one *program*, which owns a whole
block of BLOCK_SIZE elements. `tl.program_id(0)` says which block, `tl.arange(0, BLOCK_SIZE)` gives the
block's lanes, and a mask switches off the lanes past the end of the data. Triton turns contiguous offsets
into wide, coalesced memory transactions by itself.

Traffic: read 2n elements, write n (`labkernels.traffic.add`). One add per element: ~0.08 FLOP/byte in
fp32, far left of any GPU's ridge point, so the best possible time is bytes / copy bandwidth.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.lane import LANE, on_gpu, require_device

# The interpreter pays ~1-2 ms per program instance whatever its size: big blocks on the CPU lane.
DEFAULT_BLOCK_SIZE = 1024 if LANE == "gpu" else 16384
ELEMENTWISE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BF16_ON_CPU = "bfloat16 is computed wrongly by the Triton interpreter; use float16 or float32 on the CPU lane"


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y  # read 2n, write n


@triton.jit
def _vector_add_kernel(
    x_ptr,  # *Pointer* to the first input
    y_ptr,  # *Pointer* to the second input
    out_ptr,  # *Pointer* to the output
    n_elements,  # how many elements in each
    BLOCK_SIZE: tl.constexpr,  # elements per program; a compile-time constant (a power of two)
):
    pid = tl.program_id(axis=0)  # which block this program owns
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # contiguous: one coalesced access per warp
    mask = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def check_elementwise(name: str, *tensors: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The checks every elementwise launcher of this chapter makes, each with a message naming the problem."""
    labels = "xyzw"
    first = tensors[0]
    for label, t in zip(labels, tensors, strict=False):
        require_device(t, f"{name}: {label}")
        if t.dtype not in ELEMENTWISE_DTYPES:
            raise TypeError(f"{name}: {label} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: inputs must share one dtype, got {first.dtype} and {t.dtype}")
        if t.shape != first.shape:
            raise ValueError(f"{name}: shapes differ, {tuple(first.shape)} vs {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(
                f"{name}: {label} is not contiguous (strides {t.stride()}); this kernel walks flat memory, "
                "so pass t.contiguous() (a copy)"
            )
    if first.numel() == 0:
        raise ValueError(f"{name}: inputs are empty")
    if first.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"{name}: {BF16_ON_CPU}")
    if out is not None:
        require_device(out, f"{name}: out")
        if out.dtype != first.dtype or out.shape != first.shape:
            raise ValueError(
                f"{name}: out must be {first.dtype} {tuple(first.shape)}, got {out.dtype} {tuple(out.shape)}"
            )
        if not out.is_contiguous():
            raise ValueError(f"{name}: out is not contiguous (strides {out.stride()})")


def vector_add(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """x + y with one Triton program per BLOCK_SIZE elements."""
    check_elementwise("vector_add", x, y, out=out)
    block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"vector_add: block_size must be a positive power of two, got {block_size}")
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    grid = (triton.cdiv(n, block_size),)
    _vector_add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps)
    return out
