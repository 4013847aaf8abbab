#!/usr/bin/env bash
# Chapter 05's int8 decode GEMV record on one H200 (about 80 s): gpu_jobs/int8_gemv.py writes
# $OUT/ch05_int8_gemv.csv (copy it into labkernels/reference/, then execute notebook 05 on the CPU lane and
# check it on the GPU lane with gpu_jobs/ch05_check.sh) and prints its rows.
set -u
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout -k 5 250 python gpu_jobs/int8_gemv.py --out "$OUT" > "$OUT/int8_gemv.log" 2>&1
echo "int8_gemv rc=$?"; grep -E "impl=|tuner" "$OUT/int8_gemv.log" | sed -E 's/dtype=\S+ //; s/err=\S+ //' | cut -c1-330
tail -1 "$OUT/int8_gemv.log"
