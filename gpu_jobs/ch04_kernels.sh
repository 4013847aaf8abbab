#!/usr/bin/env bash
# Chapter 04 kernels on the H200: GPU tests of tests/test_ch04_kernels.py, then the ch04_matmul and ch04_conv
# benchmarks; CSVs to $OUT/ch04_kernels/ and a summary. Every step runs even if one before it failed.
# Budget: under 265 s (timeout 260 overall; the steps have their own, shorter limits).
set -u
if [ -z "${CH04_INNER:-}" ]; then CH04_INNER=1 exec timeout 260 bash "$0" "$@"; fi
OUT="${OUT:-/tmp/out}"
DEST="$OUT/ch04_kernels"
mkdir -p "$DEST"
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
failed=()
start=$(date +%s)

step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s, at $(( $(date +%s) - start ))s)"
  if ! timeout "$limit" "$@"; then failed+=("$name"); echo "!! $name failed or timed out"; fi
}

step "gpu tests" 130 $PY -m pytest -q -x -p no:cacheprovider -m gpu tests/test_ch04_kernels.py > "$DEST/pytest.log" 2>&1
tail -15 "$DEST/pytest.log"
# The benchmarks record after every shape, so a step cut short by its limit still leaves its CSV.
step "bench ch04_matmul" 85 $PY -c "
from labkernels.ch04_libraries import bench_kernels as b
from labkernels.results import record
rows = []
for shape in b.MATMUL_SHAPES:
    rows += (new := b.matmul_rows(*shape)); b._print_matmul(new); record('ch04_matmul', rows, '$DEST')
rows += (new := b.tf32_rows()); b._print_matmul(new); record('ch04_matmul', rows, '$DEST')
"
step "bench ch04_conv" 35 $PY -c "
from labkernels.ch04_libraries import bench_kernels as b
from labkernels.results import record
rows = []
for shape in b.CONV_SHAPES:
    rows += b.conv_rows(*shape); record('ch04_conv', rows, '$DEST')
    print('  conv', shape, 'done', flush=True)
"

echo "== summary (at $(( $(date +%s) - start ))s)"
$PY - "$DEST" <<'PYEOF' || failed+=("summary")
import sys
from pathlib import Path
from labkernels.ch04_libraries import bench_kernels
from labkernels.results import load
d = Path(sys.argv[1])
if (d / "ch04_matmul.csv").exists():
    t = load(d / "ch04_matmul.csv")
    print(bench_kernels.vs_cublas_summary(t))
    for r in t.where(impl="labkernels", mode="graph").rows:
        plain = t.where(impl="labkernels", mode="plain", m=r["m"], n=r["n"], k=r["k"], dtype=r["dtype"]).rows[0]
        print(f"  {r['m']}x{r['n']}x{r['k']} {r['dtype']:9s} auto={r['auto_kernel']:15s} "
              f"plain {plain['ratio_vs_cublas']:.2f} graph {r['ratio_vs_cublas']:.2f}")
    for r in t.rows:
        if r["impl"] in ("split_k", "split_k_deterministic", "k_major_view", "stream_k") and r["mode"] == "graph":
            print(f"  {r['m']}x{r['n']}x{r['k']} {r['impl']}: graph {r['ratio_vs_cublas']:.2f}")
else:
    print("no ch04_matmul.csv")
if (d / "ch04_conv.csv").exists():
    t = load(d / "ch04_conv.csv")
    for r in t.where(impl="labkernels").rows:
        print(f"conv C={r['c']} {r['size']}^2 K={r['k_out']} {r['r']}x{r['r']} s{r['stride']} {r['mode']}: "
              f"{r['tflops']:.0f} TFLOP/s, vs cuDNN NHWC {r['ratio_vs_cudnn_channels_last']:.2f}, "
              f"vs NCHW {r['ratio_vs_cudnn_nchw']:.2f}")
else:
    print("no ch04_conv.csv")
PYEOF
echo "failed steps: ${failed[*]:-none}; total $(( $(date +%s) - start ))s"
