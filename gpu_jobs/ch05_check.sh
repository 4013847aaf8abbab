#!/usr/bin/env bash
# Chapter 05 checked on one H200 (about 4 minutes): its unit tests on the GPU lane; the int8 GEMV's sanitizer
# entry under compute-sanitizer memcheck and racecheck (every design, split and not); nbval over notebook 05,
# its appendix and its solutions against the stored (CPU-lane) outputs.
set -u
OUT="${OUT:?set OUT to an output folder}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$SECONDS
(
  timeout -k 5 300 python -m pytest -q -p no:cacheprovider -n 4 tests/test_ch05_fusion.py > "$OUT/tests.log" 2>&1
  echo "tests/test_ch05_fusion.py, GPU lane: rc=$? in $((SECONDS - start)) s" > "$OUT/tests.rc"
) &
python -m labkernels.sanitize --only 'ch05\.int8_gemv' --check-kernels > "$OUT/plain.log" 2>&1
echo "int8_gemv entry without a sanitizer rc=$?"; tail -2 "$OUT/plain.log"
for tool in memcheck racecheck; do
  timeout -k 5 150 compute-sanitizer --tool "$tool" --error-exitcode 9 python -m labkernels.sanitize \
    --only 'ch05\.int8_gemv' > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error|passed|failed" "$OUT/$tool.log" | tail -3
done
MPLBACKEND=module://matplotlib_inline.backend_inline timeout -k 5 200 python -m pytest -q -p no:cacheprovider \
  -n 3 --dist loadfile --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  notebooks/05_fusion.ipynb notebooks/appendix/05_fusion_depth.ipynb solutions/05_fusion.ipynb \
  > "$OUT/nbval.log" 2>&1
echo "nbval, GPU lane: rc=$? in $((SECONDS - start)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/nbval.log" | tail -8
wait
cat "$OUT/tests.rc"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -8
