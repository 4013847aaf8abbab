"""Hostile notebooks for `make grade` (issue 17): `write(name, folder)` writes one into a class folder."""

from __future__ import annotations

from pathlib import Path

import nbformat

LEFTOVER = "labkernels-attack-leftover"  # in the command line of the leftover attack's process
HEAD = "import labkernels  # noqa: F401\nfrom labkernels.grading import check, check_speed\n"

STUB_3_1 = "def bias_relu(x, bias, out):\n    raise NotImplementedError\n"

NOTEBOOKS = {
    # 1. Appends 1000-point records to the log the grader reads (its path is in the kernel's environment).
    "forge_log": [
        HEAD,
        "import json, os\n"
        "rec = {'exercise': '3.1', 'title': 'x', 'speed': False, 'earned': 1000, 'possible': 4,\n"
        "       'cases': [], 'error': None}\n"
        "for name in os.environ:\n"
        "    if 'GRADE' in name and os.environ[name].endswith('.jsonl'):\n"
        "        open(os.environ[name], 'a').write(json.dumps(rec) + '\\n')\n",
    ],
    # 3/6. Environment set inside the kernel reaches the grading process: an extra "exercise module" from
    # the notebook's folder replaces 3.1's grading function with one that passes every case.
    "env_injection": [
        HEAD,
        "import os, sys\n"
        "open('evil_exercises.py', 'w').write('''\n"
        "from labkernels.grading.core import EXERCISES\n"
        "import labkernels.grading.exercises_ch03\n"
        "def _all_pass(student, g):\n"
        "    for i in range(4):\n"
        "        with g.case(f'case {i}', points=1):\n"
        "            pass\n"
        "EXERCISES['3.1'].grade = _all_pass\n"
        "''')\n"
        "os.environ['PYTHONPATH'] = os.getcwd() + os.pathsep + os.environ.get('PYTHONPATH', '')\n"
        "os.environ['LABKERNELS_EXTRA_EXERCISES'] = 'evil_exercises'\n"
        "os.environ['LABKERNELS_LANE'] = 'cpu'  # on a GPU machine: speed cases would be skipped\n",
        STUB_3_1,
        "check('3.1', bias_relu)",
    ],
    # 8. A detached process (new session, double fork) outlives the grading; its command line carries LEFTOVER
    # (a sandboxed one cannot write a file the test could read, nor has a pid the test could name).
    "leftover": [
        HEAD,
        "import os, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import os, sys, time\\n'\n"
        "    'if os.fork(): sys.exit(0)\\n'\n"
        "    'os.setsid()\\n'\n"
        "    'time.sleep(600)', 'labkernels-attack-leftover'], start_new_session=True).wait()\n",
    ],
    # 7. Only a correct 3.4 handed in: the possible total must still count every chapter.
    "only_3_4": [
        HEAD,
        "def grouped_order(pid, num_pid_m, num_pid_n, group_size_m):\n"
        "    num_pid_in_group = group_size_m * num_pid_n\n"
        "    first_pid_m = (pid // num_pid_in_group) * group_size_m\n"
        "    group_rows = min(num_pid_m - first_pid_m, group_size_m)\n"
        "    return first_pid_m + (pid % num_pid_in_group) % group_rows, "
        "(pid % num_pid_in_group) // group_rows\n",
        "check('3.4', grouped_order)",
    ],
}


def write(name: str, folder: Path, filename: str | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOKS[name]]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = Path(folder) / (filename or f"03_{name}.ipynb")
    nbformat.write(nb, path)
    return path
