#!/usr/bin/env bash
# Exercise 6.4 (dQ with grouped-query heads and n_q != n_k) on the H200, about 2 minutes: the chapter 06
# solutions graded alone with --expect full (the speed case included: at least 0.7x the chapter's dQ kernel at
# (4, 16, 4096, 64) fp16), then the 6.4 grader tests of tests/test_ch06_attention.py. Report and log in
# $OUT/ch06_ex64/.
set -u
OUT="${OUT:-/tmp/out}"
dest="$OUT/ch06_ex64"
mkdir -p "$dest"
export PYTHONUNBUFFERED=1
folder=$(mktemp -d)/ch06
mkdir -p "$folder" && cp solutions/06_flash_attention.ipynb "$folder/"
start=$SECONDS
timeout 150 python -m labkernels grade "$folder" --chapters 06 --expect full --cell-timeout 140 \
  --json "$dest/grade.json" > "$dest/grade.log" 2>&1
echo "grade solutions/06 --expect full: rc=$? in $((SECONDS - start)) s"
grep -E "6\.4|TOTAL" "$dest/grade.log"
python - "$dest/grade.json" <<'PY'
import json
import sys


def records(node):
    """Every exercise record in the report, wherever it nests."""
    if isinstance(node, dict):
        if node.get("exercise") == "6.4" and "cases" in node:
            yield node
        for value in node.values():
            yield from records(value)
    elif isinstance(node, list):
        for value in node:
            yield from records(value)


for rec in records(json.load(open(sys.argv[1]))):
    print(f"6.4 {'speed' if rec['speed'] else 'correctness'}: {rec['earned']}/{rec['possible']}")
    for case in rec["cases"]:
        print(f"  {case['status']:5s} {case['case']}  {case['reason'][:300]}")
PY
start=$SECONDS
timeout 80 python -m pytest -q -p no:cacheprovider tests/test_ch06_attention.py -k "dq_grader or graders_fail" \
  > "$dest/tests.log" 2>&1
echo "6.4 grader tests: rc=$? in $((SECONDS - start)) s"
tail -3 "$dest/tests.log"
