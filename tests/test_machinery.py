"""The machinery every chapter stands on: lanes, timing, the traffic model, ceilings, roofline, results."""

import math
import os
import subprocess
import sys

import matplotlib
import pytest
import torch

import labkernels
from labkernels import roofline, timing, traffic
from labkernels.results import Table, describe, load, load_reference, record
from labkernels.sweep import plot_sweep, sweep

matplotlib.use("Agg")


def test_cpu_lane_sets_the_interpreter_before_triton_is_imported():
    if labkernels.on_gpu():
        pytest.skip("CPU-lane behaviour")
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert labkernels.DEVICE.type == "cpu"
    assert labkernels.size(cpu=1, gpu=2) == 1


def test_importing_triton_first_on_a_cpu_machine_is_refused():
    if labkernels.on_gpu():
        pytest.skip("CPU-lane behaviour")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", "import triton, labkernels"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "import labkernels first" in proc.stderr


def test_require_device_names_the_problem():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        labkernels.require_device([1, 2], "x")
    if not labkernels.on_gpu():
        return
    with pytest.raises(ValueError, match="x is on cpu"):
        labkernels.require_device(torch.ones(2), "x")


@pytest.mark.parametrize(
    "dtype, size", [(torch.float32, 4), (torch.float16, 2), (torch.bfloat16, 2), (torch.float64, 8)]
)
def test_traffic_formulas(dtype, size):
    n = 1823
    assert traffic.copy(n, dtype).bytes == 2 * n * size
    assert traffic.add(n, dtype) == traffic.Traffic("add", 3 * n * size, n)
    assert traffic.add_relu(n, dtype).bytes == 3 * n * size
    assert traffic.add_relu(n, dtype, fused=False).bytes == 5 * n * size
    assert traffic.matmul(64, 48, 32, dtype) == traffic.Traffic(
        "matmul", (64 * 32 + 32 * 48 + 64 * 48) * size, 2 * 64 * 48 * 32
    )
    assert traffic.softmax(7, 5000, dtype).bytes == 2 * 7 * 5000 * size
    assert traffic.transpose(3, 5, dtype).bytes == 2 * 15 * size


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_traffic_rejects_non_positive_sizes(bad):
    with pytest.raises(ValueError, match="must be a positive int"):
        traffic.copy(bad)
    with pytest.raises(ValueError, match="must be a positive int"):
        traffic.matmul(4, bad, 4)


def test_traffic_rejects_non_dtypes():
    with pytest.raises(TypeError, match="torch.dtype"):
        traffic.add(10, "float32")


def test_roofline_math():
    bw, peak = 4000.0, 800.0  # GB/s, TFLOP/s
    assert roofline.ridge_point(bw, peak) == pytest.approx(200.0)
    copy = traffic.copy(1 << 20)
    assert roofline.best_time_ms(copy, bw, peak) == pytest.approx(copy.bytes / 4e12 * 1e3)
    assert roofline.bound(traffic.add(1 << 20), bw, peak) == "memory"
    assert roofline.bound(traffic.matmul(8192, 8192, 8192, torch.bfloat16), bw, peak) == "compute"
    big = traffic.matmul(8192, 8192, 8192, torch.bfloat16)
    assert roofline.best_time_ms(big, bw, peak) == pytest.approx(big.flops / 800e12 * 1e3)
    with pytest.raises(ValueError, match="positive"):
        roofline.ridge_point(0, 100)


def test_timing_measures_real_time_and_rejects_bad_arguments():
    import time

    ms = timing.cpu_bench(lambda: time.sleep(0.01), warmup=0, rep=3)
    assert 9 <= ms <= 100
    with pytest.raises(ValueError, match="rep >= 1"):
        timing.cpu_bench(lambda: None, rep=0)
    with pytest.raises(ValueError, match="positive"):
        timing.gbps(10, 0)
    assert timing.gbps(2e9, 1000) == pytest.approx(2.0)
    assert 9 <= timing.graph_ms(lambda: time.sleep(0.01), rep=3) <= 100  # the CPU lane: cpu_bench
    calls = []
    us = timing.host_us(lambda: (calls.append(1), time.sleep(0.002)), calls=4, warmup=1)
    assert len(calls) == 5 and 1900 <= us <= 50_000
    with pytest.raises(ValueError, match="calls must be >= 1"):
        timing.host_us(lambda: None, calls=0)


def test_autotune_bench_works_for_triton_autotune_in_this_lane():
    import triton
    import triton.language as tl

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
        key=["n"],
        do_bench=timing.autotune_bench,
    )
    @triton.jit
    def _fill(out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs.to(tl.float32), mask=offs < n)

    n = 300
    out = torch.full((n,), float("nan"), device=labkernels.DEVICE)
    _fill[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](out, n)
    torch.testing.assert_close(out.cpu(), torch.arange(n, dtype=torch.float32), atol=0, rtol=0)
    assert len(_fill.cache) == 1


def test_measured_ceilings_are_positive_and_sane():
    bw = roofline.measure_copy_bandwidth(1 << 22)
    assert 0.1 < bw < 1e5
    peak = roofline.measure_matmul_peak(torch.float32, n=128)
    assert 1e-4 < peak < 1e4
    with pytest.raises(TypeError, match="float dtypes"):
        roofline.measure_matmul_peak(torch.int32)
    with pytest.raises(ValueError, match="tf32 applies"):
        roofline.measure_matmul_peak(torch.float16, tf32=True)
    with pytest.raises(ValueError, match="nbytes"):
        roofline.measure_copy_bandwidth(0)


def test_hot_copy_sweep_returns_a_table():
    table = roofline.copy_size_sweep([1 << 12, 1 << 16])
    assert table.column("nbytes") == [1 << 12, 1 << 16]
    assert all(v > 0 for v in table.column("gbps"))


def test_results_round_trip_with_environment_columns(tmp_path):
    path = record("unit", [{"n": 4, "ms": 0.5, "impl": "torch"}], tmp_path)
    table = load(path)
    row = table.rows[0]
    assert (row["n"], row["ms"], row["impl"]) == (4, 0.5, "torch")
    for column in ("device", "torch", "triton", "cuda", "date", "git"):
        assert column in row
    assert "torch" in describe(table)
    with pytest.raises(ValueError, match="no rows"):
        record("empty", [], tmp_path)


def test_shipped_reference_ceilings_load():
    table = load_reference("ceilings")
    if table is None:
        pytest.skip("no reference recorded yet")
    c = roofline.reference_ceilings()
    assert c.bandwidth_gbps > 1000 and c.peak_tflops["bfloat16"] > 100


def test_sweep_and_plot():
    table = sweep(lambda n, k: {"y": n * k}, {"n": [1, 2, 4], "k": [1, 3]})
    assert len(table) == 6 and table.where(n=4, k=3).column("y") == [12]
    ax = plot_sweep(table, "n", "y", by="k", reference=Table([{"n": 1, "k": 1, "y": 2, "device": "H200"}]))
    assert len(ax.lines) == 3
    with pytest.raises(ValueError, match="no values"):
        sweep(lambda n: {}, {"n": []})


def test_roofline_plot_places_points():
    c = roofline.Ceilings("test", 1000.0, {"float32": 10.0})
    pts = [roofline.Point("add", traffic.add(1 << 20), 1.0)]
    ax = roofline.plot_roofline(pts, [c])
    assert any(math.isclose(line.get_xdata()[0], traffic.add(1 << 20).intensity) for line in ax.lines)


def test_sweep_widget_recomputes_when_controls_change():
    import ipywidgets as w

    from labkernels.widgets import SweepWidget

    widget = SweepWidget(
        lambda top: sweep(lambda n: {"y": n}, {"n": list(range(1, top + 1))}),
        lambda t, ax: plot_sweep(t, "n", "y", ax=ax, logx=False),
        {"top": w.IntSlider(value=3, min=1, max=10)},
    )
    assert len(widget.run()) == 3
    widget.controls["top"].value = 7
    widget.button.click()
    assert len(widget.table) == 7 and widget.figure is not None


def test_env_report_has_versions():
    from labkernels.env import report

    r = report()
    assert r["torch"] == torch.__version__ and r["lane"] in ("cpu", "gpu")
