"""Chapter 05's fusion-log record (`ch05_fusion_log`, read by notebook 05 section 4): Inductor's scheduler
log for `bench.fusion_cases` at a decode step's sizes in bf16, compiled afresh, as rows.

    python gpu_jobs/ch05_fusion_log.py --out DIR     # DIR/ch05_fusion_log.csv, and the table on stdout
"""

from __future__ import annotations  # noqa: I001  (labkernels before triton: it sets the lane)

import argparse

import labkernels  # noqa: F401
from labkernels.ch05_fusion import bench
from labkernels.results import Table, record


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    rows = bench.fusion_log_record()
    print(Table(rows))
    print(record("ch05_fusion_log", rows, p.parse_args().out, replace=True))


if __name__ == "__main__":
    main()
