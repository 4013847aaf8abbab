"""Chapter 06 benchmarks (`make bench`, GPU lane): attention vs SDPA's backends, online softmax vs copy.

The measuring functions are plain (they return rows or a `Table`), so the notebook's widgets call them too;
the `@benchmark` functions fix the sizes recorded in `labkernels/reference/`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton.softmax import MAX_COLS
from labkernels.ch03_triton.softmax import softmax as ch03_softmax
from labkernels.ch06_attention.flash_attention import flash_attention
from labkernels.ch06_attention.naive import naive_attention
from labkernels.ch06_attention.online_softmax import config as softmax_config
from labkernels.ch06_attention.online_softmax import online_softmax
from labkernels.lane import DEVICE, on_gpu
from labkernels.results import Table
from labkernels.roofline import measure_copy_bandwidth
from labkernels.sweep import sweep

MUST_SHOW = [(4, 16, 4096, d, c) for d in (64, 128) for c in (False, True)]
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION"}
SDPA_BACKENDS |= {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_math": "MATH"}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sdpa(backend: str, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def attention_impls(causal: bool, names=None) -> dict:
    """name -> fn(q, k, v): this chapter's kernel, SDPA with one backend forced, and naive attention."""
    impls = {"labkernels": lambda q, k, v: flash_attention(q, k, v, causal=causal)}
    impls |= {name: _sdpa(backend, causal) for name, backend in SDPA_BACKENDS.items()}
    impls["naive"] = lambda q, k, v: naive_attention(q, k, v, causal=causal)
    return {n: f for n, f in impls.items() if names is None or n in names}


def peak_extra_mb(fn) -> float:
    """GPU memory allocated by one call of fn beyond what was allocated before it, in MB (NaN on the CPU).
    fn runs once first, so one-time work (autotuning, caches) is not counted."""
    if not on_gpu():
        return float("nan")
    fn()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e6


def attention_rows(batch, heads, seq, head_dim, dtype, causal, names=None, memory=True) -> list[dict]:
    """One row per implementation: ms (median), TFLOP/s (causal counts half the FLOPs), extra peak memory.
    An implementation that cannot run this shape (no kernel for it, out of memory) gets NaN and the reason."""
    q, k, v = (torch.randn(batch, heads, seq, head_dim, device=DEVICE, dtype=dtype) for _ in range(3))
    flops = traffic.flash_attention(batch, heads, seq, head_dim, dtype, causal=causal).flops
    params = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "dtype": _dtype_name(dtype)}
    params["causal"] = causal
    rows = []
    with torch.no_grad():
        for impl, fn in attention_impls(causal, names).items():
            row = {**params, "impl": impl}
            try:
                ms = timing.time_ms(lambda fn=fn: fn(q, k, v))
                row |= {"ms": ms, "tflops": timing.tflops(flops, ms)}
                row["peak_mb"] = peak_extra_mb(lambda fn=fn: fn(q, k, v)) if memory else float("nan")
            except (RuntimeError, torch.OutOfMemoryError) as e:  # no such kernel here, or too big
                row |= {"ms": math.nan, "tflops": math.nan, "peak_mb": math.nan, "error": str(e)[:60]}
                if on_gpu():
                    torch.cuda.empty_cache()
            rows.append(row)
    flash = next((r["ms"] for r in rows if r["impl"] == "sdpa_flash"), math.nan)
    for row in rows:
        row["speedup_vs_flash"] = flash / row["ms"]
    return rows


def sequence_sweep(seqs, names, batch=4, heads=16, head_dim=64, dtype=torch.bfloat16, causal=False) -> Table:
    """attention_rows over sequence lengths: time, TFLOP/s and peak memory of each implementation."""
    rows = []
    for seq in seqs:
        rows += attention_rows(batch, heads, seq, head_dim, dtype, causal, names)
    return Table(rows)


def training_rows(batch, heads, seq, head_dim, dtype, causal) -> list[dict]:
    """Forward + backward: SDPA's FLASH backend (its CPU-lane stand-in: MATH) and this chapter's kernels.
    TFLOP/s counts the backward as 2.5x the forward's FLOPs (two matmuls recomputed, three more)."""
    q, k, v = (
        torch.randn(batch, heads, seq, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn_like(q)
    flops = 3.5 * traffic.flash_attention(batch, heads, seq, head_dim, dtype, causal=causal).flops
    params = {"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "dtype": _dtype_name(dtype)}
    impls = {
        "sdpa_flash_fwd_bwd": _sdpa("FLASH_ATTENTION" if on_gpu() else "MATH", causal),
        "labkernels_fwd_bwd": lambda q, k, v: flash_attention(q, k, v, causal=causal),
    }
    rows = []
    for impl, fn in impls.items():
        ms = timing.time_ms(lambda fn=fn: fn(q, k, v).backward(grad))
        rows.append({**params, "causal": causal, "impl": impl, "ms": ms, "tflops": timing.tflops(flops, ms)})
    return rows


@benchmark("ch06_attention")
def bench_attention() -> list[dict]:
    rows = []
    for batch, heads, seq, head_dim, causal in MUST_SHOW:
        shape = (batch, heads, seq, head_dim, torch.bfloat16, causal)
        rows += [{"sweep": "must_show", **r} for r in attention_rows(*shape)]
        rows += [{"sweep": "training", **r} for r in training_rows(*shape)]
    for seq in (512, 1024, 2048, 4096, 8192, 16384):
        names = None if seq <= 8192 else ["labkernels", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
        rows += [{"sweep": "seq", **r} for r in attention_rows(4, 16, seq, 64, torch.bfloat16, False, names)]
    return rows


# --- online softmax ----------------------------------------------------------------------------------------


def online_softmax_rows(n_rows: int, n_cols: int, dtype: torch.dtype, copy_gbps: float) -> list[dict]:
    """online_softmax against a copy of the same bytes, torch.softmax and (rows up to 32768) ch03's softmax.
    GB/s counts the ideal traffic (read MN, write MN) for every softmax, so all are compared on one scale."""
    x = torch.randn(n_rows, n_cols, device=DEVICE).to(dtype)
    out = torch.empty_like(x)
    impls = {
        "online_softmax": lambda: online_softmax(x, out),
        "copy": lambda: out.copy_(x),  # read MN, write MN: the ceiling at this size
        "torch": lambda: torch.softmax(x, dim=1),
    }
    if n_cols <= MAX_COLS:
        impls["ch03_softmax"] = lambda: ch03_softmax(x)
    nbytes = traffic.softmax(n_rows, n_cols, dtype).bytes
    block, warps, mode = softmax_config(n_rows, n_cols, dtype)
    params = {"rows": n_rows, "cols": n_cols, "dtype": _dtype_name(dtype)}
    rows = []
    for impl, fn in impls.items():
        ms = timing.time_ms(fn)
        gbps = timing.gbps(nbytes, ms)
        rows.append({**params, "impl": impl, "ms": ms, "gbps": gbps, "fraction_of_copy": gbps / copy_gbps})
    same_size_copy = rows[1]["gbps"]
    for row in rows:
        row["fraction_of_same_size_copy"] = row["gbps"] / same_size_copy
    rows[0] |= {"block_size": block, "num_warps": warps, "mode": mode}
    return rows


SOFTMAX_SHAPES = [(8192, 5000), (4096, 32768), (1024, 262144)]


# The experiment behind the online softmax's modes, in the order the notebook explains them. The CSV
# (labkernels/reference/ch06_softmax_variants.csv) holds experiments/softmax_variants2.py's rows from the
# H200 at the revision in its `git` column, with the script's kinds renamed (shipped -> tuned, nosync ->
# split_no_exchange, pipe -> split_persistent_overlap) and its 5000-column rows left out: there the variants
# lacked the vector-width hint that the package's kernels have, so they were not comparable.
SOFTMAX_VARIANTS = ("tuned", "prefetch", "split_persistent_overlap", "split_no_exchange")
# The split kernel's exchange taken apart (experiments/softmax_exchange.py, ch06_softmax_exchange.csv):
EXCHANGE_VARIANTS = (
    "ticket_rmw",  # as it was: an acq_rel ticket, then publish, count in, poll the count
    "relaxed_rmw",  # the same with a relaxed ticket (what ships now)
    "relaxed_none",  # the relaxed ticket and no exchange (a wrong result): the ticket's cost alone
    "relaxed_rmw_packed",  # 16-bit data converted again after the wait, so that less stays live across it
    "relaxed_rmw_words",  # 16-bit data held as 32-bit words, two elements each, across the wait
    "relaxed_reread",  # nothing held across the wait: the chunk is read again (from L2) after it
)
# No wait with a chunk in registers (experiments/softmax_lagged.py, ch06_softmax_lagged.csv): persistent
# programs normalize the chunk they reduced LAG steps earlier, read again from L2; `shipped` is
# online_softmax's own choice.
LAGGED_VARIANTS = ("shipped", "lagged", "lagged_hints")
# 16-bit rows held as 32-bit words, two elements each (experiments/softmax_words.py, ch06_softmax_words.csv):
# whole rows with one element a register (`prefetch`, what float32 rows use) against the words kernel that
# online_softmax uses for 16-bit rows, and the split kernel against a words version of it.
WORDS_VARIANTS = ("shipped", "prefetch", "prefetch_words", "split", "split_words")
# One thread-block cluster a row, in CUDA (experiments/softmax_cluster.py, ch06_softmax_cluster.csv): the
# chunks exchange (m, l) through distributed shared memory after a hardware barrier. `cluster` launches one
# cluster a row; `cluster_persistent` launches the clusters the GPU holds and each walks rows, loading the
# next while it finishes this one; `plain_` drops the streaming cache hints of the loads and stores.
CLUSTER_VARIANTS = ("shipped", "cluster", "cluster_persistent", "plain_cluster_persistent")
# The exchange as one 64-bit (m, l) word per chunk, polled in place (experiments/softmax_slots.py,
# ch06_softmax_slots.csv): one relaxed atomic to publish, and the polled words are the data (no count, no
# fence, no second load); `split` is the shipped exchange at the same configurations.
SLOTS_VARIANTS = ("shipped", "split", "split_slots")
# The split kernel in CUDA with each chunk waiting in shared memory, copied there by cp.async, instead of in
# registers: few registers a thread, so 3 to 16 blocks an SM (experiments/softmax_staged.py,
# ch06_softmax_staged.csv).
STAGED_VARIANTS = ("shipped", "staged")
# The split kernel with fewer instructions an element (experiments/softmax_lean.py, ch06_softmax_lean.csv; the
# counts: ch06_softmax_lean_sass.csv): `split` is the shipped kernel at each configuration; `_fma` computes
# exp(x - m) with one fused multiply-add, `_words` holds the chunk as 32-bit words, `_packed` takes the max
# on bfloat16 pairs; `_r80` caps the registers so that three 256-thread programs fit an SM.
LEAN_VARIANTS = ("shipped", "split", "split_fma", "split_words_fma", "split_packed", "split_packed_fma",
                 "split_packed_fma_r80")  # fmt: skip


# The split kernel holding its raw words across the wait and exponentiating again after it
# (experiments/softmax_hold.py, ch06_softmax_hold.csv): `lean` is online_softmax's split_lean at its two tuned
# configurations; `hold` exponentiates on the MUFU, `hold_poly` on the FMA pipe (a polynomial), `hold_half`
# half on each; `hold_none` leaves the second exponentials out (a wrong result: what they cost).
HOLD_VARIANTS = ("shipped", "lean", "hold", "hold_poly", "hold_half", "hold_none")


def hold_by_programs(hold: Table, rows: int = 1024, cols: int = 262144) -> Table:
    """The hold kernel's configurations at (rows, cols) bfloat16, with the programs an SM its registers allow
    and the bytes of input those programs hold, most bytes first: what the register caps buy."""
    out = []
    for r in hold.where(rows=rows, cols=cols, dtype="bfloat16", variant="hold").rows:
        fields = dict(part.split("=") for part in r["config"].split())
        programs, block = int(fields["programs/SM"]), int(fields["block"])
        out.append({"block": block, "warps": int(fields["warps"]), "maxnreg": fields["maxnreg"],
                    "registers": int(fields["regs"]), "spilled_bytes": int(fields["spills"]),
                    "programs/SM": programs, "held_KiB/SM": programs * block * 2 // 1024,
                    "of_copy": round(r["fraction_of_same_size_copy"], 3)})  # fmt: skip
    return Table(sorted(out, key=lambda r: (-r["held_KiB/SM"], -r["of_copy"])))


def hold_best(hold: Table) -> Table:
    """best_softmax_variants of ch06_softmax_hold, each configuration cut to its launch: block, warps,
    register cap."""
    timed, _ = timed_and_checks(hold)
    best = best_softmax_variants(timed, HOLD_VARIANTS)
    return Table(r | {"config": " ".join(r["config"].split()[:3])} for r in best.rows)


# Persistent programs that load and publish their next chunk before they wait for the one they hold
# (experiments/softmax_pipelined.py, ch06_softmax_pipelined.csv): the wait hidden behind a chunk's load, two
# chunks held a program; `hold` is the split_hold kernel at its two register caps, in the same run.
PIPELINED_VARIANTS = ("shipped", "hold", "pipelined")


def pipelined_best(pipelined: Table) -> Table:
    """best_softmax_variants of ch06_softmax_pipelined, each configuration cut to its launch: block, warps,
    register cap and, for the persistent kernel, its programs an SM."""
    keep = ("block", "warps", "maxnreg", "programs/SM")

    def launch(config: str) -> str:  # the shipped row's config is its tuple: kept whole
        return " ".join(part for part in config.split() if part.split("=")[0] in keep) or config

    best = best_softmax_variants(pipelined, PIPELINED_VARIANTS)
    return Table(r | {"config": launch(r["config"])} for r in best.rows)


def timed_and_checks(table: Table) -> tuple[Table, Table]:
    """An experiment's rows split into the timed ones and the accuracy checks that were not timed (their
    fraction of a copy is NaN): softmax_lean checks its variants at extreme row maxima that way."""
    timed = [r for r in table.rows if not math.isnan(r["fraction_of_same_size_copy"])]
    return Table(timed), Table(r for r in table.rows if math.isnan(r["fraction_of_same_size_copy"]))


def lean_summary(lean: Table, counts: Table, rows: int = 1024, cols: int = 262144) -> Table:
    """Per variant of softmax_lean: its fastest configuration at (rows, cols) bfloat16 as a fraction of a
    copy, and that configuration compiled for sm_90 (ch06_softmax_lean_sass): SASS instructions an element,
    as a fraction of the shipped kernel's at the same configuration, and registers a thread."""
    timed, _ = timed_and_checks(lean)
    best = best_softmax_variants(timed.where(rows=rows, cols=cols, dtype="bfloat16"), LEAN_VARIANTS)
    out = []
    for r in best.rows:
        if r["variant"] == "shipped":
            continue  # the same kernel as `split`, at its tuned configuration
        block, warps = (int(part.split("=")[1]) for part in r["config"].split())
        compiled = {c["variant"]: c for c in counts.where(block_size=block, num_warps=warps).rows}
        mine = compiled.get(r["variant"])
        out.append({"variant": r["variant"], "config": r["config"], "of_copy": r["of_copy"],
                    "instr/element": mine["instructions_per_element"] if mine else "-",
                    "vs split": round(mine["instructions_per_element"]
                                      / compiled["split"]["instructions_per_element"], 2) if mine else "-",
                    "registers": mine["registers"] if mine else "-"})  # fmt: skip
    return Table(out)


def best_softmax_variants(table: Table, variants: tuple[str, ...] = SOFTMAX_VARIANTS) -> Table:
    """The fastest configuration of each of `variants` per shape, as a fraction of a same-size copy timed in
    the same run. `tuned` is the autotuned choice of the time (one_block, loop or split); `split_no_exchange`
    skips the programs' exchange (its result is wrong): the time of the memory traffic and the per-chunk
    work alone, so the distance from it to `tuned` is what the exchange costs."""
    rows = []
    shapes = dict.fromkeys((r["rows"], r["cols"], r["dtype"]) for r in table.rows)  # in the CSV's order
    for shape in sorted(shapes, key=lambda s: (s[1], s[2])):  # a stable sort: not a set's hash order
        group = [r for r in table.rows if (r["rows"], r["cols"], r["dtype"]) == shape]
        for variant in variants:
            runs = [r for r in group if r["variant"] == variant]
            if runs:
                best = max(runs, key=lambda r: r["fraction_of_same_size_copy"])
                rows.append(
                    {k: best[k] for k in ("rows", "cols", "dtype", "variant", "config", "correct")}
                    | {"of_copy": round(best["fraction_of_same_size_copy"], 3)}
                )
    return Table(rows)


@benchmark("ch06_online_softmax")
def bench_online_softmax() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    return [
        row
        for shape in SOFTMAX_SHAPES
        for dtype in (torch.float32, torch.bfloat16)
        for row in online_softmax_rows(*shape, dtype, copy_gbps)
    ]


def naive_memory_sweep(seqs, batch=1, heads=4, head_dim=64, dtype=None) -> Table:
    """Naive attention against the fused kernel over sequence lengths: the modeled HBM traffic and score
    bytes (lane-independent) beside the measured time and, on the GPU, measured extra peak memory."""
    dtype = dtype or (torch.bfloat16 if on_gpu() else torch.float32)  # the interpreter's bfloat16 is broken

    def measure(seq):
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device=DEVICE, dtype=dtype) for _ in range(3))
        out = {}
        for impl, fn, t in (
            ("naive", naive_attention, traffic.attention_naive(batch, heads, seq, head_dim, dtype)),
            ("fused", flash_attention, traffic.flash_attention(batch, heads, seq, head_dim, dtype)),
        ):
            with torch.no_grad():
                out[f"{impl}_mb_moved"] = t.bytes / 1e6
                out[f"{impl}_peak_mb"] = peak_extra_mb(lambda fn=fn: fn(q, k, v))
        with torch.no_grad():
            out["naive_ms"] = timing.time_ms(lambda: naive_attention(q, k, v))
        return out

    return sweep(measure, {"seq": list(seqs)}, desc="sequence length")


SWEEP_IMPLS = ("labkernels", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "naive")


def plot_sequence_sweep(sweep_table: Table, title: str = ""):
    """TFLOP/s and extra peak memory against sequence length, one line per implementation. The fused kernels
    hold the same memory, so their lines coincide: each gets its own marker, and the ones drawn first are
    wider, so every line still shows where they lie on top of each other."""
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(12, 4), layout="constrained")
    for i, (impl, marker) in enumerate(zip(SWEEP_IMPLS, "osD^vx", strict=True)):
        rows = [r for r in sweep_table.where(impl=impl).rows if r["tflops"] == r["tflops"]]  # NaN: not run
        seqs = [r["seq"] for r in rows]
        style = {"marker": marker, "markersize": 7 - i, "linewidth": 4 - 0.5 * i, "label": impl}
        speed.plot(seqs, [r["tflops"] for r in rows], **style)
        memory.plot(seqs, [max(r["peak_mb"], 1e-1) for r in rows], **style)  # log axis: no zeros
    for ax in (speed, memory):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.grid(True, alpha=0.3)
    speed.set_ylabel("TFLOP/s")
    memory.set_ylabel("extra peak memory, MB")
    memory.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(title, fontsize=9)
    return fig


# Every experiment on the widest rows, in the order they were run (notebooks/appendix/06_wide_row_softmax):
# the reference CSV and the variants it timed.
WIDE_ROW_EXPERIMENTS = {
    "ch06_softmax_variants": SOFTMAX_VARIANTS,
    "ch06_softmax_exchange": EXCHANGE_VARIANTS,
    "ch06_softmax_lagged": LAGGED_VARIANTS,
    "ch06_softmax_words": WORDS_VARIANTS,
    "ch06_softmax_cluster": CLUSTER_VARIANTS,
    "ch06_softmax_slots": SLOTS_VARIANTS,
    "ch06_softmax_staged": STAGED_VARIANTS,
    "ch06_softmax_lean": LEAN_VARIANTS,
    "ch06_softmax_hold": HOLD_VARIANTS,
    "ch06_softmax_pipelined": PIPELINED_VARIANTS,
}


def wide_row_designs(rows: int = 1024, cols: int = 262144, dtype: str = "bfloat16") -> Table:
    """One row per design of every wide-row experiment at (rows, cols, dtype): its best fraction of a
    same-size copy and whether its softmax was right. `shipped`/`tuned` rows are online_softmax as it was on
    the day of that experiment; the designs marked wrong skip the exchange (what the exchange costs)."""
    from labkernels.results import load_reference

    out = []
    for name, variants in WIDE_ROW_EXPERIMENTS.items():
        table = load_reference(name)
        if table is None:
            continue
        timed, _ = timed_and_checks(table)
        best = best_softmax_variants(timed.where(rows=rows, cols=cols, dtype=dtype), variants)
        for r in best.rows:
            out.append({"experiment": name.removeprefix("ch06_softmax_"), "design": r["variant"],
                        "correct": r["correct"], "of_copy": r["of_copy"]})  # fmt: skip
    return Table(out)
