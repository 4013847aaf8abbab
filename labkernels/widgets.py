"""Widget wiring: controls → a sweep function that returns a Table → a plot. Nothing else lives here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from labkernels.results import Table


class SweepWidget:
    """Controls, a Run button and a figure. `run()` recomputes (tests call it directly)."""

    def __init__(
        self,
        compute: Callable[..., Table],
        plot: Callable[[Table, object], None],
        controls: Mapping[str, widgets.Widget],
        run_label: str = "Run",
    ):
        if not controls:
            raise ValueError("a SweepWidget needs at least one control")
        self.compute, self.plot, self.controls = compute, plot, dict(controls)
        self.button = widgets.Button(description=run_label, button_style="primary")
        self.button.on_click(lambda _: self.run())
        self.output = widgets.Output()
        self.table: Table | None = None
        self.figure = None

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def run(self) -> Table:
        self.table = self.compute(**self.values())
        fig, ax = plt.subplots(figsize=(7, 4))
        self.plot(self.table, ax)
        self.figure = fig
        with self.output:
            self.output.clear_output(wait=True)
            display(fig)
        plt.close(fig)
        return self.table

    def box(self) -> widgets.VBox:
        return widgets.VBox([widgets.HBox(list(self.controls.values()) + [self.button]), self.output])

    def _ipython_display_(self) -> None:
        display(self.box())
