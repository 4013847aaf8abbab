"""Chapter 03 exercises: a fused add+relu kernel, a row softmax for any row length, a tiled matmul's K loop,
and the grouped program order that keeps its tiles in L2.

Sizes come from `labkernels.size`: small on the CPU lane (the interpreter costs ~1-2 ms per program), large on
the GPU. Every size is drawn at grading time and is deliberately not a multiple of any power of two.
"""

from __future__ import annotations

import math

import torch

from labkernels import size, traffic
from labkernels.ch03_triton import add_relu as add_relu_mod
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.grading.core import exercise


def _odd(g, low: int, high: int) -> int:
    """A random size in [low, high] that is not a multiple of 16 (so never of a block size)."""
    n = g.randint(low, high)
    return n if n % 16 else n + 7


@exercise("3.1", "Fused add+relu kernel", points=4, speed_points=2, timeout_s=120, requires="triton")
def _grade_3_1(student, g):
    def one(shape, dtype):
        x, y = g.randn(*shape, dtype=dtype), g.randn(*shape, dtype=dtype)
        out = g.guarded_empty(shape, dtype)  # NaN inside, canaries around it
        student(x, y, out)
        g.check_close(out, add_relu_mod.reference(x, y), atol=1e-6, rtol=1e-6)

    with g.case("a size that is not a multiple of the block", points=1):
        one((_odd(g, *size(cpu=(3000, 60_000), gpu=(1_000_000, 30_000_000))),), torch.float32)
    with g.case("a size smaller than one block", points=1):
        one((_odd(g, 1, 100),), torch.float32)
    with g.case("float16 inputs", points=1):
        one((_odd(g, *size(cpu=(3000, 30_000), gpu=(100_000, 5_000_000))),), torch.float16)
    with g.case("a 2-D tensor (the kernel sees flat memory)", points=1):
        one((g.randint(3, 60), _odd(g, 100, 700)), torch.float32)
    with g.case("bandwidth >= 70% of copy at 2^26 float32", points=2, gpu_only=True):
        n = 1 << 26
        x, y = g.randn(n), g.randn(n)
        out = g.guarded_empty((n,), torch.float32)
        student(x, y, out)
        g.check_close(out, add_relu_mod.reference(x, y), atol=1e-6, rtol=1e-6)
        g.expect_bandwidth(
            lambda: student(x, y, out),
            traffic.add_relu(n, torch.float32),
            fraction=0.7,
            check=lambda x, y, out: g.check_close(out, add_relu_mod.reference(x, y), atol=1e-6, rtol=1e-6),
        )


SOFTMAX_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2)}


@exercise("3.2", "Row softmax for any row length", points=5, speed_points=1, timeout_s=120, requires="triton")
def _grade_3_2(student, g):
    def one(x):
        out = g.guarded_empty(tuple(x.shape), x.dtype)
        student(x, out)
        atol, rtol = SOFTMAX_TOL[x.dtype]
        g.check_close(out, softmax_mod.reference(x.double()), atol=atol, rtol=rtol)

    rows = size(cpu=(1, 40), gpu=(100, 3000))
    with g.case("rows whose length is not a power of two", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 3000)))
    with g.case("rows of one element, and rows shorter than a warp", points=1):
        one(g.randn(g.randint(*rows), 1))
        one(g.randn(g.randint(*rows), _odd(g, 2, 31)))
    with g.case("large values (subtract the row max before exp)", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 1000)) * 1000)
    with g.case("float16 in, float16 out", points=1):
        one(g.randn(g.randint(*rows), _odd(g, 100, 3000), dtype=torch.float16))
    with g.case("rows with a stride (a slice of a wider matrix)", points=1):
        n_cols = _odd(g, 100, 1000)
        wide = g.randn(g.randint(*rows), n_cols + g.randint(1, 50))
        one(wide[:, :n_cols])
    with g.case("bandwidth >= 50% of copy at 4096 x 5000 float32", points=1, gpu_only=True):
        x = g.randn(4096, 5000)
        out = g.guarded_empty((4096, 5000), torch.float32)
        student(x, out)
        g.check_close(out, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5)
        g.expect_bandwidth(
            lambda: student(x, out),
            traffic.softmax(4096, 5000, torch.float32),
            fraction=0.5,
            check=lambda x, out: g.check_close(out, torch.softmax(x, dim=1), atol=1e-6, rtol=1e-5),
        )


@exercise(
    "3.3",
    "The K loop of a tiled matmul, with grouped program order",
    points=4,
    timeout_s=180,
    requires="triton",
)
def _grade_3_3(student, g):
    # student(a, b, c, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M) writes a @ b into c (float32).
    def one(m, n, k, dtype, tiles):
        a, b = g.randn(m, k, dtype=dtype), g.randn(k, n, dtype=dtype)
        c = g.guarded_empty((m, n), torch.float32)
        student(a, b, c, *tiles)
        # TF32 (triton's default for fp32 on the GPU) and IEEE both pass; a lost K step does not.
        g.check_close(c, matmul_mod.reference(a, b), atol=1e-2 * math.sqrt(k), rtol=1e-2)

    small, big = size(cpu=(40, 100), gpu=(300, 1500))
    with g.case("float32, no dimension a multiple of its tile", points=1):
        one(_odd(g, small, big), _odd(g, small, big), _odd(g, small, big), torch.float32, (32, 32, 16, 4))
    with g.case("K smaller than one BLOCK_SIZE_K step", points=1):
        one(_odd(g, small, big), _odd(g, small, big), g.randint(1, 15), torch.float32, (32, 32, 16, 4))
    with g.case("float16 inputs, float32 accumulator", points=1):
        one(_odd(g, small, big), _odd(g, small, big), _odd(g, small, big), torch.float16, (32, 32, 32, 2))
    with g.case("a short last group (row tiles not a multiple of GROUP_SIZE_M)", points=1):
        group = 3
        tiles_m = group * g.randint(1, 3) + g.randint(1, group - 1)
        m = 16 * tiles_m - g.randint(1, 15)
        one(m, _odd(g, small, big), _odd(g, 20, 60), torch.float32, (16, 32, 16, group))


def _grouped_order_reference(pid, num_pid_m, num_pid_n, group_size_m):
    num_pid_in_group = group_size_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * group_size_m
    group_rows = min(num_pid_m - first_pid_m, group_size_m)
    return first_pid_m + (pid % num_pid_in_group) % group_rows, (pid % num_pid_in_group) // group_rows


@exercise("3.4", "Grouped program order, in plain Python", points=2, timeout_s=60)
def _grade_3_4(student, g):
    # student(pid, num_pid_m, num_pid_n, group_size_m) -> (pid_m, pid_n)
    def grids(count):
        for _ in range(count):
            yield g.randint(1, 40), g.randint(1, 40), g.randint(1, 9)

    def tiles_of(num_pid_m, num_pid_n, group):
        # One round trip for the whole grid; tile indices are ints (a float index is not an index).
        got = student.map([(pid, num_pid_m, num_pid_n, group) for pid in range(num_pid_m * num_pid_n)])
        for pid, tile in enumerate(got):
            g.expect(
                isinstance(tile, tuple | list)
                and len(tile) == 2
                and all(isinstance(i, int) and not isinstance(i, bool) for i in tile),
                f"pid {pid}: return (pid_m, pid_n) as two ints, got {tile!r}",
            )
        return [tuple(t) for t in got]

    with g.case("every tile computed exactly once (short last groups included)", points=1):
        for num_pid_m, num_pid_n, group in grids(30):
            tiles = tiles_of(num_pid_m, num_pid_n, group)
            g.expect(
                sorted(tiles) == [(i, j) for i in range(num_pid_m) for j in range(num_pid_n)],
                f"grid {num_pid_m} x {num_pid_n}, GROUP_SIZE_M={group}: the tiles are not each visited once",
            )
    with g.case("programs walk down a group of rows before moving right", points=1):
        for num_pid_m, num_pid_n, group in grids(30):
            tiles = tiles_of(num_pid_m, num_pid_n, group)
            for pid in range(num_pid_m * num_pid_n):
                want = _grouped_order_reference(pid, num_pid_m, num_pid_n, group)
                got = tiles[pid]
                g.expect(
                    got == want,
                    f"grid {num_pid_m} x {num_pid_n}, GROUP_SIZE_M={group}: pid {pid} gave {got}, not {want}",
                )
