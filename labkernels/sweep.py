"""Sweeps: a plain function over a grid of parameters, returning a Table (testable), then plotted."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

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
    for values in tqdm(combos, desc=desc or "sweep", leave=False):
        params = dict(zip(names, values, strict=True))
        result = fn(**params)
        if not isinstance(result, Mapping):
            raise TypeError(f"the swept function must return a dict of results, got {result!r} for {params}")
        rows.append({**params, **result})
    return Table(rows)


def plot_sweep(
    table: Table,
    x: str,
    y: str,
    by: str | None = None,
    reference: Table | None = None,
    ax=None,
    logx: bool = True,
    logy: bool = False,
    title: str | None = None,
    ylabel: str | None = None,
):
    """Lines of `y` against `x`, one per value of `by`; a reference table is drawn dashed beside them."""
    for t, what in ((table, "table"), (reference, "reference")):
        needed = [c for c in (x, y, by) if c is not None]
        missing = [c for c in needed if t is not None and len(t) and c not in t.columns]
        if missing:
            raise KeyError(f"plot_sweep: the {what} has no column(s) {missing}; its columns are {t.columns}")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    _lines(ax, table, x, y, by, style="-o", suffix="", single="this machine")
    if reference is not None and len(reference):
        device = str(reference.rows[0].get("device", "reference"))
        _lines(ax, reference, x, y, by, style="--", suffix=f" ({device})", single=device)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an empty table draws no lines and needs no legend
        ax.legend(fontsize=8)
    return ax


def _lines(ax, table: Table, x: str, y: str, by: str | None, style: str, suffix: str, single: str) -> None:
    groups = table.unique(by) if by else [None]
    for group in groups:
        part = table.where(**{by: group}) if by else table
        rows = sorted(part.rows, key=lambda r: r[x])
        label = f"{group}{suffix}" if by else single
        ax.plot([r[x] for r in rows], [r[y] for r in rows], style, label=label, markersize=3)
