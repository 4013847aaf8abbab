"""Online softmax's split kernel, persistent, loading its next chunk before it waits (experiment, bfloat16).

In the shipped split kernels (`split_lean`, `split_hold`) a program loads one chunk of a row, publishes the
chunk's (max, sum), waits for the row's other chunks and writes. While it waits it holds its chunk and has no
load in flight. Without the wait the same kernel runs at 0.975 of a copy (ch06_softmax_exchange.csv,
`relaxed_none`); with it, at 0.874 (ch06_online_softmax.csv). The question here: is the gap the wait itself,
or what a waiting program keeps out of the memory system? (`split_persistent_overlap`, in
ch06_softmax_variants.csv, asked the same of the first split kernel and lost; this asks it again with the hold
kernel's arithmetic.)

Here the programs are persistent and take chunks (tickets) in row order. Each loop iteration holds two
chunks: it takes the next ticket, loads that chunk and publishes its (max, sum), and only *then* waits for
the row of the chunk it already holds. By then that row's other chunks have had a whole chunk's load to
publish, so the wait is usually over before it starts. Then the held chunk is exponentiated again and
written. Two exponentials an element, as `split_hold`; two chunks of words held a program.

No deadlock: every program publishes every chunk it holds before it waits. So the row of the smallest chunk
held anywhere is complete, unless all held chunks lie in that row and its last chunk is not taken. That needs
2 x programs < chunks a row; the grid here is many times larger.

    python experiments/softmax_pipelined.py OUTDIR        # GPU: table on stdout, OUTDIR/results.csv
    python experiments/softmax_pipelined.py --registers   # no GPU: registers and programs an SM, for sm_90
"""

import os
import sys

REGISTERS_ONLY = __name__ == "__main__" and "--registers" in sys.argv
if REGISTERS_ONLY:  # compile for sm_90 on a machine without a GPU: no interpreter
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    torch.cuda.is_available = lambda: True

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from labkernels.ch06_attention import online_softmax as osm  # noqa: E402

# (BLOCK_SIZE, num_warps, maxnreg): a thread holds 2 x BLOCK_SIZE / (64 x warps) words
CONFIGS = [(8192, 4, None), (8192, 4, 104), (8192, 2, None), (8192, 2, 168), (4096, 2, None), (4096, 2, 104),
           (4096, 1, 168), (16384, 4, None), (16384, 4, 168), (16384, 8, 104)]  # fmt: skip
HOLD_CONFIGS = [(16384, 4, 96), (16384, 4, 80)]  # the shipped split_hold's, beside it


@triton.jit
def _load_chunk(x_words, ticket, total_tickets, n_words, x_row_words, WORDS: tl.constexpr,
                CHUNKS: tl.constexpr, NEG_INF: tl.constexpr):  # fmt: skip
    """The words of chunk `ticket` (every word NEG_INF past the row's end or past the last ticket)."""
    row64 = (ticket // CHUNKS).to(tl.int64)
    words = (ticket % CHUNKS) * WORDS + tl.arange(0, WORDS)
    mask = (words < n_words) & (ticket < total_tickets)
    return tl.load(x_words + row64 * x_row_words + words, mask=mask, other=NEG_INF)  # read N


@triton.jit
def _chunk_state(w):
    """(m, a, b, correction, total) of a chunk of bfloat16 words: its max, `_exp2_shift`'s factors and the
    sum of exp(x - m): the first exponentials."""
    pairs = tl.reduce(w, 0, osm._max_bf16_pairs)
    pair_even, pair_odd = osm._widen(pairs, tl.bfloat16)
    m = tl.maximum(pair_even, pair_odd)
    a, b, correction = osm._exp2_shift(m)
    even, odd = osm._widen(w, tl.bfloat16)
    total = tl.sum(tl.exp2(even * a - b) + tl.exp2(odd * a - b), axis=0) * correction
    return m, a, b, correction, total


@triton.jit
def _publish(stats_ptr, sync_ptr, ticket, m, total, CHUNKS: tl.constexpr):
    """`osm._exchange`'s first half: the chunk's (m, l) stored, then its arrival counted (release)."""
    row = ticket // CHUNKS
    stat = stats_ptr + (row.to(tl.int64) * CHUNKS + ticket % CHUNKS) * 2
    tl.store(stat, m)
    tl.store(stat + 1, total)
    tl.debug_barrier()
    tl.atomic_add(sync_ptr + 1 + row, 1, sem="release")


@triton.jit
def _wait_and_merge(stats_ptr, sync_ptr, ticket, m, CHUNKS: tl.constexpr, MAX_SPIN: tl.constexpr):
    """`osm._exchange`'s second half: wait for the row's chunks, merge, return exp(m - M) / L (NaN if the
    wait gave up)."""
    row = ticket // CHUNKS
    row64 = row.to(tl.int64)
    arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
    spins = arrived * 0
    while (arrived < CHUNKS) & (spins < MAX_SPIN):
        arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    idx = tl.arange(0, CHUNKS)
    ms = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2, volatile=True)
    ls = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2 + 1, volatile=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(ls * tl.exp2((ms - row_max) * 1.4426950408889634), axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    rescale = tl.exp2((m_safe - row_max) * 1.4426950408889634) / row_sum
    rescale = tl.where((m == -float("inf")) & (row_sum > 0), 0.0, rescale)
    return tl.where(arrived >= CHUNKS, rescale, float("nan"))


@triton.jit
def pipelined_kernel(out_ptr, x_ptr, stats_ptr, sync_ptr, total_tickets, n_col_vecs, x_row_vecs, out_row_vecs,
                     BLOCK_SIZE: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                     MAX_SPIN: tl.constexpr, NEG_INF: tl.constexpr):  # fmt: skip
    """Persistent: each iteration loads and publishes chunk `nxt`, then waits for the row of chunk `ticket`
    (held since the iteration before) and writes it. Traffic as the split kernel: read MN, write MN."""
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    HALF_VEC: tl.constexpr = VEC // 2
    n_words = n_col_vecs * HALF_VEC
    x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    out_words = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    w = _load_chunk(x_words, ticket, total_tickets, n_words, x_row_vecs * HALF_VEC, WORDS, CHUNKS, NEG_INF)
    m, a, b, correction, total = _chunk_state(w)
    if ticket < total_tickets:
        _publish(stats_ptr, sync_ptr, ticket, m, total, CHUNKS)
    while ticket < total_tickets:
        nxt = tl.atomic_add(sync_ptr, 1, sem="relaxed")
        w_next = _load_chunk(x_words, nxt, total_tickets, n_words, x_row_vecs * HALF_VEC, WORDS, CHUNKS,
                             NEG_INF)  # fmt: skip
        m_next, a_next, b_next, correction_next, total_next = _chunk_state(w_next)
        if nxt < total_tickets:  # published before this program waits: nobody waits on a held chunk
            _publish(stats_ptr, sync_ptr, nxt, m_next, total_next, CHUNKS)
        rescale = _wait_and_merge(stats_ptr, sync_ptr, ticket, m, CHUNKS, MAX_SPIN) * correction
        even, odd = osm._widen_again(w, tl.bfloat16, True)
        out = osm._narrow(tl.exp2(even * a - b) * rescale, tl.exp2(odd * a - b) * rescale, tl.bfloat16, True)
        row64 = (ticket // CHUNKS).to(tl.int64)
        words = (ticket % CHUNKS) * WORDS + tl.arange(0, WORDS)
        tl.store(out_words + row64 * (out_row_vecs * HALF_VEC) + words, out, mask=words < n_words)  # write N
        ticket, w, m, a, b, correction = nxt, w_next, m_next, a_next, b_next, correction_next


_programs: dict[tuple, int] = {}


def programs_per_sm(regs: int, warps: int) -> int:
    """Programs an H200 SM holds by registers (64K a SM, allocated 8 a thread at a time, 64 warps at most)."""
    return min(65536 // ((regs + 7) // 8 * 8 * 32 * warps), 64 // warps, 32)


def launch(x, out, block, warps, maxnreg=None, per_sm=None):
    """One persistent launch: SMs x programs-an-SM programs (by the compiled kernel's registers, found on the
    first call). Returns the compiled kernel."""
    vec = osm.vector_width(x, out)
    if x.dtype != torch.bfloat16 or vec % 2:
        raise ValueError("pipelined_kernel: bfloat16 rows of whole 32-bit words only")
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    cap = {} if maxnreg is None else {"maxnreg": maxnreg}
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    key = (block, warps, maxnreg)
    grid = sms * (per_sm or _programs.get(key, 1))
    compiled = pipelined_kernel[(grid,)](out, x, stats, sync, rows * chunks, cols // vec, x.stride(0) // vec,
                                         out.stride(0) // vec, BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec,
                                         MAX_SPIN=osm.MAX_SPIN, NEG_INF=osm.NEG_INF_WORD[x.dtype],
                                         num_warps=warps, **cap)  # fmt: skip
    _programs.setdefault(key, programs_per_sm(compiled.n_regs, warps))
    return compiled


def registers() -> None:
    """Registers a thread, spills and programs an SM of each config, compiled for sm_90."""
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90 import compile_sm90, ptxas_info

    sig = {"out_ptr": "*bf16", "x_ptr": "*bf16", "stats_ptr": "*fp32", "sync_ptr": "*i32"}
    sig |= {"total_tickets": "i32", "n_col_vecs": "i32", "x_row_vecs": "i32", "out_row_vecs": "i32"}
    for block, warps, _ in CONFIGS:
        consts = {"BLOCK_SIZE": block, "CHUNKS": 32, "VEC": 8, "MAX_SPIN": osm.MAX_SPIN,
                  "NEG_INF": osm.NEG_INF_WORD[torch.bfloat16]}  # fmt: skip
        info = ptxas_info(compile_sm90(pipelined_kernel, sig, consts, warps))
        regs = int(info.split("Used ")[1].split(" registers")[0])
        spill = "spill" in info and " 0 bytes spill stores" not in info
        print(f"block={block:6} warps={warps:2} regs={regs:3} programs/SM={programs_per_sm(regs, warps)}"
              f"{' SPILLS' if spill else ''}", flush=True)  # fmt: skip


def main() -> int:
    if REGISTERS_ONLY:
        registers()
        return 0
    sys.path.insert(0, os.path.dirname(__file__))
    import softmax_hold as hold
    import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    for rows, cols in [(1024, 262144), (256, 1 << 20), (4096, 32768)]:
        case = lagged.case_beside_shipped(rec, rows, cols, "bfloat16")
        for block, warps, cap in HOLD_CONFIGS:
            rec.measure(case, "hold", f"block={block} warps={warps} maxnreg={cap}",
                        lambda c=case, b=block, w=warps, r=cap: hold.launch(c.x, c.out, b, w, r))  # fmt: skip
        for block, warps, cap in CONFIGS:
            if not 2 <= cols // block <= osm.MAX_CHUNKS:
                continue
            compiled = launch(case.x, case.out, block, warps, cap)
            per_sm = _programs[(block, warps, cap)]
            for programs in sorted({per_sm, max(1, per_sm - 1)}):  # a program fewer: room for the stats
                config = (f"block={block} warps={warps} maxnreg={cap} regs={compiled.n_regs} "
                          f"spills={compiled.n_spills} programs/SM={programs}")  # fmt: skip
                call = lambda c=case, b=block, w=warps, r=cap, p=programs: launch(c.x, c.out, b, w, r, p)  # noqa: E731
                rec.measure(case, "pipelined", config, call)
    rec.print_best()
    return 0


if __name__ == "__main__":
    sys.exit(main())
