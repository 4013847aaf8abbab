"""Horizontal fusion: two results from one read of the input.

`torch.sin(x)` and `torch.cos(x)` are two kernels that each read x: read 2n, write 2n. Nothing flows from
one to the other, so this is not a chain; but one kernel can load x once and store both: read n, write 2n
(`labkernels.traffic.sincos`), a 25% saving. Inductor does the same when two ops share an input in one graph
(one kernel, two outputs). Rotary embeddings (RoPE) are the everyday case.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.ch03_triton.vector_add import check_elementwise
from labkernels.ch05_fusion.pointwise import _no_grad, _offsets, launch_config


def reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.sin(x), torch.cos(x)  # two kernels: read n, write n; read n, write n


@triton.jit
def _sincos_kernel(x_ptr, sin_ptr, cos_ptr, n_elements, BLOCK_SIZE: tl.constexpr, INT64: tl.constexpr):
    offsets, mask = _offsets(n_elements, BLOCK_SIZE, INT64)
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # read n, once for both
    tl.store(sin_ptr + offsets, tl.sin(x).to(sin_ptr.dtype.element_ty), mask=mask)  # write n
    tl.store(cos_ptr + offsets, tl.cos(x).to(cos_ptr.dtype.element_ty), mask=mask)  # write n


@torch.library.custom_op("labkernels::ch05_sincos", mutates_args=(), schema="(Tensor x) -> (Tensor, Tensor)")
def _sincos_op(x):
    return _sincos(x)


@_sincos_op.register_fake
def _(x):
    check_elementwise("sincos", x)
    return torch.empty_like(x), torch.empty_like(x)


def sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin x, cos x) from one read of x; x contiguous, float16/bfloat16/float32. Under torch.compile it is
    the op `labkernels::ch05_sincos`, traced without a graph break."""
    check_elementwise("sincos", x)
    _no_grad("sincos", x)
    return _sincos_op(x) if torch.compiler.is_compiling() else _sincos(x)


def _sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sin, cos = torch.empty_like(x), torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return sin, cos
    block, warps, int64 = launch_config(n)
    _sincos_kernel[(triton.cdiv(n, block),)](x, sin, cos, n, BLOCK_SIZE=block, INT64=int64, num_warps=warps)
    return sin, cos
