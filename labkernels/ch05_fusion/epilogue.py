"""GEMM epilogue fusion: gelu(A @ B + bias) with the bias and the activation applied to the accumulator.

Eager torch runs cuBLAS, which writes C to HBM, then `+ bias` and `gelu`, which each read C and write it
again: 4MN extra elements (`labkernels.traffic.matmul_bias_gelu`). Chapter 03's matmul applies both to the
fp32 accumulator in registers before its single store (`_epilogue` in `labkernels.ch03_triton.matmul`), so
the epilogue costs one read of the bias. Whether that is worth much depends on how long the matmul itself
takes: at 4096^3 the extra passes are ~10% of the work; for a skinny matmul they can be most of it.
"""

from __future__ import annotations

import torch

from labkernels.ch03_triton import matmul as matmul_mod


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """In fp64: the higher-precision reference for the tests."""
    return matmul_mod.reference(a, b, bias, "gelu")


def eager(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """What eager torch runs: cuBLAS, then two pointwise kernels over C."""
    c = a @ b  # read MK + KN, write MN
    c = c + bias  # read MN + N, write MN
    return torch.nn.functional.gelu(c)  # read MN, write MN


def matmul_bias_gelu(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, *, input_precision: str = "ieee"
) -> torch.Tensor:
    """gelu(a @ b + bias) in one kernel (chapter 03's matmul, its epilogue); a (M, K), b (K, N), bias (N,).
    Forward only: inputs that require grad get a clear error."""
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"matmul_bias_gelu: bias must be a tensor, got {type(bias).__name__}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, bias) if isinstance(t, torch.Tensor)):
        raise RuntimeError(
            "matmul_bias_gelu: inputs require grad, but the fused kernel has no backward; call it under "
            "torch.no_grad() or use `eager` for training"
        )
    if bias.dtype != getattr(a, "dtype", None):
        raise TypeError(f"matmul_bias_gelu: bias is {bias.dtype} but a is {getattr(a, 'dtype', None)}")
    return matmul_mod.matmul(a, b, bias=bias, activation="gelu", input_precision=input_precision)
