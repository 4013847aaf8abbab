"""Tiled matmul with `tl.dot`: C = A @ B (+ bias, then an optional activation), fp32 accumulation.

Each program computes one BLOCK_SIZE_M x BLOCK_SIZE_N tile of C. It walks K in steps of BLOCK_SIZE_K,
loading a tile of A and a tile of B per step (masked at the ragged end of K) and accumulating their product
in fp32 registers; `tl.dot` maps to the tensor cores. A tile of A is reused BLOCK_SIZE_N times and a tile
of B BLOCK_SIZE_M times from on-chip memory: that reuse is what lifts matmul from memory-bound to
compute-bound. At best A and B are read once and C written once (`labkernels.traffic.matmul`); 2MNK FLOPs.

Grouped ordering: programs are numbered so that GROUP_SIZE_M consecutive programs share the same columns
of B and walk down a few rows of tiles, instead of sweeping a full row of tiles. Tiles loaded by one
program are then still in L2 when its neighbours need them.

Rows of A and columns of B past the matrix edge are wrapped (`% M`, `% N`) instead of masked: they read
valid memory, compute a few rows nobody stores, and keep the loads unmasked and fast; the store is masked.

The epilogue (bias add, ReLU or GELU) is applied to the fp32 accumulator before the single store, so a
linear layer's activation costs no extra HBM traffic (chapter 05 measures it).
fp32 inputs take `input_precision`: "ieee" (exact fp32 products, no tensor cores) or "tf32" (inputs rounded
to a 10-bit mantissa, tensor cores: several times faster, ~1e-3 relative error).

Two kernels compute the same tiles (`matmul(kernel=...)` picks one):
- "tiled": the kernel above, pointer arithmetic and masks; any strides, every dtype, both lanes.
- "tma_persistent" (Hopper and later, 16-bit operands whose rows are contiguous and 16-byte aligned): tiles
  move through the TMA unit (Hopper's tensor memory accelerator, an asynchronous copy unit in each SM),
  which takes a tensor descriptor (base, shape, strides, box; each program
  writes its own on the device) instead of a pointer per element, fills zeros past the edges and clips the
  store; and one program per SM loops over the tiles, so that the next tile's loads can overlap this tile's
  epilogue.
  "auto" (the default) times both on such a GPU, when the operands allow, and keeps the faster per shape.
  The Triton interpreter emulates the descriptors, so the CPU lane runs it too when asked by name.

Past 2^31 - 1 elements, `row * stride` wraps in int32: when an operand or C reaches that far, the tiled kernel
is compiled with INDEX_64 (int64 offsets; a constexpr, so the common case compiles without it). The TMA
descriptors take 64-bit strides already. The epilogue's ReLU is `where(acc < 0, 0, acc)`, which keeps NaN as
torch.relu does (compiled `tl.maximum` would turn NaN into 0). The op is registered with torch.library
(`labkernels::ch03_matmul`, with a fake and a backward, bias and activation included) for autograd and
torch.compile; a plain call launches directly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton.vector_add import BF16_ON_CPU, INT32_MAX
from labkernels.lane import DEVICE, LANE, on_gpu, require_device, sm_count
from labkernels.timing import graph_autotune_bench

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATIONS = (None, "relu", "gelu")
KERNELS = ("auto", "tiled", "tma_persistent")
SHARED_MEMORY_BYTES = 227 * 1024  # an H100/H200 program's shared-memory limit: larger configs are pruned


def _config(m: int, n: int, k: int, stages: int, warps: int, group: int = 8, **options) -> triton.Config:
    meta = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps, **options)


# Hopper configs, after Triton's matmul tutorial and an H200 sweep at 4096^3: big tiles for big squares
# (the `config` column of the ch03_matmul reference shows which one the autotuner picked per shape: 128x256x64
# for bf16, 256x128x32 for fp32, whose fp32 tiles fit shared memory at 4 stages), smaller ones so that skinny
# shapes still make enough tiles to fill 132 SMs.
GPU_CONFIGS = [
    _config(128, 256, 64, stages=4, warps=8),
    _config(128, 256, 64, stages=3, warps=8),
    _config(256, 128, 32, stages=4, warps=8),
    _config(256, 128, 64, stages=3, warps=8),
    _config(128, 128, 64, stages=4, warps=8),
    _config(128, 128, 64, stages=4, warps=4),
    _config(64, 256, 32, stages=4, warps=4),
    _config(128, 64, 64, stages=4, warps=4),
    _config(64, 128, 64, stages=4, warps=4),
    # 3 programs an SM: 0.76 of cuBLAS at 1536^3 in graph replays, where the autotuner picked one at 0.69
    _config(64, 128, 64, stages=3, warps=4),
]
# Under the interpreter a config costs per program: two big tiles, so autotuning is quick to watch.
CPU_CONFIGS = [
    _config(32, 32, 32, stages=1, warps=4, group=4),
    _config(64, 64, 32, stages=1, warps=4, group=4),
]


def reference(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """In fp64 (a higher-precision reference for the tests), returned in fp64."""
    c = a.double() @ b.double()  # read MK + KN, write MN
    if bias is not None:
        c = c + bias.double()
    if activation == "relu":
        c = torch.relu(c)
    elif activation == "gelu":
        c = torch.nn.functional.gelu(c)
    return c


def _prune_by_shared_memory(configs, named_args, c_staged: bool = False, **kwargs):
    """Drop configs whose pipelined tiles (stages x (BM*BK + BK*BN) elements, plus the BM*BN tile of C that a
    TMA store stages when `c_staged`) exceed shared memory."""
    element_size = named_args["a_ptr"].element_size()

    def shared_bytes(c):
        m, n, k = c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"]
        return (c.num_stages * (m * k + k * n) + c_staged * m * n) * element_size

    fits = [c for c in configs if shared_bytes(c) <= SHARED_MEMORY_BYTES]
    return fits or [min(configs, key=shared_bytes)]


def snug_tiles(configs: list, m: int, n: int) -> list:
    """Drop tiles taller than M or wider than N round up to (a power of two, or the least height or width on
    offer): such a tile runs the same grid as a snug one and only computes rows or columns that nobody
    stores. Rows first, then columns among the tiles left, so at least one config stays. Each config dropped
    is a compile saved on a new small shape."""
    m_cap = max(triton.next_power_of_2(m), min(c.kwargs["BLOCK_SIZE_M"] for c in configs))
    short = [c for c in configs if c.kwargs["BLOCK_SIZE_M"] <= m_cap]
    n_cap = max(triton.next_power_of_2(n), min(c.kwargs["BLOCK_SIZE_N"] for c in short))
    return [c for c in short if c.kwargs["BLOCK_SIZE_N"] <= n_cap]


# A config whose tiles keep fewer than this share of the SMs busy is not tuned when another fills them.
MIN_FILL = 0.6


def tile_count(config, m: int, n: int) -> int:
    """Programs a tiled launch of this config runs on an M x N output: one per tile of C."""
    return triton.cdiv(m, config.kwargs["BLOCK_SIZE_M"]) * triton.cdiv(n, config.kwargs["BLOCK_SIZE_N"])


def filling_tiles(configs: list, m: int, n: int, sms: int) -> list:
    """Drop tiles so big that they leave more than 40% of the SMs idle, when other tiles give every SM (or
    as many as any config can) work. At 1536^3 a 128 x 256 tile makes 72 programs for 132 SMs: with 45% of
    the machine idle no per-SM speed wins that back, yet one tuning on the H200 picked it (0.67 of cuBLAS,
    where another timing of the same configs picked one at 0.74: experiments/tuning_cost.py). Never empty."""
    reachable = min(sms, max(tile_count(c, m, n) for c in configs))
    return [c for c in configs if tile_count(c, m, n) >= MIN_FILL * reachable]


def _prune(configs, named_args, c_staged: bool = False, **kwargs):
    """The autotuners' pruning: tiles that fit shared memory, then only those snug to M and N, then only
    those that fill the GPU (where some do)."""
    fits = _prune_by_shared_memory(configs, named_args, c_staged=c_staged)
    m, n = named_args["M"], named_args["N"]
    return filling_tiles(snug_tiles(fits, m, n), m, n, sm_count())


@triton.jit
def _tile_coordinates(
    tile_id, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr
):
    """Grouped ordering: tile ids run down GROUP_SIZE_M rows of tiles before moving one column right."""
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)  # the last group may be short
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """Bias and activation on the fp32 accumulator, before the one store of C."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]  # read N
    if ACTIVATION == "relu":
        acc = tl.where(acc < 0, 0.0, acc)  # keeps NaN (compiled tl.maximum would not)
    elif ACTIVATION == "gelu_poly":  # GELU into a 16-bit C (`_kernel_activation` picks it)
        acc = _gelu_for_16_bit(acc)
    elif ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))  # exact (erf) GELU, as torch's default
    return acc


@triton.jit
def _gelu_for_16_bit(x):
    """GELU(x) = x * Phi(x), with Phi(-|x|) = erfc(|x| / sqrt 2) / 2 = 2^P(|x| / sqrt 2): P is a degree-12
    polynomial fit to log2(erfc(z) / 2) on [0, 10.5] (Chebyshev least squares, fp32 coefficients).

    Why not tl.erf: libdevice's erff picks one of two coefficient sets per element, two MOVs per coefficient.
    On the 128 x 256 x 64 tile (128 accumulator elements a thread) the erf GELU adds nearly twice this form's
    instructions an element and spills; this form spills nothing (reference/ch05_epilogue_sass.csv, sm_90).
    While an epilogue runs, its SM's tensor cores wait: one program fills an SM at that tile. This is 12
    FMAs with immediate coefficients and one exp2. Evaluated in fp32 the
    fit is within 8e-6 relative where |GELU(x)| > 1e-6, hundreds of times under a 16-bit output's rounding
    (a test holds every 16-bit output within one step of the correctly rounded GELU): for fp16/bf16 C, not
    for fp32. Past z = 10.5, 2^P underflows to 0: GELU(-inf) is NaN and GELU(-20) is -0, as with erf.
    What `activation="gelu"` runs for fp16/bf16 C: on the H200 at 4096^3 bf16 it took both kernels' 128 x 256
    x 64 tiles closer to the bias alone than tl.erf did (reference/ch05_epilogue_variants.csv)."""
    z = tl.minimum(tl.abs(x) * 0.7071067811865476, 10.5)
    p = -3.405799253730635e-11
    p = p * z + 2.0836234959631383e-09
    p = p * z - 5.312508477572919e-08
    p = p * z + 6.903465532559494e-07
    p = p * z - 3.6558269584929803e-06
    p = p * z - 2.425116690574214e-05
    p = p * z + 0.0006232181913219392
    p = p * z - 0.005895056761801243
    p = p * z + 0.03547580912709236
    p = p * z - 0.15431955456733704
    p = p * z - 0.9159795045852661
    p = p * z - 1.6283117532730103
    p = p * z - 0.9999887943267822
    phi_of_minus_abs = tl.exp2(p)  # Phi(-|x|), the lower tail, accurate relative to itself
    return x * tl.where(x >= 0, 1.0 - phi_of_minus_abs, phi_of_minus_abs)


@triton.jit
def _matmul_tiles(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # None, "relu" or "gelu"
    INPUT_PRECISION: tl.constexpr,  # fp32 inputs only: "ieee" or "tf32"
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_SIZE_K: no step is ragged, the loads need no mask
    INDEX_64: tl.constexpr,  # an operand or C reaches past 2^31 - 1 elements: int64 offsets
    ALIGN: tl.constexpr = 1,  # N and the row strides are multiples of this (`_alignment`)
):
    pid_m, pid_n = _tile_coordinates(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    matmul_tile(
        a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
        stride_cn, pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N, HAS_BIAS, ACTIVATION, INPUT_PRECISION,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K, INDEX_64, ALIGN,
    )  # fmt: skip


@triton.jit
def matmul_tile(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    first_row,  # the tile's first row and column of C (< M and < N: int32 is enough for them)
    first_col,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    INDEX_64: tl.constexpr,
    ALIGN: tl.constexpr,
):
    """One BLOCK_SIZE_M x BLOCK_SIZE_N tile of C = A B (+ epilogue), from (first_row, first_col): the body of
    `_matmul_tiles`, and of chapter 04's kernel that runs tiles of two widths in one launch."""
    if ALIGN > 1:  # x // ALIGN * ALIGN is x, and the compiler now knows it: loads become 16-byte copies
        N = N // ALIGN * ALIGN
        stride_am = stride_am // ALIGN * ALIGN
        stride_bk = stride_bk // ALIGN * ALIGN
        stride_cm = stride_cm // ALIGN * ALIGN
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    if INDEX_64:  # every offset below is then int64: row * stride cannot wrap
        first_row, first_col, offs_k = first_row.to(tl.int64), first_col.to(tl.int64), offs_k.to(tl.int64)

    offs_am = (first_row + tl.arange(0, BLOCK_SIZE_M)) % M  # wrapped: always valid rows
    offs_bn = (first_col + tl.arange(0, BLOCK_SIZE_N)) % N
    a_rows = a_ptr + offs_am[:, None] * stride_am  # (BM, 1)
    b_cols = b_ptr + offs_bn[None, :] * stride_bn  # (1, BN)
    a_ptrs = a_rows + offs_k[None, :] * stride_ak  # (BM, BK)
    b_ptrs = b_cols + offs_k[:, None] * stride_bk  # (BK, BN)

    # The full K-steps load unmasked: a mask that varies along a row (k < K) caps each load at one element,
    # as does a row stride not known to be 16 bytes (ALIGN). Held back by both, 3000 x 5000 x 1000 (rows of
    # 1000 and 5000 elements) took 13x the shipped matmul's time on the H200
    # (experiments/epilogue_variants.py).
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, K // BLOCK_SIZE_K):
        if INDEX_64:  # from the int64 column index: the int32 step BLOCK_SIZE_K * stride could wrap too
            k_offs = k * BLOCK_SIZE_K + offs_k
            a_ptrs = a_rows + k_offs[None, :] * stride_ak
            b_ptrs = b_cols + k_offs[:, None] * stride_bk
        a = tl.load(a_ptrs)  # read BM x BK
        b = tl.load(b_ptrs)  # read BK x BN
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        if not INDEX_64:
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
    if not EVEN_K:  # the ragged last step, once: masked lanes load 0 and add nothing
        k_offs = (K // BLOCK_SIZE_K) * BLOCK_SIZE_K + offs_k
        a = tl.load(a_rows + k_offs[None, :] * stride_ak, mask=k_offs[None, :] < K, other=0.0)
        b = tl.load(b_cols + k_offs[:, None] * stride_bk, mask=k_offs[:, None] < K, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    offs_cm = first_row + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = first_col + tl.arange(0, BLOCK_SIZE_N)
    c = _epilogue(acc, bias_ptr, offs_cn, N, HAS_BIAS, ACTIVATION).to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))  # write MN


@triton.jit
def _matmul_tma_persistent(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,  # rows are contiguous: only the row strides vary
    stride_bk,
    stride_cm,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr,  # one per SM
    # Triton's automatic warp specialization of the tile loop (a warp group issuing the TMA loads, others
    # the MMAs and the epilogue). No config turns it on: on the H200 it did not make the GELU epilogue at
    # 4096^3 reliably faster, and it made the 128x128 configs slower (experiments/epilogue_variants.py
    # --warp-specialize times it).
    WARP_SPECIALIZE: tl.constexpr = False,
):
    # Each descriptor is written once per program, on the device (into scratch from `_descriptor_scratch`),
    # which keeps the host's side of a launch as light as the tiled kernel's.
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_SIZE_K, BLOCK_SIZE_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_SIZE_M, BLOCK_SIZE_N])
    num_tiles = tl.cdiv(M, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N)
    # flatten=True lets the compiler pipeline across tiles: the next tile's first loads start during this
    # tile's epilogue and store.
    for tile_id in tl.range(
        tl.program_id(axis=0), num_tiles, NUM_PROGRAMS, flatten=True, warp_specialize=WARP_SPECIALIZE
    ):
        pid_m, pid_n = _tile_coordinates(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            # One TMA copy per tile; past M, N or K the TMA unit fills zeros, so no masks.
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])  # read BM x BK
            b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])  # read BK x BN
            acc = tl.dot(a, b, acc)
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c = _epilogue(acc, bias_ptr, offs_cn, N, HAS_BIAS, ACTIVATION).to(c_ptr.dtype.element_ty)
        c_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], c)  # write BM x BN, clipped at the edges


def _descriptor_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for the descriptors the TMA kernel writes (128 bytes each): Triton asks for it at every
    launch of a kernel that builds descriptors on the device."""
    return torch.empty(size, device=DEVICE, dtype=torch.int8)


triton.set_allocator(_descriptor_scratch)


def _even_k(args: dict) -> bool:
    return args["K"] % args["BLOCK_SIZE_K"] == 0


def row_alignment(n: int, strides: tuple) -> int:
    """The largest of 16, 8, 4, 2, 1 that divides N and the row strides of a, b and C, for operands whose
    rows are contiguous (`strides` = a's, b's and C's (row, column) strides, column strides 1); else 1.

    Triton marks an integer argument only when it is a multiple of 16, so rows of K = 1000 elements (2000
    bytes, 16-byte aligned) compile to one-element loads unless the kernel is told: 8 covers 16 bytes of
    a 16-bit dtype. N counts too: a tile of B's columns wraps at N (`% N`)."""
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn = strides
    if (stride_ak, stride_bn, stride_cn) != (1, 1, 1):
        return 1
    return next(m for m in (16, 8, 4, 2, 1) if all(x % m == 0 for x in (n, stride_am, stride_bk, stride_cm)))


def _alignment(args: dict) -> int:
    """`row_alignment` of a `_matmul_tiles` launch's named arguments (the autotuner's heuristic)."""
    names = ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
    return row_alignment(args["N"], tuple(args[name] for name in names))


# The autotuned kernels: each config timed on the first call of a key, the fastest kept per key.
_matmul_kernel = triton.autotune(
    configs=GPU_CONFIGS if LANE == "gpu" else CPU_CONFIGS,
    key=["M", "N", "K", "HAS_BIAS", "ACTIVATION", "INPUT_PRECISION", "INDEX_64"],  # triton adds dtypes
    prune_configs_by={"early_config_prune": _prune},
    do_bench=graph_autotune_bench,
)(triton.heuristics({"EVEN_K": _even_k, "ALIGN": _alignment})(_matmul_tiles))


def _tma_config(m: int, n: int, k: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    """A TMA kernel config: every constexpr the launcher does not pass is in it, warp specialization off (a
    launcher kept per key replays exactly these)."""
    config = _config(m, n, k, stages=stages, warps=warps, group=group)
    config.kwargs["WARP_SPECIALIZE"] = False
    return config


# The same tile shapes; a C tile is staged in shared memory for its TMA store, so 128x256x64 fits 3 stages.
TMA_CONFIGS = [
    _tma_config(*shape, stages=stages, warps=warps)
    for shape, stages, warps in [
        ((128, 256, 64), 3, 8),
        ((256, 128, 64), 3, 8),
        ((128, 128, 64), 4, 8),
        ((128, 128, 64), 4, 4),
        ((128, 64, 64), 4, 4),
        ((64, 128, 64), 4, 4),
    ]
]
CPU_TMA_CONFIGS = [_tma_config(32, 32, 32, stages=1, warps=4, group=4)]
_matmul_tma_kernel = triton.autotune(
    configs=TMA_CONFIGS if LANE == "gpu" else CPU_TMA_CONFIGS,
    key=["M", "N", "K", "HAS_BIAS", "ACTIVATION"],  # tensor dtypes are added by triton
    prune_configs_by={"early_config_prune": functools.partial(_prune, c_staged=True)},
    do_bench=graph_autotune_bench,
)(_matmul_tma_persistent)


# Per call, the autotuner rebuilds its key and three dicts of arguments before it launches: host time that a
# 1024^3 matmul, a few microseconds on an H200, cannot hide. So matmul() lets the autotuner choose once per
# key, keeps the winner here with its grid, and from then on launches the plain jitted kernel (through a
# cached launcher: `_launches` below).
class _Tuned(NamedTuple):
    config: triton.Config
    grid: tuple[int]
    meta: dict  # constexprs and launch options: the config's, the call's options, EVEN_K


_tuned_launches: dict[tuple, _Tuned] = {}


def check_operands(a, b) -> None:
    """The operand checks every matmul of the course makes (chapter 04's split-K and stream-K too): two 2-D
    tensors of one supported dtype, on one device of this lane, with matching inner dimensions."""
    require_device(a, "matmul: a")
    require_device(b, "matmul: b")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in DTYPES:
            raise TypeError(f"matmul: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dim() != 2:
            raise ValueError(f"matmul: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.device != b.device:
        raise ValueError(f"matmul: a is on {a.device} but b is on {b.device}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"matmul: {BF16_ON_CPU}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: inner dimensions differ, a is {tuple(a.shape)} and b is {tuple(b.shape)}")


def _check(a, b, bias, activation, input_precision, kernel) -> None:
    check_operands(a, b)
    if activation not in ACTIVATIONS:
        raise ValueError(f"matmul: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if input_precision not in ("ieee", "tf32"):
        raise ValueError(f"matmul: input_precision must be 'ieee' or 'tf32', got {input_precision!r}")
    if kernel not in KERNELS:
        raise ValueError(f"matmul: kernel must be one of {KERNELS}, got {kernel!r}")
    if bias is not None:
        require_device(bias, "matmul: bias")
        if bias.device != a.device or b.device != a.device:
            raise ValueError(f"matmul: bias is on {bias.device}, a on {a.device}")
        if bias.shape != (b.shape[1],):
            raise ValueError(f"matmul: bias must have shape ({b.shape[1]},), got {tuple(bias.shape)}")
        if bias.dtype not in DTYPES or (bias.dtype == torch.bfloat16 and not on_gpu()):
            raise TypeError(f"matmul: bias has unsupported dtype {bias.dtype}")


@functools.cache
def _has_tma() -> bool:
    """A GPU with the TMA unit (compute capability 9.0, Hopper, or later)."""
    return on_gpu() and torch.cuda.get_device_capability() >= (9, 0)


def _why_not_tma(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None if the TMA kernel can take a and b (and a contiguous C), else the reason it cannot."""
    if a.dtype not in (torch.float16, torch.bfloat16):
        return f"it takes float16 and bfloat16 operands, got {a.dtype}"
    if max(*a.shape, b.shape[1]) > INT32_MAX:
        return f"a descriptor's dimensions are int32, and a is {tuple(a.shape)}, b {tuple(b.shape)}"
    for name, t in (("a", a), ("b", b)):
        if t.stride(1) != 1:
            return f"{name}'s rows are not contiguous (strides {t.stride()})"
        if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
            return f"{name}'s rows overlap (strides {t.stride()}), as in an expanded tensor"
        if t.data_ptr() % 16:
            return f"{name} does not start on a 16-byte boundary"
    # A descriptor steps from row to row in multiples of 16 bytes.
    row_elements = {"a": a.stride(0), "b": b.stride(0), "C": b.shape[1]}
    for name, elements in row_elements.items():
        if elements * a.element_size() % 16:
            return f"{name}'s rows start {elements * a.element_size()} bytes apart, not a multiple of 16"
    return None


def _pick_kernel(kernel: str, a: torch.Tensor, b: torch.Tensor) -> str:
    """The kernel to run: "tiled", "tma_persistent", or "auto" when both can run and only timing can choose.
    The interpreter emulates TMA copies: kernel="tma_persistent" runs on the CPU lane (correct, not fast)."""
    if kernel == "tiled":
        return kernel
    why_not = _why_not_tma(a, b)
    if kernel == "tma_persistent" and why_not is None and on_gpu() and not _has_tma():
        why_not = f"this GPU ({torch.cuda.get_device_name()}) predates Hopper's TMA unit"
    if kernel == "tma_persistent" and why_not is not None:
        raise ValueError(f"matmul: kernel='tma_persistent' cannot run here: {why_not}")
    if kernel == "auto" and (why_not is not None or not _has_tma()):
        return "tiled"
    return kernel


# "auto" keeps the faster kernel per key. Neither wins everywhere: in the H200's ch03_matmul reference the
# persistent TMA kernel is ahead where each SM gets several tiles of C (4096^2, 8192^2) and behind where it
# gets about one or fewer (1024^2, 2048^2, 512 x 4096).
_auto_choices: dict[tuple, str] = {}


def _choose(a, b, c, bias, options: dict, shape_key: tuple) -> str:
    """Tune both kernels for this key, time each one's winner, keep the faster. On the GPU the two are timed
    in CUDA-graph replays, GPU time only: timed with L2 cleared before each run (the autotuner's way), the
    pick for 1024^3 changed between processes on the H200, to a kernel a third slower in graph replays."""
    medians = {}
    bias_or_c = c if bias is None else bias
    for kernel in ("tiled", "tma_persistent"):
        key = (kernel, *shape_key)
        launcher = _launch(kernel, a, b, c, bias, options, key)  # tunes, the first time
        launcher = launcher or _launch(kernel, a, b, c, bias, options, key)  # as later calls will launch
        call = functools.partial(launcher, a, b, c, bias_or_c)
        medians[kernel] = graph_autotune_bench(call)[0]  # the median; CUDA-graph replays on the GPU lane
    _auto_choices[shape_key] = min(medians, key=medians.get)
    return _auto_choices[shape_key]


@functools.cache
def _programs(device: torch.device) -> int:
    """Persistent programs: one per SM (a few under the interpreter, so that each loops over tiles)."""
    return sm_count(device)


def _launch(kernel: str, a, b, c, bias, options: dict, key: tuple):
    """Launch `kernel` with the autotuner's winner for this key; the first call of a key tunes. Returns a
    launcher(a, b, c, bias_or_c) for the next calls of the key, or None after tuning."""
    (M, K), N = a.shape, b.shape[1]
    bias_or_c = c if bias is None else bias  # a valid pointer either way; read only if HAS_BIAS
    if kernel == "tiled":
        args = (a, b, c, bias_or_c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    else:
        args = (a, b, c, bias_or_c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    tuned = _tuned_launches.get(key)
    if tuned is not None:  # tuned already: the plain jitted kernel, with the winner's constexprs
        if kernel == "tiled":  # per call: the key holds the sizes, not the strides
            meta = tuned.meta | {"ALIGN": row_alignment(args[5], args[7:13])}
            return launch_cache.launch(_matmul_tiles, tuned.grid, args, meta)  # read MK + KN, write MN
        return launch_cache.launch(_matmul_tma_persistent, tuned.grid, args, tuned.meta)  # the same bytes
    _tune(kernel, args, options, key)
    return None


def _tune(kernel: str, args: tuple, options: dict, key: tuple) -> None:
    """The first call of a key: the autotuner times every config and launches the best, which is kept."""
    M, N, K = args[4:7]
    autotuned, programs = _matmul_kernel, None
    if kernel == "tma_persistent":
        autotuned, programs = _matmul_tma_kernel, _programs(args[0].device)
        options = {
            "HAS_BIAS": options["HAS_BIAS"],
            "ACTIVATION": options["ACTIVATION"],
            "NUM_PROGRAMS": programs,
        }

    def grid(meta):
        tiles = triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"])
        return (tiles if programs is None else min(programs, tiles),)

    autotuned[grid](*args, **options)
    meta = autotuned.best_config.all_kwargs() | options
    if kernel == "tiled":
        meta["EVEN_K"] = _even_k({"K": K, **meta})
        meta["ALIGN"] = row_alignment(args[5], args[7:13])
    _tuned_launches[key] = _Tuned(autotuned.best_config, grid(meta), meta)


def needs_int64(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when the tiled kernel's int32 offsets would wrap: an element of a, b or C lies past 2^31 - 1
    (through its strides), or a step of BLOCK_SIZE_K (at most 256) rows of b or columns of a is that far.
    Shapes and strides only: meta tensors work."""
    (M, K), N = a.shape, b.shape[1]
    (sam, sak), (sbk, sbn) = a.stride(), b.stride()
    return (
        (M - 1) * sam + (K + 256) * sak > INT32_MAX
        or (K + 256) * sbk + (N - 1) * sbn > INT32_MAX
        or M * N > INT32_MAX
    )


def _empty_product(a, b, bias, activation) -> torch.Tensor:
    """C when M, N or K is 0: nothing to launch. K = 0 sums nothing: zeros, then bias and activation."""
    M, N = a.shape[0], b.shape[1]
    c = torch.zeros((M, N), device=a.device, dtype=torch.float32)
    if bias is not None:
        c += bias.float()
    if activation == "relu":
        c = torch.relu(c)
    elif activation == "gelu":
        c = torch.nn.functional.gelu(c)
    return c.to(a.dtype)


# What each plain call would recompute, kept per key: the checks passed, the kernel chosen, the tuned launch
# and its launcher (`labkernels.launch_cache`: a thin one that calls the compiled kernel directly).
class _Known(NamedTuple):
    key: tuple  # the _tuned_launches key
    shape: tuple[int, int]  # C's
    contiguous_bias: bool  # bias must be copied to a contiguous one first
    launcher: object  # launcher(a, b, c, bias_or_c)


_launches = launch_cache.KeyedLaunches()


def _launch_key(a, b, bias, activation, input_precision, kernel) -> tuple:
    """Everything the checks, the kernel choice and Triton's specialization read from the arguments."""
    key = (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0)
    key += (b.shape, b.stride(), b.dtype, b.device, b.data_ptr() % 16 == 0)
    if bias is not None:
        key += (bias.shape, bias.stride(), bias.dtype, bias.device, bias.data_ptr() % 16 == 0)
    return (*key, type(activation), activation, type(input_precision), input_precision, type(kernel), kernel)


def _kernel_activation(activation: str | None, c_dtype: torch.dtype) -> str | None:
    """The epilogue the kernels compile: GELU into a 16-bit C takes the polynomial (`_gelu_for_16_bit`), which
    rounds as tl.erf's form does and was faster on the H200 (reference/ch05_epilogue_variants.csv); fp32 C
    keeps erf."""
    if activation == "gelu" and c_dtype in (torch.float16, torch.bfloat16):
        return "gelu_poly"
    return activation


def _matmul(a, b, bias, activation, input_precision, kernel) -> tuple[torch.Tensor, tuple | None]:
    """C, and the key its launch is kept under (None when nothing was launched). Known keys only allocate
    and launch."""
    try:
        fast_key = _launch_key(a, b, bias, activation, input_precision, kernel)
        known = _launches.get(fast_key)
    except Exception:  # not tensors, unhashable options, tensors without storage: the checks say so
        fast_key = known = None
    if known is not None:
        c = a.new_empty(known.shape)  # a's dtype and device, without parsing them
        bias_or_c = c if bias is None else bias if known.contiguous_bias else bias.contiguous()
        known.launcher(a, b, c, bias_or_c)  # read MK + KN at best, write MN
        return c, known.key
    _check(a, b, bias, activation, input_precision, kernel)
    if a.numel() == 0 or b.numel() == 0:
        return _empty_product(a, b, bias, activation), None
    kernel = _pick_kernel(kernel, a, b)
    (M, K), N = a.shape, b.shape[1]
    contiguous_bias = bias is None or bias.is_contiguous()
    bias = bias.contiguous() if bias is not None else None  # N elements: a negligible copy if strided
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    precision = input_precision if a.dtype == torch.float32 else "tf32"  # ignored for 16-bit inputs
    options = {
        "HAS_BIAS": bias is not None,
        "ACTIVATION": _kernel_activation(activation, c.dtype),
        "INPUT_PRECISION": precision,
        "INDEX_64": needs_int64(a, b),
    }
    out_dtype = c.dtype if bias is None else bias.dtype
    shape_key = (M, N, K, a.dtype, out_dtype, *options.values())  # what the autotuners key on, and more
    if kernel == "auto":
        kernel = _auto_choices.get(shape_key) or _choose(a, b, c, bias, options, shape_key)
    key = (kernel, *shape_key)
    launcher = _launch(kernel, a, b, c, bias, options, key)
    if launcher is not None and fast_key is not None:
        _launches[fast_key] = _Known(key, (M, N), contiguous_bias, launcher)
    return c, key


# --- the registered op: autograd and torch.compile ---------------------------------------------------------


@torch.library.custom_op(
    "labkernels::ch03_matmul",
    mutates_args=(),
    schema="(Tensor a, Tensor b, Tensor? bias=None, str? activation=None, str input_precision='ieee', "
    "str kernel='auto') -> Tensor",
)
def _matmul_op(a, b, bias=None, activation=None, input_precision="ieee", kernel="auto"):
    return _matmul(a, b, bias, activation, input_precision, kernel)[0]


@_matmul_op.register_fake
def _(a, b, bias=None, activation=None, input_precision="ieee", kernel="auto"):
    _check(a, b, bias, activation, input_precision, kernel)
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b, bias, activation, _, _ = inputs
    ctx.activation = activation
    ctx.save_for_backward(a, b, bias, output)


def _matmul_backward(ctx, grad):
    """C = act(Z), Z = A @ B + bias: dZ = grad * act'(Z), dA = dZ @ B^T, dB = A^T @ dZ, dbias = rows' sum."""
    a, b, bias, c = ctx.saved_tensors
    if ctx.activation == "relu":
        dz = torch.ops.aten.threshold_backward(grad, c, 0)  # torch.relu's: passes where C > 0
    elif ctx.activation == "gelu":  # GELU' needs Z, which was never stored: recompute it (fp32)
        z = a.float() @ b.float() if bias is None else torch.addmm(bias.float(), a.float(), b.float())
        dz = torch.ops.aten.gelu_backward(grad.float(), z).to(grad.dtype)
    else:
        dz = grad
    da = dz @ b.mT if ctx.needs_input_grad[0] else None
    db = a.mT @ dz if ctx.needs_input_grad[1] else None
    dbias = None
    if bias is not None and ctx.needs_input_grad[2]:
        dbias = dz.sum(0, dtype=torch.float32).to(bias.dtype)
    return da, db, dbias, None, None, None


_matmul_op.register_autograd(_matmul_backward, setup_context=_setup_context)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    input_precision: str = "ieee",
    kernel: str = "auto",
) -> torch.Tensor:
    """activation(a @ b + bias) for a (M, K) and b (K, N) of one dtype; any strides. Result: (M, N) in a's
    dtype, accumulated in fp32. `input_precision` ("ieee" or "tf32") applies to float32 inputs.

    kernel: "tiled", "tma_persistent" (16-bit operands with contiguous, 16-byte-aligned rows; emulated on the
    CPU lane) or "auto": on a Hopper or later GPU, when the operands allow both, the faster of the two for
    this shape, timed on the first call; else "tiled". The first call for a shape and dtype autotunes
    (`tuned_config` shows the winner). Differentiable (a, b and bias); compiles with torch.compile."""
    try:
        wants_grad = (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)) and (
            torch.is_grad_enabled()
        )
    except AttributeError:  # not tensors: the checks say so
        wants_grad = False
    if wants_grad or torch.compiler.is_compiling():
        return torch.ops.labkernels.ch03_matmul(a, b, bias, activation, input_precision, kernel)
    return _matmul(a, b, bias, activation, input_precision, kernel)[0]


def tuned_config(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    input_precision: str = "ieee",
    kernel: str = "auto",
) -> tuple[str, triton.Config]:
    """(kernel, config) that `matmul(same arguments)` launches. Runs that matmul once: it autotunes first if
    this key has not been seen."""
    key = _matmul(a, b, bias, activation, input_precision, kernel)[1]
    if key is None:
        raise ValueError(
            f"matmul: an operand is empty (a {tuple(a.shape)}, b {tuple(b.shape)}): nothing tuned"
        )
    return key[0], _tuned_launches[key].config
