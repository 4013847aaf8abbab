#!/usr/bin/env bash
# Chapter 05's int8 GEMV at decode (M = 1, 16; 4096 x 4096 and 4096 x 14336 bf16) beside cuBLAS on bf16
# weights and the prologue-fused kernel, plus cuBLASLt's fused bias + GELU epilogue at 4096^3
# (gpu_jobs/int8_gemv.py). First the GEMV's unit tests. Writes $OUT/int8_gemv/ch05_int8_gemv.csv and logs.
# One H200: ~2 min; hard stops keep it under 4.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/int8_gemv"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 60 python -m pytest -q -x -p no:cacheprovider tests/test_ch05_fusion.py -k "gemv or dequantize" \
  > "$dest/tests.log" 2>&1; echo "gemv tests rc=$?"; tail -3 "$dest/tests.log"
timeout -k 5 160 python gpu_jobs/int8_gemv.py --out "$dest" 2>&1 | tee "$dest/log.txt"
echo "int8_gemv: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
