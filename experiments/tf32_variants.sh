#!/usr/bin/env bash
# TF32 matmul with a row-major B at 4096^3 (cuBLAS, chapter 04's k_major with and without the copy of B,
# Triton transposes, a k_major config sweep, the swapped C^T = B^T A^T kernel with B^T fed from registers)
# and 1536^3 bf16 (cuBLAS, chapters 03 and 04, chapter 03 tiled configs): checked against fp64, timed as
# CUDA-graph replays and plain calls (experiments/tf32_variants.py). Table on stdout, CSV in
# $OUT/tf32_variants/results.csv. Run from the repository root on one H200.
# Budget: ~100 s expected with a cold Triton cache (compiles run first, in parallel); hard stop at 170 s.
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/tf32_variants"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
# --budget-s: no new section starts after it; the timeout kills a hang (the CSV keeps the rows done so far)
timeout -k 5 165 python experiments/tf32_variants.py --out "$OUT/tf32_variants" --budget-s 120 --rep-ms 20 \
  2>&1 | tee "$OUT/tf32_variants/log.txt"
echo "tf32_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; CSV: $OUT/tf32_variants/results.csv"
