"""The sandboxed grading process: `python -m labkernels.grading.child payload.json results.jsonl`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def _load_answer(answer: dict, workdir: Path):
    if answer["kind"] == "data":
        return answer["value"]
    path = workdir / "submission.py"
    path.write_text(answer["source"])
    spec = importlib.util.spec_from_file_location("submission", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["submission"] = module
    spec.loader.exec_module(module)
    return getattr(module, answer["entry"])


def main(payload_path: str, results_path: str) -> int:
    import labkernels  # noqa: F401  (picks the lane before triton is imported)
    from labkernels.grading.core import Grader
    from labkernels.grading.registry import get

    payload = json.loads(Path(payload_path).read_text())
    ex = get(payload["ex_id"])
    grader = Grader(results_path, speed=payload["speed"])
    try:
        student = _load_answer(payload["answer"], Path(payload_path).parent)
    except Exception as e:  # a submission that does not even load fails every case, with the reason
        print(f"your code could not be loaded: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    ex.grade(student, grader)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
