"""A costly fixture computed once per test run, whichever pytest-xdist worker asks for it first.

A module-scoped fixture is set up once per *worker*: with tests of one module spread over two workers, both
graded the same class. (`--dist loadgroup` would keep a group on one worker, but pytest-xdist 3.8 marks the
group in a node id that pytest 9 no longer reads, so the group is split.)"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def once_per_run(tmp_path_factory, name: str, compute: Callable[[Path], object]):
    """compute(folder), run once per test run: under pytest-xdist by the first worker to ask, while the
    others wait on a lock and then read its pickled result; without xdist (or without it installed), here.
    The folder is shared."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # set by xdist in each of its workers
        return compute(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # this run's folder, above each worker's own
    result = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if not result.exists():
            folder = root / name
            folder.mkdir(exist_ok=True)
            result.write_bytes(pickle.dumps(compute(folder)))
    return pickle.loads(result.read_bytes())
