"""Weight-only int8 at decode (M = 1 and 16, bf16): chapter 05's GEMV/split-K kernel beside cuBLAS on bf16
weights and the prologue-fused matmul kernel, and cuBLASLt's fused bias + GELU epilogue beside chapter 05's.

Rows (labkernels/reference/ch05_int8_gemv.csv, read by notebook 05 sections 6 and 7):
- kind "int8": at K x N = 4096 x 4096 and 4096 x 14336, M in {1, 16}: cuBLAS on bf16 weights (`a @ w16`, with
  W stored (K, N) and K-major), `int8_gemv` on K-major int8 weights (`quantize(w, k_major=True)`: its tuned
  config, its design's int8 conversion), the same by integer adds (`magic=True`) and by the plain cast
  (`magic=False`), `int8_gemv` on (K, N) weights (the "cols" design) and `int8_matmul(path="fused")`. Each output poisoned by a fresh
  allocation, checked against fp64 (fresh inputs); timed as CUDA-graph replays of one weight matrix
  (`us_graph`: it can stay in the 50 MB L2 between replays), replays that rotate through copies of the
  weights past 120 MB (`us_graph_hbm`: every replay reads from HBM, as a model's next layer does), and plain
  calls (host in). `vs_cublas_*`: the faster cuBLAS layout's time over the row's, timed the same way.
- kind "epilogue": gelu(a @ b + bias) at 4096^3 bf16: eager (cuBLAS, then two passes), cuBLAS without the
  epilogue, `torch._addmm_activation(bias, a, b, use_gelu=True)` (cuBLASLt's GELU epilogue: the tanh form),
  and `epilogue.matmul_bias_gelu` (erf form).

    python gpu_jobs/int8_gemv.py --out DIR     # GPU: table on stdout, DIR/ch05_int8_gemv.csv
    python gpu_jobs/int8_gemv.py --smoke       # CPU lane: the checks at small fp16 shapes, no timing
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse
import math
import sys
import time

import labkernels
import torch

from labkernels import timing
from labkernels.ch05_fusion import epilogue, prologue
from labkernels.lane import on_gpu
from labkernels.results import record

SHAPES = ((4096, 4096), (4096, 14336))  # (K, N)
MS = (1, 16)
TOL = 2e-2  # relative max error against fp64: bf16 outputs, fp32 sums


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def timed(row: dict, fn, timed_: bool, base: dict | None) -> dict:
    if timed_:
        row["us_graph"] = 1e3 * timing.graph_ms(fn)
        row["us_plain"] = 1e3 * timing.time_ms(fn)
        if base is not None:
            row["vs_cublas_graph"] = base["us_graph"] / row["us_graph"]
            row["vs_cublas_plain"] = base["us_plain"] / row["us_plain"]
    return row


def copies_for(nbytes: int) -> int:
    """How many copies of the weights pass 120 MB: rotating through them, every replay reads from HBM."""
    return max(2, math.ceil(120e6 / nbytes))


def int8_impls(a, w):
    """name -> call for one set of weights w = (w16 (K, N), w16 K-major, w_int8 K-major, w_int8 (K, N), scale)."""
    w16, w16_t, w_k, w_n, scale = w
    return {
        "cublas bf16 weights": lambda: a @ w16,
        "cublas bf16 weights, K-major": lambda: a @ w16_t,
        "int8_gemv": lambda: prologue.int8_gemv(a, w_k, scale),
        "int8_gemv integer add": lambda: prologue.int8_gemv(a, w_k, scale, magic=True),
        "int8_gemv plain cast": lambda: prologue.int8_gemv(a, w_k, scale, magic=False),
        "int8_gemv N-contiguous": lambda: prologue.int8_gemv(a, w_n, scale),
        "int8_matmul fused": lambda: prologue.int8_matmul(a, w_n, scale, path="fused"),
    }


# The GEMV rows: which of a weight set's tensors each one reads (K-major int8, or (K, N) int8).
GEMV_WEIGHTS = {"int8_gemv": 2, "int8_gemv integer add": 2, "int8_gemv plain cast": 2,
                "int8_gemv N-contiguous": 3}  # fmt: skip


def weights(k: int, n: int, dtype, device):
    w_n, scale = prologue.quantize(torch.randn(k, n, device=device).to(dtype))
    w16 = prologue.dequantize(w_n, scale)
    return w16, w16.t().contiguous().t(), w_n.t().contiguous().t(), w_n, scale


def int8_rows(m: int, k: int, n: int, dtype, device, timed_: bool) -> list[dict]:
    a = torch.randn(m, k, device=device).to(dtype)
    sets = [weights(k, n, dtype, device) for _ in range(copies_for(k * n) if timed_ else 1)]
    ref = prologue.reference(a, sets[0][3], sets[0][4])
    if timed_:
        w_k = sets[0][2]
        for cfg in prologue.GEMV_GPU_CONFIGS[prologue.gemv_design(a, w_k)]:
            t = timing.graph_ms(lambda cfg=cfg: prologue.int8_gemv(a, w_k, sets[0][4], config=cfg))
            print(f"  tuner candidate {cfg}: {t * 1e3:.2f} us (graph)", flush=True)
    per_set = [int8_impls(a, w) for w in sets]
    rows = []
    for impl, fn in per_set[0].items():
        design = prologue.gemv_design(a, sets[0][GEMV_WEIGHTS[impl]]) if impl in GEMV_WEIGHTS else ""
        row = {"kind": "int8", "shape": f"{m}x{n}x{k}", "dtype": str(dtype)[6:], "M": m, "impl": impl,
               "design": design}  # fmt: skip
        out = fn()
        err = rel_err(out, ref)
        row |= {"err": err, "ok": "ok" if err <= TOL else "FAIL"}
        if timed_:
            row["us_graph"] = 1e3 * timing.graph_ms(fn)
            every_copy = timing.rotating([calls[impl] for calls in per_set])  # each replay reads HBM
            row["us_graph_hbm"] = 1e3 * timing.graph_ms(every_copy)
            row["us_plain"] = 1e3 * timing.time_ms(fn)
            weight_bytes = 2 * k * n if impl.startswith("cublas") else k * n
            row["weight_gbps_graph"] = weight_bytes / (row["us_graph"] * 1e3)
            row["weight_gbps_hbm"] = weight_bytes / (row["us_graph_hbm"] * 1e3)
        rows.append(row)
    if timed_:  # against the faster of cuBLAS's two layouts, timed the same way
        for mode in ("graph", "graph_hbm", "plain"):
            best = min(r[f"us_{mode}"] for r in rows if r["impl"].startswith("cublas"))
            for r in rows:
                r[f"vs_cublas_{mode}"] = best / r[f"us_{mode}"]
    for row in rows:
        print("  ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in row.items()), flush=True)
    return rows


def epilogue_rows(size: int, dtype, device, timed_: bool) -> list[dict]:
    a, b = (torch.randn(size, size, device=device).to(dtype) for _ in range(2))
    bias = torch.randn(size, device=device).to(dtype)
    exact = epilogue.reference(a, b, bias)
    tanh_form = torch.nn.functional.gelu(a.double() @ b.double() + bias.double(), approximate="tanh")
    impls = {
        "eager": (lambda: epilogue.eager(a, b, bias), exact),
        "cublas, no epilogue": (lambda: a @ b, a.double() @ b.double()),
        "cublasLt _addmm_activation gelu": (
            lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
            tanh_form,
        ),
        "labkernels matmul_bias_gelu": (lambda: epilogue.matmul_bias_gelu(a, b, bias), exact),
    }
    rows, base = [], None
    for impl, (fn, ref) in impls.items():
        row = {"kind": "epilogue", "shape": f"{size}x{size}x{size}", "dtype": str(dtype)[6:], "M": size,
               "impl": impl, "config": ""}  # fmt: skip
        err = rel_err(fn(), ref)
        row |= {"err": err, "ok": "ok" if err <= TOL else "FAIL"}
        row = timed(row, fn, timed_, base)
        base = base or row
        rows.append(row)
        print(
            "  ".join(f"{c}={v:.4g}" if isinstance(v, float) else f"{c}={v}" for c, v in row.items()),
            flush=True,
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    start = time.perf_counter()
    rows = []
    if args.smoke:  # the interpreter: fp16 (bf16 is wrong there), small odd shapes, no timing
        for m in MS:
            rows += int8_rows(m, 200, 72, torch.float16, "cpu", timed_=False)
    else:
        if not on_gpu():
            raise SystemExit("int8_gemv.py: needs a GPU (or --smoke)")
        for k, n in SHAPES:
            for m in MS:
                rows += int8_rows(m, k, n, torch.bfloat16, labkernels.DEVICE, timed_=True)
                if args.out:  # after each case: a hard stop keeps the rows done
                    record("ch05_int8_gemv", rows, args.out, replace=True)
        rows += epilogue_rows(4096, torch.bfloat16, labkernels.DEVICE, timed_=True)
    if args.out:
        print(record("ch05_int8_gemv", rows, args.out, replace=True))
    bad = [r for r in rows if r["ok"] != "ok"]
    print(f"{len(rows)} rows, {len(bad)} failed, {time.perf_counter() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
