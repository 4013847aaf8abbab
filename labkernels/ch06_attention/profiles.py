"""Chapter 06 under the profiler: the DRAM bytes of attention, naive against fused.

bf16, B=2, H=16, N=4096, D=64 (the scores: 1 GiB a copy, far past the H200's L2, and one ncu run well
under a minute). Three implementations of softmax(Q K^T / sqrt(D)) V:
- naive: the chapter's torch ops (`naive.naive_attention`), one kernel per op with the N x N scores in HBM,
  summed over its kernels;
- labkernels: this chapter's `flash_attention` (tuned on its first call);
- sdpa_flash: SDPA with the FLASH backend forced (FlashAttention-2, CUDA).
DRAM bytes against `traffic.attention_naive` and `traffic.flash_attention` (`model_bytes`: Q, K, V, O once),
and how busy each keeps the tensor pipe. The fused kernels ask for K and V once per query block
(`flash_attention.forward_hbm_bytes`); what the counters show below that is L2's share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from labkernels import traffic
from labkernels.bench import benchmark
from labkernels.ch06_attention.flash_attention import flash_attention
from labkernels.ch06_attention.naive import naive_attention
from labkernels.lane import DEVICE
from labkernels.profile import case, profile_rows

SHAPE = (2, 16, 4096, 64)  # (B, H, N, D)
DTYPE = torch.bfloat16
QUESTIONS = ("dram", "tensor_pipe")
NAIVE_BYTES = traffic.attention_naive(*SHAPE, DTYPE).bytes
FUSED_BYTES = traffic.flash_attention(*SHAPE, DTYPE).bytes


def _sdpa_flash(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v)


def _attention_case(fn):
    """Fresh bf16 (B, H, N, D) inputs; a first call (tunes, picks kernels) checked against fp32 naive
    attention (a check that it computes attention: tests/test_ch06_attention.py holds the tight ones);
    the launch to profile."""
    q, k, v = (torch.randn(SHAPE, device=DEVICE, dtype=DTYPE) for _ in range(3))
    expected = naive_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(fn(q, k, v).float(), expected, atol=2e-2, rtol=2e-2)
    return lambda: fn(q, k, v)  # read Q, K, V; write O (and, naive, the scores and P in HBM)


@case("ch06.attention_naive", questions=QUESTIONS, total=True, model_bytes=NAIVE_BYTES)
def attention_naive():
    """naive attention (torch ops, scores in HBM), bf16 B=2 H=16 N=4096 D=64"""
    return _attention_case(naive_attention)


@case("ch06.attention_labkernels", questions=QUESTIONS, total=True, model_bytes=FUSED_BYTES)
def attention_labkernels():
    """this chapter's flash_attention (Triton), tuned, bf16 B=2 H=16 N=4096 D=64"""
    return _attention_case(flash_attention)


@case("ch06.attention_sdpa_flash", questions=QUESTIONS, total=True, model_bytes=FUSED_BYTES)
def attention_sdpa_flash():
    """SDPA's FLASH backend (FlashAttention-2), bf16 B=2 H=16 N=4096 D=64"""
    return _attention_case(_sdpa_flash)


CASES = ["ch06.attention_naive", "ch06.attention_labkernels", "ch06.attention_sdpa_flash"]


@benchmark("ch06_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)
