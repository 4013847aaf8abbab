"""Chapter 08 on an H200: check the Gluon kernels against torch, then time them against torch and cuBLAS.

Each step runs in its own process (`gpu_jobs/ch08_hopper.sh`), so a kernel that fails to compile, faults
or hangs costs its own step only. A step appends JSON rows to $ROWS (a scratch folder); `merge` writes
them as CSVs with labkernels.results into $OUT:
- ch08_correctness.csv: each kernel, config and shape: the largest error against an fp32 reference, torch's
  own error beside it, NaNs left from the poisoned output, pass/fail, or the error that stopped it;
- ch08_copy.csv: TMA copy by stage count against torch's copy, alternating rounds (GB/s = read + write);
- ch08_gemm.csv: the warp-specialized GEMM configs against cuBLAS (torch.matmul), alternating rounds.

usage: python gpu_jobs/ch08_hopper.py check-copy | check-gemm CONFIG | bench-copy | bench-gemm | merge
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from pathlib import Path

import torch

import labkernels  # noqa: F401  (picks the lane before triton is imported)
from labkernels import timing
from labkernels.ch08_hopper import copy as ch08_copy
from labkernels.ch08_hopper import gemm as ch08_gemm
from labkernels.results import Table, record

ROWS = Path(os.environ.get("ROWS", "/tmp/ch08_rows"))
OUT = Path(os.environ.get("OUT", "/tmp/out"))
COPY_STAGES = (2, 3, 4, 6)
# the issue's two squares, then chapter 04's shape set (labkernels.ch04_libraries.bench_kernels.MATMUL_SHAPES,
# copied so that this job does not import chapter 04's kernels)
GEMM_SHAPES = [
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (1024, 1024, 1024),
    (4096, 512, 4096),
    (512, 4096, 4096),
    (4096, 4096, 512),
    (3000, 5000, 1000),
    (16, 4096, 4096),
    (4096, 16, 4096),
    (128, 128, 65536),
    (1536, 1536, 1536),
    (2048, 2048, 2048),
    (6144, 6144, 6144),
]


def emit(table: str, **row) -> None:
    ROWS.mkdir(parents=True, exist_ok=True)
    with (ROWS / f"{table}.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(table, row, flush=True)


def read_rows(table: str) -> list[dict]:
    path = ROWS / f"{table}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def short(e: BaseException) -> str:
    """The exception's type, first and last lines (a compile error's message starts with its location)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [""]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{type(e).__name__}: {text}"[:400]


def poison_next(numel: int, dtype: torch.dtype) -> None:
    """Fill a freed block with NaN so that the launcher's torch.empty of the same size gets it back: an
    output element the kernel forgets to write stays NaN. (The caching allocator reuses a freed block of the
    same size on the same stream; `check_poison` confirms it does here.)"""
    torch.full((numel,), float("nan"), dtype=dtype, device="cuda")


def check_poison() -> bool:
    poison_next(1 << 20, torch.bfloat16)
    return bool(torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda").isnan().all())


def check_copy() -> None:
    poisoned = check_poison()
    for dtype in (torch.float32, torch.bfloat16):
        for rows, cols in ((777, 1000), (64, 128), (3, 8), (4096, 3000)):
            for stages in COPY_STAGES:
                name = dict(
                    kernel="tma_copy", config=f"s{stages}", shape=f"{rows}x{cols}", dtype=str(dtype)[6:]
                )
                try:
                    x = torch.randn(rows, cols, device="cuda").to(dtype)
                    poison_next(x.numel(), dtype)
                    out = ch08_copy.tma_copy(x, stages=stages)
                    torch.cuda.synchronize()
                    nans = int(out.isnan().sum())
                    exact = bool(torch.equal(out, x))
                    emit(
                        "correctness",
                        **name,
                        max_abs_err=float((out.float() - x.float()).abs().max()),
                        torch_max_abs_err=0.0,
                        nan_count=nans,
                        poisoned=poisoned,
                        passed=exact,
                        error="",
                    )
                except Exception as e:  # noqa: BLE001  (recorded, and the next case runs)
                    traceback.print_exc()
                    emit(
                        "correctness",
                        **name,
                        max_abs_err="",
                        torch_max_abs_err="",
                        nan_count="",
                        poisoned=poisoned,
                        passed=False,
                        error=short(e),
                    )


def check_gemm(config: str) -> None:
    poisoned = check_poison()
    shapes = [
        (128, 256, 64),
        (1000, 776, 520),
        (3000, 5000, 1000),
        (4096, 4096, 4096),
        (16, 4096, 4096),
        (4096, 16, 4096),
        (300, 200, 8),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in shapes:
            name = dict(kernel="gemm_ws", config=config, shape=f"{m}x{n}x{k}", dtype=str(dtype)[6:])
            try:
                a = torch.randn(m, k, device="cuda").to(dtype)
                b = torch.randn(k, n, device="cuda").to(dtype)
                ref = a.float() @ b.float()
                poison_next(m * n, dtype)
                c = ch08_gemm.gemm(a, b, config=config)
                torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max())
                torch_err = float(((a @ b).float() - ref).abs().max())
                nans = int(c.isnan().sum())
                # flash-attention's rule: our error within twice torch's own, against the same fp32 result
                ok = nans == 0 and err <= 2 * torch_err + 1e-6
                emit(
                    "correctness",
                    **name,
                    max_abs_err=err,
                    torch_max_abs_err=torch_err,
                    nan_count=nans,
                    poisoned=poisoned,
                    passed=ok,
                    error="",
                )
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                emit(
                    "correctness",
                    **name,
                    max_abs_err="",
                    torch_max_abs_err="",
                    nan_count="",
                    poisoned=poisoned,
                    passed=False,
                    error=short(e),
                )
                if "illegal" in str(e).lower() or "launch failure" in str(e).lower():
                    return  # the CUDA context is gone: the rest of this process would only repeat it


def passed(kernel: str, shapes: tuple[str, ...]) -> set[str]:
    """Configs of `kernel` that passed at every one of `shapes`: those are timed (an edge case that fails
    elsewhere stays in the correctness table, and the chapter says so)."""
    rows = [r for r in read_rows("correctness") if r["kernel"] == kernel and r["shape"] in shapes]
    configs = {r["config"] for r in rows}
    return {c for c in configs if all(r["passed"] for r in rows if r["config"] == c)}


def bench_copy() -> None:
    good = passed("tma_copy", ("4096x3000", "777x1000"))
    for dtype, shape in ((torch.float32, (16384, 8192)), (torch.bfloat16, (16384, 16384))):
        x = torch.randn(shape, device="cuda").to(dtype)
        out = torch.empty_like(x)
        nbytes = 2 * x.numel() * x.element_size()  # read n, write n
        calls = {"torch": lambda x=x, out=out: out.copy_(x)}
        for stages in COPY_STAGES:
            if f"s{stages}" in good:
                calls[f"tma_copy_s{stages}"] = lambda x=x, s=stages: ch08_copy.tma_copy(x, stages=s)
        try:
            ms = timing.alternating_ms(calls, rounds=3, warmup=10, rep=40)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit(
                "copy",
                impl="error",
                stages="",
                dtype=str(dtype)[6:],
                shape=f"{shape[0]}x{shape[1]}",
                bytes=nbytes,
                ms="",
                gbps="",
                fraction_of_torch="",
                error=short(e),
            )
            continue
        for impl, t in ms.items():
            emit(
                "copy",
                impl=impl,
                stages=impl.rsplit("_s", 1)[1] if "_s" in impl else "",
                dtype=str(dtype)[6:],
                shape=f"{shape[0]}x{shape[1]}",
                bytes=nbytes,
                ms=t,
                gbps=nbytes / t / 1e6,
                fraction_of_torch=ms["torch"] / t,
                error="",
            )


def bench_gemm() -> None:
    good = sorted(passed("gemm_ws", ("4096x4096x4096", "1000x776x520")))
    for m, n, k in GEMM_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        calls = {"cublas": lambda a=a, b=b: a @ b}
        for config in good:
            try:
                ch08_gemm.gemm(a, b, config=config)  # compiles outside the timed region; refuses a bad shape
                calls[config] = lambda a=a, b=b, c=config: ch08_gemm.gemm(a, b, config=c)
            except Exception as e:  # noqa: BLE001
                emit("gemm", m=m, n=n, k=k, impl=config, ms="", tflops="", ratio_vs_cublas="", error=short(e))
        ms = timing.alternating_ms(calls, rounds=3, warmup=10, rep=40)
        for impl, t in ms.items():
            emit(
                "gemm",
                m=m,
                n=n,
                k=k,
                impl=impl,
                ms=t,
                tflops=2 * m * n * k / t / 1e9,
                ratio_vs_cublas=ms["cublas"] / t,
                error="",
            )
    ratios = {}
    for r in read_rows("gemm"):
        if r["impl"] != "cublas" and r["ratio_vs_cublas"] != "":
            ratios.setdefault(r["impl"], []).append(r["ratio_vs_cublas"])
    for impl, rs in ratios.items():
        mean = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{impl}: geometric mean vs cuBLAS {mean:.3f} over {len(rs)} shapes")


def merge() -> None:
    for table, name in (("correctness", "ch08_correctness"), ("copy", "ch08_copy"), ("gemm", "ch08_gemm")):
        rows = read_rows(table)
        if rows:
            print(Table(rows))
            print("wrote", record(name, rows, OUT, replace=True))
        else:
            print(f"no rows for {table}")


if __name__ == "__main__":
    step = sys.argv[1]
    if step == "check-gemm":
        check_gemm(sys.argv[2])
    else:
        {"check-copy": check_copy, "bench-copy": bench_copy, "bench-gemm": bench_gemm, "merge": merge}[step]()
