"""Chapter 03's matmul epilogue and small-grid configs, side by side against cuBLAS (an experiment).

1. gelu(A @ B + bias) at 4096^3 bf16 (chapter 05's epilogue shape): eager (cuBLAS, then two pointwise
   kernels), cuBLAS alone (no epilogue), the shipped `matmul_bias_gelu`, and direct launches of the tiled
   and TMA-persistent kernels per config with three epilogues: bias only, GELU through tl.erf (what
   fp32 C runs) and the 16-bit GELU polynomial (ACTIVATION="gelu_poly", `_gelu_for_16_bit`):
   the erf form nearly twice the polynomial's instructions an element on sm_90 (ch05_epilogue_sass). Configs
   include 128 x 128 x 64 in 3 stages, whose 96 KiB of shared memory let two programs share an SM, so that
   one program's epilogue can run while the other's tensor-core loop does.
2. 1536^3 and 3000 x 5000 x 1000 (no epilogue; the two chapter 04 shapes whose last wave is nearly empty):
   cuBLAS, the shipped `matmul`, direct launches of the tiled kernel over configs that fit two or three
   programs an SM, and `_wide_tile_kernel`: a tile 128 + 64 = 192 columns wide, held as two accumulators
   (Triton's blocks are powers of two). At 1536^3 its 12 x 8 = 96 tiles make one wave on 132 SMs, where
   128 x 128 tiles make 144 (a full wave and 12 more); cuBLAS picks a 192 x 96 tile (128 tiles) there.
Every output is poisoned (NaN) first and checked against fp64; times are CUDA-graph replays (`graph_ms`)
and plain calls (`time_ms`).

    python experiments/epilogue_variants.py --out DIR   # GPU: table on stdout, DIR/results.csv
    python experiments/epilogue_variants.py --smoke     # CPU lane (interpreter): tiny fp16/fp32 shapes
    python experiments/epilogue_variants.py --warp-specialize --out DIR  # the TMA kernel with and without
        # Triton's warp specialization: at 4096^3 (bias, GELU polynomial), 1536^3 and 8192^3
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import csv
import os
import sys
import time

import labkernels  # noqa: F401
import torch
import triton
import triton.language as tl

from labkernels.ch03_triton import matmul as ch03
from labkernels.ch05_fusion import epilogue
from labkernels.lane import on_gpu, sm_count
from labkernels.timing import graph_ms, time_ms

TOL = 1e-2  # max |error| / max |reference|: bf16 output rounding (8-bit mantissa)
# (BM, BN, BK, stages, warps)
TILED = [
    (128, 256, 64, 3, 8), (128, 256, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 8),
    (128, 128, 64, 3, 8), (128, 128, 64, 3, 4), (128, 128, 32, 4, 4), (128, 64, 64, 3, 4),
    (64, 128, 64, 3, 4),
]  # fmt: skip
TMA = [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 2, 8)]
# --warp-specialize: the TMA kernel with Triton's warp specialization (a producer warp group issuing the TMA
# loads; on sm_90 a 4-warp 128 x 128 config compiles to 12 warps, two consumer groups) against without it
TMA_WS = [(128, 256, 64, 3, 8, False), (128, 128, 64, 4, 4, False)] + [
    (*shape, stages, warps, True)
    for shape, stages, warps in [((128, 128, 64), 3, 4), ((128, 128, 64), 4, 4), ((128, 256, 64), 3, 4),
                                 ((128, 128, 64), 3, 8), ((128, 256, 64), 3, 8), ((64, 128, 64), 4, 4)]
]  # fmt: skip
EPILOGUES = [("bias", True, None), ("gelu_erf", True, "gelu"), ("gelu_poly", True, "gelu_poly")]


def tiled_call(a, b, c, bias, cfg, act, has_bias):
    (M, K), N = a.shape, b.shape[1]
    bm, bn, bk, stages, warps = cfg
    meta = dict(HAS_BIAS=has_bias, ACTIVATION=act, INPUT_PRECISION="ieee", BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn,
                BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, EVEN_K=K % bk == 0, INDEX_64=False, num_warps=warps,
                num_stages=stages)  # fmt: skip
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    args = (a, b, c, bias if has_bias else c, M, N, K, *a.stride(), *b.stride(), *c.stride())
    return lambda: ch03._matmul_tiles[grid](*args, **meta)


def tma_call(a, b, c, bias, cfg, act, has_bias):
    (M, K), N = a.shape, b.shape[1]
    bm, bn, bk, stages, warps, *ws = cfg  # a sixth field: warp_specialize
    programs = min(sm_count(a.device), triton.cdiv(M, bm) * triton.cdiv(N, bn))
    meta = dict(HAS_BIAS=has_bias, ACTIVATION=act, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                GROUP_SIZE_M=8, NUM_PROGRAMS=programs, WARP_SPECIALIZE=bool(ws and ws[0]), num_warps=warps,
                num_stages=stages)  # fmt: skip
    args = (a, b, c, bias if has_bias else c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    return lambda: ch03._matmul_tma_persistent[(programs,)](*args, **meta)


@triton.jit
def _wide_tile_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_N2: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):  # fmt: skip
    """C = A @ B (rows contiguous, K a multiple of BLOCK_SIZE_K) in tiles BLOCK_N1 + BLOCK_N2 columns wide:
    two accumulators, two dots a K step sharing the A tile."""
    width: tl.constexpr = BLOCK_N1 + BLOCK_N2
    pid_m, pid_n = ch03._tile_coordinates(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, width, GROUP_SIZE_M)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n1 = pid_n * width + tl.arange(0, BLOCK_N1)
    offs_n2 = pid_n * width + BLOCK_N1 + tl.arange(0, BLOCK_N2)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :]  # wrapped rows: valid, never stored
    b1_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n1 % N)[None, :]
    b2_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n2 % N)[None, :]
    acc1 = tl.zeros((BLOCK_SIZE_M, BLOCK_N1), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_SIZE_M, BLOCK_N2), dtype=tl.float32)
    for _ in range(0, K // BLOCK_SIZE_K):
        a = tl.load(a_ptrs)  # read BM x BK
        acc1 = tl.dot(a, tl.load(b1_ptrs), acc1)  # read BK x BN1
        acc2 = tl.dot(a, tl.load(b2_ptrs), acc2)  # read BK x BN2
        a_ptrs += BLOCK_SIZE_K
        b1_ptrs += BLOCK_SIZE_K * stride_bk
        b2_ptrs += BLOCK_SIZE_K * stride_bk
    rows = offs_m[:, None] < M
    c_rows = c_ptr + offs_m[:, None] * stride_cm
    tl.store(c_rows + offs_n1[None, :], acc1.to(c_ptr.dtype.element_ty), mask=rows & (offs_n1[None, :] < N))
    tl.store(c_rows + offs_n2[None, :], acc2.to(c_ptr.dtype.element_ty), mask=rows & (offs_n2[None, :] < N))


# (BM, BN1, BN2, BK, stages, warps)
WIDE = [(128, 128, 64, 64, 3, 8), (128, 128, 64, 64, 4, 8), (128, 128, 64, 64, 4, 4), (64, 128, 64, 64, 4, 4)]


def wide_call(a, b, c, cfg):
    (M, K), N = a.shape, b.shape[1]
    bm, bn1, bn2, bk, stages, warps = cfg
    if K % bk:
        raise ValueError(f"K = {K} is not a multiple of {bk}")
    meta = dict(BLOCK_SIZE_M=bm, BLOCK_N1=bn1, BLOCK_N2=bn2, BLOCK_SIZE_K=bk, GROUP_SIZE_M=8, num_warps=warps,
                num_stages=stages)  # fmt: skip
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn1 + bn2),)
    args = (a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0))
    return lambda: _wide_tile_kernel[grid](*args, **meta)


class Bench:
    def __init__(self, out_csv, budget_s, rep, timed=True):
        self.rows, self.out_csv, self.rep = [], out_csv, rep
        self.timed = timed  # False in smoke mode: the interpreter checks correctness, its times mean nothing
        self.deadline = time.perf_counter() + budget_s

    def over(self):
        return time.perf_counter() > self.deadline

    def run(self, case, name, make, ref, c, base=None):
        """make() returns a callable writing c (poisoned first); checked once, then timed (unless smoke)."""
        row = {"case": case, "variant": name}
        try:
            fn = make()
            if c is not None:
                c.fill_(float("nan"))
            out = fn()
            out = c if c is not None else out
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            row["err"], row["ok"] = f"{err:.2e}", "ok" if err <= TOL else "FAIL"
            if self.timed:
                self._time(row, fn, base)
        except Exception as exc:  # one variant failing must not stop the others
            row["ok"], row["err"] = "ERROR", f"{type(exc).__name__}: {str(exc)[:160]}"
        self.rows.append(row)
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)  # fmt: skip
        self.write()
        return row

    def _time(self, row, fn, base):
        row["ms_graph"] = graph_ms(fn, rep=self.rep)
        row["ms_plain"] = time_ms(fn, rep=self.rep)
        if base:
            row["graph_vs_base"] = base["ms_graph"] / row["ms_graph"]
            row["plain_vs_base"] = base["ms_plain"] / row["ms_plain"]

    @classmethod
    def from_command_line(cls):
        """(bench, args) from --out DIR, --smoke, --budget-s, --rep: the experiments' shared options."""
        p = argparse.ArgumentParser()
        p.add_argument("--out", default="")
        p.add_argument("--smoke", action="store_true")
        p.add_argument("--warp-specialize", action="store_true", help="TMA with and without warp groups")
        p.add_argument("--budget-s", type=float, default=200)
        p.add_argument("--rep", type=int, default=50)
        args = p.parse_args()
        if args.out:
            os.makedirs(args.out, exist_ok=True)
        out_csv = os.path.join(args.out, "results.csv") if args.out else ""
        return cls(out_csv, args.budget_s, args.rep, timed=not args.smoke), args

    def verdict(self) -> int:
        """Prints the count of rows and failures; the exit status (1 if any variant failed or errored)."""
        bad = [r for r in self.rows if r["ok"] != "ok"]
        print(f"{len(self.rows)} rows, {len(bad)} failed or errored", flush=True)
        return 1 if bad else 0

    def write(self):
        if not self.out_csv:
            return
        keys = ["case", "variant", "ok", "err", "ms_graph", "ms_plain", "graph_vs_base", "plain_vs_base"]
        with open(self.out_csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)


def epilogue_section(bench, size, dtype, device, tiled, tma, epilogues=EPILOGUES):
    torch.manual_seed(0)
    M = N = K = size
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    bias = torch.randn(N, device=device).to(dtype)
    ref = epilogue.reference(a, b, bias)
    ref_bias = a.double() @ b.double() + bias.double()
    case = f"{size}^3 {str(dtype)[6:]} bias+gelu"
    eager = bench.run(case, "eager", lambda: lambda: epilogue.eager(a, b, bias), ref, None)
    bench.run(case, "cublas, no epilogue", lambda: lambda: a @ b, ref_bias - bias.double(), None, eager)
    bench.run(case, "shipped matmul_bias_gelu", lambda: lambda: epilogue.matmul_bias_gelu(a, b, bias), ref,
              None, eager)  # fmt: skip
    c = torch.empty(M, N, device=device, dtype=dtype)
    for kind, cfgs, maker in (("tiled", tiled, tiled_call), ("tma", tma, tma_call)):
        for cfg in cfgs:
            for label, has_bias, act in epilogues:
                if bench.over():
                    return
                name = f"{config_name(kind, cfg)} {label}"
                want = ref_bias if act is None else ref
                make = lambda m=maker, cfg=cfg, act=act, hb=has_bias: m(a, b, c, bias, cfg, act, hb)  # noqa: E731
                bench.run(case, name, make, want, c, eager)


def config_name(kind: str, cfg: tuple) -> str:
    """A config's name, e.g. "tiled 128x256x64 s3 w8"; " ws" marks a TMA config run with warp groups."""
    ws = " ws" if len(cfg) > 5 and cfg[5] else ""
    return f"{kind} {'x'.join(map(str, cfg[:3]))} s{cfg[3]} w{cfg[4]}{ws}"


def wave_section(bench, shape, dtype, device, tiled, wide, tma=()):
    """No epilogue: cuBLAS, the shipped matmul, then direct launches of the tiled, wide and TMA kernels."""
    torch.manual_seed(0)
    M, N, K = shape
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    ref = a.double() @ b.double()
    case = f"{M}x{N}x{K} {str(dtype)[6:]}"
    cub = bench.run(case, "cublas", lambda: lambda: a @ b, ref, None)
    bench.run(case, "shipped matmul", lambda: lambda: ch03.matmul(a, b), ref, None, cub)
    c = torch.empty(M, N, device=device, dtype=dtype)
    variants = [(config_name("tiled", cfg), lambda cfg=cfg: tiled_call(a, b, c, None, cfg, None, False))
                for cfg in tiled]  # fmt: skip
    variants += [(f"wide {cfg[0]}x({cfg[1]}+{cfg[2]})x{cfg[3]} s{cfg[4]} w{cfg[5]}",
                  lambda cfg=cfg: wide_call(a, b, c, cfg)) for cfg in wide]  # fmt: skip
    variants += [(config_name("tma", cfg), lambda cfg=cfg: tma_call(a, b, c, None, cfg, None, False))
                 for cfg in tma]  # fmt: skip
    for name, make in variants:
        if bench.over():
            return
        bench.run(case, name, make, ref, c, cub)


def main() -> int:
    bench, args = Bench.from_command_line()
    device = "cuda" if on_gpu() else "cpu"
    if args.smoke:  # the interpreter: correctness of every path on tiny shapes
        small = [(32, 32, 32, 1, 4)]
        epilogue_section(bench, 64, torch.float16, device, small, small + [(32, 32, 32, 1, 4, True)])
        wide = [(32, 32, 16, 32, 1, 4)]
        wave_section(bench, (48, 200, 64), torch.float32, device, small, wide, [(32, 32, 32, 1, 4, True)])
    elif args.warp_specialize:
        keep = [e for e in EPILOGUES if e[0] != "gelu_erf"]
        epilogue_section(bench, 4096, torch.bfloat16, device, [], TMA_WS, keep)
        for shape in ((1536, 1536, 1536), (8192, 8192, 8192)):
            wave_section(bench, shape, torch.bfloat16, device, [], [], TMA_WS)
    else:
        epilogue_section(bench, 4096, torch.bfloat16, device, TILED, TMA)
        for shape in ((1536, 1536, 1536), (3000, 5000, 1000)):
            wave_section(bench, shape, torch.bfloat16, device, TILED, WIDE)
    return bench.verdict()


if __name__ == "__main__":
    sys.exit(main())
