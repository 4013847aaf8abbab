#!/usr/bin/env bash
# Chapters 01-02 hardening (issue 12) on the GPU lane: build the course's C++/CUDA extension, then run the
# gpu-marked tests of tests/test_ch01_jit.py, tests/test_ch02_strides.py and tests/test_ch01_ch02_hardening.py
# (every kernel past 2^31 elements, each in its own process, four at a time; NaN/inf against torch;
# overlap, autograd), the regression tests of the TORCH_CHECK-with-numbers crash (not gpu-marked: they run
# on both lanes; here they are the H200 check that the private libstdc++ link fixes it) and the probe of that
# crash (labkernels.ch01_jit.abi_probe), side by side, each under `timeout 200`. It took 42 s on the H200
# (the cold extension build took 7.8 s in labkernels/reference/ch01_build.csv); it ends within ~3.5 minutes
# in any case. Logs and JUnit XML: $OUT/ch01_ch02/.
# Run from the repository root: OUT=/some/dir bash gpu_jobs/ch01_ch02.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/labkernels_out}
DIR="$OUT/ch01_ch02"
mkdir -p "$DIR"
PY=${PYTHON:-python}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}
export PATH="$(dirname "$(command -v "$PY")"):$PATH"
start=$(date +%s)

# 1. The extension (cold or cached): the tests and the probe then load it.
timeout 200 "$PY" -c 'from labkernels.ch01_jit import build, ops; ops.load(); print(build.LAST_BUILD)' \
    >"$DIR/build.log" 2>&1
echo $? >"$DIR/build.rc"

# 2. The probe (it builds two tiny extensions with torch headers) and the crash's regression tests beside the
#    gpu-marked tests.
timeout 200 "$PY" -m labkernels.ch01_jit.abi_probe >"$DIR/probe.log" 2>&1 &
probe_pid=$!
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfEs --junitxml="$DIR/numbers.xml" \
    tests/test_ch01_ch02_hardening.py -k "streams_numbers or libstdcxx" >"$DIR/numbers.log" 2>&1 &
numbers_pid=$!
timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfEs --junitxml="$DIR/tests.xml" -m gpu \
    tests/test_ch01_jit.py tests/test_ch02_strides.py tests/test_ch01_ch02_hardening.py \
    --deselect tests/test_ch01_ch02_hardening.py::test_streamed_numbers_in_a_check_message_raise \
    >"$DIR/tests.log" 2>&1
echo $? >"$DIR/tests.rc"
wait "$probe_pid"
echo $? >"$DIR/probe.rc"
wait "$numbers_pid"
echo $? >"$DIR/numbers.rc"

echo "ch01_ch02 on $("$PY" -c 'import torch; print(torch.cuda.get_device_name())' 2>/dev/null), \
torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null), \
triton $("$PY" -c 'import triton; print(triton.__version__)' 2>/dev/null)"
failed=()
for name in build tests numbers probe; do
    rc=$(cat "$DIR/$name.rc" 2>/dev/null || echo missing)
    summary=$(tail -1 "$DIR/$name.log")
    [ "$rc" = 124 ] && summary="TIMED OUT after 200 s; $summary"
    echo "  $name: exit $rc: $summary"
    [ "$rc" != 0 ] && failed+=("$name")
done
grep -hE "^(FAILED|ERROR)" "$DIR/tests.log" "$DIR/numbers.log" | head -20 | sed 's/^/    /'
echo "  probe (TORCH_CHECK with numbers):"
sed 's/^/    /' "$DIR/probe.log" | tail -8
echo "  took $(($(date +%s) - start)) s; failed steps: ${failed[*]:-none}"
