#!/usr/bin/env bash
# Re-runs the test files named in $RETEST (after fixes), in the GPU lane.
set -u
mkdir -p "$OUT/retest"
timeout "${RETEST_TIMEOUT_S:-150}" python -m pytest -q -p no:cacheprovider -n 4 --dist loadfile ${RETEST:?} > "$OUT/retest/retest.log" 2>&1
echo "retest rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/retest/retest.log" | tail -20
