#!/usr/bin/env bash
# Host cost per call of the chapter 03 ops against torch's (the ch03_launch reference), on the GPU.
set -u
mkdir -p "$OUT/ch03_launch"
timeout 120 python -m labkernels bench ch03_launch && cp labkernels/reference/ch03_launch.csv "$OUT/ch03_launch/"
python - <<'PY'
from labkernels.results import load
for r in load("labkernels/reference/ch03_launch.csv"):
    print({k: v for k, v in r.items() if k not in ("device", "torch", "triton", "cuda", "date", "git")})
PY
