"""Online softmax: a row softmax for any row width, in one read of a row that fits a program, two otherwise.

ch03's softmax holds a whole row in one program's registers, so rows wider than 32768 are refused. The online
softmax (Milakov & Gimelshein, 2018) walks a row in blocks and keeps two numbers, the running max m and the
running sum l of exp(x - m); a new block with max m_b rescales the sum: l = l * exp(m - m_new) + sum exp(x_b -
m_new). A second walk writes exp(x - m) / l. Traffic: a row that fits one block is read once and written once
(`traffic.softmax`, 2MN; on the GPU persistent programs may load the next row while they reduce this one);
a row walked twice is read twice (3MN; the second read hits L2 if the rows in flight fit there); on the GPU
a wide row can instead be split over programs that hold their chunks in registers and exchange (m, l): 2MN
again (a chunk that waits too long for its partners reads the row itself: slower, never wrong). The same
rescaling, applied to a sum of rows of V, is FlashAttention's inner loop.
Compute is fp32; the result is stored in x's dtype. Backward: dx = y * (g - sum(g * y)).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from labkernels.lane import LANE, on_gpu, require_device, sm_count

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634
BF16_ON_CPU = "bfloat16 is computed wrongly by the Triton interpreter; use float16 or float32 on the CPU lane"
# The widest row held in one program (one read); wider rows are walked in blocks (two reads).
MAX_ONE_BLOCK = 32768
CPU_BLOCK = 16384  # the interpreter pays per program and per block, not per element
TUNE_FROM = 1 << 22  # elements from which the GPU lane times its candidate configs (first call per shape)


def reference(x: torch.Tensor) -> torch.Tensor:
    """Two-pass softmax in plain torch, rows on the last dim: read MN (max), read MN, write MN (exp, sum)."""
    z = x - x.amax(dim=-1, keepdim=True)
    e = torch.exp(z)
    return e / e.sum(dim=-1, keepdim=True)


@triton.jit
def _online_softmax_kernel(
    out_ptr,
    x_ptr,
    n_col_vecs,  # the row length in whole VEC-element vectors
    x_row_vecs,  # x's row stride, in vectors (columns are contiguous)
    out_row_vecs,
    BLOCK_SIZE: tl.constexpr,  # columns per block (a power of two)
    ONE_BLOCK: tl.constexpr,  # the whole row fits one block: read once
    VEC: tl.constexpr,  # lengths and strides are multiples of VEC: the compiler may use 16-byte accesses
):
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    row = tl.program_id(axis=0).to(tl.int64)  # 64-bit: row * stride may pass 2^31
    x_row = x_ptr + row * stride_xm
    out_row = out_ptr + row * stride_om
    cols = tl.arange(0, BLOCK_SIZE)
    if ONE_BLOCK:
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)  # read N
        num = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)
        out = num * (1.0 / tl.sum(num, axis=0))
        tl.store(out_row + cols, out.to(out_ptr.dtype.element_ty), mask=mask)  # write N
    else:
        # Pass 1: running max m and running sum (l) of exp(x - m), block by block.  read N
        # The first block starts the state (tensors from the start: their type stays fixed through the loop).
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        m_safe = tl.where(m == -float("inf"), 0.0, m)  # a row of -inf so far: no NaN from -inf - -inf
        row_sum = tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
        for start in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            row_sum = row_sum * tl.exp2((m - m_safe) * 1.4426950408889634)  # rescale the old sum
            row_sum += tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
            m = m_new
        inv_sum = 1.0 / row_sum
        # Pass 2: exp(x - m) / l.  read N (from L2 if the rows in flight fit there), write N
        for start in range(0, n_cols, BLOCK_SIZE):
            mask = start + cols < n_cols
            x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
            out = tl.exp2((x - m) * 1.4426950408889634) * inv_sum
            tl.store(out_row + start + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _prefetch_rows_kernel(
    out_ptr,
    x_ptr,
    n_rows,
    n_col_vecs,
    x_row_vecs,
    out_row_vecs,
    BLOCK_SIZE: tl.constexpr,  # the whole row (a power of two)
    VEC: tl.constexpr,
):
    """Whole rows, as ONE_BLOCK above, but a few persistent programs walk the rows grid-stride and issue the
    next row's load before they reduce this one. A row of 32768 needs all of an SM's registers (one program
    per SM), so without this the SM's loads stop while it takes the max, the sum and the exponentials and
    stores: at 2 bytes an element those fixed costs are a larger share of a row's time than at 4."""
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    first = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_cols
    upcoming = tl.load(
        x_ptr + first.to(tl.int64) * stride_xm + cols, mask=in_row & (first < n_rows), other=-float("inf")
    )
    for row in range(first, n_rows, step):
        current = upcoming
        # Read N of the next row, issued BEFORE this row's registers are first used: using them waits for
        # their load, and a load issued after that wait would leave one row in flight instead of two.
        nxt = row + step
        upcoming = tl.load(
            x_ptr + tl.cast(nxt, tl.int64) * stride_xm + cols,
            mask=in_row & (nxt < n_rows),
            other=-float("inf"),
        )
        x = current.to(tl.float32)
        num = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)
        out = num * (1.0 / tl.sum(num, axis=0))
        tl.store(
            out_ptr + tl.cast(row, tl.int64) * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=in_row
        )


# Two 16-bit -inf in one 32-bit word: the `other` of a masked load of words.
NEG_INF_WORD = {torch.bfloat16: -8323200, torch.float16: -67044352}  # 0xFF80FF80, 0xFC00FC00


@triton.jit
def _widen(w, DTYPE: tl.constexpr):
    """The two 16-bit elements of each 32-bit word as fp32: (even column, odd column). A bfloat16 is the top
    half of an fp32, so each is one instruction (a shift, a mask); a float16 is one conversion."""
    if DTYPE == tl.bfloat16:
        even = (w << 16).to(tl.float32, bitcast=True)
        odd = (w & -65536).to(tl.float32, bitcast=True)
    else:
        even = w.to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
        odd = (w >> 16).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    return even, odd


@triton.jit
def _narrow(even, odd, DTYPE: tl.constexpr, PTX: tl.constexpr):
    """Round two fp32 results to DTYPE and pack them in one 32-bit word (the even column in the low half).
    With PTX (the GPU lane), one `cvt.rn.bf16x2.f32` (or `.f16x2`) does both; the interpreter has no PTX."""
    if PTX:
        if DTYPE == tl.bfloat16:
            word = tl.inline_asm_elementwise(
                "cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [even, odd], dtype=tl.int32, is_pure=True, pack=1
            )
        else:
            word = tl.inline_asm_elementwise(
                "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,f,f", [even, odd], dtype=tl.int32, is_pure=True, pack=1
            )
    else:
        low = even.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        high = odd.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
        word = (high << 16) | low
    return word


@triton.jit
def _prefetch_words_kernel(
    out_ptr,
    x_ptr,
    n_rows,
    n_col_vecs,
    x_row_vecs,
    out_row_vecs,
    BLOCK_SIZE: tl.constexpr,  # the whole row, in elements (a power of two)
    VEC: tl.constexpr,  # an even number of 16-bit elements: rows are whole 32-bit words
    NEG_INF: tl.constexpr,  # NEG_INF_WORD of the dtype
    PTX: tl.constexpr,
):
    """`_prefetch_rows_kernel` for 16-bit rows, held as 32-bit words of two elements. Triton keeps a 16-bit
    tensor one element a register: splitting the loaded pairs, widening each, then rounding and repacking
    each result cost about 3 instructions an element, and at 2 bytes an element a 32768-wide row spends
    nearly as many instruction slots as its bytes allow (instructions a thread, counted from sm_90 SASS by
    experiments/softmax_sass.py: reference/ch06_softmax_sass.csv). Traffic as a copy: read MN, write MN."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    HALF_VEC: tl.constexpr = VEC // 2  # words a vector
    n_words, x_row_words, out_row_words = (
        n_col_vecs * HALF_VEC,
        x_row_vecs * HALF_VEC,
        out_row_vecs * HALF_VEC,
    )
    x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    out_words = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    first = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)
    words = tl.arange(0, WORDS)
    in_row = words < n_words
    upcoming = tl.load(
        x_words + first.to(tl.int64) * x_row_words + words, mask=in_row & (first < n_rows), other=NEG_INF
    )
    for row in range(first, n_rows, step):
        current = upcoming
        nxt = row + step  # read N of the next row, issued before this row's registers are used
        upcoming = tl.load(
            x_words + tl.cast(nxt, tl.int64) * x_row_words + words,
            mask=in_row & (nxt < n_rows),
            other=NEG_INF,
        )
        even, odd = _widen(current, DTYPE)
        row_max = tl.max(tl.maximum(even, odd), axis=0)
        # (x - m) * log2(e), not x * log2(e) - m * log2(e): that is one FFMA, but m * log2(e) rounds, and for
        # |m| in the thousands its error (about |m| * 2^-24) reaches the exponent of every element.
        num_even = tl.exp2((even - row_max) * 1.4426950408889634)
        num_odd = tl.exp2((odd - row_max) * 1.4426950408889634)
        inv_sum = 1.0 / tl.sum(num_even + num_odd, axis=0)
        out = _narrow(num_even * inv_sum, num_odd * inv_sum, DTYPE, PTX)
        tl.store(out_words + tl.cast(row, tl.int64) * out_row_words + words, out, mask=in_row)  # write N


@triton.jit
def _row_state(x_row, n_cols, WALK: tl.constexpr):
    """The (max, sum of exp(x - max)) of a whole row, walked in blocks of WALK elements as pass 1 of
    `_online_softmax_kernel`: what a chunk that waited too long computes for itself (read N again)."""
    cols = tl.arange(0, WALK)
    x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    row_sum = tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
    for start in range(WALK, n_cols, WALK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        # m - m_safe: exp2(-inf) = 0 while the row so far is -inf. Replacing that m by 0 (an earlier version)
        # gave exp(0 - M) = inf for a very negative M, and 0 * inf = NaN: leading -inf blocks, then x ~ -1000.
        row_sum = row_sum * tl.exp2((m - m_safe) * 1.4426950408889634)
        row_sum += tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
        m = m_new
    return m, row_sum


@triton.jit
def _exchange(stats_ptr, sync_ptr, x_row, n_cols, row, chunk, m, total, CHUNKS: tl.constexpr,
              MAX_SPIN: tl.constexpr, WALK: tl.constexpr):  # fmt: skip
    """A split row's chunk publishes its (m, l) = (max, sum of exp(x - m)), waits for the row's other chunks
    and merges all: M = max m_c, L = sum l_c exp(m_c - M). Returns the factor exp(m - M) / L that turns this
    chunk's exp(x - m) into the softmax. A chunk whose partners have not all arrived after MAX_SPIN polls
    stops waiting and computes (M, L) itself from the row in x (`_row_state`): slower, never wrong."""
    row64 = row.to(tl.int64)
    stat = stats_ptr + (row64 * CHUNKS + chunk) * 2
    tl.store(stat, m)
    tl.store(stat + 1, total)
    tl.debug_barrier()  # the stats are written before the arrival is counted (release)
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="release") + 1
    spins = arrived * 0
    while (arrived < CHUNKS) & (spins < MAX_SPIN):
        arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    if arrived >= CHUNKS:
        # Merge the CHUNKS states of the row: M = max m_c, L = sum l_c * exp(m_c - M).
        idx = tl.arange(0, CHUNKS)
        ms = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2, volatile=True)
        ls = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2 + 1, volatile=True)
        row_max = tl.max(ms, axis=0)
        row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
        row_sum = tl.sum(ls * tl.exp2((ms - row_max) * 1.4426950408889634), axis=0)
    else:  # waited too long: the others may not be running (a busy GPU). Read the row again instead.
        row_max, row_sum = _row_state(x_row, n_cols, WALK)
        row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    # exp(x - M) / L = exp(x - m) * exp(m - M) / L. A chunk of -inf has num = 0 and must give 0, not 0 * inf
    # (exp(0 - M) overflows for a very negative M); a row of -inf (L = 0) still gives NaN, as torch.softmax.
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    rescale = tl.exp2((m_safe - row_max) * 1.4426950408889634) / row_sum
    return tl.where((m == -float("inf")) & (row_sum > 0), 0.0, rescale)


@triton.jit
def _split_row_kernel(
    out_ptr,
    x_ptr,
    stats_ptr,  # (rows, CHUNKS, 2) fp32: each chunk's (max, sum)
    sync_ptr,  # int32 zeros: [0] the ticket counter, [1 + row] the chunks of that row that have arrived
    n_col_vecs,
    x_row_vecs,
    out_row_vecs,
    BLOCK_SIZE: tl.constexpr,  # columns per chunk
    CHUNKS: tl.constexpr,  # programs per row (a power of two)
    VEC: tl.constexpr,
    MAX_SPIN: tl.constexpr,  # stop waiting after this many polls and compute the row's state alone
    WALK: tl.constexpr,  # the block in which a chunk that stopped waiting reads the row again
):
    """A row too wide for one program, split over CHUNKS programs that each hold their chunk in registers:
    read once, write once (2MN). The chunks exchange their (max, sum) through global memory and wait for each
    other. Speed relies on a row's chunks running at once: programs take a ticket in the order they start, so
    when one waits, every program with a lower ticket has started. Correctness relies on nothing: a chunk
    that is still waiting after MAX_SPIN polls (its partners not resident: a busy GPU, MPS, another stream)
    reads the whole row again and computes the row's (max, sum) itself (one more read of the row). Under the
    interpreter programs run one after another: every chunk but a row's last takes that path."""
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    # The ticket is only a number: relaxed, no ordering (acq_rel, the default, measured 0.03-0.04 slower).
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    cols = chunk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=-float("inf")).to(tl.float32)  # read N
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    # exp(x - m) once, kept for the output and rescaled after the exchange: exponentiating every element again
    # after the wait added instructions where, at 2 bytes an element, there are few to spare.
    num = tl.exp2((x - m_safe) * 1.4426950408889634)  # x - m first: exact for close values, whatever |m| is
    total = tl.sum(num, axis=0)
    x_row = x_ptr + row64 * stride_xm
    rescale = _exchange(stats_ptr, sync_ptr, x_row, n_cols, row, chunk, m, total, CHUNKS, MAX_SPIN, WALK)
    out = num * rescale
    tl.store(out_ptr + row64 * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=mask)  # write N


@triton.jit
def _max_bf16_pairs(a, b):
    """Two words of bfloat16 pairs, maxed pair by pair in one `max.bf16x2` (a max does not round)."""
    return tl.inline_asm_elementwise(
        "max.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _exp2_shift(m):
    """(a, b, correction) with exp(x - m) = exp2(x * a - b) * correction, for a chunk's max m: one fma an
    element. b = fl(m * a) is rounded, but its rounding error r = m * a - b is exact in one fma, and
    exp2(-r) is one number for the whole chunk, so no element pays for the rounding. a = log2(e), except
    where m * log2(e) could overflow (|m| >= 2^100): there every x below m is at least 2^93 below it (an
    exponential of 0) and a = 2^-100 keeps it so, while x = m still gives exp2(0)."""
    m_safe = tl.where(m == -float("inf"), 0.0, m)  # a chunk of -inf: every exponential is 0 anyway
    a = tl.where(tl.abs(m_safe) < 1.2676506002282294e30, 1.4426950408889634, 7.888609052210118e-31)
    b = m_safe * a
    return a, b, tl.exp2(-tl.fma(m_safe, a, -b))


@triton.jit
def _widen_again(w, DTYPE: tl.constexpr, PTX: tl.constexpr):
    """`_widen` once more, for the second pass of `_split_lean_kernel` with HOLD. On the GPU through inline
    PTX marked impure, which the compiler may neither merge with the first widening nor move before the wait:
    so nothing computed from the first widening stays in registers across the wait."""
    if not PTX:  # the interpreter: no PTX, and no registers to save
        even, odd = _widen(w, DTYPE)
    elif DTYPE == tl.bfloat16:
        even = tl.inline_asm_elementwise(
            "shl.b32 $0, $1, 16;", "=r,r", [w], dtype=tl.int32, is_pure=False, pack=1
        ).to(tl.float32, bitcast=True)
        odd = tl.inline_asm_elementwise(
            "and.b32 $0, $1, 0xFFFF0000;", "=r,r", [w], dtype=tl.int32, is_pure=False, pack=1
        ).to(tl.float32, bitcast=True)
    else:
        even = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, lo; }",
            "=f,r", [w], dtype=tl.float32, is_pure=False, pack=1,
        )  # fmt: skip
        odd = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $1; cvt.f32.f16 $0, hi; }",
            "=f,r", [w], dtype=tl.float32, is_pure=False, pack=1,
        )  # fmt: skip
    return even, odd


@triton.jit
def _split_lean_kernel(
    out_ptr,
    x_ptr,
    stats_ptr,
    sync_ptr,
    n_col_vecs,
    x_row_vecs,
    out_row_vecs,
    BLOCK_SIZE: tl.constexpr,  # columns per chunk
    CHUNKS: tl.constexpr,
    VEC: tl.constexpr,  # an even number of 16-bit elements: rows are whole 32-bit words
    MAX_SPIN: tl.constexpr,
    WALK: tl.constexpr,
    NEG_INF: tl.constexpr,  # NEG_INF_WORD of the dtype
    PTX: tl.constexpr,
    HOLD: tl.constexpr = False,  # hold the words, not the exponentials, across the wait (mode split_hold)
):
    """`_split_row_kernel` for 16-bit rows with fewer instructions an element (experiments/softmax_lean.py,
    ch06_softmax_lean.csv): the chunk held as 32-bit words of two elements; exp(x - m) as one fma
    (`_exp2_shift`) instead of a subtract and a multiply; in bfloat16 on the GPU, the chunk's max taken on
    the packed pairs before widening. It needs more registers a thread than the split kernel, so it pays at
    4 warps (fewer, larger programs); the tuning times it for bfloat16 rows and keeps it where it is faster
    (rows of a million). Traffic as the split kernel: 2MN.

    HOLD (experiments/softmax_hold.py, ch06_softmax_hold.csv): kept as they are, the exponentials stay in fp32
    across the wait, one register an element, so a 16384-element chunk takes about 166 registers a thread and
    three programs fit an SM. With HOLD only the loaded words wait, half a register an element, and the
    exponentials are computed again after the wait; launched under a register cap (`hold_registers`), five
    programs fit, and while some wait the others keep loading. The price is a second exponential an element;
    the arithmetic is the same, so the result is the same bit for bit."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    HALF_VEC: tl.constexpr = VEC // 2  # words a vector
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    words = chunk * WORDS + tl.arange(0, WORDS)
    mask = words < n_col_vecs * HALF_VEC
    x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (x_row_vecs * HALF_VEC)
    w = tl.load(x_words + words, mask=mask, other=NEG_INF)  # read N
    even, odd = _widen(w, DTYPE)
    if PTX and DTYPE == tl.bfloat16:
        pairs = tl.reduce(w, 0, _max_bf16_pairs)  # half an instruction an element, not one
        pair_even, pair_odd = _widen(pairs, DTYPE)
        m = tl.maximum(pair_even, pair_odd)
    else:
        m = tl.max(tl.maximum(even, odd), axis=0)
    a, b, correction = _exp2_shift(m)
    num_even = tl.exp2(even * a - b)
    num_odd = tl.exp2(odd * a - b)
    total = tl.sum(num_even + num_odd, axis=0) * correction
    x_row = x_ptr + row64 * (x_row_vecs * VEC)
    n_cols = n_col_vecs * VEC
    rescale = _exchange(stats_ptr, sync_ptr, x_row, n_cols, row, chunk, m, total, CHUNKS, MAX_SPIN, WALK)
    rescale = rescale * correction
    if HOLD:  # the words were all that waited: widen and exponentiate them again
        even, odd = _widen_again(w, DTYPE, PTX)
        num_even = tl.exp2(even * a - b)
        num_odd = tl.exp2(odd * a - b)
    out = _narrow(num_even * rescale, num_odd * rescale, DTYPE, PTX)
    out_words = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (out_row_vecs * HALF_VEC)
    tl.store(out_words + words, out, mask=mask)  # write N


def hold_registers(block: int, warps: int) -> int:
    """The register cap of `_split_lean_kernel` with HOLD, in bfloat16: the words a thread holds plus 32.
    Left to itself ptxas allocates for the exponentials' peak (about 166 a thread at 16384 x 4 warps, as
    without HOLD); at this cap it schedules them in fewer registers without spilling (softmax_hold.py
    --registers)."""
    return block // (64 * warps) + 32


MAX_SPIN = 1 << 16  # polls before a waiting chunk computes its row's state itself
WALK = 1024  # elements a step when it does (a few registers a thread beside the chunk it holds)
MAX_CHUNKS = 64  # far fewer than the programs an H200 holds at once (132 SMs, several programs each)


def vector_width(x: torch.Tensor, out: torch.Tensor) -> int:
    """Elements per 16-byte vector that the row length and both row strides are multiples of (else 1)."""
    vec = 16 // x.element_size()
    if x.data_ptr() % 16 or out.data_ptr() % 16:
        return 1
    while vec > 1 and (x.shape[1] % vec or x.stride(0) % vec or out.stride(0) % vec):
        vec //= 2
    return vec


def _candidates(n_cols: int, lean: bool = False) -> list[tuple[int, int, str]]:
    """(BLOCK_SIZE, num_warps, mode) configurations worth timing for a row width; mode is "one_block",
    "prefetch" (whole rows, the next one loading while this one is reduced), "loop" (two reads), "split"
    (a row over several programs, one read) or, with `lean` (bfloat16 rows of whole words), "split_lean"
    (the split kernel with fewer instructions an element; in float16 it measured no faster) and "split_hold"
    (the lean kernel holding its words, not its exponentials, across the wait: more programs an SM)."""
    whole = triton.next_power_of_2(n_cols)
    configs = []
    if whole <= MAX_ONE_BLOCK:
        configs += [
            (whole, w, "one_block") for w in (4, 8, 16, 32) if 32 * w <= whole and whole // (32 * w) <= 128
        ]
    if 8192 < whole <= MAX_ONE_BLOCK:
        configs += [(whole, w, "prefetch") for w in (16, 32)]
    if whole > 2048:
        configs += [(b, w, "loop") for b, w in ((4096, 8), (8192, 8), (8192, 16)) if b < whole]
    if whole > 8192:
        configs += [
            (b, w, "split")
            for b, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8))
            if 2 <= whole // b <= MAX_CHUNKS
        ]
    if whole > 8192 and lean:
        # 4 warps: the lean kernel's registers fit fewer 256-thread programs an SM (ch06_softmax_lean.csv)
        configs += [(b, 4, "split_lean") for b in (8192, 16384) if 2 <= whole // b <= MAX_CHUNKS]
        # the hold kernel's best chunks at 1024-4096 rows and at rows of a million (ch06_softmax_hold.csv)
        configs += [(b, 4, "split_hold") for b in (16384, 32768) if 2 <= whole // b <= MAX_CHUNKS]
    return configs or [(whole, 4, "one_block")]


def _launch(x, out, block: int, warps: int, mode: str, max_spin: int = MAX_SPIN) -> None:
    n_rows, n_cols = x.shape
    vec = vector_width(x, out)
    args = (n_cols // vec, x.stride(0) // vec, out.stride(0) // vec)
    if mode == "prefetch":
        programs = min(n_rows, sm_count(x.device))  # one program per SM: a 32768-wide row fills its registers
        if x.element_size() == 2 and vec % 2 == 0:  # 16-bit rows of whole 32-bit words
            _prefetch_words_kernel[(programs,)](
                out, x, n_rows, *args, BLOCK_SIZE=block, VEC=vec, NEG_INF=NEG_INF_WORD[x.dtype], PTX=on_gpu(),
                num_warps=warps,
            )  # fmt: skip
        else:
            _prefetch_rows_kernel[(programs,)](
                out, x, n_rows, *args, BLOCK_SIZE=block, VEC=vec, num_warps=warps
            )
    elif mode in ("split", "split_lean", "split_hold"):
        chunks = triton.next_power_of_2(triton.cdiv(n_cols, block))
        stats = torch.empty(n_rows, chunks, 2, device=x.device, dtype=torch.float32)
        sync = torch.zeros(1 + n_rows, device=x.device, dtype=torch.int32)  # ticket, then arrivals per row
        common = dict(BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec, MAX_SPIN=max_spin, WALK=min(block, WALK),
                      num_warps=warps)  # fmt: skip
        # The tuning chose split_lean or split_hold on contiguous rows; a view whose rows are not whole 32-bit
        # words (an odd row stride, an odd offset) gets the plain split kernel at the same block and warps.
        if mode != "split" and x.element_size() == 2 and vec % 2 == 0:
            hold = mode == "split_hold"
            # The cap is bfloat16's: float16's conversions need more registers and spill under it (the tuning
            # offers split_hold for bfloat16 only).
            cap = {"maxnreg": hold_registers(block, warps)} if hold and x.dtype == torch.bfloat16 else {}
            _split_lean_kernel[(n_rows * chunks,)](
                out, x, stats, sync, *args, NEG_INF=NEG_INF_WORD[x.dtype], PTX=on_gpu(), HOLD=hold, **cap,
                **common,
            )  # fmt: skip
        else:
            _split_row_kernel[(n_rows * chunks,)](out, x, stats, sync, *args, **common)
    else:
        _online_softmax_kernel[(n_rows,)](
            out, x, *args, BLOCK_SIZE=block, ONE_BLOCK=mode == "one_block", VEC=vec, num_warps=warps
        )


@functools.lru_cache(maxsize=256)
def _tuned(n_rows: int, n_cols: int, dtype: torch.dtype) -> tuple[int, int, str]:
    """Times each candidate once per (shape, dtype) on the GPU and keeps the fastest (a small autotune).
    Every mode gives the softmax whatever the GPU runs beside it (a split chunk that waits too long computes
    its row's state itself); a candidate whose output still differs from torch's is dropped all the same."""
    from labkernels.timing import autotune_bench

    x = torch.randn(n_rows, n_cols, device="cuda").to(dtype)
    out = torch.empty_like(x)
    expected = torch.softmax(x.float(), dim=1)
    atol, rtol = (1e-6, 1e-4) if dtype == torch.float32 else (1e-2, 2e-2)
    times = {}
    lean = dtype == torch.bfloat16 and vector_width(x, out) % 2 == 0
    for c in _candidates(n_cols, lean):
        out.fill_(float("nan"))
        ms = autotune_bench(lambda c=c: _launch(x, out, *c), quantiles=(0.5,))
        if torch.allclose(out.float(), expected, atol=atol, rtol=rtol):
            times[c] = ms
    return min(times, key=times.get)


def config(n_rows: int, n_cols: int, dtype: torch.dtype) -> tuple[int, int, str]:
    """The (BLOCK_SIZE, num_warps, mode) that online_softmax launches for this shape."""
    if LANE != "gpu":
        block = min(triton.next_power_of_2(n_cols), CPU_BLOCK)
        return block, 4, "one_block" if block >= n_cols else "loop"
    if n_rows * n_cols < TUNE_FROM:  # too small to be worth timing configs: a rule of thumb
        whole = triton.next_power_of_2(n_cols)
        if whole <= MAX_ONE_BLOCK:
            return whole, max(4, min(16, whole // 1024)), "one_block"
        # A few wide rows: split them (one read, and programs enough to fill the GPU). The loop has one
        # program a row: 37 rows would keep 37 SMs busy.
        # 37 x 100008 on the H200: split 0.76-0.80 of copy (ch06_softmax_slots), loop 0.37 (..._cluster)
        for block, warps in ((16384, 8), (8192, 4)):
            if whole // block <= MAX_CHUNKS:
                return block, warps, "split"
        return 8192, 8, "loop"
    return _tuned(n_rows, n_cols, dtype)


def _check(x: torch.Tensor, out: torch.Tensor | None) -> None:
    require_device(x, "online_softmax: x")
    if x.dtype not in DTYPES:
        raise TypeError(f"online_softmax: x has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"online_softmax: {BF16_ON_CPU}")
    if x.dim() != 2:
        raise ValueError(f"online_softmax: x must be 2-D (rows, cols), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"online_softmax: x is empty, shape {tuple(x.shape)}")
    if x.stride(1) != 1:
        raise ValueError(f"online_softmax: x's columns must be contiguous (strides {x.stride()})")
    if out is None:
        return
    require_device(out, "online_softmax: out")
    if out.dtype != x.dtype or out.shape != x.shape:
        raise ValueError(
            f"online_softmax: out must be {x.dtype} {tuple(x.shape)}, got {out.dtype} {tuple(out.shape)}"
        )
    if out.stride(1) != 1:
        raise ValueError(f"online_softmax: out's columns must be contiguous (strides {out.stride()})")
    if out.shape[0] > 1 and out.stride(0) < out.shape[1]:
        raise ValueError(f"online_softmax: out's rows overlap each other (strides {out.stride()}): a view?")
    if _overlaps(x, out):
        raise ValueError("online_softmax: out overlaps x (the second pass re-reads x after out is written)")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    def span(t):
        start = t.data_ptr()
        return start, start + ((t.shape[0] - 1) * t.stride(0) + t.shape[1]) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a0 < b1 and b0 < a1


def _forward(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    _check(x, out)
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    _launch(x, out, *config(*x.shape, x.dtype))
    return out


# torch.library: the op torch.compile traces without a graph break (the fake gives the output's shape), with
# its backward in torch ops, which compile traces too.
@torch.library.custom_op("labkernels::ch06_online_softmax", mutates_args=())
def _softmax_op(x: torch.Tensor) -> torch.Tensor:
    return _forward(x)


@_softmax_op.register_fake
def _(x):
    _check(x, None)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    g, yf = grad.float(), y.float()
    return (yf * (g - (g * yf).sum(dim=1, keepdim=True))).to(y.dtype)  # dx = y * (g - <g, y>)


_softmax_op.register_autograd(_softmax_backward, setup_context=_setup_context)


def online_softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Row softmax of a 2-D (rows, cols) tensor of any width; rows may be strided, columns contiguous.

    `out` (same shape and dtype, not overlapping x) receives the result. Inputs that require grad get a
    backward (through torch.autograd; `out` is then not accepted). The op is
    `torch.ops.labkernels.ch06_online_softmax`, which torch.compile traces without a graph break."""
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        if out is not None:
            raise ValueError(
                "online_softmax: out= is not supported when x requires grad (autograd allocates)"
            )
        _check(x, None)
        return _softmax_op(x)
    if torch.compiler.is_compiling():  # the op; out= a copy of its result (so overlap cannot hurt)
        _check(x, None)
        if out is not None and (out.dtype != x.dtype or out.shape != x.shape):
            raise ValueError(
                f"online_softmax: out must be {x.dtype} {tuple(x.shape)}, got {out.dtype} {tuple(out.shape)}"
            )
        return _softmax_op(x) if out is None else out.copy_(_softmax_op(x))
    return _forward(x, out)
