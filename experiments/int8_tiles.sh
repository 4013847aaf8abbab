#!/usr/bin/env bash
# Chapter 05's prologue-fused int8 kernel at 12 tile configs beside cuBLAS on 16-bit weights and the shipped
# int8_matmul (auto, dequantize), M = 16 ... 2048, N = K = 4096 bf16 (experiments/int8_tiles.py). Table on
# stdout, CSV in $OUT/int8_tiles/results.csv. One H200: ~120 s; hard stop at 240 s (the CSV keeps the rows done).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/int8_tiles"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 240 python experiments/int8_tiles.py --out "$OUT/int8_tiles" --budget-s 200 \
  2>&1 | tee "$OUT/int8_tiles/log.txt"
echo "int8_tiles: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
