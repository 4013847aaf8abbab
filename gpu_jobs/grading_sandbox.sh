#!/usr/bin/env bash
# Issue 42 on the H200: the grading sandbox starts there (unshare, no bwrap), CUDA works inside it, and every
# chapter's solutions still score full when graded sandboxed (gpu_jobs/grade_solutions.sh, speed cases
# included). About 3 minutes. Logs in $OUT/grading_sandbox/ and $OUT/grade_solutions/.
set -u
dest="$OUT/grading_sandbox"
mkdir -p "$dest"
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_grading_sandbox.py \
  -k "out_of_reach or undone or refuses or collide or cache or venv" > "$dest/tests.log" 2>&1
echo "sandbox tests rc=$?"; tail -3 "$dest/tests.log"
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python gpu_jobs/cuda_in_sandbox.py > "$dest/cuda_inside.log" 2>&1
echo "CUDA inside the sandbox (expects pid 1, sum 8.0): rc=$?"; tail -1 "$dest/cuda_inside.log"
bash gpu_jobs/grade_solutions.sh
grep -h '"sandbox"' "$OUT"/grade_solutions/grades/students/*.json | sort | uniq -c
