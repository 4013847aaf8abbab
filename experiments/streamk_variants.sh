#!/usr/bin/env bash
# Stream-K variants (experiments/streamk_variants.py) against cuBLAS, chapter 03's matmul and chapter 04's
# stream_k on wave-quantized bf16 shapes: checks (fp32 reference, determinism, graph replays, flags reset)
# and timings (plain do_bench medians and CUDA-graph replays). Table on stdout, CSV in $OUT/streamk/.
# Run from the repository root on one H200. Budget: under 200 s with a cold Triton cache (~2 min expected).
set -u
OUT="${OUT:?set OUT to an output folder}"
mkdir -p "$OUT/streamk"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
# --budget-s: no new shape starts after it; the timeout kills a hang (the CSV keeps the rows done so far)
timeout -k 5 195 python experiments/streamk_variants.py --budget-s 140 --rep-ms 40 2>&1 | tee "$OUT/streamk/variants.log"
echo "streamk_variants: rc=${PIPESTATUS[0]} in $((SECONDS - start)) s; CSV: $OUT/streamk/variants.csv"
