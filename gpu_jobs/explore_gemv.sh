#!/usr/bin/env bash
# The weight-only GEMV designs of experiments/weight_gemv.py swept and timed on one H200 (about 5 minutes):
# the log and DIR/weight_gemv.csv land in $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout -k 5 400 python experiments/weight_gemv.py --out "$OUT" --budget "${BUDGET_S:-200}" 2>&1 | tee "$OUT/gemv_log.txt" | grep -v "^  "
