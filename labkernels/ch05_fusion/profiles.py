"""Chapter 05 under the profiler: the DRAM bytes fusion saves, and the registers it costs.

- chain: the hand-fused N-op chain (`pointwise.chain`) at N = 2, 15 and 60 on 2^26 fp32 elements: registers
  per thread, spilled bytes and occupancy as N grows, and DRAM bytes against the traffic model's 3 passes.
- chain_eager: the same chains as eager torch ops at N = 2 (add, relu) and 15, one kernel per op, summed
  over their kernels: DRAM bytes against the model's 2N+1 passes.
- rmsnorm: the fused RMSNorm+residual (`rmsnorm.rmsnorm_residual`), a reduction that holds its whole row in
  registers, at 4096 and at 65536 fp32 columns a row (the widest it takes): registers, spills, occupancy.
Each case carries the bytes `labkernels.traffic` predicts for it (`model_bytes`).
"""

from __future__ import annotations

import functools

import torch

from labkernels import traffic
from labkernels.bench import benchmark
from labkernels.ch05_fusion import pointwise, rmsnorm
from labkernels.lane import DEVICE
from labkernels.profile import case, profile_rows

N_ELEMENTS = 1 << 26  # fp32: 256 MiB a tensor, far past the H200's L2
CHAIN_LENGTHS = (2, 15, 60)
EAGER_LENGTHS = (2, 15)  # a subset of CHAIN_LENGTHS
RMSNORM_SHAPES = ((16384, 4096), (1024, 65536))  # (rows, cols): 2^26 elements each
FUSED_QUESTIONS = ("spills", "occupancy", "dram")


def _chain_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(N_ELEMENTS, device=DEVICE), torch.randn(N_ELEMENTS, device=DEVICE)


def _chain_case(n_ops: int):
    x, y = _chain_inputs()
    out = torch.full_like(x, float("nan"))
    pointwise.chain(x, y, n_ops, out=out)  # compiles
    torch.testing.assert_close(out, pointwise.reference_chain(x, y, n_ops), atol=1e-5, rtol=1e-5)
    return lambda: pointwise.chain(x, y, n_ops, out=out)  # read 2n, write n


def _chain_eager_case(n_ops: int):
    x, y = _chain_inputs()
    pointwise.reference_chain(x, y, n_ops)  # warms up torch's kernels and its caching allocator
    return lambda: pointwise.reference_chain(x, y, n_ops)  # N kernels: read 2n write n, then read n write n


def _rmsnorm_case(rows: int, cols: int):
    x, residual = torch.randn(rows, cols, device=DEVICE), torch.randn(rows, cols, device=DEVICE)
    weight = 1 + 0.1 * torch.randn(cols, device=DEVICE)
    y, h = rmsnorm.rmsnorm_residual(x, residual, weight)  # compiles
    y_ref, h_ref = rmsnorm.reference(x, residual, weight)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    return lambda: rmsnorm.rmsnorm_residual(x, residual, weight)  # read 2MN + N, write 2MN


def _register() -> list[str]:
    """One case per chain length, eager chain and RMSNorm shape; returns their names."""
    names = []
    for n_ops in CHAIN_LENGTHS:
        name = f"ch05.chain_{n_ops}"
        case(
            name,
            questions=FUSED_QUESTIONS,
            kernel="_chain_kernel",
            doc=f"hand-fused chain of {n_ops} ops, fp32 2^26",
            model_bytes=traffic.pointwise_chain(N_ELEMENTS, n_ops).bytes,
        )(functools.partial(_chain_case, n_ops))
        names.append(name)
        if n_ops not in EAGER_LENGTHS:
            continue
        name = f"ch05.chain_{n_ops}_eager"  # beside its fused twin in the table
        case(
            name,
            questions=("dram",),
            doc=f"eager chain of {n_ops} torch ops ({n_ops} kernels), fp32 2^26",
            total=True,
            model_bytes=traffic.pointwise_chain(N_ELEMENTS, n_ops, fused=False).bytes,
        )(functools.partial(_chain_eager_case, n_ops))
        names.append(name)
    for rows, cols in RMSNORM_SHAPES:
        name = f"ch05.rmsnorm_{cols}"
        case(
            name,
            questions=FUSED_QUESTIONS,
            kernel="_rmsnorm_residual_kernel",
            doc=f"fused RMSNorm+residual, fp32 {rows}x{cols}, one row a program",
            model_bytes=traffic.rmsnorm_residual(rows, cols).bytes,
        )(functools.partial(_rmsnorm_case, rows, cols))
        names.append(name)
    return names


CASES = _register()


@benchmark("ch05_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)
