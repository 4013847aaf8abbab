#!/usr/bin/env bash
# Chapter 07 on one H200 (under 8 minutes: FlexAttention compiles for each of nine shapes): correctness of the decode kernels at full sizes, then the read roof,
# decode attention, the 4-bit GEMV and the decode step, each section's CSV written into $OUT as it finishes
# (gpu_jobs/ch07_decode.py says which). Extra arguments go to the script (--explore: other configs too).
# Copy the CSVs the notebook reads into labkernels/reference/.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export CH07_BUDGET_S="${CH07_BUDGET_S:-400}"  # the script skips a section it cannot finish by then
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$SECONDS
timeout -k 5 420 python gpu_jobs/ch07_decode.py "$OUT" "$@" 2>&1 | tee "$OUT/ch07_log.txt"
rc=${PIPESTATUS[0]}
# The unit tests on the GPU lane with the time left (kernels compile per shape: -x stops at the first failure).
left=$((${CH07_TEST_BUDGET_S:-540} - (SECONDS - start)))  # CH07_TEST_BUDGET_S=0: no unit tests
if [ "$left" -gt 20 ]; then
  timeout -k 5 "$left" python -m pytest -q -x -p no:cacheprovider tests/test_ch07_decode.py 2>&1 | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
exit "$rc"
