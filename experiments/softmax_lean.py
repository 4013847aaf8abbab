"""Online softmax's split kernel with fewer instructions an element (an experiment, 16-bit rows).

At 2 bytes an element, a wide bfloat16 row gives an SM about 9 elements a cycle to keep up with HBM, and the
shipped split kernel spends about 12.75 instructions an element (ch06_softmax_sass.csv): near the 128 an SM
issues a cycle, so after each wait for the other chunks of its row a program has no slack to catch up.
Three cuts, each a switch of `lean_split_kernel`:

  FMA     exp(x - m) as exp2(x*log2e - m*log2e): one fused multiply-add instead of a subtract and a multiply.
          m*log2e is rounded (relative 2^-24), so the exponent is off by up to |m| * 1.4427 * 2^-24: for
          |m| < FMA_RANGE that is at most 1.1e-5 relative in the result, far below half a bfloat16 or float16
          ulp (2^-9, 2^-12). A chunk whose max is outside the range takes the exact path (a branch per chunk,
          not per element).
  WORDS   the chunk loaded and stored as 32-bit words of two elements (labkernels' `_widen`, `_narrow`).
  PACKED  with WORDS, the chunk's max taken on the words with `max.bf16x2` (one instruction per two
          elements; exact, a max does not round), before widening.

Every output is checked against the fp64 reference with the output poisoned first, beside the shipped
kernel and a copy of the same bytes, in one run.

    python experiments/softmax_lean.py OUTDIR         # GPU: table on stdout, OUTDIR/results.csv
    python experiments/softmax_lean.py OUTDIR --configs   # GPU: the leanest kernel over launch configurations
    python experiments/softmax_lean.py --sass [CSV]   # no GPU: SASS instructions an element of each variant
                                                   # (labkernels/reference/ch06_softmax_lean_sass.csv)
"""

import os
import sys

SASS_ONLY = __name__ == "__main__" and "--sass" in sys.argv
if SASS_ONLY:  # compile for sm_90 on a machine without a GPU: no interpreter
    os.environ.pop("TRITON_INTERPRET", None)
    import torch

    torch.cuda.is_available = lambda: True

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from labkernels.ch06_attention import online_softmax as osm  # noqa: E402

FMA_RANGE = 256.0
LOG2E = 1.4426950408889634
VARIANTS = {  # name: (FMA, WORDS, PACKED, MAXNREG): MAXNREG caps the registers a thread (None: ptxas decides)
    "split_fma": (True, False, False, None),
    "split_words_fma": (True, True, False, None),
    "split_packed_fma": (True, True, True, None),
    "split_packed": (False, True, True, None),
    # 80 registers a thread: three 256-thread programs an SM instead of two (a few bytes of spills)
    "split_packed_fma_r80": (True, True, True, 80),
}


@triton.jit
def _shift(m, FMA: tl.constexpr):
    """(A, B, correction) with exp(x - m) = exp2(x * A - B) * correction for the chunk's max m.
    Exact path (not FMA): A = log2e, B = 0 and x is shifted by m first (returned as the chunk's `x - m`).
    FMA path: B = fl(m * A) is rounded, but its rounding error r = m * A - B is exact in one fma, and
    exp2(-r) is one number for the whole chunk: the per-element work is one fma, the rounding costs nothing.
    A = log2e, except where |m| is so large that m * log2e could overflow (|m| >= 2^100): there every x that
    is not m itself is at least 2^93 below it, its exponential 0 in fp32, and A = 2^-100 keeps that so."""
    m_safe = tl.where(m == -float("inf"), 0.0, m)  # a chunk of -inf: every exponential is 0 anyway
    a = tl.where(tl.abs(m_safe) < 1.2676506002282294e30, 1.4426950408889634, 7.888609052210118e-31)
    b = m_safe * a
    r = tl.fma(m_safe, a, -b)  # m * a - b, exact
    return a, b, tl.exp2(-r)


@triton.jit
def _exp_shifted(x, m, FMA: tl.constexpr):
    """exp(x - m) of a chunk and the factor that completes it (1 on the exact path), m the chunk's max."""
    if FMA:
        a, b, correction = _shift(m, FMA)
        num = tl.exp2(x * a - b)  # one fma an element
    else:
        m_safe = tl.where(m == -float("inf"), 0.0, m)
        num = tl.exp2((x - m_safe) * 1.4426950408889634)
        correction = 1.0
    return num, correction


@triton.jit
def _max_bf16x2(a, b):
    return tl.inline_asm_elementwise("max.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)  # fmt: skip


@triton.jit
def lean_split_kernel(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                      BLOCK_SIZE: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                      MAX_SPIN: tl.constexpr, NEG_INF: tl.constexpr, FMA: tl.constexpr, WORDS: tl.constexpr,
                      PACKED: tl.constexpr):  # fmt: skip
    """labkernels' `_split_row_kernel` with the three switches of the module's docstring."""
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    if WORDS:
        N_WORDS: tl.constexpr = BLOCK_SIZE // 2
        HALF_VEC: tl.constexpr = VEC // 2
        words = chunk * N_WORDS + tl.arange(0, N_WORDS)
        mask = words < n_col_vecs * HALF_VEC
        x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (x_row_vecs * HALF_VEC)
        w = tl.load(x_words + words, mask=mask, other=NEG_INF)  # read N
        if PACKED:
            pair = tl.reduce(w, 0, _max_bf16x2)
            even, odd = osm._widen(w, DTYPE)
            pair_even, pair_odd = osm._widen(pair, DTYPE)
            m = tl.maximum(pair_even, pair_odd)
        else:
            even, odd = osm._widen(w, DTYPE)
            m = tl.max(tl.maximum(even, odd), axis=0)
        num_even, correction = _exp_shifted(even, m, FMA)
        num_odd, correction = _exp_shifted(odd, m, FMA)
        total = tl.sum(num_even + num_odd, axis=0) * correction
        rescale = osm._exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN) * correction
        out = osm._narrow(num_even * rescale, num_odd * rescale, DTYPE, True)
        out_words = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (out_row_vecs * HALF_VEC)
        tl.store(out_words + words, out, mask=mask)  # write N
    else:
        n_cols = n_col_vecs * VEC
        cols = chunk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(x_ptr + row64 * (x_row_vecs * VEC) + cols, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        num, correction = _exp_shifted(x, m, FMA)
        total = tl.sum(num, axis=0) * correction
        rescale = osm._exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN) * correction
        out = num * rescale
        tl.store(out_ptr + row64 * (out_row_vecs * VEC) + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def launch(x, out, block, warps, variant, maxnreg=None):
    fma, words, packed, cap_of_variant = VARIANTS[variant]
    maxnreg = maxnreg or cap_of_variant
    cap = {} if maxnreg is None else {"maxnreg": maxnreg}
    vec = osm.vector_width(x, out)
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    lean_split_kernel[(rows * chunks,)](out, x, stats, sync, cols // vec, x.stride(0) // vec,
                                        out.stride(0) // vec, BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec,
                                        MAX_SPIN=osm.MAX_SPIN, NEG_INF=osm.NEG_INF_WORD[x.dtype], FMA=fma,
                                        WORDS=words, PACKED=packed and x.dtype == torch.bfloat16,
                                        num_warps=warps, **cap)  # fmt: skip


SPLIT_CONFIGS = [(8192, 4), (16384, 8), (16384, 4), (32768, 8)]


SASS_FIELDS = ["device", "torch", "triton", "cuda", "date", "git", "variant", "block_size", "num_warps",
               "elements_per_thread", "instructions_per_element", "registers", "ffma", "fmnmx",
               "hmnmx2"]  # fmt: skip


def sass_counts(path: str) -> None:
    """Each variant compiled for sm_90 (bfloat16), its SASS counted (a static count: one instruction once;
    these kernels have no loop over elements, so it is the count a thread executes, give or take a branch)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90 import compile_sm90, compiled_meta, opcodes, sass_and_ptxas, write_reference

    sig = {"out_ptr": "*bf16", "x_ptr": "*bf16", "stats_ptr": "*fp32", "sync_ptr": "*i32",
           "n_col_vecs": "i32", "x_row_vecs": "i32", "out_row_vecs": "i32"}  # fmt: skip
    meta, rows = compiled_meta(), []
    for block, warps in SPLIT_CONFIGS:
        per_thread = block // (32 * warps)
        base = {"BLOCK_SIZE": block, "CHUNKS": 16, "VEC": 8, "MAX_SPIN": osm.MAX_SPIN}
        for name, switches in [("split", None), *VARIANTS.items()]:
            if switches is None:
                ptx = compile_sm90(osm._split_row_kernel, sig, base, warps)
            elif switches[3] is not None:
                continue  # a register cap is a launch option: the same instructions, spilled
            else:
                fma, words, packed, _ = switches
                consts = base | {"NEG_INF": osm.NEG_INF_WORD[torch.bfloat16], "FMA": fma, "WORDS": words,
                                 "PACKED": packed}  # fmt: skip
                ptx = compile_sm90(lean_split_kernel, sig, consts, warps)
            sass, info = sass_and_ptxas(ptx)
            ops = opcodes(sass)
            rows.append(meta | dict(variant=name, block_size=block, num_warps=warps,
                                    elements_per_thread=per_thread,
                                    instructions_per_element=round(sum(ops.values()) / per_thread, 2),
                                    registers=int(info.split("Used ")[1].split(" registers")[0]),
                                    ffma=ops["FFMA"], fmnmx=ops["FMNMX"], hmnmx2=ops["HMNMX2"]))  # fmt: skip
            print(rows[-1], flush=True)
    write_reference(path, SASS_FIELDS, rows)


def extreme_rows(lagged, rec) -> None:
    """The FMA path at maxima where m * log2e rounds coarsely or would overflow: rows near -1000 and +5000,
    and rows of values up to bfloat16's largest, each with a few -inf, checked against fp64."""
    from labkernels.ch06_attention.online_softmax import reference

    for label, make in [("near_-1000", lambda x: x * 3 - 1000), ("near_5000", lambda x: x * 3 + 5000),
                        ("huge", lambda x: x * 5e37)]:  # fmt: skip
        for dtype in ("bfloat16", "float16"):
            if label == "huge" and dtype == "float16":
                continue  # float16 overflows at 65504: "near_5000" is its large case
            case = lagged.Case(64, 262144, dtype)
            x = make(torch.randn(64, 262144, device="cuda", dtype=torch.float64))
            x[:, ::1000] = float("-inf")
            case.x = x.to(getattr(torch, dtype))
            case.ref = reference(case.x.double())
            for variant in VARIANTS:
                if VARIANTS[variant][2] and dtype != "bfloat16":
                    continue
                rec.measure(case, variant, f"{label} block=16384 warps=8",
                            lambda c=case, v=variant: launch(c.x, c.out, 16384, 8, v))  # fmt: skip


# --configs: the leanest kernel over launch shapes, with register caps that fit more programs an SM
MORE_CONFIGS = [(4096, 1, None), (4096, 2, None), (8192, 2, None), (8192, 4, None), (16384, 4, None),
                (16384, 4, 128), (16384, 4, 96), (8192, 2, 128), (16384, 8, None), (32768, 8, None),
                (32768, 16, None), (65536, 16, None)]  # fmt: skip


def sweep_configs(lagged, rec) -> None:
    for rows, cols in [(1024, 262144), (256, 1 << 20), (4096, 65536)]:
        case = lagged.case_beside_shipped(rec, rows, cols, "bfloat16")
        for block, warps, cap in MORE_CONFIGS:
            if cols // block > osm.MAX_CHUNKS:
                continue
            config = f"block={block} warps={warps}" + (f" maxnreg={cap}" if cap else "")
            call = lambda c=case, b=block, w=warps, r=cap: launch(c.x, c.out, b, w, "split_packed_fma", r)  # noqa: E731
            rec.measure(case, "split_packed_fma", config, call)
    rec.print_best()


def main() -> int:
    if SASS_ONLY:
        sass_counts(sys.argv[2] if len(sys.argv) > 2 else "labkernels/reference/ch06_softmax_lean_sass.csv")
        return 0
    import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    if "--configs" in sys.argv:
        sweep_configs(lagged, rec)
        return 0
    shapes = [(1024, 262144, "bfloat16"), (1024, 262144, "float16"), (4096, 65536, "bfloat16"),
              (256, 1 << 20, "bfloat16")]  # fmt: skip
    for rows, cols, dtype in shapes:
        case = lagged.case_beside_shipped(rec, rows, cols, dtype)
        for block, warps in SPLIT_CONFIGS:
            rec.measure(case, "split", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: osm._launch(c.x, c.out, b, w, "split"))  # fmt: skip
            for variant in VARIANTS:
                if VARIANTS[variant][3] and block // (32 * warps) != 64:
                    continue  # the cap fits 64 elements a thread, not more
                if VARIANTS[variant][2] and dtype != "bfloat16":
                    continue
                config = f"block={block} warps={warps}"
                call = lambda c=case, b=block, w=warps, v=variant: launch(c.x, c.out, b, w, v)  # noqa: E731
                rec.measure(case, variant, config, call)
        # The shipped kernel once more at the end: how far the GPU drifted during the run.
        rec.measure(case, "shipped_again", str(osm.config(rows, cols, getattr(torch, dtype))),
                    lambda c=case: osm.online_softmax(c.x, c.out))  # fmt: skip
    extreme_rows(lagged, rec)
    rec.print_best()
    return 0


if __name__ == "__main__":
    sys.exit(main())
