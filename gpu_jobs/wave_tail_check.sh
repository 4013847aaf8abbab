#!/usr/bin/env bash
# The wave-tail kernel on the H200: its tests (both launches, streams, graphs), then chapter 04's matmul
# benchmark (ch04_matmul.csv to $OUT/ch04_matmul/). ~4 min.
set -u
export MPLBACKEND=Agg
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_ch04_kernels.py -k "wave_tail or auto_rule or matmul_fp32 or poisoned" 2>&1 | tail -5
BENCH_TIMEOUT_S=240 bash gpu_jobs/ch04_matmul_bench.sh  # more candidates to time than it was sized for
echo "bench rc=$?"
