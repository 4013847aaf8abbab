#!/usr/bin/env bash
# `make test-gpu-notebooks` spread over worker processes: nbval (strict) over $NOTEBOOKS on the GPU, one notebook
# per worker at a time. Logs and the JUnit report go to $OUT/notebooks/.
set -u
# plt.show() must leave a figure in the output (as `make` sets it): Agg would leave none and fail nbval
export MPLBACKEND=module://matplotlib_inline.backend_inline
mkdir -p "$OUT/notebooks"
workers=${NB_WORKERS:-4}
# -v: each cell's verdict as it ends, so a run cut off by the timeout still names the cells that failed
timeout "${NB_TIMEOUT_S:-400}" python -m pytest -v -p no:cacheprovider -n "$workers" --dist loadfile \
  --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  --junitxml="$OUT/notebooks/notebooks.xml" ${NOTEBOOKS:-notebooks solutions} > "$OUT/notebooks/notebooks.log" 2>&1
echo "nbval rc=$?"
grep -E "FAILED|ERROR|passed|failed" "$OUT/notebooks/notebooks.log" | grep -v PASSED | tail -40
