#!/usr/bin/env bash
# Chapter 03's matmul epilogue (bias, GELU through tl.erf, the 16-bit GELU polynomial) at 4096^3, and
# small-grid configs and a 192-column tile at 1536^3 and 3000 x 5000 x 1000, bf16, against cuBLAS and eager
# (experiments/epilogue_variants.py). Table on stdout, CSV in $OUT/epilogue_variants/results.csv. One H200.
# Budget: 66 variants, each compiled then timed (~4 s): ~280 s; hard stop at 380 s (the CSV keeps the rows
# done so far).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/epilogue_variants"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 380 python experiments/epilogue_variants.py --out "$OUT/epilogue_variants" --budget-s 340 \
  2>&1 | tee "$OUT/epilogue_variants/log.txt"
echo "epilogue_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
