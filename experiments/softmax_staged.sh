#!/usr/bin/env bash
# Online softmax with its chunks staged in shared memory (experiments/softmax_staged.py): chunk sizes x block
# sizes, bf16 and fp32, at 1024x262144 and 4096x32768, against the shipped online_softmax and a same-size copy;
# each checked against the fp64 reference, output poisoned first. CSV in $OUT/softmax_staged/results.csv.
# Run from the repository root on one H200: under a minute, at most 150 s.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_staged"
mkdir -p "$dest"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 150 python -u experiments/softmax_staged.py "$dest" --budget-s 110 2>&1 | tee "$dest/log.txt" | tail -n 60
echo "softmax_staged: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; log: $dest/log.txt; CSV: $dest/results.csv"
