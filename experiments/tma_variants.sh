#!/usr/bin/env bash
# Chapter 03's TMA-persistent matmul at short K (3000 x 5000 x 1000 bf16): the fixed cost of a tile, and
# epilogue slices, stages, grouping, flattening and warp specialization against cuBLAS, with 4096^3, 8192^3
# and 1536^3 as controls (experiments/tma_variants.py). CSV in $OUT/tma_variants/results.csv. One H200.
# Budget: ~35 variants compiled (~4 s each) then timed in 5 alternating rounds: ~300 s; hard stop at 400 s.
set -u
OUT="${OUT:?set OUT to an output folder}"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 400 python experiments/tma_variants.py --budget-s 330 2>&1 | tee "$OUT/tma_variants.txt"
echo "tma_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
