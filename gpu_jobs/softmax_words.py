"""Online softmax, whole rows: the shipped persistent prefetch kernel against one that holds 16-bit rows as
32-bit words (two elements each).

At 2 bytes an element a 32768-wide row's softmax spends about as many instruction slots as its bytes allow:
(H200, sm_90 SASS of the shipped kernel, 32 elements a thread) ~15 instructions an element. Triton keeps each
bfloat16 in its own register (a PRMT to split every pair, then a shift to widen it), and converts the result
back one element at a time. Holding the row as int32 words, a bfloat16 widens to fp32 with one shift or mask,
and `cvt.rn.bf16x2.f32` packs two results in one instruction (inline PTX; `ASM=0` packs in plain Triton):
432 instructions a thread against 496 (counts from `--sass`). Does it move the copy fraction?

    python gpu_jobs/softmax_words.py OUTDIR      # GPU: table on stdout, OUTDIR/results.csv
"""

import os
import sys

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

import torch
import triton
import triton.language as tl

@triton.jit
def _unpack(w, DTYPE: tl.constexpr):
    if DTYPE == tl.bfloat16:  # a bfloat16 is the top half of an fp32: shift or mask, one instruction
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    else:
        lo = w.to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    return lo, hi

@triton.jit
def _pack(lo, hi, DTYPE: tl.constexpr, ASM: tl.constexpr):
    if ASM:
        if DTYPE == tl.bfloat16:
            return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1)
    lo16 = lo.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi16 = hi.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
    return (hi16 << 16) | lo16

@triton.jit
def prefetch_words(out_ptr, x_ptr, n_rows, n_col_vecs, x_row_vecs, out_row_vecs, BLOCK_SIZE: tl.constexpr, VEC: tl.constexpr, ASM: tl.constexpr):
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    n_words, sx, so = n_col_vecs * (VEC // 2), x_row_vecs * (VEC // 2), out_row_vecs * (VEC // 2)
    xw = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    first = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)
    words = tl.arange(0, WORDS)
    in_row = words < n_words
    NEG: tl.constexpr = -8323200 if DTYPE == tl.bfloat16 else -67044352  # two -inf halves
    upcoming = tl.load(xw + first.to(tl.int64) * sx + words, mask=in_row & (first < n_rows), other=NEG)
    for row in range(first, n_rows, step):
        current = upcoming
        nxt = row + step
        upcoming = tl.load(xw + tl.cast(nxt, tl.int64) * sx + words, mask=in_row & (nxt < n_rows), other=NEG)
        lo, hi = _unpack(current, DTYPE)
        row_max = tl.max(tl.maximum(lo, hi), axis=0)
        num_lo = tl.exp2(lo * 1.4426950408889634 - row_max * 1.4426950408889634)
        num_hi = tl.exp2(hi * 1.4426950408889634 - row_max * 1.4426950408889634)
        inv = 1.0 / tl.sum(num_lo + num_hi, axis=0)
        packed = _pack(num_lo * inv, num_hi * inv, DTYPE, ASM)
        tl.store(out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + tl.cast(row, tl.int64) * so + words, packed, mask=in_row)


def launch(x, out, warps, asm):
    from labkernels.ch06_attention.online_softmax import vector_width
    from labkernels.lane import sm_count

    vec = vector_width(x, out)
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    programs = min(rows, sm_count(x.device))
    prefetch_words[(programs,)](out, x, rows, cols // vec, x.stride(0) // vec, out.stride(0) // vec,
                                BLOCK_SIZE=block, VEC=vec, ASM=asm, num_warps=warps)  # fmt: skip


def main() -> int:
    from labkernels.ch06_attention import online_softmax as osm

    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    for rows, cols, dtype in [(4096, 32768, "bfloat16"), (4096, 32768, "float16"), (8192, 16384, "bfloat16"),
                              (2048, 32768, "bfloat16"), (4096, 32000, "bfloat16")]:  # fmt: skip
        case = lagged.Case(rows, cols, dtype)
        case.copy_ms = lagged.bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
        rec.measure(case, "shipped", str(osm.config(rows, cols, getattr(torch, dtype))),
                    lambda c=case: osm.online_softmax(c.x, c.out))  # fmt: skip
        for warps in (16, 32):
            rec.measure(case, "prefetch", f"warps={warps}",
                        lambda c=case, w=warps: osm._launch(c.x, c.out, triton.next_power_of_2(c.cols), w, "prefetch"))
            for asm in (0, 1):
                rec.measure(case, f"words_asm{asm}", f"warps={warps}",
                            lambda c=case, w=warps, a=asm: launch(c.x, c.out, w, a))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
