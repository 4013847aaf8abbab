#!/usr/bin/env bash
# The tiled matmul with and without being told its rows' alignment (gpu_jobs/alignment.py), bf16 on one H200:
# $OUT/alignment/ch04_alignment.csv. Under a minute.
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/alignment"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 120 python gpu_jobs/alignment.py --out "$OUT/alignment"
echo "alignment: rc=$?"
