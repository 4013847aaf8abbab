#!/usr/bin/env bash
# The one-row 4-bit GEMV designs (experiments/int4_gemv.py): `lop`, `lop_pf` and `fma` swept at N = 4096 and
# 14336, K = 4096, bf16, then each design's best beside cuBLAS on bf16 weights, torch's int4pack and the shipped
# int4_matmul. Then Nsight Compute's counters for each design's profiled config and int4pack at N = 14336.
# Table on stdout; $OUT/int4_gemv/int4_gemv.csv and ncu.csv. Sweep budget BUDGET_S (default 240 s).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/int4_gemv"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 420 python experiments/int4_gemv.py --out "$OUT/int4_gemv" --budget "${BUDGET_S:-240}" \
  2>&1 | tee "$OUT/int4_gemv/log.txt"
echo "int4_gemv: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed.sum
metrics=$metrics,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
metrics=$metrics,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,launch__registers_per_thread
timeout -k 5 240 ncu --csv --metrics "$metrics" python experiments/int4_gemv.py --profile \
  > "$OUT/int4_gemv/ncu.csv" 2> "$OUT/int4_gemv/ncu.err"
echo "ncu: rc=$? in $((SECONDS - start)) s"
