#!/usr/bin/env bash
# Chapter 04's convolution against cuDNN channels_last (fp16, batch 32, the ch04_conv shapes), in one run
# (experiments/conv_variants.py): plain calls and CUDA-graph replays with thin launches on and off, a config
# sweep of `_conv_kernel` and split-K variants for the two shapes furthest behind. Checks against fp64.
# Table on stdout, CSV in $OUT/conv_variants/results.csv. Run from the repository root on one H200.
# Budget: under 120 s with a cold Triton cache (the kernels compile first, in parallel processes).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/conv_variants"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
# --budget-s: no new variant starts after it; the timeout kills a hang (the CSV keeps the rows done so far)
timeout -k 3 115 python experiments/conv_variants.py --budget-s 95 2>&1 | tee "$OUT/conv_variants/log.txt"
echo "conv_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; CSV: $OUT/conv_variants/results.csv"
