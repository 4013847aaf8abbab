"""Online softmax's split kernel holding only its raw 16-bit words across the wait (an experiment, bfloat16).

The split kernels keep exp(x - m) of their chunk in fp32 registers while they wait for the row's other chunks:
one register an element. A 16384-element chunk at 4 warps then takes about 200 registers a thread, two
programs fit an SM, and while one waits the SM has at most one chunk's loads in flight. Without the wait the
same kernel runs at 0.97-0.98 of a copy (ch06_softmax_exchange.csv, POLL="none"). Here a program keeps only
the words it loaded (two bfloat16 a register: half the registers an element) and computes exp(x - m) again
after the wait: twice the exponentials (MUFU work), for twice the programs an SM, so more chunks load while
others wait. The question: does the bytes-in-flight reading of the gap hold?

The second pass must not reuse the first pass's exponentials, or the compiler keeps them live across the wait
and the registers come back: the words are widened again by inline PTX marked impure (`_widen_again`), which
the compiler may neither merge with the first widening nor move. The arithmetic is labkernels'
`_split_lean_kernel`'s (`_exp2_shift`: one fma an element, its rounding folded into the chunk's factor), so
the results equal the lean kernel's bit for bit (the `differ_from_lean` field of each row counts the
elements that differ). labkernels ships this kernel as online_softmax's mode `split_hold`
(`_split_lean_kernel` with HOLD, capped by `hold_registers`); the copy here also has the variants of the
second exponentials.

    python experiments/softmax_hold.py OUTDIR        # GPU: table on stdout, OUTDIR/results.csv
    python experiments/softmax_hold.py --registers  # no GPU: registers and programs an SM, for sm_90
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

# (BLOCK_SIZE, num_warps, maxnreg): the hold kernel's registers peak while it exponentiates, not while it
# waits, so ptxas allocates about as many as the lean kernel's unless capped; capped at about the held words
# plus 32 it does not spill (`--registers`), and more programs fit an SM.
CONFIGS = [(8192, 2, None), (8192, 2, 96), (8192, 2, 80), (8192, 4, None), (16384, 4, None), (16384, 4, 128),
           (16384, 4, 96), (16384, 4, 80), (16384, 8, 72), (32768, 4, 168), (32768, 4, 144), (32768, 8, 96),
           (65536, 8, 160), (16384, 4, 72), (8192, 2, 72), (16384, 2, 144), (16384, 2, 160)]  # fmt: skip
# the second exponentials on the FMA pipe ("poly"), split between the pipes ("half"), or left out ("none": a
# diagnostic, wrong results), at the configs where the MUFU version did best
SECOND_CONFIGS = [(16384, 4, 80), (16384, 4, 96), (8192, 2, 80), (32768, 4, 168)]
LEAN_CONFIGS = [(8192, 4), (16384, 4)]  # the lean kernel's tuned configs


@triton.jit
def _widen_again(w):
    """`_widen` of bfloat16 words through impure PTX: a second widening the compiler cannot merge with the
    first, so nothing computed from the first survives the wait."""
    even = tl.inline_asm_elementwise(
        "shl.b32 $0, $1, 16;", "=r,r", [w], dtype=tl.int32, is_pure=False, pack=1
    )
    odd = tl.inline_asm_elementwise(
        "and.b32 $0, $1, 0xFFFF0000;", "=r,r", [w], dtype=tl.int32, is_pure=False, pack=1
    )
    return even.to(tl.float32, bitcast=True), odd.to(tl.float32, bitcast=True)


@triton.jit
def _exp2_poly(t):
    """2^t for t <= 0 on the FMA pipe, not the MUFU: t = j + f with j = round(t) (the 1.5 * 2^23 trick: an
    add and a subtract) and |f| <= 1/2; 2^f by its degree-4 Taylor polynomial (relative error below 4.2e-5,
    2% of half a bfloat16 ulp); 2^j added to the result's exponent bits. Below 2^-125 it returns 0 (those
    outputs are below bfloat16's smallest normal)."""
    tc = tl.maximum(t, -125.0)
    shifted = tc + 12582912.0  # 1.5 * 2^23: the sum rounds to an integer, held in the low mantissa bits
    j = shifted - 12582912.0
    f = tc - j
    p = 0.009618129107628477 * f + 0.05550410866482158
    p = p * f + 0.2402265069591007
    p = p * f + 0.6931471805599453
    p = p * f + 1.0
    bits = p.to(tl.int32, bitcast=True) + (shifted.to(tl.int32, bitcast=True) << 23)
    return tl.where(t < -125.0, 0.0, bits.to(tl.float32, bitcast=True))


@triton.jit
def _second_exp2(t, SECOND: tl.constexpr):
    if SECOND == "poly":
        return _exp2_poly(t)
    elif SECOND == "none":  # a diagnostic: the second pass without its exponentials (wrong results)
        return t
    else:
        return tl.exp2(t)


@triton.jit
def hold_split_kernel(out_ptr, x_ptr, stats_ptr, sync_ptr, n_col_vecs, x_row_vecs, out_row_vecs,
                      BLOCK_SIZE: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr,
                      MAX_SPIN: tl.constexpr, NEG_INF: tl.constexpr,
                      SECOND: tl.constexpr = "mufu"):  # fmt: skip
    """`_split_lean_kernel` (bfloat16, GPU) that holds the loaded words, not their exponentials, while it
    waits, and exponentiates again after the wait. Traffic as the split kernel: read MN, write MN."""
    WORDS: tl.constexpr = BLOCK_SIZE // 2
    HALF_VEC: tl.constexpr = VEC // 2
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    words = chunk * WORDS + tl.arange(0, WORDS)
    mask = words < n_col_vecs * HALF_VEC
    x_words = x_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (x_row_vecs * HALF_VEC)
    w = tl.load(x_words + words, mask=mask, other=NEG_INF)  # read N: the only thing held across the wait
    pairs = tl.reduce(w, 0, osm._max_bf16_pairs)
    pair_even, pair_odd = osm._widen(pairs, tl.bfloat16)
    m = tl.maximum(pair_even, pair_odd)
    a, b, correction = osm._exp2_shift(m)
    even, odd = osm._widen(w, tl.bfloat16)
    total = tl.sum(tl.exp2(even * a - b) + tl.exp2(odd * a - b), axis=0) * correction  # first exponentials
    rescale = osm._exchange(stats_ptr, sync_ptr, row, chunk, m, total, CHUNKS, MAX_SPIN) * correction
    even, odd = _widen_again(w)
    # SECOND: "mufu" (tl.exp2), "poly" (the FMA pipe), "half" (even columns on the FMA pipe, odd on the
    # MUFU: both pipes busy), "none" (a diagnostic without them)
    num_even = _second_exp2(even * a - b, "poly" if SECOND == "half" else SECOND)
    num_odd = _second_exp2(odd * a - b, "mufu" if SECOND == "half" else SECOND)
    out = osm._narrow(num_even * rescale, num_odd * rescale, tl.bfloat16, True)
    out_words = out_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + row64 * (out_row_vecs * HALF_VEC)
    tl.store(out_words + words, out, mask=mask)  # write N


def launch(x, out, block, warps, maxnreg=None, second="mufu"):
    """Returns the compiled kernel (its n_regs and n_spills)."""
    vec = osm.vector_width(x, out)
    if x.dtype != torch.bfloat16 or vec % 2:
        raise ValueError("hold_split_kernel: bfloat16 rows of whole 32-bit words only")
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    cap = {} if maxnreg is None else {"maxnreg": maxnreg}
    return hold_split_kernel[(rows * chunks,)](out, x, stats, sync, cols // vec, x.stride(0) // vec,
                                               out.stride(0) // vec, BLOCK_SIZE=block, CHUNKS=chunks, VEC=vec,
                                               MAX_SPIN=osm.MAX_SPIN, NEG_INF=osm.NEG_INF_WORD[x.dtype],
                                               SECOND=second, num_warps=warps, **cap)  # fmt: skip


def launch_lean(x, out, block, warps):
    """The shipped lean kernel at any config (osm._launch's split_lean, outside the tuning)."""
    osm._launch(x, out, block, warps, "split_lean")


def programs_per_sm(regs: int, warps: int) -> int:
    """Programs an H200 SM holds by registers (64K a SM, allocated 8 a thread at a time, 64 warps at most)."""
    return min(65536 // ((regs + 7) // 8 * 8 * 32 * warps), 64 // warps, 32)


def beside_lean(case, block: int, warps: int, cap, second: str) -> str:
    """Registers, spills and programs an SM of the compiled hold kernel, and how many of its outputs differ
    from the lean kernel's at the same chunk size (with the MUFU's exponentials none: the same arithmetic)."""
    compiled = launch(case.x, case.out, block, warps, cap, second)
    hold = case.out.clone()
    launch_lean(case.x, case.out, block, 4)
    differ = (hold.view(torch.int16) != case.out.view(torch.int16)).double().mean().item()
    per_sm = programs_per_sm(compiled.n_regs, warps)
    regs = f" regs={compiled.n_regs} spills={compiled.n_spills} programs/SM={per_sm}"
    return regs + f" differ_from_lean={differ:.2g}"


def registers() -> None:
    """Registers a thread and programs an SM (by registers) of the hold kernel and the lean one, sm_90."""
    sys.path.insert(0, os.path.dirname(__file__))
    from sm90 import compile_sm90, opcodes, sass_and_ptxas

    sig = {"out_ptr": "*bf16", "x_ptr": "*bf16", "stats_ptr": "*fp32", "sync_ptr": "*i32",
           "n_col_vecs": "i32", "x_row_vecs": "i32", "out_row_vecs": "i32"}  # fmt: skip
    for block, warps, _ in CONFIGS:
        base = {"BLOCK_SIZE": block, "CHUNKS": 16, "VEC": 8, "MAX_SPIN": osm.MAX_SPIN,
                "NEG_INF": osm.NEG_INF_WORD[torch.bfloat16]}  # fmt: skip
        for name, kernel, consts in [("lean", osm._split_lean_kernel, base | {"PTX": True}),
                                     ("hold", hold_split_kernel, base)]:  # fmt: skip
            sass, info = sass_and_ptxas(compile_sm90(kernel, sig, consts, warps))
            regs = int(info.split("Used ")[1].split(" registers")[0])
            spill = "spill" in info and " 0 bytes spill stores" not in info
            per_sm = programs_per_sm(regs, warps)
            ops = opcodes(sass)
            print(f"{name:5} block={block:6} warps={warps:2} regs={regs:3} programs/SM={per_sm} "
                  f"MUFU={ops['MUFU']} instr/elem={sum(ops.values()) / (block / 32 / warps):.2f}"
                  f"{' SPILLS' if spill else ''}", flush=True)  # fmt: skip


def main() -> int:
    if REGISTERS_ONLY:
        registers()
        return 0
    import softmax_lagged as lagged  # Case, Recorder, bench: the same measurement as the other experiments

    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rec = lagged.Recorder(os.path.join(out_dir, "results.csv"))
    for rows, cols in [(1024, 262144), (256, 1 << 20), (4096, 65536), (4096, 32768)]:
        case = lagged.case_beside_shipped(rec, rows, cols, "bfloat16")
        for block, warps in LEAN_CONFIGS:
            rec.measure(case, "lean", f"block={block} warps={warps}",
                        lambda c=case, b=block, w=warps: launch_lean(c.x, c.out, b, w))  # fmt: skip
        for block, warps, cap in CONFIGS:
            if not 2 <= cols // block <= osm.MAX_CHUNKS:
                continue
            config = f"block={block} warps={warps} maxnreg={cap}" + beside_lean(
                case, block, warps, cap, "mufu"
            )
            call = lambda c=case, b=block, w=warps, r=cap: launch(c.x, c.out, b, w, r)  # noqa: E731
            rec.measure(case, "hold", config, call)
        for second in ("poly", "half", "none"):
            for block, warps, cap in SECOND_CONFIGS:
                if not 2 <= cols // block <= osm.MAX_CHUNKS:
                    continue
                config = f"block={block} warps={warps} maxnreg={cap}" + beside_lean(
                    case, block, warps, cap, second
                )
                call = lambda c=case, b=block, w=warps, r=cap, s=second: launch(c.x, c.out, b, w, r, s)  # noqa: E731
                rec.measure(case, f"hold_{second}", config, call)
        rec.measure(case, "shipped_again", str(osm.config(rows, cols, torch.bfloat16)),
                    lambda c=case: osm.online_softmax(c.x, c.out))  # fmt: skip
    rec.print_best()
    return 0


if __name__ == "__main__":
    sys.exit(main())
