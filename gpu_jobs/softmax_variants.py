"""Online-softmax variants on wide rows (issue 15): which change closes the bf16 gap to copy bandwidth?

Variants of the shipped kernels (labkernels/ch06_attention/online_softmax.py), each timed beside a copy of
the same bytes, with registers/spills read from the compiled kernel and the result checked against fp64:
- one_block: the whole row in one program; PACKED=0 keeps fp32 x/exp live, 1 keeps the loaded bf16 row and
  recomputes exp for the output (fewer registers, two exps), 2 keeps exp(x - m) rounded to bf16 (one exp).
- split: a row over CHUNKS programs exchanging (max, sum); TICKET=0 maps programs to chunks by program id
  (no ticket atomic before the load), POLL_VOLATILE=1 polls with a load instead of an atomic.
Usage: python gpu_jobs/softmax_variants.py OUTDIR
"""

import csv
import sys
import time

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _to_fp32(xr, x, PACKED: tl.constexpr):
    if PACKED == 1:  # bf16 bits << 16 is the fp32 value: a second, distinct conversion the compiler won't merge
        return (xr.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return x


@triton.jit
def one_block(out_ptr, x_ptr, n_cols, sx, so, BLOCK: tl.constexpr, PACKED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    xr = tl.load(x_ptr + row * sx + cols, mask=mask, other=-float("inf"))
    x = xr.to(tl.float32)
    m = tl.max(x, axis=0)
    if PACKED == 0:
        num = tl.exp2((x - m) * 1.4426950408889634)
        out = num * (1.0 / tl.sum(num, axis=0))
    elif PACKED == 1:
        s = tl.sum(tl.exp2((x - m) * 1.4426950408889634), axis=0)
        out = tl.exp2((_to_fp32(xr, x, 1) - m) * 1.4426950408889634) * (1.0 / s)
    else:
        num = tl.exp2((x - m) * 1.4426950408889634)
        s = tl.sum(num, axis=0)
        out = num.to(out_ptr.dtype.element_ty).to(tl.float32) * (1.0 / s)
    tl.store(out_ptr + row * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def split(
    out_ptr, x_ptr, stats_ptr, sync_ptr, n_cols, sx, so,
    BLOCK: tl.constexpr, CHUNKS: tl.constexpr, TICKET: tl.constexpr, POLL_VOLATILE: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    if TICKET:
        ticket = tl.atomic_add(sync_ptr, 1)
    else:
        ticket = tl.program_id(0)
    row = ticket // CHUNKS
    chunk = ticket % CHUNKS
    row64 = row.to(tl.int64)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    xr = tl.load(x_ptr + row64 * sx + cols, mask=mask, other=-float("inf"))
    x = xr.to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    if PACKED == 2:
        num = tl.exp2((x - m_safe) * 1.4426950408889634)
        total = tl.sum(num, axis=0)
        keep = num.to(out_ptr.dtype.element_ty)
    else:
        total = tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
    stat = stats_ptr + (row64 * CHUNKS + chunk) * 2
    tl.store(stat, m)
    tl.store(stat + 1, total)
    tl.debug_barrier()
    arrived = tl.atomic_add(sync_ptr + 1 + row, 1, sem="release") + 1
    spins = arrived * 0
    while (arrived < CHUNKS) & (spins < 65536):
        if POLL_VOLATILE:
            arrived = tl.load(sync_ptr + 1 + row, volatile=True)
        else:
            arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    idx = tl.arange(0, CHUNKS)
    ms = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2, volatile=True)
    ls = tl.load(stats_ptr + (row64 * CHUNKS + idx) * 2 + 1, volatile=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(ls * tl.exp2((ms - row_max) * 1.4426950408889634), axis=0)
    inv = 1.0 / row_sum
    if PACKED == 2:  # num was taken against the chunk's own max: rescale to the row's
        out = keep.to(tl.float32) * (tl.exp2((m_safe - row_max) * 1.4426950408889634) * inv)
    else:
        out = tl.exp2((_to_fp32(xr, x, PACKED) - row_max) * 1.4426950408889634) * inv
    out = tl.where(arrived >= CHUNKS, out, float("nan"))
    tl.store(out_ptr + row64 * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def bench(fn, reps=60):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median")


def run_one_block(x, out, block, warps, packed):
    return one_block[(x.shape[0],)](out, x, x.shape[1], x.stride(0), out.stride(0), BLOCK=block, PACKED=packed,
                                    num_warps=warps)


def run_split(x, out, block, warps, ticket, poll, packed):
    rows, cols = x.shape
    chunks = triton.next_power_of_2(triton.cdiv(cols, block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    return split[(rows * chunks,)](out, x, stats, sync, cols, x.stride(0), out.stride(0), BLOCK=block,
                                   CHUNKS=chunks, TICKET=ticket, POLL_VOLATILE=poll, PACKED=packed,
                                   num_warps=warps)


def variants(cols, dtype):
    whole = triton.next_power_of_2(cols)
    packs = (0, 1, 2) if dtype == torch.bfloat16 else (0,)
    out = []
    if whole <= 32768:
        for w in (8, 16, 32):
            if 4 <= whole // (32 * w) <= 128:
                out += [("one_block", dict(block=whole, warps=w, packed=p)) for p in packs]
    for block, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16), (32768, 16)):
        if 2 <= whole // block <= 64:
            for p in packs:
                out.append(("split", dict(block=block, warps=w, ticket=1, poll=0, packed=p)))
                out.append(("split", dict(block=block, warps=w, ticket=1, poll=1, packed=p)))
            out.append(("split", dict(block=block, warps=w, ticket=0, poll=1, packed=packs[-1])))
    return out


def main(outdir):
    import labkernels  # noqa: F401  (the lane)
    from labkernels.ch06_attention import online_softmax as osm

    rows_out = []
    t0 = time.time()
    for rows, cols, dtype in ((4096, 32768, torch.bfloat16), (1024, 262144, torch.bfloat16),
                              (1024, 262144, torch.float32), (8192, 5000, torch.bfloat16),
                              (4096, 32768, torch.float32)):
        x = torch.randn(rows, cols, device="cuda").to(dtype) * 3
        ref = torch.softmax(x.double(), dim=1)
        out = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()
        copy_ms = bench(lambda: out.copy_(x))
        shipped = osm.config(rows, cols, dtype)
        ship_ms = bench(lambda: osm.online_softmax(x, out))
        base = dict(rows=rows, cols=cols, dtype=str(dtype).split(".")[1], copy_ms=copy_ms)
        rows_out.append(base | dict(kind="shipped", cfg=str(shipped), ms=ship_ms, frac=copy_ms / ship_ms,
                                    regs="", spills="", err=""))
        print(f"{rows}x{cols} {dtype}: copy {copy_ms * 1e3:.1f} us, shipped {shipped} "
              f"{ship_ms * 1e3:.1f} us = {copy_ms / ship_ms:.3f} of copy", flush=True)
        for kind, cfg in variants(cols, dtype):
            if time.time() - t0 > 230:
                print("time budget spent", flush=True)
                break
            try:
                out.fill_(float("nan"))
                if kind == "one_block":
                    k = run_one_block(x, out, **cfg)
                    fn = lambda: run_one_block(x, out, **cfg)  # noqa: E731
                else:
                    k = run_split(x, out, **cfg)
                    fn = lambda: run_split(x, out, **cfg)  # noqa: E731
                torch.cuda.synchronize()
                err = (out.double() - ref).abs().max().item()
                ms = bench(fn)
                r = base | dict(kind=kind, cfg=str(cfg), ms=ms, frac=copy_ms / ms, regs=k.n_regs,
                                spills=k.n_spills, err=err)
            except Exception as e:  # noqa: BLE001
                r = base | dict(kind=kind, cfg=str(cfg), ms=float("nan"), frac=float("nan"), regs="",
                                spills="", err=f"{type(e).__name__}: {str(e)[:80]}")
            rows_out.append(r)
            print(f"  {kind:9s} {r['cfg']:75s} {r['ms'] * 1e3:8.1f} us {r['frac']:.3f} regs={r['regs']} "
                  f"spills={r['spills']} err={r['err']}", flush=True)
    with open(f"{outdir}/variants.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        w.writeheader()
        w.writerows(rows_out)


if __name__ == "__main__":
    main(sys.argv[1])
