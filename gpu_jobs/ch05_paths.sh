#!/usr/bin/env bash
# Chapter 05's matmul fusions on the H200 (issue 14): the int8 prologue's two paths over M and beside compile,
# the epilogue's rows, and which ch03 tile configs make the bias + GELU epilogue cheapest (each candidate
# config alone, with and without the epilogue: a config that runs two programs per SM can overlap one
# program's epilogue with another's main loop). Writes $OUT/ch05_paths/ch05_fusion_paths.csv. About 2.5 min.
set -u
OUT="${OUT:-/tmp/out}"
dest="$OUT/ch05_paths"
mkdir -p "$dest"
timeout 100 python -m pytest -q -x -p no:cacheprovider tests/test_ch05_fusion.py -k "int8 or dequant or epilogue" \
  > "$dest/tests.log" 2>&1; echo "ch05 matmul-fusion tests rc=$?"; tail -3 "$dest/tests.log"
timeout 200 python - "$dest" <<'PY' 2>&1 | tee "$dest/paths.log"
import sys

import torch
import triton

import labkernels
from labkernels import timing
from labkernels.ch03_triton import matmul as mm
from labkernels.ch05_fusion import bench, epilogue
from labkernels.results import Table, record
from labkernels.roofline import measure_copy_bandwidth

copy = measure_copy_bandwidth()
rows = bench.prologue_rows(16, 4096, 4096, copy) + bench.prologue_rows(4096, 4096, 4096, copy)
rows += bench.epilogue_rows(4096, 4096, 4096, copy)
rows += bench.int8_path_rows()
print(record("ch05_fusion_paths", rows, sys.argv[1], replace=True))
for r in rows:
    print(f"{r['kind']:17s} {r['shape']:15s} {r['impl']:24s} {r['ms'] * 1e3:9.1f} us"
          f"  vs compile {r.get('ratio_vs_compile') or 0:5.2f}  vs eager {r.get('speedup_vs_eager') or 0:5.2f}")

# Epilogue: each candidate tile config alone, 4096^3 bf16, graph replays (host cost out).
def reset():
    mm._launches.clear()
    mm._tuned_launches.clear()
    mm._auto_choices.clear()
    for tuner in (mm._matmul_kernel, mm._matmul_tma_kernel):
        tuner.cache.clear()

def cfg(m, n, k, s, w):
    return triton.Config({"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": 8},
                         num_stages=s, num_warps=w)

a = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda").to(torch.bfloat16)
bias = torch.randn(4096, device="cuda").to(torch.bfloat16)
ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
print("cublas a@b graph us", 1e3 * timing.graph_ms(lambda: a @ b))
print("eager epilogue graph us", 1e3 * timing.graph_ms(lambda: epilogue.eager(a, b, bias)))
tiled0, tma0 = list(mm._matmul_kernel.configs), list(mm._matmul_tma_kernel.configs)
candidates = {
    "tiled": [cfg(128, 256, 64, 3, 8), cfg(128, 128, 64, 4, 8), cfg(128, 128, 64, 3, 8), cfg(128, 128, 64, 2, 8),
              cfg(64, 256, 64, 2, 4), cfg(64, 256, 64, 3, 4), cfg(128, 256, 64, 2, 8), cfg(128, 128, 32, 4, 8)],
    "tma_persistent": [cfg(128, 256, 64, 3, 8), cfg(128, 128, 64, 4, 8), cfg(128, 256, 64, 2, 8)],
}
for kernel, configs in candidates.items():
    tuner = mm._matmul_kernel if kernel == "tiled" else mm._matmul_tma_kernel
    for c in configs:
        tuner.configs = [c]
        reset()
        try:
            out = mm.matmul(a, b, bias=bias, activation="gelu", kernel=kernel)
            err = (out.float() - ref).abs().max().item()
            t_epi = timing.graph_ms(lambda: mm.matmul(a, b, bias=bias, activation="gelu", kernel=kernel))
            t_mm = timing.graph_ms(lambda: mm.matmul(a, b, kernel=kernel))
            print(f"{kernel:15s} {c.kwargs['BLOCK_SIZE_M']}x{c.kwargs['BLOCK_SIZE_N']}x{c.kwargs['BLOCK_SIZE_K']}"
                  f" s{c.num_stages} w{c.num_warps}: gelu {t_epi * 1e3:7.1f} us, plain {t_mm * 1e3:7.1f} us,"
                  f" epilogue +{(t_epi / t_mm - 1) * 100:4.1f}%, max err {err:.3f}")
        except Exception as exc:  # a config that does not fit: say so and go on
            print(f"{kernel:15s} {c}: {type(exc).__name__}: {str(exc)[:120]}")
mm._matmul_kernel.configs, mm._matmul_tma_kernel.configs = tiled0, tma0
reset()
t = timing.graph_ms(lambda: epilogue.matmul_bias_gelu(a, b, bias))
print("shipped configs, auto:", mm.tuned_config(a, b, bias=bias, activation="gelu"), f"{t * 1e3:.1f} us")
PY
