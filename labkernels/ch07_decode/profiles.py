"""Chapter 07 under the profiler: where a one-row 4-bit GEMV's time goes.

bf16, M = 1, K = 4096, N = 14336 (the MLP's up-projection of a Llama-3-8B-sized layer), each kernel replayed
by ncu from a flushed cache (its default), so the weights come from HBM. Three ways to compute a @ W^T:
- labkernels: this chapter's `int4_matmul` (the one-row kernel and its split-K sum), summed over both;
- torch_int4pack: torch's `_weight_int4pack_mm` (tinygemm) on the same 4-bit weights;
- cublas_bf16: cuBLAS on the 16-bit weights, four times the bytes.
A GEMV at one row does two FLOPs a weight: what holds it below the read roof is how many bytes each SM keeps
in flight (warps resident times bytes a load), not arithmetic. The questions: DRAM bytes and throughput
against the traffic model, resident warps and bytes a load, and what limits the warps.
"""

from __future__ import annotations

import torch

from labkernels.bench import benchmark
from labkernels.ch07_decode import bench, int4
from labkernels.profile import case, profile_rows

M, N, K = 1, 14336, 4096
DTYPE = torch.bfloat16
QUESTIONS = ("dram", "in_flight", "occupancy")
INT4_BYTES = int4.traffic(M, N, K, DTYPE).bytes
BF16_BYTES = (M * K + N * K + M * N) * 2


def _gemv_case(make_call, on_int4_weights: bool = True):
    """Fresh inputs; the call checked against a float64 reference on the weights it reads (tight checks are in
    tests/test_ch07_decode.py); the launch to profile."""
    a, w, packed, scales = bench.int4_inputs(M, N, K, DTYPE)
    call = make_call(a, w, packed, scales)
    want = int4.reference(a, packed, scales) if on_int4_weights else a.double() @ w.double().T
    torch.testing.assert_close(call().double(), want, atol=3e-2, rtol=3e-2)
    return call


def _labkernels(a, w, packed, scales):
    return lambda: int4.int4_matmul(a, packed, scales)  # read 2K + KN/2 + 2NK/128 bytes, write 2N


def _int4pack(a, w, packed, scales):
    theirs = bench.torch_int4(packed, scales)
    return lambda: theirs(a)


def _cublas(a, w, packed, scales):
    return lambda: a @ w.T  # read 2KN bytes of weights


@case("ch07.int4_labkernels", questions=QUESTIONS, total=True, model_bytes=INT4_BYTES)
def int4_labkernels():
    """this chapter's int4_matmul (one-row kernel + split-K sum), bf16 M=1 K=4096 N=14336"""
    return _gemv_case(_labkernels)


@case("ch07.int4_torch_int4pack", questions=QUESTIONS, total=True, model_bytes=INT4_BYTES)
def int4_torch_int4pack():
    """torch's _weight_int4pack_mm (tinygemm), the same 4-bit weights, bf16 M=1 K=4096 N=14336"""
    return _gemv_case(_int4pack)


@case("ch07.int4_cublas_bf16", questions=QUESTIONS, total=True, model_bytes=BF16_BYTES)
def int4_cublas_bf16():
    """cuBLAS on the bf16 weights (four times the bytes), M=1 K=4096 N=14336"""
    return _gemv_case(_cublas, on_int4_weights=False)


CASES = ["ch07.int4_labkernels", "ch07.int4_torch_int4pack", "ch07.int4_cublas_bf16"]


@benchmark("ch07_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)
