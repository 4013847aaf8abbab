#!/usr/bin/env bash
# The wave-tail kernel on the H200: its tests (both launches, streams, graphs), then chapter 04's matmul
# benchmark (ch04_matmul.csv to $OUT/ch04_matmul/, auto now also times "wave_tail"). ~4 min.
set -u
export MPLBACKEND=Agg
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_ch04_kernels.py -k "wave_tail or auto_rule or matmul_fp32 or poisoned" 2>&1 | tail -5
mkdir -p "$OUT/ch04_matmul"
timeout 240 python -c "
from labkernels.ch04_libraries import bench_kernels as b
from labkernels.results import record
rows = []
for shape in b.MATMUL_SHAPES:
    rows += (new := b.matmul_rows(*shape)); b._print_matmul(new); record('ch04_matmul', rows, '$OUT/ch04_matmul')
rows += (new := b.tf32_rows()); b._print_matmul(new); record('ch04_matmul', rows, '$OUT/ch04_matmul')
"
echo "bench rc=$?"
