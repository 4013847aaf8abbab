#!/usr/bin/env bash
# Chapter 05 on the H200: GPU tests, then the fusion and launch benchmarks; CSVs copied to $OUT/ch05/.
# Run from the repo root with $OUT set. Under 5 minutes: the steps' timeouts add up to 295 s (tests 50,
# the fusion bench 120 — about a dozen torch.compile graphs plus the matmul autotuning —, the int8 paths
# over M 90, launch 25, summary 10).
set -u
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT/ch05"
failed=()
start=$(date +%s)

echo "== GPU tests (tests/test_ch05_fusion.py)"
timeout 50 python -m pytest -q -x -p no:cacheprovider tests/test_ch05_fusion.py > "$OUT/ch05/tests.log" 2>&1
rc=$?
tail -15 "$OUT/ch05/tests.log"
[ "$rc" = 0 ] || failed+=("tests(rc=$rc)")

echo "== bench ch05_fusion (t=$(( $(date +%s) - start )) s)"
timeout 120 python -m labkernels bench ch05_fusion > "$OUT/ch05/bench_fusion.log" 2>&1 || failed+=("bench ch05_fusion(rc=$?)")
tail -5 "$OUT/ch05/bench_fusion.log"

echo "== bench ch05_int8_paths (t=$(( $(date +%s) - start )) s)"
timeout 90 python -m labkernels bench ch05_int8_paths > "$OUT/ch05/bench_int8_paths.log" 2>&1 || failed+=("bench ch05_int8_paths(rc=$?)")
tail -5 "$OUT/ch05/bench_int8_paths.log"

echo "== bench ch05_launch (t=$(( $(date +%s) - start )) s)"
timeout 25 python -m labkernels bench ch05_launch > "$OUT/ch05/bench_launch.log" 2>&1 || failed+=("bench ch05_launch(rc=$?)")
tail -5 "$OUT/ch05/bench_launch.log"

cp labkernels/reference/ch05_*.csv "$OUT/ch05/" 2>/dev/null || true

echo "== summary (t=$(( $(date +%s) - start )) s)"
timeout 10 python - <<'PY' || failed+=("summary")
import labkernels  # noqa: F401
from labkernels.ch05_fusion.bench import summary
from labkernels.results import Table, load_reference

fusion = load_reference("ch05_fusion")
if fusion is not None:
    print(summary(fusion))
    matmuls = Table(
        {k: r.get(k) for k in ("kind", "shape", "impl", "ms", "tflops", "speedup_vs_eager", "ratio_vs_compile")}
        for r in fusion.rows
        if r["kind"] in ("matmul_bias_gelu", "int8_matmul")
    )
    print(matmuls)
    sweep = fusion.where(kind="chain_sweep")
    print(Table({k: r[k] for k in ("n_ops", "n", "impl", "gbps", "fraction_of_copy")} for r in sweep.rows))
launch = load_reference("ch05_launch")
if launch is not None:
    print(Table({k: r.get(k) for k in ("table", "op", "step", "impl", "host_us")} for r in launch.rows))
PY

echo "== done in $(( $(date +%s) - start )) s; failed: ${failed[*]:-none}"
