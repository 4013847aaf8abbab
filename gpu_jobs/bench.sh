#!/usr/bin/env bash
# Runs the benchmarks named in $BENCH_NAMES one by one (each within $BENCH_LIMIT_S), recording the reference
# CSVs in labkernels/reference/ and copying each to $OUT/bench/.
set -u
mkdir -p "$OUT/bench"
for name in ${BENCH_NAMES:?}; do
  start=$SECONDS
  timeout "${BENCH_LIMIT_S:-200}" python -m labkernels bench "$name" > "$OUT/bench/$name.log" 2>&1
  echo "bench $name: rc=$? in $((SECONDS - start)) s"; tail -3 "$OUT/bench/$name.log"
  cp labkernels/reference/"$name".csv "$OUT/bench/" 2>/dev/null || echo "  (no CSV for $name)"
done
