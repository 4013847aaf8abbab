"""Chapter 07 on the H200: correctness at full sizes, then the measurements the notebook draws.

Writes into $OUT (or the folder given as the first argument), one CSV a section, each as soon as it is done:
  ch07_roofs.csv             copy and read-only stream bandwidth
  ch07_decode_attention.csv  ours (contiguous, paged) vs SDPA default, FLASH and compiled FlexAttention, B
                             in {1, 8, 64}, L in {4k, 32k, 128k}, Hq 32, Hkv 8, D 128, bf16; graph replays
                             and plain calls, alternating
  ch07_int4.csv              4-bit GEMV vs bf16 cuBLAS and torch's _weight_int4pack_mm, M in {1, 16}
  ch07_decode_step.csv       one Llama-3-8B-sized layer: ours eager / CUDA graph, torch eager / compile
  ch07_decode_configs.csv    (with --explore) other block sizes, warps, stages and split counts
A section that would start past the time budget is skipped and says so; CH07_SKIP="int4,decode step" leaves
out the sections it names (the roof is measured whenever a later section needs it).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch

import labkernels  # noqa: F401  (picks the lane before triton)
from labkernels import results, roofline, timing
from labkernels.ch07_decode import bench, int4, paged
from labkernels.ch07_decode import decode_attention as dec
from labkernels.ch07_decode import decode_step as ds

OUT = (
    sys.argv[1]
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-")
    else os.environ.get("OUT", "/tmp/out")
)
EXPLORE = "--explore" in sys.argv
BUDGET_S = float(os.environ.get("CH07_BUDGET_S", "235"))
ROUNDS = int(os.environ.get("CH07_ROUNDS", "3"))
SKIP = {name.strip() for name in os.environ.get("CH07_SKIP", "").split(",") if name.strip()}
START = time.time()
failed: list[str] = []


def left() -> float:
    return BUDGET_S - (time.time() - START)


def section(name: str, needs_s: float):
    def run(fn):
        if name in SKIP:
            print(f"[{name}] left out (CH07_SKIP)", flush=True)
            return None
        if left() < needs_s:
            print(f"[{name}] skipped: {left():.0f} s left, needs about {needs_s:.0f}", flush=True)
            failed.append(f"{name} (skipped)")
            return None
        t0 = time.time()
        try:
            out = fn()
        except Exception:  # noqa: BLE001  (report and go on to the next section)
            traceback.print_exc()
            failed.append(name)
            out = None
        print(f"[{name}] {time.time() - t0:.0f} s", flush=True)
        return out

    return run


def expect(ok: bool, what: str) -> None:
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failed.append(what)


# --- correctness ------------------------------------------------------------------------------------------


@section("correctness", 20)
def correctness():
    torch.manual_seed(0)
    for batch, q_heads, kv_heads, n_tokens, seq_len, head_dim in [
        (3, 32, 8, 1, 33_001, 128), (2, 32, 8, 4, 4_099, 128), (5, 8, 8, 1, 1_000, 64),
        (1, 32, 4, 8, 70_000, 64),
    ]:  # fmt: skip
        q, k, v = bench.attention_inputs(batch, seq_len, q_heads, kv_heads, head_dim, n_tokens)
        want = dec.reference(q, k, v)
        got = dec.decode_attention(q, k, v).double()
        if n_tokens == 1:
            torch_err = (bench.sdpa(q, k, v).double() - want).abs().max().item()
        else:
            torch_err = 2e-2
        err = (got - want).abs().max().item()
        expect(err <= 2 * torch_err + 1e-3, f"decode {batch},{q_heads}/{kv_heads},T{n_tokens},L{seq_len}: "
               f"err {err:.2e} (SDPA {torch_err:.2e})")  # fmt: skip
        lens = torch.randint(n_tokens, seq_len + 1, (batch,), dtype=torch.int32).cuda()
        k_pool, v_pool, table = paged.paginate(k, v, 64, spare_blocks=5)
        got = paged.paged_decode_attention(q, k_pool, v_pool, table, lens).double()
        err = (got - dec.reference(q, k, v, lens)).abs().max().item()
        expect(err <= 2 * torch_err + 1e-3, f"paged ragged lengths {lens.tolist()}: err {err:.2e}")
    for m, n, k in [(1, 14336, 4096), (16, 4096, 4096), (7, 6144, 4096)]:
        a, w, packed, scales = bench.int4_inputs(m, n, k)
        want = int4.reference(a, packed, scales)
        got = int4.int4_matmul(a, packed, scales).double()
        dense = (a @ int4.dequantize_int4(packed, scales).T).double()
        err, torch_err = (got - want).abs().max().item(), (dense - want).abs().max().item()
        expect(err <= 2 * torch_err + 1e-3, f"int4 {m}x{n}x{k}: err {err:.2e} (bf16 matmul {torch_err:.2e})")
        try:
            theirs = bench.torch_int4(packed, scales)(a).double()
            print(f"      _weight_int4pack_mm vs reference: {(theirs - want).abs().max().item():.2e}")
        except Exception as e:  # noqa: BLE001
            print(f"      _weight_int4pack_mm failed: {type(e).__name__}: {str(e)[:100]}")
    cfg = ds.LayerConfig(**bench.STEP_CONFIG)
    ours, layer, inputs = bench.step_setup(2, 1000, cfg)
    with torch.no_grad():
        out, h = ours(*inputs)
        graph = ds.Captured(ours, *inputs)
        g_out, g_h = graph.replay()
        t_out, t_h = layer(*inputs)
    expect(torch.equal(out, g_out) and torch.equal(h, g_h), "decode step: graph replay == eager")
    err = (out.float() - t_out.float()).abs().max().item()
    scale = t_out.float().abs().max().item()
    expect(err <= 0.05 * scale, f"decode step vs torch layer: err {err:.3g} (max {scale:.3g})")


# --- roofs ----------------------------------------------------------------------------------------------


@section("roofs", 10)
def roofs():
    copy = roofline.measure_copy_bandwidth()
    read = bench.read_bandwidth()
    results.record(
        "ch07_roofs", [{"quantity": "copy", "gbps": copy}, {"quantity": "read", "gbps": read}], OUT
    )
    print(f"copy {copy:.0f} GB/s, read {read:.0f} GB/s ({read / copy:.2f}x copy)")
    return read


READ = roofs or bench.read_bandwidth()


INT4_CONFIGS = {
    "bn32": dict(block_n=32),
    "bn128": dict(block_n=128),
    "bn128_w8": dict(block_n=128, num_warps=8),
    "bn64_w8": dict(num_warps=8),
    "bn64_s3": dict(num_stages=3, row=False),  # the one-row kernel takes no num_stages
    "bn256_w8": dict(block_n=256, num_warps=8),
    "bn64_split2x": dict(splits=8),
}


@section("int4", 25)
def int4_section():
    rows = []
    for m in (1, 16):
        for k, n in ((4096, 4096), (4096, 14336)):
            rows += bench.int4_rows(m, n, k, READ, rounds=ROUNDS, configs=INT4_CONFIGS if EXPLORE else None)
            results.record("ch07_int4", rows, OUT)
            by = {(r["impl"], r["timing"]): r["ms"] for r in rows if r["m"] == m and r["n"] == n}
            line = "  ".join(
                f"{name} {by[(name, 'graph')] * 1e3:.1f}" for name, mode in by if mode == "graph"
            )
            print(f"int4 M{m} {k}x{n} (µs, graph): {line}", flush=True)
    return rows


@section("decode step", 25)
def step_section():
    rows = bench.step_rows(1, 4096)
    results.record("ch07_decode_step", rows, OUT)
    for r in rows:
        print(f"step B{r['batch']} ctx {r['context']}: {r['impl']:>30} {r['ms'] * 1e3:8.1f} µs "
              f"{r['tokens_per_s']:8.0f} tok/s host {r['host_us']:.0f} µs, "
              f"graph GPU {r['gpu_ms_graph'] * 1e3:.1f} µs")  # fmt: skip
    return rows


@section("decode attention", 200)  # FlexAttention compiles once a shape
def attention():
    rows = []
    for batch in (1, 8, 64):
        for seq_len in (4096, 32768, 131072):
            if left() < 8:
                print(f"attention: stopped before B{batch} L{seq_len}")
                break
            rows += bench.attention_rows(batch, seq_len, READ, rounds=ROUNDS)
            torch.cuda.empty_cache()
            results.record("ch07_decode_attention", rows, OUT)
            by = {
                (r["impl"], r["timing"]): r for r in rows if r["batch"] == batch and r["seq_len"] == seq_len
            }
            best = max(by[("sdpa_default", "graph")]["gbps"], by[("sdpa_flash", "graph")]["gbps"])
            ours = by[("labkernels", "graph")]["gbps"]
            pg = by[("labkernels_paged", "graph")]["gbps"]
            flex = by[("flex_attention", "graph")]
            flex_text = flex["failed"] or f"ours/flex {ours / flex['gbps']:.2f}"
            print(f"B{batch:>3} L{seq_len:>6}: ours {ours / READ:.2f} of read, best SDPA {best / READ:.2f}, "
                  f"ours/best {ours / best:.2f}, paged/contiguous {pg / ours:.2f}, {flex_text}",
                  flush=True)  # fmt: skip
    return rows


ATTN_CONFIGS = [(64, 4, 3, s) for s in (2, 4, 8, 16)] + [(128, 4, 3, 4), (128, 4, 3, 8), (64, 8, 3, 8)]


def explore_shape(batch: int, seq_len: int) -> list[dict]:
    q, k, v = bench.attention_inputs(batch, seq_len)
    out = torch.empty_like(q)
    moved = dec.traffic(batch, 32, 8, 1, seq_len, 128).bytes
    rows = []
    for block_n, warps, stages, s in ATTN_CONFIGS:
        fn = lambda s=s, bn=block_n, w=warps, st=stages: dec.launch(  # noqa: E731
            q, k, v, out, max_len=seq_len, sm_scale=0.088, splits=s, block_n=bn, num_warps=w, num_stages=st
        )
        try:
            ms = timing.graph_ms(fn)
        except Exception as e:  # noqa: BLE001
            print(f"config {block_n},{warps},{stages},{s} failed: {type(e).__name__}")
            continue
        rows.append({
            "op": "decode_attention", "batch": batch, "seq_len": seq_len, "block_n": block_n,
            "num_warps": warps, "num_stages": stages, "splits": s, "ms": ms,
            "fraction_of_read": timing.gbps(moved, ms) / READ,
        })  # fmt: skip
    return rows


def explore():
    rows = []
    for batch in (8,):
        for seq_len in (4096, 32768, 131072):
            if left() < 10:
                return rows
            new = explore_shape(batch, seq_len)
            torch.cuda.empty_cache()
            rows += new
            results.record("ch07_decode_configs", rows, OUT)
            best = min(new, key=lambda r: r["ms"])
            print(f"explore B{batch} L{seq_len}: best {best}", flush=True)
    return rows


if EXPLORE:
    section("explore", 20)(explore)

print(f"total {time.time() - START:.0f} s")
if failed:
    print("FAILED or skipped:", failed)
    sys.exit(1)
print("ch07: all checks passed")
