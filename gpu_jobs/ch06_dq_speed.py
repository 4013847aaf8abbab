"""Exercise 6.4's speed case alone, on the GPU: the solution notebook's code cells run here (not its check
cells), then `check_speed("6.4", attention_dq)`, sandboxed as `make grade` runs it.

    python gpu_jobs/ch06_dq_speed.py
"""

import json

cells = json.load(open("solutions/06_flash_attention.ipynb"))["cells"]
scope: dict = {}
for cell in cells:
    source = "".join(cell["source"])
    if cell["cell_type"] == "code" and "check(" not in source and "check_speed(" not in source:
        exec(compile(source, "solutions/06_flash_attention.ipynb", "exec"), scope)  # noqa: S102
exec("check_speed('6.4', attention_dq)", scope)  # noqa: S102
