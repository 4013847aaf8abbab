#!/usr/bin/env bash
# Host cost per call of chapter 03's softmax and matmul against torch's (issue 14), on the GPU:
# 1. tests/test_ch03_launch.py on the GPU lane (thin launches bitwise equal to Triton's, on the current
#    stream, LABKERNELS_THIN_LAUNCH=0), under `timeout 90`;
#    the conv's and chapter 05's pointwise thin-launch tests;
# 2. the ch03_launch benchmark (headline rows and the step-by-step breakdown), under `timeout 180`;
#    the CSV goes to $OUT/ch03_launch/ch03_launch.csv;
# 3. chapter 05's per-call table (ch05_launch), under `timeout 240`, to $OUT/ch03_launch/ch05_launch.csv.
# Each step runs whatever the others did; about 4 minutes in all.
# Run from the repository root: OUT=/some/dir bash gpu_jobs/ch03_launch.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/labkernels_out}
DIR="$OUT/ch03_launch"
mkdir -p "$DIR"
PY=${PYTHON:-python}
start=$(date +%s)
failed=()

echo "ch03_launch on $("$PY" -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null), \
torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null), \
triton $("$PY" -c 'import triton; print(triton.__version__)' 2>/dev/null)"

timeout 90 "$PY" -m pytest -q -p no:cacheprovider -rfEs --junitxml="$DIR/tests.xml" tests/test_ch03_launch.py \
    "tests/test_ch04_kernels.py::test_conv_thin_equals_normal_bitwise_on_any_stream_and_in_a_graph" \
    tests/test_ch05_fusion.py::test_pointwise_thin_equals_normal_bitwise \
    tests/test_ch05_fusion.py::test_launch_breakdown_restores_thin_launches \
    >"$DIR/tests.log" 2>&1
rc=$?
echo "  tests (GPU lane): exit $rc: $(grep -E "(passed|failed|error)" "$DIR/tests.log" | tail -1)"
if [ "$rc" != 0 ]; then
    failed+=("tests")
    [ "$rc" = 124 ] && echo "    TIMED OUT after 90 s"
    grep -E "^(FAILED|ERROR)" "$DIR/tests.log" | head -20 | sed 's/^/    /'
fi

timeout 180 "$PY" -m labkernels bench ch03_launch >"$DIR/bench.log" 2>&1
rc=$?
if [ "$rc" = 0 ] && cp labkernels/reference/ch03_launch.csv "$DIR/"; then
    "$PY" - "$DIR/ch03_launch.csv" <<'PY' || failed+=("summary")
import sys

from labkernels.results import load

rows = load(sys.argv[1])
us = {r["op"]: float(r["host_us"]) for r in rows}
for r in rows:
    print(f"    {r['section']:9s} {r['op']:75s} {float(r['host_us']):8.1f} us")
pairs = [
    ("labkernels softmax", "torch.softmax"),
    ("labkernels matmul, tiled", "torch.matmul (cuBLAS)"),
    ("labkernels matmul, tma_persistent", "torch.matmul (cuBLAS)"),
]
for ours, theirs in pairs:
    if ours in us:
        ratio = us[ours] / us[theirs]
        print(f"  {ours}: {ratio:.2f}x {theirs} ({'meets' if ratio <= 2 else 'MISSES'} the 2x goal)")
PY
else
    failed+=("bench")
    echo "  bench: exit $rc"
    tail -20 "$DIR/bench.log" | sed 's/^/    /'
fi

timeout 240 "$PY" -m labkernels bench ch05_launch >"$DIR/bench_ch05.log" 2>&1
rc=$?
if [ "$rc" = 0 ] && cp labkernels/reference/ch05_launch.csv "$DIR/"; then
    "$PY" - "$DIR/ch05_launch.csv" <<'PY' || failed+=("summary ch05")
import sys

from labkernels.results import load

rows = load(sys.argv[1])
for r in rows:
    print(f"    {r['table']:9s} {r['op']:16s} {r['impl']:24s} {r['step']:48s} {float(r['host_us']):8.1f} us")
us = {(r["op"], r["impl"]): float(r["host_us"]) for r in rows if r["table"] == "per_call"}
for op in ("softmax", "matmul"):
    ratio = us[(op, "labkernels")] / us[(op, "torch")]
    print(f"  ch05_launch {op}: {ratio:.2f}x torch ({'meets' if ratio <= 2 else 'MISSES'} the 2x goal)")
PY
else
    failed+=("bench ch05_launch")
    echo "  bench ch05_launch: exit $rc"
    tail -20 "$DIR/bench_ch05.log" | sed 's/^/    /'
fi

echo "  total $(($(date +%s) - start)) s; logs in $DIR"
if [ ${#failed[@]} -eq 0 ]; then
    echo "ch03_launch: PASS"
else
    echo "ch03_launch: FAIL (${failed[*]})"
    exit 1
fi
