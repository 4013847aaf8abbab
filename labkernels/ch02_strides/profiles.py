"""Chapter 02 under the profiler: why a naive transpose is slow and where the tiled ones stop.

The same copy of x.t() (an n x n fp32 view, strides (1, n)) into a contiguous out, six ways, each profiled
for DRAM traffic, coalescing (32-byte sectors per warp-wide request: 4 when a warp's 32 floats are
contiguous, 32 when each lane touches its own sector), shared-memory wavefronts and bank conflicts,
occupancy, and the bytes each SM keeps in flight. A contiguous copy of the same bytes is the roof.
"""

from __future__ import annotations

import torch

from labkernels.bench import benchmark
from labkernels.ch02_strides import triton_strided
from labkernels.lane import DEVICE
from labkernels.profile import case, profile_rows

N = 8192  # 256 MiB per matrix: far past the 50 MB L2, and quick to save and restore between ncu's passes
QUESTIONS = ("dram", "coalescing", "shared_memory", "occupancy", "in_flight")
TILE = {
    "block_m": 64,
    "block_n": 64,
    "num_warps": 8,
}  # the autotuner's pick at 8192 and 16384 (ch02_transpose)


def _transpose_case(copy) -> callable:
    """Fresh x.t() and a NaN-poisoned out; one checked warm-up call (compiles); the launch to profile."""
    x = torch.randn(N, N, device=DEVICE).t()  # read along columns of the storage: strides (1, N)
    out = torch.full((N, N), float("nan"), device=DEVICE)
    copy(x, out)
    if not torch.equal(out, x):
        raise AssertionError("the transpose copied x.t() wrongly")
    return lambda: copy(x, out)  # read N², write N²


def _cuda_ops():
    from labkernels.ch02_strides import ops

    return ops


@case("ch02.copy_contiguous", questions=QUESTIONS, kernel="_copy_flat_kernel")
def copy_contiguous():
    """Triton copy_flat of a contiguous matrix: the same bytes as the transposes, the roof"""
    # Not torch's out.copy_(x): for contiguous tensors that is a cudaMemcpy, which ncu does not profile.
    x = torch.randn(N, N, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    triton_strided.copy_flat(x, out)
    if not torch.equal(out, x):
        raise AssertionError("copy_flat copied x wrongly")
    return lambda: triton_strided.copy_flat(x, out)  # read N², write N²


@case("ch02.transpose_torch", questions=QUESTIONS)
def transpose_torch():
    """torch x.t().contiguous() (its copy_ kernel)"""
    return _transpose_case(lambda x, out: out.copy_(x))


@case("ch02.transpose_triton_naive", questions=QUESTIONS, kernel="_copy_2d_naive_kernel")
def transpose_triton_naive():
    """Triton, one flat block of outputs per program: reads N floats apart"""
    return _transpose_case(triton_strided.copy_2d_naive)


@case("ch02.transpose_triton_tiled", questions=QUESTIONS, kernel="_copy_2d_tiled_kernel")
def transpose_triton_tiled():
    """Triton, 64x64 tiles, 8 warps: the compiler swaps the layout through shared memory"""
    return _transpose_case(lambda x, out: triton_strided.copy_2d_tiled(x, out, **TILE))


@case("ch02.transpose_cuda_naive", questions=QUESTIONS, kernel="copy_strided_kernel")
def transpose_cuda_naive():
    """CUDA, one thread per output element, grid-stride (csrc/cuda/strided.cu)"""
    return _transpose_case(_cuda_ops().copy_strided)


@case("ch02.transpose_cuda_tiled", questions=QUESTIONS, kernel="copy_2d_tiled_kernel")
def transpose_cuda_tiled():
    """CUDA, 32x32 shared-memory tile (+1 column), 32x8 threads (csrc/cuda/strided.cu)"""
    return _transpose_case(_cuda_ops().copy_2d_tiled)


CASES = [
    "ch02.copy_contiguous",
    "ch02.transpose_torch",
    "ch02.transpose_triton_naive",
    "ch02.transpose_triton_tiled",
    "ch02.transpose_cuda_naive",
    "ch02.transpose_cuda_tiled",
]


@benchmark("ch02_profile")
def bench_profile() -> list[dict]:
    _cuda_ops().ensure_loaded()  # build the extension here, not inside a profiled process
    return profile_rows(CASES)
