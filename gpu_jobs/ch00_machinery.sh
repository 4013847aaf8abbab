#!/usr/bin/env bash
# Chapter 00 machinery: the lane-aware timing test and the rest of tests/test_machinery.py, the prose check,
# and the read:write mix benchmark (why a 2:1 kernel can pass 100% of copy bandwidth). Output:
# $OUT/ch00_machinery/ (logs, ch00_read_write_mix.csv). Run from the repository root on the H200.
# Budget: under 2.5 minutes (the whole job is wrapped in `timeout 150`; each step has its own limit too).
# Afterwards: copy ch00_read_write_mix.csv into labkernels/reference/ and re-execute notebook 03 on the GPU.
set -u
OUT="${OUT:?set OUT to an output folder}"
if [ -z "${CH00_MACHINERY_INNER:-}" ]; then  # the whole job runs under one 150 s limit
  CH00_MACHINERY_INNER=1 timeout 150 bash "$0" "$@" || echo "ch00_machinery: stopped at its 150 s limit or failed"
  exit 0
fi
DEST="$OUT/ch00_machinery"
mkdir -p "$DEST"

step() {  # step NAME SECONDS CMD...: one step; a failure is reported and the next step still runs
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  if timeout "$limit" "$@" >"$DEST/$name.log" 2>&1; then
    echo "ok    $name ($((SECONDS - start)) s): $(tail -n 1 "$DEST/$name.log")"
  else
    echo "FAIL  $name ($((SECONDS - start)) s): last lines:"
    tail -n 12 "$DEST/$name.log" | sed 's/^/      /'
  fi
}

main() {
  export MPLBACKEND=Agg
  step machinery_tests 70 python -m pytest -q -p no:cacheprovider tests/test_machinery.py
  step prose_tests 20 python -m pytest -q -p no:cacheprovider tests/test_prose.py
  step bench_read_write_mix 45 python -m labkernels bench ch00_read_write_mix
  cp labkernels/reference/ch00_read_write_mix.csv "$DEST/" 2>/dev/null || echo "no ch00_read_write_mix.csv written"
  timeout 20 python - "$DEST/ch00_read_write_mix.csv" <<'PY' || echo "summary failed"
import sys

from labkernels.results import Table, load

table = load(sys.argv[1])
print(Table({k: r[k] for k in ("kernel", "n", "gbps", "fraction_of_copy")} for r in table.rows))
PY
}

main
