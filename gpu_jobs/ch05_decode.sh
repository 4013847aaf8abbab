#!/usr/bin/env bash
# Chapter 05's decode GEMV and compile host-time records on one H200 (about 8 minutes), then the chapter
# checked against them: the int8 GEMV benchmark (gpu_jobs/int8_gemv.py) and experiments/compile_host.py write
# their CSVs into labkernels/reference/ here; tests/test_ch05_fusion.py runs on the GPU lane; notebook 05 and
# its appendix are executed on the CPU lane (LABKERNELS_LANE=cpu: the outputs the repository stores) and then
# checked by nbval on the GPU lane, with the chapter's solutions. Everything lands in $OUT/ch05.tar.gz.
set -u
OUT="${OUT:?set OUT to an output folder}"
dest="$OUT/ch05"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$SECONDS
timeout -k 5 220 python gpu_jobs/int8_gemv.py --out "$dest" > "$dest/int8_gemv.log" 2>&1
echo "int8_gemv rc=$? in $((SECONDS - start)) s"; grep -E "impl=(int8_gemv|cublas)" "$dest/int8_gemv.log" | \
  sed -E 's/dtype=\S+ //; s/err=\S+ //' | cut -c1-260; tail -1 "$dest/int8_gemv.log"
timeout -k 5 200 python experiments/compile_host.py --out "$dest" > "$dest/compile_host.log" 2>&1
echo "compile_host rc=$? in $((SECONDS - start)) s"; grep "^{" "$dest/compile_host.log" | cut -c1-200
cp "$dest"/*.csv labkernels/reference/
(
  timeout -k 5 300 python -m pytest -q -p no:cacheprovider -n 4 tests/test_ch05_fusion.py > "$dest/tests.log" 2>&1
  echo "tests/test_ch05_fusion.py on the GPU lane rc=$? in $((SECONDS - start)) s" > "$dest/tests.rc"
) &
LABKERNELS_LANE=cpu MPLBACKEND=module://matplotlib_inline.backend_inline timeout -k 5 300 python -m labkernels \
  execute notebooks/05_fusion.ipynb notebooks/appendix/05_fusion_depth.ipynb > "$dest/execute.log" 2>&1
echo "CPU-lane execution rc=$? in $((SECONDS - start)) s"; tail -3 "$dest/execute.log"
MPLBACKEND=module://matplotlib_inline.backend_inline timeout -k 5 200 python -m pytest -q -p no:cacheprovider \
  -n 3 --dist loadfile --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  notebooks/05_fusion.ipynb notebooks/appendix/05_fusion_depth.ipynb solutions/05_fusion.ipynb \
  > "$dest/nbval.log" 2>&1
echo "nbval on the GPU lane rc=$? in $((SECONDS - start)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/nbval.log" | tail -8
wait
cat "$dest/tests.rc"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/tests.log" | tail -8
cp notebooks/05_fusion.ipynb notebooks/appendix/05_fusion_depth.ipynb "$dest/"
tar -czf "$OUT/ch05.tar.gz" -C "$OUT" ch05 && rm -rf "$dest"
