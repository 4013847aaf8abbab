"""Sweeps: a plain function over a grid of parameters, returning a Table (testable), then plotted.

Progress shows while a sweep runs and is gone when it ends: a notebook stores no frozen "0%" bar.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from labkernels.results import Table


def sweep(fn: Callable[..., Mapping], grid: Mapping[str, Sequence], desc: str = "") -> Table:
    """Call `fn(**params)` for every combination in `grid`; each row = params + what fn returned."""
    if not grid:
        raise ValueError("grid must name at least one parameter")
    for name, values in grid.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise TypeError(f"grid parameter {name!r} must be a list of values, got {values!r}")
        if len(values) == 0:
            raise ValueError(f"grid parameter {name!r} has no values")
    names = list(grid)
    combos = list(itertools.product(*(grid[n] for n in names)))
    rows = []
    for values in _progress(combos, desc or "sweep"):
        params = dict(zip(names, values, strict=True))
        result = fn(**params)
        if not isinstance(result, Mapping):
            raise TypeError(f"the swept function must return a dict of results, got {result!r} for {params}")
        rows.append({**params, **result})
    return Table(rows)


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return getattr(get_ipython(), "kernel", None) is not None


def _progress(items: list, desc: str) -> Iterator:
    """Yield `items` under a progress bar that leaves nothing behind.

    In a terminal, tqdm with leave=False erases its own line. In a notebook, the bar is a widget whose text
    form ("desc: 0%| 0/15") would stay in the stored output; so it is displayed under a display id and that
    output is replaced by an empty one when the sweep ends (or fails).
    """
    if not _in_kernel():
        yield from tqdm(items, desc=desc, leave=False)
        return
    from IPython.display import display
    from tqdm.notebook import tqdm as notebook_tqdm

    bar = notebook_tqdm(items, desc=desc, leave=False, display=False)
    handle = display(bar.container, display_id=True)
    try:
        yield from bar
    finally:
        bar.close()
        with contextlib.suppress(
            Exception
        ):  # no frontend to update (a plain IPython shell): nothing to blank
            handle.update({"text/plain": ""}, raw=True)


def _spread(*tables: Table | None, column: str) -> float:
    """max / min of a column's positive values over the tables (1 when there are none)."""
    values = [
        r[column] for t in tables if t is not None for r in t.rows if isinstance(r.get(column), (int, float))
    ]
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if not positive or len(positive) < len(values):
        return 1.0
    return max(positive) / min(positive)


# How the columns that tables share read on an axis; any other column is its own label.
AXIS_LABELS = {"gbps": "GB/s", "tflops": "TFLOP/s", "ms": "time (ms)", "nbytes": "bytes"}


def plot_sweep(
    table: Table,
    x: str,
    y: str,
    by: str | None = None,
    reference: Table | None = None,
    ax=None,
    logx: bool = True,
    logy: bool | None = None,
    title: str | None = None,
    ylabel: str | None = None,
    order: Sequence | None = None,
):
    """Lines of `y` against `x`, one per value of `by`; a reference table is drawn dashed beside them, each
    group in the same color as this machine's line of it.

    `logy=None` picks a log y axis when the values span more than 20x (this machine's 10 GB/s beside an
    H200's 4 000 would otherwise lie flat on the axis); a value <= 0 keeps it linear. `order` lists groups
    first in that order, so that figures side by side give each group one color even where one of them
    lacks some groups.
    """
    for t, what in ((table, "table"), (reference, "reference")):
        needed = [c for c in (x, y, by) if c is not None]
        missing = [c for c in needed if t is not None and len(t) and c not in t.columns]
        if missing:
            raise KeyError(f"plot_sweep: the {what} has no column(s) {missing}; its columns are {t.columns}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    colors = _group_colors(by, (table, reference), order)
    _lines(ax, table, x, y, by, style="-o", suffix="", single="this machine", colors=colors)
    if reference is not None and len(reference):
        device = str(reference.rows[0].get("device", "reference"))
        _lines(ax, reference, x, y, by, style="--", suffix=f" ({device})", single=device, colors=colors)
    if logx:
        ax.set_xscale("log", base=2)
    if logy is None:
        logy = _spread(table, reference, column=y) > 20
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(AXIS_LABELS.get(x, x))
    ax.set_ylabel(ylabel or AXIS_LABELS.get(y, y))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an empty table draws no lines and needs no legend
        ax.legend(fontsize=8)
    return ax


def _group_colors(by: str | None, tables, order: Sequence | None) -> dict:
    """One of matplotlib's ten cycle colors per group: `order` first, then the groups of each table as met."""
    names = list(order or [])
    for t in tables:
        if by and t is not None and len(t):
            names += [g for g in t.unique(by) if g not in names]
    return {group: f"C{i % 10}" for i, group in enumerate(names)}


def _lines(ax, table: Table, x, y, by, style: str, suffix: str, single: str, colors: dict) -> None:
    groups = table.unique(by) if by else [None]
    for group in groups:
        part = table.where(**{by: group}) if by else table
        rows = sorted(part.rows, key=lambda r: r[x])
        label = f"{group}{suffix}" if by else single
        color = colors.get(group)  # None (no `by`): the axes' own cycle
        ax.plot([r[x] for r in rows], [r[y] for r in rows], style, label=label, markersize=3, color=color)
