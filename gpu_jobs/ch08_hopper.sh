#!/usr/bin/env bash
# Chapter 08 on the H200: correctness of the Gluon kernels (TMA copy, warp-specialized GEMM), then copy
# bandwidth against torch and the GEMM against cuBLAS; CSVs to $OUT (ch08_correctness, ch08_copy, ch08_gemm)
# and the log to $OUT/ch08_job.log. Each step is its own process with its own timeout, so a kernel that
# fails to compile, faults or hangs costs only its step. Under 4 minutes: the timeouts add up to 215 s
# (copy check 35, two GEMM checks 40 each, copy bench 30, GEMM bench 60, merge 10); the unit tests run
# after them only if at least 40 s of a 225-s budget remain. Measured on the H200 (2026-12-03): 62 s in all.
set -u
OUT="${OUT:-/tmp/out}"
export OUT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export ROWS="$(mktemp -d)"
mkdir -p "$OUT"
LOG="$OUT/ch08_job.log"
failed=()
start=$(date +%s)
step() {  # step NAME TIMEOUT ARGS...
    local name=$1 limit=$2
    shift 2
    echo "== $name (t=$(( $(date +%s) - start )) s)" | tee -a "$LOG"
    timeout "$limit" python gpu_jobs/ch08_hopper.py "$@" >> "$LOG" 2>&1
    local rc=$?
    [ "$rc" = 0 ] || { failed+=("$name(rc=$rc)"); echo "   $name failed: rc=$rc" | tee -a "$LOG"; }
}

python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$LOG"
step check-copy 35 check-copy
step check-gemm-w8 40 check-gemm 128x256x64_s3_w8
step check-gemm-w4 40 check-gemm 128x128x64_s4_w4
step bench-copy 30 bench-copy
step bench-gemm 60 bench-gemm
step merge 10 merge
grep -E "^(correctness|copy|gemm) |geometric mean|Error|error" "$LOG" | tail -60

left=$(( 225 - ($(date +%s) - start) ))
if [ "$left" -ge 40 ]; then
    echo "== GPU tests (tests/test_ch08_hopper.py, $left s left)" | tee -a "$LOG"
    timeout "$left" python -m pytest -q -x -p no:cacheprovider tests/test_ch08_hopper.py >> "$LOG" 2>&1 || failed+=("tests(rc=$?)")
    tail -5 "$LOG"
fi
echo "== done in $(( $(date +%s) - start )) s; failed: ${failed[*]:-none}" | tee -a "$LOG"
