"""What the 24 tiles past two waves cost at 1536^3, and what a stream-K tail costs alone (an experiment; GPU).

Chapter 03's pick at 1536^3 is 64 x 128 tiles: 288 programs on 132 SMs, 3 fit an SM, so all run at once and
24 SMs hold three while 108 hold two. If an SM with three tiles is the one everybody waits for, launching only
the first 264 tiles (two an SM) should take about 2/3 of the time of 288; if each program runs at its own
pace whatever else shares its SM, about the same. This times chapter 03's tiled kernel on the first T tiles
(T = 132 ... 288: C is only partly written, nothing to check but the full grid) beside cuBLAS, as CUDA-graph
replays in alternating rounds, and prints each kernel's registers, spills and shared memory; then the
stream-K tail of `sk_tail.py` alone on the 24 leftover tiles, on the main stream (no second stream), and the
same kernel's whole-tile path on all 288, to split its cost from the stream join's.

    PYTHONPATH=$PWD python experiments/tile_count.py         # GPU; CSV to $OUT/tile_count/tile_count.csv
    ncu ... python experiments/tile_count.py --once          # each kernel launched once more after warm-up
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import os
import sys

import torch

import labkernels  # noqa: F401  (before triton: it sets the lane)
import recording
import sk_tail

from labkernels.ch03_triton import matmul as ch03
from labkernels.ch04_libraries import splitk
from labkernels.lane import sm_count
from labkernels.timing import graph_ms

M = N = K = 1536
TILE = dict(BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, EVEN_K=True)
COUNTS = (132, 198, 240, 264, 276, 288)


def launchers(a, b, c, ws, tickets, sms: int) -> dict:
    strides = (*a.stride(), *b.stride(), *c.stride())
    meta = TILE | {"ALIGN": ch03.row_alignment(N, strides), "num_stages": 3, "num_warps": 4}
    tiles = (M // 64) * (N // 128)
    sk_tiles = tiles % sms

    def first(count):
        return lambda: ch03._matmul_tiles[(count,)](
            a, b, c, c, M, N, K, *strides, HAS_BIAS=False, ACTIVATION=None, INPUT_PRECISION="ieee",
            INDEX_64=False, **meta,
        )  # fmt: skip

    def sk(grid, sk_count, programs, first_tile, sk_only):
        return lambda: sk_tail._sk_tail_kernel[(grid,)](
            a, b, c, ws, tickets, M, N, K, sk_count, programs, first_tile, *strides,
            INPUT_PRECISION="ieee", BIG=False, SK_ONLY=sk_only, **meta,
        )  # fmt: skip

    calls = {"cublas": lambda: torch.mm(a, b, out=c)}
    calls |= {f"ch03 first {t} tiles": first(t) for t in COUNTS}
    calls["sk kernel, 288 whole"] = sk(tiles, 0, 0, 0, False)
    calls[f"sk kernel, {sk_tiles} tiles SK alone"] = sk(sms, sk_tiles, sms, tiles - sk_tiles, True)
    calls[f"sk kernel, {sk_tiles} tiles whole"] = sk(sk_tiles, 0, 0, 0, False)  # tiles 0..23, whole
    return calls


def main() -> int:
    once = "--once" in sys.argv
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    sms = sm_count()
    ws = torch.zeros(4 * sms * 64 * 128, device="cuda", dtype=torch.float32)
    tickets = torch.zeros(4 * sms + 1, device="cuda", dtype=torch.int32)
    calls = launchers(a, b, c, ws, tickets, sms)
    compiled = {name: call() for name, call in calls.items()}  # compiles; Triton returns the kernel
    c.fill_(float("nan"))
    calls["ch03 first 288 tiles"]()  # the full grid writes all of C
    err = recording.rel_err(c, splitk.reference(a, b))
    print(f"ch03 288 tiles: rel err {err:.1e}; tickets left {int(tickets.abs().sum())}")
    for name, k in compiled.items():
        if hasattr(k, "n_regs"):
            print(f"{name:32s} regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}")
    torch.cuda.synchronize()
    if once:  # under ncu: one more launch of each, warm
        for call in calls.values():
            call()
        torch.cuda.synchronize()
        return 0
    timed = recording.alternating_medians(calls, 5, lambda call: graph_ms(call, rep=30))
    cublas = timed["cublas"][0]
    meta = recording.versioned()
    rows = []
    for name, (med, spread) in timed.items():
        rows.append(meta | {"m": M, "n": N, "k": K, "impl": name, "ms": med, "spread": spread,
                            "of_cublas": cublas / med})  # fmt: skip
        print(f"{name:32s} {med * 1e3:7.2f} us  {cublas / med:.3f} of cuBLAS spread {spread:.2f}", flush=True)
    out_dir = os.path.join(os.environ.get("OUT", "/tmp"), "tile_count")
    os.makedirs(out_dir, exist_ok=True)
    recording.write_csv(f"{out_dir}/tile_count.csv", rows)
    return int(not err < 2e-2)


if __name__ == "__main__":
    sys.exit(main())
