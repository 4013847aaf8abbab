#!/usr/bin/env bash
# The TORCH_CHECK-with-numbers regression on the GPU image, and the probe's view of the course's link.
set -u
mkdir -p "$OUT/ch01_numbers"
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_ch01_ch02_hardening.py -k "streams_numbers or libstdcxx" 2>&1 | tail -5
timeout 60 python -m labkernels.ch01_jit.abi_probe > "$OUT/ch01_numbers/probe.log" 2>&1; tail -6 "$OUT/ch01_numbers/probe.log"
