#!/usr/bin/env bash
# labkernels.profile for chapters 05 and 06 on the H200: records ch05_profile (7 cases: fused chains of 2, 15
# and 60 ops, eager chains of 2 and 15, RMSNorm at 4096 and 65536 columns) and ch06_profile (3 cases: naive,
# labkernels and SDPA-FLASH attention) into labkernels/reference/, copies the CSVs to
# $OUT/profile56/ and prints the tables. Expected ~2-3 min (each case one process under ncu: import, compile or
# tune, a few replay passes); each table is cut off at $PROFILE56_LIMIT_S (default 110 s).
set -u
dest="$OUT/profile56"
mkdir -p "$dest"
ncu=$(python -c "import labkernels.profile as p; print(p.ncu_path() or '')")
echo "ncu: ${ncu:-not found}"; [ -n "$ncu" ] && "$ncu" --version | tail -1
# Whether `make bench` finds the two tables by itself (it does once each chapter's bench.py imports profiles).
python -c "from labkernels import bench; f = bench.discover(); print('make bench finds:', [n for n in ('ch05_profile', 'ch06_profile') if n in f])"
for spec in ch05_profile:ch05_fusion ch06_profile:ch06_attention; do
  name=${spec%%:*} chapter=${spec##*:}
  start=$SECONDS
  # Imports the chapter's profiles module first, so this works whether or not bench.py imports it yet.
  timeout "${PROFILE56_LIMIT_S:-110}" python -c \
    "import labkernels.$chapter.profiles; from labkernels import bench; bench.run(['$name'])" \
    > "$dest/$name.log" 2>&1
  echo "bench $name: rc=$? in $((SECONDS - start)) s"; grep -iE "warn|error|Traceback" "$dest/$name.log" | head -5
  cp labkernels/reference/"$name".csv "$dest/" 2>/dev/null || { echo "  (no CSV)"; tail -15 "$dest/$name.log"; }
done
python - <<'PY'
import os
from pathlib import Path

import labkernels.profile as p
from labkernels.results import load

for name, questions in (("ch05_profile", (["dram"], ["spills", "occupancy"])), ("ch06_profile", (["dram"], ["tensor_pipe"]))):
    path = Path(os.environ["OUT"]) / "profile56" / f"{name}.csv"
    if not path.exists():
        continue
    table = load(path)
    for q in questions:
        print(f"--- {name} {'+'.join(q)}")
        print(p.summary(table, q))
PY
