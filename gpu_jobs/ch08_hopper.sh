#!/usr/bin/env bash
# Chapter 08 on the H200: correctness of the Gluon kernels (TMA copy, warp-specialized GEMM, FA3-style
# forward), then copy bandwidth against torch, the GEMM against cuBLAS, the attention forward against cuDNN
# and chapter 06, the GEMM's and the attention forward's timelines inside one program, and the FP8 GEMM
# against torch._scaled_mm. CSVs to $OUT (ch08_correctness, ch08_copy, ch08_gemm, ch08_attention,
# ch08_timeline, ch08_attention_timeline, ch08_fp8) and the log to $OUT/ch08_job.log. Each step is its own
# process with its own timeout, so a kernel that fails to compile, faults or hangs costs only its step. The
# timeouts add up to 575 s (copy check 35, two GEMM checks 40 each, attention check 90, copy bench 30, GEMM
# bench 60, attention bench 120, timelines 30 and 40, FP8 check 40 and bench 40, merge 10); the unit tests
# run after them only if at least 40 s of a CH08_BUDGET_S (600 s) budget remain. Measured on the H200
# (2026-12-04, every step, no unit tests): 175 s.
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
step check-attention 90 check-attention
step bench-copy 30 bench-copy
step bench-gemm 60 bench-gemm
step bench-attention 120 bench-attention
step timeline 30 timeline
step attention-timeline 40 attention-timeline
step check-fp8 40 check-fp8
step bench-fp8 40 bench-fp8
step merge 10 merge
grep -E "^(correctness|copy|gemm|attention|fp8) |geometric mean|Error|error" "$LOG" | tail -60

left=$(( ${CH08_BUDGET_S:-600} - ($(date +%s) - start) ))  # CH08_BUDGET_S=0: no unit tests
if [ "$left" -ge 40 ]; then
    echo "== GPU tests (tests/test_ch08_hopper.py, $left s left)" | tee -a "$LOG"
    timeout "$left" python -m pytest -q -x -p no:cacheprovider tests/test_ch08_hopper.py >> "$LOG" 2>&1 || failed+=("tests(rc=$?)")
    tail -5 "$LOG"
fi
echo "== done in $(( $(date +%s) - start )) s; failed: ${failed[*]:-none}" | tee -a "$LOG"
