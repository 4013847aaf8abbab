#!/usr/bin/env bash
# The split kernel holding its raw words across the wait (experiments/softmax_hold.py) beside the lean and shipped
# kernels and a copy of the same bytes, every output checked against fp64 with the output poisoned first.
# About 3 min on one H200.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_hold"
mkdir -p "$dest"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 5 500 python -u experiments/softmax_hold.py "$dest" 2>&1 | tee "$dest/log.txt" | tail -n 80
