"""Chapter 00 reference results: the H200's ceilings, its copy-size curve, and ops on its roofline."""

from __future__ import annotations

import torch

from labkernels.bench import benchmark
from labkernels.ch00_roofline.ops import measure_ops, points_rows, read_write_mix_rows
from labkernels.roofline import ceilings_rows, copy_size_sweep, measure_ceilings

GPU_GEMMS = [(4096, 4096, 4096), (8192, 8192, 64), (16384, 16384, 16), (4096, 4096, 512), (512, 4096, 4096)]
COPY_SIZES = [1 << p for p in range(12, 33, 1)]  # 4 KiB .. 4 GiB


@benchmark("ceilings")
def ceilings() -> list[dict]:
    return ceilings_rows(measure_ceilings())


@benchmark("ch00_copy_sizes")
def copy_sizes() -> list[dict]:
    return copy_size_sweep(COPY_SIZES).rows


@benchmark("ch00_ops")
def ops() -> list[dict]:
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for row in points_rows(measure_ops(1 << 28, GPU_GEMMS, dtype)):
            rows.append({"dtype": str(dtype).removeprefix("torch."), **row})
    return rows


@benchmark("ch00_read_write_mix")
def read_write_mix() -> list[dict]:
    """Why a 2:1 read:write kernel can beat 100% of copy bandwidth: the same bytes, different mixes."""
    return [row for p in (24, 28) for row in read_write_mix_rows(1 << p)]
