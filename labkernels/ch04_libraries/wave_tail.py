"""Whole waves, then the tiles left over as narrower tiles beside them, in one launch of chapter 03's tile.

A tiled matmul of T tiles on S SMs runs T // S full waves and T % S tiles more. When an SM holds several
programs at once, the extra tiles do not wait for a wave: they start at once, as one more program on T % S
SMs, and those SMs finish last. At 1536^3 chapter 03's pick is 64 x 128 tiles, 288 programs, 3 an SM: on the
H200 its kernel took 13.9 us for the first 264 tiles (two an SM) and 16.5 us for all 288
(`experiments/tile_count.py`), so a twelfth of the work cost a sixth of the time.

When the grouped tile order leaves the tiles past the full waves as one rectangle of C, `_waves_and_tail`
runs the full waves' tiles as chapter 03 does and, in its last programs, the rectangle in tiles a quarter as
wide. Those programs take the room the big tiles leave on every SM, so the leftover work spreads over all of
them instead of T % S. No partial sums: each element of C is still one program's dot product over all of K,
so the result is the same on every call. Where the rest is not one rectangle (or there is no rest) it is
chapter 03's tiled kernel.

The first form of this (`experiments/wave_tail.py`) ran the rectangle as a second launch on a second stream:
as fast in CUDA-graph replays, but a plain call paid more host time for the two launches and the streams'
hand-offs than the matmul took. One launch costs the host about what chapter 03's call costs; on the H200 at
1536^3 bf16 it ran faster than chapter 03's tiled kernel both as graph replays and as plain calls
(reference/ch04_one_launch_tail.csv, experiments/one_launch_tail.py), and `matmul(kernel="auto")` kept it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch02_strides.views import may_overlap
from labkernels.ch03_triton import matmul as ch03
from labkernels.lane import on_gpu

GROUP_SIZE_M = 8  # chapter 03's tile order (`ch03._tile_coordinates`); its configs all use 8


def tile_coordinates(tile_id: int, m: int, n: int, block_m: int, block_n: int, group: int) -> tuple[int, int]:
    """(row, column) of a tile in chapter 03's grouped order, computed on the host."""
    rows, cols = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    in_group = group * cols
    first_row = tile_id // in_group * group
    group_rows = min(rows - first_row, group)  # the last group may be short
    return first_row + tile_id % in_group % group_rows, tile_id % in_group // group_rows


def leftover(m: int, n: int, block_m: int, block_n: int, sms: int, group: int = GROUP_SIZE_M):
    """(whole, rectangle): the tiles of the full waves, and the rows and columns of C that the others cover,
    (r0, r1, c0, c1), or None when they are not one rectangle or there is no full wave or no rest."""
    check_sms(sms)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    whole = tiles // sms * sms
    if whole in (0, tiles):
        return tiles, None
    coords = [tile_coordinates(t, m, n, block_m, block_n, group) for t in range(whole, tiles)]
    row_set, col_set = {r for r, _ in coords}, {c for _, c in coords}
    spans = (max(row_set) - min(row_set) + 1, max(col_set) - min(col_set) + 1)
    if spans != (len(row_set), len(col_set)) or len(row_set) * len(col_set) != tiles - whole:
        return tiles, None  # gaps, or a ragged block: not one rectangle
    r0, c0 = min(row_set) * block_m, min(col_set) * block_n
    return whole, (r0, min(m, (max(row_set) + 1) * block_m), c0, min(n, (max(col_set) + 1) * block_n))


def tail_block_n(block_n: int) -> int:
    """The leftover tiles' width: a quarter of the big tile's (at least 16). On the H200 at 1536^3, 64 x 32
    tiles beside 64 x 128 ones ran fastest of nine shapes; 32-row tiles, which lose wgmma, ran slowest
    (experiments/wave_tail.py)."""
    return max(16, block_n // 4)


@triton.jit
def _waves_and_tail(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    whole,  # programs below this run the full waves' tiles, in chapter 03's grouped order
    tail_row, tail_col,  # the rectangle's first row and column of C
    tail_cols,  # its width in narrow tiles
    INPUT_PRECISION: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr,
    ALIGN: tl.constexpr, TAIL_BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(axis=0)
    if pid < whole:
        pid_m, pid_n = ch03._tile_coordinates(pid, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        row, col = pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N
        # read BM x K + K x BN, write BM x BN
        ch03.matmul_tile(
            a_ptr, b_ptr, c_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
            stride_cn, row, col, False, None, INPUT_PRECISION, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
            EVEN_K, INDEX_64, ALIGN,
        )  # fmt: skip
    else:  # the rectangle, row of tiles by row of tiles: its A rows and B columns sit in L2 (a few MB)
        t = pid - whole
        row, col = tail_row + t // tail_cols * BLOCK_SIZE_M, tail_col + t % tail_cols * TAIL_BLOCK_N
        # read BM x K + K x TAIL_BLOCK_N, write BM x TAIL_BLOCK_N
        ch03.matmul_tile(
            a_ptr, b_ptr, c_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
            stride_cn, row, col, False, None, INPUT_PRECISION, BLOCK_SIZE_M, TAIL_BLOCK_N, BLOCK_SIZE_K,
            EVEN_K, INDEX_64, ALIGN,
        )  # fmt: skip


class _Plan(NamedTuple):
    rectangle: tuple | None  # (r0, r1, c0, c1) of C computed by the narrow tiles
    launch: Callable[..., None]  # launcher(a, b, c, ...): the whole call


_plans: dict[tuple, _Plan] = {}


def _key(a: torch.Tensor, b: torch.Tensor, precision: str) -> tuple:
    """What the plan depends on: shapes, strides, dtype, device, 16-byte alignment (Triton specializes on
    it) and the precision."""
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0,
            b.data_ptr() % 16 == 0, precision)  # fmt: skip


def _meta(a, b, c, config: triton.Config, precision: str) -> dict:
    """Chapter 03's constexprs for its tuned config on these operands (as chapter 03 passes them)."""
    K, N = b.shape
    strides = (*a.stride(), *b.stride(), *c.stride())
    c_span = (c.shape[0] - 1) * c.stride(0) + (c.shape[1] - 1) * c.stride(1)  # C may be a wide view
    return config.all_kwargs() | {
        "INPUT_PRECISION": precision if a.dtype == torch.float32 else "tf32",
        "INDEX_64": ch03.needs_int64(a, b) or c_span > ch03.INT32_MAX,
        "EVEN_K": K % config.kwargs["BLOCK_SIZE_K"] == 0,
        "ALIGN": ch03.row_alignment(N, strides),
    }  # fmt: skip


def check(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, narrow: int | None = None) -> None:
    """What `launch` and `run` need: chapter 03's operand checks, no operand that requires grad (C is written
    in place), a C of (M, N) in their dtype on their device and clear of both (the kernel reads A and B while
    other programs write C), a narrow width that is a power of two (on the GPU at least 16, the smallest
    `tl.dot`)."""
    ch03.check_operands(a, b)
    shape = (a.shape[0], b.shape[1])
    if tuple(c.shape) != shape or c.dtype != a.dtype or c.device != a.device:
        raise ValueError(f"wave_tail: c must be {shape} {a.dtype} on {a.device}, got {tuple(c.shape)} "
                         f"{c.dtype} on {c.device}")  # fmt: skip
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise ValueError("wave_tail: a or b requires grad, and C written here has no backward; call "
                         "splitk.matmul(a, b, kernel='wave_tail'), which has one")  # fmt: skip
    for name, t in (("a", a), ("b", b)):
        if may_overlap(c, t):
            raise ValueError(f"wave_tail: c overlaps {name} in memory; pass a separate output")
    smallest = 16 if on_gpu() else 1
    if narrow is not None and (narrow < smallest or narrow & (narrow - 1)):
        raise ValueError(f"wave_tail: narrow must be a power of two >= {smallest}, got {narrow}")


def check_sms(sms) -> None:
    """The SM count the waves are cut by: a positive int (0 would divide by zero; a negative count has no
    waves)."""
    if not isinstance(sms, int) or isinstance(sms, bool) or sms < 1:
        raise ValueError(f"wave_tail: sms must be a positive int (the GPU's SM count), got {sms!r}")


def launch(a, b, c, meta: dict, sms: int, narrow: int | None = None) -> tuple[tuple | None, Callable]:
    """C = A B with chapter 03's tile config `meta` on `sms` SMs, launched once: (the rectangle of narrow
    tiles or None, the launcher for the next calls with operands of the same shapes, strides and alignment).
    narrow: the narrow tiles' width (`tail_block_n`'s choice when None)."""
    check(a, b, c, narrow)
    check_sms(sms)
    return _launch(a, b, c, meta, sms, narrow)


def _launch(a, b, c, meta: dict, sms: int, narrow: int | None = None) -> tuple[tuple | None, Callable]:
    """`launch` without its checks."""
    (M, K), N = a.shape, b.shape[1]
    block_m, block_n = meta["BLOCK_SIZE_M"], meta["BLOCK_SIZE_N"]
    strides = (*a.stride(), *b.stride(), *c.stride())
    whole, rect = leftover(M, N, block_m, block_n, sms, meta["GROUP_SIZE_M"])
    if rect is None:  # chapter 03's kernel as it is
        tiled = meta | {"HAS_BIAS": False, "ACTIVATION": None}
        alone = launch_cache.launch(ch03._matmul_tiles, (whole,), (a, b, c, c, M, N, K, *strides), tiled)
        return None, lambda a, b, c: alone(a, b, c, c)  # c as the unused bias pointer too
    narrow = narrow or tail_block_n(block_n)
    r0, r1, c0, c1 = rect
    tail_cols = triton.cdiv(c1 - c0, narrow)
    programs = whole + triton.cdiv(r1 - r0, block_m) * tail_cols
    args = (a, b, c, M, N, K, *strides, whole, r0, c0, tail_cols)
    return rect, launch_cache.launch(_waves_and_tail, (programs,), args, meta | {"TAIL_BLOCK_N": narrow})


def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, precision: str, sms: int) -> None:
    """C = A B into a contiguous (M, N) c, one launch. The first call of a shape tunes chapter 03's tiled
    kernel (`ch03.tuned_config`) and keeps the plan. precision: "ieee" or "tf32", for fp32 operands."""
    check(a, b, c)
    if not c.is_contiguous() or c.data_ptr() % 16:
        raise ValueError("wave_tail: c must be contiguous and 16-byte aligned, as a fresh tensor is (the "
                         "kept launchers take its strides and alignment as they were)")  # fmt: skip
    if precision not in ("ieee", "tf32"):
        raise ValueError(f"wave_tail: precision must be 'ieee' or 'tf32', got {precision!r}")
    check_sms(sms)
    _run(a, b, c, precision, sms)


def _run(a, b, c, precision: str, sms: int) -> None:
    """`run` without its checks: for `splitk.matmul`, which has checked a and b, allocated c, and handles
    autograd itself (its backward calls this again, with grad mode on under create_graph)."""
    key = (*_key(a, b, precision), sms)
    plan = _plans.get(key)
    if plan is not None:
        plan.launch(a, b, c)  # read MK + KN, write MN
        return
    config = ch03.tuned_config(a, b, input_precision=precision, kernel="tiled")[1]
    _plans[key] = _Plan(*_launch(a, b, c, _meta(a, b, c, config, precision), sms))


def planned(a: torch.Tensor, b: torch.Tensor, precision: str, sms: int) -> tuple | None:
    """The rectangle of C (r0, r1, c0, c1) that the narrow tiles compute for these operands, () when their
    calls are chapter 03's kernel alone, None before their first call."""
    plan = _plans.get((*_key(a, b, precision), sms))
    return None if plan is None else (plan.rectangle or ())
