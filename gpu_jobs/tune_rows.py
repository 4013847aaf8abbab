"""Times every candidate configuration of two row-reduction kernels on the GPU, against a copy of the same
bytes: ch06's online softmax (the tuner's candidates plus the variants under evaluation) and ch05's RMSNorm +
residual (its candidates, torch.compile of the reference, eager). Each candidate is checked against an fp32
reference first (poisoned output); a wrong one is reported and not timed.

Writes $OUT/tune_rows/softmax.csv and $OUT/tune_rows/rmsnorm.csv and prints a table per shape. The run stops
starting new candidates after TUNE_BUDGET_S seconds (default 215) and says which were skipped.
"""

from __future__ import annotations

import csv
import os
import sys
import time

import torch

from labkernels import timing, traffic  # before triton: labkernels picks the lane first
from labkernels.ch05_fusion import rmsnorm
from labkernels.ch06_attention import online_softmax as osm
from labkernels.lane import DEVICE, on_gpu

START = time.monotonic()
BUDGET_S = float(os.environ.get("TUNE_BUDGET_S", "215"))
OUT = os.path.join(os.environ.get("OUT", "/tmp/out"), "tune_rows")
# Most lagging first, so a run cut short by the budget still answers the open questions.
SOFTMAX_SHAPES = [
    (1024, 262144, torch.bfloat16),
    (4096, 32768, torch.bfloat16),
    (1024, 262144, torch.float32),
    (4096, 32768, torch.float32),
]
SOFTMAX_LAST = [(8192, 5000, torch.bfloat16), (8192, 5000, torch.float32)]  # already at 0.96-0.97
RMSNORM_SHAPES = [(16384, 4096, torch.bfloat16), (16384, 4096, torch.float32)]
SOFTMAX_TOL = {torch.float32: (1e-6, 1e-4), torch.bfloat16: (1e-5, 1.6e-2)}  # (atol, rtol) vs fp32
RMSNORM_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (6e-2, 3e-2)}


def elapsed() -> float:
    return time.monotonic() - START


def bench_ms(fn) -> float:
    return timing.time_ms(fn, warmup=10, rep=50)  # do_bench's median on the GPU


def name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check(got, ref, tol) -> str:
    """'' if got matches ref within tol, else the reason."""
    if torch.isnan(got).any():
        return "NaN in output"
    try:
        torch.testing.assert_close(got.float(), ref, atol=tol[0], rtol=tol[1])
    except AssertionError as e:
        return " ".join(str(e).split())[:120]
    return ""


def softmax_rows(n_rows, n_cols, dtype) -> list[dict]:
    x = torch.randn(n_rows, n_cols, device=DEVICE).to(dtype)
    out = torch.empty_like(x)
    ref = torch.softmax(x.float(), dim=1)
    nbytes = traffic.softmax(n_rows, n_cols, dtype).bytes
    copy_ms = bench_ms(lambda: out.copy_(x))
    params = {"rows": n_rows, "cols": n_cols, "dtype": name(dtype)}
    baseline = set(osm._candidates(n_cols))
    rows = [{**params, "mode": "copy", "ms": copy_ms, "fraction_of_copy": 1.0}]
    for block, warps, mode in osm._candidates(n_cols, extra=True):
        row = {
            **params,
            "block": block,
            "warps": warps,
            "mode": mode,
            "baseline": (block, warps, mode) in baseline,
        }
        if elapsed() > BUDGET_S:
            rows.append({**row, "error": "skipped: time budget"})
            continue
        try:
            out.fill_(float("nan"))
            osm._launch(x, out, block, warps, mode)  # compiles
            if on_gpu():
                torch.cuda.synchronize()
            error = check(out, ref, SOFTMAX_TOL[dtype])
            if not error:
                ms = bench_ms(lambda b=block, w=warps, m=mode: osm._launch(x, out, b, w, m))
                error = check(out, ref, SOFTMAX_TOL[dtype])  # the split modes again, after many runs
                row |= {"ms": ms, "gbps": nbytes / ms / 1e6, "fraction_of_copy": copy_ms / ms}
        except Exception as e:  # a config that does not compile or launch here: report it, go on
            error = f"{type(e).__name__}: {' '.join(str(e).split())[:100]}"
        rows.append({**row, "error": error})
    return rows


def rmsnorm_rows(n_rows, n_cols, dtype) -> list[dict]:
    x, r = (torch.randn(n_rows, n_cols, device=DEVICE).to(dtype) for _ in range(2))
    w = torch.randn(n_cols, device=DEVICE).to(dtype)
    y_ref, h_ref = rmsnorm.reference(x.float(), r.float(), w.float())
    nbytes = traffic.rmsnorm_residual(n_rows, n_cols, dtype).bytes
    n = nbytes // 8  # the bench's ceiling: an fp32 copy of as many bytes (read n, write n)
    src, dst = torch.empty(n, device=DEVICE), torch.empty(n, device=DEVICE)
    copy_ms = bench_ms(lambda: dst.copy_(src))
    params = {"rows": n_rows, "cols": n_cols, "dtype": name(dtype)}
    torch._dynamo.reset()
    compiled = torch.compile(rmsnorm.reference)
    impls = {"eager": lambda: rmsnorm.reference(x, r, w), "compile": lambda: compiled(x, r, w)}
    default = rmsnorm.launch_config(n_rows, n_cols)
    impls |= {c: (lambda c=c: rmsnorm._forward(x, r, w, 1e-6, c)) for c in rmsnorm.candidates(n_rows, n_cols)}
    rows = [{**params, "impl": "copy", "ms": copy_ms, "fraction_of_copy": 1.0}]
    for impl, fn in impls.items():
        row = {**params, "impl": impl if isinstance(impl, str) else "labkernels"}
        if not isinstance(impl, str):
            row |= {"block_m": impl[0], "warps": impl[1], "evict": impl[2]}
            row["default"] = (impl[0], impl[1], impl[2]) == (default[0], default[2], True)
        if elapsed() > BUDGET_S:
            rows.append({**row, "error": "skipped: time budget"})
            continue
        try:
            y, h = fn()  # compiles
            error = check(h, h_ref.to(dtype).float(), RMSNORM_TOL[dtype]) or check(
                y, y_ref, RMSNORM_TOL[dtype]
            )
            if not error:
                ms = bench_ms(fn)
                row |= {"ms": ms, "gbps": nbytes / ms / 1e6, "fraction_of_copy": copy_ms / ms}
        except Exception as e:
            error = f"{type(e).__name__}: {' '.join(str(e).split())[:100]}"
        rows.append({**row, "error": error})
    compile_ms = next((r.get("ms") for r in rows if r["impl"] == "compile"), None)
    for row in rows:
        if compile_ms and row.get("ms"):
            row["ratio_vs_compile"] = compile_ms / row["ms"]
    return rows


def write(path, rows) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def show(rows, label_keys) -> None:
    done = sorted((r for r in rows if r.get("ms")), key=lambda r: r["ms"])
    for r in done:
        label = " ".join(f"{r[k]}" for k in label_keys if k in r)
        extra = f" vs_compile {r['ratio_vs_compile']:.3f}" if "ratio_vs_compile" in r else ""
        flag = " *" if r.get("baseline") or r.get("default") else ""
        print(f"    {label:<34} {r['ms']:8.4f} ms  {r['fraction_of_copy']:6.3f} of copy{extra}{flag}")
    for r in rows:
        if r.get("error"):
            print(f"    {' '.join(str(r.get(k, '')) for k in label_keys):<34} FAILED/SKIPPED: {r['error']}")


def main() -> int:
    import triton

    os.makedirs(OUT, exist_ok=True)
    device = torch.cuda.get_device_name() if on_gpu() else "CPU lane (a dry run: no GPU timings)"
    print(f"{device}  torch {torch.__version__}  triton {triton.__version__}")
    softmax, norm = [], []
    plan = [("softmax", s) for s in SOFTMAX_SHAPES] + [("rmsnorm", s) for s in RMSNORM_SHAPES]
    plan += [("softmax", s) for s in SOFTMAX_LAST]
    for kind, (m, n, dtype) in plan:
        t0 = elapsed()
        if kind == "softmax":
            rows = softmax_rows(m, n, dtype)
            softmax += rows
            print(f"\nonline softmax {m}x{n} {name(dtype)} ({elapsed() - t0:.0f} s; * = tuner's candidate)")
            show(rows, ("mode", "block", "warps"))
        else:
            rows = rmsnorm_rows(m, n, dtype)
            norm += rows
            print(f"\nrmsnorm+residual {m}x{n} {name(dtype)} ({elapsed() - t0:.0f} s; * = the default)")
            show(rows, ("impl", "block_m", "warps", "evict"))
        write(os.path.join(OUT, "softmax.csv"), softmax)
        write(os.path.join(OUT, "rmsnorm.csv"), norm)
        if on_gpu():
            torch.cuda.empty_cache()
    print(f"\ntotal {elapsed():.0f} s; CSVs in {OUT}")
    failed = [r for r in softmax + norm if r.get("error") and not r["error"].startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
