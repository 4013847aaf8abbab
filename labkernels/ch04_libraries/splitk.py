"""Split-K and stream-K: the chapter 03 matmul for shapes that make too few tiles to fill the GPU.

A tiled matmul gives each program one BLOCK_M x BLOCK_N tile of C and walks all of K. With M = 16, N = 4096
and 128-wide tiles that is 32 programs for 132 SMs: a quarter of the machine does all the work, and the
rest idles. Two ways to cut the work finer, both along K:

- **split-K** ("split_k"): each tile's K range is cut into `split` chunks, one program per (tile, chunk),
  each leaving an fp32 partial in a workspace. Where the chunks are few (<= SUM_GROUP) or
  `deterministic=True` asks for it, each program then takes a ticket (an atomic count per tile), and the
  one that takes a tile's last ticket adds the partials in chunk order, stores the tile of C and resets
  the ticket: one launch, nobody waits, and the result is bitwise the same on every run. Many chunks make
  that sum a long serial read (in two levels, groups of SUM_GROUP then the groups), so otherwise they are
  added with fp32 atomics into one M x N sum and `_cast_and_zero_kernel` casts it and zeroes it for the
  next call. Extra traffic: the partials, split x M x N x 4 bytes written and read (in L2 for skinny
  shapes). A first version launched up to three kernels per call (zero the workspace, partials, sum or
  cast) through Triton's own launch path: on skinny shapes each call cost the host more than its kernels
  took. (Atomics summed in the same launch by the tile's last program gave wrong results on the H200 for
  some tile shapes, fence or not: the atomics here are read by the next launch.)
- **stream-K** ("stream_k"): one program per SM; the total work, tiles x K-steps, is cut into equal
  contiguous ranges, one per program, so every SM gets the same number of K-steps whatever the tile count.
  A range may start or end inside a tile: the program that computes a tile's *last* K-step adds the
  partial sums of the earlier programs that covered the same tile (published in a per-program fp32 slot
  with a flag), in K order, and stores the tile. Each program walks its range backwards, so it publishes
  its partial tile first, and the tile it finishes comes last, when its neighbours have long published:
  waiting is rare. The order of the additions is fixed by the shape, so stream-K is deterministic too.
  It fixes wave quantization: 144 tiles on 132 SMs would otherwise run as two waves, the second 9% full.
- **wave tail** ("wave_tail", `wave_tail.py`): chapter 03's tiles for the full waves, and in the same
  launch the tiles left over, a quarter as wide, so that the leftover work lands on every SM instead of a
  few. No partial sums.

`matmul(kernel="auto")` keeps the chapter 03 kernels (tiled, TMA persistent) where they fill the GPU, and
considers split-K when the tiles are fewer than the SMs and K is deep, stream-K and the wave tail when the
last wave of tiles is partly filled (`auto_candidates`, a rule on tile counts, SM count and K). When the
rule leaves more than one candidate, the first call of a shape times each once and keeps the fastest (as
chapter 03's "auto").

TF32: a wgmma (Hopper tensor-core) instruction takes 32-bit operands from shared memory only "K-major",
K contiguous in memory. A row-major B (K, N) is N-major, so Triton turns each tile around element by element
(4-byte copies), which is why chapter 03's TF32 matmul runs at a fraction of cuBLAS. With `allow_tf32=True`,
fp32 inputs go through the "k_major" kernels. A B that is already K-major (b = w.t() of a row-major weight,
as in a linear layer) is read as it is; any other B is first copied K-major by chapter 02's tiled transpose
(read KN, write KN: 4KN bytes more per call). Where the rows allow TMA copies (16-byte aligned, Hopper),
`_k_major_tma_kernel` loads both operands through the TMA unit; elsewhere the pointer kernel does.
The copy's alternative, C^T = B^T A^T with B^T fed to wgmma from registers (where any layout is allowed),
copies nothing, but Triton (3.6, 3.7) lets a step's register-operand MMAs run on while the next step loads
new values into those registers, which PTX leaves undefined (chapter 04's box convolution gave wrong outputs
that way). Waiting for each step's MMAs makes it correct and slower than the copy
(experiments/conv_box_diagnose.py --wait-configs measures both).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch02_strides.triton_strided import copy_2d_tiled
from labkernels.ch03_triton import matmul as ch03
from labkernels.ch03_triton.matmul import _tile_coordinates, check_operands  # grouped order, as ch03 teaches
from labkernels.ch04_libraries import wave_tail
from labkernels.lane import DEVICE, LANE, on_gpu, sm_count
from labkernels.timing import graph_autotune_bench

KERNELS = ("auto", "tiled", "tma_persistent", "split_k", "stream_k", "wave_tail", "k_major")
CH03_KERNELS = ("tiled", "tma_persistent")
SHARED_MEMORY_BYTES = ch03.SHARED_MEMORY_BYTES
INT32_LIMIT = 2**31
K_MAJOR_TMA = True  # "k_major" loads through TMA where the operands allow it (`_tma_fits`)
SPLIT_K_GRANULE = 256  # each split's K range is a multiple of this, so of every BLOCK_SIZE_K below
MAX_SPLIT = 128
SUM_GROUP = tl.constexpr(8)  # deterministic split-K adds its partials in groups of this many, then the groups
REFERENCE_TILE = 128  # the tile the auto rule counts with (the common size in chapter 03's winners)


def _config(m: int, n: int, k: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    meta = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# Split-K: skinny tiles (16 rows, for M = 16) up to 128 x 128; deep BLOCK_SIZE_K keeps many bytes in flight
# per program where the shape is memory-bound. Tiles much larger than M or N are pruned.
SPLIT_K_CONFIGS = [
    _config(16, 64, 128, stages=4, warps=4),
    _config(16, 128, 128, stages=4, warps=4),
    _config(64, 16, 128, stages=4, warps=4),
    _config(64, 64, 128, stages=4, warps=4),
    _config(64, 128, 64, stages=4, warps=4),
    _config(128, 128, 64, stages=4, warps=8),
    _config(128, 64, 64, stages=4, warps=4),
]
# Stream-K: the tile sizes chapter 03's autotuner picks for mid-size shapes.
STREAM_K_CONFIGS = [
    _config(128, 128, 64, stages=4, warps=8),
    _config(128, 256, 64, stages=3, warps=8),
    _config(128, 64, 64, stages=4, warps=4),
]
# TF32 (fp32 operands): a stage holds twice the bytes of a 16-bit one, so BLOCK_SIZE_K 32 (128-byte rows,
# one swizzle line) and fewer stages: 128 x 256 x 32 x 4 bytes x 3 stages = 144 KiB of shared memory.
K_MAJOR_CONFIGS = [
    _config(128, 256, 32, stages=4, warps=8),  # 192 KiB
    _config(128, 256, 32, stages=3, warps=8),
    _config(256, 128, 32, stages=3, warps=8),
    _config(128, 128, 32, stages=4, warps=8),
    _config(128, 128, 32, stages=5, warps=4),
]
CPU_CONFIGS = [_config(32, 32, 32, stages=1, warps=4, group=4)]  # one config: the interpreter never times
# The K-major kernel through TMA copies (`_k_major_tma_kernel`): persistent, C stored through pointers.
K_MAJOR_TMA_CONFIGS = [
    _config(128, 256, 32, stages=4, warps=8),
    _config(128, 256, 32, stages=3, warps=8),
    _config(256, 128, 32, stages=3, warps=8),
    _config(128, 128, 32, stages=4, warps=8),
    _config(128, 128, 64, stages=3, warps=8),
]


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b in fp64, returned in fp64: the higher-precision reference of the tests."""
    return a.double() @ b.double()  # read MK + KN, write MN


# --- the rule ----------------------------------------------------------------------------------------------


def _pow2_at_least(x: int, floor: int, cap: int) -> int:
    return min(cap, max(floor, 1 << max(0, (x - 1).bit_length())))


def split_for(m: int, n: int, k: int, sms: int) -> int:
    """How many K chunks split-K cuts each tile into: enough (tile, chunk) programs to give every SM one,
    with each chunk at least 2 x SPLIT_K_GRANULE deep (shallower chunks cost more in partials than they
    save), at most MAX_SPLIT. Tiles are counted at REFERENCE_TILE, narrowed to M or N when smaller."""
    tiles = math.ceil(m / _pow2_at_least(m, 16, REFERENCE_TILE)) * math.ceil(
        n / _pow2_at_least(n, 16, REFERENCE_TILE)
    )
    return max(1, min(sms // tiles, k // (2 * SPLIT_K_GRANULE), MAX_SPLIT))


def split_chunk(k: int, split: int) -> int:
    """K elements per split: ceil(K / split) rounded up to SPLIT_K_GRANULE (the last chunk is shorter)."""
    return triton.cdiv(triton.cdiv(k, split), SPLIT_K_GRANULE) * SPLIT_K_GRANULE


def auto_candidates(
    m: int, n: int, k: int, sms: int, dtype: torch.dtype, allow_tf32: bool = False
) -> list[str]:
    """The kernels "auto" considers for this shape, most promising first. "ch03" stands for chapter 03's own
    choice between its tiled and TMA persistent kernels. Counted in REFERENCE_TILE tiles:
    - fp32: "k_major" with TF32 (wgmma needs K-major operands), else chapter 03's kernel;
    - fewer tiles than SMs, K deep enough for `split_for` to return >= 2: split-K fills the SMs (alone, with
      no timing, when the tiles fill at most a quarter of the SMs);
    - the last wave of tiles at most half full, and few waves (< 8: a partial wave costs 1/waves or more):
      stream-K evens the K-steps out over the SMs;
    - at least one full wave and a partial one, few waves: "wave_tail" runs the partial wave's tiles
      narrower, in the same launch (chapter 03's tile decides whether they form a rectangle; where they do
      not, it is chapter 03's tiled kernel, and the timing keeps whichever is faster)."""
    if dtype == torch.float32:
        return ["k_major"] if allow_tf32 else ["ch03"]
    tiles = math.ceil(m / REFERENCE_TILE) * math.ceil(n / REFERENCE_TILE)
    candidates = ["ch03"]
    if split_for(m, n, k, sms) >= 2:
        if tiles * 4 <= sms:  # three quarters of the SMs would idle: nothing else comes close
            return ["split_k"]
        candidates.insert(1, "split_k")
    last_wave = tiles % sms
    if tiles >= sms // 2 and tiles < 8 * sms and 0 < last_wave <= sms // 2 and k >= 512:
        candidates.insert(1 if candidates[0] == "split_k" else 0, "stream_k")
    if sms <= tiles < 8 * sms and last_wave:
        candidates.insert(candidates.index("ch03") + 1, "wave_tail")
    return candidates


# --- the kernels -------------------------------------------------------------------------------------------


@triton.jit
def _dot_range(
    a_ptr, b_ptr, pid_m, pid_n, k_lo, k_hi, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    EVEN_K: tl.constexpr, BIG: tl.constexpr, ALIGN: tl.constexpr,
):  # fmt: skip
    """The fp32 sum over K-steps [k_lo, k_hi) of one tile's products. Rows and columns past the edge wrap
    (% M, % N: valid memory, never stored). BIG: some offset can pass 2^31, so offsets are 64-bit.
    ALIGN: N and the row strides are multiples of it (`ch03.row_alignment`; chapter 03's kernel says why).
    The full K-steps load unmasked and the ragged last one (if in range) masked, once."""
    if ALIGN > 1:  # x // ALIGN * ALIGN is x, and the compiler now knows it: 16-byte copies
        N = N // ALIGN * ALIGN
        stride_am = stride_am // ALIGN * ALIGN
        stride_bk = stride_bk // ALIGN * ALIGN
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = k_lo * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
    if BIG:
        offs_am = offs_am.to(tl.int64)
        offs_bn = offs_bn.to(tl.int64)
        offs_k = offs_k.to(tl.int64)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BM, BK)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn  # (BK, BN)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    full_steps = K // BLOCK_SIZE_K
    for k in range(k_lo, tl.minimum(k_hi, full_steps)):
        if BIG:  # recomputed in 64 bits: BLOCK_SIZE_K x a stride may itself pass 2^31
            kk = (k * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)).to(tl.int64)
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + kk[None, :] * stride_ak
            b_ptrs = b_ptr + kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn
        a = tl.load(a_ptrs)  # read BM x BK
        b = tl.load(b_ptrs)  # read BK x BN
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        if not BIG:
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
    if not EVEN_K:
        if k_hi > full_steps:  # this range holds the ragged last step: masked lanes load 0 and add nothing
            kk = full_steps * BLOCK_SIZE_K + tl.arange(0, BLOCK_SIZE_K)
            if BIG:
                kk = kk.to(tl.int64)
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + kk[None, :] * stride_ak
            b_ptrs = b_ptr + kk[:, None] * stride_bk + offs_bn[None, :] * stride_bn
            a = tl.load(a_ptrs, mask=kk[None, :] < K, other=0.0)
            b = tl.load(b_ptrs, mask=kk[:, None] < K, other=0.0)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _store_tile(
    c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BIG: tl.constexpr,
):  # fmt: skip
    """C's tile (pid_m, pid_n) = acc in C's dtype, masked at M and N; int64 offsets when BIG (past 2^31)."""
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    if BIG:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)  # write BM x BN


@triton.jit
def _publish(token, PTX: tl.constexpr):
    """Every thread's writes so far reach the whole GPU before any thread of the program passes the barrier
    (CUDA's `__threadfence(); __syncthreads();`), so the ticket that one thread takes next vouches for all of
    them; and, after a ticket, no thread's read is served from before it."""
    if PTX:  # the interpreter runs one program at a time, in order: nothing to fence
        tl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tmov.u32 $0, $1;", "=r,r", [token], dtype=tl.int32,
                                  is_pure=False, pack=1)  # fmt: skip
    tl.debug_barrier()


@triton.jit
def _add_slots(
    ws_ptr, first, count, stride, in_ws, mask, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr
):
    """ws[first] + ws[first + stride] + ... (count slots of M x N fp32), in that order: read count x BM x BN
    (.cg: from L2, where the other SMs' writes are)."""
    total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for i in range(count):
        total += tl.load(ws_ptr + (first + i * stride) + in_ws, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _split_k_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, tickets_ptr, M, N, K, K_SPLIT,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    EVEN_K: tl.constexpr, BIG: tl.constexpr,
    MODE: tl.constexpr,  # "direct": one split, store C; "ordered": partials in ws[split]; "atomic": one sum
    ALIGN: tl.constexpr = 1,  # N and the row strides are multiples of it (`ch03.row_alignment`)
    PTX: tl.constexpr = False,  # the GPU lane: `_publish` fences
):  # fmt: skip
    """Program (tile, split): the tile's products over K elements [split x K_SPLIT, (split+1) x K_SPLIT).
    "ordered": each program leaves its fp32 partial in its own slot, ws[split], and takes a ticket (an
    atomic count); the program that takes the last ticket adds the slots in a fixed order, stores the tile of
    C and resets the ticket. No program waits for another, it is one launch, and the result is bitwise the
    same whichever program comes last. In two levels, so that one program never reads more than SUM_GROUP +
    splits / SUM_GROUP slots: the last program of each group of SUM_GROUP splits adds its group's slots into
    the group's first slot (group tickets), and the last group to finish adds the group sums (tile tickets,
    after the tiles x groups group tickets). "atomic": fp32 atomics into one sum (ws, kept at zero), which
    `_cast_and_zero_kernel` turns into C after this launch: the order of the additions varies."""
    tile = tl.program_id(axis=0)
    pid_m, pid_n = _tile_coordinates(tile, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    split = tl.program_id(axis=1)
    splits = tl.num_programs(axis=1)
    steps_per_split = K_SPLIT // BLOCK_SIZE_K
    k_lo = split * steps_per_split
    k_hi = tl.minimum(k_lo + steps_per_split, tl.cdiv(K, BLOCK_SIZE_K))
    acc = _dot_range(
        a_ptr, b_ptr, pid_m, pid_n, k_lo, k_hi, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        INPUT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K, BIG, ALIGN,
    )  # fmt: skip
    if MODE == "direct":
        _store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BIG)
    else:
        offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        MN = M * N
        if BIG:  # M x N itself may pass 2^31: multiplied in 64 bits
            offs_m = offs_m.to(tl.int64)
            offs_n = offs_n.to(tl.int64)
            MN = M.to(tl.int64) * N
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        in_ws = offs_m[:, None] * N + offs_n[None, :]  # the workspace is (splits or 1, M, N), contiguous
        if MODE == "atomic":  # `_cast_and_zero_kernel` reads the sum after this launch
            tl.atomic_add(ws_ptr + in_ws, acc, mask=mask, sem="relaxed")  # read + write BM x BN fp32 in L2
        else:
            tl.store(ws_ptr + split * MN + in_ws, acc, mask=mask)  # write BM x BN fp32 (to L2, mostly)
            _publish(tile, PTX)
            group = split // SUM_GROUP
            first = group * SUM_GROUP
            in_group = tl.minimum(splits - first, SUM_GROUP)
            groups = tl.cdiv(splits, SUM_GROUP)
            group_ticket = tickets_ptr + tile * groups + group
            if tl.atomic_add(group_ticket, 1) == in_group - 1:  # the group's last: add its slots in order
                _publish(tile, PTX)
                total = _add_slots(ws_ptr, first * MN, in_group, MN, in_ws, mask, BLOCK_SIZE_M, BLOCK_SIZE_N)
                tl.atomic_xchg(group_ticket, 0)
                last = groups == 1
                if not last:
                    tl.store(
                        ws_ptr + first * MN + in_ws, total, mask=mask
                    )  # the group's sum, in its 1st slot
                    _publish(tile, PTX)
                    tile_ticket = tickets_ptr + tl.num_programs(axis=0) * groups + tile
                    last = tl.atomic_add(tile_ticket, 1) == groups - 1
                    if last:  # the last group: add the group sums, in group order
                        _publish(tile, PTX)
                        total = _add_slots(ws_ptr, 0, groups, SUM_GROUP * MN, in_ws, mask, BLOCK_SIZE_M,
                                           BLOCK_SIZE_N)  # fmt: skip
                        tl.atomic_xchg(tile_ticket, 0)
                if last:
                    _store_tile(c_ptr, total, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M,
                                BLOCK_SIZE_N, BIG)  # fmt: skip


@triton.jit
def _cast_and_zero_kernel(ws_ptr, c_ptr, MN, BLOCK: tl.constexpr):
    """C = the atomic sum cast to C's dtype (C contiguous), and the sum zeroed for the next launch (no
    memset launch)."""
    offs = tl.program_id(axis=0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    total = tl.load(ws_ptr + offs, mask=mask)  # read MN fp32
    tl.store(c_ptr + offs, total.to(c_ptr.dtype.element_ty), mask=mask)  # write MN
    tl.store(ws_ptr + offs, tl.zeros_like(total), mask=mask)  # write MN fp32


@triton.jit
def _stream_k_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, flags_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    EVEN_K: tl.constexpr, BIG: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,
    ALIGN: tl.constexpr = 1,  # N and the row strides are multiples of it (`ch03.row_alignment`)
):  # fmt: skip
    pid = tl.program_id(axis=0)
    steps_per_tile = tl.cdiv(K, BLOCK_SIZE_K)
    total = tl.cdiv(M, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N) * steps_per_tile
    per_program = tl.cdiv(total, NUM_PROGRAMS)
    start = pid * per_program
    hi = tl.minimum(start + per_program, total)
    slot = tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)[None, :]
    while hi > start:  # backwards over this program's range, one tile segment at a time
        tile_id = (hi - 1) // steps_per_tile
        tile_begin = tile_id * steps_per_tile
        lo = tl.maximum(start, tile_begin)
        pid_m, pid_n = _tile_coordinates(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        acc = _dot_range(
            a_ptr, b_ptr, pid_m, pid_n, lo - tile_begin, hi - tile_begin, M, N, K,
            stride_am, stride_ak, stride_bk, stride_bn,
            INPUT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K, BIG, ALIGN,
        )  # fmt: skip
        if hi < tile_begin + steps_per_tile:  # a later program finishes this tile: publish the partial
            tl.store(ws_ptr + pid * (BLOCK_SIZE_M * BLOCK_SIZE_N) + slot, acc)  # write BM x BN fp32
            tl.debug_barrier()  # every thread's part of the slot is written before the flag says so
            tl.atomic_xchg(flags_ptr + pid, 1)
        else:
            if lo > tile_begin:  # earlier programs hold the tile's first K-steps: add theirs, in K order
                total_acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
                for j in range(tile_begin // per_program, pid):
                    while tl.atomic_cas(flags_ptr + j, 1, 1) != 1:
                        pass
                    # read BM x BN fp32 (.cg: from L2, where the other SM's stores are)
                    total_acc += tl.load(
                        ws_ptr + j * (BLOCK_SIZE_M * BLOCK_SIZE_N) + slot, cache_modifier=".cg"
                    )
                    tl.atomic_xchg(flags_ptr + j, 0)  # consumed: ready for the next launch
                acc = total_acc + acc
            _store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BIG)
        hi = lo


@triton.jit
def _k_major_tma_kernel(
    a_ptr, bt_ptr, c_ptr, M, N, K, stride_am, stride_btn, stride_cm, stride_cn,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, BIG: tl.constexpr,
):  # fmt: skip
    """C = A B with A (M, K) row-major and B given as B^T (N, K) row-major, i.e. B K-major: both operands
    come by TMA copies, K-contiguous as wgmma wants 32-bit operands; past M, N or K the TMA unit fills
    zeros, so no masks. Persistent: program p takes tiles p, p + NUM_PROGRAMS, ... The tile loop is not
    flattened: flattened, the next tile's copies would be in flight during the store, whose fp32 tile passes
    through shared memory too (128 x 256 x 4 bytes beside the stages: more than an SM has)."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = tl.make_tensor_descriptor(bt_ptr, [N, K], [stride_btn, 1], [BLOCK_SIZE_N, BLOCK_SIZE_K])
    num_tiles = tl.cdiv(M, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N)
    for tile_id in tl.range(tl.program_id(axis=0), num_tiles, NUM_PROGRAMS, flatten=False):
        pid_m, pid_n = _tile_coordinates(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])  # read BM x BK
            bt = b_desc.load([pid_n * BLOCK_SIZE_N, k * BLOCK_SIZE_K])  # read BN x BK
            acc = tl.dot(a, bt.T, acc, input_precision=INPUT_PRECISION)
        _store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N, BIG)


# --- autotuning and launching ------------------------------------------------------------------------------


def _block_fits(configs, named_args, **kwargs):
    """Drop configs whose pipelined tiles exceed shared memory, then tiles much taller than M or wider than
    N (work on wrapped rows nobody stores: chapter 03's `snug_tiles`)."""
    element_size = named_args["a_ptr"].element_size()

    def shared_bytes(c):
        m, n, k = c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"]
        return c.num_stages * (m * k + k * n) * element_size

    fits = [c for c in configs if shared_bytes(c) <= SHARED_MEMORY_BYTES]
    return ch03.snug_tiles(fits or [min(configs, key=shared_bytes)], named_args["M"], named_args["N"])


def _even_k(args: dict) -> bool:
    return args["K"] % args["BLOCK_SIZE_K"] == 0


def _autotuned(fn, configs, key):
    return triton.autotune(
        configs=configs if LANE == "gpu" else CPU_CONFIGS,
        key=key,
        prune_configs_by={"early_config_prune": _block_fits},
        do_bench=graph_autotune_bench,
    )(triton.heuristics({"EVEN_K": _even_k})(fn))


_SPLIT_K_KEY = ["M", "N", "K", "K_SPLIT", "INPUT_PRECISION", "BIG"]
_split_k_tuned = _autotuned(_split_k_kernel, SPLIT_K_CONFIGS, _SPLIT_K_KEY)
_k_major_tuned = _autotuned(_split_k_kernel, K_MAJOR_CONFIGS, _SPLIT_K_KEY)
_stream_k_tuned = _autotuned(_stream_k_kernel, STREAM_K_CONFIGS, ["M", "N", "K", "INPUT_PRECISION", "BIG"])
_k_major_tma_tuned = triton.autotune(
    configs=K_MAJOR_TMA_CONFIGS if LANE == "gpu" else CPU_CONFIGS,
    key=["M", "N", "K", "INPUT_PRECISION", "BIG"],
    prune_configs_by={"early_config_prune": _block_fits},
    do_bench=graph_autotune_bench,
)(_k_major_tma_kernel)


Launcher = Callable[..., None]


class _Tuned(NamedTuple):
    config: triton.Config
    meta: dict  # constexprs and launch options: the config's, the call's, EVEN_K


# As in chapter 03: the autotuner chooses once per key; later calls launch the jitted kernel directly, which
# spares the autotuner's per-call host work (a 1024^3 matmul takes less GPU time than that).
_tuned: dict[tuple, _Tuned] = {}


def _launch(key: tuple, autotuned, jitted, grid_of, args: tuple, options: dict, K: int) -> Launcher | None:
    """Launch with this key's tuned config (the first call of a key tunes: the autotuner times every config
    and launches the best). Returns a launcher for the next calls whose leading tensors differ and whose
    shapes, strides, alignment and options are the same (`launch_cache.launch`), or None after tuning."""
    tuned = _tuned.get(key)
    if tuned is not None:  # the key holds the sizes, not the strides: this call's ALIGN
        meta = tuned.meta | {"ALIGN": options["ALIGN"]}
        return launch_cache.launch(jitted, grid_of(meta), args, meta)
    autotuned[grid_of](*args, **options)  # times every config the first time, then launches the best
    meta = autotuned.best_config.all_kwargs() | options
    meta["EVEN_K"] = _even_k({"K": K, **meta})
    _tuned[key] = _Tuned(autotuned.best_config, meta)
    return None


@functools.cache
def num_sms(device: torch.device = DEVICE) -> int:
    """Streaming multiprocessors: persistent programs, and what the auto rule fills (4 under the interpreter,
    so that the CPU lane's stream-K programs share tiles)."""
    return sm_count(device)


_scratch_buffers: dict[tuple, torch.Tensor] = {}
ZERO_KEPT = ("split_k tickets", "split_k sum", "stream_k flags")  # the `zeroed` buffers below
# Zero-kept buffers handed to a call that has not yet launched all its kernels (`_returned` takes them off).
_taken: set[tuple] = set()


def _scratch(device: torch.device, name: str, numel: int, dtype: torch.dtype, zeroed: bool = True):
    """A buffer of at least `numel` elements per device, stream and name, kept across calls. `zeroed`: zeros
    when allocated, and the kernels that use it leave it at zero (tickets, flags, the atomic sum), so later
    launches and CUDA-graph replays need no memset. Per stream, because kernels on two streams may run at
    once; one stream runs its launches one after the other.
    A call stopped between taking a zero-kept buffer and its last launch (Jupyter's "interrupt kernel", an
    exception; under the interpreter, in the middle of a kernel) can leave counts or sums in it: such a
    buffer is still marked taken, and the next call that takes it zeroes it first."""
    key = (device, _current_stream(device), name)
    buffer = _scratch_buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        allocate = torch.zeros if zeroed else torch.empty
        buffer = _scratch_buffers[key] = allocate(numel, device=device, dtype=dtype)
    elif zeroed and key in _taken:  # its last user never returned: whatever it left is not zero
        buffer.zero_()
    if zeroed:
        _taken.add(key)
    return buffer


def _returned(device: torch.device) -> None:
    """The call on this device and stream has launched all its kernels, and complete kernels leave the
    zero-kept buffers at zero: they are no longer taken."""
    stream = _current_stream(device)
    for name in ZERO_KEPT:
        _taken.discard((device, stream, name))


def _current_stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    index = torch.cuda.current_device() if device.index is None else device.index  # "cuda" alone: the current
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton's launcher asks, cheaply
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _stream_k_buffers(device: torch.device, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A partial-tile slot per program (the largest config's tile) and a flag per program. Flags start at 0
    and every launch leaves them at 0 (each finisher resets those it consumed)."""
    largest = max(c.kwargs["BLOCK_SIZE_M"] * c.kwargs["BLOCK_SIZE_N"] for c in STREAM_K_CONFIGS + CPU_CONFIGS)
    slots = _scratch(device, "stream_k slots", programs * largest, torch.float32, zeroed=False)
    return slots, _scratch(device, "stream_k flags", programs, torch.int32)


def _split_k_buffers(device: torch.device, mode: str, split: int, M: int, N: int):
    """(workspace, tickets) for a split-K launch: "ordered", split x M x N fp32 slots and a ticket per (tile,
    group of SUM_GROUP splits) and per tile, for the smallest tiles on offer (16 x 16); "atomic", one M x N
    fp32 sum kept at zero (twice: it takes no tickets)."""
    if mode == "atomic":
        total = _scratch(device, "split_k sum", M * N, torch.float32)
        return total, total
    tiles = triton.cdiv(M, 16) * triton.cdiv(N, 16)
    tickets = _scratch(device, "split_k tickets", tiles * (triton.cdiv(split, SUM_GROUP) + 1), torch.int32)
    return _scratch(device, "split_k partials", split * M * N, torch.float32, zeroed=False), tickets


def _span(t: torch.Tensor) -> int:
    """1 + the largest element offset a kernel reaches in t."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def _tiles(M: int, N: int, meta: dict) -> int:
    return triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"])


def _split_k_mode(split: int, deterministic: bool) -> str:
    """How split-K adds its partials: "direct" (one split: nothing to add), "ordered" (one launch, a fixed
    order: bitwise reproducible) when asked for or when the splits are few enough that the last program's
    sum is short, else "atomic" (fp32 atomics, then `_cast_and_zero_kernel`: a second launch, but no
    program reads more than its own partial)."""
    if split == 1:
        return "direct"
    return "ordered" if deterministic or split <= SUM_GROUP else "atomic"


def _run_split_k(a, b, c, precision, split, deterministic, big, autotuned) -> Launcher | None:
    """`_split_k_kernel` (and, for "atomic", the cast). Returns run(a, b, c) for the next calls with operands
    of the same shapes, strides and alignment (None after a call that tuned)."""
    (M, K), N = a.shape, b.shape[1]
    chunk = split_chunk(K, split)
    split = triton.cdiv(K, chunk)  # rounding the chunk up may leave fewer splits
    mode = _split_k_mode(split, deterministic)
    strides = (*a.stride(), *b.stride(), *c.stride())
    align = ch03.row_alignment(N, strides)
    options = {"INPUT_PRECISION": precision, "BIG": big, "ALIGN": align, "MODE": mode, "PTX": LANE == "gpu"}
    kind = "k_major" if autotuned is _k_major_tuned else "split_k"
    key = (kind, M, N, K, split, a.dtype, c.dtype, precision, big, mode)
    grid = lambda meta: (_tiles(M, N, meta), split)  # noqa: E731
    device = a.device
    if mode == "atomic" and key not in _tuned:  # tune "ordered": timed atomics would pile runs into the sum
        ordered_key = (*key[:-1], "ordered")
        ws, tickets = _split_k_buffers(device, "ordered", split, M, N)
        args = (a, b, c, ws, tickets, M, N, K, chunk, *strides)
        _launch(ordered_key, autotuned, _split_k_kernel, grid, args, options | {"MODE": "ordered"}, K)  # C
        _returned(device)
        tuned = _tuned[ordered_key]
        _tuned[key] = _Tuned(tuned.config, tuned.meta | {"MODE": "atomic"})  # one assignment: never half-set
        return None
    ws, tickets = (c, c) if mode == "direct" else _split_k_buffers(device, mode, split, M, N)
    args = (a, b, c, ws, tickets, M, N, K, chunk, *strides)
    launcher = _launch(key, autotuned, _split_k_kernel, grid, args, options, K)
    if mode == "atomic":
        block = 1024 if on_gpu() else 4096
        cast = launch_cache.launch(_cast_and_zero_kernel, (triton.cdiv(M * N, block),), (ws, c, M * N),
                                   {"BLOCK": block})  # read MN fp32, write MN and MN fp32  # fmt: skip
    _returned(device)
    if launcher is None:
        return None
    if mode == "direct":
        return lambda a, b, c: launcher(a, b, c, c, c)  # read MK + KN, write MN

    def run(a, b, c):  # read MK + KN, write split x MN fp32 and add them in L2 (ordered: one launch)
        ws, tickets = _split_k_buffers(device, mode, split, M, N)
        launcher(a, b, c, ws, tickets)
        if mode == "atomic":
            cast(ws, c)  # the sum to C, and back to zero
        _returned(device)

    return run


def _run_stream_k(a, b, c, precision, big) -> Launcher | None:
    """One launch of `_stream_k_kernel`; returns run(a, b, c) for the next calls of these shapes, strides
    and alignment (None after a call that tuned)."""
    (M, K), N = a.shape, b.shape[1]
    device, programs = a.device, num_sms(a.device)
    ws, flags = _stream_k_buffers(device, programs)
    strides = (*a.stride(), *b.stride(), *c.stride())
    args = (a, b, c, ws, flags, M, N, K, *strides)
    align = ch03.row_alignment(N, strides)
    options = {"INPUT_PRECISION": precision, "BIG": big, "NUM_PROGRAMS": programs, "ALIGN": align}
    key = ("stream_k", M, N, K, a.dtype, precision, big)
    grid = lambda meta: (min(programs, _tiles(M, N, meta) * triton.cdiv(K, meta["BLOCK_SIZE_K"])),)  # noqa: E731
    launcher = _launch(key, _stream_k_tuned, _stream_k_kernel, grid, args, options, K)
    _returned(device)
    if launcher is None:
        return None

    def run(a, b, c):  # read MK + KN, write MN
        launcher(a, b, c, *_stream_k_buffers(device, programs))
        _returned(device)

    return run


def _tma_fits(a: torch.Tensor, bt: torch.Tensor) -> bool:
    """TMA copies read rows that are contiguous, start 16-byte aligned and lie a multiple of 16 bytes apart,
    none overlapping the next (an expanded operand, row stride 0, has no descriptor); the TMA unit is
    Hopper's (compute capability 9.0) or later. The interpreter emulates it."""
    if on_gpu() and not ch03._has_tma():
        return False
    size = a.element_size()

    def rows_fit(t: torch.Tensor) -> bool:
        apart = t.stride(0) >= t.shape[1] and t.stride(0) * size % 16 == 0
        return t.stride(1) == 1 and apart and t.shape[1] * size >= 16

    return rows_fit(a) and rows_fit(bt) and a.data_ptr() % 16 == 0 and bt.data_ptr() % 16 == 0


def _run_k_major_tma(a, b, c, precision, big) -> None:
    """`_k_major_tma_kernel` on a and b's K-major view (b.t() is then row-major): read MK + KN, write MN."""
    (M, K), N = a.shape, b.shape[1]
    bt = b.t()
    programs = num_sms(a.device)
    args = (a, bt, c, M, N, K, a.stride(0), bt.stride(0), *c.stride())
    key = ("k_major_tma", M, N, K, a.dtype, c.dtype, precision, big)
    grid = lambda meta: (min(programs, _tiles(M, N, meta)),)  # noqa: E731
    tuned = _tuned.get(key)
    if tuned is not None:
        _k_major_tma_kernel[grid(tuned.meta)](*args, **tuned.meta)
        return
    options = {"INPUT_PRECISION": precision, "BIG": big, "NUM_PROGRAMS": programs}
    _k_major_tma_tuned[grid](*args, **options)
    best = _k_major_tma_tuned.best_config
    _tuned[key] = _Tuned(best, best.all_kwargs() | options)


# --- checks, choice, entry point ---------------------------------------------------------------------------


def _check(a, b, kernel, split_k, deterministic, allow_tf32) -> None:
    check_operands(a, b)
    if kernel not in KERNELS:
        raise ValueError(f"matmul: kernel must be one of {KERNELS}, got {kernel!r}")
    if split_k is not None:
        if not isinstance(split_k, int) or isinstance(split_k, bool) or split_k < 1:
            raise ValueError(f"matmul: split_k must be a positive int or None, got {split_k!r}")
        if kernel not in ("auto", "split_k"):
            raise ValueError(f"matmul: split_k applies to kernel='split_k', not kernel={kernel!r}")
    for name, flag in (("deterministic", deterministic), ("allow_tf32", allow_tf32)):
        if not isinstance(flag, bool):
            raise TypeError(f"matmul: {name} must be True or False, got {flag!r}")


def _is_k_major(b: torch.Tensor) -> bool:
    """b (K, N) has its K index contiguous (columns of b are rows in memory)."""
    return b.stride(0) == 1 and (b.shape[1] == 1 or b.stride(1) >= b.shape[0])


# Chapter 02's tiled transpose, one tile size: 128 x 64 fp32 with 8 warps was the autotuner's pick for a
# transposed 4096 x 4096 copy on the H200 (ch02_transpose.csv). One config: no tuning on the call's path.
TRANSPOSE_TILE = (128, 64, 8) if LANE == "gpu" else (64, 64, 4)


def _k_major(b: torch.Tensor) -> torch.Tensor:
    """b (K, N) as a view whose K index is contiguous: b itself if it already is, else a copy by chapter 02's
    tiled transpose (read KN, write KN): wgmma takes 32-bit operands from shared memory only K-major."""
    if _is_k_major(b):
        return b
    block_m, block_n, warps = TRANSPOSE_TILE
    return copy_2d_tiled(b.t(), block_m=block_m, block_n=block_n, num_warps=warps).t()


_auto_choices: dict[tuple, str] = {}


def _resolve(kernel: str, a, b, split_k, allow_tf32) -> str:
    """The kernel that runs: a name of KERNELS other than "auto"."""
    if kernel != "auto":
        return kernel
    if split_k is not None:
        return "split_k"
    (M, K), N = a.shape, b.shape[1]
    key = (M, N, K, a.dtype, allow_tf32)
    chosen = _auto_choices.get(key)
    if chosen is None:
        candidates = auto_candidates(M, N, K, num_sms(a.device), a.dtype, allow_tf32)
        chosen = (
            candidates[0]
            if len(candidates) == 1 or not on_gpu()
            else _time_candidates(candidates, a, b, allow_tf32)
        )
        _auto_choices[key] = chosen
    return chosen


def _time_candidates(candidates: list[str], a, b, allow_tf32) -> str:
    """Each candidate's full call (partials and sum included) timed once, after its own tuning, as CUDA-graph
    replays: GPU time only, so a kernel of several launches is not judged by its host cost."""
    medians = {}
    for name in candidates:
        call = functools.partial(_forward, a, b, name, None, False, allow_tf32)  # the default mode
        call()  # tunes
        medians[name] = graph_autotune_bench(call)[0]  # the median
    return min(medians, key=medians.get)


def _ch03_kernel(a, b, allow_tf32) -> str:
    precision = "tf32" if allow_tf32 else "ieee"
    return ch03.tuned_config(a, b, input_precision=precision)[0]


def _forward(a, b, kernel, split_k, deterministic, allow_tf32) -> torch.Tensor:
    return _planned(a, b, kernel, split_k, deterministic, allow_tf32)[0]


Plan = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _planned(a, b, kernel, split_k, deterministic, allow_tf32) -> tuple[torch.Tensor, Plan | None]:
    """C, and plan(a, b) -> C for the next calls with operands of the same shapes, strides, dtypes, device and
    alignment: the kernel chosen, the checks passed and the launch prepared (None: nothing to keep yet)."""
    (M, K), N = a.shape, b.shape[1]
    if M == 0 or N == 0 or K == 0:  # an empty sum is 0; nothing to launch
        return torch.zeros((M, N), device=a.device, dtype=a.dtype), None
    kernel = _resolve(kernel, a, b, split_k, allow_tf32)
    precision = "tf32" if allow_tf32 and a.dtype == torch.float32 else "ieee"
    if kernel == "ch03" or kernel in CH03_KERNELS:  # chapter 03 keeps its own prepared launches
        ch03_kernel = "auto" if kernel == "ch03" else kernel
        plan = functools.partial(ch03.matmul, input_precision=precision, kernel=ch03_kernel)
        return plan(a, b), plan
    if kernel == "wave_tail":  # chapter 03's tiles, and the leftover ones narrower, in one launch
        sms = num_sms(a.device)

        def plan(a, b):
            c = torch.empty((M, N), device=a.device, dtype=a.dtype)
            wave_tail._run(a, b, c, precision, sms)  # checked, c allocated just above; keeps its launcher
            return c

        return plan(a, b), plan
    copy_b = (precision == "tf32" or kernel == "k_major") and not _is_k_major(b)
    if copy_b:
        b = _k_major(b)
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    big = max(_span(a), _span(b), M * N) >= INT32_LIMIT
    if kernel == "stream_k":
        return c, _plan(_run_stream_k(a, b, c, precision, big), M, N, copy_b)
    if kernel == "k_major" and K_MAJOR_TMA and _tma_fits(a, b.t()):
        _run_k_major_tma(a, b, c, precision, big)
        # no checks, no choice: the launch
        options = {"kernel": kernel, "split_k": None, "deterministic": False, "allow_tf32": allow_tf32}
        return c, functools.partial(_forward, **options)
    split = 1 if kernel == "k_major" else (split_k or split_for(M, N, K, num_sms(a.device)))
    big = big or (split > 1 and split * M * N >= INT32_LIMIT)  # the partials' workspace
    autotuned = _k_major_tuned if kernel == "k_major" else _split_k_tuned
    return c, _plan(_run_split_k(a, b, c, precision, split, deterministic, big, autotuned), M, N, copy_b)


def _plan(run: Launcher | None, M: int, N: int, copy_b: bool) -> Plan | None:
    """plan(a, b): allocate C and launch with `run(a, b, c)`, B copied K-major first where the call did."""
    if run is None:
        return None

    def plan(a, b):
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        run(a, _k_major(b) if copy_b else b, c)
        return c

    return plan


# --- the registered op: autograd and torch.compile ---------------------------------------------------------


@torch.library.custom_op(
    "labkernels::ch04_matmul",
    mutates_args=(),
    schema="(Tensor a, Tensor b, str kernel='auto', int? split_k=None, bool deterministic=False, "
    "bool allow_tf32=False) -> Tensor",
)
def _matmul_op(a, b, kernel="auto", split_k=None, deterministic=False, allow_tf32=False):
    _check(a, b, kernel, split_k, deterministic, allow_tf32)
    return _forward(a, b, kernel, split_k, deterministic, allow_tf32)


@_matmul_op.register_fake
def _(a, b, kernel="auto", split_k=None, deterministic=False, allow_tf32=False):
    _check(a, b, kernel, split_k, deterministic, allow_tf32)
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b, _, _, deterministic, allow_tf32 = inputs
    ctx.options = {"deterministic": deterministic, "allow_tf32": allow_tf32}
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, grad_c):
    """dA = dC B^T, dB = A^T dC, by the registered op itself: under create_graph (second-order gradients)
    these products record their own backward, and when torch.compile traces the backward with fake tensors
    they take the op's fake (the public matmul's kept plans would launch on them: "Cannot access data
    pointer of Tensor", seen on the H200)."""
    a, b = ctx.saved_tensors
    op = torch.ops.labkernels.ch04_matmul
    deterministic, allow_tf32 = ctx.options["deterministic"], ctx.options["allow_tf32"]
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:  # read MN + KN, write MK
        grad_a = op(grad_c, b.t(), "auto", None, deterministic, allow_tf32)
    if ctx.needs_input_grad[1]:  # read MK + MN, write KN
        grad_b = op(a.t(), grad_c, "auto", None, deterministic, allow_tf32)
    return grad_a, grad_b, None, None, None, None


_matmul_op.register_autograd(_matmul_backward, setup_context=_setup_context)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    kernel: str = "auto",
    split_k: int | None = None,
    deterministic: bool = False,
    allow_tf32: bool = False,
) -> torch.Tensor:
    """a @ b for a (M, K) and b (K, N) of one dtype (float16, bfloat16, float32), any strides; the result is
    (M, N) in that dtype, accumulated in fp32.

    kernel: "tiled" and "tma_persistent" are chapter 03's; "split_k" (split = `split_k`, or `split_for`'s
    choice), "stream_k", "wave_tail" (the tiles past the full waves as narrower tiles, in the same
    launch) and "k_major" (B read K-major) are this chapter's; "auto" picks per shape
    (`auto_candidates`, then a one-time timing where several remain; `chosen_kernel` says which).
    deterministic: split-K always adds its partials in a fixed order (bitwise reproducible), in its one
    launch; by default it does so up to SUM_GROUP chunks and adds more with fp32 atomics and a cast (an
    order that varies). The other kernels are deterministic anyway. allow_tf32: fp32 inputs
    use TF32 tensor cores (10-bit mantissa products, ~1e-3 relative error). Inputs that require grad get a
    backward (dA = dC B^T, dB = A^T dC, by this same matmul, so second-order gradients too); the op is
    registered as `torch.ops.labkernels.ch04_matmul` and compiles with torch.compile. Later calls with
    operands of the same shapes, strides, dtypes and alignment skip the checks and the choice: they allocate
    C and launch."""
    if torch.compiler.is_compiling():  # the registered op: its fake gives torch.compile the output's shape
        return torch.ops.labkernels.ch04_matmul(a, b, kernel, split_k, deterministic, allow_tf32)
    wants_grad = False
    try:
        wants_grad = torch.is_grad_enabled() and (a.requires_grad or b.requires_grad)
        plan_key = None if wants_grad else _plan_key(a, b, kernel, split_k, deterministic, allow_tf32)
        known = _plans.get(plan_key)
    except Exception:  # not tensors, unhashable options, tensors without storage: the checks say so
        plan_key = known = None
    if known is not None:
        return known(a, b)  # checked and chosen on an earlier call with the same key
    _check(a, b, kernel, split_k, deterministic, allow_tf32)
    if wants_grad:  # the registered op, whose backward is this matmul again
        return torch.ops.labkernels.ch04_matmul(a, b, kernel, split_k, deterministic, allow_tf32)
    c, plan = _planned(a, b, kernel, split_k, deterministic, allow_tf32)
    if plan is not None and plan_key is not None:
        _plans[plan_key] = plan
    return c


# What a plain call would recompute, kept per key: the checks passed, the kernel chosen, the launch prepared
# (a thin launcher where `labkernels.launch_cache` can build one). Emptied when thin launches are switched.
_plans = launch_cache.KeyedLaunches()


def _plan_key(a, b, kernel, split_k, deterministic, allow_tf32) -> tuple:
    """Everything the checks, the kernel choice and Triton's specialization read from the arguments (types
    too: True == 1, but only True passes the checks)."""
    key = (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0)
    key += (b.shape, b.stride(), b.dtype, b.device, b.data_ptr() % 16 == 0)
    options = (kernel, split_k, deterministic, allow_tf32)
    return key + tuple(type(o) for o in options) + options


def chosen_kernel(a: torch.Tensor, b: torch.Tensor, *, allow_tf32: bool = False) -> str:
    """The kernel `matmul(a, b, kernel="auto", allow_tf32=...)` runs for this shape ("tiled",
    "tma_persistent", "split_k", "stream_k", "wave_tail" or "k_major"). Runs that matmul once (choosing, if
    first)."""
    _check(a, b, "auto", None, False, allow_tf32)
    matmul(a, b, allow_tf32=allow_tf32)
    (M, K), N = a.shape, b.shape[1]
    chosen = _auto_choices.get((M, N, K, a.dtype, allow_tf32), "tiled")
    return _ch03_kernel(a, b, allow_tf32) if chosen == "ch03" else chosen


def tuned_config(
    a: torch.Tensor, b: torch.Tensor, kernel: str, *, split_k: int | None = None
) -> triton.Config | None:
    """The autotuner's config that `matmul(a, b, kernel=kernel)` launches (after one such call), else None."""
    (M, K), N = a.shape, b.shape[1]
    if kernel in CH03_KERNELS or kernel == "wave_tail":  # wave_tail: chapter 03's tiled config, its big tiles
        return ch03.tuned_config(a, b, kernel="tiled" if kernel == "wave_tail" else kernel)[1]
    for key, tuned in _tuned.items():
        same_split = split_k is None or kernel != "split_k" or key[4] == split_k
        same_kernel = key[0] == kernel or (kernel == "k_major" and key[0] == "k_major_tma")
        if same_kernel and key[1:4] == (M, N, K) and same_split:
            return tuned.config
    return None
