#!/usr/bin/env bash
# Row-reduction tuning sweep on the H200 (under 4 minutes): every candidate configuration of ch06's online
# softmax (8192x5000, 4096x32768, 1024x262144; fp32 and bf16) and of ch05's RMSNorm + residual (16384x4096;
# bf16 and fp32, with torch.compile of the reference), each checked against an fp32 reference and timed against
# a copy of the same bytes. CSVs in $OUT/tune_rows/; a table per shape on stdout.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/tune_rows"
export PYTHONUNBUFFERED=1
start=$SECONDS
# The script stops starting candidates at TUNE_BUDGET_S (default 215 s); the timeout is the hard stop.
timeout 235 python gpu_jobs/tune_rows.py 2>&1 | tee "$OUT/tune_rows/log.txt"
rc=${PIPESTATUS[0]}
echo "tune_rows: rc=$rc in $((SECONDS - start)) s"
exit "$rc"
