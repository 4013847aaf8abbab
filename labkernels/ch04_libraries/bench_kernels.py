"""Chapter 04 kernel benchmarks (`make bench`, GPU lane): this chapter's matmul (split-K, stream-K, TF32
K-major) against cuBLAS, and its implicit-GEMM convolution against cuDNN in both layouts.

Every implementation is timed twice: as a user calls it (`timing.time_ms`, plain calls, host cost included
where the GPU cannot hide it) and as CUDA-graph replays (`timing.graph_ms`, the host taken out). Rounds
alternate between implementations, median of each: the clock follows the card's power draw, so whichever
ran first would otherwise get the cooler, faster card.
"""

from __future__ import annotations

import contextlib
import re
import statistics

import torch

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch03_triton import matmul as ch03
from labkernels.ch04_libraries import conv as conv_mod
from labkernels.ch04_libraries import splitk
from labkernels.lane import DEVICE
from labkernels.results import Table, load_reference
from labkernels.roofline import tf32_matmuls

ROUNDS = 2
MATMUL_SHAPES = [  # the six first, then skinny and wave-quantized ones
    (1024, 1024, 1024),
    (4096, 512, 4096),
    (512, 4096, 4096),
    (4096, 4096, 512),
    (3000, 5000, 1000),
    (8192, 8192, 8192),
    (16, 4096, 4096),
    (4096, 16, 4096),
    (128, 128, 65536),
    (1536, 1536, 1536),
    (2048, 2048, 2048),
    (6144, 6144, 6144),
]
MODES = {
    "plain": lambda fn: timing.time_ms(fn, warmup=10, rep=30),
    "graph": lambda fn: timing.graph_ms(fn, rep=10),
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _time_rounds(impls: dict, context=contextlib.nullcontext) -> dict[tuple[str, str], float]:
    """Median ms per (impl, mode), over ROUNDS alternating rounds."""
    samples = {(impl, mode): [] for impl in impls for mode in MODES}
    with context():
        for fn in impls.values():
            fn()  # tuning and first-call work stay outside the timed region
        for _ in range(ROUNDS):
            for impl, fn in impls.items():
                for mode, timer in MODES.items():
                    samples[impl, mode].append(timer(fn))
    return {key: statistics.median(values) for key, values in samples.items()}


def _rows(times: dict, params: dict, flops: float, baseline: str, extra: dict) -> list[dict]:
    rows = []
    for (impl, mode), ms in times.items():
        row = {**params, "impl": impl, "mode": mode, "ms": ms, "tflops": timing.tflops(flops, ms)}
        if impl != baseline:
            row["ratio_vs_" + baseline] = times[baseline, mode] / ms
        rows.append(row | extra.get(impl, {}))
    return rows


def _variant_name(kernel: str, a, b) -> str:
    return ch03.tuned_config(a, b)[0] if kernel == "ch03" else kernel


def matmul_rows(m: int, n: int, k: int, dtype: torch.dtype = torch.bfloat16) -> list[dict]:
    """auto, each kernel auto considered for this shape (split-K also in its deterministic mode), cuBLAS."""
    a = torch.randn(m, k, device=DEVICE).to(dtype)
    b = torch.randn(k, n, device=DEVICE).to(dtype)
    chosen = splitk.chosen_kernel(a, b)  # times the candidates, the first time
    impls = {"labkernels": lambda: splitk.matmul(a, b)}
    for candidate in splitk.auto_candidates(m, n, k, splitk.num_sms(), dtype):
        name = _variant_name(candidate, a, b)
        impls[name] = lambda name=name: splitk.matmul(a, b, kernel=name)
        if name == "split_k":
            impls["split_k_deterministic"] = lambda: splitk.matmul(a, b, kernel="split_k", deterministic=True)
    impls["cublas"] = lambda: a @ b
    times = _time_rounds(impls)
    split = splitk.split_for(m, n, k, splitk.num_sms())
    params = {"m": m, "n": n, "k": k, "dtype": _dtype_name(dtype), "auto_kernel": chosen}
    extra = {"split_k": {"split": split}, "split_k_deterministic": {"split": split}}
    return _rows(times, params, traffic.matmul(m, n, k, dtype).flops, "cublas", extra)


def tf32_rows(size: int = 4096) -> list[dict]:
    """fp32 with TF32 on both sides. "labkernels" copies B to K-major inside the call (counted);
    "k_major_view" gets a B that already is (as `w.t()` of a row-major weight), so it copies nothing."""
    a, b = torch.randn(size, size, device=DEVICE), torch.randn(size, size, device=DEVICE)
    b_view = b.t().contiguous().t()
    impls = {
        "labkernels": lambda: splitk.matmul(a, b, allow_tf32=True),
        "k_major_view": lambda: splitk.matmul(a, b_view, allow_tf32=True),
        "ch03_tiled": lambda: ch03.matmul(a, b, input_precision="tf32", kernel="tiled"),
        "cublas": lambda: a @ b,
    }
    times = _time_rounds(impls, lambda: tf32_matmuls(True))
    params = {
        "m": size,
        "n": size,
        "k": size,
        "dtype": "tf32",
        "auto_kernel": splitk.chosen_kernel(a, b, allow_tf32=True),
    }
    return _rows(times, params, traffic.matmul(size, size, size).flops, "cublas", {})


@benchmark("ch04_matmul")
def bench_matmul() -> list[dict]:
    rows = []
    for shape in MATMUL_SHAPES:
        shape_rows = matmul_rows(*shape)
        rows += shape_rows
        _print_matmul(shape_rows)
    tf32 = tf32_rows()
    _print_matmul(tf32)
    return rows + tf32


def _print_matmul(rows: list[dict]) -> None:
    ours = {r["mode"]: r for r in rows if r["impl"] == "labkernels"}
    r = ours["graph"]
    print(
        f"  matmul {r['m']}x{r['n']}x{r['k']} {r['dtype']}: auto={r['auto_kernel']} ratio vs cuBLAS "
        f"plain {ours['plain']['ratio_vs_cublas']:.2f} graph {r['ratio_vs_cublas']:.2f}",
        flush=True,
    )


def vs_cublas_summary(table: Table | None = None, dtype: str = "bfloat16") -> Table | None:
    """Per timing mode (plain calls, graph replays): the geometric mean of labkernels' ratio to cuBLAS over
    the H200 table's shapes (`ch04_matmul`), and the lowest ratio with its shape. A geometric mean, because
    the ratios multiply: 2x on one shape and 0.5x on another average to 1x, not 1.25x."""
    table = load_reference("ch04_matmul") if table is None else table
    if table is None:
        return None
    rows = []
    for mode in MODES:
        ours = table.where(impl="labkernels", mode=mode, dtype=dtype).rows
        worst = min(ours, key=lambda r: r["ratio_vs_cublas"])
        mean = statistics.geometric_mean(r["ratio_vs_cublas"] for r in ours)
        rows.append({"calls": mode, "shapes": len(ours), "geometric mean": round(mean, 3),
                     "lowest": round(worst["ratio_vs_cublas"], 3),
                     "lowest at": f"{worst['m']}x{worst['n']}x{worst['k']}"})  # fmt: skip
    return Table(rows)


HOST_ROUNDS = 5
HOST_SHAPES = [(16, 4096, 4096), (4096, 16, 4096), (128, 128, 65536), (1024, 1024, 1024)]


@benchmark("ch04_matmul_host")
def bench_matmul_host() -> list[dict]:
    """Host time of one call into an idle GPU queue (`timing.host_us_idle`) of `splitk.matmul` (auto, and
    split-K with the fixed-order sum) and of `torch.matmul`, bf16; the kernel auto runs."""
    rows = []
    for m, n, k in HOST_SHAPES:
        a = torch.randn(m, k, device=DEVICE).to(torch.bfloat16)
        b = torch.randn(k, n, device=DEVICE).to(torch.bfloat16)
        impls = {
            "labkernels": lambda a=a, b=b: splitk.matmul(a, b),
            "split_k_deterministic": lambda a=a, b=b: splitk.matmul(
                a, b, kernel="split_k", deterministic=True
            ),
            "torch.matmul": lambda a=a, b=b: a @ b,
        }
        params = {"m": m, "n": n, "k": k, "dtype": "bfloat16", "auto_kernel": splitk.chosen_kernel(a, b)}
        for fn in impls.values():
            fn()  # tuning and the first call's checks stay out of the timing
        samples = {impl: [] for impl in impls}
        for _ in range(HOST_ROUNDS):  # alternating: a pause of the host's lands on one sample, not one impl
            for impl, fn in impls.items():
                samples[impl].append(timing.host_us_idle(fn))
        rows += [params | {"impl": impl, "host_us": statistics.median(us)} for impl, us in samples.items()]
        print(
            f"  host per call {m}x{n}x{k}: "
            + ", ".join(f"{r['impl']} {r['host_us']:.1f} us" for r in rows[-3:])
        )
    return rows


_SUMS = {"direct": "nothing to add", "ordered": "fixed order", "atomic": "atomics + cast"}  # splitk modes


def split_k_sums() -> Table | None:
    """Graph replays of split-K at each shape the H200 table ran it: the default (few chunks: the fixed-order
    sum in one launch; many: atomics and a cast) beside `deterministic=True` (the fixed order always)."""
    table = load_reference("ch04_matmul")
    if table is None:
        return None
    graphs = table.where(mode="graph")
    rows = []
    for r in graphs.where(impl="split_k"):
        fixed = graphs.where(impl="split_k_deterministic", m=r["m"], n=r["n"], k=r["k"]).rows[0]
        chunks = r["split"]
        rows.append({"m": r["m"], "n": r["n"], "k": r["k"], "chunks": chunks,
                     "default adds by": _SUMS[splitk._split_k_mode(chunks, deterministic=False)],
                     "default, us": round(r["ms"] * 1e3, 2), "fixed order, us": round(fixed["ms"] * 1e3, 2),
                     "fixed order vs cuBLAS": round(fixed["ratio_vs_cublas"], 2)})  # fmt: skip
    return Table(rows)


def host_per_call() -> Table | None:
    """The H200's host time per call (`ch04_matmul_host`): labkernels' kept plan against torch.matmul."""
    table = load_reference("ch04_matmul_host")
    if table is None:
        return None
    rows = []
    for r in table.where(impl="labkernels"):
        lib = table.where(impl="torch.matmul", m=r["m"], n=r["n"], k=r["k"]).rows[0]
        rows.append({"m": r["m"], "n": r["n"], "k": r["k"], "auto runs": r["auto_kernel"],
                     "labkernels, us": round(r["host_us"], 1), "torch.matmul, us": round(lib["host_us"], 1),
                     "ratio": round(r["host_us"] / lib["host_us"], 2)})  # fmt: skip
    return Table(rows)


# --- filling the SMs where no power-of-two tile does -------------------------------------------------------

# experiments/wide_tiles.py names a variant "BM+EM x BN+EN x BK sS wW [tma]": a (BM + EM) x (BN + EN) tile
# made of up to four power-of-two blocks; experiments/sk_tail.py "BMxBNxBK sS wW" and its switches below.
_WIDE_NAME = re.compile(r"(\d+)\+(\d+)x(\d+)\+(\d+)x\d+ s\d+ w\d+( tma)?")
_TAIL_NAME = re.compile(r"(\d+)x(\d+)x\d+ s\d+ w\d+ ?(.*)")
_TAIL_SWITCHES = {  # in the order the names write them
    "no SK": "whole tiles only",
    "+1 wave": "+1 wave stream-K",
    "SK last": "launched last",
    "2 kernels": "2 kernels",
    "atomic": "atomic fix-up",
}
_ALONE = "SK alone"  # the stream-K kernel without the whole tiles: a cost, not a matmul


def _wide_variant(name: str) -> tuple[str, str]:
    """(tile, how): TMA and pointer loads count as one way (the faster is kept)."""
    bm, em, bn, en, _ = _WIDE_NAME.fullmatch(name).groups()
    rows = f"{bm}+{em}" if int(em) else bm
    cols = f"{bn}+{en}" if int(en) else bn
    return f"{int(bm) + int(em)}x{int(bn) + int(en)}", f"tile of blocks {rows} x {cols}"


def _tail_variant(name: str) -> tuple[str, str]:
    bm, bn, switches = _TAIL_NAME.fullmatch(name).groups()
    if "no SK" in switches and "2 kernels" in switches:  # no stream-K tiles: chapter 03's kernel runs alone
        return f"{bm}x{bn}", "chapter 03's tiled kernel, alone"
    said = [words for switch, words in _TAIL_SWITCHES.items() if switch in switches]
    return f"{bm}x{bn}", "stream-K tail" + "".join(f", {words}" for words in said)


def filling_experiments(m: int = 1536, n: int = 1536, k: int = 1536) -> Table | None:
    """What two ways of filling every SM measured at one bf16 shape on the H200, against cuBLAS in the same
    run (CUDA-graph replays; reference tables ch04_wide_tiles and ch04_sk_tail): the fastest config of each
    tile and approach, fastest first, after the shipped matmul. `programs` is the tiles (for stream-K: the
    whole tiles plus one program per SM), `an SM holds` the programs its shared memory and registers allow
    at once (measured for the tile experiment only). "2 kernels": chapter 03's tiled kernel takes the
    whole tiles, the stream-K kernel the rest, on a second stream; "atomic fix-up": the pieces of a tile
    add into one fp32 sum with atomics (not bitwise repeatable) instead of the last one adding them all."""
    wide, tail = load_reference("ch04_wide_tiles"), load_reference("ch04_sk_tail")
    if wide is None or tail is None:
        return None
    best: dict[tuple[str, str], dict] = {}
    for table, describe in ((wide, _wide_variant), (tail, _tail_variant)):
        for r in table.where(m=m, n=n, k=k):
            if r["impl"] in ("cublas", "shipped") or _ALONE in r["impl"]:
                continue
            tile, how = describe(r["impl"])
            stream_k = r.get("sk_tiles") or 0
            programs = r["tiles"] - stream_k + (r["sms"] if stream_k else 0)
            row = {"tile": tile, "how": how, "programs": programs, "stream-K tiles": stream_k,
                   "an SM holds": r.get("resident_per_sm"), "us": round(r["ms"] * 1e3, 1),
                   "vs cuBLAS": round(r["of_cublas"], 3)}  # fmt: skip
            if (tile, how) not in best or row["vs cuBLAS"] > best[tile, how]["vs cuBLAS"]:
                best[tile, how] = row
    shipped = wide.where(m=m, n=n, k=k, impl="shipped").rows[0]
    first = {"tile": "(chapter 03's pick)", "how": "the shipped matmul, same run", "programs": None,
             "stream-K tiles": None, "an SM holds": None, "us": round(shipped["ms"] * 1e3, 1),
             "vs cuBLAS": round(shipped["of_cublas"], 3)}  # fmt: skip
    return Table([first, *sorted(best.values(), key=lambda r: -r["vs cuBLAS"])])


def leftover_cost(m: int = 1536, n: int = 1536, k: int = 1536) -> Table | None:
    """What the stream-K kernel takes on the leftover tiles alone (sk_tail's "SK alone" rows: the whole
    tiles skipped), beside the whole matmul by chapter 03's pick and by cuBLAS, on the H200 in one run."""
    tail = load_reference("ch04_sk_tail")
    if tail is None:
        return None
    rows = tail.where(m=m, n=n, k=k)
    whole = {r["impl"]: r for r in rows if r["impl"] in ("cublas", "shipped")}
    table = [{"what": "the whole matmul, cuBLAS", "tiles": None, "us": round(whole["cublas"]["ms"] * 1e3, 1)},
             {"what": "the whole matmul, chapter 03's pick", "tiles": None,
              "us": round(whole["shipped"]["ms"] * 1e3, 1)}]  # fmt: skip
    for r in rows:
        if _ALONE in r["impl"]:
            fix_up = "atomic fix-up" if "atomic" in r["impl"] else "last piece adds all"
            table.append({"what": f"stream-K kernel alone, leftover tiles only ({fix_up})",
                          "tiles": f"{r['sk_tiles']} of {r['tiles']}",
                          "us": round(r["ms"] * 1e3, 1)})  # fmt: skip
    return Table(table)


def _variant_rows(name: str) -> list[dict] | None:
    """The rows of reference table `name` other than its baselines (cuBLAS, the shipped matmul); None when
    the table is not shipped."""
    table = load_reference(name)
    return None if table is None else [r for r in table if r["impl"] not in ("cublas", "shipped")]


def tile_count_cost(sms: int = 132) -> Table | None:
    """Chapter 03's tiled kernel at 1536^3 (64 x 128 tiles) launched on only its first T tiles, on the H200
    (reference ch04_tile_count, CUDA-graph replays beside cuBLAS): C is then only partly written; the time
    says what the tiles past each count cost. `on the busiest SM`: T programs dealt out to the SMs in turn."""
    table = load_reference("ch04_tile_count")
    if table is None:
        return None
    rows = []
    for r in table:
        if not r["impl"].startswith("ch03 first "):
            continue
        tiles = int(r["impl"].split()[2])
        rows.append({"tiles launched": tiles, "on the busiest SM": -(-tiles // sms),
                     "us": round(r["ms"] * 1e3, 1), "vs cuBLAS": round(r["of_cublas"], 3)})  # fmt: skip
    return Table(rows)


def _occupancy_variant(r: dict) -> dict:
    """experiments/sk_tail.py's --occupancy names: "64x128x64 s3 w4 [+N wave] [atomic] [P/SM] [maxnreg R]"."""
    name = r["impl"]
    per_sm = int(re.search(r"(\d+)/SM", name).group(1)) if "/SM" in name else 1
    cap = re.search(r"maxnreg (\d+)", name)
    stream_k = int(r["sk_tiles"] or 0)
    return {
        "tile": "x".join(name.split("x")[:2]),
        "stages": int(re.search(r" s(\d+) ", name).group(1)),
        "whole tiles": int(r["tiles"]) - stream_k,
        "stream-K tiles": stream_k,
        "stream-K programs": r["sms"] * per_sm if stream_k else 0,
        "register cap": int(cap.group(1)) if cap else None,
        "fix-up": ("atomic" if "atomic" in name else "last piece adds all") if stream_k else None,
        "us": round(r["ms"] * 1e3, 1),
        "vs cuBLAS": round(r["of_cublas"], 3),
        "error after replays": float(f"{r['rel_err_after_replays']:.3g}"),
        "flag": _replay_flag(r),
    }


REPLAY_DRIFT = 2.0  # an error after replays this many times the first call's: the variant is not sound


def _replay_flag(r: dict) -> str:
    """The flag "WRONG after replays" where a variant's error after CUDA-graph replays grew past REPLAY_DRIFT
    x its first call's (its partial sums left state behind between replays); else empty."""
    after, first = r["rel_err_after_replays"], r["rel_err"]
    return "WRONG after replays" if after > REPLAY_DRIFT * max(first, 1e-12) else ""


def stream_k_occupancy() -> Table | None:
    """The stream-K tail again at 1536^3 on the H200, its registers capped so that an SM holds 3 of its
    programs (`maxnreg`), and classic stream-K over 2 or 3 programs an SM (reference ch04_sk_occupancy,
    graph replays beside cuBLAS and the shipped matmul, fastest first)."""
    table = load_reference("ch04_sk_occupancy")
    if table is None:
        return None
    shipped = table.where(impl="shipped").rows[0]
    first = {"tile": "(chapter 03's pick)", "stages": None, "whole tiles": None, "stream-K tiles": None,
             "stream-K programs": None, "register cap": None, "fix-up": "the shipped matmul, same run",
             "us": round(shipped["ms"] * 1e3, 1), "vs cuBLAS": round(shipped["of_cublas"], 3),
             "error after replays": float(f"{shipped['rel_err_after_replays']:.3g}"),
             "flag": _replay_flag(shipped)}  # fmt: skip
    rows = [_occupancy_variant(r) for r in _variant_rows("ch04_sk_occupancy")]
    return Table([first, *sorted(rows, key=lambda r: -r["vs cuBLAS"])])


def three_an_sm() -> Table | None:
    """1536^3 in 384 tiles, about three on every SM, each tile made of two power-of-two blocks (reference
    ch04_three_an_sm; experiments/wide_tiles.py --three), beside chapter 03's pick, fastest first."""
    variants = _variant_rows("ch04_three_an_sm")
    if variants is None:
        return None
    rows = []
    for r in variants:
        tile, how = _wide_variant(r["impl"].removesuffix(" tma"))
        k_step, stages = re.search(r"x(\d+) s(\d+) ", r["impl"]).groups()
        rows.append({"tile": tile, "made of": how.removeprefix("tile of blocks "), "K-step": int(k_step),
                     "stages": int(stages), "programs": r["tiles"],
                     "loads": "TMA" if r["impl"].endswith("tma") else "pointers",
                     "an SM holds": r["resident_per_sm"], "us": round(r["ms"] * 1e3, 1),
                     "vs cuBLAS": round(r["of_cublas"], 3)})  # fmt: skip
    return Table(sorted(rows, key=lambda r: -r["vs cuBLAS"]))


def wave_tail_tiles() -> Table | None:
    """The full waves' 264 tiles of 64 x 128 and the 24 left over as narrower tiles in a second launch on a
    second stream, at 1536^3 on the H200 (reference ch04_wave_tail, graph replays in alternating rounds),
    fastest first, after chapter 03's kernel on all 288 tiles in the same run."""
    variants = _variant_rows("ch04_wave_tail")
    if variants is None:
        return None
    rows = []
    for r in variants:
        if " + " in r["impl"]:
            tail = r["impl"].split(" + ")[1]
            how = "second stream, launched first" if "small first" in tail else "second stream"
            how = "same stream, after" if "one stream" in tail else how
            tile = " ".join(tail.split()[:2])  # "64x32x64 s3": the tile, its K-step and stages
        else:
            tile, how = "(none: one launch)", "chapter 03's kernel, all 288 tiles"
        rows.append({"leftover tiles as": tile, "launched": how, "us": round(r["ms"] * 1e3, 2),
                     "vs cuBLAS": round(r["of_cublas"], 3)})  # fmt: skip
    return Table(sorted(rows, key=lambda r: -r["vs cuBLAS"]))


ONE_LAUNCH_NAMES = {  # experiments/one_launch_tail.py's names for what it timed
    "package wave_tail": "matmul(kernel='wave_tail'): one launch",
    "package tiled": "matmul(kernel='tiled')",
    "two streams, 64x32 narrow": "two launches, two streams (the first form)",
    "ch03 kernel, all 288": "chapter 03's kernel, all 288 tiles (Triton's launch)",
    **{f"one launch, 64x{w} narrow": f"one launch, 64x{w} tiles (bare launcher)" for w in (16, 32, 64)},
}


def one_launch_tail() -> Table | None:
    """At 1536^3 bf16 on the H200 (reference ch04_one_launch_tail, one run, alternating rounds): the leftover
    tiles narrower in the same launch (the package's call and the bare kernel at three widths), in a second
    launch on a second stream, and chapter 03's kernel on all the tiles, as CUDA-graph replays and as plain
    calls, with a plain call's host time; fastest graph replay first, cuBLAS last."""
    table = load_reference("ch04_one_launch_tail")
    if table is None:
        return None
    rows = []
    for impl in table.unique("impl"):
        graph, plain = (table.where(impl=impl, mode=mode).rows[0] for mode in ("graph", "plain"))
        rows.append({"what": ONE_LAUNCH_NAMES.get(impl, impl),
                     "graph replay, us": round(graph["ms"] * 1e3, 2),
                     "graph vs cuBLAS": round(graph["of_cublas"], 3),
                     "plain call, us": round(plain["ms"] * 1e3, 2),
                     "plain vs cuBLAS": round(plain["of_cublas"], 3),
                     "host per call, us": round(plain["host_us"], 1)})  # fmt: skip
    return Table(sorted(rows, key=lambda r: (r["what"] == "cublas", -r["graph vs cuBLAS"])))


SHORT_K_TILE = "128x256x64 s3 w8"  # chapter 03's largest TMA config: the one the K sweep times


def short_k() -> tuple[Table, Table] | None:
    """Chapter 03's TMA-persistent kernel at 3000 x 5000 x K bf16 on the H200 (reference ch04_tma_variants:
    one run, alternating rounds). (1) Its 128 x 256 x 64 config against cuBLAS as K grows, CUDA-graph
    replays; (2) at K = 1000, the package's matmul and the kernel's variants (epilogue stored in column
    slices, stages, grouping, no flattening, warp specialization), best graph replay first."""
    table = load_reference("ch04_tma_variants")
    if table is None:
        return None
    at_3000 = table.where(m=3000, n=5000)
    growth = []
    for k in at_3000.unique("k"):
        tile, cublas = (at_3000.where(k=k, variant=v).rows[0] for v in (SHORT_K_TILE, "cublas"))
        growth.append({"K": k, "K-steps a tile": -(-k // 64),
                       "labkernels, us": round(tile["graph_ms"] * 1e3, 1),
                       "cuBLAS, us": round(cublas["graph_ms"] * 1e3, 1),
                       "vs cuBLAS": round(tile["graph_vs_cublas"], 3)})  # fmt: skip
    variants = [
        {"variant": r["variant"], "graph vs cuBLAS": round(r["graph_vs_cublas"], 3),
         "plain vs cuBLAS": round(r["plain_vs_cublas"], 3)}
        for r in at_3000.where(k=1000).rows if r["variant"] != "cublas"
    ]  # fmt: skip
    return Table(growth), Table(sorted(variants, key=lambda r: -r["graph vs cuBLAS"]))


# --- convolution -------------------------------------------------------------------------------------------

# (batch, C, size, K_out, R, stride, padding): ResNet-50's 3x3 stages, a 1x1 reduction, a stride-2 3x3.
CONV_SHAPES = [
    (32, 64, 56, 64, 3, 1, 1),
    (32, 128, 28, 128, 3, 1, 1),
    (32, 256, 14, 256, 3, 1, 1),
    (32, 512, 7, 512, 3, 1, 1),
    (32, 256, 56, 64, 1, 1, 0),
    (32, 128, 56, 128, 3, 2, 1),
]


def conv_rows(batch, c, size, k_out, r, stride, padding, dtype=torch.float16) -> list[dict]:
    """labkernels (NHWC) against cuDNN with channels_last and with NCHW, cudnn.benchmark on."""
    x_nchw = torch.randn(batch, c, size, size, device=DEVICE).to(dtype)
    w_torch = torch.randn(k_out, c, r, r, device=DEVICE).to(dtype)
    x_nhwc, w_nhwc = x_nchw.permute(0, 2, 3, 1).contiguous(), conv_mod.weight_from_torch(w_torch)
    x_cl = x_nchw.contiguous(memory_format=torch.channels_last)
    w_cl = w_torch.contiguous(memory_format=torch.channels_last)
    conv = torch.nn.functional.conv2d
    impls = {
        "labkernels": lambda: conv_mod.conv2d_nhwc(x_nhwc, w_nhwc, stride=stride, padding=padding),
        "cudnn_channels_last": lambda: conv(x_cl, w_cl, stride=stride, padding=padding),
        "cudnn_nchw": lambda: conv(x_nchw, w_torch, stride=stride, padding=padding),
    }
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        times = _time_rounds(impls)
    finally:
        torch.backends.cudnn.benchmark = old
    p = conv_mod.output_size(size, r, stride, padding)
    flops = 2 * batch * p * p * k_out * r * r * c
    params = {
        "batch": batch,
        "c": c,
        "size": size,
        "k_out": k_out,
        "r": r,
        "stride": stride,
        "padding": padding,
    }
    params["dtype"] = _dtype_name(dtype)
    rows = _rows(times, params, flops, "cudnn_channels_last", {})
    for row in rows:  # both baselines, per mode
        row["ratio_vs_cudnn_nchw"] = times["cudnn_nchw", row["mode"]] / row["ms"]
    return rows


@benchmark("ch04_conv")
def bench_conv() -> list[dict]:
    rows = []
    for shape in CONV_SHAPES:
        shape_rows = conv_rows(*shape)
        rows += shape_rows
        ours = {r["mode"]: r for r in shape_rows if r["impl"] == "labkernels"}
        print(
            f"  conv C={shape[1]} {shape[2]}^2 K={shape[3]} {shape[4]}x{shape[4]} s{shape[5]}: "
            f"{ours['graph']['tflops']:.0f} TFLOP/s, vs cuDNN NHWC "
            f"plain {ours['plain']['ratio_vs_cudnn_channels_last']:.2f} "
            f"graph {ours['graph']['ratio_vs_cudnn_channels_last']:.2f}",
            flush=True,
        )
    return rows


def tuning_summary() -> Table | None:
    """One row per design tried on the shapes chapter 03's matmul leaves behind (the appendix's records, graph
    replays on the H200): its best variant against cuBLAS beside the baseline of the same run, and whether
    the package kept it. None when a record is not shipped."""
    fill, occ = filling_experiments(1536, 1536, 1536), stream_k_occupancy()
    three, tails, one, short = three_an_sm(), wave_tail_tiles(), one_launch_tail(), short_k()
    if None in (fill, occ, three, tails, one, short):
        return None

    def best(rows, column="vs cuBLAS"):
        return max(r[column] for r in rows)

    pick = fill.rows[0]["vs cuBLAS"]  # chapter 03's pick, the shipped matmul, in the same run
    blocks = [r for r in fill if r["how"].startswith("tile of blocks") and "+" in r["how"]]  # 128 x 128+16...
    stream = [r for r in fill if r["how"].startswith("stream-K tail")]
    capped = [r for r in occ.rows[1:] if r["stream-K tiles"]]
    by_what = {r["what"]: r for r in one}
    variants = {r["variant"]: r for r in short[1]}
    shipped_short = variants.pop("shipped matmul")["graph vs cuBLAS"]
    rows = [
        ("a tile of power-of-two blocks (128 x 144, 192 x 96, ...)", "1536^3", best(blocks), pick, "no"),
        ("whole tiles, then a stream-K tail", "1536^3", best(stream), pick, "no"),
        ("stream-K tail, registers capped (3 programs an SM)", "1536^3", best(capped),
         occ.rows[0]["vs cuBLAS"], "no"),
        ("three tiles an SM, each of two blocks", "1536^3", best(r for r in three if "+" in r["made of"]),
         three.rows[0]["vs cuBLAS"], "no"),
        ("leftover tiles narrower, second launch on a second stream", "1536^3",
         best(r for r in tails if "second stream" in r["launched"]),
         next(r["vs cuBLAS"] for r in tails if r["leftover tiles as"].startswith("(none")), "no: host cost"),
        ("leftover tiles narrower, in the same launch (wave_tail)", "1536^3",
         by_what["matmul(kernel='wave_tail'): one launch"]["graph vs cuBLAS"],
         by_what["matmul(kernel='tiled')"]["graph vs cuBLAS"], "yes: auto picks it"),
        ("epilogue slices, groupings, no flattening, warp specialization", "3000x5000x1000",
         best(variants.values(), "graph vs cuBLAS"), shipped_short, "no: within noise"),
    ]  # fmt: skip
    names = ("design", "shape", "best vs cuBLAS", "baseline vs cuBLAS, same run", "kept")
    return Table(dict(zip(names, row, strict=True)) for row in rows)
