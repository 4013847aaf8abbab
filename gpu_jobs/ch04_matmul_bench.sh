#!/usr/bin/env bash
# Chapter 04's matmul benchmark alone on an idle H200 (under 100 s): ch04_matmul.csv to $OUT/ch04_matmul/.
# Plain calls are host-bound at small sizes, so nothing else should run beside it.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/ch04_matmul"
timeout "${BENCH_TIMEOUT_S:-100}" python -c "
from labkernels.ch04_libraries import bench_kernels as b
from labkernels.results import record
rows = []
for shape in b.MATMUL_SHAPES:
    rows += (new := b.matmul_rows(*shape)); b._print_matmul(new); record('ch04_matmul', rows, '$OUT/ch04_matmul')
rows += (new := b.tf32_rows()); b._print_matmul(new); record('ch04_matmul', rows, '$OUT/ch04_matmul')
"
