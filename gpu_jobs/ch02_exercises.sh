#!/usr/bin/env bash
# Exercises 2.2 and 2.3 on the H200 (about 1-2 minutes): tests/test_ch02_exercises.py on the GPU lane, then the
# solutions' answers graded with 2.3's speed case. Writes $OUT/ch02_exercises/{pytest.log,ch02_exercises_grades.csv}.
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/ch02_exercises"
PY="${PYTHON:-python}"
[ -x .venv/bin/python ] && PY=.venv/bin/python
timeout 120 $PY -m pytest -q -p no:cacheprovider tests/test_ch02_exercises.py > "$OUT/ch02_exercises/pytest.log" 2>&1
echo "tests/test_ch02_exercises.py: rc=$?"; tail -3 "$OUT/ch02_exercises/pytest.log"
timeout 120 $PY gpu_jobs/ch02_exercises.py
echo "grade 2.2/2.3 (speed included): rc=$?"
