#!/usr/bin/env bash
# The FlashAttention backward with timed block shapes, on the GPU (about 6 minutes):
# 1. the backward's tests (gradients against fp64, the tuned configs at 4096 tokens), under `timeout 200`;
# 2. chapter 06's attention benchmark, in one process with a report of the backward configs it tuned for the
#    four must-show shapes, under `timeout 300`; the CSV goes to $OUT/flash_backward/ch06_attention.csv.
# Run from the repository root: OUT=/some/dir bash gpu_jobs/flash_backward.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/labkernels_out}
DIR="$OUT/flash_backward"
mkdir -p "$DIR"
PY=${PYTHON:-python}
failed=()

timeout 200 "$PY" -m pytest -q -p no:cacheprovider -rfEs tests/test_ch06_attention.py -k backward \
    >"$DIR/tests.log" 2>&1 || failed+=("tests")
echo "  tests: $(grep -E "(passed|failed|error)" "$DIR/tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)" "$DIR/tests.log" | head -20 | sed 's/^/    /'

timeout 300 "$PY" - >"$DIR/bench.log" 2>&1 <<'PY' || failed+=("bench")
import torch

from labkernels.ch06_attention import bench
from labkernels.ch06_attention import flash_attention as fa
from labkernels.cli import main

rc = main(["bench", "ch06_attention"])
for batch, heads, seq, head_dim, causal in bench.MUST_SHOW:
    q = torch.empty(batch, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16)
    dkdv, dq = fa.bwd_config(q, causal)  # tuned during the bench: cached
    print(f"backward configs D={head_dim} causal={causal}: dK/dV {dkdv}, dQ {dq}")
raise SystemExit(rc)
PY
cp labkernels/reference/ch06_attention.csv "$DIR/" || failed+=("csv")
grep "backward configs" "$DIR/bench.log" | sed 's/^/  /'
"$PY" - "$DIR/ch06_attention.csv" <<'PY' || failed+=("summary")
import sys

from labkernels.results import load

rows = [r for r in load(sys.argv[1]) if r["sweep"] == "training"]
ms = {(r["head_dim"], r["causal"], r["impl"]): float(r["ms"]) for r in rows}
for (d, causal, impl), t in sorted(ms.items()):
    if impl == "labkernels_fwd_bwd":
        flash = ms[(d, causal, "sdpa_flash_fwd_bwd")]
        print(f"  training D={d} causal={causal}: labkernels {t:.3f} ms, FLASH {flash:.3f} ms: {flash / t:.2f}x")
PY

if [ ${#failed[@]} -eq 0 ]; then echo "flash_backward: PASS"; else echo "flash_backward: FAIL (${failed[*]})"; exit 1; fi
