"""labkernels.widgets: the default plot is drawn on display and stored as a plain image; controls redraw."""

import asyncio
import base64

import ipywidgets as w
import pytest

from labkernels.results import Table
from labkernels.widgets import WIDGET_VIEW, SweepWidget

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make(calls, fail_at=None, **kwargs):
    def compute(top, kind):
        calls.append((top, kind))
        if top == fail_at:
            raise ValueError(f"no sweep at top={top}")
        return Table([{"n": n, "y": n * n} for n in range(1, top + 1)])

    def plot(table, ax):
        ax.plot(table.column("n"), table.column("y"), label=f"{len(table)} points")

    controls = {
        "top": w.IntSlider(value=3, min=1, max=10, description="largest n"),
        "kind": w.Dropdown(options=["a", "b"], value="a", description="kind"),
    }
    return SweepWidget(compute, plot, controls, **kwargs)


def test_display_draws_the_default_and_carries_it_as_a_plain_image():
    calls = []
    widget = make(calls)
    assert calls == []  # nothing is measured before the widget is shown
    bundle = widget._repr_mimebundle_()
    assert calls == [(3, "a")]
    assert bundle[WIDGET_VIEW]["model_id"] == widget.box().model_id
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_MAGIC)
    # The fallback text names the controls, never a repr like VBox(children=...).
    assert "largest n = 3" in bundle["text/plain"] and "kind = a" in bundle["text/plain"]
    assert "VBox" not in bundle["text/plain"]
    # The live plot sits in the Output widget as an ordinary image output.
    (out,) = widget.output.outputs
    assert out["output_type"] == "display_data"
    assert base64.b64decode(out["data"]["image/png"]).startswith(PNG_MAGIC)
    # The caption is drawn only into the fallback picture, not left on the live figure.
    assert widget.figure.texts == []
    assert bundle["image/png"] != out["data"]["image/png"]
    # A second display reuses the drawn table: no second sweep.
    widget._repr_mimebundle_()
    assert calls == [(3, "a")]


def test_explicit_run_then_display_measures_once():
    calls = []
    widget = make(calls)
    table = widget.run()
    widget._repr_mimebundle_()
    assert calls == [(3, "a")] and len(table) == 3


def test_a_control_change_redraws_and_the_button_measures_again():
    calls = []
    widget = make(calls)
    widget.run()
    before = widget.output.outputs[0]["data"]["image/png"]
    widget.controls["top"].value = 7  # no event loop here: redraws at once
    assert calls[-1] == (7, "a") and len(widget.table) == 7
    assert widget.output.outputs[0]["data"]["image/png"] != before
    widget.controls["kind"].value = "b"
    assert calls[-1] == (7, "b")
    n = len(calls)
    widget.run()  # same values: reuses the table
    assert len(calls) == n
    widget.button.click()  # "Measure again": same values, measured again
    assert len(calls) == n + 1 and calls[-1] == (7, "b")


def test_sliders_report_only_where_they_are_dropped():
    widget = make([])
    assert widget.controls["top"].continuous_update is False


def test_changes_in_a_burst_cost_one_sweep_under_an_event_loop():
    calls = []
    widget = make(calls, debounce_s=0.05)
    widget.run()

    async def burst():
        for top in (4, 5, 6, 8):
            widget.controls["top"].value = top
        assert calls == [(3, "a")]  # nothing yet: the redraw waits for quiet
        assert "redrawing" in widget.status.value
        await asyncio.sleep(0.3)

    asyncio.run(burst())
    assert calls == [(3, "a"), (8, "a")] and len(widget.table) == 8
    assert "redrawing" not in widget.status.value


def test_a_failing_sweep_is_reported_and_keeps_the_last_plot():
    calls = []
    widget = make(calls, fail_at=5)
    widget.run()
    last = widget.output.outputs
    with pytest.raises(ValueError, match="top=5"):
        widget.controls["top"].value = 5
    assert "ValueError" in widget.status.value and "top=5" in widget.status.value
    assert widget.output.outputs == last and len(widget.table) == 3


def test_a_widget_needs_a_control():
    with pytest.raises(ValueError, match="at least one control"):
        SweepWidget(lambda: Table([]), lambda t, ax: None, {})
