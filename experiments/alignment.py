"""What the tiled matmul loses when the compiler cannot prove its rows 16 bytes apart (an experiment).

Triton marks an integer argument as a multiple of 16 only when it is one. At 3000 x 5000 x 1000 bf16 no row
stride is, though every row starts 16 bytes after a multiple of 16 bytes (1000 x 2 = 2000 bytes). Chapter
03's `_matmul_tiles` takes ALIGN (`row_alignment`) to be told; this launches one config with ALIGN = 1 (what
Triton proves alone) and with the true alignment, reads the launched kernel's PTX for its global loads, and
times both against cuBLAS (CUDA-graph replays). C is poisoned first and checked against fp64.

    python experiments/alignment.py --out DIR   # GPU: DIR/ch04_alignment.csv
    python experiments/alignment.py --smoke     # CPU lane (interpreter): the checks only, no PTX, no times
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import re
import sys

import labkernels  # noqa: F401
import torch
import triton

from labkernels.ch03_triton import matmul as ch03
from labkernels.lane import on_gpu
from labkernels.results import record
from labkernels.timing import graph_ms

CONFIG = dict(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=64, GROUP_SIZE_M=8, num_warps=8, num_stages=3)
SMOKE_CONFIG = dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=4, num_warps=4,
                    num_stages=1)  # fmt: skip
TOL = 1e-2  # max |error| / max |reference|: bf16 output rounding


def global_loads(ptx: str) -> dict:
    """Per kind of global load in the PTX: 16-byte async copies to shared memory, and one-element loads."""
    return {
        "async_copies": len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)),
        "one_element_loads": len(re.findall(r"ld\.global\.b16", ptx)),
    }


def rows(m: int, n: int, k: int, config: dict, device: str, dtype) -> list[dict]:
    torch.manual_seed(0)
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    c = torch.full((m, n), float("nan"), device=device, dtype=dtype)
    want = a.double() @ b.double()
    strides = (*a.stride(), *b.stride(), *c.stride())
    args = (a, b, c, c, m, n, k, *strides)
    grid = (triton.cdiv(m, config["BLOCK_SIZE_M"]) * triton.cdiv(n, config["BLOCK_SIZE_N"]),)
    out = []
    cublas_ms = graph_ms(lambda: a @ b) if on_gpu() else None
    for align in sorted({1, ch03.row_alignment(n, strides)}):
        meta = dict(config, HAS_BIAS=False, ACTIVATION=None, INPUT_PRECISION="ieee", INDEX_64=False,
                    EVEN_K=k % config["BLOCK_SIZE_K"] == 0, ALIGN=align)  # fmt: skip
        c.fill_(float("nan"))
        compiled = ch03._matmul_tiles[grid](*args, **meta)  # read MK + KN at best, write MN
        err = ((c.double() - want).abs().max() / want.abs().max()).item()
        if not err <= TOL:  # NaN (an unwritten element) fails too
            raise AssertionError(f"{m}x{n}x{k} ALIGN={align}: error {err:.2e}")
        row = {"shape": f"{m}x{n}x{k}", "dtype": str(dtype)[6:], "align": align, "max_error": err}
        if on_gpu():
            ms = graph_ms(lambda meta=meta: ch03._matmul_tiles[grid](*args, **meta))
            row |= global_loads(compiled.asm["ptx"])
            row |= {"ms": ms, "cublas_ms": cublas_ms, "ratio_vs_cublas": cublas_ms / ms}
        print(row, flush=True)
        out.append(row)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        table = rows(48, 40, 52, SMOKE_CONFIG, "cpu", torch.float16)  # rows 52 and 40 apart: ALIGN 4, then 1
    else:
        shapes = ((3000, 5000, 1000), (4096, 4096, 4096))
        table = [r for shape in shapes for r in rows(*shape, CONFIG, "cuda", torch.bfloat16)]
    if args.out:
        record("ch04_alignment", table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
