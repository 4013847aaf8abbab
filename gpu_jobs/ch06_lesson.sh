#!/usr/bin/env bash
# Chapter 06 after issue 48, on one H200 (under 4 minutes): the fuzz tests and the forced-fallback tests of the
# split softmax on the GPU, the chapter's attention tests, then forward and forward + backward against SDPA's
# FLASH and cuDNN backends at the four shapes of ch06_attention.csv in alternating rounds
# (gpu_jobs/ch06_lesson.py). Writes $OUT/ch06_lesson.csv and $OUT/ch06_lesson_tests.txt. Each step runs even
# if an earlier one failed.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
failed=()
export PYTHONUNBUFFERED=1
start=$SECONDS

# ~60 s: the GPU fuzz tests, the forced fallback (max_spin=0) of every split mode, the must-show shapes.
timeout 100 python -m pytest -q -p no:cacheprovider -rs tests/test_ch06_attention.py \
  -k "fuzz or fallback or negative_scale or nan_future or huge_future or ragged_padding or must_be_a_bool or second_order or rows_overlap or split_row_on_the_gpu or split_lean_on_the_gpu or empty_chunks or must_show" \
  2>&1 | tee "$OUT/ch06_lesson_tests.txt" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("tests")
echo "tests: $((SECONDS - start)) s"

# ~90 s: 4 shapes x (check + tune, 5 alternating rounds of forward, 5 of forward + backward).
timeout 130 python gpu_jobs/ch06_lesson.py "$OUT" || failed+=("bench")
echo "all steps: $((SECONDS - start)) s"

if [ ${#failed[@]} -gt 0 ]; then echo "FAILED steps: ${failed[*]}"; exit 1; fi
echo "ch06_lesson: all steps passed"
