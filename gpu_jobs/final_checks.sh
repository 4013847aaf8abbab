#!/usr/bin/env bash
# Re-checks after the last fixes, on the H200, in about 6 minutes (to $OUT/final/): chapter 06's attention
# against SDPA's FLASH and cuDNN backends with the GPU to itself (gpu_jobs/ch06_lesson.py), chapter 06's GPU
# tests, then chapter 06's solutions graded sandboxed with their speed cases.
set -u
dest="$OUT/final"
mkdir -p "$dest"
export LABKERNELS_FAILURE_LOG="$dest/failures.log"
start=$SECONDS
timeout 170 python gpu_jobs/ch06_lesson.py "$dest" 2>&1 | tee "$dest/ch06_bench.log" | grep -v Warning
echo "ch06 bench rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
timeout 150 python -m pytest -q -p no:cacheprovider -n 8 tests/test_ch06_attention.py -k "flash or attention or head_dim \
  or block_sizes" > "$dest/ch06_tests.log" 2>&1
echo "ch06 attention tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/ch06_tests.log" | tail -8
klass=$(mktemp -d)/class
mkdir -p "$klass/ch06" && cp solutions/06_flash_attention.ipynb "$klass/ch06/"
timeout 150 python -m labkernels grade "$klass" --run-timeout 140 --out "$dest/grades" > "$dest/grade06.log" 2>&1
echo "grade ch06 solutions rc=$?"; grep -E "^ch06|6\.[0-9]" "$dest/grade06.log" | head -12
echo "all in $((SECONDS - start)) s"
