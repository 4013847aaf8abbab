"""Chapter 07 measurements: the read roof, decode attention against SDPA, the 4-bit GEMV against cuBLAS and
torch's int4 kernel, and the decode step in its four forms. Each returns rows for `labkernels.results`.

On the GPU every timing is taken two ways, in alternating rounds with the anchor (the GPU's clock follows its
power draw): graph replays (`timing.graph_ms`: GPU time only) and plain calls (`timing.time_ms`: what a Python
loop gets, the launch included). On the CPU lane the kernels run under the interpreter and are not timed; the
sweeps time torch's own implementation of the op instead, against this machine's read bandwidth.
"""

from __future__ import annotations

import contextlib
import math
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from labkernels import timing
from labkernels.ch07_decode import decode_attention as dec
from labkernels.ch07_decode import int4, paged
from labkernels.hostmath import cdiv
from labkernels.lane import DEVICE, LANE
from labkernels.results import Table
from labkernels.sweep import sweep

READ_BLOCK, READ_ITERS = 4096, 16


@triton.jit
def _read_kernel(x_ptr, out_ptr, n_elements, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """Read ITERS blocks, write one number: a stream with (almost) no writes, the roof of a decode step."""
    base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, 0))


READ_CONFIGS = [(4096, 16, 4), (8192, 8, 8), (16384, 4, 16)]  # (BLOCK, ITERS, num_warps)


def _reader(x, block: int, iters: int, warps: int):
    programs = cdiv(x.numel(), block * iters)
    out = torch.empty(programs, device=x.device)
    return lambda: _read_kernel[(programs,)](x, out, x.numel(), BLOCK=block, ITERS=iters, num_warps=warps)


def read_bandwidth(nbytes: int | None = None) -> float:
    """GB/s of a read-only stream over a buffer far past the cache: on the GPU the best of a few configs of
    the Triton read kernel over 4 GiB (a roof is the best read measured); on the CPU torch's sum over 64 MiB
    of float32 (the interpreter is not timed)."""
    if LANE == "gpu":
        n = (nbytes or 1 << 32) // 2
        x = torch.ones(n, device="cuda", dtype=torch.bfloat16)
        best = 0.0
        for block, iters, warps in READ_CONFIGS:
            best = max(best, timing.gbps(2 * n, timing.time_ms(_reader(x, block, iters, warps), rep=200)))
        return best
    n = (nbytes or 1 << 26) // 4
    x = torch.ones(n)
    return timing.gbps(4 * n, timing.time_ms(lambda: x.sum()))


# --- decode attention ---------------------------------------------------------------------------------------


def attention_inputs(batch, seq_len, q_heads=32, kv_heads=8, head_dim=128, n_tokens=1, dtype=torch.bfloat16):
    q = torch.randn(batch, q_heads, n_tokens, head_dim, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, kv_heads, seq_len, head_dim, device=DEVICE, dtype=dtype)
    v = torch.randn_like(k)
    return q, k, v


def random_pools(batch, seq_len, kv_heads, head_dim, block_size, dtype, generator=None):
    """A paged cache of `batch` sequences of `seq_len` tokens with random contents, its blocks in a random
    order in the pool (drawn directly, not copied from a contiguous cache: at B = 64, L = 128k each cache is
    17 GB)."""
    pages = cdiv(seq_len, block_size)
    shape = (batch * pages, kv_heads, block_size, head_dim)
    k_pool = torch.randn(shape, device=DEVICE, dtype=dtype)
    v_pool = torch.randn(shape, device=DEVICE, dtype=dtype)
    table = torch.randperm(batch * pages, generator=generator).view(batch, pages).to(DEVICE, torch.int32)
    lens = torch.full((batch,), seq_len, device=DEVICE, dtype=torch.int32)
    return k_pool, v_pool, table, lens


def sdpa(q, k, v, backend=None):
    """torch's SDPA on the same cache: one query token needs no mask; GQA through enable_gqa."""
    from torch.nn.attention import sdpa_kernel

    group = q.shape[1] // k.shape[1]
    ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=group > 1)


#: Shapes FlexAttention compiles for in one process: one per (B, L) of the sweep, past dynamo's default of 8.
FLEX_RECOMPILE_LIMIT = 64


def _every_key(b, h, q_idx, kv_idx):
    return kv_idx >= 0  # no mask: every query sees every key


def flex(q, k, v, *, compiled: bool = True):
    """(call, None) for torch's FlexAttention over the same cache (no score modification, GQA through
    enable_gqa; compiled, as its documentation asks), or (None, why) when it does not compile or run at this
    shape. It gets a block mask of 128-key blocks that masks nothing: its decode kernel splits the cache by
    mask blocks, and without a block mask the whole cache is one block, which one split reads alone."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    group = q.shape[1] // k.shape[1]
    if compiled:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, FLEX_RECOMPILE_LIMIT)
        fn = torch.compile(flex_attention, dynamic=False)
    else:
        fn = flex_attention
    try:
        mask = create_block_mask(_every_key, None, None, q.shape[2], k.shape[2], device=q.device)
        call = lambda: fn(q, k, v, block_mask=mask, enable_gqa=group > 1)  # noqa: E731
        call()
    except Exception as e:  # noqa: BLE001  (any failure is a result to report: the row says why)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
    return call, None


def _alternating(calls: dict, rounds: int, graph: bool) -> dict[str, float]:
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            samples[name].append(timing.graph_ms(fn) if graph else timing.time_ms(fn))
    return {name: statistics.median(t) for name, t in samples.items()}


def attention_rows(
    batch,
    seq_len,
    read_gbps,
    *,
    rounds=3,
    block_size=64,
    q_heads=32,
    kv_heads=8,
    head_dim=128,
    with_flex=True,
):
    """Ours (contiguous and paged) against SDPA's default and FLASH backends and compiled FlexAttention at one
    shape, both timings. Where FlexAttention fails its row has NaN times and says why (`failed`)."""
    from torch.nn.attention import SDPBackend

    dtype = torch.bfloat16
    q, k, v = attention_inputs(batch, seq_len, q_heads, kv_heads, head_dim, dtype=dtype)
    k_pool, v_pool, table, lens = random_pools(batch, seq_len, kv_heads, head_dim, block_size, dtype)
    calls = {
        "sdpa_default": lambda: sdpa(q, k, v),
        "labkernels": lambda: dec.decode_attention(q, k, v),
        "sdpa_flash": lambda: sdpa(q, k, v, SDPBackend.FLASH_ATTENTION),
        "labkernels_paged": lambda: paged.paged_decode_attention(
            q, k_pool, v_pool, table, lens, validate=False
        ),
    }
    flex_call, flex_failed = flex(q, k, v) if with_flex else (None, "not measured")
    if flex_call is not None:
        calls["flex_attention"] = flex_call
    moved = dec.traffic(batch, q_heads, kv_heads, 1, seq_len, head_dim, dtype).bytes
    rows = []
    for mode, graph in (("graph", True), ("plain", False)):
        times = _alternating(calls, rounds, graph)
        if flex_call is None:
            times["flex_attention"] = float("nan")  # the row stays, with the reason beside it
        for name, ms in times.items():
            gbps = timing.gbps(moved, ms) if math.isfinite(ms) else float("nan")
            rows.append({
                "op": "decode_attention", "impl": name, "timing": mode, "batch": batch, "seq_len": seq_len,
                "q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim, "block_size": block_size,
                "splits": dec.num_splits(batch, kv_heads, seq_len), "nbytes": moved, "ms": ms, "gbps": gbps,
                "fraction_of_read": gbps / read_gbps,
                "failed": flex_failed if name == "flex_attention" and flex_failed else "",
            })  # fmt: skip
    return rows


def decode_sweep(batches, lengths, read_gbps: float, q_heads=None, kv_heads=None, head_dim=None) -> Table:
    """Bytes, time and fraction of the read roof of decode attention at each (B, L) on this lane: our kernel
    on the GPU (graph replays); torch's SDPA on the CPU (the interpreter's time would say nothing)."""
    q_heads = q_heads or (32 if LANE == "gpu" else 8)
    kv_heads = kv_heads or (8 if LANE == "gpu" else 2)
    head_dim = head_dim or (128 if LANE == "gpu" else 64)
    dtype = torch.bfloat16 if LANE == "gpu" else torch.float32

    def one(batch, seq_len):
        q, k, v = attention_inputs(batch, seq_len, q_heads, kv_heads, head_dim, dtype=dtype)
        fn = (lambda: dec.decode_attention(q, k, v)) if LANE == "gpu" else (lambda: sdpa(q, k, v))
        ms = timing.graph_ms(fn)
        moved = dec.traffic(batch, q_heads, kv_heads, 1, seq_len, head_dim, dtype).bytes
        gbps = timing.gbps(moved, ms)
        return {"nbytes": moved, "ms": ms, "gbps": gbps, "fraction_of_read": gbps / read_gbps}

    return sweep(one, {"batch": list(batches), "seq_len": list(lengths)}, desc="decode attention")


def plot_fraction(table: Table, reference: Table | None, ax) -> None:
    """Fraction of the read roof against L, one line per batch: this machine solid, the H200 dashed."""
    from labkernels.sweep import plot_sweep

    plot_sweep(table, "seq_len", "fraction_of_read", by="batch", reference=reference, ax=ax, logy=False,
               ylabel="fraction of the read roof", title="decode attention")  # fmt: skip
    ax.axhline(1.0, color="0.5", lw=0.8)
    # Above 1: data a cache holds (a CPU's small sweep) reads faster than the stream the roof measured.
    values = [f for t in (table, reference) if t is not None for f in t.column("fraction_of_read")]
    ax.set_ylim(0, max([1.2, *(1.1 * f for f in values if math.isfinite(f))]))


# --- 4-bit GEMV ---------------------------------------------------------------------------------------------


def int4_inputs(m, n, k, dtype=torch.bfloat16):
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    w = torch.randn(n, k, device=DEVICE, dtype=dtype) / math.sqrt(k)
    packed, scales = int4.quantize_int4(w)
    return a, w, packed, scales


def torch_int4(packed, scales):
    """The same weights in torch's `_weight_int4pack_mm` format (tinygemm): (q - 8) * s + 0, group 128."""
    q = int4.unpack_int4(packed).to(torch.int32)
    high_first = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)  # its packing: the even k in the high nibble
    weight = torch.ops.aten._convert_weight_to_int4pack(high_first, 8)
    s = scales.t().contiguous()  # (K / GROUP, N)
    scales_and_zeros = torch.stack((s, torch.zeros_like(s)), dim=-1).contiguous()
    return lambda a: torch.ops.aten._weight_int4pack_mm(a, weight, int4.GROUP, scales_and_zeros)


def int4_rows(m, n, k, read_gbps, *, rounds=3, configs=None):
    """Ours (and `configs`: name -> int4_matmul overrides) against bf16 cuBLAS and `_weight_int4pack_mm`."""
    a, w, packed, scales = int4_inputs(m, n, k)
    calls = {"cublas_bf16": lambda: a @ w.T, "labkernels": lambda: int4.int4_matmul(a, packed, scales)}
    try:
        theirs = torch_int4(packed, scales)
        theirs(a)
        calls["torch_int4pack"] = lambda: theirs(a)
    except (RuntimeError, NotImplementedError) as e:
        print(f"_weight_int4pack_mm unavailable: {type(e).__name__}: {str(e)[:120]}")
    for name, cfg in (configs or {}).items():
        calls[name] = lambda cfg=cfg: int4.int4_matmul(a, packed, scales, **cfg)
    rows = []
    for mode, graph in (("graph", True), ("plain", False)):
        for name, ms in _alternating(calls, rounds, graph).items():
            if name == "cublas_bf16":
                moved = (m * k + k * n + m * n) * 2
            else:
                moved = int4.traffic(m, n, k).bytes
            gbps = timing.gbps(moved, ms)
            rows.append({
                "op": "int4_matmul", "impl": name, "timing": mode, "m": m, "n": n, "k": k, "nbytes": moved,
                "ms": ms, "gbps": gbps, "fraction_of_read": gbps / read_gbps,
            })  # fmt: skip
    return rows


# --- the decode step ----------------------------------------------------------------------------------------

STEP_CONFIG = dict(d_model=4096, q_heads=32, kv_heads=8, head_dim=128, d_ff=14336)  # one Llama-3-8B layer


def per_call_ms(fn, calls: int = 100) -> float:
    """Wall time per call of `calls` back-to-back calls, waited for at the end: a step loop's throughput (host
    bound or GPU bound, whichever is slower)."""
    import time

    def wait():
        if LANE == "gpu":
            torch.cuda.synchronize()

    fn()
    wait()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    wait()
    return (time.perf_counter() - start) / calls * 1e3


def step_setup(batch: int, context: int, cfg=None, dtype=torch.bfloat16, block_size: int = 64):
    """The layer's weights, a paged cache of `context` random tokens per sequence (room for one more), the
    inputs of one step, and the torch layer with the same weights and cache contents."""
    from labkernels.ch07_decode import decode_step as ds

    cfg = cfg or ds.LayerConfig(**STEP_CONFIG)
    g = torch.Generator().manual_seed(7)
    w = ds.make_weights(cfg, dtype, DEVICE, generator=g)
    k = torch.randn(batch, cfg.kv_heads, context + 1, cfg.head_dim, generator=g).to(DEVICE, dtype)
    v = torch.randn(batch, cfg.kv_heads, context + 1, cfg.head_dim, generator=g).to(DEVICE, dtype)
    k_pool, v_pool, table = paged.paginate(k, v, block_size, generator=g)
    positions = torch.full((batch,), context, device=DEVICE, dtype=torch.int32)
    delta = torch.randn(batch, cfg.d_model, generator=g).to(DEVICE, dtype)
    residual = torch.randn(batch, cfg.d_model, generator=g).to(DEVICE, dtype)
    layer = ds.TorchLayer(cfg, w, batch, context + 1)
    layer.k_cache.copy_(k)
    layer.v_cache.copy_(v)
    ours = lambda positions, delta, residual: ds.step(  # noqa: E731
        cfg, w, k_pool, v_pool, table, positions, delta, residual
    )
    return ours, layer, (positions, delta, residual)


def step_rows(batch: int, context: int, *, rounds: int = 3) -> list[dict]:
    """Tokens per second of the step: ours eager and replayed from a CUDA graph, torch eager and
    torch.compile(mode="reduce-overhead"); and where the eager step's time goes (host µs vs GPU ms)."""
    from labkernels.ch07_decode.decode_step import Captured

    ours, layer, inputs = step_setup(batch, context)
    with torch.no_grad():
        graph = Captured(ours, *inputs)
        compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
        for _ in range(3):
            compiled(*inputs)
        calls = {
            "labkernels_graph": graph.replay,
            "torch_compile_reduce_overhead": lambda: compiled(*inputs),
            "labkernels_eager": lambda: ours(*inputs),
            "torch_eager": lambda: layer(*inputs),
        }
        samples = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                samples[name].append(per_call_ms(fn))
        gpu_ms = timing.time_ms(graph.replay)  # GPU time of one step: the replay's host cost is a few µs
        host = {"labkernels_eager": timing.host_us_idle(lambda: ours(*inputs), calls=50),
                "torch_eager": timing.host_us_idle(lambda: layer(*inputs), calls=50)}  # fmt: skip
    rows = []
    for name, times in samples.items():
        ms = statistics.median(times)
        rows.append({
            "op": "decode_step", "impl": name, "batch": batch, "context": context, "ms": ms,
            "tokens_per_s": batch / (ms * 1e-3), "host_us": host.get(name, float("nan")),
            "gpu_ms_graph": gpu_ms,
        })  # fmt: skip
    return rows


# --- tables of the shipped results --------------------------------------------------------------------------


def _over(ours_gbps: float, theirs: dict | None) -> float | str:
    """ours / theirs, or why there is no ratio: FlexAttention's failure, or not measured."""
    if theirs is None:
        return "not measured"
    if not math.isfinite(theirs["gbps"]):
        return "failed" if theirs.get("failed") else "not measured"
    return round(ours_gbps / theirs["gbps"], 2)


def attention_table(table: Table, timing_mode: str = "graph") -> Table:
    """Per (B, L): ours and the best SDPA backend as fractions of the read roof, ours / best, the target (1.0
    where the best is under 0.9 of the roof, else 0.95), ours / FLASH, ours / compiled FlexAttention ("failed"
    where it did not compile) and paged / contiguous."""
    rows = []
    for batch in table.unique("batch"):
        for seq_len in table.where(batch=batch).unique("seq_len"):
            got = {r["impl"]: r for r in table.where(batch=batch, seq_len=seq_len, timing=timing_mode)}
            if not {"labkernels", "sdpa_default", "sdpa_flash", "labkernels_paged"} <= set(got):
                continue
            best = max(got["sdpa_default"]["gbps"], got["sdpa_flash"]["gbps"])
            ours = got["labkernels"]["gbps"]
            best_fraction = best / got["labkernels"]["gbps"] * got["labkernels"]["fraction_of_read"]
            target = 1.0 if best_fraction < 0.9 else 0.95
            rows.append({
                "batch": batch, "seq_len": seq_len,
                "ours_of_read": round(got["labkernels"]["fraction_of_read"], 2),
                "best_sdpa_of_read": round(best_fraction, 2), "ours_over_best": round(ours / best, 2),
                "target": target, "met": ours / best >= target,
                "ours_over_flash": round(ours / got["sdpa_flash"]["gbps"], 2),
                "ours_over_flex": _over(ours, got.get("flex_attention")),
                "paged_over_contiguous": round(got["labkernels_paged"]["gbps"] / ours, 2),
            })  # fmt: skip
    return Table(rows)


#: The chapter's 4-bit targets: ours / `_weight_int4pack_mm` everywhere, ours / bf16 cuBLAS at (K, N).
INT4PACK_TARGET = 1.0
CUBLAS_TARGETS = {(4096, 14336): 2.0}


def int4_table(table: Table, timing_mode: str = "graph") -> Table:
    """Per (M, K, N): microseconds of ours, bf16 cuBLAS and `_weight_int4pack_mm`, ours' speed-up on each, and
    whether the point meets its targets (INT4PACK_TARGET, and CUBLAS_TARGETS where one is set)."""
    rows = []
    for m in table.unique("m"):
        for k, n in dict.fromkeys((r["k"], r["n"]) for r in table.where(m=m).rows):
            got = {r["impl"]: r["ms"] for r in table.where(m=m, k=k, n=n, timing=timing_mode)}
            if not {"labkernels", "cublas_bf16"} <= set(got):
                continue
            theirs = got.get("torch_int4pack", float("nan"))
            x_cublas, x_int4pack = got["cublas_bf16"] / got["labkernels"], theirs / got["labkernels"]
            met = x_int4pack >= INT4PACK_TARGET and x_cublas >= CUBLAS_TARGETS.get((k, n), 0.0)
            rows.append({
                "m": m, "k_x_n": f"{k}x{n}", "ours_us": round(got["labkernels"] * 1e3, 1),
                "cublas_bf16_us": round(got["cublas_bf16"] * 1e3, 1), "int4pack_us": round(theirs * 1e3, 1),
                "x_cublas": round(x_cublas, 2), "x_int4pack": round(x_int4pack, 2), "target_met": met,
            })  # fmt: skip
    return Table(rows)
