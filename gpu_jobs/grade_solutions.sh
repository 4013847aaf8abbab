#!/usr/bin/env bash
# `grade solutions --expect full` on the GPU lane in about 2 minutes: each chapter's solution notebook in its
# own folder, the folders graded as a class with -j 7 (chapters in parallel, speed cases one at a time after),
# then every folder's own chapter must score full marks, speed cases included. A folder scores zero on the
# chapters it does not hold: only its own chapter is read. Gradebook and report in $OUT/grade_solutions/.
set -u
dest="$OUT/grade_solutions"
klass=$(mktemp -d)/class
mkdir -p "$dest"
for nb in solutions/[0-9][0-9]_*.ipynb; do
  folder="$klass/ch_$(basename "$nb" .ipynb)"
  mkdir -p "$folder" && cp "$nb" "$folder/"
done
start=$SECONDS
timeout "${GRADE_TIMEOUT_S:-300}" python -m labkernels grade "$klass" -j 7 --run-timeout "${RUN_TIMEOUT_S:-280}" \
  --out "$dest/grades" > "$dest/grade.log" 2>&1
echo "grade (every chapter's solutions, -j 7): rc=$? in $((SECONDS - start)) s"
python - "$dest/grades/gradebook-long.csv" <<'EOF'
import csv
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
own = [r for r in rows if r["exercise"].split(".")[0] == str(int(r["student"].split("_")[1]))]
totals = defaultdict(lambda: [0.0, 0.0])
for r in own:
    totals[(r["student"], r["part"])][0] += float(r["earned"])
    totals[(r["student"], r["part"])][1] += float(r["possible"])
for (student, part), (earned, possible) in sorted(totals.items()):
    print(f"{student:28s} {part:12s} {earned:g}/{possible:g}")
short = [r for r in own if float(r["earned"]) < float(r["possible"])]
for r in short:
    print("NOT FULL", r["student"], r["exercise"], r["part"], str(r.get("reason", ""))[:200])
sys.exit(1 if short or not own else 0)
EOF
echo "solutions full on every chapter: rc=$?"
