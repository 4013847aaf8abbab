#!/usr/bin/env bash
# Issue 42 on the H200: the grading sandbox starts there (unshare, no bwrap), CUDA works inside it, and every
# chapter's solutions still score full when graded sandboxed (gpu_jobs/grade_solutions.sh, speed cases
# included). About 3 minutes. Logs in $OUT/grading_sandbox/ and $OUT/grade_solutions/.
set -u
dest="$OUT/grading_sandbox"
mkdir -p "$dest"
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_grading_sandbox.py \
  -k "out_of_reach or undone or refuses or collide or cache or venv" > "$dest/tests.log" 2>&1
echo "sandbox tests rc=$?"; tail -3 "$dest/tests.log"
python - > "$dest/cuda_inside.log" 2>&1 <<'PY'
import os, subprocess, sys, tempfile
from labkernels.grading import isolation
from labkernels.grading.remote import PACKAGE_ROOT

with tempfile.TemporaryDirectory() as tmp:
    os.mkdir(f"{tmp}/root"); os.mkdir(f"{tmp}/shared")
    code = "import os, torch; x = torch.ones(4, device='cuda'); print(os.getpid(), float((x * 2).sum()))"
    cmd = isolation.prefix([f"{tmp}/shared"], PACKAGE_ROOT, f"{tmp}/root") + [sys.executable, "-c", code]
    proc = subprocess.run(cmd, cwd=f"{tmp}/shared", capture_output=True, text=True, timeout=120)
    print(proc.returncode, proc.stdout.strip(), proc.stderr[-500:])
    sys.exit(0 if proc.stdout.strip() == "1 8.0" else 1)
PY
echo "CUDA inside the sandbox (expects pid 1, sum 8.0): rc=$?"; tail -1 "$dest/cuda_inside.log"
bash gpu_jobs/grade_solutions.sh
grep -h '"sandbox"' "$OUT"/grade_solutions/grades/students/*.json | sort | uniq -c
