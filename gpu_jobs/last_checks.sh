#!/usr/bin/env bash
# The last H200 run on the submitted code, in under 9 minutes, each step with its own limit:
#  1. chapter 07's decode-attention rows (contiguous and paged) and its full-size correctness, the GPU to itself
#     (gpu_jobs/ch07_decode.py without the int4 and decode-step sections) -> $OUT/final/ch07_*.csv;
#  2. the unit tests of chapters 04-08 and the extension/exercise hardening on this lane (8 workers), beside
#     compute-sanitizer memcheck over chapter 07's and int8_gemv's sanitizer entries;
#  3. a sandboxed process sees the GPU (pid 1 inside), then every chapter's solutions graded sandboxed, speed
#     cases included, the GPU to itself again (gpu_jobs/grade_solutions.sh).
# Logs in $OUT/final/ and $OUT/grade_solutions/.
# Grading needs Jupyter (nbformat, nbclient, ipykernel), which the GPU image lacks: carry .whl
# (../shared/gpu/wheels.sh) and run the install line it prints before this script.
set -u
python -c "import nbformat, nbclient, ipykernel" 2>/dev/null || echo "!! no Jupyter packages here: step 3's grading will fail (see the header)"
dest="$OUT/final"
mkdir -p "$dest"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$SECONDS

CH07_SKIP="int4,decode step" CH07_BUDGET_S=135 timeout -k 5 150 python gpu_jobs/ch07_decode.py "$dest" \
  > "$dest/ch07.log" 2>&1
echo "1. ch07 attention rows rc=$? at $((SECONDS - start)) s"; grep -E "^(B |FAIL|ok)|FAILED|total" "$dest/ch07.log" | tail -16

timeout 170 python -m labkernels.sanitize --tool memcheck --only '^(ch05\.int8_gemv|ch07)' > "$dest/memcheck.log" 2>&1 &
memcheck=$!
timeout 175 python -m pytest -q -p no:cacheprovider -n 8 --dist worksteal \
  -k "not above_2_to_31 and not beyond_int32" tests/test_ch04_kernels.py tests/test_ch04_model.py \
  tests/test_ch04_exercises.py tests/test_ch05_fusion.py tests/test_ch06_attention.py tests/test_ch07_decode.py \
  tests/test_ch08_hopper.py tests/test_ch01_ch02_hardening.py tests/test_ch02_exercises.py > "$dest/unit.log" 2>&1
echo "2. unit tests rc=$? at $((SECONDS - start)) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/unit.log" | tail -12
wait $memcheck; echo "2. memcheck rc=$?"; tail -12 "$dest/memcheck.log"

PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python gpu_jobs/cuda_in_sandbox.py > "$dest/cuda_inside.log" 2>&1
echo "3. CUDA inside the sandbox (expects pid 1, sum 8.0): rc=$?"; tail -1 "$dest/cuda_inside.log"
GRADE_TIMEOUT_S=${GRADE_TIMEOUT_S:-170} RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-160} bash gpu_jobs/grade_solutions.sh
grep -h '"sandbox"' "$OUT"/grade_solutions/grades/students/*.json 2>/dev/null | sort | uniq -c
echo "all steps: $((SECONDS - start)) s"
