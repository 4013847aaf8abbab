#!/usr/bin/env bash
# Chapter 06's online softmax on the H200 (under 90 s): its GPU tests, then the ch06_online_softmax benchmark;
# the CSV is copied to $OUT/ch06_softmax/.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/ch06_softmax"
timeout 40 python -m pytest -q -x -p no:cacheprovider tests/test_ch06_attention.py -k "online" 2>&1 | tail -5
timeout 45 python -m labkernels bench ch06_online_softmax
cp labkernels/reference/ch06_online_softmax.csv "$OUT/ch06_softmax/"
