"""Whole waves, then the tiles left over as narrower tiles beside them: chapter 03's tiled kernel, twice.

A tiled matmul of T tiles on S SMs runs T // S full waves and T % S tiles more. When an SM holds several
programs at once, the extra tiles do not wait for a wave: they start at once, as one more program on T % S
SMs, and those SMs finish last. At 1536^3 chapter 03's pick is 64 x 128 tiles, 288 programs, 3 an SM: on the
H200 its kernel took 13.9 us for the first 264 tiles (two an SM) and 16.5 us for all 288
(`gpu_jobs/tile_count.py`), so a twelfth of the work cost a sixth of the time.

`run` launches the full waves' tiles as before and, when the grouped tile order leaves the other tiles as one
rectangle of C, computes that rectangle with a second launch of the same kernel on views of A, B and C, with
tiles a quarter as wide, on a second stream. Its programs take the room the big tiles leave on every SM, so
the leftover work spreads over all of them instead of 24. No partial sums: each element of C is still one
program's dot product over all of K, so the result is the same on every call. Where the rest is not one
rectangle (or there is no rest) it is chapter 03's tiled kernel, one launch.

The second stream waits for the caller's stream before it starts, and the caller's stream waits for it
before anything after the call: the call is ordered as one kernel would be, and in a CUDA-graph capture the
two launches become two branches of the graph.

What it gains and costs, measured on the H200 at 1536^3 bf16 (reference/ch04_wave_tail_calls.csv): 15.1 us
against 15.7 us for the tiled kernel alone in CUDA-graph replays (0.76 of cuBLAS against 0.73), and 107 us
against 19 us as a plain call, where the host's work (two launches, the streams' hand-offs, the call's
checks) is longer than the kernels. So `matmul(kernel="auto")` does not pick it: it pays inside a CUDA
graph, or wherever the host runs far enough ahead of the GPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton

from labkernels import launch_cache
from labkernels.ch03_triton import matmul as ch03

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
    (gpu_jobs/wave_tail.py)."""
    return max(16, block_n // 4)


class _Plan(NamedTuple):
    rectangle: tuple | None  # (r0, r1, c0, c1) of C computed by the tail launch
    main: Callable[..., None]  # launcher(a, b, c, c): the full waves (every tile when there is no tail)
    tail: Callable[..., None] | None  # launcher(a_rows, b_cols, c_part, c_part)


_plans: dict[tuple, _Plan] = {}


def _key(a: torch.Tensor, b: torch.Tensor, precision: str) -> tuple:
    """What the plan depends on: shapes, strides, dtype, device, 16-byte alignment (Triton specializes on
    it; a view of an aligned tensor at a tile's offset is aligned too) and the precision."""
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, a.device, a.data_ptr() % 16 == 0,
            b.data_ptr() % 16 == 0, precision)  # fmt: skip


def _tiles_launch(a, b, c, meta: dict, programs: int | None = None) -> Callable[..., None]:
    """Chapter 03's tiled kernel on (a, b, c), its first `programs` tiles (all when None): launched once,
    and its launcher returned."""
    (M, K), N = a.shape, b.shape[1]
    strides = (*a.stride(), *b.stride(), *c.stride())
    tiles = triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"])
    meta = meta | {"ALIGN": ch03.row_alignment(N, strides)}
    args = (a, b, c, c, M, N, K, *strides)
    return launch_cache.launch(ch03._matmul_tiles, (programs or tiles,), args, meta)  # read MK + KN, write MN


def _first_call(a, b, c, precision: str, sms: int) -> _Plan:
    """Tune chapter 03's tiled kernel for this shape, compute C with both launches, and keep the plan."""
    config = ch03.tuned_config(a, b, input_precision=precision, kernel="tiled")[1]
    (M, K), N = a.shape, b.shape[1]
    meta = config.all_kwargs() | {
        "HAS_BIAS": False, "ACTIVATION": None,
        "INPUT_PRECISION": precision if a.dtype == torch.float32 else "tf32",  # as chapter 03 passes it
        "INDEX_64": ch03.needs_int64(a, b), "EVEN_K": K % config.kwargs["BLOCK_SIZE_K"] == 0,
    }  # fmt: skip
    whole, rect = leftover(M, N, meta["BLOCK_SIZE_M"], meta["BLOCK_SIZE_N"], sms, meta["GROUP_SIZE_M"])
    if rect is None:
        return _Plan(None, _tiles_launch(a, b, c, meta), None)
    narrow = meta | {"BLOCK_SIZE_N": tail_block_n(meta["BLOCK_SIZE_N"])}
    holder = {}

    def launches(side):
        holder["main"] = _tiles_launch(a, b, c, meta, programs=whole)
        with _on(side):
            a_rows, b_cols, c_part = _parts(a, b, c, rect)
            holder["tail"] = _tiles_launch(a_rows, b_cols, c_part, narrow)

    _forked(a.device, launches)
    return _Plan(rect, holder["main"], holder["tail"])


def _parts(a, b, c, rect):
    r0, r1, c0, c1 = rect
    return a[r0:r1], b[:, c0:c1], c[r0:r1, c0:c1]


@functools.cache
def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def _on(side):
    return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()


def _forked(device: torch.device, launches: Callable) -> None:
    """launches(side): the tail goes on `side`, which starts after everything already on the caller's stream;
    the caller's stream then waits for it. On the CPU lane (no streams) side is None: one after the other."""
    side = _side_stream(device)
    if side is None:
        launches(None)
        return
    caller = torch.cuda.current_stream(device)
    side.wait_stream(caller)  # A and B written, C allocated, before the tail reads or writes them
    launches(side)
    caller.wait_stream(side)  # whatever follows on the caller's stream sees all of C


def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, precision: str, sms: int) -> None:
    """C = A B (c allocated by the caller, (M, N) contiguous), in one or two launches of chapter 03's tiled
    kernel. The first call of a shape tunes chapter 03's kernel (`ch03.tuned_config`) and keeps the plan."""
    key = (*_key(a, b, precision), sms)
    plan = _plans.get(key)
    if plan is None:
        _plans[key] = _first_call(a, b, c, precision, sms)
        return
    if plan.tail is None:
        plan.main(a, b, c, c)
        return

    def launches(side):
        plan.main(a, b, c, c)  # read the full waves' MK + KN share, write their MN
        with _on(side):
            a_rows, b_cols, c_part = _parts(a, b, c, plan.rectangle)
            plan.tail(a_rows, b_cols, c_part, c_part)  # the rest of C

    _forked(a.device, launches)


def planned(a: torch.Tensor, b: torch.Tensor, precision: str, sms: int) -> tuple | None:
    """The rectangle of C (r0, r1, c0, c1) that the tail launch computes for these operands, () when their
    calls are one launch, None before their first call."""
    plan = _plans.get((*_key(a, b, precision), sms))
    return None if plan is None else (plan.rectangle or ())
