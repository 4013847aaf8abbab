"""4-bit weights: a GEMV (M <= 16 rows) that reads W at half a byte an element and unpacks it in registers.

Decoding multiplies a few rows of activations by every weight matrix of the model, so the weights are nearly
all the bytes: a 16-bit W costs 2KN bytes, 4 bits cost KN/2, and the matmul should take a quarter of the time.
Layout (group-wise, symmetric): W (N, K) as nn.Linear stores it, cut along K into groups of GROUP = 128; each
group has one scale s (in a's dtype) and integers q in 0..15 with W ≈ (q - 8) s. Two q share a byte:
`packed[n, j] = q[n, 2j] | q[n, 2j + 1] << 4`, so packed is (N, K/2) uint8 and scales (N, K/GROUP).

The kernel reads the packed bytes as 32-bit words (eight weights a word) one group of a tile of columns at a
time and turns each nibble into the float q - 8 with bit operations (`_unpack`: no integer-to-float
conversion). With up to FMA_MAX_M rows it multiplies on the CUDA cores and sums the group; with more it builds
the group's (BLOCK_N, GROUP) tile and calls tl.dot. Either way the scale is applied once per group and column,
not per weight. Traffic: read MK + KN/2 + 2KN/GROUP, write MN (`traffic`). With few column tiles the K range
is split over programs (split-K) whose fp32 partial sums a second kernel adds.

One row (M = 1, a decode step at batch 1) has its own kernel, `_int4_row_kernel`: at one row a GEMV does two
FLOPs a weight, so what limits it is how many bytes are in flight, not arithmetic. Each program keeps the next
two groups' words loading while it converts the current one, takes a tile of up to 128 columns so each x value
is loaded and converted once for all of them, and turns a nibble into a float with one mask-and-or
(`_nibble_plus_offset`); the constant that leaves is subtracted once a word, not once a weight.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels import traffic as traffic_mod
from labkernels.hostmath import cdiv, next_power_of_2
from labkernels.lane import LANE, on_gpu, require_device, sm_count

GROUP = 128
MAX_M = 16
GPU_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.float32)
PROGRAMS_PER_SM = 2  # the split-K model: enough programs to keep every SM reading
FMA_MAX_M = 4  # up to this many rows, fmas on the CUDA cores; above, tl.dot on the tensor cores
BLOCK_N, NUM_WARPS, NUM_STAGES = (64, 4, 4) if LANE == "gpu" else (32, 4, 1)
# The one-row kernel: wide tiles for few columns, narrow ones with fewer warps for many, so each SM holds
# several programs (H200, K = 4096: 128 columns and 4 warps at N = 4096, 64 and 2 at N = 14336 were fastest).
ROW_PROGRAMS_PER_SM = 6
ROW_WIDE_BELOW_N = 8192  # N below this: (128 columns, 4 warps) a program; from it: (64, 2)


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed (N, K/2) uint8, scales (N, K/GROUP) in w's dtype) with w ≈ (q - 8) * scale, per group of 128
    along K; q = round(w / s) + 8 clamped to 0..15, s = max|w| / 7 of the group."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"quantize_int4: K = {k} must be a multiple of the group size {GROUP}")
    groups = w.float().view(n, k // GROUP, GROUP)
    scale = (groups.abs().amax(dim=-1, keepdim=True) / 7).clamp(min=1e-8)
    q = (torch.round(groups / scale) + 8).clamp(0, 15).to(torch.uint8).view(n, k)
    return pack_int4(q), scale.squeeze(-1).to(w.dtype)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) uint8 in 0..15 -> (N, K/2) uint8, the even k in the low nibble."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K/2) uint8 -> q (N, K) uint8 in 0..15."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).view(packed.shape[0], -1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """W (N, K) in the scales' dtype: (q - 8) * s."""
    q = unpack_int4(packed).float() - 8
    w = q.view(q.shape[0], -1, GROUP) * scales.float()[:, :, None]
    return w.view(q.shape).to(scales.dtype)


def reference(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """a @ W^T in fp64, W unpacked and scaled in fp64."""
    q = unpack_int4(packed).double() - 8
    w = (q.view(q.shape[0], -1, GROUP) * scales.double()[:, :, None]).view(q.shape)
    return a.double() @ w.T


def traffic(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> traffic_mod.Traffic:
    """Read MK + N K/GROUP scales (dtype) and KN/2 bytes of weights, write MN; 2MNK FLOPs."""
    e = traffic_mod.element_size(dtype)
    return traffic_mod.Traffic(
        "int4_matmul", (m * k + n * (k // GROUP) + m * n) * e + k * n // 2, 2 * m * n * k
    )


def split_k(m: int, n: int, k: int, block_n: int = BLOCK_N, sms: int | None = None) -> int:
    """How many K ranges (whole groups each) the columns are cut into: one while the column tiles alone give
    PROGRAMS_PER_SM programs an SM, more until they do, at most one group a range."""
    sms = sm_count() if sms is None else sms
    tiles = cdiv(n, block_n)
    return max(1, min(cdiv(PROGRAMS_PER_SM * sms, tiles), k // GROUP))


def row_config(n: int, k: int, sms: int | None = None) -> dict:
    """The one-row kernel's (block_n, num_warps, splits): the K range cut into about enough splits for
    ROW_PROGRAMS_PER_SM programs an SM (fewer column tiles, more splits), each split whole groups."""
    sms = sm_count() if sms is None else sms
    block_n, warps = (128, 4) if n < ROW_WIDE_BELOW_N else (64, 2)
    wanted = cdiv(ROW_PROGRAMS_PER_SM * sms, cdiv(n, block_n))
    return {"block_n": block_n, "num_warps": warps, "splits": _splits_of(k // GROUP, wanted)[1]}


@triton.jit
def _unpack(words, i: tl.constexpr):
    """Nibble i of each 32-bit word as fp32 q - 8, without an integer-to-float conversion (a quarter-rate
    instruction): 0x4B000000 is the float 2^23, whose last mantissa bits are the integers, so OR-ing q into it
    gives 2^23 + q exactly, and subtracting 2^23 + 8 leaves q - 8. Two integer ops and one float add."""
    bits = ((words >> (4 * i)) & 0xF) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388616.0


@triton.jit
def _int4_gemv_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr,  # a (M, K); w (N, K/8) int32; s (N, K/GROUP); out (M, N) or (splits, M, N)
    M, N, K, stride_am, stride_wn, stride_sn, stride_om, groups_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, GROUP // 8)  # the 32-bit words of one group: word c holds k = 8c ... 8c + 7
    m_ok = offs_m < M
    n_ok = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_c[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first = pid_k * groups_per_split
    last = tl.minimum(first + groups_per_split, K // GROUP)
    for group in range(first, last):
        words = tl.load(
            w_rows + group * (GROUP // 8), mask=n_ok[:, None], other=0
        )  # read BLOCK_N x GROUP/2 B
        scale = tl.load(s_ptr + offs_n * stride_sn + group, mask=n_ok, other=0.0).to(tl.float32)  # read N
        if DOT:  # many rows: the (BLOCK_N, GROUP) tile of q - 8 in a's dtype, then one tl.dot
            n0, n1, n2, n3 = _unpack(words, 0), _unpack(words, 1), _unpack(words, 2), _unpack(words, 3)
            n4, n5, n6, n7 = _unpack(words, 4), _unpack(words, 5), _unpack(words, 6), _unpack(words, 7)
            # tl.join adds a last dimension, so the outermost join picks the lowest bit of i: evens, then odds
            evens = tl.join(tl.join(n0, n4), tl.join(n2, n6))
            tile = tl.join(evens, tl.join(tl.join(n1, n5), tl.join(n3, n7)))
            tile = tl.reshape(tile, (BLOCK_N, GROUP)).to(a_ptr.dtype.element_ty)  # k = 8c + i in order
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + group * GROUP + tl.arange(0, GROUP)[None, :],
                        mask=m_ok[:, None], other=0.0)  # fmt: skip
            acc += tl.trans(tl.dot(tile, tl.trans(a))) * scale[None, :]
        else:  # one to four rows: fma per weight and row, the group's sum scaled once per column
            part = tl.zeros([BLOCK_M, BLOCK_N, GROUP // 8], dtype=tl.float32)
            for i in tl.static_range(8):
                a_i = tl.load(a_ptr + offs_m[:, None] * stride_am + group * GROUP + 8 * offs_c[None, :] + i,
                              mask=m_ok[:, None], other=0.0).to(tl.float32)  # fmt: skip
                part += a_i[:, None, :] * _unpack(words, i)[None, :, :]
            acc += tl.sum(part, 2) * scale[None, :]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT:  # fp32 partial sums, one (M, N) slice a K range
        slot = out_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(slot, acc, mask=mask)
    else:
        out = acc.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], out, mask=mask)


@triton.jit
def _nibble_plus_offset(words, i: tl.constexpr, f128, f2048):
    """Nibble i of 32-bit words as the float 128 + q or 2048 + q, with one mask-and-or (a single LOP3): put at
    mantissa bits 16-19 of the float 128.0 (0x43000000) a nibble reads as 128 + q exactly, at bits 12-15 of
    2048.0 (0x45000000) as 2048 + q. Nibbles 3 and 4 already sit there; one shift a pair brings the others.
    f128 and f2048 are those floats' bits as kernel arguments: in a register, ptxas folds the and-or into one
    LOP3 (two, with both operands immediate)."""
    if i == 0 or i == 1:
        t = words << 12
    elif i == 2:
        t = words << 4
    elif i == 3 or i == 4:
        t = words
    elif i == 5:
        t = words >> 4
    else:
        t = words >> 12
    if i == 1 or i == 4 or i == 5 or i == 7:
        bits = (t & 0x000F0000) | f128
    else:
        bits = (t & 0x0000F000) | f2048
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _nibble_offset(i: tl.constexpr):
    """What `_nibble_plus_offset`'s float holds beyond q - 8: 128 + 8 or 2048 + 8."""
    if i == 1 or i == 4 or i == 5 or i == 7:
        return 136.0
    else:
        return 2056.0


@triton.jit
def _int4_row_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr,  # a (1, K); w (N, K/8) int32; s (N, K/GROUP); out (N) or (splits, N) fp32
    N, K, stride_wn, stride_sn, groups_per_split, f128, f2048,
    BLOCK_N: tl.constexpr, GROUP: tl.constexpr, SPLIT: tl.constexpr, EXACT: tl.constexpr,
):  # fmt: skip
    WORDS: tl.constexpr = GROUP // 8  # a group's weights, eight 4-bit weights a 32-bit word
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, WORDS)
    n_ok = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_c[None, :]
    first = tl.program_id(1) * groups_per_split
    last = tl.minimum(first + groups_per_split, K // GROUP)
    # Two groups' words in flight before the loop, a third issued at the top of each step: one step's
    # loads are never waited on by the step that issues them.
    words = tl.load(w_rows + first * WORDS, mask=n_ok[:, None], other=0)
    following = tl.load(w_rows + (first + 1) * WORDS, mask=n_ok[:, None] & (first + 1 < last), other=0)
    acc = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
    for group in range(first, last):
        after = tl.load(
            w_rows + (group + 2) * WORDS, mask=n_ok[:, None] & (group + 2 < last), other=0
        )  # read BLOCK_N x GROUP/2 B, used two steps later
        part = tl.zeros([BLOCK_N, WORDS], dtype=tl.float32)
        offset = tl.zeros([WORDS], dtype=tl.float32)  # sum of x (c + 8) over each word's k: for every column
        for i in tl.static_range(8):
            x_i = tl.load(a_ptr + group * GROUP + 8 * offs_c + i).to(tl.float32)  # read 16, for all columns
            if EXACT:  # fp32 inputs: q - 8 exactly, one float add a weight
                part += (_nibble_plus_offset(words, i, f128, f2048) - _nibble_offset(i)) * x_i[None, :]
            else:  # 16-bit inputs: the offset once a word; the subtraction costs ~2^-16 of the word's sum
                part += _nibble_plus_offset(words, i, f128, f2048) * x_i[None, :]
                offset += x_i * _nibble_offset(i)
        scale = tl.load(s_ptr + offs_n * stride_sn + group, mask=n_ok, other=0.0).to(tl.float32)  # read N
        acc += (part - offset[None, :]) * scale[:, None]
        words = following
        following = after
    total = tl.sum(acc, axis=1)
    if SPLIT:
        tl.store(out_ptr + tl.program_id(1).to(tl.int64) * N + offs_n, total, mask=n_ok)
    else:
        tl.store(out_ptr + offs_n, total.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _sum_splits_kernel(
    part_ptr, out_ptr, n_elements, N, stride_om, SPLITS: tl.constexpr, BLOCK: tl.constexpr
):
    """out = sum over the splits of the fp32 partials (splits, M, N), rounded to out's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLITS):
        total += tl.load(part_ptr + s * n_elements + offs, mask=mask, other=0.0)  # read splits x MN
    tl.store(out_ptr + (offs // N) * stride_om + offs % N, total.to(out_ptr.dtype.element_ty), mask=mask)


def _check(a, packed, scales) -> None:
    name = "int4_matmul"
    dtypes = GPU_DTYPES if on_gpu() else CPU_DTYPES
    for label, t in (("a", a), ("packed", packed), ("scales", scales)):
        require_device(t, f"{name}: {label}")
        if t.dim() != 2:
            raise ValueError(f"{name}: {label} must be 2-D, got shape {tuple(t.shape)}")
    if a.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name}: a has dtype {a.dtype}; this lane supports {names}")
    if packed.dtype != torch.uint8:
        raise TypeError(f"{name}: packed must be torch.uint8 (two 4-bit weights a byte), got {packed.dtype}")
    if scales.dtype != a.dtype:
        raise TypeError(f"{name}: scales are {scales.dtype} but a is {a.dtype}; pass one dtype")
    m, k = a.shape
    n = packed.shape[0]
    if not 1 <= m <= MAX_M:
        raise ValueError(f"{name}: a has {m} rows; this GEMV kernel takes 1 to {MAX_M}")
    if k % GROUP or packed.shape[1] * 2 != k:
        raise ValueError(
            f"{name}: a is (M, {k}) and packed {tuple(packed.shape)}: K must be a multiple of {GROUP} and "
            "packed must be (N, K/2)"
        )
    if scales.shape != (n, k // GROUP):
        raise ValueError(f"{name}: scales must be ({n}, {k // GROUP}), got {tuple(scales.shape)}")
    if a.stride(1) != 1 or packed.stride(1) != 1 or scales.stride(1) != 1:
        raise ValueError(f"{name}: a, packed and scales need contiguous rows")
    reach = max((m - 1) * a.stride(0) + k - 1, m * n - 1, (n - 1) * scales.stride(0) + k // GROUP - 1)
    if reach >= 2**31:  # the words' offsets are 64-bit; these are not
        raise ValueError(
            f"{name}: a {tuple(a.shape)}, the scales {tuple(scales.shape)} or the {m} x {n} output reach "
            "past 2^31 - 1 elements, and the kernel indexes them with 32-bit offsets"
        )
    if torch.is_grad_enabled() and (a.requires_grad or scales.requires_grad):
        raise RuntimeError(
            f"{name}: inputs require grad; the 4-bit GEMV is inference only (use torch.no_grad())"
        )


def _forward(
    a, packed, scales, splits=None, block_n=None, num_warps=None, num_stages=None, dot=None, row=None
):
    (m, k), n = a.shape, packed.shape[0]
    if packed.data_ptr() % 4 or packed.stride(0) % 4:  # here, not in _check: a traced tensor has no address
        raise ValueError(
            "int4_matmul: packed is read as 32-bit words: its start and row stride must be multiples of 4"
        )
    if row is None:
        row = m == 1 and not dot
    if row:
        if m != 1:
            raise ValueError(f"int4_matmul: row=True is the one-row kernel, and a has {m} rows")
        if num_stages is not None:
            raise ValueError(
                "int4_matmul: the one-row kernel loads two groups ahead by hand and takes no num_stages; "
                "pass row=False to run the many-row kernel with it"
            )
        config = row_config(n, k) | {
            key: value for key, value in (("splits", splits), ("block_n", block_n), ("num_warps", num_warps))
            if value is not None
        }  # fmt: skip
        return _forward_row(a, packed, scales, **config)
    block_n = block_n or BLOCK_N
    dot = m > FMA_MAX_M if dot is None else dot
    block_m = 16 if dot else next_power_of_2(m)  # tl.dot's minimum is 16 rows
    out = _output((m, n), a, a.dtype)
    groups_per_split, splits = _splits_of(k // GROUP, split_k(m, n, k, block_n) if splits is None else splits)
    target = _output((splits, m, n), a, torch.float32) if splits > 1 else out
    words = packed.view(torch.int32)  # (N, K/8): eight 4-bit weights a word, k = 8c + i in nibble i
    _int4_gemv_kernel[(cdiv(n, block_n), splits)](
        a, words, scales, target, m, n, k, a.stride(0), words.stride(0), scales.stride(0), out.stride(0),
        groups_per_split, BLOCK_M=block_m, BLOCK_N=block_n, GROUP=GROUP, SPLIT=splits > 1, DOT=dot,
        num_warps=num_warps or NUM_WARPS, num_stages=num_stages or NUM_STAGES,
    )  # fmt: skip
    if splits > 1:
        _sum_splits(target, out)
    return out


def _output(shape: tuple[int, ...], like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Every buffer a kernel here writes is allocated by this one function (the tests poison it)."""
    return torch.empty(shape, device=like.device, dtype=dtype)


def _splits_of(groups: int, splits: int) -> tuple[int, int]:
    """(groups a split, splits): `splits` asked for, fewer if the groups do not fill the last ones."""
    if splits < 1:
        raise ValueError(f"int4_matmul: splits = {splits}; it must be at least 1")
    groups_per_split = cdiv(groups, min(splits, groups))
    return groups_per_split, cdiv(groups, groups_per_split)


def _sum_splits(part: torch.Tensor, out: torch.Tensor) -> None:
    """out (M, N) = the sum of the fp32 partials part (splits, M, N)."""
    splits, m, n = part.shape
    block = 1024
    _sum_splits_kernel[(cdiv(m * n, block),)](part, out, m * n, n, out.stride(0), SPLITS=splits, BLOCK=block)


def _forward_row(a, packed, scales, block_n, num_warps, splits):
    """The one-row kernel (`_int4_row_kernel`), then the split-K sum."""
    k, n = a.shape[1], packed.shape[0]
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"int4_matmul: block_n = {block_n} must be a power of two of at least 16")
    out = _output((1, n), a, a.dtype)
    groups_per_split, splits = _splits_of(k // GROUP, splits)
    target = _output((splits, 1, n), a, torch.float32) if splits > 1 else out
    words = packed.view(torch.int32)  # (N, K/8): eight 4-bit weights a word, k = 8c + i in nibble i
    _int4_row_kernel[(cdiv(n, block_n), splits)](
        a, words, scales, target, n, k, words.stride(0), scales.stride(0), groups_per_split,
        0x43000000, 0x45000000,  # the bits of the floats 128.0 and 2048.0
        BLOCK_N=block_n, GROUP=GROUP, SPLIT=splits > 1, EXACT=a.dtype == torch.float32,
        num_warps=num_warps, num_stages=1,  # the loads run ahead by hand: no software pipeline on top
    )  # fmt: skip
    if splits > 1:
        _sum_splits(target, out)
    return out


@torch.library.custom_op(
    "labkernels::ch07_int4_matmul",
    mutates_args=(),
    schema="(Tensor a, Tensor packed, Tensor scales) -> Tensor",
)
def _int4_op(a, packed, scales):
    return _forward(a, packed, scales)


@_int4_op.register_fake
def _(a, packed, scales):
    return a.new_empty((a.shape[0], packed.shape[0]))


def int4_matmul(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, **config) -> torch.Tensor:
    """a @ W^T for a (M, K) with M <= 16 and W given as `quantize_int4` returns it; (M, N) in a's dtype,
    accumulated in fp32. `config` (splits, block_n, num_warps, num_stages, dot, row) overrides the defaults:
    row=False sends one row to the many-row kernel. Inference only."""
    _check(a, packed, scales)
    if torch.compiler.is_compiling() and not config:
        return torch.ops.labkernels.ch07_int4_matmul(a, packed, scales)
    return _forward(a, packed, scales, **config)
