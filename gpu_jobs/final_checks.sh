#!/usr/bin/env bash
# Re-checks after the last fixes, on the H200, in about 7 minutes: RMSNorm's rows of ch05_fusion re-measured
# (to $OUT/final/), the changed test files, nbval on chapter 05, then memcheck over the sanitizer registry
# without the autotuned matmuls (their many configs take minutes to compile: tests/test_sanitizer.py runs them).
set -u
dest="$OUT/final"
mkdir -p "$dest"
python - "$dest" <<'PY' > "$dest/rmsnorm.log" 2>&1; echo "rmsnorm rows: rc=$?"; tail -4 "$dest/rmsnorm.log"
import sys
from labkernels.ch05_fusion import bench
from labkernels.results import record
from labkernels.roofline import measure_copy_bandwidth
rows = bench.rmsnorm_rows(16384, 4096, measure_copy_bandwidth())
print(record("ch05_fusion_rmsnorm", rows, sys.argv[1], replace=True))
for r in rows:
    print({k: r.get(k) for k in ("impl", "ms", "fraction_of_copy", "speedup_vs_compile")})
PY
timeout 150 python -m pytest -q -p no:cacheprovider -n 6 --dist loadfile tests/test_profile.py tests/test_ch05_fusion.py \
  tests/test_ch06_attention.py > "$dest/retest.log" 2>&1
echo "retest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/retest.log" | tail -8
MPLBACKEND=module://matplotlib_inline.backend_inline timeout 120 python -m pytest -q -p no:cacheprovider -n 2 \
  --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg notebooks/05_fusion.ipynb solutions/05_fusion.ipynb \
  > "$dest/nbval05.log" 2>&1
echo "nbval 05 rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/nbval05.log" | tail -8
start=$SECONDS
timeout 200 python -m labkernels.sanitize --tool memcheck --only '^(ch01|ch02|ch03\.(vector_add|add_relu|softmax)|ch04\.conv|ch05|ch06)' \
  > "$dest/memcheck.log" 2>&1
echo "memcheck subset rc=$? in $((SECONDS - start)) s"; tail -30 "$dest/memcheck.log"
