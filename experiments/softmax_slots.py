"""Online softmax, split rows: an exchange in fewer round trips to L2 than the shipped one.

The shipped split kernel (labkernels' `_split_row_kernel`, its exchange in `_exchange`) makes four round
trips to L2 after its chunk is loaded: it stores its (m, l), counts its arrival with a release atomic (which
waits for the stores), polls the row's count with acquire atomics, and then loads the row's (m, l) pairs. Here
each chunk's (m, l) travels as ONE 64-bit word, written with one relaxed atomic exchange into the row's slot
for that chunk (the slots start as all-ones, a value no (m, l) pair takes except a NaN max with an all-ones
payload, whose row is NaN anyway), and a waiting chunk polls the row's slots themselves: when none is
all-ones, the words it loaded are the data. No count, no fence, no second load. The ticket counter is the
same buffer's first word, so one fill prepares a launch.

    python experiments/softmax_slots.py OUTDIR      # GPU: table on stdout, OUTDIR/results.csv
"""

import os
import sys

import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

import torch
import triton
import triton.language as tl

from labkernels.ch06_attention import online_softmax as osm


@triton.jit
def _exchange_slots(slots_ptr, row, chunk, m, total, CHUNKS: tl.constexpr, MAX_SPIN: tl.constexpr):
    """Publish (m, l) as one word in the row's slot for this chunk; poll the row's slots until all are written;
    merge. Returns exp(m - M) / L (NaN if the chunk gave up waiting)."""
    row_slots = slots_ptr + 1 + row.to(tl.int64) * CHUNKS
    word = (m.to(tl.uint32, bitcast=True).to(tl.int64) << 32) | total.to(tl.uint32, bitcast=True).to(tl.int64)
    tl.atomic_xchg(row_slots + chunk, word, sem="relaxed")
    idx = tl.arange(0, CHUNKS)
    words = tl.load(row_slots + idx, volatile=True)
    spins = 0
    while (tl.sum((words == -1).to(tl.int32), axis=0) > 0) & (spins < MAX_SPIN):
        words = tl.load(row_slots + idx, volatile=True)
        spins += 1
    complete = tl.sum((words == -1).to(tl.int32), axis=0) == 0
    ms = (words >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    ls = words.to(tl.int32).to(tl.float32, bitcast=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(ls * tl.exp2((ms - row_max) * 1.4426950408889634), axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    rescale = tl.exp2((m_safe - row_max) * 1.4426950408889634) / row_sum
    rescale = tl.where((m == -float("inf")) & (row_sum > 0), 0.0, rescale)
    return tl.where(complete, rescale, float("nan"))


@triton.jit
def split_slots_kernel(out_ptr, x_ptr, slots_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                       BLOCK_SIZE: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                       MAX_SPIN: tl.constexpr):  # fmt: skip
    """labkernels' `_split_row_kernel` with `_exchange_slots` for its exchange."""
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    ticket = tl.atomic_add(slots_ptr, 1, sem="relaxed") + 1  # the counter starts at -1
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    cols = chunk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=-float("inf")).to(tl.float32)  # read N
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    num = tl.exp2((x - m_safe) * 1.4426950408889634)
    rescale = _exchange_slots(slots_ptr, row, chunk, m, tl.sum(num, axis=0), CHUNKS, MAX_SPIN)
    tl.store(out_ptr + row64 * stride_om + cols, (num * rescale).to(out_ptr.dtype.element_ty), mask=mask)


def launch_slots(x, out, block, warps):
    vec = osm.vector_width(x, out)
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    slots = torch.full((1 + rows * chunks,), -1, device=x.device, dtype=torch.int64)  # one fill
    split_slots_kernel[(rows * chunks,)](out, x, slots, cols // vec, x.stride(0) // vec, out.stride(0) // vec,
                                         BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec, MAX_SPIN=osm.MAX_SPIN,
                                         num_warps=warps)  # fmt: skip


def main() -> int:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    for rows, cols, dtype in [(1024, 262144, "bfloat16"), (1024, 262144, "float32"), (1024, 262144, "float16"),
                              (4096, 32768, "bfloat16"), (256, 1 << 20, "bfloat16"), (37, 100008, "bfloat16")]:  # fmt: skip
        case = lagged.Case(rows, cols, dtype)
        if rows == 37:  # chunks of -inf, and a very negative row
            case.x[1, 3 * 16384 :] = float("-inf")
            case.x[3] -= 1000.0
            case.ref = torch.softmax(case.x.double(), dim=1)
        case.copy_ms = lagged.bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
        rec.measure(case, "shipped", str(osm.config(rows, cols, getattr(torch, dtype))),
                    lambda c=case: osm.online_softmax(c.x, c.out))  # fmt: skip
        configs = [(b, w) for b, w, mode in osm._candidates(cols) if mode == "split"] + [(16384, 16), (32768, 16)]
        for block, warps in configs:
            if not 2 <= triton.cdiv(cols, block) <= osm.MAX_CHUNKS:
                continue
            rec.measure(case, "split", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: osm._launch(c.x, c.out, b, w, "split"))  # fmt: skip
            rec.measure(case, "split_slots", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: launch_slots(c.x, c.out, b, w))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
