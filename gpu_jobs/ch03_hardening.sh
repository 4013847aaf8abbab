#!/usr/bin/env bash
# Chapter 03 hardening (issue 12) on the GPU lane: every Triton kernel of chapter 03 above 2^31 elements
# (vector_add, add_relu, softmax, matmul; each in its own process, < 20 GB of GPU memory each), NaN/inf
# against torch in compiled code, autograd and torch.compile, overlap and argument errors; then the rest of
# tests/test_ch03_*.py. The two pytest runs go side by side (one GPU is plenty) under `timeout 200` each,
# so the job ends within ~3.5 minutes. Logs and JUnit XML: $OUT/ch03_hardening/.
# Run from the repository root: OUT=/some/dir bash gpu_jobs/ch03_hardening.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/labkernels_out}
DIR="$OUT/ch03_hardening"
mkdir -p "$DIR"
PY=${PYTHON:-python}
start=$(date +%s)

run() {  # run NAME ARGS...: one pytest under timeout 200, output to NAME.log, exit status to NAME.rc
    local name=$1
    shift
    timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfEs --junitxml="$DIR/$name.xml" "$@" \
        >"$DIR/$name.log" 2>&1
    echo $? >"$DIR/$name.rc"
}

# 1. The sizes past 2^31 elements (gpu-marked, subprocesses).
run big -m gpu tests/test_ch03_hardening.py -k above_2_to_31 &
big_pid=$!
# 2. Everything else of chapter 03 on the GPU: NaN/inf, autograd, compile, errors, and the original tests.
run rest tests/test_ch03_triton.py tests/test_ch03_hardening.py -k "not above_2_to_31"
wait "$big_pid"

echo "ch03_hardening on $("$PY" -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null), \
torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null), \
triton $("$PY" -c 'import triton; print(triton.__version__)' 2>/dev/null)"
failed=()
for name in big rest; do
    rc=$(cat "$DIR/$name.rc" 2>/dev/null || echo missing)
    summary=$(grep -E "(passed|failed|error|skipped)" "$DIR/$name.log" | tail -1)
    [ "$rc" = 124 ] && summary="TIMED OUT after 200 s; $summary"
    echo "  $name: exit $rc: $summary"
    if [ "$rc" != 0 ]; then
        failed+=("$name")
        grep -E "^(FAILED|ERROR)" "$DIR/$name.log" | head -20 | sed 's/^/    /'
    fi
done
echo "  total $(($(date +%s) - start)) s; logs in $DIR"
if [ ${#failed[@]} -eq 0 ]; then
    echo "ch03_hardening: PASS"
else
    echo "ch03_hardening: FAIL (${failed[*]}); see $DIR/<name>.log"
    exit 1
fi
