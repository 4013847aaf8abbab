"""Result tables: recorded to versioned CSV files and loaded back beside the learner's own numbers.

Every row written carries the environment it was measured in (GPU name, torch/triton/CUDA versions, date,
git revision), so a shipped H200 figure always says where it came from.

A CSV cell is text: `None` and `""`, `True` and `"True"`, `12` and `"12"` look alike there. So `record` writes
beside `<name>.csv` a small `<name>.types.json` with each value's type (per column, or per cell where a
column mixes types) and the CSV's digest, and `load` gives every value back as it was recorded. A CSV without
one (older shipped references, a file edited by hand: its digest no longer matches) is read by inference: a
column is numbers when every non-empty cell is one, text otherwise.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import numbers
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from labkernels import env

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
META_COLUMNS = ("device", "torch", "triton", "cuda", "date", "git")


# Columns that hold text whatever their values look like: a git revision such as 5e12345 or 0123456 must
# come back as written, not as inf or 123456.
STRING_COLUMNS = frozenset(META_COLUMNS) | {
    "dtype",
    "impl",
    "op",
    "kernel",
    "precision",
    "sweep",
    "quantity",
    "unit",
    "shape",
    "name",
    "label",
}
_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?(inf|nan)", re.I)


def _number(value: str) -> int | float | None:
    """The number `value` spells, or None. Strict: no leading zeros (0123 is a label, not 123), and an
    exponent that overflows (5e12345, a git revision) is not a number; an empty cell is not one either."""
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        number = float(value)
        if math.isinf(number) and "inf" not in value.lower():
            return None
        return number
    return None


def _column_types(header: list[str], rows: list[list[str]]) -> dict[str, bool]:
    """Per column: numeric unless it is a known text column or one of its non-empty cells is not a number."""
    numeric = {}
    for i, name in enumerate(header):
        cells = [row[i] for row in rows if row[i] != ""]
        numeric[name] = name not in STRING_COLUMNS and all(_number(c) is not None for c in cells)
    return numeric


# --- the types sidecar ----------------------------------------------------------------------------------

TYPES_SUFFIX = ".types.json"
_TYPES_FORMAT = 1


def types_path(csv_path: str | Path) -> Path:
    """`<name>.types.json` beside `<name>.csv`."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + TYPES_SUFFIX)


def _kind(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "int"
    if isinstance(value, numbers.Real):
        return "float"
    return "str"  # anything else is written as its str(): it comes back as that text


def _cell(value) -> str:
    kind = _kind(value)
    if kind == "none":
        return ""
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return repr(float(value))  # the shortest text that reads back as the same float ('nan', 'inf' too)
    return str(value)


_DECODE = {
    "none": lambda cell: None,
    "bool": lambda cell: cell == "True",
    "int": int,
    "float": float,
    "str": str,
}


def _column_kinds(table: Table) -> dict[str, str | list[str]]:
    """Per column, its one type, or the type of each row's value where they differ (a missing key: "none")."""
    kinds = {}
    for name in table.columns:
        column = [_kind(row.get(name)) for row in table.rows]
        kinds[name] = column[0] if len(set(column)) == 1 else column
    return kinds


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _typed_rows(path: Path, data: bytes, header: list[str], rows: list[list[str]]) -> list[dict] | None:
    """The rows with the types `record` noted in the sidecar, or None where there is none that fits this file
    (none written, or the CSV changed since)."""
    try:
        spec = json.loads(types_path(path).read_text())
        if spec.get("format") != _TYPES_FORMAT or spec.get("sha256") != _digest(data):
            return None
        kinds = spec["columns"]
        if list(kinds) != header:
            return None
        per_row = {
            name: kind if isinstance(kind, list) else [kind] * len(rows) for name, kind in kinds.items()
        }
        if any(len(k) != len(rows) or not set(k) <= set(_DECODE) for k in per_row.values()):
            return None
        return [
            {name: _DECODE[per_row[name][i]](cell) for name, cell in zip(header, row, strict=True)}
            for i, row in enumerate(rows)
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


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


def record(
    name: str, rows: Iterable[Mapping], directory: str | Path | None = None, *, replace: bool = False
) -> Path:
    """Write `rows` to `<directory>/<name>.csv` with the environment columns prepended; return the path.

    The file is written to a temporary file in the same folder and renamed over the old one, so a failing
    write leaves the old file whole. An existing file with the same columns is replaced (a re-run of the same
    measurement); one with different columns is kept and this raises, unless `replace=True` (`make bench`,
    which rewrites the shipped references, passes it).
    """
    if not name or "/" in name or name.startswith("."):
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
    if out.exists() and not replace:
        old = _header(out)
        if old != table.columns:
            raise ValueError(
                f"{out} already holds a table with other columns ({old} vs {table.columns}); "
                "record under another name, delete the file, or pass replace=True"
            )
    cells = [{k: _cell(v) for k, v in row.items()} for row in table.rows]
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".csv.tmp", dir=path)
    types_fd, types_tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".types.tmp", dir=path)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=table.columns)
            writer.writeheader()
            writer.writerows(cells)
            f.flush()
            os.fsync(f.fileno())
        spec = {"format": _TYPES_FORMAT, "sha256": _digest(Path(tmp).read_bytes())}
        spec["columns"] = _column_kinds(table)
        with os.fdopen(types_fd, "w") as f:
            json.dump(spec, f)
            f.write("\n")
        # atomic on one filesystem: readers see the old file or the new, never half. Between the two renames
        # the old sidecar's digest does not match the new CSV, so it is not used.
        os.replace(tmp, out)
        os.replace(types_tmp, types_path(out))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        Path(types_tmp).unlink(missing_ok=True)
        raise
    return out


def _header(path: Path) -> list[str] | None:
    with path.open(newline="") as f:
        try:
            return next(csv.reader(f), None)
        except csv.Error:
            return None


class MalformedCSV(ValueError):
    """A results file that is not a table: says which file and which line."""


def load(path: str | Path) -> Table:
    """Read a CSV written by `record`: each value as recorded (see the module's docstring). Without its types
    sidecar, text columns stay text and a column becomes numbers only when every non-empty cell is a number
    (empty cells stay ""). A malformed file raises MalformedCSV naming the line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedCSV(f"{path}: not a text CSV file ({e.reason})") from None
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f, strict=True)
        try:
            header = next(reader, None)
            if not header:
                raise MalformedCSV(f"{path}: line 1: empty file, expected a header row")
            _check_header(path, header)
            rows = []
            for row in reader:
                if not row:
                    continue  # a blank line, e.g. a trailing one
                if len(row) != len(header):
                    where = f"{path}: line {reader.line_num}"
                    raise MalformedCSV(f"{where}: {len(row)} fields where the header has {len(header)}")
                rows.append(row)
        except csv.Error as e:
            raise MalformedCSV(f"{path}: line {reader.line_num}: {e}") from None
    typed = _typed_rows(path, data, header, rows)
    if typed is not None:
        return Table(typed)
    numeric = _column_types(header, rows)
    return Table(
        {k: (_number(v) if numeric[k] and v != "" else v) for k, v in zip(header, row, strict=True)}
        for row in rows
    )


def _check_header(path: Path, header: list[str]) -> None:
    blank = [i + 1 for i, name in enumerate(header) if not name.strip()]
    if blank:
        raise MalformedCSV(f"{path}: line 1: header has an empty column name (column {blank[0]})")
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise MalformedCSV(f"{path}: line 1: header repeats column(s) {repeated}")


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
