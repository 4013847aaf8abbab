#!/usr/bin/env bash
# The grader's replayed clock on the H200 (to $OUT/replay/), in about 6 minutes: the replay and clock-attack
# tests, the GPU paths changed since the last full run (torch.library ops of chapters 05-06 under opcheck and
# torch.compile, the split softmax's forced fallback), then every chapter's solutions graded sandboxed with
# their speed cases (gpu_jobs/grade_solutions.sh), which now time every Triton answer by replay.
set -u
dest="$OUT/replay"
mkdir -p "$dest"
export LABKERNELS_FAILURE_LOG="$dest/failures.log"
start=$SECONDS
timeout 240 python -m pytest -q -p no:cacheprovider -n 6 --dist loadfile \
  "tests/test_grading.py::test_a_triton_answer_is_timed_by_the_grader_s_replay_of_its_kernels" \
  "tests/test_grading.py::test_a_clock_patched_in_the_answer_s_process_moves_no_replayed_time" \
  "tests/test_grading.py::test_speed_case_runs_on_the_gpu" \
  "tests/test_grading.py::test_crashing_submission_is_reported_and_scores_zero" \
  tests/test_ch05_fusion.py tests/test_ch06_attention.py -k "replay or patched_clock or speed_case_runs or \
  crashing or opcheck or compiles_fullgraph or under_compile or forced_fallback" \
  > "$dest/tests.log" 2>&1
echo "replay, compile-path and forced-fallback tests rc=$? in $((SECONDS - start)) s"
grep -E "^(FAILED|ERROR)|passed|failed" "$dest/tests.log" | tail -15
OUT="$dest" GRADE_TIMEOUT_S=${GRADE_TIMEOUT_S:-300} bash gpu_jobs/grade_solutions.sh
grep -iE "replay|clock" "$dest/grade_solutions/grade.log" | head -10
echo "all in $((SECONDS - start)) s"
