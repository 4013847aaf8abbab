#!/usr/bin/env bash
# `make grade` on a class (issue 17): the class tests, then a class of $N students (a third the solutions, a
# third the exercises, a third the solutions with each chapter's first answer broken) graded on chapters
# $CHAPTERS with -j $J (speed cases of chapter 03 afterwards, one at a time), then graded again (every notebook
# cached). Writes $OUT/grading_class/{gradebook.csv,gradebook-long.csv,nbgrader.csv,timings.txt}. About 6-9
# minutes on the H200; on the 2-core CPU machine give it RUN_TIMEOUT_S=1500 J=2.
set -u
N=${N:-30}
J=${J:-8}
CHAPTERS=${CHAPTERS:-00,03}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-400}  # per grading run; on the 2-core CPU machine give it more
dest="$OUT/grading_class"
mkdir -p "$dest"
work=$(mktemp -d)

if [ -z "${SKIP_CLASS_TESTS:-}" ]; then  # SKIP_CLASS_TESTS=1: only the class (the tests ran already)
  timeout 240 python -m pytest -q -x -p no:cacheprovider tests/test_grading_class.py > "$dest/pytest.log" 2>&1 \
    && echo "tests/test_grading_class.py: passed" || { echo "tests/test_grading_class.py: FAILED"; tail -15 "$dest/pytest.log"; }
fi

python - "$work/class" "$N" "$CHAPTERS" <<'EOF' || echo "building the class FAILED"
import shutil, sys
from pathlib import Path
import nbformat
klass, n, chapters = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")
for i in range(n):
    kind = ("solution", "stub", "broken")[i % 3]
    folder = klass / f"student{i:02d}_{kind}"
    folder.mkdir(parents=True)
    for ch in chapters:
        for src in Path("solutions" if kind != "stub" else "exercises").glob(f"{ch}_*.ipynb"):
            nb = nbformat.read(src, as_version=4)
            if kind == "broken":  # the first answer's cell raises before it defines anything: that exercise
                # scores zero (the function is missing), a stray raising cell elsewhere costs nothing
                first = next(c for c in nb.cells if c.cell_type == "code" and "### BEGIN SOLUTION" in c.source)
                first.source = "raise RuntimeError('broken on purpose')\n" + first.source
            nbformat.write(nb, folder / src.name)
print(f"class of {n} in {klass}")
EOF

for run in first again; do
  start=$SECONDS
  timeout $((RUN_TIMEOUT_S + 20)) python -m labkernels grade "$work/class" --chapters "$CHAPTERS" -j "$J" \
    --out "$work/grades" --export nbgrader --run-timeout "$RUN_TIMEOUT_S" > "$dest/grade_$run.log" 2>&1
  rc=$?
  echo "grade ($run run, -j $J, $N students, chapters $CHAPTERS): rc=$rc in $((SECONDS - start)) s" \
    | tee -a "$dest/timings.txt"
  head -2 "$dest/grade_$run.log"
done
cp "$work"/grades/*.csv "$dest/" 2>/dev/null || echo "no gradebook written"
python - "$dest/gradebook-long.csv" <<'EOF' || true
import csv, sys
from collections import Counter
rows = list(csv.DictReader(open(sys.argv[1])))
speed = [r for r in rows if r["part"] == "speed"]
print(f"speed cases graded: {len(speed)}; earned on solutions:",
      sum(float(r["earned"]) for r in speed if "solution" in r["student"]), "of",
      sum(float(r["possible"]) for r in speed if "solution" in r["student"]))
totals = Counter()
for r in rows:
    totals[r["student"].split("_")[1]] += float(r["earned"])
print("earned by kind:", dict(totals))
EOF
rm -rf "$work"
