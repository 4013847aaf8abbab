"""A process in the grading sandbox sees the GPU: it is PID 1 of its namespace and sums a CUDA tensor.
Prints the sandboxed process's exit code, output and stderr's tail; exits 0 when it printed "1 8.0"."""

import os
import subprocess
import sys
import tempfile

from labkernels.grading import isolation
from labkernels.grading.remote import PACKAGE_ROOT

with tempfile.TemporaryDirectory() as tmp:
    os.mkdir(f"{tmp}/root")
    os.mkdir(f"{tmp}/shared")
    code = "import os, torch; x = torch.ones(4, device='cuda'); print(os.getpid(), float((x * 2).sum()))"
    cmd = isolation.prefix([f"{tmp}/shared"], PACKAGE_ROOT, f"{tmp}/root") + [sys.executable, "-c", code]
    proc = subprocess.run(cmd, cwd=f"{tmp}/shared", capture_output=True, text=True, timeout=120)
    print(proc.returncode, proc.stdout.strip(), proc.stderr[-500:])
    sys.exit(0 if proc.stdout.strip() == "1 8.0" else 1)
