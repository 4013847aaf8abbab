"""Online-softmax variants, second round (issue 15): overlap a program's fixed costs with its next load.

- prefetch: persistent programs over whole rows (rows up to 32768), the next row's load issued before this
  row is reduced, so an SM's loads never stop while it reduces, exponentiates and stores.
- split_nosync: the split kernel with its wait and exchange removed (wrong results): what the sync costs.
- split_pipe: a wide row over CHUNKS programs as in the shipped split kernel, but persistent: a program takes
  its next chunk's ticket and issues that load before it waits for the current row, so the wait overlaps a
  load. A program publishes every chunk it holds before it waits (a chunk of the row it waits on included),
  so each row's chunks all arrive: no deadlock.
Usage: python experiments/softmax_variants2.py OUTDIR
"""

import csv
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def prefetch(out_ptr, x_ptr, n_rows, n_col_vecs, x_row_vecs, out_row_vecs, BLOCK: tl.constexpr, VEC: tl.constexpr):
    n_cols, sx, so = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    cmask = cols < n_cols
    nxt = tl.load(x_ptr + pid.to(tl.int64) * sx + cols, mask=cmask & (pid < n_rows), other=-float("inf"))
    for r in range(pid, n_rows, step):
        xr = nxt
        rn = r + step
        nxt = tl.load(x_ptr + rn.to(tl.int64) * sx + cols, mask=cmask & (rn < n_rows), other=-float("inf"))
        x = xr.to(tl.float32)
        num = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)
        out = num * (1.0 / tl.sum(num, axis=0))
        tl.store(out_ptr + tl.cast(r, tl.int64) * so + cols, out.to(out_ptr.dtype.element_ty), mask=cmask)


@triton.jit
def split_nosync(out_ptr, x_ptr, n_col_vecs, x_row_vecs, out_row_vecs, BLOCK: tl.constexpr,
                 CHUNKS: tl.constexpr, VEC: tl.constexpr):
    n_cols, sx, so = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    t = tl.program_id(0)
    row = (t // CHUNKS).to(tl.int64)
    cols = (t % CHUNKS) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * sx + cols, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    num = tl.exp2((x - m) * 1.4426950408889634)
    out = num * (1.0 / tl.sum(num, axis=0))
    tl.store(out_ptr + row * so + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _publish(stats_ptr, sync_ptr, xr, t, CHUNKS: tl.constexpr):
    """The chunk's (max, sum of exp) into its slot, then its row's arrival count + 1 (release)."""
    x = xr.to(tl.float32)
    m = tl.max(x, axis=0)
    m_safe = tl.where(m == -float("inf"), 0.0, m)
    total = tl.sum(tl.exp2((x - m_safe) * 1.4426950408889634), axis=0)
    stat = stats_ptr + t.to(tl.int64) * 2
    tl.store(stat, m)
    tl.store(stat + 1, total)
    tl.debug_barrier()
    tl.atomic_add(sync_ptr + 1 + t // CHUNKS, 1, sem="release")


@triton.jit
def _finish(out_ptr, stats_ptr, sync_ptr, xr, t, n_cols, so, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    """Wait for every chunk of t's row, merge their states, write t's chunk."""
    row = t // CHUNKS
    arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
    spins = arrived * 0
    while (arrived < CHUNKS) & (spins < 65536):
        arrived = tl.atomic_add(sync_ptr + 1 + row, 0, sem="acquire")
        spins += 1
    tl.debug_barrier()
    idx = tl.arange(0, CHUNKS)
    base = stats_ptr + (row.to(tl.int64) * CHUNKS + idx) * 2
    ms = tl.load(base, volatile=True)
    ls = tl.load(base + 1, volatile=True)
    row_max = tl.max(ms, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    row_sum = tl.sum(ls * tl.exp2((ms - row_max) * 1.4426950408889634), axis=0)
    out = tl.exp2((xr.to(tl.float32) - row_max) * 1.4426950408889634) * (1.0 / row_sum)
    out = tl.where(arrived >= CHUNKS, out, float("nan"))
    cols = (t % CHUNKS) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + row.to(tl.int64) * so + cols, out.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def split_pipe(out_ptr, x_ptr, stats_ptr, sync_ptr, n_rows, n_col_vecs, x_row_vecs, out_row_vecs,
               BLOCK: tl.constexpr, CHUNKS: tl.constexpr, VEC: tl.constexpr):
    n_cols, sx, so = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    n_tickets = n_rows * CHUNKS
    offs = tl.arange(0, BLOCK)
    t = tl.atomic_add(sync_ptr, 1)
    cols = (t % CHUNKS) * BLOCK + offs
    xa = tl.load(x_ptr + (t // CHUNKS).to(tl.int64) * sx + cols, mask=(cols < n_cols) & (t < n_tickets),
                 other=-float("inf"))
    if t < n_tickets:
        _publish(stats_ptr, sync_ptr, xa, t, CHUNKS)
    while t < n_tickets:
        t2 = tl.atomic_add(sync_ptr, 1)
        cols2 = (t2 % CHUNKS) * BLOCK + offs
        xb = tl.load(x_ptr + (t2 // CHUNKS).to(tl.int64) * sx + cols2, mask=(cols2 < n_cols) & (t2 < n_tickets),
                     other=-float("inf"))  # in flight during the wait below
        same_row = (t2 < n_tickets) & (t2 // CHUNKS == t // CHUNKS)
        if same_row:  # we hold a chunk of the row we wait for: publish it first
            _publish(stats_ptr, sync_ptr, xb, t2, CHUNKS)
        _finish(out_ptr, stats_ptr, sync_ptr, xa, t, n_cols, so, BLOCK, CHUNKS)
        if (t2 < n_tickets) & (t2 // CHUNKS != t // CHUNKS):
            _publish(stats_ptr, sync_ptr, xb, t2, CHUNKS)
        xa = xb
        t = t2


def bench(fn, reps=60):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=reps, return_mode="median")


def vec_args(x, out):
    vec = 16 // x.element_size()
    while vec > 1 and (x.shape[1] % vec or x.stride(0) % vec or out.stride(0) % vec):
        vec //= 2
    return vec, (x.shape[1] // vec, x.stride(0) // vec, out.stride(0) // vec)


def run_prefetch(x, out, warps, per_sm):
    vec, args = vec_args(x, out)
    grid = min(x.shape[0], torch.cuda.get_device_properties(0).multi_processor_count * per_sm)
    return prefetch[(grid,)](out, x, x.shape[0], *args, BLOCK=triton.next_power_of_2(x.shape[1]), VEC=vec,
                             num_warps=warps)


def run_nosync(x, out, block, warps):
    vec, args = vec_args(x, out)
    chunks = triton.next_power_of_2(triton.cdiv(x.shape[1], block))
    return split_nosync[(x.shape[0] * chunks,)](out, x, *args, BLOCK=block, CHUNKS=chunks, VEC=vec,
                                                num_warps=warps)


def run_pipe(x, out, block, warps, per_sm):
    vec, args = vec_args(x, out)
    rows = x.shape[0]
    chunks = triton.next_power_of_2(triton.cdiv(x.shape[1], block))
    stats = torch.empty(rows, chunks, 2, device=x.device, dtype=torch.float32)
    sync = torch.zeros(1 + rows, device=x.device, dtype=torch.int32)
    grid = min(rows * chunks, torch.cuda.get_device_properties(0).multi_processor_count * per_sm)
    return split_pipe[(grid,)](out, x, stats, sync, rows, *args, BLOCK=block, CHUNKS=chunks, VEC=vec,
                               num_warps=warps)


def variants(cols):
    whole = triton.next_power_of_2(cols)
    out = []
    if whole <= 32768:
        for w in (8, 16, 32):
            if 4 <= whole // (32 * w) <= 64:
                out += [("prefetch", dict(warps=w, per_sm=p)) for p in (1, 2, 4)]
    for block, w in ((4096, 4), (8192, 4), (8192, 8), (16384, 8), (16384, 16)):
        if 2 <= whole // block <= 64:
            out.append(("nosync", dict(block=block, warps=w)))
            out += [("pipe", dict(block=block, warps=w, per_sm=p)) for p in (1, 2, 4, 8)]
    return out


def main(outdir):
    import labkernels  # noqa: F401  (the lane)
    from labkernels.ch06_attention import online_softmax as osm

    rows_out = []
    t0 = time.time()
    for rows, cols, dtype in ((4096, 32768, torch.bfloat16), (1024, 262144, torch.bfloat16),
                              (1024, 262144, torch.float32), (8192, 5000, torch.bfloat16),
                              (8192, 5000, torch.float32), (4096, 32768, torch.float32)):
        x = torch.randn(rows, cols, device="cuda").to(dtype) * 3
        ref = torch.softmax(x.double(), dim=1)
        out = torch.empty_like(x)
        copy_ms = bench(lambda: out.copy_(x))
        ship_ms = bench(lambda: osm.online_softmax(x, out))
        base = dict(rows=rows, cols=cols, dtype=str(dtype).split(".")[1], copy_ms=copy_ms)
        rows_out.append(base | dict(kind="shipped", cfg=str(osm.config(rows, cols, dtype)), ms=ship_ms,
                                    frac=copy_ms / ship_ms, regs="", spills="", err=""))
        print(f"{rows}x{cols} {dtype}: copy {copy_ms * 1e3:.1f} us, shipped {ship_ms * 1e3:.1f} us = "
              f"{copy_ms / ship_ms:.3f} of copy", flush=True)
        for kind, cfg in variants(cols):
            if time.time() - t0 > 200:
                print("time budget spent", flush=True)
                break
            run = {"prefetch": run_prefetch, "nosync": run_nosync, "pipe": run_pipe}[kind]
            try:
                out.fill_(float("nan"))
                k = run(x, out, **cfg)
                torch.cuda.synchronize()
                err = (out.double() - ref).abs().max().item()
                ms = bench(lambda: run(x, out, **cfg))  # noqa: B023
                r = base | dict(kind=kind, cfg=str(cfg), ms=ms, frac=copy_ms / ms, regs=k.n_regs,
                                spills=k.n_spills, err=err)
            except Exception as e:  # noqa: BLE001
                r = base | dict(kind=kind, cfg=str(cfg), ms=float("nan"), frac=float("nan"), regs="",
                                spills="", err=f"{type(e).__name__}: {str(e)[:80]}")
            rows_out.append(r)
            print(f"  {kind:9s} {r['cfg']:55s} {r['ms'] * 1e3:8.1f} us {r['frac']:.3f} regs={r['regs']} "
                  f"spills={r['spills']} err={r['err']}", flush=True)
    with open(f"{outdir}/variants2.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows_out[0]))
        w.writeheader()
        w.writerows(rows_out)


if __name__ == "__main__":
    main(sys.argv[1])
