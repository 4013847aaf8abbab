"""Chapter 08 on an H200: check the Gluon kernels against torch, then time them against torch and cuBLAS.

Each step runs in its own process (`gpu_jobs/ch08_hopper.sh`), so a kernel that fails to compile, faults
or hangs costs its own step only. A step appends JSON rows to $ROWS (a scratch folder); `merge` writes
them as CSVs with labkernels.results into $OUT:
- ch08_correctness.csv: each kernel, config and shape: the largest error against an fp32 reference, torch's
  own error beside it, NaNs left from the poisoned output, pass/fail, or the error that stopped it;
- ch08_copy.csv: TMA copy by stage count against torch's copy, alternating rounds (GB/s = read + write);
- ch08_gemm.csv: the warp-specialized GEMM configs against cuBLAS (torch.matmul), alternating rounds;
- ch08_attention.csv: the FA3-style forward against cuDNN's SDPA and chapter 06's flash_attention;
- ch08_timeline.csv: program 0 of the GEMM at 4096^3, its clock at every wait, issue, release and epilogue;
- ch08_attention_timeline.csv: program (0, 0) of the attention forward, B4 H16 S4096 D128, full and causal;
- ch08_fp8.csv: the FP8 (e4m3) GEMM against torch._scaled_mm (default, and use_fast_accum),
  at 4096^3 and 8192^3, alternating rounds, with each one's largest error against fp64.

usage: python gpu_jobs/ch08_hopper.py check-copy | check-gemm CONFIG | check-attention | bench-copy |
       bench-gemm | bench-attention | timeline | attention-timeline | check-fp8 | bench-fp8 | merge
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import labkernels  # noqa: F401  (picks the lane before triton is imported)
from labkernels import timing
from labkernels.ch08_hopper import attention as ch08_attention
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


def emit_check(name: dict, poisoned: bool, *, err: float, torch_err: float, nans: int, ok: bool,
               error: str = "") -> None:  # fmt: skip
    """One correctness row: our largest error, torch's against the same reference, and the verdict."""
    emit("correctness", **name, max_abs_err=err, torch_max_abs_err=torch_err, nan_count=nans,
         poisoned=poisoned, passed=ok, error=error)  # fmt: skip


def emit_failure(name: dict, poisoned: bool, e: Exception) -> bool:
    """A case that raised, recorded as failed. True when the CUDA context is gone (an illegal access or a
    launch failure): the rest of the process would only repeat it, so the caller stops."""
    traceback.print_exc()
    emit("correctness", **name, max_abs_err="", torch_max_abs_err="", nan_count="", poisoned=poisoned,
         passed=False, error=short(e))  # fmt: skip
    return "illegal" in str(e).lower() or "launch failure" in str(e).lower()


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
                    err = float((out.float() - x.float()).abs().max())
                    emit_check(name, poisoned, err=err, torch_err=0.0, nans=nans, ok=exact)
                except Exception as e:  # noqa: BLE001  (recorded; the next case runs unless the context is gone)
                    if emit_failure(name, poisoned, e):
                        return


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
                emit_check(name, poisoned, err=err, torch_err=torch_err, nans=nans, ok=ok)
            except Exception as e:  # noqa: BLE001
                if emit_failure(name, poisoned, e):
                    return  # the CUDA context is gone: the rest of this process would only repeat it


ATTENTION_CHECKS = [(1, 2, 128, 64), (2, 3, 384, 128), (1, 1, 1024, 128), (2, 4, 256, 64), (1, 2, 2048, 128)]
# (B, H, S, D, causal): the three targets
ATTENTION_BENCH = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (1, 16, 16384, 128, False)]


# (causal, overlap, stages): the plain design, the overlapped one, and the overlapped one with a third K/V
# stage (O through Q's buffer)
ATTENTION_DESIGNS = [(c, o, s) for c in (False, True) for o, s in ((False, 2), (True, 2), (True, 3))]
ATTENTION_IMPLS = {(False, 2): "ch08_attention", (True, 2): "ch08_attention_overlap",
                   (True, 3): "ch08_attention_overlap_3stages"}  # fmt: skip


def _attention_config(causal: bool, overlap: bool, stages: int) -> str:
    mask = "causal" if causal else "full"
    return mask + ("+overlap" if overlap else "") + ("+3stages" if stages == 3 else "")


def _attention_reference(q, k, v, causal):
    """fp32 O and logsumexp (natural log) of the same attention."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = q.float() @ k.float().transpose(-1, -2) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.float(), torch.logsumexp(s, dim=-1)


def check_attention() -> None:
    import torch.nn.functional as F

    poisoned = check_poison()
    for dtype in (torch.bfloat16, torch.float16):
        for batch, heads, seq_len, head_dim in ATTENTION_CHECKS:
            for causal, overlap, stages in ATTENTION_DESIGNS:
                shape = f"{batch}x{heads}x{seq_len}x{head_dim}"
                config = _attention_config(causal, overlap, stages)
                name = dict(kernel="attention_fwd", config=config, shape=shape, dtype=str(dtype)[6:])
                try:
                    q, k, v = (
                        torch.randn(batch, heads, seq_len, head_dim, device="cuda").to(dtype) for _ in "qkv"
                    )
                    ref, ref_lse = _attention_reference(q, k, v, causal)
                    poison_next(q.numel(), dtype)
                    o, lse = ch08_attention.attention_forward(
                        q, k, v, causal=causal, overlap=overlap, stages=stages
                    )
                    torch.cuda.synchronize()
                    err = float((o.float() - ref).abs().max())
                    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch_err = float((theirs.float() - ref).abs().max())
                    lse_err = float((lse - ref_lse).abs().max())
                    nans = int(o.isnan().sum()) + int(lse.isnan().sum())
                    ok = nans == 0 and err <= 2 * torch_err + 1e-6 and lse_err <= 1e-3
                    emit_check(name, poisoned, err=err, torch_err=torch_err, nans=nans, ok=ok,
                               error="" if lse_err <= 1e-3 else f"lse err {lse_err:.2e}")  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    if emit_failure(name, poisoned, e):
                        return


def bench_attention() -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from labkernels.ch06_attention.flash_attention import flash_attention

    def cudnn(q, k, v, causal):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    good = {r["config"] for r in read_rows("correctness") if r["kernel"] == "attention_fwd"}
    bad = {
        r["config"] for r in read_rows("correctness") if r["kernel"] == "attention_fwd" and not r["passed"]
    }
    for batch, heads, seq_len, head_dim, causal in ATTENTION_BENCH:
        q, k, v = (
            torch.randn(batch, heads, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in "qkv"
        )
        calls = {
            "sdpa_cudnn": lambda q=q, k=k, v=v, c=causal: cudnn(q, k, v, c),
            "ch06_flash_attention": lambda q=q, k=k, v=v, c=causal: flash_attention(q, k, v, causal=c),
        }
        for (overlap, stages), impl in ATTENTION_IMPLS.items():
            if _attention_config(causal, overlap, stages) in good - bad:
                calls[impl] = lambda q=q, k=k, v=v, c=causal, o=overlap, s=stages: (
                    ch08_attention.attention_forward(q, k, v, causal=c, overlap=o, stages=s)
                )
        for fn in calls.values():
            fn()  # compiles and tunes outside the timed region
        flops = 4 * batch * heads * seq_len * seq_len * head_dim / (2 if causal else 1)
        ms = timing.alternating_ms(calls, rounds=3, warmup=10, rep=40)
        graph = {impl: timing.graph_ms(fn, rep=40) for impl, fn in calls.items()}  # the host taken out
        for impl, t in ms.items():
            emit("attention", batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, causal=causal,
                 impl=impl, ms=t, tflops=flops / t / 1e9, ratio_vs_cudnn=ms["sdpa_cudnn"] / t,
                 ratio_vs_ch06=ms["ch06_flash_attention"] / t, ms_graph=graph[impl],
                 graph_ratio_vs_cudnn=graph["sdpa_cudnn"] / graph[impl], error="")  # fmt: skip


def _fp8_operands(m, n, k):
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b_t = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    return a, b_t, torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")


def _scaled_mm(a, b_t, scale_a, scale_b, fast_accum=False):
    """torch._scaled_mm, which takes only multiples of 16: others are padded with zeros (which add nothing
    to any product) and the result cut back."""
    (m, k), n = a.shape, b_t.shape[0]
    if m % 16 or n % 16 or k % 16:
        pad = lambda t, rows: F.pad(t.view(torch.uint8), (0, -k % 16, 0, -rows % 16)).view(t.dtype)  # noqa: E731
        return _scaled_mm(pad(a, m), pad(b_t, n), scale_a, scale_b, fast_accum)[:m, :n]
    return torch._scaled_mm(a, b_t.T, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
                            use_fast_accum=fast_accum)  # fmt: skip


def check_fp8() -> None:
    poisoned = check_poison()
    for m, n, k in [(1000, 776, 512), (128, 256, 128), (17, 8, 16), (4096, 4096, 4096), (3000, 5000, 1024)]:
        name = dict(
            kernel="gemm_fp8", config=ch08_gemm.FP8_DEFAULT, shape=f"{m}x{n}x{k}", dtype="float8_e4m3fn"
        )
        try:
            a, b_t, sa, sb = _fp8_operands(m, n, k)
            ref = (a.float() @ b_t.float().T) * 0.125
            poison_next(m * n, torch.bfloat16)
            c = ch08_gemm.gemm_fp8(a, b_t, sa, sb)
            torch.cuda.synchronize()
            err = float((c.float() - ref).abs().max())
            # the looser of torch's two accumulations: ours keeps the FP8 accumulator for all of K, as
            # use_fast_accum=True does (at 4096^3 on the H200 its error was about twice the default's)
            torch_err = max(
                float((_scaled_mm(a, b_t, sa, sb, fast).float() - ref).abs().max()) for fast in (False, True)
            )
            nans = int(c.isnan().sum())
            emit_check(name, poisoned, err=err, torch_err=torch_err, nans=nans,
                       ok=nans == 0 and err <= 2 * torch_err + 1e-6)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            if emit_failure(name, poisoned, e):
                return


def bench_fp8() -> None:
    good = passed("gemm_fp8", ("4096x4096x4096", "1000x776x512"))
    for m, n, k in [(4096, 4096, 4096), (8192, 8192, 8192)]:
        a, b_t, sa, sb = _fp8_operands(m, n, k)
        # torch's default promotes the FP8 accumulator's partial sums to fp32 every so often; use_fast_accum
        # keeps them in it for all of K, as our wgmma loop does: faster, and less exact at large K
        calls = {
            "torch_scaled_mm": lambda a=a, b_t=b_t, sa=sa, sb=sb: _scaled_mm(a, b_t, sa, sb),
            "torch_scaled_mm_fast_accum": lambda a=a, b_t=b_t, sa=sa, sb=sb: _scaled_mm(a, b_t, sa, sb, True),
        }
        if ch08_gemm.FP8_DEFAULT in good:
            calls["gemm_fp8"] = lambda a=a, b_t=b_t, sa=sa, sb=sb: ch08_gemm.gemm_fp8(a, b_t, sa, sb)
        exact = (a.double() @ b_t.double().T) * 0.125
        errs = {impl: float((fn().double() - exact).abs().max()) for impl, fn in calls.items()}
        del exact
        ms = timing.alternating_ms(calls, rounds=3, warmup=10, rep=40)
        # graph replays take the host out: a Python launch that builds three descriptors can outlast 0.1 ms
        graph = {impl: timing.graph_ms(fn, rep=40) for impl, fn in calls.items()}
        for impl, t in ms.items():
            emit("fp8", m=m, n=n, k=k, impl=impl, ms=t, tflops=2 * m * n * k / t / 1e9,
                 ratio_vs_scaled_mm=ms["torch_scaled_mm"] / t,
                 ratio_vs_fast_accum=ms["torch_scaled_mm_fast_accum"] / t, max_abs_err=errs[impl],
                 ms_graph=graph[impl],
                 graph_ratio_vs_fast_accum=graph["torch_scaled_mm_fast_accum"] / graph[impl],
                 error="")  # fmt: skip


def timeline() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ch08_gemm.gemm(a, b)  # compiles the plain kernel; the timeline's own compile follows
    ch08_gemm.gemm_timeline(a, b)
    for r in ch08_gemm.gemm_timeline(a, b):  # the second run: nothing left to compile or load
        emit("timeline", config=ch08_gemm.DEFAULT_CONFIG, shape="4096x4096x4096", **r)


def attention_timeline() -> None:
    """Program (0, 0) of the overlapped forward at the issue's B4 H16 S4096 D128, full and causal."""
    for causal in (False, True):
        q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
        ch08_attention.attention_timeline(q, k, v, causal=causal)  # compiles; the second run is recorded
        for r in ch08_attention.attention_timeline(q, k, v, causal=causal):
            emit("attention_timeline", shape="4x16x4096x128", causal=causal, **r)


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
                emit("gemm", m=m, n=n, k=k, impl=config, ms="", tflops="", ratio_vs_cublas="", ms_graph="",
                     graph_ratio_vs_cublas="", error=short(e))  # fmt: skip
        ms = timing.alternating_ms(calls, rounds=3, warmup=10, rep=40)
        # graph replays take the host out: at the small shapes a Python launch outlasts the kernel
        graph = {impl: timing.graph_ms(fn, rep=40) for impl, fn in calls.items()}
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
                ms_graph=graph[impl],
                graph_ratio_vs_cublas=graph["cublas"] / graph[impl],
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
    tables = [("correctness", "ch08_correctness"), ("copy", "ch08_copy"), ("gemm", "ch08_gemm")]
    tables += [("attention", "ch08_attention"), ("timeline", "ch08_timeline"), ("fp8", "ch08_fp8")]
    tables += [("attention_timeline", "ch08_attention_timeline")]
    for table, name in tables:
        rows = read_rows(table)
        if rows:
            print(Table(rows))
            print("wrote", record(name, rows, OUT, replace=True))
        else:
            print(f"no rows for {table}")


STEPS = {
    "check-copy": check_copy,
    "check-gemm": lambda: check_gemm(sys.argv[2]),  # the config to check: check-gemm CONFIG
    "check-attention": check_attention,
    "bench-copy": bench_copy,
    "bench-gemm": bench_gemm,
    "bench-attention": bench_attention,
    "timeline": timeline,
    "attention-timeline": attention_timeline,
    "check-fp8": check_fp8,
    "bench-fp8": bench_fp8,
    "merge": merge,
}

if __name__ == "__main__":
    STEPS[sys.argv[1]]()
