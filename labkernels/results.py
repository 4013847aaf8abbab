"""Result tables: recorded to versioned CSV files and loaded back beside the learner's own numbers.

Every row written carries the environment it was measured in (GPU name, torch/triton/CUDA versions, date,
git revision), so a shipped H200 figure always says where it came from.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from labkernels import env

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
META_COLUMNS = ("device", "torch", "triton", "cuda", "date", "git")


def _parse(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


class Table:
    """A list of rows (dicts with the same keys): what sweeps return and CSVs hold."""

    def __init__(self, rows: Iterable[Mapping]):
        self.rows = [dict(r) for r in rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    @property
    def columns(self) -> list[str]:
        cols: list[str] = []
        for row in self.rows:
            cols += [k for k in row if k not in cols]
        return cols

    def column(self, name: str) -> list:
        if self.rows and name not in self.columns:
            raise KeyError(f"no column {name!r}; columns are {self.columns}")
        return [row.get(name) for row in self.rows]

    def where(self, **equals) -> Table:
        return Table(r for r in self.rows if all(r.get(k) == v for k, v in equals.items()))

    def unique(self, name: str) -> list:
        seen = []
        for value in self.column(name):
            if value not in seen:
                seen.append(value)
        return seen

    def __repr__(self) -> str:
        cols = [c for c in self.columns if c not in META_COLUMNS]
        if not self.rows:
            return "Table(empty)"
        cells = [[_fmt(r.get(c)) for c in cols] for r in self.rows]
        widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
        lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
        lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
        return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def results_dir() -> Path:
    """Where a learner's own results go: $LABKERNELS_RESULTS, or ./results."""
    return Path(os.environ.get("LABKERNELS_RESULTS", "results"))


def record(name: str, rows: Iterable[Mapping], directory: str | Path | None = None) -> Path:
    """Write `rows` to `<directory>/<name>.csv` with the environment columns prepended; return the path."""
    if not name or "/" in name:
        raise ValueError(f"result name must be a plain file stem, got {name!r}")
    rows = [dict(r) for r in rows]
    if not rows:
        raise ValueError(f"no rows to record for {name!r}")
    meta = env.report()
    meta_row = {k: meta[k] for k in META_COLUMNS}
    table = Table({**meta_row, **row} for row in rows)
    path = Path(directory) if directory is not None else results_dir()
    path.mkdir(parents=True, exist_ok=True)
    out = path / f"{name}.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=table.columns)
        writer.writeheader()
        writer.writerows(table.rows)
    return out


def load(path: str | Path) -> Table:
    with Path(path).open(newline="") as f:
        return Table({k: _parse(v) for k, v in row.items()} for row in csv.DictReader(f))


def reference_path(name: str) -> Path:
    return REFERENCE_DIR / f"{name}.csv"


def load_reference(name: str) -> Table | None:
    """The shipped reference results (recorded on an H200 by `make bench`), or None if not recorded."""
    path = reference_path(name)
    return load(path) if path.exists() else None


def describe(table: Table | None) -> str:
    """One line saying where a reference table was measured."""
    if table is None or not table.rows:
        return "no reference results recorded yet (run `make bench` on a GPU)"
    r = table.rows[0]
    return f"{r.get('device')} · torch {r.get('torch')} · triton {r.get('triton')} · {r.get('date')}"
