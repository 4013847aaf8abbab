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


# --- reads vs writes ----------------------------------------------------------------------------------------

# (label, elements read per element written, elements written, the call on tensors x, y, w, out)
MIX_KERNELS = [
    ("write only: out.fill_(1)", 0, 1, lambda x, y, w, out: out.fill_(1.0)),  # write n
    ("copy: out.copy_(x)", 1, 1, lambda x, y, w, out: out.copy_(x)),  # read n, write n
    ("add: x + y", 2, 1, lambda x, y, w, out: torch.add(x, y, out=out)),  # read 2n, write n
    ("addcmul: x + y * w", 3, 1, lambda x, y, w, out: torch.addcmul(x, y, w, out=out)),  # read 3n, write n
    ("read only: x.sum()", 1, 0, lambda x, y, w, out: x.sum()),  # read n, write one number
]


def read_write_mix_rows(n: int, dtype: torch.dtype = torch.float32) -> list[dict]:
    """GB/s of simple torch kernels that differ only in how many elements they read per element written.

    All count the bytes they must move (reads + writes), exactly as copy bandwidth does, so the column
    `fraction_of_copy` says whether HBM serves a given mix of reads and writes faster or slower than a copy's
    one read per write: the reason a 2:1 kernel such as add+relu can show more than 100% of copy bandwidth.
    """
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise ValueError(f"n must be a positive int, got {n!r}")
    x, y, w = (torch.randn(n, device=DEVICE, dtype=dtype) for _ in range(3))
    out = torch.empty_like(x)
    es = traffic.element_size(dtype)
    rows = []
    for label, reads, writes, fn in MIX_KERNELS:
        ms = timing.time_ms(lambda fn=fn: fn(x, y, w, out))
        nbytes = (reads + writes) * n * es
        rows.append(
            {
                "kernel": label,
                "reads": reads,
                "writes": writes,
                "n": n,
                "bytes": nbytes,
                "ms": ms,
                "gbps": timing.gbps(nbytes, ms),
            }
        )
    copy_gbps = next(r["gbps"] for r in rows if (r["reads"], r["writes"]) == (1, 1))
    for r in rows:
        r["fraction_of_copy"] = r["gbps"] / copy_gbps
    return rows
