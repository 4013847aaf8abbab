"""int8 weight-only matmul at large M: the prologue fused with the operands swapped (an experiment).

Chapter 05's fused kernel converts each int8 tile of W in registers and hands it to `tl.dot` as the right
operand. On Hopper, wgmma reads its right operand from shared memory only, so the converted tile goes back to
shared memory every K step, outside the TMA unit's pipeline: at M = 4096 the fused path measured slower
than eager (ch05_fusion.csv). wgmma's *left* operand may come from registers. So compute C^T = W^T A^T: the
converted W^T tile (BN x BK) is the left operand, straight from registers, and A^T (BK x BM, K-major since A
is row-major) the right one, through shared memory as usual. Chapter 04's TF32 path does the same with B^T.

`_int8_swapped_kernel`: program (pid_n, pid_m) computes C^T's tile (BN x BM), that is C's (BM x BN) tile
stored transposed. The scale is applied either to W before the dot (SCALE_IN_LOOP, rounded to a's dtype as
eager's `w.to(dtype) * scale`) or once to the fp32 accumulator after the K loop (the int8 -> 16-bit
conversion is exact, so only the product's rounding differs from eager's: it is more accurate).

Timed against cuBLAS on 16-bit weights, eager, chapter 05's dequantising kernel followed by cuBLAS (the
unfused path with the library's GEMM), and chapter 05's `int8_matmul` (auto, fused, dequantize), at
M = 16 ... 4096 with N = K = 4096, bf16. Every output poisoned (NaN) first and checked against fp64; times are
CUDA-graph replays (`graph_ms`) and plain calls (`time_ms`).

    python experiments/int8_variants.py --out DIR      # GPU: table on stdout, DIR/results.csv
    python experiments/int8_variants.py --smoke     # CPU lane (interpreter): correctness, small fp16 shapes
    python experiments/int8_variants.py --compile-sm90 # no GPU: does wgmma take W^T from registers?
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import os
import sys

COMPILE_ONLY = __name__ == "__main__" and "--compile-sm90" in sys.argv
if COMPILE_ONLY:  # compile for a GPU on a machine without one: no interpreter
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    torch.cuda.is_available = lambda: True  # labkernels picks the GPU lane; nothing is launched
import labkernels  # noqa: E402,F401,I001  (first: it sets the lane before triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from labkernels.ch03_triton.matmul import _tile_coordinates  # noqa: E402
from labkernels.ch05_fusion import prologue  # noqa: E402

# (BN, BM, BK, stages, warps): BN rows of C^T (W's columns), BM columns (A's rows)
CONFIGS = [
    (128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 64, 4, 4), (256, 128, 64, 3, 8),
    (64, 256, 64, 4, 4), (64, 128, 128, 4, 4),
]  # fmt: skip
SMALL_M_CONFIGS = [(64, 16, 256, 4, 4), (128, 16, 128, 4, 4), (64, 32, 128, 4, 4)]  # decode: few rows of A


@triton.jit
def _int8_swapped_kernel(
    a_ptr, w_ptr, scale_ptr, c_ptr, M, N, K, stride_am, stride_wk, stride_cm,
    BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_N: tl.constexpr, SCALE_IN_LOOP: tl.constexpr,
):  # fmt: skip
    """C (M, N) = A (M, K) @ (W (K, N) int8 * scale (N,)), computed as C^T = W^T A^T. Rows of A, W and C
    contiguous; K a multiple of BLOCK_SIZE_K."""
    pid_n, pid_m = _tile_coordinates(tl.program_id(axis=0), N, M, BLOCK_SIZE_N, BLOCK_SIZE_M, GROUP_SIZE_N)
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N  # wrapped: valid, never stored
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    wt_ptrs = w_ptr + offs_k[None, :] * stride_wk + offs_n[:, None]  # (BN, BK): W^T, n contiguous in memory
    at_ptrs = a_ptr + offs_m[None, :] * stride_am + offs_k[:, None]  # (BK, BM): A^T, k contiguous
    scale = tl.load(scale_ptr + offs_n).to(tl.float32)  # read N, once a program
    acc = tl.zeros((BLOCK_SIZE_N, BLOCK_SIZE_M), dtype=tl.float32)
    for _ in range(0, K // BLOCK_SIZE_K):
        wt = tl.load(wt_ptrs).to(tl.float32)  # read BN x BK int8
        if SCALE_IN_LOOP:
            wt = wt * scale[:, None]
        at = tl.load(at_ptrs)  # read BK x BM
        acc = tl.dot(wt.to(a_ptr.dtype.element_ty), at, acc)  # the converted tile: wgmma's register operand
        wt_ptrs += BLOCK_SIZE_K * stride_wk
        at_ptrs += BLOCK_SIZE_K
    if not SCALE_IN_LOOP:
        acc = acc * scale[:, None]  # the scale of output column n, once
    cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    c_ptrs = c_ptr + cm[None, :] * stride_cm + cn[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(cn[:, None] < N) & (cm[None, :] < M))  # write MN


def swapped_call(a, w_int8, scale, c, cfg, scale_in_loop):
    (M, K), N = a.shape, w_int8.shape[1]
    bn, bm, bk, stages, warps = cfg
    if K % bk or a.stride(1) != 1 or w_int8.stride(1) != 1 or c.stride(1) != 1:
        raise ValueError(f"needs contiguous rows and K % {bk} == 0")
    grid = (triton.cdiv(N, bn) * triton.cdiv(M, bm),)
    meta = dict(BLOCK_SIZE_N=bn, BLOCK_SIZE_M=bm, BLOCK_SIZE_K=bk, GROUP_SIZE_N=8,
                SCALE_IN_LOOP=scale_in_loop, num_warps=warps, num_stages=stages)  # fmt: skip
    args = (a, w_int8, scale, c, M, N, K, a.stride(0), w_int8.stride(0), c.stride(0))
    return lambda: _int8_swapped_kernel[grid](*args, **meta)


def compile_only() -> int:
    """Compile for sm_90; report whether the dot takes its left operand from registers."""
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90 import ptxas_info
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failures = 0
    names = _int8_swapped_kernel.arg_names
    for bn, bm, bk, stages, warps in CONFIGS + SMALL_M_CONFIGS:
        for scale_in_loop in (False, True):
            sig = {"a_ptr": "*bf16", "w_ptr": "*i8", "scale_ptr": "*bf16", "c_ptr": "*bf16"}
            sig |= {n: "i32" for n in ("M", "N", "K", "stride_am", "stride_wk", "stride_cm")}
            consts = dict(BLOCK_SIZE_N=bn, BLOCK_SIZE_M=bm, BLOCK_SIZE_K=bk, GROUP_SIZE_N=8,
                          SCALE_IN_LOOP=scale_in_loop)  # fmt: skip
            name = f"{bn}x{bm}x{bk} s{stages} w{warps} scale_in_loop={scale_in_loop}"
            try:
                attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in sig}  # 4096s: all 16-divisible
                src = ASTSource(fn=_int8_swapped_kernel, signature=sig | {n: "constexpr" for n in consts},
                                constexprs=consts, attrs=attrs)  # fmt: skip
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": warps, "num_stages": stages})  # fmt: skip
                dots = [ln for ln in k.asm["ttgir"].splitlines() if "ttng.warp_group_dot " in ln]
                from_registers = bool(dots) and ": tensor<" in dots[0].split("ttng.warp_group_dot")[1]
                wgmma = k.asm["ptx"].count("wgmma.mma_async")
                info = [
                    ln.strip()
                    for ln in ptxas_info(k.asm["ptx"]).splitlines()
                    if "Used" in ln or "spill" in ln
                ]
                left = "registers" if from_registers else "shared memory"
                print(
                    f"{name:40s} wgmma x{wgmma}, left operand from {left}; smem {k.metadata.shared} B; {info}"
                )
            except Exception as exc:
                failures += 1
                print(f"{name:40s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
    return failures


def int8_case(bench, m: int, n: int, k: int, dtype, device):
    """Seeded inputs (a, w_int8, scale), their fp64 reference, the case's name, and cuBLAS on the 16-bit
    weights timed first as the base row: what every int8 experiment starts from."""
    torch.manual_seed(0)
    a = torch.randn(m, k, device=device).to(dtype)
    w_int8, scale = prologue.quantize(torch.randn(k, n, device=device).to(dtype))
    ref = prologue.reference(a, w_int8, scale)
    w16 = prologue.dequantize(w_int8, scale)
    case = f"{m}x{n}x{k} {str(dtype)[6:]}"
    cub = bench.run(case, "cublas, 16-bit weights", lambda: lambda: a @ w16, ref, None)
    return (a, w_int8, scale), ref, case, cub


def run(bench, m: int, n: int, k: int, dtype, device, configs) -> None:
    (a, w_int8, scale), ref, case, cub = int8_case(bench, m, n, k, dtype, device)
    bench.run(case, "eager", lambda: lambda: prologue.eager(a, w_int8, scale), ref, None, cub)
    # unfused with the library's GEMM: one dequantising pass (read KN int8, write KN), then cuBLAS
    dequant_cublas = lambda: lambda: a @ prologue.dequantize(w_int8, scale)  # noqa: E731
    bench.run(case, "dequantize + cublas", dequant_cublas, ref, None, cub)
    for path in ("auto", "fused", "dequantize"):
        call = lambda p=path: lambda: prologue.int8_matmul(a, w_int8, scale, path=p)  # noqa: E731
        bench.run(case, f"int8_matmul {path}", call, ref, None, cub)
    c = torch.empty(m, n, device=device, dtype=dtype)
    for cfg in configs:
        for scale_in_loop in (False, True):
            if bench.over():
                return
            where = "in loop" if scale_in_loop else "after"
            name = f"swapped {'x'.join(map(str, cfg[:3]))} s{cfg[3]} w{cfg[4]} scale {where}"
            make = lambda cfg=cfg, s=scale_in_loop: swapped_call(a, w_int8, scale, c, cfg, s)  # noqa: E731
            bench.run(case, name, make, ref, c, cub)


def main() -> int:
    if COMPILE_ONLY:
        return compile_only()
    from epilogue_variants import Bench

    from labkernels.lane import on_gpu

    bench, args = Bench.from_command_line()
    if args.smoke:  # the interpreter: correctness on small fp16 shapes, K a multiple of the step
        for m in (5, 40):
            run(bench, m, 72, 64, torch.float16, "cpu", [(32, 16, 32, 1, 4)])
    else:
        device = "cuda" if on_gpu() else "cpu"
        for m in (4096, 1024, 128, 16):
            run(bench, m, 4096, 4096, torch.bfloat16, device, CONFIGS if m >= 128 else SMALL_M_CONFIGS)
    return bench.verdict()


if __name__ == "__main__":
    sys.exit(main())
