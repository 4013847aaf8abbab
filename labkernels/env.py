"""An environment report: what ran, where, with which versions. Every recorded result carries it."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch
import triton

from labkernels.lane import LANE


def device_name() -> str:
    if LANE == "gpu":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def git_revision() -> str:
    if os.environ.get("LABKERNELS_GIT_REV"):  # set where the checkout travels without its .git
        return os.environ["LABKERNELS_GIT_REV"]
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def report() -> dict[str, str]:
    """Lane, device, and the versions that decide what a kernel compiles to."""
    return {
        "lane": LANE,
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
        "git": git_revision(),
    }


def print_report() -> None:
    for key, value in report().items():
        print(f"{key:>7}: {value}")
