"""Chapter 03 under the profiler: grouped program order and L2, registers and occupancy, bytes in flight.

- matmul: the same tiled kernel and config with GROUP_SIZE_M=8 (programs walk down a group of tile rows,
  so neighbours share tiles of B in L2) and GROUP_SIZE_M=1 (row by row): L2 hit rate, DRAM bytes read, time.
  `grouping_rows` times the two at a few sizes (`make bench`: ch03_grouping).
- softmax: one 8192-wide fp32 row per program at 4, 16 and 32 warps (each thread holds 64, 16 or 8
  elements: registers per thread, theoretical and achieved occupancy, what limits it), and a 32768-wide row
  at 4 warps (256 elements a thread: more than the registers hold, so some spill to local memory).
- add_relu: BLOCK_SIZE x num_warps at 2^28 fp32 elements, the ch03_block_sweep's slow and fast configs:
  resident warps per SM x bytes per load request = the bytes each SM has in flight, which decides how much
  of HBM's bandwidth a copy-like kernel can use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch03_triton.softmax import softmax
from labkernels.lane import DEVICE
from labkernels.profile import case, profile_rows

# One fixed config, the autotuner's pick for bf16 at 4096^3 (ch03_matmul): only GROUP_SIZE_M changes.
MATMUL_CONFIG = {
    "BLOCK_SIZE_M": 128,
    "BLOCK_SIZE_N": 256,
    "BLOCK_SIZE_K": 64,
    "num_warps": 8,
    "num_stages": 3,
}
GROUPING_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 16384, 1024)]


def matmul_launch(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, group_size_m: int
) -> Callable[[], object]:
    """The ch03 tiled kernel with MATMUL_CONFIG and `group_size_m`, on contiguous 16-bit a, b and c."""
    (M, K), N = a.shape, b.shape[1]
    if K % MATMUL_CONFIG["BLOCK_SIZE_K"] or matmul_mod.needs_int64(a, b):
        raise ValueError(f"matmul_launch takes K a multiple of 64 and int32 offsets, got {M}x{N}x{K}")
    grid = (triton.cdiv(M, MATMUL_CONFIG["BLOCK_SIZE_M"]) * triton.cdiv(N, MATMUL_CONFIG["BLOCK_SIZE_N"]),)
    args = (a, b, c, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    meta = {
        "HAS_BIAS": False,
        "ACTIVATION": None,
        "INPUT_PRECISION": "tf32",
        "EVEN_K": True,
        "INDEX_64": False,
    }
    meta |= {"GROUP_SIZE_M": group_size_m, **MATMUL_CONFIG}
    return lambda: matmul_mod._matmul_tiles[grid](*args, **meta)  # read MK + KN at best, write MN


def _matmul_inputs(m: int, n: int, k: int, dtype=torch.bfloat16):
    a = torch.randn(m, k, device=DEVICE).to(dtype)
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    return a, b, torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)


def _checked(launch, a, b, c) -> None:
    """Run once and compare a few rows with an fp32 product (bf16 output: relative 1e-2)."""
    launch()
    rows = torch.randperm(a.shape[0], device=DEVICE)[:64]
    expected = a[rows].float() @ b.float()
    torch.testing.assert_close(c[rows].float(), expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item())


def _matmul_case(group_size_m: int):
    a, b, c = _matmul_inputs(8192, 8192, 8192)
    launch = matmul_launch(a, b, c, group_size_m)
    _checked(launch, a, b, c)
    return launch


@case("ch03.matmul_grouped", questions=("l2", "dram"), kernel="_matmul_tiles")
def matmul_grouped():
    """bf16 8192^3, 128x256x64 tiles, GROUP_SIZE_M=8"""
    return _matmul_case(8)


@case("ch03.matmul_ungrouped", questions=("l2", "dram"), kernel="_matmul_tiles")
def matmul_ungrouped():
    """bf16 8192^3, 128x256x64 tiles, GROUP_SIZE_M=1 (row by row)"""
    return _matmul_case(1)


SOFTMAX_CONFIGS = ((8192, 4), (8192, 16), (8192, 32), (32768, 4))  # (columns, num_warps)
ADD_RELU_CONFIGS = ((128, 4), (1024, 4), (16384, 1))  # (BLOCK_SIZE, num_warps)


def _softmax_case(n_rows: int, n_cols: int, num_warps: int):
    x = torch.randn(n_rows, n_cols, device=DEVICE)
    torch.testing.assert_close(softmax(x, num_warps=num_warps), torch.softmax(x, dim=1))
    return lambda: softmax(x, num_warps=num_warps)  # read MN, write MN


def _add_relu_case(block_size: int, num_warps: int):
    n = 1 << 28
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    add_relu(x, y, out, block_size=block_size, num_warps=num_warps)
    torch.testing.assert_close(out, torch.relu(x + y), rtol=0, atol=0)
    return lambda: add_relu(x, y, out, block_size=block_size, num_warps=num_warps)  # read 2n, write n


def _register_configs() -> list[str]:
    """One case per softmax and add_relu config; returns their names."""
    names = []
    for cols, warps in SOFTMAX_CONFIGS:
        rows, name = 8192 * 8192 // cols, f"ch03.softmax_{cols}_w{warps}"
        doc = f"fp32 softmax {rows}x{cols}, num_warps={warps}"
        build = functools.partial(_softmax_case, rows, cols, warps)
        names.append(name)
        case(name, questions=("occupancy", "spills", "dram"), kernel="_softmax_kernel", doc=doc)(build)
    for block, warps in ADD_RELU_CONFIGS:
        name, doc = (
            f"ch03.add_relu_b{block}_w{warps}",
            f"fp32 add_relu at 2^28, BLOCK_SIZE={block}, num_warps={warps}",
        )
        names.append(name)
        questions = ("in_flight", "occupancy", "spills", "dram")
        case(name, questions=questions, kernel="_add_relu_kernel", doc=doc)(
            functools.partial(_add_relu_case, block, warps)
        )
    return names


CASES = ["ch03.matmul_grouped", "ch03.matmul_ungrouped", *_register_configs()]


def grouping_rows(shapes=GROUPING_SHAPES, dtype=torch.bfloat16) -> list[dict]:
    """do_bench medians (L2 cleared between runs) of the fixed-config kernel at GROUP_SIZE_M 8 and 1."""
    rows = []
    for m, n, k in shapes:
        a, b, c = _matmul_inputs(m, n, k, dtype)
        flops = traffic.matmul(m, n, k, dtype).flops
        ms = {}
        for group in (8, 1):
            launch = matmul_launch(a, b, c, group)
            _checked(launch, a, b, c)
            ms[group] = timing.time_ms(launch)
            row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "group_size_m": group}
            rows.append(row | {"ms": ms[group], "tflops": timing.tflops(flops, ms[group])})
        rows[-2]["speedup_vs_ungrouped"] = ms[1] / ms[8]
    return rows


@benchmark("ch03_profile")
def bench_profile() -> list[dict]:
    return profile_rows(CASES)


@benchmark("ch03_grouping")
def bench_grouping() -> list[dict]:
    return grouping_rows()
