#!/usr/bin/env bash
# Online softmax, split rows: a persistent kernel whose programs never wait with a chunk in registers (each
# normalizes the chunk it reduced LAG steps earlier, re-read from L2), against the shipped online_softmax
# and a same-size copy (experiments/softmax_lagged.py). bf16 and fp32, 1024x262144, 4096x32768 and a ragged
# 8192x5000; BLOCK x warps x PER_SM (1-4 programs an SM, where the SM holds them all at once) x LAG (1-3),
# plus L2 eviction hints on a few, each checked against the fp64 reference (output poisoned first). Table
# on stdout (the full log in log.txt); CSV in $OUT/softmax_lagged/results.csv.
# Run from the repository root on one H200. About 2 minutes; at most 230 s (--budget-s: no new variant
# starts after it; the timeout stops a hang, the CSV keeps the rows done so far).
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_lagged"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 230 python -u experiments/softmax_lagged.py "$dest" --budget-s 185 2>&1 | tee "$dest/log.txt" | tail -n 60
echo "softmax_lagged: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; log: $dest/log.txt; CSV: $dest/results.csv"
