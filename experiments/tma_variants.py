"""Chapter 03's TMA-persistent matmul at short K: where a tile's fixed cost goes (an experiment).

At 3000 x 5000 x 1000 bf16 the shipped pick (128 x 256 x 64 tiles, 480 of them on 132 SMs) ran at 0.75 of
cuBLAS in graph replays, while cuBLAS's own kernel (nvjet 128 x 232, 528 tiles: four full waves) keeps
90% of its 8192^3 rate a tile. With K = 1000 a tile has 16 K-steps, so what a tile pays once (the
epilogue: the accumulator converted, staged in shared memory, stored by TMA) weighs far more than at 8192^3.

1. The fixed cost: the pick's time at K = 1000, 2000 and 4000 (same M, N); the intercept of time over K is
   what every wave pays besides its K-steps.
2. Variants of the kernel, each checked against fp64 on a poisoned C and bitwise against a second call,
   then timed beside cuBLAS in alternating rounds (graph replays and plain calls):
   - the epilogue stored in 2 or 4 column slices (`SUBTILE`): a slice of C staged in shared memory
     instead of the whole tile, which frees room for a fourth stage of A and B;
   - grouping (GROUP_SIZE_M 4, 8, 16), flatten off (no pipelining across tiles), warp specialization;
   - 4096^3, 8192^3 and 1536^3 as controls: a change that wins at short K must not lose there.

    PYTHONPATH=$PWD:$PWD/experiments python experiments/tma_variants.py  # GPU; $OUT/tma_variants/results.csv
    PYTHONPATH=$PWD:$PWD/experiments python experiments/tma_variants.py --cpu-smoke  # interpreter, fp16, tiny
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import time
from typing import NamedTuple

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import triton
import triton.language as tl

from labkernels.ch03_triton import matmul as ch03
from labkernels.lane import sm_count
from labkernels.timing import graph_ms, time_ms

TOL = 1e-2  # relative error against fp64: bf16 output rounding (8-bit mantissa)


class Variant(NamedTuple):
    bm: int
    bn: int
    bk: int
    stages: int
    warps: int
    subtile: int = 1  # column slices of the epilogue
    group: int = 8
    flatten: bool = True
    ws: bool = False

    @property
    def name(self) -> str:
        extra = [f"sub{self.subtile}"] if self.subtile > 1 else []
        extra += [f"g{self.group}"] if self.group != 8 else []
        extra += ["noflat"] if not self.flatten else []
        extra += ["ws"] if self.ws else []
        return " ".join([f"{self.bm}x{self.bn}x{self.bk} s{self.stages} w{self.warps}", *extra])


@triton.jit
def _store_sliced(c_desc, c, row, col, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  SUBTILE: tl.constexpr):  # fmt: skip
    """Store tile c at (row, col) as SUBTILE column slices (1, 2 or 4), each staged alone."""
    if SUBTILE == 1:
        c_desc.store([row, col], c)
    elif SUBTILE == 2:
        halves = tl.permute(tl.reshape(c, (BLOCK_SIZE_M, 2, BLOCK_SIZE_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        c_desc.store([row, col], left)
        c_desc.store([row, col + BLOCK_SIZE_N // 2], right)
    else:
        halves = tl.permute(tl.reshape(c, (BLOCK_SIZE_M, 2, BLOCK_SIZE_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        q = tl.permute(tl.reshape(left, (BLOCK_SIZE_M, 2, BLOCK_SIZE_N // 4)), (0, 2, 1))
        q0, q1 = tl.split(q)
        c_desc.store([row, col], q0)
        c_desc.store([row, col + BLOCK_SIZE_N // 4], q1)
        q = tl.permute(tl.reshape(right, (BLOCK_SIZE_M, 2, BLOCK_SIZE_N // 4)), (0, 2, 1))
        q2, q3 = tl.split(q)
        c_desc.store([row, col + BLOCK_SIZE_N // 2], q2)
        c_desc.store([row, col + 3 * (BLOCK_SIZE_N // 4)], q3)


@triton.jit
def _tma_variant(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    """`ch03._matmul_tma_persistent` (no bias, no activation) with the epilogue's slices and the loop's
    flattening as options."""
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_SIZE_M, BLOCK_SIZE_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, [K, N], [stride_bk, 1], [BLOCK_SIZE_K, BLOCK_SIZE_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [M, N], [stride_cm, 1], [BLOCK_SIZE_M, BLOCK_SIZE_N // SUBTILE])
    num_tiles = tl.cdiv(M, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N)
    for tile_id in tl.range(
        tl.program_id(axis=0), num_tiles, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE
    ):
        pid_m, pid_n = ch03._tile_coordinates(tile_id, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            a = a_desc.load([pid_m * BLOCK_SIZE_M, k * BLOCK_SIZE_K])  # read BM x BK
            b = b_desc.load([k * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])  # read BK x BN
            acc = tl.dot(a, b, acc)
        c = acc.to(c_ptr.dtype.element_ty)
        row, col = pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N
        _store_sliced(c_desc, c, row, col, BLOCK_SIZE_M, BLOCK_SIZE_N, SUBTILE)


def variant_call(v: Variant, a, b, c):
    (M, K), N = a.shape, b.shape[1]
    programs = min(sm_count(a.device), triton.cdiv(M, v.bm) * triton.cdiv(N, v.bn))
    meta = dict(BLOCK_SIZE_M=v.bm, BLOCK_SIZE_N=v.bn, BLOCK_SIZE_K=v.bk, GROUP_SIZE_M=v.group,
                NUM_PROGRAMS=programs, SUBTILE=v.subtile, FLATTEN=v.flatten, WARP_SPECIALIZE=v.ws,
                num_warps=v.warps, num_stages=v.stages)  # fmt: skip
    args = (a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    return lambda: _tma_variant[(programs,)](*args, **meta)


def fp64_reference(a, b):
    return a.double() @ b.double()


def checked(v: Variant, a, b) -> tuple[float, bool]:
    def run(a, b, c):
        variant_call(v, a, b, c)()
        return c

    return recording.checked_matmul(run, a, b, fp64_reference)


def cpu_smoke() -> int:
    torch.manual_seed(0)
    a = torch.randn(70, 56, dtype=torch.float16)
    b = torch.randn(56, 88, dtype=torch.float16)  # rows 16-byte aligned (TMA)
    bad = 0
    for sub in (1, 2, 4):
        err, same = checked(Variant(32, 32, 32, 1, 4, subtile=sub), a, b)
        ok = err < TOL and same
        bad += not ok
        print(f"smoke sub{sub}: rel err {err:.2e}, bitwise {same}: {'ok' if ok else 'WRONG'}")
    return int(bad > 0)


PICK = Variant(128, 256, 64, 3, 8)
SHORT_K = [
    PICK, Variant(256, 128, 64, 3, 8), Variant(128, 128, 64, 4, 8),
    Variant(128, 256, 64, 3, 8, subtile=2), Variant(128, 256, 64, 4, 8, subtile=2),
    Variant(128, 256, 64, 4, 8, subtile=4), Variant(256, 128, 64, 4, 8, subtile=2),
    Variant(128, 128, 64, 4, 8, subtile=2), Variant(128, 128, 64, 5, 8, subtile=2),
    Variant(128, 256, 64, 3, 8, group=4), Variant(128, 256, 64, 3, 8, group=16),
    Variant(128, 256, 64, 4, 8, subtile=2, group=16), Variant(128, 256, 64, 3, 8, flatten=False),
    Variant(128, 256, 64, 3, 8, ws=True, flatten=False), Variant(128, 256, 64, 3, 8, subtile=2, ws=True,
                                                                 flatten=False),
    Variant(128, 128, 64, 4, 4, ws=True, flatten=False),
]  # fmt: skip
CONTROLS = [PICK, Variant(128, 256, 64, 4, 8, subtile=2), Variant(128, 256, 64, 4, 8, subtile=4),
            Variant(128, 128, 64, 4, 8), Variant(128, 128, 64, 5, 8, subtile=2)]  # fmt: skip
SHAPES = [
    ((3000, 5000, 1000), SHORT_K), ((3000, 5000, 2000), [PICK]), ((3000, 5000, 4000), [PICK]),
    ((4096, 4096, 4096), CONTROLS), ((8192, 8192, 8192), CONTROLS), ((1536, 1536, 1536), CONTROLS),
]  # fmt: skip


def measure_shape(shape, variants, rounds, budget_end) -> list[dict]:
    m, n, k = shape
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    calls, errs = {"cublas": lambda: torch.matmul(a, b, out=c)}, {}
    calls["shipped matmul"] = lambda: ch03.matmul(a, b)
    for v in variants:
        if time.monotonic() > budget_end:
            break
        try:
            errs[v.name] = checked(v, a, b)
        except Exception as e:  # a variant that does not compile or fit: say so, go on
            print(f"{m}x{n}x{k} {v.name}: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
            continue
        calls[v.name] = variant_call(v, a, b, c)
    graph = recording.alternating_medians(calls, rounds, graph_ms)
    plain = recording.alternating_medians(calls, rounds, time_ms)
    rows = []
    for name in calls:
        err, same = errs.get(name, (float("nan"), True))
        rows.append({
            **recording.versioned(), "m": m, "n": n, "k": k, "variant": name,
            "graph_ms": graph[name][0], "plain_ms": plain[name][0], "graph_spread": graph[name][1],
            "graph_vs_cublas": graph["cublas"][0] / graph[name][0],
            "plain_vs_cublas": plain["cublas"][0] / plain[name][0],
            "tflops_graph": 2 * m * n * k / graph[name][0] / 1e9, "rel_err": err, "bitwise": same,
            "ok": name in ("cublas", "shipped matmul") or (err < TOL and same),
        })  # fmt: skip
        r = rows[-1]
        print(f"{m}x{n}x{k} {name:40s} graph {r['graph_ms'] * 1e3:8.2f} us {r['graph_vs_cublas']:.3f}  "
              f"plain {r['plain_ms'] * 1e3:8.2f} us {r['plain_vs_cublas']:.3f}  err {err:.1e} {r['ok']}",
              flush=True)  # fmt: skip
    return rows


def gpu_main(out_dir: str, args) -> int:
    budget_end = time.monotonic() + args.budget_s
    rows = []
    for shape, variants in SHAPES:
        rows += measure_shape(shape, variants, args.rounds, budget_end)
        recording.write_csv(f"{out_dir}/results.csv", rows)
    return int(not all(r["ok"] for r in rows))


def options(parser) -> None:
    parser.add_argument("--budget-s", type=float, default=240)


if __name__ == "__main__":
    recording.main(__doc__, cpu_smoke, gpu_main, "tma_variants", options)
