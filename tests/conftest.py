"""Hooks for the whole test suite."""

import os


def pytest_runtest_logreport(report):
    """With LABKERNELS_FAILURE_LOG set, each failure's traceback is appended to that file as it happens: a
    run cut off by a time limit (a GPU job's) still says why its tests failed; pytest prints them only at
    the end. Under pytest-xdist the controller writes it (a worker's report reaches it too)."""
    path = os.environ.get("LABKERNELS_FAILURE_LOG")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
