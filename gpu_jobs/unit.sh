#!/usr/bin/env bash
# `make test-gpu-unit` spread over worker processes (pytest-xdist): every unit test in the GPU lane.
set -u
mkdir -p "$OUT/unit"
workers=${UNIT_WORKERS:-6}
timeout "${UNIT_TIMEOUT_S:-300}" python -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile --junitxml="$OUT/unit/unit.xml" tests \
  > "$OUT/unit/unit.log" 2>&1
echo "unit tests rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/unit/unit.log" | tail -40
