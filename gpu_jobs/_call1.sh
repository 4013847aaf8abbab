#!/usr/bin/env bash
# one-off: split-K one launch + plans on the H200: tests, sanitizer, host cost, ch04_matmul bench
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LABKERNELS_GIT_REV=${REV}
mkdir -p $OUT/r
nvidia-smi --query-gpu=name --format=csv,noheader
start=$SECONDS
timeout 150 python -m pytest -q -x -p no:cacheprovider tests/test_ch04_kernels.py -k "matmul or split or plan or workspace or beyond or refuse or auto" > $OUT/r/tests.log 2>&1
echo "tests rc=$? in $((SECONDS-start)) s"; tail -3 $OUT/r/tests.log
start=$SECONDS
for tool in memcheck racecheck; do
  timeout 90 python -m labkernels.sanitize --only 'ch04.matmul$' --tool $tool > $OUT/r/san_$tool.log 2>&1
  echo "sanitize $tool rc=$? in $((SECONDS-start)) s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|entries ok|FAIL" $OUT/r/san_$tool.log | tail -3
done
timeout 80 python - <<'PY' > $OUT/r/host.log 2>&1
import torch
from labkernels import timing
from labkernels.ch04_libraries import splitk
for m, n, k in [(16, 4096, 4096), (4096, 16, 4096), (128, 128, 65536), (1024, 1024, 1024), (64, 64, 64)]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    for kw in ({}, {"kernel": "split_k"}, {"kernel": "split_k", "deterministic": True}):
        c = splitk.matmul(a, b, **kw); c = splitk.matmul(a, b, **kw)
        err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
        ours = timing.host_us(lambda: splitk.matmul(a, b, **kw), calls=1000)
        lib = timing.host_us(lambda: a @ b, calls=1000)
        g = timing.graph_ms(lambda: splitk.matmul(a, b, **kw)); gl = timing.graph_ms(lambda: a @ b)
        p = timing.time_ms(lambda: splitk.matmul(a, b, **kw)); pl = timing.time_ms(lambda: a @ b)
        print(f"{m}x{n}x{k} {kw}: host {ours:.1f} us vs torch {lib:.1f} us; graph {g*1e3:.2f} vs {gl*1e3:.2f} us; plain {p*1e3:.2f} vs {pl*1e3:.2f} us; rel err {err:.1e}", flush=True)
PY
echo "host rc=$?"; cat $OUT/r/host.log
start=$SECONDS
BENCH_TIMEOUT_S=200 bash gpu_jobs/ch04_matmul_bench.sh > $OUT/r/bench.log 2>&1
echo "bench rc=$? in $((SECONDS-start)) s"; tail -16 $OUT/r/bench.log
cp $OUT/ch04_matmul/*.csv $OUT/r/ 2>/dev/null; rm -rf $OUT/ch04_matmul

