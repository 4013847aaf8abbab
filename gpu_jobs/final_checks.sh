#!/usr/bin/env bash
# Re-checks after the last fixes, on the H200, in about 8 minutes (to $OUT/final/): chapter 06's attention
# against SDPA's FLASH and cuDNN backends with the GPU to itself (gpu_jobs/ch06_lesson.py), every chapter's
# solutions graded sandboxed with their speed cases (gpu_jobs/grade_solutions.sh, to $OUT/grade_solutions/),
# then nbval on notebook 06 and every solution notebook beside the grading tests that a cut-off
# `PART=unit` run of gpu_jobs/test_gpu.sh left unrun.
set -u
dest="$OUT/final"
mkdir -p "$dest"
export LABKERNELS_FAILURE_LOG="$dest/failures.log"
start=$SECONDS
timeout 150 python gpu_jobs/ch06_lesson.py "$dest" > "$dest/ch06_bench.log" 2>&1
echo "ch06 bench rc=$? in $((SECONDS - start)) s"; tail -12 "$dest/ch06_bench.log"
GRADE_TIMEOUT_S=240 RUN_TIMEOUT_S=220 bash gpu_jobs/grade_solutions.sh
echo "graded at $((SECONDS - start)) s"
left="test_shards_graded_apart or test_output_folder_inside or past_its_time_limit or rewrite_the_grader or \
rewrites_the_grader or test_records_written or environment_does_not_reach or processes_the_notebook_started or \
possible_total_counts or duplicate_and_misnamed or pythonpath"
(
  timeout 200 python -m pytest -q -p no:cacheprovider -n 3 --dist loadfile -k "$left" tests/test_grading_class.py \
    tests/test_grading_attacks.py tests/test_grading_sandbox.py > "$dest/grading_tests.log" 2>&1
  echo "grading tests left by the unit run rc=$?" > "$dest/grading_tests.rc"
) &
MPLBACKEND=module://matplotlib_inline.backend_inline timeout 200 python -m pytest -q -p no:cacheprovider -n 8 \
  --dist loadfile --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
  notebooks/06_flash_attention.ipynb solutions > "$dest/nbval.log" 2>&1
echo "nbval (notebook 06, solutions) rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/nbval.log" | tail -12
wait
cat "$dest/grading_tests.rc"; grep -E "^(FAILED|ERROR)|passed|failed" "$dest/grading_tests.log" | tail -12
echo "all in $((SECONDS - start)) s"
