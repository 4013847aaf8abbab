"""What the matmul and pointwise experiments share: their command line, timing in alternating rounds, and
CSV rows that carry the versions they were measured with (the scripts import it from their own folder)."""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys


def versioned() -> dict:
    """The columns every recorded row starts with: GPU, torch, triton, CUDA, date and revision."""
    from labkernels import env

    info = env.report()
    return {key: info[key] for key in ("device", "torch", "triton", "cuda", "date", "git")}


def alternating_medians(calls: dict, rounds: int, timer) -> dict[str, tuple[float, float]]:
    """name -> (median time, spread: (slowest - fastest) / median) over `rounds` rounds, each timing every
    call once in turn with `timer(call)`: a drift in the GPU's clock hits every call alike."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(timer(call))
    return {
        name: (statistics.median(ts), (max(ts) - min(ts)) / statistics.median(ts))
        for name, ts in times.items()
    }


def rel_err(c, ref) -> float:
    """Relative error of a result against its fp64 reference: ||c - ref|| / ||ref||."""
    return float((c.double() - ref).norm() / ref.norm())


def checked_matmul(run, a, b, reference) -> tuple[float, bool]:
    """(relative error of run(a, b, c) against reference(a, b) in fp64, with C poisoned (NaN) first: a tile
    left unwritten shows; bitwise equal on a second call). `run` returns C."""
    import torch

    c = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=a.dtype)
    first = run(a, b, c).clone()
    return rel_err(first, reference(a, b)), torch.equal(first, run(a, b, c))


def write_csv(path: str, rows: list[dict]) -> None:
    """Rows to CSV; the columns are every key of any row, in first-seen order (a row may lack some)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def main(doc: str, cpu_smoke, gpu_main, folder: str, options=None) -> None:
    """`--cpu-smoke` (or no GPU): cpu_smoke(); else gpu_main(out_dir, args) with its CSV under $OUT/folder.
    `options(parser)` adds a script's own arguments. Exits with the run's status."""
    import labkernels

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    if options is not None:
        options(parser)
    args = parser.parse_args()
    if args.cpu_smoke or not labkernels.on_gpu():
        sys.exit(cpu_smoke())
    out_dir = os.path.join(os.environ.get("OUT", "/tmp"), folder)
    os.makedirs(out_dir, exist_ok=True)
    sys.exit(gpu_main(out_dir, args))
