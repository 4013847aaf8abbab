"""Online softmax, split rows (issue 15): what the split kernel's exchange costs, and cheaper ways to wait.

The shipped split kernel (labkernels.ch06_attention.online_softmax._split_row_kernel) takes a ticket with one
atomic on a single global counter, publishes its chunk's (max, sum), counts its arrival, and polls the row's
arrival count with an atomic read-modify-write until every chunk of the row has arrived. Variants here, all
of one kernel with constexpr switches, timed against a same-size copy in the same run:
- POLL="rmw": the shipped wait (atomic_add(ptr, 0, acquire) per poll: compiled to one ld.acquire.gpu);
- POLL="load": poll with a volatile load (no read-modify-write at the L2), then one acquire atomic;
- POLL="rmw_sleep" / "load_sleep": the same with a nanosleep between polls (less L2 traffic while waiting);
- POLL="none": no exchange at all (wrong result): the ticket's cost alone, with TICKET=1;
- TICKET=1: the shipped ticket (acq_rel); TICKET=2 a relaxed one (it is only a number);
- TICKET=0: program-id order instead of a ticket (not safe: CUDA does not promise that order), for contrast.
Usage: python experiments/softmax_exchange.py OUTDIR [--smoke]
       python experiments/softmax_exchange.py --registers  (no GPU needed: ptxas's registers a thread, sm_90)
"""

import csv
import os
import sys
import time

REGISTERS_ONLY = __name__ == "__main__" and "--registers" in sys.argv
if REGISTERS_ONLY:  # compile for the GPU on any machine: no interpreter, so no labkernels lane
    os.environ.pop("TRITON_INTERPRET", None)
else:
    import labkernels  # noqa: F401  (first: it sets the lane before triton is imported)
import torch
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _nanosleep(ns):
    return tl.inline_asm_elementwise(
        "nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [ns], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS: tl.constexpr, MAX_SPIN: tl.constexpr,
              POLL: tl.constexpr = "rmw", SLEEP_NS: tl.constexpr = 0):
    """Publish this chunk's (max m, sum of exp(x - m)), count it in, wait for the row's other chunks (at most
    MAX_SPIN polls), merge. Returns (row max, 1 / row sum, NaN instead if the wait gave up)."""
    row64 = row.to(tl.int64)
    stat = stats_ptr + (row64 * CHUNKS + chunk) * 2
    tl.store(stat, m)
    tl.store(stat + 1, total)
    tl.debug_barrier()
    counter = sync_ptr + 1 + row
    arrived = tl.atomic_add(counter, 1, sem="release") + 1
    spins = arrived * 0
    while (arrived < CHUNKS) & (spins < MAX_SPIN):
        if POLL == "rmw" or POLL == "rmw_sleep":
            arrived = tl.atomic_add(counter, 0, sem="acquire")
        else:
            arrived = tl.load(counter, volatile=True)
        if POLL == "rmw_sleep" or POLL == "load_sleep":
            arrived += _nanosleep(SLEEP_NS)
        spins += 1
    if POLL == "load" or POLL == "load_sleep":
        arrived = tl.atomic_add(counter, 0, sem="acquire")  # one acquire: the stats are visible after it
    tl.debug_barrier()
    idx = tl.arange(0, CHUNKS)
    ms = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2, volatile=True)
    ls = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2 + 1, volatile=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    inv = 1.0 / tl.sum(ls * tl.exp2((ms - row_max) * LOG2E), axis=0)
    return row_max, tl.where(arrived >= CHUNKS, inv, float("nan"))


@triton.jit
def _take_ticket(sync_ptr, CHUNKS: tl.constexpr, TICKET: tl.constexpr = 2):
    """(row, chunk) of this program: by a ticket (1: acq_rel, as shipped; 2: relaxed) or program id (0)."""
    if TICKET == 1:
        ticket = tl.atomic_add(sync_ptr, 1)
    elif TICKET == 2:
        ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")  # a number only: no ordering needed
    else:
        ticket = tl.program_id(0)
    return ticket // CHUNKS, ticket % CHUNKS


@triton.jit
def split_x(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
            BLOCK: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, MAX_SPIN: tl.constexpr,
            TICKET: tl.constexpr, POLL: tl.constexpr, SLEEP_NS: tl.constexpr, PACKED: tl.constexpr):
    """The shipped split kernel with switches (module docstring). PACKED: convert the 16-bit chunk to fp32
    again after the wait, so that only the 16-bit values need to stay live across it."""
    n_cols, sx, so = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    row, chunk = _take_ticket(sync_ptr, CHUNKS, TICKET)
    row64 = row.to(tl.int64)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    raw = tl.load(x_ptr + row64 * sx + cols, mask=mask, other=-float("inf"))
    x = raw.to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = tl.sum(tl.exp2((x - m_safe) * LOG2E), axis=0)
    if POLL == "none":  # no exchange: each chunk normalised on its own (a wrong result), the ticket's cost
        row_max = m_safe
        inv = 1.0 / total
    else:
        row_max, inv = _exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN, POLL, SLEEP_NS)
    if PACKED:  # impure asm: not merged with the first conversion
        x = tl.inline_asm_elementwise("cvt.f32.bf16 $0, $1;", "=r,h", [raw], dtype=tl.float32, is_pure=False,
                                      pack=1)
    out = tl.exp2((x - row_max) * LOG2E) * inv
    tl.store(out_ptr + row64 * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


NEG_INF_PAIR = tl.constexpr(-8323200)  # 0xFF80FF80: two bfloat16 -inf in one 32-bit word


@triton.jit
def _halves(w, DTYPE: tl.constexpr):
    """The two 16-bit elements of each 32-bit word (low = the even column), as fp32."""
    lo = w.to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    hi = (w >> 16).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _pack(lo, hi, DTYPE: tl.constexpr):
    lo16 = lo.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi16 = hi.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
    return (hi16 << 16) | lo16


@triton.jit
def split_words(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                BLOCK: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr, MAX_SPIN: tl.constexpr,
                OPAQUE: tl.constexpr = True):
    """bfloat16 rows held as 32-bit words, two elements each, across the wait: half the registers of fp32
    (in the data; ptxas still allocates for the peak, which the exponentials set)."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK // 2
    n_words, sx, so = n_col_vecs * (VEC // 2), x_row_vecs * (VEC // 2), out_row_vecs * (VEC // 2)
    row, chunk = _take_ticket(sync_ptr, CHUNKS)
    row64 = row.to(tl.int64)
    cols = chunk * WORDS + tl.arange(0, WORDS)
    mask = cols < n_words
    w = tl.load(x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * sx + cols, mask=mask,
                other=NEG_INF_PAIR)
    lo, hi = _halves(w, DTYPE)
    m = tl.maximum(tl.max(lo, axis=0), tl.max(hi, axis=0))
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = tl.sum(tl.exp2((lo - m_safe) * LOG2E), axis=0) + tl.sum(tl.exp2((hi - m_safe) * LOG2E), axis=0)
    row_max, inv = _exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN)
    if OPAQUE:  # an opaque copy: the halves are computed again here rather than kept live across the wait
        w = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=tl.int32, is_pure=False, pack=1)
    lo, hi = _halves(w, DTYPE)
    words = _pack(tl.exp2((lo - row_max) * LOG2E) * inv, tl.exp2((hi - row_max) * LOG2E) * inv, DTYPE)
    tl.store(out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * so + cols, words, mask=mask)


@triton.jit
def split_reread(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                 BLOCK: tl.constexpr, SUB: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                 MAX_SPIN: tl.constexpr):
    """A chunk walked in SUB-wide pieces twice: (max, sum) streaming, the exchange, then the chunk read again
    (from L2: the chunks in flight are far smaller than it) and written. Nothing is held across the wait, so
    few registers and many programs per SM: while some wait, others load."""
    n_cols, sx, so = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    row, chunk = _take_ticket(sync_ptr, CHUNKS)
    row64 = row.to(tl.int64)
    x_row = x_ptr + row64 * sx
    sub = tl.arange(0, SUB)
    m = tl.full((), -float("inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    for start in tl.range(chunk * BLOCK, chunk * BLOCK + BLOCK, SUB):
        x = tl.load(x_row + start + sub, mask=start + sub < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        total = total * tl.exp2((m - m_safe) * LOG2E) + tl.sum(tl.exp2((x - m_safe) * LOG2E), axis=0)
        m = m_new
    row_max, inv = _exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN)
    for start in tl.range(chunk * BLOCK, chunk * BLOCK + BLOCK, SUB):
        mask = start + sub < n_cols
        x = tl.load(x_row + start + sub, mask=mask, other=-float("inf")).to(tl.float32)
        out = tl.exp2((x - row_max) * LOG2E) * inv
        tl.store(out_ptr + row64 * so + start + sub, out.to(out_ptr.dtype.element_ty), mask=mask)


def vec_args(x, out):
    vec = 16 // x.element_size()
    while vec > 1 and (x.shape[1] % vec or x.stride(0) % vec or out.stride(0) % vec):
        vec //= 2
    return vec, (x.shape[1] // vec, x.stride(0) // vec, out.stride(0) // vec)


def launch(kernel, x, out, block, warps, **constexprs):
    """One launch of a split kernel: a program per (row, chunk), fresh stats and zeroed counters."""
    vec, args = vec_args(x, out)
    rows = x.shape[0]
    chunks = triton.next_power_of_2(triton.cdiv(x.shape[1], block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    return kernel[(rows * chunks,)](out, x, stats, sync, *args, BLOCK=block, CHUNKS=chunks, VEC=vec,
                                    MAX_SPIN=1 << 16, num_warps=warps, **constexprs)


def bench(fn):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def measure(base, variant, cfg, call, out, ref, smoke):
    """A result row: the call's max abs error (output poisoned first) and its time against the copy."""
    try:
        out.fill_(float("nan"))
        call()
        err = (out.double() - ref).abs().max().item()
        ms = bench(call) if not smoke else 1.0
        row = base | dict(variant=variant, cfg=cfg, ms=ms, frac=base["copy_ms"] / ms, err=err)
    except Exception as e:  # noqa: BLE001
        row = base | dict(variant=variant, cfg=cfg, ms=float("nan"), frac=float("nan"),
                          err=f"{type(e).__name__}: {e}"[:90])
    print(f"  {variant:22s} {cfg:30s} {row['ms'] * 1e3:8.1f} us {row['frac']:.3f} err={row['err']}", flush=True)
    return row


# Round 1 (every switch) found: a relaxed ticket helps; polling with loads or sleeping does not.
# Round 2 (these): the relaxed ticket over more configs, and three ways to hold fewer registers per byte.
VARIANTS = [(1, "rmw", 0, 0), (2, "rmw", 0, 0), (2, "rmw", 0, 1), (2, "none", 0, 0), (2, "none", 0, 1)]
CONFIGS = [(4096, 2), (4096, 4), (8192, 2), (8192, 4), (8192, 8), (16384, 4), (16384, 8)]
REREAD = [(b, s, w) for b in (4096, 8192, 16384) for s, w in ((1024, 2), (2048, 4), (4096, 4), (4096, 8))
          if s < b]


def variant_name(ticket, poll, sleep_ns, packed):
    return f"{('pid', 'ticket', 'relaxed')[ticket]}_{poll}" + (f"{sleep_ns}" if sleep_ns else "") + (
        "_packed" if packed else "")


def main(outdir, smoke):
    from labkernels.ch06_attention import online_softmax as osm

    shapes = ((4096, 32768, torch.bfloat16), (1024, 262144, torch.bfloat16), (1024, 262144, torch.float32))
    configs, rereads = CONFIGS, REREAD
    if smoke:  # the interpreter runs programs one after another: only one chunk per row can finish there
        shapes, configs, rereads = ((3, 100, torch.float32),), [(128, 4)], [(128, 32, 4)]
    rows_out, t0 = [], time.time()
    for rows, cols, dtype in shapes:
        x = (torch.randn(rows, cols, device=labkernels.DEVICE) * 3).to(dtype)
        ref = torch.softmax(x.double(), dim=1)
        out = torch.empty_like(x)
        base = dict(rows=rows, cols=cols, dtype=str(dtype).split(".")[1],
                    copy_ms=bench(lambda: out.copy_(x)) if not smoke else 1.0)  # noqa: B023
        print(f"{rows}x{cols} {dtype}: copy {base['copy_ms'] * 1e3:.1f} us", flush=True)
        shipped = str(osm.config(rows, cols, dtype))
        rows_out.append(measure(base, "shipped", shipped, lambda: osm.online_softmax(x, out), out, ref, smoke))  # noqa: B023
        for block, warps in configs:
            if not smoke and not 2 <= triton.next_power_of_2(cols) // block <= 64:
                continue
            cfg = f"block={block} warps={warps}"
            for ticket, poll, sleep_ns, packed in VARIANTS:
                if (packed and dtype != torch.bfloat16) or time.time() - t0 > 150:
                    continue
                switches = dict(TICKET=ticket, POLL=poll, SLEEP_NS=sleep_ns, PACKED=packed)
                call = lambda: launch(split_x, x, out, block, warps, **switches)  # noqa: E731,B023
                rows_out.append(measure(base, variant_name(ticket, poll, sleep_ns, packed), cfg, call, out, ref,
                                        smoke))
            if dtype == torch.bfloat16:
                call = lambda: launch(split_words, x, out, block, warps)  # noqa: E731,B023
                rows_out.append(measure(base, "relaxed_rmw_words", cfg, call, out, ref, smoke))
        for block, sub, warps in rereads:
            if not smoke and not 2 <= triton.next_power_of_2(cols) // block <= 64:
                continue
            call = lambda: launch(split_reread, x, out, block, warps, SUB=sub)  # noqa: E731,B023
            rows_out.append(measure(base, "relaxed_reread", f"block={block} sub={sub} warps={warps}", call, out,
                                    ref, smoke))
    with open(f"{outdir}/exchange.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        w.writeheader()
        w.writerows(rows_out)


def ptxas_registers(kernel, constexprs: dict, warps: int, dtype: str = "*bf16") -> int:
    """Registers per thread that ptxas allocates for `kernel` compiled for sm_90 (an H100/H200)."""
    from sm90 import compile_sm90, ptxas_info

    signature = {"out_ptr": dtype, "x_ptr": dtype, "stats_ptr": "*fp32", "sync_ptr": "*i32", "n_col_vecs": "i32",
                 "x_row_vecs": "i32", "out_row_vecs": "i32"} | {name: "constexpr" for name in constexprs}
    info = ptxas_info(compile_sm90(kernel, signature, constexprs, warps))
    return int(info.split(" registers")[0].split()[-1])  # "ptxas info : Used N registers, ..."


def print_registers():
    """The three ways to hold 16-bit data more compactly, against the plain split kernel: bfloat16, 8192-wide
    chunks, 4 warps (reread: 2048-wide pieces)."""
    common = dict(BLOCK=8192, CHUNKS=32, VEC=8, MAX_SPIN=1 << 16)
    switches = dict(TICKET=2, POLL="rmw", SLEEP_NS=0)
    for name, kernel, constexprs in (
        ("relaxed_rmw", split_x, common | switches | dict(PACKED=0)),
        ("relaxed_rmw_packed", split_x, common | switches | dict(PACKED=1)),
        ("relaxed_rmw_words", split_words, common | dict(OPAQUE=True)),
        ("relaxed_reread", split_reread, common | dict(SUB=2048)),
    ):
        print(f"{name:20s} {ptxas_registers(kernel, constexprs, warps=4)} registers per thread")


if __name__ == "__main__":
    if REGISTERS_ONLY:
        print_registers()
    else:
        main(sys.argv[1], "--smoke" in sys.argv)
