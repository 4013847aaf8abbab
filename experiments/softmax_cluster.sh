#!/usr/bin/env bash
# Online softmax with Hopper thread-block clusters (experiments/softmax_cluster.py): every (cluster, threads,
# vectors a thread) that covers a row, against the shipped online_softmax and a same-size copy, bf16 and fp32
# at 8192x5000, 4096x32768, 1024x262144 and a ragged 37x100008 (also with strided rows), fp16 at the widest.
# Each checked against the fp64 reference, output poisoned first. CSV in $OUT/softmax_cluster/results.csv.
# Run from the repository root on one H200: about 2 minutes, at most 230 s.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/softmax_cluster"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 230 python -u experiments/softmax_cluster.py "$dest" --budget-s 170 2>&1 | tee "$dest/log.txt" | tail -n 45
echo "softmax_cluster: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; log: $dest/log.txt; CSV: $dest/results.csv"
