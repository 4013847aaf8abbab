"""int8 weight-only matmul at every M: which tiles chapter 05's prologue-fused kernel needs (an experiment).

`prologue.int8_matmul` fuses the dequantisation up to `FUSED_MAX_M` rows and dequantises once above. Its
autotuner offered 16-row tiles up to 64 rows and 128-row tiles above. Between the two, at M = 128-512 (a
batch of decoding sequences), a 128-row tile gives one row of tiles: 4096 columns / 128 or 256 = 16 to 32
programs for 132 SMs: the 128 x 256 rows of this run (labkernels/reference/ch05_int8_tiles.csv) take the
same time from M = 16 to 1024, slower than dequantising first. Does a tile that fills the SMs at those M
move the crossover? (It did: `prologue.MID_M_CONFIGS`, and `FUSED_MAX_M` from the `ch05_int8_paths`
benchmark.)

Times chapter 05's `_int8_matmul_kernel` itself, launched at each config below, beside cuBLAS on 16-bit
weights and the shipped `int8_matmul` (auto and dequantize), at M = 16 ... 2048 with N = K = 4096 bf16. Every
output poisoned (NaN) first and checked against fp64; CUDA-graph replays and plain calls (`Bench`).

    python experiments/int8_tiles.py --out DIR     # GPU: table on stdout, DIR/results.csv and, with the
                                                # versions, DIR/ch05_int8_tiles.csv
    python experiments/int8_tiles.py --smoke       # CPU lane (interpreter): correctness at small shapes
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import os
import sys

import labkernels  # noqa: F401  (first: it sets the lane before triton is imported)
import torch
import triton

import recording
from epilogue_variants import Bench
from int8_variants import int8_case
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch05_fusion import prologue
from labkernels.lane import on_gpu

# (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps)
CONFIGS = [
    (16, 32, 256, 4, 4), (16, 64, 128, 4, 4), (16, 64, 256, 3, 4), (32, 64, 128, 4, 4), (32, 128, 128, 4, 4),
    (64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (64, 128, 128, 3, 4), (64, 256, 64, 3, 8), (128, 64, 64, 4, 4),
    (128, 128, 64, 4, 8), (128, 256, 64, 3, 8),
]  # fmt: skip
MS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def tile_call(a, w_int8, scale, c, cfg):
    (M, K), N = a.shape, w_int8.shape[1]
    bm, bn, bk, stages, warps = cfg
    strides = (*a.stride(), *w_int8.stride(), *c.stride())
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, EVEN_K=K % bk == 0,
                ALIGN=matmul_mod.row_alignment(N, strides), num_warps=warps, num_stages=stages)  # fmt: skip
    args = (a, w_int8, scale, c, M, N, K, *strides)
    return lambda: prologue._int8_matmul_kernel[grid](*args, INPUT_PRECISION="tf32", **meta)


def run(bench, m, n, k, dtype, device, configs) -> None:
    (a, w_int8, scale), ref, case, cub = int8_case(bench, m, n, k, dtype, device)
    for path in ("auto", "dequantize"):
        call = lambda p=path: lambda: prologue.int8_matmul(a, w_int8, scale, path=p)  # noqa: E731
        bench.run(case, f"int8_matmul {path}", call, ref, None, cub)
    c = torch.empty(m, n, device=device, dtype=dtype)
    for cfg in configs:
        if bench.over():
            return
        name = f"fused {'x'.join(map(str, cfg[:3]))} s{cfg[3]} w{cfg[4]}"
        bench.run(case, name, lambda cfg=cfg: tile_call(a, w_int8, scale, c, cfg), ref, c, cub)


def main() -> int:
    bench, args = Bench.from_command_line()
    if args.smoke:  # the interpreter: correctness of the launches at small fp16 shapes
        for m in (5, 40):
            run(bench, m, 72, 64, torch.float16, "cpu", [(16, 32, 32, 1, 4), (32, 16, 64, 1, 4)])
    else:
        device = "cuda" if on_gpu() else "cpu"
        for m in MS:
            run(bench, m, 4096, 4096, torch.bfloat16, device, CONFIGS)
        if args.out:
            recording.write_csv(os.path.join(args.out, "ch05_int8_tiles.csv"),
                                [recording.versioned() | row for row in bench.rows])  # fmt: skip
    return bench.verdict()


if __name__ == "__main__":
    sys.exit(main())
