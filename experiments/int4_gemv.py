"""4-bit weights at M = 1 (bf16): fewer instructions a weight, so the GEMV can read at the memory's pace.

`weight_gemv.py`'s best int4 design at one row (`fma`: nibbles converted on the CUDA cores) ran at 1.23-1.28x
bf16 cuBLAS on the H200, short of torch's `_weight_int4pack_mm` (about 1.75x). Its conversion costs four
instructions a weight (shift, mask-and-or, float subtract, then the fma) and each thread held one row, so it
also loaded and converted an x value for nearly every weight. This script measures `lop`, the same loop with
two changes, against `fma`, chapter 07's shipped `int4_matmul`, cuBLAS on bf16 weights and int4pack:

- **One logic op a weight.** A nibble placed at mantissa bits 16-19 of the float 128.0 (0x43000000) reads as
  128 + q exactly; at bits 12-15 of 2048.0 (0x45000000), as 2048 + q. Nibbles 3 and 4 of a word already sit
  there; four shifts (<<12, <<4, >>4, >>12) bring the other six. So a weight is one mask-and-or (one LOP3)
  plus the fma, and a shift for every two weights. The offsets (128 + 8 or 2048 + 8) are not subtracted per
  weight: sum x (c + q) - (c + 8) sum x = sum x (q - 8), and sum x depends on the column of words only, so it
  is computed once per word for every row of the tile. Exact in the products; the subtraction loses about
  eight of fp32's 24 bits of the group's partial sum (|2048 / (q - 8)| ~ 2^8), far below bf16's rounding.
- **Several rows a thread.** A (BLOCK_N, BLOCK_W) tile of words with BLOCK_N up to 256 gives each thread
  several rows of the same words' columns: each x value is loaded and converted once for all of them.

Every output is poisoned (NaN) and checked against fp64 first. Timed as CUDA-graph replays, with one weight
matrix (it may stay in the 50 MB L2) and rotating through copies whose total passes 120 MB (every replay reads
from HBM, as a model's successive layers do).

    python experiments/int4_gemv.py --out DIR   # GPU: tables on stdout, DIR/int4_gemv.csv
    python experiments/int4_gemv.py --smoke     # CPU lane (interpreter): each design's check, fp16
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import math
import os
import sys
import time

import labkernels  # noqa: F401
import torch
import triton
import triton.language as tl

import recording
import weight_gemv
from labkernels import timing
from labkernels.ch07_decode import int4 as int4_mod
from labkernels.lane import on_gpu

GROUP = 128
HIGH, LOW = 136.0, 2056.0  # 128 + 8 and 2048 + 8: what a nibble's float holds beyond q - 8


@triton.jit
def _nib_magic(words, i: tl.constexpr, f128, f2048):
    """Nibble i of 32-bit words as the float 128 + q (nibbles 1, 4, 5, 7) or 2048 + q (0, 2, 3, 6): the
    nibble shifted to mantissa bits 16-19 or 12-15 and OR-ed into the float's bits. No subtraction. f128 and
    f2048 are those floats' bits, passed in registers (kernel arguments): with both operands immediate,
    ptxas emits the mask-and-or as two LOP3s; with the float in a register, as one."""
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
        bits = (t & 0x000F0000) | f128  # 128 + q
    else:
        bits = (t & 0x0000F000) | f2048  # 2048 + q
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _offset(i: tl.constexpr):
    """What _nib_magic's float holds beyond q - 8."""
    if i == 1 or i == 4 or i == 5 or i == 7:
        return 136.0
    else:
        return 2056.0


@triton.jit
def int4_lop(x_ptr, w_ptr, s_ptr, out_ptr, N, K, k_split, f128, f2048, BLOCK_N: tl.constexpr,
             BLOCK_W: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr,
             PREFETCH: tl.constexpr):  # fmt: skip
    KW = K // 8
    c0 = tl.program_id(1) * (k_split // 8)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rc = tl.arange(0, BLOCK_W)
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * KW + (c0 + rc)[None, :]
    s_ptrs = s_ptr + rn.to(tl.int64)[:, None] * (K // 128) + ((c0 + rc) // 16)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32)
    steps = k_split // 8
    words = tl.load(w_ptrs)
    if PREFETCH == 2:
        following = tl.load(w_ptrs + BLOCK_W, mask=BLOCK_W < steps, other=0)
    for c in tl.range(0, steps, BLOCK_W, num_stages=STAGES):
        # PREFETCH steps ahead: the next steps' words are in flight while this step converts and multiplies
        if PREFETCH == 1:
            following = tl.load(w_ptrs + c + BLOCK_W, mask=c + BLOCK_W < steps, other=0)
        elif PREFETCH == 2:
            after = tl.load(w_ptrs + c + 2 * BLOCK_W, mask=c + 2 * BLOCK_W < steps, other=0)
        else:
            words = tl.load(w_ptrs + c)  # read BN x BW words: eight weights each
        part = tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32)
        offset = tl.zeros([BLOCK_W], dtype=tl.float32)  # sum over the word's k of x (c + 8): every row's
        for i in tl.static_range(8):
            xi = tl.load(x_ptr + 8 * (c0 + c + rc) + i).to(tl.float32)  # read BW, once for BN rows
            part += _nib_magic(words, i, f128, f2048) * xi[None, :]
            offset += xi * _offset(i)
        acc += (part - offset[None, :]) * tl.load(s_ptrs + c // 16).to(tl.float32)  # the group's scale
        if PREFETCH == 1:
            words = following
        elif PREFETCH == 2:
            words = following
            following = after
    total = tl.sum(acc, axis=1)
    if SPLIT:
        tl.store(out_ptr + tl.program_id(1) * N + rn, total)
    else:
        tl.store(out_ptr + rn, total.to(out_ptr.dtype.element_ty))


DESIGNS = {"fma": weight_gemv.int4_fma, "lop": int4_lop, "lop_pf": int4_lop, "lop_pf2": int4_lop}
PREFETCH = {"lop": 0, "lop_pf": 1, "lop_pf2": 2}  # steps of words loaded ahead


def make_call(design, cfg, x, w, s):
    """A no-argument call computing x @ W^T into one preallocated output, and that output."""
    (m, k), n = x.shape, w.shape[0]
    block_n, block_w, warps, stages, splits = cfg
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    part = torch.empty(splits, m, n, device=x.device, dtype=torch.float32) if splits > 1 else out
    kernel = DESIGNS[design]
    lop = design.startswith("lop")
    magic = (0x43000000, 0x45000000) if lop else ()  # the floats 128 and 2048
    args = (x, w.view(torch.int32), s, part, n, k, k // splits, *magic, block_n, block_w)
    meta = dict(STAGES=stages, SPLIT=splits > 1, num_warps=warps)
    if lop:
        meta["PREFETCH"] = PREFETCH[design]

    def launch():
        kernel[(n // block_n, splits)](*args, **meta)

    if splits == 1:
        return launch, out
    block = 256

    def both():
        launch()
        weight_gemv.sum_splits[(triton.cdiv(m * n, block),)](
            part, s, out, m * n, n, SPLITS=splits, SCALE=False, BLOCK=block
        )

    return both, out


def check(design, cfg, x, w, s, ref) -> float:
    call, out = make_call(design, cfg, x, w, s)
    out.fill_(float("nan"))
    call()
    return weight_gemv.rel_err(out, ref)


def configs(design):
    """(BLOCK_N, BLOCK_W words, warps, stages, splits)."""
    if design == "fma":  # the first sweep's best at both shapes, with its neighbours
        return [(4, 128, 4, 3, sp) for sp in (1, 2, 4)] + [(8, 64, 4, 3, sp) for sp in (1, 2, 4)]
    tiles = [(32, 16, 4), (64, 16, 4), (64, 32, 4), (128, 16, 4), (128, 16, 8), (128, 32, 8), (256, 16, 8)]
    if design == "lop_pf":  # the prefetch is its own pipeline: one stage
        return [(bn, bw, w, 1, sp) for bn, bw, w in tiles for sp in (2, 4, 8)]
    if design == "lop_pf2":  # fewer registers a program, more programs an SM: more bytes in flight
        tiles = [(64, 16, 2), (64, 16, 4), (128, 16, 4), (128, 16, 8), (128, 32, 8), (256, 16, 8)]
        return [(bn, bw, w, 1, sp) for bn, bw, w in tiles for sp in (4, 8, 16)]
    return [(bn, bw, w, st, sp) for bn, bw, w in tiles for st in (2, 4) for sp in (1, 2, 4, 8)]


def smoke() -> None:
    cases = [("fma", (16, 32, 4, 1, 2)), ("lop", (16, 16, 4, 1, 2)), ("lop", (32, 32, 4, 1, 1))]
    cases += [("lop_pf", (16, 16, 4, 1, 2)), ("lop_pf", (32, 32, 4, 1, 1)), ("lop_pf2", (16, 16, 4, 1, 1))]
    for design, cfg in cases + [("lop_pf2", (32, 32, 4, 1, 2))]:
        x, [(w, s)], ref = weight_gemv.case("int4", 1, 64, 512, torch.float16, "cpu")
        err = check(design, cfg, x, w, s, ref)
        print(f"smoke int4 {design} {cfg}: err {err:.1e}", flush=True)
        assert err < 5e-3, err


def sweep(n, k, x, w, s, ref, deadline):
    """Every config of each design that is right: [(us, design, cfg)], fastest first (one matrix)."""
    found = []
    for design in DESIGNS:
        for cfg in configs(design):
            if time.time() > deadline or n % cfg[0]:
                continue
            try:
                err = check(design, cfg, x, w, s, ref)
            except Exception as e:  # noqa: BLE001  (a config that does not compile is reported, not fatal)
                print(f"  {design} {cfg}: {type(e).__name__} {str(e)[:100]}", flush=True)
                continue
            if not err <= 1e-2:
                print(f"  {design} {cfg}: WRONG err {err:.2e}", flush=True)
                continue
            call, _ = make_call(design, cfg, x, w, s)
            found.append((1e3 * timing.graph_ms(call, rep=20), design, cfg))
    return sorted(found)


def anchors(x, weights, k, n):
    """name -> (call on the first weights, calls over every copy): cuBLAS on bf16 weights (copies past
    60 MB), torch's int4pack and the shipped int4_matmul on the same 4-bit copies."""
    from labkernels.ch07_decode import bench as ch07_bench

    w16s = [
        torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(max(2, math.ceil(60e6 / (n * k))))
    ]
    theirs = [ch07_bench.torch_int4(w, s) for w, s in weights]
    shipped = [lambda w=w, s=s: int4_mod.int4_matmul(x, w, s) for w, s in weights]
    return {
        "cublas bf16": (lambda: x @ w16s[0], [lambda w16=w16: x @ w16 for w16 in w16s]),
        "torch int4pack": (lambda: theirs[0](x), [lambda t=t: t(x) for t in theirs]),
        "shipped int4_matmul": (shipped[0], shipped),
    }


def measure_shape(m, n, k, deadline) -> list[dict]:
    """Sweep both designs at one shape, then time each design's best beside the anchors in alternating
    rounds, with one weight matrix and rotating through copies."""
    copies = max(2, math.ceil(120e6 / (n * k / 2)))
    x, weights, ref = weight_gemv.case("int4", m, n, k, torch.bfloat16, "cuda", copies)
    base = anchors(x, weights, k, n)
    found = sweep(n, k, x, *weights[0], ref, deadline)
    print(f"--- int4 M={m} N={n} K={k}: {len(found)} configs right; best 6:", flush=True)
    for us, design, cfg in found[:6]:
        print(f"    {design} {cfg}: {us:.2f} us (graph, one matrix)", flush=True)
    for design in DESIGNS:  # each design's best
        best = next((cfg for _, d, cfg in found if d == design), None)
        if best:
            calls = [make_call(design, best, x, w, s)[0] for w, s in weights]
            base[f"{design} {'x'.join(map(str, best))}"] = (calls[0], calls)
    rows = []
    for mode in ("one", "rotated"):
        got = {name: [] for name in base}
        for _ in range(3):  # alternating rounds: every implementation once a round
            for name, (one, many) in base.items():
                fn = one if mode == "one" else timing.rotating(many)
                got[name].append(1e3 * timing.graph_ms(fn, rep=60))
        cub, i4p = sorted(got["cublas bf16"])[1], sorted(got["torch int4pack"])[1]
        for name, ts in got.items():
            us = sorted(ts)[1]
            nbytes = 2 * n * k if name == "cublas bf16" else n * k // 2
            row = dict(M=m, N=n, K=k, timing=mode, impl=name, us=round(us, 3),
                       weight_tbps=round(nbytes / us / 1e6, 3), vs_cublas=round(cub / us, 3),
                       vs_int4pack=round(i4p / us, 3))  # fmt: skip
            rows.append(row)
            print(
                f"    [{mode}] {name}: {us:.2f} us, weights {row['weight_tbps']:.2f} TB/s, "
                f"x{row['vs_cublas']:.2f} cuBLAS, x{row['vs_int4pack']:.2f} int4pack",
                flush=True,
            )
    return rows


#: The configs `--profile` launches under Nsight Compute (each design's best of the first H200 sweep).
PROFILED = {
    "fma": (8, 64, 4, 3, 2),
    "lop": (128, 16, 4, 4, 8),
    "lop_pf": (128, 16, 4, 1, 8),
    "lop_pf2": (128, 16, 4, 1, 8),
}


def profile(n: int = 14336, k: int = 4096) -> None:
    """Each of PROFILED's kernels and torch's int4pack, three launches each, for `ncu` to count
    (int4_gemv.sh): instructions, issue slots, DRAM throughput, warps waiting on memory."""
    from labkernels.ch07_decode import bench as ch07_bench

    x, [(w, s)], ref = weight_gemv.case("int4", 1, n, k, torch.bfloat16, "cuda")
    calls = {design: make_call(design, cfg, x, w, s)[0] for design, cfg in PROFILED.items()}
    int4pack = ch07_bench.torch_int4(w, s)
    calls["int4pack"] = lambda: int4pack(x)
    for design, call in calls.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        print(f"profiled {design}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--budget", type=float, default=300.0)
    args = parser.parse_args()
    if args.smoke or not on_gpu():
        smoke()
        return 0
    if args.profile:
        profile()
        return 0
    deadline = time.time() + args.budget
    rows = measure_shape(1, 4096, 4096, deadline - args.budget / 2)  # half the sweep budget a shape
    rows += measure_shape(1, 14336, 4096, deadline)
    if args.out:
        versioned = [recording.versioned() | r for r in rows]
        recording.write_csv(os.path.join(args.out, "int4_gemv.csv"), versioned)
    return 0


if __name__ == "__main__":
    sys.exit(main())
