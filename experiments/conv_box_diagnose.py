"""Where the box kernel's wrong results fall (an experiment's reproducer; GPU only).

`conv_variants.py --tma` found `_conv_box_kernel` wrong in some runs and right in others, on the same
inputs, whichever way the descriptors are built (device or host), y is stored (TMA or pointers) or the
filters are laid out. This runs each listed config eight times with its output poisoned (NaN), without and
with SYNC (acc used each step: the compiler then waits for the step's MMAs before the next step loads new
values into their register operand), and prints per wrong run how many outputs are off and where. On the
H200 (triton 3.6) the first four failed in some or all runs without SYNC and never with it.

The TF32 matmul with a row-major B once computed C^T = B^T A^T with B^T fed to wgmma from registers, and its
loop, compiled for sm_90, left 3 MMAs pending while the next step loaded new values into their registers
(undefined in PTX). --tf32 runs `_registers_a_kernel` (those loads, A through an elementwise op, that dot)
with WAIT off and on, 20 runs per config compared bitwise, then timed against cuBLAS TF32 (graph replays).
Measured on the H200: no run differed without the wait, and the wait cost 20% (0.91 -> 0.71 of cuBLAS at
4096^3). --wait-configs sweeps configs with the wait beside B copied K-major by chapter 02's tiled transpose,
then the K-major pointer kernel (0.80 of cuBLAS at 4096^3, graph replays); the copy ships, followed by the
K-major TMA kernel (`splitk._k_major_tma_kernel`, the `tf32` rows of ch04_matmul.csv). --k-major times the
shipped path with the TMA kernel and with the pointer kernel.

    PYTHONPATH=$PWD python experiments/conv_box_diagnose.py            # GPU: conv cases, then TF32
    PYTHONPATH=$PWD python experiments/conv_box_diagnose.py --tf32     # GPU: the TF32 register kernel
    PYTHONPATH=$PWD python experiments/conv_box_diagnose.py --wait-configs  # GPU: configs with the wait
    PYTHONPATH=$PWD python experiments/conv_box_diagnose.py --k-major  # GPU: TMA and pointer K-major kernels
    PYTHONPATH=$PWD python experiments/conv_box_diagnose.py --smoke    # CPU lane: the TF32 kernels, checked
"""

import functools  # noqa: I001  (labkernels before triton: it sets the lane)
import sys

import torch

import labkernels  # noqa: F401
import triton
import triton.language as tl

from labkernels.ch03_triton.matmul import _tile_coordinates
from labkernels.timing import graph_ms

sys.path.insert(0, "experiments")
import conv_variants as cv  # noqa: E402

CASES = [  # (shape, tile, filters K-major?, descriptors, TMA store?)
    ((32, 128, 28, 128, 3, 1, 1), (8, 4, 4, 128, 64, 3, 8), False, "host", True),
    ((32, 128, 28, 128, 3, 1, 1), (4, 4, 4, 128, 64, 3, 4), False, "device", True),
    ((32, 256, 14, 256, 3, 1, 1), (32, 2, 2, 256, 64, 3, 8), False, "host", True),
    ((32, 512, 7, 512, 3, 1, 1), (16, 1, 8, 256, 64, 3, 8), False, "host", True),
    # the fastest of the last run
    ((32, 64, 56, 64, 3, 1, 1), (4, 4, 8, 64, 64, 3, 4), True, "host", True),
    ((32, 128, 28, 128, 3, 1, 1), (4, 4, 4, 128, 64, 3, 4), True, "host", True),
    ((32, 256, 14, 256, 3, 1, 1), (32, 1, 2, 256, 128, 3, 4), False, "host", True),
    ((32, 512, 7, 512, 3, 1, 1), (16, 1, 4, 128, 128, 4, 4), True, "host", False),
]
RUNS = 8


def wrong_runs(call, ref) -> list[str]:
    cv._empty = lambda *a, **k: torch.full(*a[:1], float("nan"), **k)
    fails = []
    for run in range(RUNS):
        y = call().float()
        torch.cuda.synchronize()
        bad = ((y - ref).abs() > 0.05 * ref.abs().max()) | y.isnan()
        if bad.any():
            idx = bad.nonzero()
            fails.append(
                f"run{run}: {bad.sum().item()} bad ({y.isnan().sum().item()} NaN) in "
                f"{idx[:, 0].unique().numel()} images, k {idx[:, 3].unique().numel()} distinct"
            )
    cv._empty = torch.empty
    return fails


def conv_cases() -> None:
    for shape, tile, kn, descriptors, store_tma in CASES:
        x, w, _, _, ref = cv.operands(shape, torch.float16)
        ref = ref.float()
        for sync in (False, True):
            meta = cv._box_meta(shape, *tile, kn, descriptors, store_tma, sync)
            call = cv.box_call(x, w, shape, meta)
            fails = wrong_runs(call, ref)
            tag = f"C={shape[1]} {cv._fmt_box(meta)}" + (" sync" if sync else "")
            timing = "" if fails else f"  {cv.MODES['graph'](call) * 1e3:.1f} us (graph)"
            print(f"{tag:60} {len(fails)}/{RUNS} wrong{timing}", flush=True)
            for f in fails[:2]:
                print("   ", f, flush=True)


@triton.jit
def _registers_a_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr, WAIT: tl.constexpr,
):  # fmt: skip
    """C = A B in TF32, K a multiple of BLOCK_SIZE_K, A's tile through registers (`a + 0.0`) as in
    `splitk._dot_range`'s A_VIA_REGISTERS path; WAIT: use acc after each step's dot (the shipped fix)."""
    pid_m, pid_n = _tile_coordinates(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_SIZE_K):
        a = tl.load(a_ptrs) + 0.0  # read BM x BK
        b = tl.load(b_ptrs)  # read BK x BN
        acc = tl.dot(a, b, acc, input_precision="tf32")
        if WAIT:
            acc = acc + 0.0
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=mask)  # write MN


def _registers_a(a, b, c, cfg, wait: bool) -> None:
    """C = A B as the shipped path computes it for a row-major B: C^T = B^T A^T, B^T from registers."""
    (m, k), n = a.shape, b.shape[1]
    bt, at, ct = b.t(), a.t(), c.t()
    grid = (triton.cdiv(n, cfg.kwargs["BLOCK_SIZE_M"]) * triton.cdiv(m, cfg.kwargs["BLOCK_SIZE_N"]),)
    _registers_a_kernel[grid](bt, at, ct, n, m, k, *bt.stride(), *at.stride(), *ct.stride(), **cfg.kwargs,
                              WAIT=wait, num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip


def _name(cfg) -> str:
    tile = "x".join(str(cfg.kwargs[f"BLOCK_SIZE_{d}"]) for d in "MNK")
    return f"{tile} s{cfg.num_stages} w{cfg.num_warps}"


def registers_a_with_and_without_wait(shapes, runs: int, configs) -> None:
    """Each config of `_registers_a_kernel`, WAIT off and on: runs that differ from the first (bitwise) or
    from fp64, and on the GPU the graph-replay time against cuBLAS TF32 on the same operands."""
    device = labkernels.DEVICE
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        ref = (a.double() @ b.double()).float()
        cublas_ms = None
        if labkernels.on_gpu():
            torch.backends.cuda.matmul.allow_tf32 = True
            cublas_ms = graph_ms(functools.partial(torch.matmul, a, b), rep=50)
            torch.backends.cuda.matmul.allow_tf32 = False
        for cfg in configs:
            for wait in (False, True):
                first, differ, wrong = None, 0, 0
                for _ in range(runs):
                    c = torch.full((m, n), float("nan"), device=device)
                    _registers_a(a, b, c, cfg, wait)
                    first = c.clone() if first is None else first
                    differ += not torch.equal(c, first)
                    wrong += bool(((c - ref).abs() > 0.05 * ref.abs().max()).any() or c.isnan().any())
                timing = ""
                if cublas_ms is not None:
                    c = torch.empty((m, n), device=device)
                    run = functools.partial(_registers_a, a, b, c, cfg, wait)
                    ms = graph_ms(run, rep=50)
                    timing = f"  {ms * 1e3:.1f} us = {cublas_ms / ms:.3f} of cuBLAS ({cublas_ms * 1e3:.1f})"
                tag = f"registers-A {m}x{n}x{k} {_name(cfg)} wait={wait}"
                print(f"{tag}: {differ}/{runs} differ, {wrong} wrong{timing}", flush=True)


def k_major_kernels(shapes) -> None:
    """The shipped TF32 path, `splitk.matmul(allow_tf32=True)`, with its K-major TMA kernel and with the
    pointer kernel (`splitk.K_MAJOR_TMA` off), each tuned afresh: B row-major (copied K-major first) and B
    already K-major, against cuBLAS TF32 in graph replays and plain calls, checked against fp64."""
    from labkernels.ch04_libraries import splitk
    from labkernels.timing import time_ms

    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=labkernels.DEVICE), torch.randn(k, n, device=labkernels.DEVICE)
        b_k_major = b.t().contiguous().t()
        ref = a.double() @ b.double()
        torch.backends.cuda.matmul.allow_tf32 = True
        library = functools.partial(torch.matmul, a, b)
        lib = {"graph": graph_ms(library, rep=50), "plain": time_ms(library, rep=50)}
        torch.backends.cuda.matmul.allow_tf32 = False
        for kernel, tma in (("TMA", True), ("pointer", False)):
            splitk.K_MAJOR_TMA = tma
            splitk._tuned.clear()
            splitk._plans.clear()  # or later calls launch what the first one chose
            for layout, operand in (("row-major B", b), ("K-major B", b_k_major)):
                call = functools.partial(splitk.matmul, a, operand, allow_tf32=True)
                err = ((call().double() - ref).abs().max() / ref.abs().max()).item()
                ratios = {mode: lib[mode] / timer(call, rep=50) for mode, timer in (("graph", graph_ms),
                                                                                     ("plain", time_ms))}
                launched = "+".join(sorted({key[0] for key in splitk._tuned}))  # the kernel that really ran
                print(f"k_major {kernel:7} {m}x{n}x{k} {layout}: {ratios['graph']:.3f} (graph), "
                      f"{ratios['plain']:.3f} (plain) of cuBLAS; launched {launched}; rel err {err:.1e}",
                      flush=True)  # fmt: skip
        splitk.K_MAJOR_TMA = True


# Configs for the register path with the wait: a deeper K step (fewer waits per tile) or smaller tiles (two
# or three programs an SM, so one program's MMAs run while another waits). (BM, BN, BK, stages, warps)
WAIT_CONFIGS = [
    (128, 256, 32, 4, 8), (128, 256, 64, 2, 8), (128, 128, 64, 3, 8), (128, 128, 64, 2, 4),
    (128, 128, 32, 3, 4), (128, 128, 32, 2, 4), (64, 256, 32, 2, 4), (64, 256, 64, 2, 4),
    (64, 128, 32, 4, 4), (64, 128, 64, 3, 4), (128, 64, 64, 3, 4), (256, 128, 32, 3, 8),
]  # fmt: skip


def wait_configs_sweep(shapes) -> None:
    """`_registers_a_kernel` with the wait over WAIT_CONFIGS, checked against fp64 and timed (graph replays),
    beside the K-major path fed by a copy of B (chapter 02's tiled Triton copy, then `splitk` on the K-major
    view): plain calls and graph replays, against cuBLAS TF32."""
    from labkernels.ch02_strides.triton_strided import copy_2d_tiled
    from labkernels.ch04_libraries import splitk
    from labkernels.timing import time_ms

    for m, n, k in shapes:
        a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
        ref = (a.double() @ b.double()).float()
        torch.backends.cuda.matmul.allow_tf32 = True
        lib = {"graph": graph_ms(functools.partial(torch.matmul, a, b), rep=50),
               "plain": time_ms(functools.partial(torch.matmul, a, b), rep=50)}  # fmt: skip
        torch.backends.cuda.matmul.allow_tf32 = False
        for bm, bn, bk, stages, warps in WAIT_CONFIGS:
            meta = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8}
            cfg = triton.Config(meta, num_stages=stages, num_warps=warps)
            c = torch.full((m, n), float("nan"), device="cuda")
            try:
                _registers_a(a, b, c, cfg, True)
                ok = bool(((c - ref).abs() <= 0.05 * ref.abs().max()).all())
                ms = graph_ms(functools.partial(_registers_a, a, b, c, cfg, True), rep=50)
                verdict = f"{ms * 1e3:.1f} us = {lib['graph'] / ms:.3f} of cuBLAS (graph), ok={ok}"
            except Exception as e:  # noqa: BLE001  (out of shared memory: the sweep goes on)
                verdict = f"failed: {type(e).__name__}: {str(e)[:80]}"
            print(f"wait sweep {m}x{n}x{k} {_name(cfg)}: {verdict}", flush=True)

        def copied_then_k_major(a=a, b=b):
            b_k_major = copy_2d_tiled(b.t()).t()  # read KN, write KN: B^T contiguous
            return splitk.matmul(a, b_k_major, kernel="k_major", allow_tf32=True)

        c = copied_then_k_major()
        ok = bool(((c - ref).abs() <= 0.05 * ref.abs().max()).all())
        for mode, timer in (("graph", graph_ms), ("plain", time_ms)):
            ms = timer(copied_then_k_major, rep=50)
            print(f"copy + k_major {m}x{n}x{k} {mode}: {ms * 1e3:.1f} us = {lib[mode] / ms:.3f} of cuBLAS "
                  f"({lib[mode] * 1e3:.1f}), ok={ok}", flush=True)  # fmt: skip


if __name__ == "__main__":
    torch.manual_seed(0)
    from labkernels.ch04_libraries import splitk

    if "--smoke" in sys.argv:  # the CPU lane: the register kernel and both K-major kernels, tiny shapes
        registers_a_with_and_without_wait([(40, 48, 64)], runs=2, configs=splitk.CPU_CONFIGS)
        sys.exit(k_major_kernels([(40, 48, 64)]))
    if "--k-major" in sys.argv:
        sys.exit(k_major_kernels([(4096, 4096, 4096), (3000, 5000, 1000), (8192, 8192, 8192)]))
    if "--wait-configs" in sys.argv:
        sys.exit(wait_configs_sweep([(4096, 4096, 4096), (3000, 5000, 1024)]))
    if "--tf32" not in sys.argv:
        conv_cases()
    registers_a_with_and_without_wait([(4096, 4096, 4096), (3000, 5000, 1024)], 20, splitk.K_MAJOR_CONFIGS)
    k_major_kernels([(4096, 4096, 4096)])
