#!/usr/bin/env bash
# The tiled matmul with and without being told its rows' alignment (experiments/alignment.py), bf16 on one H200:
# $OUT/alignment/ch04_alignment.csv. Under a minute.
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/alignment"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 120 python experiments/alignment.py --out "$OUT/alignment"
echo "alignment: rc=$?"
