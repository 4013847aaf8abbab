#!/usr/bin/env bash
# The split softmax's exchange as one 64-bit word per chunk, polled in place (experiments/softmax_slots.py), against
# the shipped exchange, each checked against fp64 with the output poisoned first. About a minute on one H200.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_slots"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 5 200 python -u experiments/softmax_slots.py "$dest" 2>&1 | tee "$dest/log.txt" | tail -n 60
