#!/usr/bin/env bash
# The one-row 4-bit GEMV designs (experiments/int4_gemv.py): `lop` and `fma` swept at N = 4096 and 14336, K = 4096,
# bf16, then each design's best beside cuBLAS on bf16 weights, torch's int4pack and the shipped int4_matmul.
# Table on stdout, CSV in $OUT/int4_gemv/int4_gemv.csv. Sweep budget BUDGET_S (default 240 s); hard stop at 420 s.
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/int4_gemv"
export PYTHONPATH="$PWD:$PWD/experiments${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 420 python experiments/int4_gemv.py --out "$OUT/int4_gemv" --budget "${BUDGET_S:-240}" \
  2>&1 | tee "$OUT/int4_gemv/log.txt"
echo "int4_gemv: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s"
