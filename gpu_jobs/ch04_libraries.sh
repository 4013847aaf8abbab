#!/usr/bin/env bash
# Chapter 04 (libraries half): GPU tests, then the four benchmarks; CSVs go to $OUT/ch04_libraries/.
# Run from the repository root on the H200. Budget: under 3 minutes (each step also has its own timeout).
set -u
OUT="${OUT:?set OUT to an output folder}"
DEST="$OUT/ch04_libraries"
mkdir -p "$DEST"
failed=()

step() {  # step NAME SECONDS CMD...: run one step; a failure is reported, the next step still runs
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  if timeout "$limit" "$@" >"$DEST/$name.log" 2>&1; then
    echo "ok    $name ($((SECONDS - start)) s)"
  else
    echo "FAIL  $name ($((SECONDS - start)) s): last lines:"
    tail -n 8 "$DEST/$name.log" | sed 's/^/      /'
    failed+=("$name")
    return 1
  fi
}

main() {
  step tests 40 python -m pytest -q -x -p no:cacheprovider -m gpu tests/test_ch04_model.py
  tail -n 1 "$DEST/tests.log" | sed 's/^/      /'
  for name in ch04_tf32 ch04_cudnn ch04_wave ch04_gemm_sweep; do
    # a failed step leaves no CSV in $DEST (not even the one shipped in the repository)
    step "$name" 75 python -m labkernels bench "$name" && cp "labkernels/reference/$name.csv" "$DEST/"
  done
  python - "$DEST" <<'PY' || echo "summary failed"
import sys
from pathlib import Path

from labkernels.results import load

dest = Path(sys.argv[1])


def table(name):
    path = dest / f"{name}.csv"
    return load(path) if path.exists() else None


t = table("ch04_tf32")
if t:
    for r in t.rows:
        print(f"tf32  {r['op']:8} {r['shape']:>14} {r['precision']:9} {r['tflops']:8.1f} TFLOP/s  rel_err {r['rel_err']:.1e}")
c = table("ch04_cudnn")
if c:
    for r in c.where(kind="first_call").rows + c.where(kind="changing_shapes").rows:
        print(f"cudnn {r['kind']:15} benchmark={r['benchmark']!s:5} C={r['channels']:3} first {r['first_ms']:8.1f} ms  steady {r.get('steady_ms') or 0:.3f} ms")
    for r in c.where(kind="layout", layout="channels_last").rows:
        print(f"cudnn layout {r['precision']:8} C={r['channels']:3} NHWC {r['tflops']:6.1f} TFLOP/s x{r['speedup_vs_nchw']:.2f} vs NCHW  break-even {r['break_even_uses']:.2f} uses  {r['algorithm']}")
w = table("ch04_wave")
if w:
    print("wave  n:ms:tile " + " ".join(f"{r['n']}:{r['ms']:.3f}:{r['tile']}" for r in w.rows[::8]))
g = table("ch04_gemm_sweep")
if g:
    for r in g.rows:
        print(f"gemm  {r['m']:5}x{r['n']:5}x{r['k']:5} {r['precision']:9} {r['tflops']:7.1f} TFLOP/s  {r['tile']:>10} splitK={r['split_k']} {r['kernel'][:50]}")
PY
  if ((${#failed[@]})); then echo "failed steps: ${failed[*]}"; else echo "all steps passed"; fi
}

export -f step
timeout 170 bash -c "$(declare -f main); DEST='$DEST'; failed=(); main" || echo "ch04_libraries job stopped at its 170 s limit"
