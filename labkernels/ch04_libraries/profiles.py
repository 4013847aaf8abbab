"""Chapter 04 under the profiler: where cuBLAS's time goes against the course's Triton matmul.

bf16 1536^3, a shape where the Triton kernels lose to cuBLAS (ch04_matmul): how busy each keeps the tensor
pipes (Hopper's wgmma, and mma.sync), how many programs it launches against 132 SMs (grid size, waves per
SM), and its occupancy. Each case autotunes, or lets cuBLAS pick, before the profiled launch.
"""

from __future__ import annotations

import torch

from labkernels.bench import benchmark
from labkernels.ch03_triton.matmul import matmul
from labkernels.lane import DEVICE
from labkernels.profile import case, profile_rows

SHAPE = (1536, 1536, 1536)  # (M, N, K)
QUESTIONS = ("tensor_pipe", "occupancy", "dram")


def _matmul_case(fn):
    """Fresh bf16 operands; a checked first call (tunes); the launch to profile."""
    m, n, k = SHAPE
    a = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
    b = torch.randn(k, n, device=DEVICE).to(torch.bfloat16)
    expected = a.float() @ b.float()
    torch.testing.assert_close(fn(a, b).float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())
    return lambda: fn(a, b)  # read MK + KN, write MN


@case("ch04.matmul_cublas", questions=QUESTIONS)
def matmul_cublas():
    """torch.matmul (cuBLAS) bf16 1536^3"""
    return _matmul_case(torch.matmul)


@case("ch04.matmul_triton_tiled", questions=QUESTIONS, kernel="_matmul_tiles")
def matmul_triton_tiled():
    """the ch03 tiled Triton matmul, autotuned, bf16 1536^3"""
    return _matmul_case(lambda a, b: matmul(a, b, kernel="tiled"))


@case("ch04.matmul_triton_tma", questions=QUESTIONS, kernel="_matmul_tma_persistent")
def matmul_triton_tma():
    """the ch03 persistent TMA Triton matmul, autotuned, bf16 1536^3"""
    return _matmul_case(lambda a, b: matmul(a, b, kernel="tma_persistent"))


CASES = ["ch04.matmul_cublas", "ch04.matmul_triton_tiled", "ch04.matmul_triton_tma"]


@benchmark("ch04_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)
