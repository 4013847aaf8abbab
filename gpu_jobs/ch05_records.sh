#!/usr/bin/env bash
# Chapter 05's two H200 records in one call (about 3 minutes): the int8 decode GEMV (ch05_int8_gemv.csv) and
# Inductor's fusion log (ch05_fusion_log.csv), both under $OUT; then chapter 05's unit tests on the GPU lane.
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
bash gpu_jobs/ch05_int8_record.sh
timeout -k 5 120 python gpu_jobs/ch05_fusion_log.py --out "$OUT" > "$OUT/fusion_log.log" 2>&1
echo "fusion log rc=$?"; cut -c1-200 "$OUT/fusion_log.log" | tail -20
start=$SECONDS
timeout -k 5 240 python -m pytest -q -p no:cacheprovider -n 4 tests/test_ch05_fusion.py > "$OUT/tests.log" 2>&1
echo "tests/test_ch05_fusion.py, GPU lane: rc=$? in $((SECONDS - start)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -8
