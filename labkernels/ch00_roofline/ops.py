"""The chapter's ops in plain torch, each timed against its traffic-model byte and FLOP counts.

These are the eager PyTorch versions: `add_relu_eager` runs two kernels (add, then relu) and so moves
5n elements through memory, where a fused kernel would move 3n (chapters 01 and 03 write that kernel).
"""

from __future__ import annotations

import torch

from labkernels import timing, traffic
from labkernels.lane import DEVICE
from labkernels.roofline import Point


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y  # read 2n, write n


def add_relu_eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x + y)  # add: read 2n, write n; relu: read n, write n


def measure_ops(
    n: int, gemm_shapes: list[tuple[int, int, int]], dtype: torch.dtype = torch.float32
) -> list[Point]:
    """Time vector add, eager add+relu and GEMMs of several shapes; return them as roofline points."""
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int, got {n!r}")
    x = torch.randn(n, device=DEVICE, dtype=dtype)
    y = torch.randn(n, device=DEVICE, dtype=dtype)
    points = [
        Point("vector add", traffic.add(n, dtype), timing.time_ms(lambda: vector_add(x, y))),
        Point(
            "add+relu (eager, 2 kernels)",
            traffic.add_relu(n, dtype, fused=False),
            timing.time_ms(lambda: add_relu_eager(x, y)),
        ),
    ]
    for m, nn, k in gemm_shapes:
        a = torch.randn(m, k, device=DEVICE, dtype=dtype)
        b = torch.randn(k, nn, device=DEVICE, dtype=dtype)
        ms = timing.time_ms(lambda a=a, b=b: a @ b)
        points.append(Point(f"GEMM {m}×{nn}×{k}", traffic.matmul(m, nn, k, dtype), ms))
    return points


def points_rows(points: list[Point]) -> list[dict]:
    return [
        {
            "op": p.label,
            "bytes": p.traffic.bytes,
            "flops": p.traffic.flops,
            "ms": p.ms,
            "gbps": p.gbps,
            "tflops": p.tflops,
        }
        for p in points
    ]
