"""Figures a learner can read: no two labels overlap, all text inside the figure, no point above its own roof,
and the learner's curve readable beside the H200's.

`assert_readable` renders a figure with the Agg backend and checks the window extents of its text artists. It
is applied to every plot helper in labkernels that can be called with fake data.
"""

import itertools

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from labkernels import roofline, traffic  # noqa: E402
from labkernels.results import Table  # noqa: E402
from labkernels.sweep import plot_sweep  # noqa: E402

H200 = roofline.Ceilings("NVIDIA H200", 4219.0, {"float32": 51.2, "bfloat16": 720.0})


def _drawn_tick_labels(ax) -> tuple[set, set]:
    """(all tick labels, those matplotlib draws): a tick outside the view keeps a label it never draws."""
    every, drawn = set(), set()
    for axis in (ax.xaxis, ax.yaxis):
        low, high = sorted(axis.get_view_interval())
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            labels = {tick.label1, tick.label2}
            every |= labels
            if low - 1e-9 * abs(low) <= tick.get_loc() <= high + 1e-9 * abs(high):
                drawn |= {t for t in labels if t.get_visible()}
    return every, drawn


def _texts(fig) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()
    every, drawn = set(), set()
    for ax in fig.axes:
        e, d = _drawn_tick_labels(ax)
        every, drawn = every | e, drawn | d
    out = []
    for artist in fig.findobj(Text):
        if not artist.get_visible() or not artist.get_text().strip():
            continue
        if artist in every and artist not in drawn:
            continue
        out.append((artist.get_text(), artist.get_window_extent(renderer)))
    return out


def overlapping_texts(fig) -> list[str]:
    """Every pair of visible text artists whose boxes overlap, and every text not inside the figure."""
    fig.canvas.draw()
    texts = _texts(fig)
    inside = fig.bbox.padded(1)  # a pixel of rounding
    problems = [
        f"{t!r} is outside the figure ({box.bounds}, figure {fig.bbox.bounds})"
        for t, box in texts
        if not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1))
    ]
    for (t1, b1), (t2, b2) in itertools.combinations(texts, 2):
        if b1.overlaps(b2):
            problems.append(f"{t1!r} overlaps {t2!r}")
    return problems


def assert_readable(fig) -> None:
    problems = overlapping_texts(fig)
    plt.close(fig)
    assert not problems, "unreadable figure:\n" + "\n".join(problems)


def test_the_checker_catches_overlaps_and_text_outside():
    fig, ax = plt.subplots()
    ax.text(0.5, 0.5, "one label")
    ax.text(0.5, 0.5, "another label")
    ax.text(1.5, 0.5, "past the right edge", transform=fig.transFigure)
    problems = overlapping_texts(fig)
    plt.close(fig)
    assert any("overlaps" in p for p in problems)
    assert any("outside the figure" in p for p in problems)


# --- the CPU lane's roofline, from fake measurements ---------------------------------------------------


def fake_cpu() -> roofline.Ceilings:
    """Ceilings as measure_ceilings builds them, from made-up measurements of a 2-core laptop."""
    peaks_by_size = {512: 0.06, 1024: 0.11, 2048: 0.15}  # TFLOP/s of torch.matmul, all threads
    return roofline.Ceilings(
        "fake CPU",
        bandwidth_gbps=12.0,
        peak_tflops={"float32": max(peaks_by_size.values())},
        cache_bytes=32 << 20,
    )


def fake_points() -> list[roofline.Point]:
    def at_gbps(label, t, gbps):
        return roofline.Point(label, t, t.bytes / (gbps * 1e9) * 1e3)

    def at_tflops(label, t, tflops):
        return roofline.Point(label, t, t.flops / (tflops * 1e12) * 1e3)

    return [
        at_gbps("add, 2^18 (3 MiB: in cache)", traffic.add(1 << 18), 120.0),  # past the DRAM roof, in cache
        at_gbps("add, 2^26 (768 MiB)", traffic.add(1 << 26), 11.0),  # from DRAM, under the roof
        at_tflops("GEMM 2048^3", traffic.matmul(2048, 2048, 2048, torch.float32), 0.14),
        at_tflops("GEMM 256x256x1024", traffic.matmul(256, 256, 1024, torch.float32), 0.18),  # in cache
    ]


def test_copy_size_leaves_the_cache_and_fits_the_budget():
    llc = 32 << 20
    assert 2 * roofline.copy_bytes_past_cache(llc) >= 4 * llc
    assert 2 * roofline.copy_bytes_past_cache(None) == 1 << 30  # unknown cache: 1 GiB in all
    assert 2 * roofline.copy_bytes_past_cache(480 << 20, budget=1 << 30) <= 1 << 30
    assert 2 * roofline.copy_bytes_past_cache(480 << 20, available_bytes=2 << 30) <= (2 << 30) // 4
    assert roofline._parse_size("2048K") == 2 << 20
    assert roofline._parse_size("480 MiB (1 instance)") == 480 << 20
    llc_here = roofline.last_level_cache_bytes()
    assert llc_here is None or llc_here >= 1 << 16


def test_no_point_beats_its_own_roof_unless_its_data_is_in_cache():
    cpu, points = fake_cpu(), fake_points()
    hot = {p.label for p in points if roofline.cache_resident(p, cpu)}
    assert hot == {"add, 2^18 (3 MiB: in cache)", "GEMM 256x256x1024"}
    above = {p.label for p in points if p.tflops > roofline.roof_tflops(cpu, "float32", p.traffic.intensity)}
    assert above == hot  # the two points above the roofs are exactly the cache-resident ones
    assert roofline.beaten(points, cpu, "float32") == []
    # the old CPU ceilings (a 64 MiB copy, one 512^3 matmul) were beaten by points from DRAM: caught
    old = roofline.Ceilings("old", 9.0, {"float32": 0.027}, cache_bytes=32 << 20)
    assert {p.label for p in roofline.beaten(points, old, "float32")} == {
        "add, 2^26 (768 MiB)",
        "GEMM 2048^3",
    }
    # on the GPU lane (do_bench flushes L2, cache_bytes None) no point is excused
    gpu = roofline.Ceilings("gpu", 12.0, {"float32": 0.15})
    assert len(roofline.beaten(points, gpu, "float32")) == 2


def test_roofline_plot_marks_cache_resident_points_and_is_readable():
    cpu, points = fake_cpu(), fake_points()
    ax = roofline.plot_roofline(points, [cpu, H200], dtype="float32")
    labels = ax.get_legend_handles_labels()[1]
    assert "add, 2^18 (3 MiB: in cache) (data in cache)" in labels
    assert any(label.startswith("hollow: all data fit in the 32 MiB cache") for label in labels)
    assert not any("above its roof" in label for label in labels)
    hollow = [line for line in ax.lines if line.get_markerfacecolor() == "none" and len(line.get_xdata())]
    assert len(hollow) == 2
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert_readable(ax.figure)


def test_roofline_plot_names_a_point_above_its_roof():
    old = roofline.Ceilings("old", 9.0, {"float32": 0.027}, cache_bytes=32 << 20)
    ax = roofline.plot_roofline(fake_points(), [old], dtype="float32")
    labels = ax.get_legend_handles_labels()[1]
    assert sum("above its roof" in label for label in labels) == 2
    plt.close(ax.figure)


def test_many_matmul_points_read_through_a_legend_by_series():
    """Notebook 03's "bf16 matmuls: Triton vs cuBLAS": 4 implementations x 9 shapes, no label smear."""
    shapes = [(1024,) * 3, (2048,) * 3, (4096,) * 3, (8192,) * 3, (512, 4096, 4096), (4096, 4096, 512)]
    points = []
    for i, impl in enumerate(["triton", "triton_tiled", "triton_tma_persistent", "cublas"]):
        for m, n, k in shapes:
            t = traffic.matmul(m, n, k, torch.bfloat16)
            tflops = (0.7 + i / 20) * roofline.roof_tflops(H200, "bfloat16", t.intensity)
            points.append(
                roofline.Point(f"{impl} {m}x{n}x{k}", t, t.flops / (tflops * 1e12) * 1e3, series=impl)
            )
    ax = roofline.plot_roofline(points, [H200], dtype="bfloat16")
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [
        "NVIDIA H200: bfloat16 roof",
        "triton",
        "triton_tiled",
        "triton_tma_persistent",
        "cublas",
    ]
    assert_readable(ax.figure)


# --- sweeps: the learner's curve beside the H200's ------------------------------------------------------


def _copy_tables():
    sizes = [1 << p for p in range(12, 28)]
    mine = Table({"nbytes": s, "gbps": 10.0 + 40.0 * (s < 1 << 22)} for s in sizes)
    ref = Table(
        {"nbytes": s, "gbps": 4000.0 + 2000.0 * (s < 1 << 25), "device": "NVIDIA H200"} for s in sizes
    )
    return mine, ref


def test_sweep_beside_the_h200_uses_a_log_axis_and_reads():
    mine, ref = _copy_tables()
    ax = plot_sweep(mine, "nbytes", "gbps", reference=ref, title="copy bandwidth vs size", ylabel="GB/s")
    assert ax.get_yscale() == "log"  # 10 GB/s beside 4 000: on a linear axis the learner's line lies at zero
    low, high = ax.get_ylim()
    assert low < 10 and high > 4000
    assert_readable(ax.figure)
    ax = plot_sweep(Table({"n": n, "y": 1.0 + n / 100} for n in [1, 2, 4, 8]), "n", "y")
    assert ax.get_yscale() == "linear"  # a small spread stays linear
    plt.close(ax.figure)


def test_sweep_by_group_with_reference_reads():
    rows = [
        {"n": 1 << p, "impl": impl, "gbps": g * (p - 10)}
        for p in range(12, 26, 2)
        for impl, g in [("a", 1), ("b", 2)]
    ]
    ref = Table({**r, "gbps": r["gbps"] * 300, "device": "NVIDIA H200"} for r in rows)
    ax = plot_sweep(Table(rows), "n", "gbps", by="impl", reference=ref, title="add_relu")
    assert ax.get_yscale() == "log"
    assert_readable(ax.figure)


# --- chapter 02's helpers -------------------------------------------------------------------------------


def test_ch02_transpose_plot_reads():
    from labkernels.ch02_strides.bench import plot_transpose

    impls = ["torch .contiguous()", "kernel alone (contiguous input)", "triton tiled"]
    rows = [
        {"n": n, "impl": impl, "gbps": (i + 1) * 3.0 * n / 4096}
        for n in [256, 1024, 4096]
        for i, impl in enumerate(impls)
    ]
    ref = Table({**r, "gbps": r["gbps"] * 400, "device": "NVIDIA H200"} for r in rows)
    ax = plot_transpose(
        Table(rows), reference=ref, copy_gbps=12.0, title="transposed fp32 n x n -> contiguous"
    )
    assert ax.get_yscale() == "log"
    assert_readable(ax.figure)


@pytest.mark.parametrize(
    "sizes, strides, offset, n_storage",
    [
        ((3, 4), (4, 1), 0, 12),
        ((4, 3), (1, 4), 0, 12),
        ((3, 4), (0, 1), 0, 4),
        ((2, 6), (6, 1), 0, 12),
        ((5, 6), (1, 5), 0, 30),
    ],
    ids=["contiguous", "transposed", "broadcast", "2x6", "5x6-transposed"],
)
def test_ch02_view_picture_reads(sizes, strides, offset, n_storage):
    from labkernels.ch02_strides.views import draw_view

    ax = draw_view(sizes, strides, offset, n_storage, title=f"sizes {sizes} strides {strides}")
    assert_readable(ax.figure)


def test_a_long_roofline_legend_covers_no_point():
    """Ten entries, as notebook 04's K-sweep widget draws them: a legend that long, inside the axes, hid the
    points near the roof, so it goes outside them; its box covers no marker and the figure stays readable."""
    cpu = roofline.Ceilings("CPU (x86_64, 2 threads)", 28.6, {"float32": 0.4}, cache_bytes=480 << 20)
    points = [roofline.Point(f"K={2**i}", traffic.matmul(256, 256, 2**i), 0.0) for i in range(3, 11)]
    for p in points:  # below their roof, as measured points lie
        tflops = 0.6 * roofline.roof_tflops(cpu, "float32", p.traffic.intensity)
        p.ms = p.traffic.flops / (tflops * 1e12) * 1e3
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    roofline.plot_roofline(points, [cpu, H200], ax=ax, dtype="float32")
    fig.canvas.draw()
    legend_box = ax.get_legend().get_window_extent(fig.canvas.get_renderer())
    assert not legend_box.overlaps(ax.get_window_extent())
    markers = [line for line in ax.lines if line.get_marker() not in ("None", "", "|")]
    spots = [ax.transData.transform(xy) for line in markers for xy in line.get_xydata()]
    assert len(spots) == 8 and not any(legend_box.contains(x, y) for x, y in spots)
    assert_readable(fig)


# --- chapter 05's side-by-side bars ---------------------------------------------------------------------


def _fusion_rows(kind, shape, dtype, bytes_by_impl, ms_by_impl):
    return [
        {"kind": kind, "shape": shape, "dtype": dtype, "impl": impl, "bytes": bytes_by_impl[impl], "ms": ms}
        for impl, ms in ms_by_impl.items()
    ]


def test_ch05_kinds_bars_put_every_version_on_the_fused_bytes():
    """Eager moves more bytes than the fused kernel and takes longer: on its own bytes it could show more GB/s
    than the fused kernel; on the fused kernel's bytes its bar is lower by exactly the time ratio. Compute-
    bound matmul rows stay out; M = 16 (bound by reading W) stays in."""
    from labkernels.ch05_fusion.bench import plot_kinds, same_bytes_gbps

    ms = {"eager": 3.0, "compile": 1.2, "labkernels": 1.0}
    rows = _fusion_rows("add_relu", "4096", "float32", {"eager": 5e9, "compile": 3e9, "labkernels": 3e9}, ms)
    rows += _fusion_rows("int8_matmul", "16x4096x4096", "bfloat16", dict.fromkeys(ms, 17_047_552), ms)
    rows += _fusion_rows("int8_matmul", "4096x4096x4096", "bfloat16", dict.fromkeys(ms, 151_003_136), ms)
    bars = same_bytes_gbps(Table(rows))
    assert [r["shape"] for r in bars.rows] == ["4096", "16x4096x4096"]
    add_relu = bars.rows[0]
    assert add_relu["labkernels"] == pytest.approx(3000.0)  # 3e9 bytes in 1 ms: 3000 GB/s
    assert add_relu["eager"] == pytest.approx(add_relu["labkernels"] / 3.0)  # 3x the time, a third the bar
    assert_readable(plot_kinds(Table(rows), copy_gbps=4000.0).figure)


def test_ch06_sequence_sweep_plot_reads_and_keeps_coinciding_lines_apart():
    """The fused kernels' memory lines coincide; each keeps its own marker and width so all show."""
    from labkernels.ch06_attention.bench import SWEEP_IMPLS, plot_sequence_sweep

    rows = [
        {"impl": impl, "seq": s, "tflops": (i + 1) * s / 512, "peak_mb": s / 32 * (1 + (i >= 4) * s / 64)}
        for i, impl in enumerate(SWEEP_IMPLS)
        for s in (512, 1024, 2048)
    ]
    fig = plot_sequence_sweep(Table(rows), "B=4 H=16 D=64 bf16, fake")
    lines = fig.axes[1].get_lines()
    assert len({line.get_marker() for line in lines}) == len(SWEEP_IMPLS)
    assert len({line.get_linewidth() for line in lines}) == len(SWEEP_IMPLS)
    assert_readable(fig)


def test_sweep_colors_follow_the_group_not_the_drawing_order():
    """A group's reference line (dashed) has the color of this machine's line of it, and `order` keeps one
    color per group across figures whose tables hold different groups (the CPU lane has no Triton rows)."""
    rows = [{"n": n, "impl": impl, "gbps": float(n)} for n in (1, 2) for impl in ("a", "c")]
    ref = Table({**r, "impl": impl, "device": "H200"} for r in rows for impl in ("a", "b", "c"))
    ax = plot_sweep(Table(rows), "n", "gbps", by="impl", reference=ref, order=["a", "b", "c"])
    color = {line.get_label(): line.get_color() for line in ax.get_lines()}
    assert color["a"] == color["a (H200)"] == "C0" and color["c"] == color["c (H200)"] == "C2"
    assert color["b (H200)"] == "C1"
    plt.close(ax.figure)


def test_sweep_axes_name_units_not_column_names():
    rows = [{"nbytes": 1 << k, "gbps": float(k)} for k in (10, 11, 12)]
    ax = plot_sweep(Table(rows), "nbytes", "gbps")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("bytes", "GB/s")
    labelled = plot_sweep(Table(rows), "nbytes", "gbps", ylabel="GB/s (traffic model)")
    assert labelled.get_ylabel() == "GB/s (traffic model)"  # a caller's label wins
    plt.close("all")
