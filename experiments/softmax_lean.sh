#!/usr/bin/env bash
# The split kernel with fewer instructions an element (experiments/softmax_lean.py) beside the shipped one and a
# copy of the same bytes, every output checked against fp64 with the output poisoned first. About 3 min on
# one H200.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_lean"
mkdir -p "$dest"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 5 400 python -u experiments/softmax_lean.py "$dest" 2>&1 | tee "$dest/log.txt" | tail -n 60
