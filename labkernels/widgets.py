"""Widget wiring: controls → a sweep function that returns a Table → a plot. Nothing else lives here.

One behaviour for every widget of the course: the default sweep is drawn as soon as the widget is displayed,
and changing a control redraws the plot (debounced, so a burst of changes costs one sweep). "Measure again"
re-runs the same sweep (timings are noisy).

How it reads before the notebook is run: JupyterLab draws a widget only for a *trusted* output whose widget
state it can find once a kernel is ready; a notebook opened from a fresh checkout is untrusted, so it falls
back to the next mime type of the output. The widget's display therefore carries its default plot as an
ordinary `image/png` (with a caption naming the controls): an unrun notebook, GitHub's viewer and nbviewer
show that picture; a live kernel shows the controls and the live plot instead, never both.
"""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Callable, Mapping

import ipywidgets as widgets
from matplotlib.figure import Figure

from labkernels.results import Table

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HINT = "Change a control and the plot redraws."


def _png(fig: Figure) -> str:
    """The figure as base64 PNG (what the inline backend stores), drawn without pyplot."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _shown(value) -> str:
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value)
    return str(value)


class SweepWidget:
    """Controls, a live plot and a "Measure again" button. `run()` recomputes (tests call it directly)."""

    def __init__(
        self,
        compute: Callable[..., Table],
        plot: Callable[[Table, object], None],
        controls: Mapping[str, widgets.Widget],
        run_label: str = "Measure again",
        debounce_s: float = 0.4,
    ):
        if not controls:
            raise ValueError("a SweepWidget needs at least one control")
        self.compute, self.plot, self.controls = compute, plot, dict(controls)
        self.debounce_s = debounce_s
        self.button = widgets.Button(description=run_label, tooltip="run the same sweep again")
        self.button.on_click(lambda _: self.run(force=True))
        self.status = widgets.HTML(value=f"<small>{HINT}</small>")
        self.output = widgets.Output()
        # Whatever the sweep displays while it runs (its progress bar) goes here, not into the cell's outputs,
        # where a stored notebook would show it as a frozen "0%" line.
        self.progress = widgets.Output()
        self.table: Table | None = None
        self.figure: Figure | None = None
        self.png: str | None = None
        self._drawn_values: dict | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._box: widgets.VBox | None = None
        for control in self.controls.values():
            if hasattr(control, "continuous_update"):
                control.continuous_update = False  # a slider reports where it is dropped, not every step
            control.observe(self._changed, names="value")

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def caption(self) -> str:
        shown = ", ".join(
            f"{getattr(c, 'description', '') or name} = {_shown(c.value)}"
            for name, c in self.controls.items()
        )
        return f"Default sweep ({shown}). Run the notebook to change the controls."

    # --- computing and drawing -----------------------------------------------------------------------------
    def run(self, force: bool = False) -> Table:
        """Compute the sweep for the controls' values and draw it; unchanged values reuse the last table."""
        values = self.values()
        if not force and self.table is not None and values == self._drawn_values:
            return self.table
        self.status.value = "<small>measuring…</small>"
        try:
            with self.progress:
                table = self.compute(**values)
            # A finished progress bar closes its widget; left here, it would read "model not found".
            self.progress.clear_output()
            fig = Figure(figsize=(7, 4))
            self.plot(table, fig.subplots())
            png = _png(fig)
        except Exception as e:
            self.status.value = f"<b>error:</b> {type(e).__name__}: {e}"
            raise
        self.table, self.figure, self.png, self._drawn_values = table, fig, png, values
        plain = (
            f"<Figure size {fig.get_figwidth() * fig.dpi:g}x{fig.get_figheight() * fig.dpi:g} with 1 Axes>"
        )
        # Set the Output's outputs directly: no capture context, so a timer callback can draw too.
        self.output.outputs = (
            {"output_type": "display_data", "data": {"image/png": png, "text/plain": plain}, "metadata": {}},
        )
        self.status.value = f"<small>{HINT}</small>"
        return table

    def _changed(self, _change) -> None:
        """A control moved: redraw after `debounce_s` of quiet (at once when no event loop is running)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.debounce_s <= 0:
            self.run()
            return
        if self._pending is not None:
            self._pending.cancel()
        self.status.value = "<small>redrawing…</small>"
        self._pending = loop.call_later(self.debounce_s, self._redraw_later)

    def _redraw_later(self) -> None:
        self._pending = None
        try:
            self.run()
        except Exception:  # shown in the status line; a timer has no cell to raise into
            pass

    # --- display -------------------------------------------------------------------------------------------
    def box(self) -> widgets.VBox:
        if self._box is None:
            row = widgets.HBox(list(self.controls.values()) + [self.button])
            self._box = widgets.VBox([row, self.status, self.progress, self.output])
        return self._box

    def fallback_png(self) -> str:
        """The default plot with a caption naming the controls: what an unrun notebook shows."""
        if self.figure is None:
            self.run()
        fig = self.figure
        fig.text(0.0, -0.02, self.caption(), fontsize=8, color="0.3", ha="left", va="top")
        try:
            return _png(fig)
        finally:
            fig.texts.pop()

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs) -> dict:
        self.run()  # the default sweep is drawn on display (a no-op if it is already drawn)
        bundle = dict(self.box()._repr_mimebundle_(include=include, exclude=exclude, **kwargs) or {})
        bundle["image/png"] = self.fallback_png()
        bundle["text/plain"] = self.caption()
        return bundle
