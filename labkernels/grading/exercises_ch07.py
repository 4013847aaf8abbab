"""Chapter 07 exercises: the block-table address arithmetic of a paged cache, the bytes one decode step reads,
and a Triton kernel that unpacks 4-bit weights with their group scales.

Every input is drawn at grading time; outputs are NaN-poisoned inside guard bands. The chapter's own paged
cache and 4-bit modules are off limits while an answer runs: the arithmetic is the learner's.
"""

from __future__ import annotations

import math

import torch

from labkernels import size, traffic
from labkernels.grading.core import exercise
from labkernels.lane import DEVICE

# --- 7.1 gather a paged cache -------------------------------------------------------------------------------


def _random_paged(
    g, batch: int, kv_heads: int, head_dim: int, block_size: int, lengths: list[int], spare: int
):
    """Pools with every block filled with noise, and a table whose blocks are a random sample of the pool
    (unused table entries -1)."""
    pages = [math.ceil(n / block_size) for n in lengths]
    width = max(pages) + g.randint(0, 2)
    num_blocks = sum(pages) + spare
    order = g.random.sample(range(num_blocks), sum(pages))
    table = torch.full((batch, width), -1, dtype=torch.int32)
    at = 0
    for b, p in enumerate(pages):
        table[b, :p] = torch.tensor(order[at : at + p], dtype=torch.int32)
        at += p
    k_pool = g.randn(num_blocks, kv_heads, block_size, head_dim)
    v_pool = g.randn(num_blocks, kv_heads, block_size, head_dim)
    lens = torch.tensor(lengths, dtype=torch.int32)
    return k_pool, v_pool, table.to(DEVICE), lens.to(DEVICE)


def _gather_reference(pool: torch.Tensor, table: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Token i of sequence b is slot i % P of block table[b, i // P]; zeros past each length."""
    block_size = pool.shape[2]
    out = torch.zeros(table.shape[0], pool.shape[1], int(lens.max()), pool.shape[3], dtype=pool.dtype)
    for b, n in enumerate(lens.tolist()):
        for i in range(n):
            out[b, :, i] = pool[int(table[b, i // block_size]), :, i % block_size].cpu()
    return out


@exercise(
    "7.1", "Gather a paged KV cache into a contiguous one", points=4, timeout_s=90,
    forbids=("labkernels.ch07_decode.paged",),
)  # fmt: skip
def _grade_7_1(student, g):
    # student(k_pool, v_pool, block_table, seq_lens, k_out, v_out): k_out, v_out (B, Hkv, max(seq_lens), D)
    # receive each sequence's keys and values in order, zeros past its length.
    def one(batch, block_size, lengths, kv_heads=2, head_dim=8, spare=3):
        k_pool, v_pool, table, lens = _random_paged(g, batch, kv_heads, head_dim, block_size, lengths, spare)
        shape = (batch, kv_heads, max(lengths), head_dim)
        k_out, v_out = g.guarded_empty(shape), g.guarded_empty(shape)
        student(k_pool, v_pool, table, lens, k_out, v_out)
        g.check_close(k_out, _gather_reference(k_pool, table, lens), atol=0, rtol=0)
        g.check_close(v_out, _gather_reference(v_pool, table, lens), atol=0, rtol=0)

    with g.case("one sequence, its blocks in a random order in the pool", points=1):
        block = g.choice([4, 8, 16])
        one(1, block, [block * g.randint(2, 6)])
    with g.case("ragged lengths, not multiples of the block size (zeros past each length)", points=1):
        batch = g.randint(3, 6)
        one(batch, g.choice([4, 8]), [g.randint(1, 60) for _ in range(batch)])
    with g.case("a block larger than the longest sequence, and blocks of one token", points=1):
        one(2, 64, [g.randint(1, 30), g.randint(1, 30)])
        one(3, 1, [g.randint(1, 12) for _ in range(3)])
    with g.case("more heads, a wider head dim, spare blocks and -1 in unused table entries", points=1):
        batch = g.randint(2, 4)
        one(
            batch,
            16,
            [g.randint(1, 90) for _ in range(batch)],
            kv_heads=4,
            head_dim=32,
            spare=g.randint(5, 20),
        )


# --- 7.2 bytes of a decode step -----------------------------------------------------------------------------


def _step_bytes(cfg: dict, seq_lens: list[int], block_size: int, weight_bits: int, group: int) -> int:
    d, hq, hkv, hd, ff = cfg["d_model"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"], cfg["d_ff"]
    projections = [((hq + 2 * hkv) * hd, d), (d, hq * hd), (2 * ff, d), (d, ff)]  # (N, K) of each
    weights = 0
    for n, k in projections:
        weights += n * k * weight_bits // 8
        if weight_bits < 16:
            weights += n * (k // group) * 2  # one 16-bit scale a group
    weights += 2 * d * 2  # the two norms' weights
    cache = sum(2 * hkv * n * hd * 2 for n in seq_lens)  # K and V of every cached token, 16-bit
    table = sum(4 * math.ceil(n / block_size) for n in seq_lens)
    return cfg["layers"] * (weights + cache + table)


def _random_model(g) -> dict:
    hkv = g.choice([1, 2, 4, 8])
    return {
        "layers": g.randint(1, 40),
        "d_model": 128 * g.randint(4, 40),
        "q_heads": hkv * g.choice([1, 2, 4, 8]),
        "kv_heads": hkv,
        "head_dim": g.choice([64, 128]),
        "d_ff": 128 * g.randint(8, 120),
    }


@exercise("7.2", "The bytes one decode step reads", points=4, timeout_s=60)
def _grade_7_2(student, g):
    # student(cfg, seq_lens, block_size, weight_bits, group) -> int: see the exercise's statement.
    def one(cfg, lens, block_size, bits, group=128):
        got = student(dict(cfg), list(lens), block_size, bits, group)
        want = _step_bytes(cfg, lens, block_size, bits, group)
        g.expect(isinstance(got, int) and got == want, f"{cfg}, lengths {lens}, P={block_size}, {bits}-bit: "
                 f"got {got!r}, expected {want}")  # fmt: skip

    llama = {"layers": 32, "d_model": 4096, "q_heads": 32, "kv_heads": 8, "head_dim": 128, "d_ff": 14336}
    with g.case("16-bit weights, one sequence", points=1):
        one(llama, [g.randint(1, 8192)], 16, 16)
    with g.case("4-bit weights with a 16-bit scale per group", points=1):
        one(llama, [g.randint(1, 8192)], 16, 4)
        one(llama, [g.randint(1, 8192)], 16, 8, group=64)
    with g.case("a ragged batch: each sequence its own length, its own block table row", points=1):
        one(llama, [g.randint(1, 50_000) for _ in range(g.randint(2, 16))], g.choice([16, 32, 64]), 4)
    with g.case("random models", points=1):
        for _ in range(20):
            lens = [g.randint(1, 30_000) for _ in range(g.randint(1, 8))]
            one(_random_model(g), lens, g.choice([8, 16, 128]), g.choice([4, 8, 16]), g.choice([32, 64, 128]))


# --- 7.3 unpack 4-bit weights in a Triton kernel ------------------------------------------------------------

GROUP = 128
UNPACK_TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3)}


def _unpack_reference(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(q - 8) * s in fp64, q the low nibble (even k) and the high nibble (odd k) of each byte."""
    p = packed.to("cpu", torch.int64)
    q = torch.stack((p & 0xF, p >> 4), dim=-1).view(p.shape[0], -1).double() - 8
    s = scales.to("cpu", torch.float64)
    return (q.view(q.shape[0], -1, GROUP) * s[:, :, None]).view(q.shape)


def _packed(g, n: int, k: int) -> torch.Tensor:
    return (
        torch.randint(0, 256, (n, k // 2), generator=g.generator, dtype=torch.int32)
        .to(torch.uint8)
        .to(DEVICE)
    )


@exercise(
    "7.3", "Unpack 4-bit weights with their group scales, in Triton", points=4, speed_points=2, timeout_s=240,
    requires="triton", forbids=("labkernels.ch07_decode.int4",),
)  # fmt: skip
def _grade_7_3(student, g):
    # student(packed, scales, out): packed (N, K/2) uint8, scales (N, K/128), out (N, K) in the scales' dtype.
    def one(n, groups, dtype):
        packed = _packed(g, n, GROUP * groups)
        scales = g.randn(n, groups, dtype=dtype)
        out = g.guarded_empty((n, GROUP * groups), dtype)
        student(packed, scales, out)
        atol, rtol = UNPACK_TOL[dtype]
        g.check_close(out, _unpack_reference(packed, scales), atol=atol, rtol=rtol)

    rows = size(cpu=(20, 90), gpu=(1000, 5000))
    with g.case("an odd number of rows, a few groups, float32", points=1):
        one(g.randint(*rows) | 1, g.randint(2, 5), torch.float32)
    with g.case("float16 scales and output", points=1):
        one(g.randint(*rows), g.randint(1, 4), torch.float16)
    with g.case("one row, and fewer rows than a block", points=1):
        one(1, g.randint(1, 3), torch.float32)
        one(g.randint(2, 15), g.randint(1, 3), torch.float32)
    with g.case("many groups a row", points=1):
        one(g.randint(3, 9), size(cpu=g.randint(10, 20), gpu=g.randint(30, 112)), torch.float32)
    with g.case("bandwidth >= 60% of copy at 14336 x 4096 bfloat16", points=2, gpu_only=True):
        n, k = 14336, 4096
        packed = _packed(g, n, k)
        scales = g.randn(n, k // GROUP, dtype=torch.bfloat16)
        out = g.guarded_empty((n, k), torch.bfloat16)
        student(packed, scales, out)
        atol, rtol = UNPACK_TOL[torch.bfloat16]
        g.check_close(out, _unpack_reference(packed, scales), atol=atol, rtol=rtol)
        moved = traffic.Traffic("unpack_int4", n * k // 2 + (n * k // GROUP + n * k) * 2, n * k)
        g.expect_bandwidth(
            lambda: student(packed, scales, out),
            moved,
            fraction=0.6,
            check=lambda packed, scales, out: g.check_close(
                out, _unpack_reference(packed, scales), atol=atol, rtol=rtol
            ),
        )
