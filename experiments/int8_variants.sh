#!/usr/bin/env bash
# int8 weight-only matmul with the operands swapped (C^T = W^T A^T: the converted weights are wgmma's register
# operand) against cuBLAS on 16-bit weights, eager and chapter 05's int8_matmul, M = 16 ... 4096, N = K =
# 4096 bf16 (experiments/int8_variants.py). Table on stdout, CSV in $OUT/int8_variants/results.csv. One H200.
# Budget: 66 variants, each compiled then timed: ~220 s; hard stop at 300 s (the CSV keeps the rows done).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/int8_variants"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 300 python experiments/int8_variants.py --out "$OUT/int8_variants" --budget-s 260 \
  2>&1 | tee "$OUT/int8_variants/log.txt"
echo "int8_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
