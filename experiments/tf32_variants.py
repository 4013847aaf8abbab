"""TF32 matmul with a row-major B, and 1536^3 bf16: variants side by side against cuBLAS.

Chapter 04's TF32 path ("k_major") needs B K-major (wgmma takes 32-bit operands from shared memory only with
K contiguous), so a row-major B (K, N) was copied first (`b.t().contiguous()`). This job measured, at 4096^3
(what won, "swapped add0", shipped for a while; its register-operand MMAs were left pending across steps,
see conv_box_diagnose.py, and with the wait that fixes it the copy by a tiled transpose is faster, so the
copy ships again, by chapter 02's tiled kernel):
- cuBLAS TF32; the shipped k_major path with a row-major B (copy) and with a K-major view of B (no copy);
- the copy alone: torch's `b.t().contiguous()` against Triton transposes (tiled, TMA), as a fraction of a
  same-size `clone()`; and the k_major path behind the fastest of them;
- a config sweep of the k_major kernel (direct launches, no copy);
- "swapped": C^T = B^T A^T with no copy at all. B^T (N, K) is the left operand, MN-major in memory; wgmma
  reads its left operand from registers in any layout, and Triton feeds it from registers when an
  elementwise op sits between the load and the dot (A_OP "add0": x + 0.0; "cvt": round to TF32 with
  cvt.rna). A^T (K, M) is the right operand, K-major (A row-major). C is stored transposed.
and at 1536^3 bf16: cuBLAS, chapter 03 (tiled, TMA persistent), chapter 04 (split-K 2/3/4, stream-K) and
direct launches of chapter 03's tiled kernel over a few configs.

Every variant is checked against an fp64 reference (relative Frobenius error) and timed as CUDA-graph replays
(`graph_ms`) and plain calls (`time_ms`). All compiles are done first, in parallel worker processes (the
Triton cache on disk is then hit by the timed process).

    python experiments/tf32_variants.py --out DIR      # GPU: table on stdout, DIR/results.csv
    python experiments/tf32_variants.py --smoke        # CPU lane (interpreter), tiny fp32 shapes
    python experiments/tf32_variants.py --compile-sm90 # no GPU: compile the kernels for sm_90, report wgmma
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import csv
import math
import os
import re
import sys
import time
import traceback

COMPILE_ONLY = __name__ == "__main__" and "--compile-sm90" in sys.argv
if COMPILE_ONLY:  # compile for a GPU on a machine without one: no interpreter, no labkernels lane
    os.environ.pop("TRITON_INTERPRET", None)
else:
    import labkernels  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

TF32_TOL = 3e-3  # relative Frobenius error: TF32 products (10-bit mantissa) summed over K = 4096
BF16_TOL = 1e-2  # bf16 output rounding (8-bit mantissa)


# --- kernels ------------------------------------------------------------------------------------------------


@triton.jit
def _grouped(
    tile_id, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, GROUP_SIZE_M: tl.constexpr
):
    """Chapter 03's grouped tile order (a copy: this file also compiles without labkernels)."""
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tf32_round(x):
    """fp32 -> TF32, round to nearest (ties away): the tensor core would otherwise drop the low 13 bits."""
    return tl.inline_asm_elementwise(
        "cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def _swapped_kernel(
    x_ptr, y_ptr, c_ptr, M, N, K,
    stride_xm, stride_xk, stride_yk, stride_yn, stride_cm, stride_cn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    A_OP: tl.constexpr,  # what happens to the x tile between its load and the dot (see the module docstring)
):  # fmt: skip
    """c = x @ y in TF32, K a multiple of BLOCK_SIZE_K; `_split_k_kernel`'s direct mode plus A_OP. Launched on
    (b.t(), a.t(), c.t()) it computes C^T = B^T A^T: x = B^T is MN-major, y = A^T K-major."""
    pid_m, pid_n = _grouped(tl.program_id(axis=0), M, N, BLOCK_SIZE_M, BLOCK_SIZE_N, GROUP_SIZE_M)
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M  # wrapped: valid rows, never stored
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk  # (BM, BK)
    xt_ptrs = x_ptr + offs_k[:, None] * stride_xk + offs_m[None, :] * stride_xm  # (BK, BM), for "trans*"
    y_ptrs = y_ptr + offs_k[:, None] * stride_yk + offs_n[None, :] * stride_yn  # (BK, BN)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for _ in range(0, K // BLOCK_SIZE_K):
        if A_OP == "trans" or A_OP == "trans_cvt":  # the x tile loaded as (BK, BM), transposed in registers
            x = tl.trans(tl.load(xt_ptrs))  # read BM x BK
            if A_OP == "trans_cvt":
                x = _tf32_round(x)
        else:
            x = tl.load(x_ptrs)  # read BM x BK
            if A_OP == "add0":  # not folded (x + 0.0 != x for x = -0.0): the tile goes through registers
                x = x + 0.0
            elif A_OP == "mul1":  # folded away: no elementwise op is left
                x = x * 1.0
            elif A_OP == "cvt":
                x = _tf32_round(x)
        y = tl.load(y_ptrs)  # read BK x BN
        acc = tl.dot(x, y, acc, input_precision="tf32")
        x_ptrs += BLOCK_SIZE_K * stride_xk
        xt_ptrs += BLOCK_SIZE_K * stride_xk
        y_ptrs += BLOCK_SIZE_K * stride_yk
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))  # write MN


@triton.jit
def _transpose_kernel(
    src_ptr, dst_ptr, R, C, stride_sr, stride_dr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    """dst (C, R) = src (R, C)^T, both with contiguous rows: each tile is read along src's rows and written
    along dst's rows (Triton turns the tile around through shared memory)."""
    offs_r = tl.program_id(axis=0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tl.program_id(axis=1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    tile = tl.load(src_ptr + offs_r[:, None] * stride_sr + offs_c[None, :], mask=mask)  # read BR x BC
    dst_ptrs = dst_ptr + offs_c[:, None] * stride_dr + offs_r[None, :]
    tl.store(dst_ptrs, tl.trans(tile), mask=tl.trans(mask))  # write BC x BR


@triton.jit
def _transpose_tma_kernel(src_ptr, dst_ptr, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """As `_transpose_kernel`, through TMA descriptors (contiguous src and dst; zeros/clipping at edges)."""
    src = tl.make_tensor_descriptor(src_ptr, [R, C], [C, 1], [BLOCK_R, BLOCK_C])
    dst = tl.make_tensor_descriptor(dst_ptr, [C, R], [R, 1], [BLOCK_C, BLOCK_R])
    r0 = tl.program_id(axis=0) * BLOCK_R
    c0 = tl.program_id(axis=1) * BLOCK_C
    dst.store([c0, r0], tl.trans(src.load([r0, c0])))  # read BR x BC, write BC x BR


# --- configs ------------------------------------------------------------------------------------------------

SMEM = 227 * 1024
# (BM, BN, BK, stages, warps, group) for the k_major kernel at 4096^3, no copy
SWEEP = [
    (128, 256, 32, 3, 8, 8), (128, 256, 32, 4, 8, 8), (128, 256, 32, 3, 8, 16),
    (256, 128, 32, 3, 8, 8), (256, 128, 32, 4, 8, 8), (256, 128, 32, 3, 8, 16),
    (128, 128, 32, 4, 4, 8), (128, 128, 32, 4, 8, 8), (128, 128, 32, 5, 4, 8), (128, 128, 32, 5, 8, 8),
    (128, 128, 64, 3, 8, 8), (128, 256, 64, 2, 8, 8), (256, 128, 64, 2, 8, 8),
]  # fmt: skip
# the swapped kernel: (A_OP, BM, BN, BK, stages, warps, group); BM is N's tile (the wgmma M), BN is M's
SWAPPED = [
    ("add0", 128, 256, 32, 3, 8, 8), ("add0", 128, 256, 32, 4, 8, 8), ("add0", 256, 128, 32, 3, 8, 8),
    ("add0", 128, 128, 32, 4, 8, 8), ("add0", 128, 128, 32, 5, 4, 8), ("add0", 128, 128, 64, 3, 8, 8),
    ("cvt", 128, 256, 32, 3, 8, 8), ("cvt", 128, 256, 32, 4, 8, 8), ("cvt", 256, 128, 32, 3, 8, 8),
    ("cvt", 128, 128, 32, 4, 8, 8),
    ("trans_cvt", 128, 256, 32, 3, 8, 8),  # wgmma from registers, but the tile is loaded 4 bytes at a time
    ("none", 128, 256, 32, 3, 8, 8),  # contrast: both operands from shared memory (what k_major does today)
]  # fmt: skip
COMPILE_ONLY_FORMS = ("none", "mul1", "add0", "cvt", "trans", "trans_cvt")
TRANSPOSES = [("tiled", 64, 64, 4), ("tiled", 32, 128, 4), ("tiled", 128, 32, 4), ("tiled", 128, 128, 8)]
TRANSPOSES += [("tma", 32, 32, 4), ("tma", 64, 64, 4), ("tma", 128, 32, 4)]
# chapter 03's tiled kernel at 1536^3 bf16: (BM, BN, BK, stages, warps, group)
TILED_1536 = [
    (128, 64, 64, 4, 4, 8), (64, 128, 64, 4, 4, 8),
    (128, 128, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 128, 64, 5, 8, 8), (128, 128, 64, 4, 4, 8),
    (128, 256, 64, 3, 8, 8), (256, 128, 64, 3, 8, 8), (128, 128, 128, 3, 8, 8),
]  # fmt: skip
SMOKE_TILE = (32, 32, 16, 1, 4, 2)


def fits(bm, bn, bk, stages, elem=4) -> bool:
    return stages * (bm * bk + bk * bn) * elem <= SMEM


def tile_meta(bm, bn, bk, stages, warps, group) -> dict:
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


# --- compile-only: what Triton makes of each kernel for sm_90 -----------------------------------------------


def _sm90(fn, types: dict, constexprs: dict, num_warps: int, num_stages: int):
    """Compile `fn` for sm_90 as a launch would: pointers and the integers in `types` marked 16-divisible
    (every size and stride here is), integers equal to 1 passed as constexprs."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature = {n: types.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in types}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def describe(compiled) -> str:
    """wgmma or mma.sync; where wgmma's left operand comes from (registers or shared memory); the widths of
    the cp.async copies (4-byte copies: a tile turned around element by element)."""
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    dots = [line for line in ttgir.splitlines() if "ttng.warp_group_dot " in line]
    wgmma = len(re.findall(r"wgmma\.mma_async", ptx))
    mma = len(re.findall(r"mma\.sync", ptx))
    left = "registers" if any(": tensor<" in d.split("ttng.warp_group_dot")[1] for d in dots) else "shared"
    copies = sorted(set(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], (0x\w+)", ptx)))
    kind = f"wgmma x{wgmma} (left operand from {left})" if wgmma else f"mma.sync x{mma}"
    return f"{kind}; cp.async sizes {copies or '-'}; smem {compiled.metadata.shared} B"


def compile_only() -> int:
    f32 = {n: "*fp32" for n in ("x_ptr", "y_ptr", "c_ptr")}
    ints = {n: "i32" for n in ("M", "N", "K", "stride_xk", "stride_yn", "stride_cn")}
    failures = 0
    # x = b.t(): strides (1, N); y = a.t(): (1, K); c.t(): (1, N). The unit strides are specialized.
    unit = {"stride_xm": 1, "stride_yk": 1, "stride_cm": 1}
    rows = [(form, 128, 256, 32, 3, 8, 8) for form in COMPILE_ONLY_FORMS] + SWAPPED
    seen = set()
    for form, bm, bn, bk, stages, warps, group in rows:
        if (form, bm, bn, bk, stages, warps) in seen:
            continue
        seen.add((form, bm, bn, bk, stages, warps))
        consts = unit | {"A_OP": form} | tile_meta(bm, bn, bk, stages, warps, group)
        consts = {k: v for k, v in consts.items() if not k.startswith("num_")}
        name = f"swapped {form} {bm}x{bn}x{bk} s{stages} w{warps}"
        try:
            compiled = _sm90(_swapped_kernel, f32 | ints, consts, warps, stages)
            print(f"{name:38s} {describe(compiled)}", flush=True)
        except Exception as exc:
            failures += 1
            print(f"{name:38s} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    for kind, br, bc, warps in TRANSPOSES:
        name = f"transpose {kind} {br}x{bc} w{warps}"
        try:
            if kind == "tiled":
                types = {"src_ptr": "*fp32", "dst_ptr": "*fp32", "R": "i32", "C": "i32"}
                types |= {"stride_sr": "i32", "stride_dr": "i32"}
                compiled = _sm90(_transpose_kernel, types, {"BLOCK_R": br, "BLOCK_C": bc}, warps, 1)
            else:
                types = {"src_ptr": "*fp32", "dst_ptr": "*fp32", "R": "i32", "C": "i32"}
                compiled = _sm90(_transpose_tma_kernel, types, {"BLOCK_R": br, "BLOCK_C": bc}, warps, 1)
            print(f"{name:38s} ok, smem {compiled.metadata.shared} B", flush=True)
        except Exception as exc:
            failures += 1
            print(f"{name:38s} FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return failures


# --- precompiling in parallel (GPU) -------------------------------------------------------------------------


def _jit(tag: str, name: str):
    if tag == "here":
        return globals()[name]
    from labkernels.ch03_triton import matmul as ch03
    from labkernels.ch04_libraries import splitk

    return getattr(splitk if tag == "splitk" else ch03, name)


def _warm(job) -> str:
    """In a worker process: compile one kernel (into Triton's disk cache) without launching it."""
    tag, name, dtypes, scalars, meta = job
    start = time.perf_counter()
    try:
        tensors = [torch.empty(64, dtype=getattr(torch, d), device="cuda") for d in dtypes]
        _jit(tag, name).warmup(*tensors, *scalars, grid=(1,), **meta)
        return f"ok {time.perf_counter() - start:.1f}s"
    except Exception as exc:
        return f"{name} {meta}: {type(exc).__name__}: {str(exc)[:200]}"


def precompile(jobs: list, workers: int) -> None:
    import multiprocessing

    start = time.perf_counter()
    unique = list({repr(j): j for j in jobs}.values())
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.map(_warm, unique, chunksize=1)
    bad = [r for r in results if not r.startswith("ok")]
    took = time.perf_counter() - start
    print(f"precompiled {len(unique) - len(bad)}/{len(unique)} kernels in {took:.0f} s ({workers} processes)")
    for r in bad[:10]:
        print("  precompile failed:", r, flush=True)


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def job(tag, name, tensors, scalars, meta) -> tuple:
    return (tag, name, [_dt(t) for t in tensors], tuple(scalars), dict(meta))


# --- measuring ----------------------------------------------------------------------------------------------


class Table:
    FIELDS = [
        "section",
        "variant",
        "ms_graph",
        "ms_plain",
        "ratio_graph",
        "ratio_plain",
        "rel_err",
        "ok",
        "note",
    ]

    def __init__(self, path: str | None):
        self.rows: list[dict] = []
        self.path = path
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", newline="") as f:
                csv.DictWriter(f, self.FIELDS).writeheader()
        heads = ("graph ms", "plain ms", "x graph", "x plain", "rel err")
        print(f"{'section':8s} {'variant':44s}", *(f"{h:>9s}" for h in heads), "ok", flush=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if self.path:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, self.FIELDS).writerow(row)

        def fmt(v, spec):
            return format(v, spec) if isinstance(v, float) and not math.isnan(v) else f"{'-':>9s}"

        cells = [fmt(row[k], s) for k, s in (("ms_graph", "9.4f"), ("ms_plain", "9.4f"))]
        cells += [fmt(row[k], "9.3f") for k in ("ratio_graph", "ratio_plain")] + [fmt(row["rel_err"], "9.1e")]
        print(f"{row['section']:8s} {row['variant'][:44]:44s}", *cells, row["ok"], row["note"], flush=True)


def rel_err(c: torch.Tensor, ref: torch.Tensor) -> float:
    return float((c.double() - ref).norm() / ref.norm())


class Bench:
    def __init__(self, args, table: Table):
        from labkernels.timing import graph_ms, time_ms

        self.graph_ms, self.time_ms = graph_ms, time_ms
        self.args, self.table = args, table
        self.start = time.perf_counter()

    def over_budget(self) -> bool:
        return time.perf_counter() - self.start > self.args.budget_s

    def sync(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def run(self, section, name, fn, ref=None, tol=None, base=None, check=None, note="") -> dict:
        """Check fn() against ref (fp64), then time it (graph replays, plain calls). base: (graph, plain) ms
        of the baseline the ratios are taken against (baseline / this)."""
        row = dict.fromkeys(("ms_graph", "ms_plain", "ratio_graph", "ratio_plain", "rel_err"), math.nan)
        row |= {"section": section, "variant": name, "ok": "", "note": note}
        try:
            out = fn()
            self.sync()
            if ref is not None:
                err = rel_err(out, ref)
                row["rel_err"], row["ok"] = err, "ok" if err <= tol else "FAIL"
            elif check is not None:
                row["ok"] = "ok" if check(out) else "FAIL"
            del out
            row["ms_graph"] = self.graph_ms(fn, rep=self.args.rep_ms)
            row["ms_plain"] = self.time_ms(fn, warmup=self.args.rep_ms // 2, rep=self.args.rep_ms)
            if base is not None:
                row["ratio_graph"] = base[0] / row["ms_graph"]
                row["ratio_plain"] = base[1] / row["ms_plain"]
        except Exception as exc:
            traceback.print_exc()
            row["ok"], row["note"] = "ERROR", f"{type(exc).__name__}: {str(exc)[:150]}"
        self.table.add(row)
        return row


class Direct:
    """A kernel launched with fixed constexprs: the normal launch once, then labkernels' thin launcher."""

    def __init__(self, jitfn, grid, args: tuple, meta: dict, n_tensors: int, out: torch.Tensor):
        self.jitfn, self.grid, self.args, self.meta = jitfn, grid, args, meta
        self.n, self.out = n_tensors, out  # the leading tensor arguments; C (poisoned until the first launch)
        self.launcher = None

    def __call__(self):
        from labkernels import launch_cache

        if self.launcher is None:
            self.launcher = launch_cache.launch(self.jitfn, self.grid, self.args, self.meta)
        else:
            self.launcher(*self.args[: self.n])
        return self.out


def poisoned(shape, dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# --- the sections -------------------------------------------------------------------------------------------


def tf32_setup(M, N, K, device, smoke):
    """The operands and every launch of the TF32 sections: (direct launches by name, precompile jobs)."""
    from labkernels.ch04_libraries import splitk

    torch.manual_seed(0)
    a = torch.randn(M, K, device=device)
    b = torch.randn(K, N, device=device)
    bt = b.t().contiguous()  # (N, K): b's K-major twin
    direct, jobs = {}, []
    chunk = splitk.split_chunk(K, 1)
    sweep = [SMOKE_TILE] if smoke else SWEEP
    for bm, bn, bk, stages, warps, group in sweep:
        if not fits(bm, bn, bk, stages):
            continue
        c = poisoned((M, N), torch.float32, device)
        args = (a, bt.t(), c, c, c, M, N, K, chunk, *a.stride(), *bt.t().stride(), *c.stride())
        meta = tile_meta(bm, bn, bk, stages, warps, group)
        meta |= {"INPUT_PRECISION": "tf32", "EVEN_K": K % bk == 0, "BIG": False, "MODE": "direct"}
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), 1)
        direct[f"k_major {bm}x{bn}x{bk} s{stages} w{warps} g{group}"] = Direct(
            splitk._split_k_kernel, grid, args, meta, 5, c
        )
        jobs.append(job("splitk", "_split_k_kernel", args[:5], args[5:], meta))
    for cfg in splitk.K_MAJOR_CONFIGS:  # what the shipped autotuner compiles
        meta = cfg.all_kwargs() | {"INPUT_PRECISION": "tf32", "BIG": False, "MODE": "direct", "PTX": True}
        meta["EVEN_K"] = K % meta["BLOCK_SIZE_K"] == 0
        if fits(meta["BLOCK_SIZE_M"], meta["BLOCK_SIZE_N"], meta["BLOCK_SIZE_K"], cfg.num_stages):
            args = (a, bt.t(), a, a, a, M, N, K, chunk, K, 1, 1, K, N, 1)
            jobs.append(job("splitk", "_split_k_kernel", args[:5], args[5:], meta))
    swapped = [("add0", *SMOKE_TILE), ("none", *SMOKE_TILE)] if smoke else SWAPPED
    for form, bm, bn, bk, stages, warps, group in swapped:
        if not fits(bm, bn, bk, stages):
            continue
        c = poisoned((M, N), torch.float32, device)
        x, y, ct = b.t(), a.t(), c.t()  # C^T (N, M) = B^T (N, K) @ A^T (K, M)
        args = (x, y, ct, N, M, K, *x.stride(), *y.stride(), *ct.stride())
        meta = tile_meta(bm, bn, bk, stages, warps, group) | {"A_OP": form}
        grid = (triton.cdiv(N, bm) * triton.cdiv(M, bn),)
        direct[f"swapped {form} {bm}x{bn}x{bk} s{stages} w{warps}"] = Direct(
            _swapped_kernel, grid, args, meta, 3, c
        )
        jobs.append(job("here", "_swapped_kernel", args[:3], args[3:], meta))
    return a, b, bt, direct, jobs


def transposer(kind, br, bc, warps):
    """dst = src.t().contiguous() for a contiguous 2-D src, by one of this file's transpose kernels."""

    def run(src: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
        R, C = src.shape
        dst = torch.empty((C, R), device=src.device, dtype=src.dtype) if dst is None else dst
        grid = (triton.cdiv(R, br), triton.cdiv(C, bc))
        if kind == "tiled":
            _transpose_kernel[grid](
                src, dst, R, C, src.stride(0), dst.stride(0), BLOCK_R=br, BLOCK_C=bc, num_warps=warps
            )
        else:
            _transpose_tma_kernel[grid](src, dst, R, C, BLOCK_R=br, BLOCK_C=bc, num_warps=warps)
        return dst

    return run


def transpose_jobs(b: torch.Tensor) -> list:
    K, N = b.shape
    jobs = []
    for kind, br, bc, warps in TRANSPOSES:
        if kind == "tiled":
            jobs.append(
                job(
                    "here",
                    "_transpose_kernel",
                    (b, b),
                    (K, N, N, K),
                    {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": warps},
                )
            )
        else:
            jobs.append(
                job(
                    "here",
                    "_transpose_tma_kernel",
                    (b, b),
                    (K, N),
                    {"BLOCK_R": br, "BLOCK_C": bc, "num_warps": warps},
                )
            )
    return jobs


def bf16_setup(M, N, K, device, dtype, smoke):
    from labkernels.ch03_triton import matmul as ch03
    from labkernels.ch04_libraries import splitk

    torch.manual_seed(1)
    a = torch.randn(M, K, device=device).to(dtype)
    b = torch.randn(K, N, device=device).to(dtype)
    direct, jobs = {}, []
    common = {"HAS_BIAS": False, "ACTIVATION": None, "INPUT_PRECISION": "tf32", "INDEX_64": False}
    for bm, bn, bk, stages, warps, group in [SMOKE_TILE] if smoke else TILED_1536:
        if not fits(bm, bn, bk, stages, a.element_size()):
            continue
        c = poisoned((M, N), dtype, device)
        args = (a, b, c, c, M, N, K, *a.stride(), *b.stride(), *c.stride())
        meta = tile_meta(bm, bn, bk, stages, warps, group) | common | {"EVEN_K": K % bk == 0}
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        direct[f"ch03 tiled {bm}x{bn}x{bk} s{stages} w{warps}"] = Direct(
            ch03._matmul_tiles, grid, args, meta, 4, c
        )
        jobs.append(job("ch03", "_matmul_tiles", args[:4], args[4:], meta))
    if smoke:
        return a, b, direct, jobs
    # what the shipped autotuners compile at this shape (best effort: a miss only costs a compile later)
    strides = (K, 1, N, 1, N, 1)
    for cfg in ch03.GPU_CONFIGS:
        meta = cfg.all_kwargs() | common
        meta["EVEN_K"] = K % meta["BLOCK_SIZE_K"] == 0
        jobs.append(job("ch03", "_matmul_tiles", (a, b, a, a), (M, N, K, *strides), meta))
    sms = splitk.num_sms(a.device)
    for cfg in ch03.TMA_CONFIGS:
        meta = cfg.all_kwargs() | {"HAS_BIAS": False, "ACTIVATION": None, "NUM_PROGRAMS": sms}
        jobs.append(job("ch03", "_matmul_tma_persistent", (a, b, a, a), (M, N, K, K, N, N), meta))
    ws = torch.empty(1, device=device, dtype=torch.float32)
    flags = torch.empty(1, device=device, dtype=torch.int32)
    for split in (2, 3, 4):
        chunk = splitk.split_chunk(K, split)
        for cfg in splitk.SPLIT_K_CONFIGS:
            for mode in ("ordered", "atomic"):
                # PTX as the shipped launcher sets it on the GPU lane: the same compiled kernel, warmed
                meta = cfg.all_kwargs() | {"INPUT_PRECISION": "ieee", "BIG": False, "MODE": mode, "PTX": True}
                meta["EVEN_K"] = K % meta["BLOCK_SIZE_K"] == 0
                tensors = (a, b, a, ws, flags)
                jobs.append(job("splitk", "_split_k_kernel", tensors, (M, N, K, chunk, *strides), meta))
    # the atomic mode's second launch, with the block `splitk` gives it on the GPU lane
    jobs.append(job("splitk", "_cast_and_zero_kernel", (ws, a), (M * N,), {"BLOCK": 1024}))
    for cfg in splitk.STREAM_K_CONFIGS:
        meta = cfg.all_kwargs() | {"INPUT_PRECISION": "ieee", "BIG": False, "NUM_PROGRAMS": sms}
        meta["EVEN_K"] = K % meta["BLOCK_SIZE_K"] == 0
        jobs.append(job("splitk", "_stream_k_kernel", (a, b, a, ws, flags), (M, N, K, *strides), meta))
    return a, b, direct, jobs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="CPU lane: tiny fp32 shapes, correctness")
    parser.add_argument("--compile-sm90", action="store_true", help="no GPU: compile for sm_90 and report")
    parser.add_argument("--out", default=None, help="folder for results.csv")
    parser.add_argument("--rep-ms", type=int, default=20, help="graph_ms rep (ms); time_ms rep (ms)")
    parser.add_argument("--budget-s", type=float, default=130.0, help="no new section starts after this")
    parser.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    parser.add_argument("--no-precompile", action="store_true")
    args = parser.parse_args()
    if args.compile_sm90:
        return 1 if compile_only() else 0

    from labkernels.ch03_triton import matmul as ch03
    from labkernels.ch04_libraries import splitk
    from labkernels.ch04_libraries.libraries import fp32_matmul_precision
    from labkernels.lane import DEVICE, on_gpu

    smoke = args.smoke or not on_gpu()
    if smoke:
        args.rep_ms = 3
    device = DEVICE
    S = 4096 if not smoke else 96
    M, N, K = (S, S, S) if not smoke else (96, 80, 64)
    S2, dtype2 = (1536, torch.bfloat16) if not smoke else (64, torch.float32)
    table = Table(os.path.join(args.out, "results.csv") if args.out else None)

    a, b, bt, direct32, jobs = tf32_setup(M, N, K, device, smoke)
    a2, b2, direct16, jobs16 = bf16_setup(S2, S2, S2, device, dtype2, smoke)
    jobs += transpose_jobs(b) + jobs16
    if on_gpu() and not args.no_precompile:
        try:
            precompile(jobs, args.workers)
        except Exception:  # each kernel then compiles on its first launch
            traceback.print_exc()
    bench = Bench(args, table)

    # 1. cuBLAS TF32 and the reference
    ref = a.double() @ b.double()  # read MK + KN in fp64, write MN
    with fp32_matmul_precision("tf32"):
        cub = bench.run("tf32", "cublas tf32", lambda: a @ b, ref, TF32_TOL)
    base = (cub["ms_graph"], cub["ms_plain"])

    # 2. the shipped k_major path: row-major B (copied each call) and a K-major view (no copy)
    def km(bb):
        return lambda: splitk.matmul(a, bb, kernel="k_major", allow_tf32=True)

    bench.run("tf32", "k_major shipped, row-major B (copy)", km(b), ref, TF32_TOL, base)
    bench.run("tf32", "k_major shipped, K-major view B", km(bt.t()), ref, TF32_TOL, base)
    print("  k_major tuned config:", splitk.tuned_config(a, b, "k_major"), flush=True)

    # 3. the copy alone, as a fraction of a same-size clone (ratio = clone ms / this ms)
    clone = bench.run("copy", "torch b.clone()", lambda: b.clone())
    copy_base = (clone["ms_graph"], clone["ms_plain"])
    expect = bt
    bench.run(
        "copy",
        "torch b.t().contiguous()",
        lambda: b.t().contiguous(),
        base=copy_base,
        check=lambda t: torch.equal(t, expect),
    )
    best_t, best_ms = None, math.inf
    for kind, br, bc, warps in TRANSPOSES if not smoke else [("tiled", 32, 32, 4), ("tma", 32, 32, 4)]:
        fn = transposer(kind, br, bc, warps)
        row = bench.run(
            "copy",
            f"triton transpose {kind} {br}x{bc} w{warps}",
            lambda fn=fn: fn(b),
            base=copy_base,
            check=lambda t: torch.equal(t, expect),
        )
        if row["ok"] == "ok" and row["ms_graph"] < best_ms:
            best_t, best_ms = (fn, f"{kind} {br}x{bc} w{warps}"), row["ms_graph"]

    # 4. k_major behind the fastest transpose
    if best_t is not None:
        fn, label = best_t
        call = lambda: splitk.matmul(a, fn(b).t(), kernel="k_major", allow_tf32=True)  # read + write KN first
        bench.run("tf32", f"k_major + transpose {label}", call, ref, TF32_TOL, base)

    # 6. swapped (no copy): RS forms first, then the contrast
    for name, call in direct32.items():
        if name.startswith("swapped") and not bench.over_budget():
            if smoke and "cvt" in name:
                continue  # inline PTX does not run under the interpreter
            bench.run("tf32", name, call, ref, TF32_TOL, base)

    # 5. the k_major config sweep (no copy)
    for name, call in direct32.items():
        if name.startswith("k_major") and not bench.over_budget():
            bench.run("tf32", name, call, ref, TF32_TOL, base)

    # 7. 1536^3 bf16
    if not bench.over_budget():
        ref2 = a2.double() @ b2.double()
        cub2 = bench.run("bf16", "cublas", lambda: a2 @ b2, ref2, BF16_TOL)
        base2 = (cub2["ms_graph"], cub2["ms_plain"])
        calls = {
            "ch03 tiled (autotuned)": lambda: ch03.matmul(a2, b2, kernel="tiled"),
            "ch03 tma_persistent (autotuned)": lambda: ch03.matmul(a2, b2, kernel="tma_persistent"),
            **{
                f"ch04 split_k={s}": (lambda s=s: splitk.matmul(a2, b2, kernel="split_k", split_k=s))
                for s in (2, 3, 4)
            },
            "ch04 stream_k": lambda: splitk.matmul(a2, b2, kernel="stream_k"),
            **direct16,
        }
        if smoke:  # TMA takes 16-bit operands; the smoke shapes are fp32
            del calls["ch03 tma_persistent (autotuned)"]
        for name, call in calls.items():
            if not bench.over_budget():
                bench.run("bf16", name, call, ref2, BF16_TOL, base2)
        for kernel in ("tiled", "tma_persistent"):
            try:
                print(
                    f"  ch03 {kernel} tuned config:", ch03.tuned_config(a2, b2, kernel=kernel)[1], flush=True
                )
            except Exception as exc:
                print(f"  ch03 {kernel} tuned config: {exc}", flush=True)

    bad = [r for r in table.rows if r["ok"] in ("FAIL", "ERROR")]
    print(
        f"done in {time.perf_counter() - bench.start:.0f} s after setup; {len(table.rows)} rows, "
        f"{len(bad)} failed or errored",
        flush=True,
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
