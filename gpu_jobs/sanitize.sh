#!/usr/bin/env bash
# compute-sanitizer over every CUDA/Triton op of the course (tests/test_sanitizer.py): the registry without a
# sanitizer (which also builds the extension and fills Triton's cache), memcheck over every entry in one
# process, racecheck over the shared-memory entries, and a planted out-of-bounds write memcheck must report.
# Expected: 3-5 minutes on one H200 (memcheck and racecheck dominate; the per-entry seconds under each tool
# are in the log, so the slowest ops can be read off). Hard limit: 9 minutes. Log: $OUT/sanitize/pytest.log.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/sanitize"
export PYTHONUNBUFFERED=1
start=$SECONDS
timeout "${SANITIZE_TIMEOUT_S:-540}" python -m pytest -q -s -p no:cacheprovider tests/test_sanitizer.py \
  > "$OUT/sanitize/pytest.log" 2>&1
rc=$?
echo "test_sanitizer rc=$rc in $((SECONDS - start)) s"
grep -E "^(ok|FAIL) |sanitizer registry|compute-sanitizer|entries ok|kernels never|^(FAILED|ERROR)|passed|failed" \
  "$OUT/sanitize/pytest.log" | tail -90
exit $rc
