#!/usr/bin/env bash
# The wave-tail kernel on the H200: chapter 04's matmul tests (chapter 03's run in test_gpu.sh), the
# one-launch experiment (one_launch_tail.csv to $OUT/one_launch_tail/), then
# chapter 04's matmul benchmark (ch04_matmul.csv to $OUT/ch04_matmul/). Under 9 min.
set -u
export MPLBACKEND=Agg
timeout 190 python -m pytest -q -p no:cacheprovider tests/test_ch04_kernels.py \
    -k "wave_tail or auto or poisoned or refuses or beyond_int32" 2>&1 | tail -8
timeout 100 python experiments/one_launch_tail.py
echo "experiment rc=$?"
BENCH_TIMEOUT_S=240 bash gpu_jobs/ch04_matmul_bench.sh  # more candidates to time than it was sized for
echo "bench rc=$?"
