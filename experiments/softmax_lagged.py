"""Online softmax, split rows: a persistent kernel that waits for a row's other chunks off the critical path.

The shipped split kernel holds its chunk in registers while it waits for the row's other chunks; that wait
is its cost (experiments/softmax_exchange.py). Here no program waits with data in registers. A persistent grid
of P = SMs x PER_SM programs (PER_SM 1 to 4) walks the work items (row, chunk), item = row * CHUNKS +
chunk; program p takes items p, p + P, p + 2P, ... At step s it
  (a) issues the HBM load of its next item (so one load is always in flight, as `_prefetch_rows_kernel`),
  (b) reduces the current item to its chunk (max m, sum l of exp(x - m)), publishes them and counts the
      chunk in with a release atomic on the row's counter,
  (c) normalizes the item it published LAG steps earlier: reads that chunk again (from L2: it was read about
      LAG x P items ago, LAG x P x chunk bytes, a few MB), checks with an acquire atomic that the row's
      CHUNKS chunks are in (normally true by then), merges the row's stats and writes exp(x - M) / L.
LAG more steps at the end drain the normalizations. Traffic: read 2MN (the second read mostly from L2),
write MN; HBM: read MN, write MN, as a copy.

Deadlock freedom: the old item of program p at step s is p + (s - LAG)P; its row's items lie within
CHUNKS - 1 of it, so when CHUNKS <= P (here always: at most 64 chunks, 132 or more programs) they all
belong to steps <= s - LAG + 1. For LAG >= 2 that is step s - 1 or earlier: published before anyone's
step s, so the wait is normally already over. For LAG = 1 it may be step s, whose publish comes before
every program's wait of step s: a brief wait. (In general CHUNKS <= LAG x P + 1 suffices; the launch
checks it.) By induction every program reaches every publish, as long as all P programs run at once; with
that a static round-robin needs no ticket. Co-residency is what the register check guards: a program that
cannot start until another one finishes may be the one that other program waits for. MAX_SPIN bounds
every wait anyway: a program that gives up writes NaN, never a wrong number, and waits no more (so a bad
launch ends in milliseconds, not minutes).
The Triton interpreter runs programs one after another, so the exchange cannot run there: --smoke runs
ONE program (P = 1, CHUNKS <= LAG + 1), where every wait is for the program's own earlier items: it checks
the indexing, masks, merge and drain on the CPU lane, not the synchronization.

What it found (H200, torch 2.11, triton 3.6, 2026-12-01; every variant correct): slower than the shipped
kernel everywhere. Best fraction of a same-size copy, lagged against shipped: 1024 x 262144 bf16 0.59 / 0.73,
fp32 0.62 / 0.89; 4096 x 32768 bf16 0.61 / 0.88. The likely reason, not measured: a program has one chunk in
flight per step, and a step holds the HBM load, a reduction, the publish and an L2 round trip for the poll, in
sequence: per program the bytes in flight are fewer than the shipped kernel's, which waits but keeps several
chunks loading per SM.

    python experiments/softmax_lagged.py OUTDIR [--budget-s 190]   # GPU: table on stdout, OUTDIR/results.csv
    python experiments/softmax_lagged.py --registers               # no GPU: ptxas registers/spills, sm_90a
    python experiments/softmax_lagged.py --smoke                   # CPU lane (interpreter), one program
"""

import argparse
import concurrent.futures
import csv
import ctypes
import multiprocessing
import os
import re
import subprocess
import sys
import time

REGISTERS_ONLY = __name__ == "__main__" and "--registers" in sys.argv
if REGISTERS_ONLY:  # compile for the GPU on any machine: no interpreter, so no labkernels lane
    os.environ.pop("TRITON_INTERPRET", None)
else:
    import labkernels  # noqa: F401  (first: it sets the lane before triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)
# The merge reads a row's stats as one MAX_CHUNKS-wide vector, so the chunk count need not be a constexpr.
MAX_CHUNKS = 64
MAX_SPIN = 1 << 16  # polls before a program gives up on a row (NaN out)
# (BLOCK, num_warps): 16 to 128 elements a thread for bfloat16, 16 to 64 for float32 (twice the registers an
# element). Fewer leave too little in flight per program; more spill (the current chunk in fp32 and the next
# one loading are live together).
CONFIGS = {
    "bfloat16": [(4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 4), (16384, 8), (16384, 16),
                 (32768, 8), (32768, 16)],
    "float32": [(4096, 4), (4096, 8), (8192, 4), (8192, 8), (8192, 16), (16384, 8), (16384, 16)],
}  # fmt: skip
LAGS = (2, 1, 3)  # LAG = 2 first: the design's default; 1 and 3 after it, on the configs that did best
# Programs an SM, where it holds them. A program has one chunk loading at a time, so an SM has PER_SM x
# chunk bytes in flight; a copy at full speed needs some 30 KB an SM: small chunks need more programs.
PER_SM = (1, 2, 3, 4)
CASES = [(1024, 262144, "bfloat16"), (4096, 32768, "bfloat16"), (1024, 262144, "float32"),
         (4096, 32768, "float32"), (8192, 5000, "bfloat16"), (8192, 5000, "float32")]  # fmt: skip
# L2 eviction hints (HINTS=1), at the first LAG only: the configs with the most bytes in flight an SM.
HINT_CONFIGS = {
    "bfloat16": [(16384, 4), (16384, 8), (32768, 8)],
    "float32": [(8192, 4), (8192, 8), (16384, 8)],
}
RAGGED_CONFIGS = [(4096, 4), (4096, 8)]  # 5000 = 4096 + 904: two chunks, the second ragged
# |out - ref| <= ATOL x (the row's largest value) + RTOL x |ref|. bfloat16: RTOL one unit in the last place
# (the rounding of the result is at most half of one); float32: the fp32 arithmetic (exp2, sums of 2^18).
TOL = {"bfloat16": (2e-3, 8e-3), "float32": (1e-6, 1e-5), "float16": (1e-3, 2e-3)}
FIELDS = ["device", "torch", "triton", "cuda", "date", "git", "rows", "cols", "dtype", "variant", "config",
          "ms", "copy_ms", "fraction_of_same_size_copy", "max_abs_err", "correct"]  # fmt: skip


# --- the kernel ---------------------------------------------------------------------------------------------


@triton.jit
def _item_cols(item, n_items, chunks, n_cols, BLOCK: tl.constexpr):
    """Row (64-bit), columns and mask of work item `item` (masked off unless 0 <= item < n_items)."""
    valid = (item >= 0) & (item < n_items)
    item = tl.where(valid, item, 0)  # keeps the addresses of a masked-off item inside the tensor
    cols = (item % chunks) * BLOCK + tl.arange(0, BLOCK)
    return (item // chunks).to(tl.int64), cols, valid & (cols < n_cols)


@triton.jit
def _load_item(x_ptr, item, n_items, chunks, n_cols, stride_xm, BLOCK: tl.constexpr, HINTS: tl.constexpr):
    row64, cols, mask = _item_cols(item, n_items, chunks, n_cols, BLOCK)
    # read BLOCK (HBM); HINTS: keep it in L2 for the second read, ahead of other lines
    return tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=-float("inf"),
                   eviction_policy="evict_last" if HINTS else "")  # fmt: skip


@triton.jit
def _publish(stats_ptr, count_ptr, x_raw, item, n_items, chunks):
    """The chunk's max m and sum l of exp(x - m), stored, then counted in on the row's counter."""
    valid = item < n_items
    x = x_raw.to(tl.float32)  # masked-off lanes (and a masked-off item) hold -inf
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)  # an all -inf chunk: no NaN from -inf - -inf
    total = tl.sum(tl.exp2((x - m_safe) * LOG2E), axis=0)
    stat = stats_ptr + item.to(tl.int64) * 2  # stats[row, chunk] = stats[item]
    tl.store(stat, m, mask=valid)  # write 8 bytes
    tl.store(stat + 1, total, mask=valid)
    tl.debug_barrier()  # the stats are written before the arrival is counted (release)
    tl.atomic_add(count_ptr + item // chunks, 1, mask=valid, sem="release")


@triton.jit
def _wait_for_row(counter, chunks, valid, patience):
    """True once all `chunks` of the row are counted in (acquire: their stats are visible), False if
    `patience` polls were not enough. Normally the first poll already sees them all."""
    arrived = tl.atomic_add(counter, 0, mask=valid, sem="acquire")  # one L2 round trip
    arrived = tl.where(valid, arrived, chunks)
    spins = arrived * 0
    while (arrived < chunks) & (spins < patience):
        arrived = tl.atomic_add(counter, 0, sem="acquire")
        spins += 1
    return arrived >= chunks


@triton.jit
def _row_max_and_sum(stats_ptr, row64, chunks, MAX_CHUNKS: tl.constexpr):
    """M = max m_c, L = sum l_c exp(m_c - M) over the row's chunks."""
    idx = tl.arange(0, MAX_CHUNKS)
    stat = stats_ptr + (row64 * chunks + idx) * 2
    # volatile: not from L1, which may hold this line from before its other chunks arrived. read 8 x chunks
    ms = tl.load(stat, mask=idx < chunks, other=-float("inf"), volatile=True)
    ls = tl.load(stat + 1, mask=idx < chunks, other=0.0, volatile=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    return row_max, tl.sum(ls * tl.exp2((ms - row_max) * LOG2E), axis=0)


@triton.jit
def _normalize(out_ptr, x_ptr, stats_ptr, count_ptr, item, n_items, chunks, n_cols, stride_xm, stride_om,
               patience, BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr, HINTS: tl.constexpr):  # fmt: skip
    """exp(x - M) / L of work item `item` (nothing if item < 0: the first LAG steps). Returns the patience
    left: 0 once a wait gave up."""
    row64, cols, mask = _item_cols(item, n_items, chunks, n_cols, BLOCK)
    # read BLOCK again, from L2; issued before the wait so that its latency overlaps the poll's. HINTS: the
    # last use of these lines, and the written ones are not read again: both may leave L2 first.
    evict: tl.constexpr = "evict_first" if HINTS else ""
    x = tl.load(x_ptr + row64 * stride_xm + cols, mask=mask, other=0.0, eviction_policy=evict)
    done = _wait_for_row(count_ptr + row64, chunks, item >= 0, patience)
    tl.debug_barrier()  # every thread reads the stats after the acquire
    row_max, row_sum = _row_max_and_sum(stats_ptr, row64, chunks, MAX_CHUNKS)
    y = tl.exp2((x.to(tl.float32) - row_max) * LOG2E) * (1.0 / row_sum)
    y = tl.where(done, y, float("nan"))  # gave up: NaN, never a wrong number
    y = y.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row64 * stride_om + cols, y, mask=mask, eviction_policy=evict)  # write BLOCK
    return tl.where(done, patience, 0)


# The integers are not specialized (divisible by 16, equal to 1): one compiled kernel serves every shape.
@triton.jit(do_not_specialize=["n_rows", "chunks", "n_col_vecs", "x_row_vecs", "out_row_vecs"])
def lagged_softmax_kernel(
    out_ptr,
    x_ptr,
    stats_ptr,  # (rows, chunks, 2) fp32: each chunk's (max, sum of exp(x - max))
    count_ptr,  # (rows,) int32 zeros: the chunks of each row whose stats are published
    n_rows,
    chunks,  # chunks a row: cdiv(n_cols, BLOCK) <= MAX_CHUNKS and <= LAG x programs + 1 (no deadlock)
    n_col_vecs,  # the row length in whole VEC-element vectors
    x_row_vecs,  # x's row stride, in vectors (columns are contiguous)
    out_row_vecs,
    BLOCK: tl.constexpr,  # columns a chunk (a power of two)
    MAX_CHUNKS: tl.constexpr,
    VEC: tl.constexpr,  # lengths and strides are multiples of VEC: 16-byte accesses
    LAG: tl.constexpr,  # steps between publishing an item and normalizing it
    MAX_SPIN: tl.constexpr,
    HINTS: tl.constexpr,  # L2 eviction hints: x's lines stay for the second read, the rest leave first
):
    """Module docstring: program p takes items p, p + P, ...; step s publishes one, normalizes the one LAG
    steps older, and has the next one's load in flight meanwhile."""
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    pid = tl.program_id(axis=0)
    n_programs = tl.num_programs(axis=0)
    n_items = n_rows * chunks
    steps = tl.cdiv(n_items - pid, n_programs)  # this program's items (the launch keeps P <= n_items)
    upcoming = _load_item(x_ptr, pid, n_items, chunks, n_cols, stride_xm, BLOCK, HINTS)
    patience = tl.full((), MAX_SPIN, tl.int32)
    for step in range(0, steps + LAG):  # the last LAG steps only drain the normalizations
        item = pid + step * n_programs
        current = upcoming
        # (a) the next item's HBM read, issued before this one's registers are first used (that waits for
        # their load): the SM keeps loading through the reduction, the exchange and the normalization.
        upcoming = _load_item(x_ptr, item + n_programs, n_items, chunks, n_cols, stride_xm, BLOCK, HINTS)
        _publish(stats_ptr, count_ptr, current, item, n_items, chunks)  # (b)
        old = item - LAG * n_programs  # (c)
        patience = _normalize(out_ptr, x_ptr, stats_ptr, count_ptr, old, n_items, chunks, n_cols, stride_xm,
                              stride_om, patience, BLOCK, MAX_CHUNKS, HINTS)  # fmt: skip


def launch(x, out, block, warps, lag, programs, hints=0, max_spin=MAX_SPIN):
    """One call: `programs` persistent programs (at most one per item), fresh stats, zeroed counters."""
    from labkernels.ch06_attention.online_softmax import vector_width

    rows, cols = x.shape
    vec = vector_width(x, out)
    chunks = triton.cdiv(cols, block)
    programs = min(programs, rows * chunks)
    if chunks > MAX_CHUNKS or chunks > lag * programs + 1:  # see the module docstring (deadlock freedom)
        raise ValueError(f"{chunks} chunks a row: more than {MAX_CHUNKS} or LAG x {programs} programs + 1")
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    counts = torch.zeros(rows, device=x.device, dtype=torch.int32)  # write 4 bytes a row
    return lagged_softmax_kernel[(programs,)](
        out, x, stats, counts, rows, chunks, cols // vec, x.stride(0) // vec, out.stride(0) // vec,
        BLOCK=block, MAX_CHUNKS=MAX_CHUNKS, VEC=vec, LAG=lag, MAX_SPIN=max_spin, HINTS=hints, num_warps=warps,
    )  # fmt: skip


# --- compiling: ahead in worker processes (GPU run), or for sm_90 on any machine (--registers) --------------


def variants():
    """(dtype, BLOCK, num_warps, LAG, HINTS) of every kernel compiled."""
    plain = [(d, b, w, lag, 0) for d, configs in CONFIGS.items() for b, w in configs for lag in LAGS]
    return plain + [(d, b, w, LAGS[0], 1) for d, configs in HINT_CONFIGS.items() for b, w in configs]


def _vec(dtype: str) -> int:
    return 16 // torch.empty((), dtype=getattr(torch, dtype)).element_size()


def compiled(dtype, block, warps, lag, hints):
    """The kernel of one variant, from Triton's cache when a worker compiled it (same arguments, same key)."""
    dt = getattr(torch, dtype)
    return lagged_softmax_kernel.warmup(
        dt, dt, torch.float32, torch.int32, 1, 2, 1, 1, 1, grid=(1,),
        BLOCK=block, MAX_CHUNKS=MAX_CHUNKS, VEC=_vec(dtype), LAG=lag, MAX_SPIN=MAX_SPIN, HINTS=hints,
        num_warps=warps,
    )  # fmt: skip


def _warm(job) -> str | None:
    """A worker's job: compile one variant, or run the shipped softmax once on a shape (its candidates
    compile and its tuning runs; the main process then finds them all in Triton's cache)."""
    try:
        if job[0] == "shipped":
            from labkernels.ch06_attention.online_softmax import online_softmax

            _, rows, cols, dtype = job
            online_softmax(torch.randn(rows, cols, device="cuda").to(getattr(torch, dtype)))
            torch.cuda.synchronize()
        else:
            compiled(*job[1:])
        return None
    except Exception as e:  # noqa: BLE001
        return f"{job}: {type(e).__name__}: {e}"[:300]


def ptxas_report(dtype, block, warps, lag, hints) -> dict:
    """ptxas's registers and spills of one variant compiled for sm_90a, and the atomics its PTX holds."""
    from sm90 import compile_sm90, ptxas_info

    ptr = {"bfloat16": "*bf16", "float32": "*fp32", "float16": "*fp16"}[dtype]
    ints = ["n_rows", "chunks", "n_col_vecs", "x_row_vecs", "out_row_vecs"]
    constexprs = dict(
        BLOCK=block, MAX_CHUNKS=MAX_CHUNKS, VEC=_vec(dtype), LAG=lag, MAX_SPIN=MAX_SPIN, HINTS=hints
    )
    signature = {"out_ptr": ptr, "x_ptr": ptr, "stats_ptr": "*fp32", "count_ptr": "*i32"}
    signature |= {name: "i32" for name in ints} | {name: "constexpr" for name in constexprs}
    ptx = compile_sm90(lagged_softmax_kernel, signature, constexprs, warps)
    info = ptxas_info(ptx)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    ordered = re.findall(r"\b(?:atom|red|ld|st)\.[a-z0-9.]*(?:acquire|release)[a-z0-9.]*", ptx)
    return dict(regs=regs, spill_bytes=sum(spills), ordering=sorted(set(ordered)), cp_async="cp.async" in ptx)


def programs_per_sm_by_registers(regs: int, warps: int) -> int:
    """Programs an SM holds by registers (65536 a SM, allocated a warp at a time in units of 256) and by
    threads (2048 a SM)."""
    per_warp = -(-regs * 32 // 256) * 256
    return min(65536 // per_warp, 64) // warps


def print_registers() -> None:
    print("dtype      block warps lag hints regs spill B per_SM ordering")
    for dtype, block, warps, lag, hints in variants():
        r = ptxas_report(dtype, block, warps, lag, hints)
        fits = programs_per_sm_by_registers(r["regs"], warps)
        notes = " ".join(r["ordering"]) + (" cp.async!" if r["cp_async"] else "")
        print(f"{dtype:9s} {block:6d} {warps:5d} {lag:3d} {hints:5d} {r['regs']:4d} {r['spill_bytes']:7d} "
              f"{fits:6d} {notes}", flush=True)  # fmt: skip


# --- the GPU run: checks and timings ------------------------------------------------------------------------


def occupancy(kernel, warps: int) -> int:
    """Programs of a loaded `kernel` an SM holds at once, from the driver (registers, shared memory,
    threads); the register formula if the driver cannot be asked."""
    try:
        n = ctypes.c_int()
        err = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), ctypes.c_void_p(kernel.function), ctypes.c_int(32 * warps),
            ctypes.c_size_t(kernel.metadata.shared),
        )  # fmt: skip
        if err == 0:
            return n.value
    except OSError:
        pass
    return programs_per_sm_by_registers(kernel.n_regs, warps)


def register_fits() -> dict:
    """Per variant: (registers a thread, programs an SM holds), from the compiled kernels; printed."""
    fits = {}
    print("dtype      block warps lag hints regs spills per_SM")
    for v in variants():
        try:
            kernel = compiled(*v)
            kernel._init_handles()  # loads it: registers, spills and the handle the driver is asked about
            fits[v] = (kernel.n_regs, occupancy(kernel, v[2]))
            dtype, block, warps, lag, hints = v
            regs, spills, per_sm = kernel.n_regs, kernel.n_spills, fits[v][1]
            print(f"{dtype:9s} {block:6d} {warps:5d} {lag:3d} {hints:5d} {regs:4d} {spills:6d} {per_sm:6d}")
        except Exception as e:  # noqa: BLE001
            fits[v] = (0, 0)  # not run
            print(f"{v}: {type(e).__name__}: {e}"[:200])
    return fits


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def compare(out, ref, dtype: str) -> tuple[float, bool]:
    """Max abs error against the fp64 reference; True if |out - ref| <= ATOL x row max + RTOL x |ref|."""
    err = (out.double() - ref).abs()
    atol, rtol = TOL[dtype]
    ok = bool((err <= atol * ref.amax(dim=1, keepdim=True) + rtol * ref.abs()).all())  # NaN compares False
    return err.max().item(), ok


class Case:
    """One (rows, cols, dtype): input, fp64 reference, output, the same-size copy's time."""

    def __init__(self, rows, cols, dtype):
        from labkernels.ch06_attention.online_softmax import reference

        self.rows, self.cols, self.dtype = rows, cols, dtype
        self.x = (torch.randn(rows, cols, device="cuda") * 3).to(getattr(torch, dtype))
        self.ref = reference(self.x.double())
        self.out = torch.empty_like(self.x)
        self.copy_ms = float("nan")

    def check(self, call) -> tuple[float, bool]:
        """Max abs error of `call`'s output (poisoned first) and whether every element is within TOL."""
        self.out.fill_(float("nan"))
        call()
        return compare(self.out, self.ref, self.dtype)


class Recorder:
    """CSV rows, written as they are measured (a run cut short keeps what it did)."""

    def __init__(self, path):
        from labkernels import env

        info = env.report()
        self.meta = {k: info[k] for k in ("device", "torch", "triton", "cuda", "date", "git")}
        self.path = path
        self.file = open(path, "w", newline="")  # noqa: SIM115
        self.writer = csv.DictWriter(self.file, fieldnames=FIELDS)
        self.writer.writeheader()
        self.rows = []

    def measure(self, case: Case, variant: str, config: str, call) -> dict:
        row = self.meta | dict(rows=case.rows, cols=case.cols, dtype=case.dtype)
        row |= dict(variant=variant, config=config)
        try:
            err, ok = case.check(call)
            ms = bench(call)
            row |= dict(ms=ms, copy_ms=case.copy_ms, fraction_of_same_size_copy=case.copy_ms / ms,
                        max_abs_err=err, correct=ok)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            row |= dict(ms=float("nan"), copy_ms=case.copy_ms, fraction_of_same_size_copy=float("nan"),
                        max_abs_err=f"{type(e).__name__}: {e}"[:120], correct=False)  # fmt: skip
        self.writer.writerow(row)
        self.file.flush()
        self.rows.append(row)
        print(f"  {case.rows}x{case.cols} {case.dtype:8s} {variant:12s} {config:46s} "
              f"{row['fraction_of_same_size_copy']:.3f} err={row['max_abs_err']} ok={row['correct']}",
              flush=True)  # fmt: skip
        return row

    def print_best(self) -> None:
        """The fastest correct configuration of each variant per shape (chapter 06's `best_softmax_variants`,
        which the notebook reads the recorded CSV with), and how many runs were wrong."""
        from labkernels.ch06_attention.bench import best_softmax_variants
        from labkernels.results import Table

        variants = tuple(dict.fromkeys(r["variant"] for r in self.rows))  # in the order they were measured
        print("\nbest fraction of a same-size copy:")
        print(best_softmax_variants(Table(r for r in self.rows if r["correct"]), variants))
        wrong = [r for r in self.rows if not r["correct"]]
        print(f"{len(self.rows)} measured, {len(wrong)} wrong", flush=True)


def case_beside_shipped(rec: Recorder, rows: int, cols: int, dtype: str) -> Case:
    """A Case with its same-size copy timed (read MN, write MN) and the shipped online_softmax measured."""
    from labkernels.ch06_attention import online_softmax as osm

    case = Case(rows, cols, dtype)
    case.copy_ms = bench(lambda: case.out.copy_(case.x))
    shipped = str(osm.config(rows, cols, getattr(torch, dtype)))
    rec.measure(case, "shipped", shipped, lambda: osm.online_softmax(case.x, case.out))
    return case


def ctypes_launch(entry, args: tuple):
    """A call of a C entry point of an nvcc-built library that takes `args` and the current stream last, and
    returns a cudaError_t: raised, not ignored."""

    def call():
        err = entry(*args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if err:
            raise RuntimeError(f"cudaError {err}")

    return call


def nvcc_library(source: str, library: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Builds experiments/`source` (CUDA, sm_90, with labkernels/csrc/cuda's headers) into the shared library
    `library` with nvcc alone, for ctypes: seconds, where a torch extension takes a minute. ptxas's register
    counts are in the result's stderr; a failed build ends the run."""
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = ["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    cmd += [*flags, "-I", os.path.join(here, "..", "labkernels", "csrc", "cuda"), "-o", library]
    start = time.time()
    done = subprocess.run([*cmd, os.path.join(here, source)], capture_output=True, text=True)
    print(f"nvcc {source}: rc={done.returncode} in {time.time() - start:.1f} s", flush=True)
    if done.returncode:
        print(done.stderr[-3000:])
        sys.exit(1)
    return done


def compile_ahead(workers: int, build_inputs, wait_s: float):
    """Every variant and the shipped softmax's candidates compiled in parallel processes (a cold cache would
    otherwise spend the budget compiling one kernel after another) while `build_inputs()` runs here."""
    if workers < 1:  # everything compiles when first launched
        return build_inputs()
    jobs = [("shipped", r, c, d) for r, c, d in CASES] + [("lagged", *v) for v in variants()]
    start = time.time()
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    futures = [pool.submit(_warm, job) for job in jobs]
    built = build_inputs()
    done, pending = concurrent.futures.wait(futures, timeout=max(5.0, wait_s - (time.time() - start)))
    errors = [f.result() if f.exception() is None else repr(f.exception()) for f in done]
    errors = [e for e in errors if e]
    first = f", first: {errors[0]}" if errors else ""
    took = time.time() - start
    print(f"compiled {len(done)} of {len(jobs)} jobs ahead in {took:.0f} s; {len(errors)} failed{first}")
    if pending:  # timings want the GPU and the CPU to themselves: stop the workers still busy
        for process in list(pool._processes.values()):
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    return built


def lagged_runs(case: Case, lag: int, hints: int, configs, sms: int, fits: dict):
    """((block, warps), config label, call) of `case`'s lagged launches at this LAG. PER_SM programs an SM
    only where an SM holds that many at once: else some programs could not start until others finished,
    and those others may be waiting for them (a deadlock, which MAX_SPIN turns into NaN)."""
    for block, warps in configs:
        if not 2 <= triton.cdiv(case.cols, block) <= MAX_CHUNKS:
            continue
        regs, per_sm_max = fits.get((case.dtype, block, warps, lag, hints), (0, 0))
        for per_sm in (k for k in PER_SM if k <= per_sm_max):
            cfg = f"block={block} warps={warps} per_sm={per_sm} lag={lag} regs={regs}"
            call = lambda b=block, w=warps, p=sms * per_sm: launch(case.x, case.out, b, w, lag, p, hints)
            yield (block, warps), cfg, call


def gpu_main(out_dir: str, budget_s: float, workers: int) -> None:
    from labkernels.ch06_attention import online_softmax as osm

    start = time.time()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"{props.name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    cases = compile_ahead(workers, lambda: [Case(*c) for c in CASES], 0.4 * budget_s)
    fits = register_fits()
    os.makedirs(out_dir, exist_ok=True)
    rec = Recorder(os.path.join(out_dir, "results.csv"))
    for case in cases:
        case.copy_ms = bench(lambda c=case: c.out.copy_(c.x))  # read MN, write MN
        shipped = str(osm.config(case.rows, case.cols, getattr(torch, case.dtype)))  # tunes (cached kernels)
        print(f"{case.rows}x{case.cols} {case.dtype}: copy {case.copy_ms * 1e3:.1f} us", flush=True)
        rec.measure(case, "shipped", shipped, lambda c=case: osm.online_softmax(c.x, c.out))
    # Rounds: every config at the first LAG; the L2 hints on a few; the other LAGs, best configs first.
    rounds = [(LAGS[0], 0, CONFIGS), (LAGS[0], 1, HINT_CONFIGS)] + [(lag, 0, CONFIGS) for lag in LAGS[1:]]
    best = {}  # (case, block, warps) -> best correct fraction so far
    for lag, hints, round_configs in rounds:
        for case in cases:
            configs = RAGGED_CONFIGS if case.cols == 5000 else round_configs[case.dtype]
            if (lag, hints) != rounds[0][:2]:
                if case.cols == 5000:
                    continue  # the ragged shape is a correctness check: the first round only
                configs = sorted(configs, key=lambda bw, c=case: -best.get((c, *bw), 0.0))
            for (block, warps), cfg, call in lagged_runs(case, lag, hints, configs, sms, fits):
                if time.time() - start > budget_s:
                    print(f"budget spent: {case.rows}x{case.cols} {case.dtype} {cfg} not run", flush=True)
                    continue
                row = rec.measure(case, "lagged_hints" if hints else "lagged", cfg, call)
                frac = row["fraction_of_same_size_copy"] if row["correct"] else 0.0
                best[(case, block, warps)] = max(best.get((case, block, warps), 0.0), frac)
    rec.file.close()
    summary(rec.rows)
    print(f"wrote {rec.path} in {time.time() - start:.0f} s")


def summary(rows) -> None:
    """Per shape and dtype: the shipped softmax, then the five fastest correct lagged variants."""
    print(f"\n{'shape':>13s} {'dtype':8s} {'variant':12s} {'config':46s} of copy      us max_abs_err")
    for r, c, d in CASES:
        mine = [x for x in rows if (x["rows"], x["cols"], x["dtype"]) == (r, c, d)]
        lagged = [x for x in mine if x["variant"].startswith("lagged") and x["correct"]]
        lagged.sort(key=lambda x: -x["fraction_of_same_size_copy"])
        for x in [x for x in mine if x["variant"] == "shipped"] + lagged[:5]:
            frac, us, err = x["fraction_of_same_size_copy"], x["ms"] * 1e3, x["max_abs_err"]
            print(f"{r:>6d}x{c:<6d} {d:8s} {x['variant']:12s} {x['config']:46s} {frac:7.3f} {us:7.1f} {err}")
        wrong = sum(1 for x in mine if x["variant"].startswith("lagged") and not x["correct"])
        if wrong:
            print(f"{'':13s} {d:8s} {wrong} lagged variants NOT correct (see the CSV)")


# --- the CPU lane: one program ------------------------------------------------------------------------------


def smoke() -> int:
    """One program under the interpreter (every wait is for its own earlier items): ragged chunks, LAG 1-3,
    the drain, against the fp64 reference. Not the synchronization between programs."""
    import warnings

    from labkernels.ch06_attention.online_softmax import reference

    # The first LAG steps have no old item yet: their merge reads unwritten stats and is masked off (numpy,
    # under the interpreter, warns about the inf and NaN it computes there).
    warnings.filterwarnings("ignore", "overflow|invalid value|divide by zero", RuntimeWarning)
    torch.manual_seed(0)
    bad = 0
    runs = [(5, 300, 128, 2, 0, torch.float32), (4, 100, 64, 1, 0, torch.float32),
            (3, 250, 64, 3, 0, torch.float16), (2, 64, 64, 2, 0, torch.float32),
            (3, 180, 64, 2, 1, torch.float32)]  # fmt: skip
    for rows, cols, block, lag, hints, dtype in runs:
        x = (torch.randn(rows, cols) * 3).to(dtype)
        out = torch.full_like(x, float("nan"))
        launch(x, out, block, 4, lag, programs=1, hints=hints)
        err, ok = compare(out, reference(x.double()), str(dtype).split(".")[1])
        bad += not ok
        print(f"{rows}x{cols} {dtype} block={block} lag={lag} hints={hints}: max_abs_err={err:.2e} ok={ok}")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.environ.get("OUT", "/tmp"), "softmax_lagged")
    parser.add_argument("out_dir", nargs="?", default=default_out)
    parser.add_argument("--budget-s", type=float, default=190.0, help="start no new variant after this")
    parser.add_argument("--workers", type=int, default=min(14, max(1, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--registers", action="store_true", help="ptxas registers and spills, sm_90a; no GPU")
    parser.add_argument("--smoke", action="store_true", help="CPU lane: one program under the interpreter")
    args = parser.parse_args()
    if args.registers:
        print_registers()
        return 0
    if args.smoke:
        return smoke()
    if not torch.cuda.is_available():
        print("no GPU: use --registers or --smoke")
        return 2
    gpu_main(args.out_dir, args.budget_s, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
