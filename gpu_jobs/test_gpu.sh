#!/usr/bin/env bash
# `make test-gpu` on one H200 in under 9 minutes: the compute-sanitizer tests (tests/test_sanitizer.py, their
# own process: they print their wall times) run beside the other unit tests (pytest-xdist), then nbval over
# the notebooks and solutions. Logs to $OUT/test_gpu/; a summary on stdout.
set -u
dest="$OUT/test_gpu"
mkdir -p "$dest"
start=$SECONDS
(
  timeout "${SANITIZE_TIMEOUT_S:-420}" python -m pytest -q -s -p no:cacheprovider tests/test_sanitizer.py \
    > "$dest/sanitizer.log" 2>&1
  echo "sanitizer tests rc=$? in $((SECONDS - start)) s" > "$dest/sanitizer.rc"
) &
# -v: each test's verdict as it ends, so a run cut off by the timeout still says which tests were left;
# loadgroup: the kernel files' tests spread over the workers, the other files stay whole (tests/conftest.py)
timeout "${UNIT_TIMEOUT_S:-360}" python -m pytest -v -p no:cacheprovider -n "${UNIT_WORKERS:-8}" --dist loadgroup \
  --durations=25 --ignore tests/test_sanitizer.py tests > "$dest/unit.log" 2>&1
echo "unit tests (without the sanitizer's) rc=$? in $((SECONDS - start)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$dest/unit.log" | tail -25
wait
cat "$dest/sanitizer.rc"
grep -E "sanitizer registry|compute-sanitizer|^(FAILED|ERROR)|passed|failed|^FAIL " "$dest/sanitizer.log" | tail -20
nb_start=$SECONDS
MPLBACKEND=module://matplotlib_inline.backend_inline timeout "${NB_TIMEOUT_S:-220}" python -m pytest -q \
  -p no:cacheprovider -n "${NB_WORKERS:-6}" --dist loadfile --nbval --nbval-current-env \
  --nbval-sanitize-with tests/nbval_sanitize.cfg notebooks solutions > "$dest/notebooks.log" 2>&1
echo "nbval rc=$? in $((SECONDS - nb_start)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$dest/notebooks.log" | tail -25
