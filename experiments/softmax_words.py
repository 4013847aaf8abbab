"""Online softmax with 16-bit rows held as 32-bit words (two elements each), against one element a register.

At 2 bytes an element a wide row's softmax spends about as many instruction slots as its bytes allow. Triton
keeps each bfloat16 in its own register: it splits the loaded pairs (PRMT), widens each (a shift), and rounds
and repacks each result. Held as int32 words, a bfloat16 widens with one shift or mask and
`cvt.rn.bf16x2.f32` packs two results in one instruction (labkernels' `_widen`, `_narrow`). Instructions a
thread, counted from sm_90 SASS: experiments/softmax_sass.py (labkernels/reference/ch06_softmax_sass.csv).

  prefetch  whole rows (labkernels' `_prefetch_rows_kernel` against `_prefetch_words_kernel`, 16 and 32 warps)
  split     a row over several programs exchanging (max, sum) (the shipped `_split_row_kernel` against
            `split_words_kernel` below, which holds its chunk as words), at the shipped split configs

Every output is checked against the fp64 reference, poisoned first.

    python experiments/softmax_words.py OUTDIR      # GPU: table on stdout, OUTDIR/results.csv
"""

import os
import sys

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

import torch
import triton
import triton.language as tl

from labkernels.ch06_attention import online_softmax as osm


@triton.jit
def split_words_kernel(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                       BLOCK_SIZE: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, MAX_SPIN: tl.constexpr,
                       NEG_INF: tl.constexpr, PTX: tl.constexpr):  # fmt: skip
    """labkernels' `_split_row_kernel` with the chunk loaded, widened and stored as 32-bit words."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    HALF_VEC: tl.constexpr = VEC // 2
    n_words, x_row_words, out_row_words = n_col_vecs * HALF_VEC, x_row_vecs * HALF_VEC, out_row_vecs * HALF_VEC
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    words = chunk * WORDS + tl.arange(0, WORDS)
    mask = words < n_words
    w = tl.load(x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * x_row_words + words, mask=mask,
                other=NEG_INF)  # fmt: skip
    even, odd = osm._widen(w, DTYPE)
    m = tl.max(tl.maximum(even, odd), axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    num_even = tl.exp2((even - m_safe) * 1.4426950408889634)
    num_odd = tl.exp2((odd - m_safe) * 1.4426950408889634)
    total = tl.sum(num_even + num_odd, axis=0)
    rescale = osm._exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN)
    out = osm._narrow(num_even * rescale, num_odd * rescale, DTYPE, PTX)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * out_row_words + words, out, mask=mask)


def launch_split_words(x, out, block, warps):
    vec = osm.vector_width(x, out)
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    split_words_kernel[(rows * chunks,)](out, x, stats, sync, cols // vec, x.stride(0) // vec,
                                         out.stride(0) // vec, BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec,
                                         MAX_SPIN=osm.MAX_SPIN, NEG_INF=osm.NEG_INF_WORD[x.dtype], PTX=True,
                                         num_warps=warps)  # fmt: skip


def launch_prefetch(x, out, warps, words):
    from labkernels.lane import sm_count

    vec = osm.vector_width(x, out)
    rows, cols = x.shape
    args = (out, x, rows, cols // vec, x.stride(0) // vec, out.stride(0) // vec)
    grid = (min(rows, sm_count(x.device)),)
    block = triton.next_power_of_2(cols)
    if words:
        osm._prefetch_words_kernel[grid](*args, BLOCK_SIZE=block, VEC=vec, NEG_INF=osm.NEG_INF_WORD[x.dtype],
                                         PTX=True, num_warps=warps)  # fmt: skip
    else:
        osm._prefetch_rows_kernel[grid](*args, BLOCK_SIZE=block, VEC=vec, num_warps=warps)


def main() -> int:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    for rows, cols, dtype in [(4096, 32768, "bfloat16"), (4096, 32768, "float16"), (2048, 32768, "bfloat16"),
                              (1024, 262144, "bfloat16"), (1024, 262144, "float16"),
                              (256, 1 << 20, "bfloat16")]:  # fmt: skip
        case = lagged.Case(rows, cols, dtype)
        case.copy_ms = lagged.bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
        rec.measure(case, "shipped", str(osm.config(rows, cols, getattr(torch, dtype))),
                    lambda c=case: osm.online_softmax(c.x, c.out))  # fmt: skip
        if cols <= osm.MAX_ONE_BLOCK:
            for warps in (16, 32):
                for words in (False, True):
                    rec.measure(case, "prefetch_words" if words else "prefetch", f"warps={warps}",
                                lambda c=case, w=warps, b=words: launch_prefetch(c.x, c.out, w, b))  # fmt: skip
        for block, warps, mode in osm._candidates(cols):
            if mode != "split":
                continue
            rec.measure(case, "split", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: osm._launch(c.x, c.out, b, w, "split"))  # fmt: skip
            rec.measure(case, "split_words", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: launch_split_words(c.x, c.out, b, w))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
