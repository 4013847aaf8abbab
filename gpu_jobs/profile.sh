#!/usr/bin/env bash
# labkernels.profile on the H200: ncu's metric list (to confirm the names), one case through the CLI, then the
# profiler benchmarks (ch02_profile, ch03_profile, ch04_profile) and the timed ch03_grouping, CSVs to
# $OUT/profile/. Expected ~5 min with .torch_extensions carried (the CUDA extension build adds ~70 s cold):
# 18 cases, each one process under ncu (~10 s: import, compile, a few replay passes of one launch).
set -u
dest="$OUT/profile"
mkdir -p "$dest/reports"
ncu=$(python -c "import labkernels.profile as p; print(p.ncu_path() or '')")
echo "ncu: ${ncu:-not found}"; [ -n "$ncu" ] && "$ncu" --version | tail -1
"$ncu" --query-metrics > "$dest/query_metrics.txt" 2>&1
"$ncu" --query-metrics --chip gh100 > "$dest/query_metrics_gh100.txt" 2>&1
"$ncu" --query-metrics-mode suffix --chip gh100 \
  --metrics dram__bytes_read,lts__t_sector_hit_rate,sm__pipe_tensor_op_gmma_cycles_active,sm__pipe_tensor_op_hmma_cycles_active,launch__occupancy_limit_registers \
  > "$dest/query_suffixes.txt" 2>&1
echo "metric list: $(wc -l < "$dest/query_metrics.txt") lines; launch__ listed: $(grep -c '^launch__' "$dest/query_metrics.txt")"
python - <<'PY' > "$dest/names_check.txt" 2>&1
import labkernels.profile as p
known = p.known_metrics(p.ncu_path())
asked = sorted({m for ms in p.QUESTIONS.values() for m in ms} | {p.TIME})
print("unknown to this ncu's list:", p._unknown(asked, known))
PY
cat "$dest/names_check.txt"
start=$SECONDS
timeout 120 python -m labkernels.profile profile ch02.transpose_cuda_tiled --keep "$dest/reports" > "$dest/cli.log" 2>&1
echo "CLI profile ch02.transpose_cuda_tiled: rc=$? in $((SECONDS - start)) s"; tail -8 "$dest/cli.log"
for name in ch02_profile ch03_profile ch04_profile ch03_grouping; do
  start=$SECONDS
  LABKERNELS_NCU_REPORTS="$dest/reports" timeout "${PROFILE_LIMIT_S:-200}" python -m labkernels bench "$name" \
    > "$dest/$name.log" 2>&1
  echo "bench $name: rc=$? in $((SECONDS - start)) s"; grep -iE "warn|error" "$dest/$name.log" | head -5
  cp labkernels/reference/"$name".csv "$dest/" 2>/dev/null || { echo "  (no CSV)"; tail -5 "$dest/$name.log"; }
done
python - <<'PY'
import labkernels.profile as p
from labkernels.results import load
from pathlib import Path
import os
for name in ("ch02_profile", "ch03_profile", "ch04_profile", "ch03_grouping"):
    path = Path(os.environ["OUT"]) / "profile" / f"{name}.csv"
    if path.exists():
        print(f"--- {name}")
        print(p.summary(load(path)) if name.endswith("profile") else load(path))
PY
