"""Chapter 05 benchmarks (`make bench`, GPU lane): every fusion kind eager / torch.compile / hand-fused,
in one run, with the bytes each moves (the traffic model), GB/s and the fraction of copy bandwidth.

The measuring functions are plain (they return rows), so the notebook's widget calls them too; the
`@benchmark` functions fix the sizes recorded in `labkernels/reference/`.
"""

from __future__ import annotations

import torch

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch05_fusion import epilogue, horizontal, inductor, launch, pointwise, prologue, rmsnorm
from labkernels.lane import DEVICE
from labkernels.results import Table, load_reference
from labkernels.roofline import measure_copy_bandwidth
from labkernels.traffic import Traffic


def _random(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compiled(fn, **options):
    """A fresh torch.compile of fn: dynamo's caches are reset, so one function compiled for several
    settings (chain lengths, sizes) never runs into the recompile limit."""
    torch._dynamo.reset()
    return torch.compile(fn, **options)


def _copy_impl(t: Traffic):
    """A device copy of as many bytes as the fused op must move: the ceiling at this size."""
    n = max(1, t.bytes // 8)  # fp32 elements: read n, write n
    src, dst = torch.empty(n, device=DEVICE), torch.empty(n, device=DEVICE)
    return "copy", lambda: dst.copy_(src), traffic.copy(n)


def fusion_rows(kind: str, params: dict, impls: list, copy_gbps: float) -> list[dict]:
    """Time each (impl, fn, traffic); a row per impl with ms, bytes, GB/s, fraction of copy bandwidth, and the
    speed-up over eager and the ratio to torch.compile (compile ms / ms: > 1 means faster than compile)."""
    rows = []
    for impl, fn, t in impls:
        fn()  # compiles, autotunes, warms up outside the timed region
        ms = timing.time_ms(fn)
        gbps = timing.gbps(t.bytes, ms)
        row = {"kind": kind, **params, "impl": impl, "ms": ms, "bytes": t.bytes, "gbps": gbps}
        row["fraction_of_copy"] = gbps / copy_gbps
        if t.flops and t.intensity > 10:  # matmuls: compute-bound, TFLOP/s says more
            row["tflops"] = timing.tflops(t.flops, ms)
        rows.append(row)
    ms = {r["impl"]: r["ms"] for r in rows}
    for r in rows:
        if r["impl"] != "copy":
            r["speedup_vs_eager"] = ms["eager"] / r["ms"]
            r["ratio_vs_compile"] = ms["compile"] / r["ms"]
    return rows


def launch_config_sweep() -> tuple[Table, float] | None:
    """The three pointwise kernels at 2^26 fp32 under other launch configs (BLOCK_SIZE / num_warps), on the
    H200 (experiments/pointwise_blocks.py; reference ch05_pointwise_blocks): each config's median time as a
    ratio to torch.compile's in the same alternating rounds (> 1: faster), one column per op; and the
    largest spread between a variant's fastest and slowest round, as a fraction of its median."""
    ref = load_reference("ch05_pointwise_blocks")
    if ref is None:
        return None
    ops = ref.unique("op")
    configs = [impl for impl in ref.unique("impl") if "/" in impl]  # "1024/4": BLOCK_SIZE / num_warps
    table = Table(
        {"block/warps": c} | {op: round(ref.where(op=op, impl=c).rows[0]["vs_compile"], 3) for op in ops}
        for c in configs
    )
    return table, max(ref.column("spread"))


def _elementwise_params(n, dtype):
    return {"shape": str(n), "dtype": _dtype_name(dtype)}


def add_relu_rows(n: int, copy_gbps: float, dtype=torch.float32) -> list[dict]:
    x, y = _random(n, dtype=dtype), _random(n, dtype=dtype)
    fused, eager = traffic.add_relu(n, dtype), traffic.add_relu(n, dtype, fused=False)
    c = compiled(lambda x, y: torch.relu(x + y))
    impls = [
        ("eager", lambda: torch.relu(x + y), eager),
        ("compile", lambda: c(x, y), fused),
        ("labkernels", lambda: add_relu(x, y), fused),
        _copy_impl(fused),
    ]
    return fusion_rows("add_relu", _elementwise_params(n, dtype), impls, copy_gbps)


def mul_add_sigmoid_rows(n: int, copy_gbps: float, dtype=torch.float32) -> list[dict]:
    x, a, b = (_random(n, dtype=dtype) for _ in range(3))
    fused, eager = traffic.mul_add_sigmoid(n, dtype), traffic.mul_add_sigmoid(n, dtype, fused=False)
    c = compiled(pointwise.reference_mul_add_sigmoid)
    impls = [
        ("eager", lambda: pointwise.reference_mul_add_sigmoid(x, a, b), eager),
        ("compile", lambda: c(x, a, b), fused),
        ("labkernels", lambda: pointwise.mul_add_sigmoid(x, a, b), fused),
        _copy_impl(fused),
    ]
    return fusion_rows("mul_add_sigmoid", _elementwise_params(n, dtype), impls, copy_gbps)


def chain_rows(
    n_ops: int, sizes: list[int], copy_gbps: float, dtype=torch.float32, dynamic: bool = False
) -> list[dict]:
    """The N-op chain at each size; one compile for all sizes when dynamic=True (a symbolic size)."""
    c = compiled(lambda x, y: pointwise.reference_chain(x, y, n_ops), dynamic=dynamic)
    rows = []
    for n in sizes:
        x, y = _random(n, dtype=dtype), _random(n, dtype=dtype)
        fused, eager = (
            traffic.pointwise_chain(n, n_ops, dtype),
            traffic.pointwise_chain(n, n_ops, dtype, fused=False),
        )
        impls = [
            ("eager", lambda x=x, y=y: pointwise.reference_chain(x, y, n_ops), eager),
            ("compile", lambda x=x, y=y: c(x, y), fused),
            ("labkernels", lambda x=x, y=y: pointwise.chain(x, y, n_ops), fused),
        ]
        params = {"n_ops": n_ops, "n": n, "dynamic": dynamic, **_elementwise_params(n, dtype)}
        rows += fusion_rows("chain", params, impls, copy_gbps)
    return rows


def chain_sweep(n_ops_list: list[int], sizes: list[int], copy_gbps: float, dtype=torch.float32) -> Table:
    """Chain length x size: what the notebook's widget plots (one dynamic-shape compile per chain length)."""
    return Table(r for n_ops in n_ops_list for r in chain_rows(n_ops, sizes, copy_gbps, dtype, dynamic=True))


def rmsnorm_rows(n_rows: int, n_cols: int, copy_gbps: float, dtype=torch.bfloat16) -> list[dict]:
    x, r = _random(n_rows, n_cols, dtype=dtype), _random(n_rows, n_cols, dtype=dtype)
    w = _random(n_cols, dtype=dtype)
    fused = traffic.rmsnorm_residual(n_rows, n_cols, dtype)
    eager = traffic.rmsnorm_residual(n_rows, n_cols, dtype, fused=False)
    c = compiled(rmsnorm.reference)
    impls = [
        ("eager", lambda: rmsnorm.reference(x, r, w), eager),
        ("compile", lambda: c(x, r, w), fused),
        ("labkernels", lambda: rmsnorm.rmsnorm_residual(x, r, w), fused),
        _copy_impl(fused),
    ]
    params = {"shape": f"{n_rows}x{n_cols}", "dtype": _dtype_name(dtype)}
    return fusion_rows("rmsnorm_residual", params, impls, copy_gbps)


def sincos_rows(n: int, copy_gbps: float, dtype=torch.float32) -> list[dict]:
    x = _random(n, dtype=dtype)
    fused, eager = traffic.sincos(n, dtype), traffic.sincos(n, dtype, fused=False)
    c = compiled(horizontal.reference)
    impls = [
        ("eager", lambda: horizontal.reference(x), eager),
        ("compile", lambda: c(x), fused),
        ("labkernels", lambda: horizontal.sincos(x), fused),
        _copy_impl(fused),
    ]
    return fusion_rows("sincos", _elementwise_params(n, dtype), impls, copy_gbps)


def epilogue_rows(m: int, n: int, k: int, copy_gbps: float, dtype=torch.bfloat16) -> list[dict]:
    """cuBLAS + two eager kernels; compile (cuBLAS + one fused add+gelu kernel over C); the Triton matmul with
    the epilogue in registers; and cuBLAS alone (no epilogue at all) for scale."""
    a, b, bias = _random(m, k, dtype=dtype), _random(k, n, dtype=dtype), _random(n, dtype=dtype)
    e = traffic.element_size(dtype)
    mm = traffic.matmul(m, n, k, dtype)
    fused = traffic.matmul_bias_gelu(m, n, k, dtype)
    eager = traffic.matmul_bias_gelu(m, n, k, dtype, fused=False)
    one_pass = Traffic(
        "matmul+1pass", mm.bytes + (2 * m * n + n) * e, fused.flops
    )  # compile: one pass over C
    c = compiled(epilogue.eager)
    impls = [
        ("eager", lambda: epilogue.eager(a, b, bias), eager),
        ("compile", lambda: c(a, b, bias), one_pass),
        ("labkernels", lambda: epilogue.matmul_bias_gelu(a, b, bias), fused),
        ("cublas, no epilogue", lambda: a @ b, mm),
    ]
    params = {"shape": f"{m}x{n}x{k}", "dtype": _dtype_name(dtype)}
    return fusion_rows("matmul_bias_gelu", params, impls, copy_gbps)


def prologue_rows(m: int, n: int, k: int, copy_gbps: float, dtype=torch.bfloat16) -> list[dict]:
    """Eager dequantise-then-matmul; compile (the dequantisation fused into one kernel, then cuBLAS); the
    Triton matmul dequantising in its loads; and cuBLAS on 16-bit weights (no int8 at all) for scale."""
    a = _random(m, k, dtype=dtype)
    w_int8, scale = prologue.quantize(_random(k, n))
    scale = scale.to(dtype)
    w16 = w_int8.to(dtype) * scale
    e = traffic.element_size(dtype)
    mm = traffic.matmul(m, n, k, dtype)
    fused = traffic.int8_matmul(m, n, k, dtype)
    eager = traffic.int8_matmul(m, n, k, dtype, fused=False)
    one_pass = Traffic("dequant+matmul", k * n * (1 + e) + n * e + mm.bytes, fused.flops)
    c = compiled(prologue.eager)
    auto = fused if m <= prologue.FUSED_MAX_M else one_pass  # the path int8_matmul takes at this M
    impls = [
        ("eager", lambda: prologue.eager(a, w_int8, scale), eager),
        ("compile", lambda: c(a, w_int8, scale), one_pass),
        ("labkernels", lambda: prologue.int8_matmul(a, w_int8, scale), auto),
        ("labkernels, fused", lambda: prologue.int8_matmul(a, w_int8, scale, path="fused"), fused),
        (
            "labkernels, dequantize",
            lambda: prologue.int8_matmul(a, w_int8, scale, path="dequantize"),
            one_pass,
        ),
        ("cublas, 16-bit weights", lambda: a @ w16, mm),
    ]
    params = {"shape": f"{m}x{n}x{k}", "dtype": _dtype_name(dtype)}
    return fusion_rows("int8_matmul", params, impls, copy_gbps)


INT8_PATH_MS = (16, 32, 64, 128, 256, 512, 1024, 4096)
INT8_PATH_ROUNDS = 5


@benchmark("ch05_int8_paths")
def int8_path_rows(ms=INT8_PATH_MS, n: int = 4096, k: int = 4096, dtype=torch.bfloat16) -> list[dict]:
    """Where fusing the dequantisation stops paying: both paths of `int8_matmul`, and cuBLAS on 16-bit
    weights, over M (the number of tokens): it sets `prologue.FUSED_MAX_M`. Each M's three calls are timed in
    alternating rounds, median of each, so a drift of the clock hits them alike. No torch.compile here (a
    recompile per M would cost minutes): `prologue_rows` sets compile beside both paths at M = 16 and 4096."""
    w_int8, scale = prologue.quantize(_random(k, n))
    scale = scale.to(dtype)
    w16 = w_int8.to(dtype) * scale
    rows = []
    for m in ms:
        a = _random(m, k, dtype=dtype)
        impls = {
            "fused": lambda a=a: prologue.int8_matmul(a, w_int8, scale, path="fused"),
            "dequantize": lambda a=a: prologue.int8_matmul(a, w_int8, scale, path="dequantize"),
            "cublas, 16-bit weights": lambda a=a: a @ w16,
        }
        for fn in impls.values():
            fn()  # autotunes outside the timed region
        times = timing.alternating_ms(impls, rounds=INT8_PATH_ROUNDS)
        for impl, ms_ in times.items():
            row = {"kind": "int8_paths", "shape": f"{m}x{n}x{k}", "dtype": _dtype_name(dtype), "impl": impl}
            rows.append({**row, "ms": ms_, "tflops": timing.tflops(2 * m * n * k, ms_)})
    return rows


def int8_tile_table(table: Table, big_tile: str = "fused 128x256x64 s3 w8") -> Table:
    """experiments/int8_tiles.py's graph replays (`ch05_int8_tiles`), one row per M: cuBLAS on 16-bit weights,
    the dequantize path, the fastest tile of the fused kernel and that of the 128 x 256 tile, in us."""
    by_m: dict[int, dict] = {}
    for r in table.rows:
        by_m.setdefault(int(r["case"].split("x")[0]), {})[r["variant"]] = r["ms_graph"] * 1e3
    rows = []
    for m, us in sorted(by_m.items()):
        fused = {name.removeprefix("fused "): t for name, t in us.items() if name.startswith("fused ")}
        best = min(fused, key=fused.get)
        rows.append(
            {"M": m, "cublas_16bit_us": us["cublas, 16-bit weights"],
             "dequantize_us": us["int8_matmul dequantize"], "best_tile": best, "best_tile_us": fused[best],
             "128x256_us": us[big_tile]}
        )  # fmt: skip
    return Table(rows)


def int8_path_table(table: Table) -> Table:
    """The `int8_paths` rows as one row per M: each path's microseconds and the faster path."""
    by_m: dict[int, dict] = {}
    for r in table.where(kind="int8_paths").rows:
        by_m.setdefault(int(r["shape"].split("x")[0]), {})[r["impl"]] = r["ms"] * 1e3
    rows = []
    for m, us in sorted(by_m.items()):
        faster = "fused" if us["fused"] < us["dequantize"] else "dequantize"
        rows.append(
            {"M": m, "fused_us": us["fused"], "dequantize_us": us["dequantize"],
             "cublas_16bit_us": us["cublas, 16-bit weights"], "faster": faster}
        )  # fmt: skip
    return Table(rows)


def int8_gemv_table(table: Table) -> Table:
    """gpu_jobs/int8_gemv.py's decode rows (`ch05_int8_gemv`, kind "int8"), one row per (M, N x K), in us:
    the faster cuBLAS layout on bf16 weights, `int8_gemv` on K-major int8 weights (its design), chapter 05's
    first GEMV on (K, N) weights ("cols") and the fused matmul kernel, as graph replays of one matrix; the
    GEMV's speed-up over cuBLAS there and with the weights read from HBM (rotating copies), and in plain
    calls; the TB/s at which the GEMV reads its weights from HBM."""
    cases: dict[tuple, dict] = {}
    for r in table.where(kind="int8").rows:
        cases.setdefault((r["M"], r["shape"]), {})[r["impl"]] = r
    rows = []
    for (m, shape), by in cases.items():
        gemv = by["int8_gemv"]
        cublas = min((r for name, r in by.items() if name.startswith("cublas")), key=lambda r: r["us_graph"])
        _, n, k = shape.split("x")
        rows.append(
            {"M": m, "NxK": f"{n}x{k}", "design": gemv["design"], "cublas_us": round(cublas["us_graph"], 1),
             "gemv_us": round(gemv["us_graph"], 1), "x_cublas": round(gemv["vs_cublas_graph"], 2),
             "x_cublas_hbm": round(gemv["vs_cublas_graph_hbm"], 2),
             "hbm_tbps": round(gemv["weight_gbps_hbm"] / 1e3, 2),
             "cols_us": round(by["int8_gemv N-contiguous"]["us_graph"], 1),
             "fused_us": round(by["int8_matmul fused"]["us_graph"], 1),
             "x_cublas_plain": round(gemv["vs_cublas_plain"], 2)}
        )  # fmt: skip
    return Table(rows)


def compile_host_table(table: Table) -> Table:
    """experiments/compile_host.py's record (`ch05_compile_host`): per `dynamic` and chain length, the host
    time per call of each round, and per call the GPU kernels, their time, the Python calls and the graphs
    compiled (the first round's; the second round repeats them)."""
    cases: dict[tuple, list] = {}
    for r in table.rows:
        cases.setdefault((r["dynamic"], r["n_ops"]), []).append(r)
    rows = []
    for (dynamic, n_ops), runs in cases.items():
        runs.sort(key=lambda r: r["round"])
        first = runs[0]
        rows.append(
            {"dynamic": dynamic, "n_ops": n_ops, **{f"host_us_{r['round']}": r["host_us"] for r in runs},
             "kernels": first["kernels"], "gpu_us": first["gpu_us"], "py_calls": first["py_calls"],
             "graphs": first["graphs"]}
        )  # fmt: skip
    return Table(rows)


def fusion_cases(gpu_sizes: bool, dtype=torch.bfloat16) -> dict[str, tuple]:
    """The two graphs whose fusion log chapter 05 reads: weight-only int8 dequantised before a matmul (a
    decode step's shape when `gpu_sizes`), and RMSNorm after a residual add that is also returned."""
    m, k, n = (16, 4096, 4096) if gpu_sizes else (4, 256, 64)
    rows, cols = (4096, 4096) if gpu_sizes else (64, 512)
    w_int8, scale = prologue.quantize(_random(k, n, dtype=dtype))
    return {
        "int8 dequantize + matmul": (prologue.eager, (_random(m, k, dtype=dtype), w_int8, scale)),
        "RMSNorm + residual": (rmsnorm.reference, tuple(_random(*shape, dtype=dtype) for shape in
                                                        ((rows, cols), (rows, cols), (cols,)))),
    }  # fmt: skip


def fusion_log_rows(case: str, log: inductor.FusionLog) -> list[dict]:
    """A fusion log as rows: each node (round 0: its kind and ops), then each round's fusions and refusals
    (the nodes paired, their ops, the scheduler's reason for a refusal)."""
    rows = [{"case": case, "round": 0, "event": "node", "node": name, "ops": ", ".join(ops), "other": "",
             "other_ops": "", "note": kind} for name, (kind, ops) in log.nodes.items()]  # fmt: skip
    for d in log.decisions:
        rows.append(
            {"case": case, "round": d.round, "event": d.verdict, "node": d.first, "ops": log.ops(d.first),
             "other": d.second, "other_ops": log.ops(d.second), "note": d.reason}
        )  # fmt: skip
    return rows


def fusion_logs(gpu_sizes: bool) -> dict[str, inductor.FusionLog]:
    """Each case of `fusion_cases` compiled afresh on this lane (bf16 on a GPU, fp32 on a CPU): its log."""
    dtype = torch.bfloat16 if DEVICE != "cpu" else torch.float32
    cases = fusion_cases(gpu_sizes, dtype)
    return {case: inductor.fusion_log(fn, *args) for case, (fn, args) in cases.items()}


def fusion_log_record() -> list[dict]:
    """`fusion_logs` at this lane's sizes, as `fusion_log_rows` (the record `ch05_fusion_log`)."""
    logs = fusion_logs(gpu_sizes=DEVICE != "cpu")
    return [row for case, log in logs.items() for row in fusion_log_rows(case, log)]


def fusion_log_table(table: Table, case: str) -> Table:
    """One case of a `ch05_fusion_log` record: its nodes, then the scheduler's decisions, round by round."""
    keep = ("round", "event", "node", "ops", "other", "note")
    return Table({k: r[k] for k in keep} for r in table.where(case=case).rows)


@benchmark("ch05_fusion")
def bench_fusion() -> list[dict]:
    copy_gbps = measure_copy_bandwidth()
    big = 1 << 26
    rows = add_relu_rows(big, copy_gbps) + mul_add_sigmoid_rows(big, copy_gbps)
    rows += chain_rows(15, [big], copy_gbps)
    rows += [
        {**r, "kind": "chain_sweep"} for r in chain_sweep([2, 4, 8, 15], [1 << 20, 1 << 23, big], copy_gbps)
    ]
    rows += rmsnorm_rows(16384, 4096, copy_gbps)
    rows += sincos_rows(big, copy_gbps)
    rows += epilogue_rows(4096, 4096, 4096, copy_gbps)
    rows += prologue_rows(16, 4096, 4096, copy_gbps) + prologue_rows(4096, 4096, 4096, copy_gbps)
    return rows  # the int8 paths over M: their own benchmark, ch05_int8_paths


@benchmark("ch05_launch")
def bench_launch() -> list[dict]:
    rows = [{"table": "per_call", **r} for r in launch.host_rows()]
    return rows + [{"table": "breakdown", **r} for r in launch.breakdown_rows()]


def summary(table: Table) -> Table:
    """Per fusion kind (headline sizes): eager / compile / labkernels GB/s; labkernels vs compile and copy."""
    out = []
    for r in table.rows:
        if r["impl"] != "labkernels" or r["kind"] in ("chain_sweep", "int8_paths"):
            continue
        same = [s for s in table.rows if s["kind"] == r["kind"] and s["shape"] == r["shape"]]
        by = {s["impl"]: s for s in same}
        out.append(
            {
                "kind": r["kind"] + (f" ({r['n_ops']} ops)" if r["kind"] == "chain" else ""),
                "shape": r["shape"],
                "dtype": r["dtype"],
                "eager_gbps": round(by["eager"]["gbps"]),
                "compile_gbps": round(by["compile"]["gbps"]),
                "labkernels_gbps": round(r["gbps"]),
                "vs_compile": round(r["ratio_vs_compile"], 2),
                "vs_eager": round(r["speedup_vs_eager"], 2),
                "fraction_of_copy": round(r["fraction_of_copy"], 2),
            }
        )
    return Table(out)


IMPLS = (("eager", "eager"), ("compile", "torch.compile"), ("labkernels", "labkernels"))


def _compute_bound(row: dict) -> bool:
    """A matmul row (shape "MxNxK") whose FLOPs per byte are past 100: the 4096^3 ones, a few hundred, near
    or past an H200's ridge, measured in TFLOP/s; M = 16 has about 30 and is bound by reading W."""
    dims = [int(d) for d in str(row["shape"]).split("x")]
    return len(dims) == 3 and 2 * dims[0] * dims[1] * dims[2] / row["bytes"] > 100


def same_bytes_gbps(table: Table) -> Table:
    """Per memory-bound fusion kind (headline sizes), each version's speed as GB/s of the *hand-fused*
    kernel's bytes: those bytes over that version's time. One scale for all three, so GB/s compare as
    speeds; a version's own GB/s (the `summary` table) counts its own bytes, and eager's or compile's extra
    passes make them move more bytes, so that they can show more GB/s while they take longer."""
    out = []
    for r in table.rows:
        if r["impl"] != "labkernels" or r["kind"] in ("chain_sweep", "int8_paths") or _compute_bound(r):
            continue
        by = {s["impl"]: s for s in table.rows if s["kind"] == r["kind"] and s["shape"] == r["shape"]}
        row = {"kind": r["kind"], "shape": r["shape"], "dtype": r["dtype"]}
        row |= {impl: r["bytes"] / (by[impl]["ms"] * 1e6) for impl, _ in IMPLS}  # bytes / ms -> GB/s
        out.append(row)
    return Table(out)


def plot_kinds(table: Table, copy_gbps: float | None = None, ax=None):
    """Bars of `same_bytes_gbps`: eager, compile and hand-fused per fusion kind; a taller bar is a faster
    version. The copy bandwidth, as a dotted line, is the most the hand-fused bytes can go."""
    import matplotlib.pyplot as plt

    rows = same_bytes_gbps(table).rows
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 4), layout="constrained")
    width = 0.27
    for i, (impl, label) in enumerate(IMPLS):
        ax.bar([j + (i - 1) * width for j in range(len(rows))], [r[impl] for r in rows], width, label=label)
    if copy_gbps:
        ax.axhline(copy_gbps, ls=":", color="gray", label="copy bandwidth")
    ax.set_xticks(range(len(rows)), [f"{r['kind']}\n{r['shape']} {r['dtype']}" for r in rows], fontsize=7)
    ax.set_ylabel("GB/s of the hand-fused kernel's bytes\n(higher = faster)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: no bar hidden
    return ax
