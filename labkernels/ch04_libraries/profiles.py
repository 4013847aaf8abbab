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

# The convolution furthest behind cuDNN (ch04_conv): fp16, batch 32, C = K_out = 512 at 7^2, 3x3, padding 1.
# Their own table, ch04_conv_profile (`bench_conv_profile` below).
CONV_SHAPE = (32, 512, 7, 512)  # (batch, C, H = W, K_out)
CONV_QUESTIONS = ("tensor_pipe", "occupancy", "l2")
CONV_CASES = ["ch04.conv_cudnn_c512", "ch04.conv_triton_c512"]


def _conv_operands():
    batch, c, size, k_out = CONV_SHAPE
    x = torch.randn(batch, c, size, size, device=DEVICE, dtype=torch.float16)
    w = torch.randn(k_out, c, 3, 3, device=DEVICE, dtype=torch.float16)
    return x, w


@case("ch04.conv_cudnn_c512", questions=CONV_QUESTIONS)
def conv_cudnn_c512():
    """cuDNN 3x3 conv, channels_last, cudnn.benchmark on, fp16, batch 32, C = K_out = 512 at 7^2"""
    x, w = _conv_operands()
    x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True  # the case runs in its own process
    torch.nn.functional.conv2d(x, w, padding=1)  # times cuDNN's candidates, keeps the fastest
    return lambda: torch.nn.functional.conv2d(x, w, padding=1)  # read x, w; write y


@case("ch04.conv_triton_c512", questions=CONV_QUESTIONS, kernel="_conv_kernel")
def conv_triton_c512():
    """the chapter's implicit-GEMM Triton conv, NHWC, autotuned, fp16, batch 32, C = K_out = 512 at 7^2"""
    from labkernels.ch04_libraries.conv import conv2d_nhwc, reference, weight_from_torch

    x, w = _conv_operands()
    x, w = x.permute(0, 2, 3, 1).contiguous(), weight_from_torch(w)
    got = conv2d_nhwc(x, w, padding=1)  # tunes
    # fan-in 4608: outputs of a few hundred at most, rounded to fp16 (2^-11 relative)
    torch.testing.assert_close(got.double(), reference(x, w, padding=1), rtol=1e-2, atol=0.5)
    return lambda: conv2d_nhwc(x, w, padding=1)  # read x, w; write y


@benchmark("ch04_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)


@benchmark("ch04_conv_profile")
def bench_conv_profile() -> list[dict]:
    return profile_rows(CONV_CASES)
