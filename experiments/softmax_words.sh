#!/usr/bin/env bash
# Whole-row online softmax with 16-bit rows held as 32-bit words (experiments/softmax_words.py) against the
# shipped prefetch kernel, each checked against fp64 with the output poisoned first. About 30 s on one H200.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_words"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout -k 5 120 python -u experiments/softmax_words.py "$dest" 2>&1 | tee "$dest/log.txt" | tail -n 40
