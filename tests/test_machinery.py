"""The machinery every chapter stands on: lanes, timing, the traffic model, ceilings, roofline, results."""

import math
import os
import subprocess
import sys
from pathlib import Path

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
    calls = []
    us = timing.host_us(lambda: (calls.append(1), time.sleep(0.002)), calls=4, warmup=1)
    assert len(calls) == 5 and 1900 <= us <= 50_000
    with pytest.raises(ValueError, match="calls and blocks must be >= 1"):
        timing.host_us(lambda: None, calls=0)
    # one call in five pauses 25x longer: the median of the runs ignores it, where a mean would not
    pauses = iter([0.05, 0.002, 0.002, 0.002, 0.002])
    us = timing.host_us(lambda: time.sleep(next(pauses)), calls=5, warmup=0, blocks=5)
    assert 1900 <= us <= 20_000
    # into an idle queue: each call timed alone, the median; one long pause is not the answer
    calls.clear()
    pauses = iter([0.002, 0.05, 0.002, 0.002, 0.05, 0.002, 0.002])
    us = timing.host_us_idle(lambda: (calls.append(1), time.sleep(next(pauses))), calls=5, warmup=2)
    assert len(calls) == 7 and 1900 <= us <= 20_000
    with pytest.raises(ValueError, match="calls must be >= 1"):
        timing.host_us_idle(lambda: None, calls=0)
    # alternating rounds: each round times every call in turn (however many calls a timing makes on this
    # lane), and each one's median is its own
    order = []
    times = timing.alternating_ms(
        {"slow": lambda: (order.append("slow"), time.sleep(0.004)), "fast": lambda: order.append("fast")},
        rounds=3,
        warmup=1,
        rep=3,
    )
    turns = [name for i, name in enumerate(order) if i == 0 or order[i - 1] != name]
    assert turns == ["slow", "fast"] * 3 and set(times) == {"slow", "fast"}
    assert times["slow"] > times["fast"] and times["slow"] >= 3.5


def test_graph_ms_times_the_work_of_this_lane():
    """graph_ms replays a CUDA graph on the GPU lane, so it must be given GPU work: a host sleep is not
    captured by a graph and would time as nothing. On the GPU, time a pointwise kernel over buffers far bigger
    than L2 both ways: the graph replay must see its bytes (not less than they take at a bandwidth no GPU has)
    and agree with a plain timing. On the CPU lane graph_ms is time_ms, which times the host.

    It needs the GPU to itself (gpu_jobs/test_gpu.sh runs it alone): beside another process's kernels the GPU
    time-slices, and a long replay is charged for the other's slices (2.1x a plain call, on the H200)."""
    import time

    if not labkernels.on_gpu():
        assert 9 <= timing.graph_ms(lambda: time.sleep(0.01), rep=3) <= 100
        return
    n = 64 << 20  # 256 MiB of fp32 per buffer: 512 MB moved per copy, ten times an H200's L2
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    # The fastest of three alternating rounds each: other test processes may share the GPU (make test-gpu
    # runs several), and a round that overlapped their kernels times them too.
    graph, plain = (min(ts) for ts in zip(*[_copy_both_ways(dst, src) for _ in range(3)], strict=True))
    floor = traffic.copy(n).bytes / 20e12 * 1e3  # ms at 20 TB/s, several times any GPU's HBM bandwidth
    assert graph > floor, f"graph_ms {graph:.4f} ms is faster than physics allows ({floor:.4f} ms)"
    assert 0.5 * plain <= graph <= 2 * plain, f"graph_ms {graph:.4f} ms vs time_ms {plain:.4f} ms"


def _double(src, dst) -> None:
    torch.mul(src, 2, out=dst)  # read n, write n: a copy's bytes, in a pointwise kernel


def _copy_both_ways(dst, src) -> tuple[float, float]:
    """(graph replay, plain call) of `_double`, in ms."""
    run = lambda: _double(src, dst)  # noqa: E731
    return timing.graph_ms(run, rep=50), timing.time_ms(run, rep=50)


@pytest.mark.skipif(not labkernels.on_gpu(), reason="graph replays need a GPU")
def test_graph_autotune_bench_times_the_kernel_and_keeps_torch_memory_cache():
    """The tuners' graph bencher against Triton's do_bench_cudagraph on a pointwise kernel over buffers bigger
    than L2 (they must agree), and without torch.cuda.graph's empty_cache(): torch holds at least the memory
    it held before."""
    import triton.testing

    n = 32 << 20  # 128 MiB of fp32
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    medians, references = [], []
    for _ in range(3):  # alternating rounds, the fastest of each kept: other tests may share the GPU
        reserved = torch.cuda.memory_reserved()  # before each: do_bench_cudagraph empties the cache
        median, low, high = timing.graph_autotune_bench(lambda: _double(src, dst))
        assert torch.cuda.memory_reserved() >= reserved, "the bencher released torch's cached memory"
        assert low <= median <= high
        medians.append(median)
        # the median, as the bencher's: the mean of ten replays carries any one that was slow
        references.append(
            triton.testing.do_bench_cudagraph(lambda: _double(src, dst), rep=20, return_mode="median")
        )
    median, reference = min(medians), min(references)
    agrees = 0.8 * reference <= median <= 1.25 * reference
    assert agrees, f"{median:.4f} ms; do_bench_cudagraph: {reference:.4f}"


@pytest.mark.parametrize("bench", ["autotune_bench", "graph_autotune_bench"])
def test_autotune_bench_works_for_triton_autotune_in_this_lane(bench):
    import triton
    import triton.language as tl

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
        key=["n"],
        do_bench=getattr(timing, bench),
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


# --- results files: no value changes on a round trip, no silent loss, clear errors --------------------------


def test_results_round_trip_keeps_every_value(tmp_path, monkeypatch):
    from labkernels import env

    report = env.report()
    monkeypatch.setattr(env, "report", lambda: {**report, "git": "5e12345"})
    rows = [
        {"n": 3, "ms": 0.1 + 0.2, "tag": "0123456", "rev": "1e5", "big": 2**62, "speedup": 1.5},
        {"n": 5, "ms": float("inf"), "tag": "abc", "rev": "7e308x", "big": -1, "speedup": None},
    ]
    table = load(record("unit", rows, tmp_path))
    first, second = table.rows
    assert first["git"] == "5e12345" and second["git"] == "5e12345"  # not inf
    assert first["tag"] == "0123456"  # not 123456: the column holds text
    assert first["rev"] == "1e5"  # its column holds a non-number too, so it stays text
    assert (first["n"], first["ms"], first["big"]) == (3, 0.1 + 0.2, 2**62)
    assert second["ms"] == float("inf") and first["speedup"] == 1.5 and second["speedup"] is None


def _same(a, b) -> bool:
    """Equal and of the same type (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    return a == b or (isinstance(a, float) and a != a and b != b)


def test_results_round_trip_every_type(tmp_path):
    """None, booleans, numeric-looking text, "nan"/"inf" text and ints in a mixed column come back as they
    were recorded (before: "", "True", 100000.0, nan, "12")."""
    rows = [
        {"speedup": None, "ok": True, "label": "1e5", "code": "12", "note": "nan", "mixed": 7, "x": 0.5},
        {"speedup": 1.5, "ok": False, "label": "5e12", "code": "13", "note": "inf", "mixed": "-", "x": None},
        {"speedup": 2.0, "ok": True, "label": "", "code": "007", "note": "", "mixed": 2.5, "x": math.nan},
    ]
    loaded = load(record("types", rows, tmp_path)).rows
    for want, got in zip(rows, loaded, strict=True):
        for column, value in want.items():
            assert _same(got[column], value), (column, value, got[column])


def test_a_hand_edited_csv_is_read_by_inference(tmp_path):
    """The types sidecar describes the CSV it was written with: after an edit it is not applied."""
    path = record("types", [{"n": 1, "tag": "12"}], tmp_path)
    assert load(path).rows[0]["tag"] == "12"
    path.write_text(path.read_text().replace(",12", ",14"))
    assert load(path).rows[0]["tag"] == 14  # inferred: a column of numbers


def test_every_shipped_reference_table_loads_and_round_trips(tmp_path):
    from labkernels.results import REFERENCE_DIR

    paths = sorted(REFERENCE_DIR.glob("*.csv"))
    assert paths
    for path in paths:
        table = load(path)
        assert len(table) > 0, path
        again = load(record(path.stem, table.rows, tmp_path)).rows
        for want, got in zip(table.rows, again, strict=True):
            assert all(_same(got[c], want[c]) for c in want), path


def test_every_shipped_reference_sidecar_matches_its_table():
    """A sidecar whose digest is stale is ignored, and its table loads untyped: `passed` reads "True", not
    True, and a cell testing `is True` counts nothing. Re-record a shipped table with its sidecar."""
    import hashlib
    import json

    from labkernels.results import REFERENCE_DIR, types_path

    for path in sorted(REFERENCE_DIR.glob("*.csv")):
        sidecar = types_path(path)
        if sidecar.exists():
            digest = json.loads(sidecar.read_text())["sha256"]
            assert digest == hashlib.sha256(path.read_bytes()).hexdigest(), f"{sidecar.name} is stale"


def test_leading_zero_or_overflowing_numbers_stay_text(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("device,git,code,x\nH200,0123456,007,1\nH200,1234567,12,2\n")
    rows = load(path).rows
    assert [r["git"] for r in rows] == ["0123456", "1234567"]  # a META column is always text
    assert [r["code"] for r in rows] == ["007", "12"]
    assert [r["x"] for r in rows] == [1, 2]
    path.write_text("a\n5e12345\n")
    assert load(path).rows[0]["a"] == "5e12345"


def test_record_refuses_to_replace_a_table_with_other_columns(tmp_path):
    path = record("unit", [{"n": 1, "ms": 0.5}], tmp_path)
    before = path.read_text()
    with pytest.raises(ValueError, match="other columns"):
        record("unit", [{"n": 1, "gbps": 9.0}], tmp_path)
    assert path.read_text() == before
    record("unit", [{"n": 2, "ms": 0.25}], tmp_path)  # the same measurement again: replaced
    assert load(path).column("n") == [2]
    record("unit", [{"n": 3, "gbps": 1.0}], tmp_path, replace=True)  # asked: replaced
    assert load(path).column("gbps") == [1.0]


def test_a_failing_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    import csv

    path = record("unit", [{"n": 1, "ms": 0.5}], tmp_path)
    before, types_before = path.read_text(), (tmp_path / "unit.types.json").read_text()

    def fail(self, rows):
        raise OSError("disk full")

    monkeypatch.setattr(csv.DictWriter, "writerows", fail)
    with pytest.raises(OSError, match="disk full"):
        record("unit", [{"n": 2, "ms": 0.7}], tmp_path)
    assert path.read_text() == before and (tmp_path / "unit.types.json").read_text() == types_before
    # no temporary file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit.csv", "unit.types.json"]


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("", 1, "empty file"),
        ("a,b\n1,2\n3,4,5\n", 3, "3 fields where the header has 2"),
        ("a,b\n1\n", 2, "1 fields where the header has 2"),
        ("a,a\n1,2\n", 1, "repeats column"),
        ("a,\n1,2\n", 1, "empty column name"),
        ('a,b\n1,"2\n', 2, "unexpected end of data"),
    ],
)
def test_malformed_csv_names_the_file_and_line(tmp_path, text, line, message):
    from labkernels.results import MalformedCSV

    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(MalformedCSV, match=rf"bad\.csv: line {line}: .*{message}"):
        load(path)


def test_binary_file_is_refused_clearly(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"a,b\n\xff\xfe\x00,1\n")
    with pytest.raises(ValueError, match=r"bin\.csv: not a text CSV"):
        load(path)


# --- the command line must never lose work -----------------------------------------------------------------


def _solution_folder(tmp_path):
    import nbformat

    folder = tmp_path / "sol"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Chapter 00 — exercises"),
        nbformat.v4.new_code_cell("import math"),
        nbformat.v4.new_code_cell("### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION"),
        nbformat.v4.new_code_cell("assert answer == 42"),
    ]
    path = folder / "00_x.ipynb"
    nbformat.write(nb, path)
    return folder, path


def test_exercises_refuses_to_overwrite_solutions(tmp_path, capsys):
    from labkernels.cli import main

    folder, path = _solution_folder(tmp_path)
    before = path.read_text()
    assert main(["exercises", "--solutions", str(folder), "--exercises", str(folder)]) != 0
    assert "solutions folder itself" in capsys.readouterr().err
    assert path.read_text() == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "00_x.ipynb").write_text(before)  # a folder of someone's solutions, not of generated exercises
    assert main(["exercises", "--solutions", str(folder), "--exercises", str(other)]) != 0
    assert "holds solution regions" in capsys.readouterr().err
    assert (other / "00_x.ipynb").read_text() == before
    assert main(["exercises", "--solutions", str(folder), "--exercises", str(tmp_path / "ex")]) == 0
    assert "answer = 42" not in (tmp_path / "ex" / "00_x.ipynb").read_text()


def test_exercises_check_fails_on_a_missing_folder(tmp_path, capsys):
    from labkernels.cli import main

    folder, _ = _solution_folder(tmp_path)
    assert (
        main(["exercises", "--check", "--solutions", str(folder), "--exercises", str(tmp_path / "no")]) != 0
    )
    assert "no such folder of exercises" in capsys.readouterr().err
    assert main(["exercises", "--check", "--solutions", str(tmp_path / "none")]) != 0
    assert "no such folder of solutions" in capsys.readouterr().err


def _exercise_cli(*args):
    from labkernels.cli import main

    return main(["exercises", *map(str, args)])


def test_exercises_keeps_a_learners_edited_notebook(tmp_path, capsys):
    folder, _ = _solution_folder(tmp_path)
    ex = tmp_path / "ex"
    assert _exercise_cli("--solutions", folder, "--exercises", ex) == 0
    answered = (ex / "00_x.ipynb").read_text().replace("raise NotImplementedError", "answer = 41  #")
    (ex / "00_x.ipynb").write_text(answered)
    capsys.readouterr()
    assert _exercise_cli("--solutions", folder, "--exercises", ex) != 0  # before: rewrote it, exit 0
    err = capsys.readouterr().err
    assert str(ex / "00_x.ipynb") in err and "--exercises ex-new" in err and "--force" in err
    assert (ex / "00_x.ipynb").read_text() == answered
    assert _exercise_cli("--solutions", folder, "--exercises", tmp_path / "ex-new") == 0  # stubs beside
    assert _exercise_cli("--solutions", folder, "--exercises", ex, "--force") == 0
    assert "answer = 41" not in (ex / "00_x.ipynb").read_text()


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_exercises_refreshes_stubs_that_only_the_solutions_changed(tmp_path):
    """An instructor edits a solution notebook: its committed exercise is replaced (it is no one's work)."""
    folder, path = _solution_folder(tmp_path)
    ex = tmp_path / "ex"
    assert _exercise_cli("--solutions", folder, "--exercises", ex) == 0
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-qm", "course")
    path.write_text(path.read_text().replace("### BEGIN SOLUTION", "x = 0\\n### BEGIN SOLUTION"))
    assert _exercise_cli("--check", "--solutions", folder, "--exercises", ex) != 0
    assert _exercise_cli("--solutions", folder, "--exercises", ex) == 0
    assert _exercise_cli("--check", "--solutions", folder, "--exercises", ex) == 0


def test_exercises_check_points_to_a_command_that_keeps_work(tmp_path, capsys):
    folder, path = _solution_folder(tmp_path)
    ex = tmp_path / "ex"
    assert _exercise_cli("--solutions", folder, "--exercises", ex) == 0
    path.write_text(path.read_text().replace("### BEGIN SOLUTION", "x = 0\\n### BEGIN SOLUTION"))
    capsys.readouterr()
    assert _exercise_cli("--check", "--solutions", folder, "--exercises", ex) != 0
    err = capsys.readouterr().err
    assert "is stale" in err and "make exercises" not in err  # before: `make exercises` (which overwrote)
    assert f"python -m labkernels exercises --solutions {folder} --exercises {ex}" in err


def test_exercises_refuses_the_chapters_folder_and_a_file(tmp_path, capsys):
    import shutil

    root = Path(__file__).resolve().parents[1]
    solutions, chapters = tmp_path / "solutions", tmp_path / "notebooks"
    shutil.copytree(root / "solutions", solutions)
    shutil.copytree(root / "notebooks", chapters, ignore=shutil.ignore_patterns("appendix"))
    before = {p.name: p.read_text() for p in chapters.glob("*.ipynb")}
    assert _exercise_cli("--solutions", solutions, "--exercises", chapters) != 0  # before: stubs, exit 0
    assert "not generated exercises" in capsys.readouterr().err
    assert {p.name: p.read_text() for p in chapters.glob("*.ipynb")} == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "scratch.ipynb").write_text("{}")
    folder, _ = _solution_folder(tmp_path)
    assert _exercise_cli("--solutions", folder, "--exercises", mine) != 0
    assert "no solution notebook" in capsys.readouterr().err
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert _exercise_cli("--solutions", folder, "--exercises", a_file) == 2  # before: FileExistsError
    assert "is a file, not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "mine"


def test_exercises_name_the_file_and_line_of_a_broken_solution(tmp_path, capsys):
    folder, path = _solution_folder(tmp_path)
    path.write_text(path.read_text()[:-40])  # cut short: not JSON
    assert _exercise_cli("--solutions", folder, "--exercises", tmp_path / "ex") == 2
    err = capsys.readouterr().err
    assert f"{path} is not a notebook: not JSON at line" in err and "Traceback" not in err
    path.write_text(nbformat_notebook(["x = 1", "def f():\n    ### BEGIN SOLUTION\n    return 1\n"]))
    assert _exercise_cli("--solutions", folder, "--exercises", tmp_path / "ex") == 2
    err = capsys.readouterr().err
    assert f"{path}, cell 1: line 2: ### BEGIN SOLUTION without an END" in err and "nested" not in err
    unclosed = "### BEGIN SOLUTION\na = 1\n### BEGIN SOLUTION\nb = 2\n### END SOLUTION"
    path.write_text(nbformat_notebook([unclosed]))
    assert _exercise_cli("--solutions", folder, "--exercises", tmp_path / "ex") == 2
    err = capsys.readouterr().err
    assert "cell 0: the ### BEGIN SOLUTION at line 1 has no ### END SOLUTION before the next" in err
    assert "nested" not in err and not (tmp_path / "ex").exists()


def nbformat_notebook(sources: list[str]) -> str:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nbformat.writes(nb)


def test_grade_json_into_a_new_folder_keeps_the_results(tmp_path, monkeypatch):
    import json

    from labkernels.cli import main
    from labkernels.grading import notebooks

    fake = [{"notebook": "00_x.ipynb", "problem": None, "exercises": []}]
    graded = []
    fake_grade = lambda folder, cell_timeout, **limits: graded.append(1) or fake  # noqa: E731
    monkeypatch.setattr(notebooks, "grade_folder", fake_grade)
    folder = tmp_path / "submissions"  # a report is never written into the graded folder
    folder.mkdir()
    report = tmp_path / "new" / "deeper" / "report.json"
    assert main(["grade", str(folder), "--json", str(report)]) == 0
    assert json.loads(report.read_text()) == fake
    # a report path that can never be written is refused before grading starts
    graded.clear()
    assert main(["grade", str(folder), "--json", str(tmp_path / "new")]) == 2
    assert graded == []


# --- helpers given empty or wrong input say so -------------------------------------------------------------


def test_helpers_given_empty_input_raise_clear_errors_or_return_empty():
    with pytest.raises(ValueError, match="moves no bytes"):
        _ = traffic.Traffic("nothing", 0, 0).intensity
    with pytest.raises(ValueError, match="must be a number >= 0"):
        traffic.Traffic("bad", -1, 0)
    assert sum([traffic.add(4), traffic.relu(4)]).bytes == traffic.add_relu(4, fused=False).bytes
    with pytest.raises(ValueError, match="not a ceilings table"):
        roofline.ceilings_from_table(Table([]))
    with pytest.raises(ValueError, match="exactly one copy_bandwidth row"):
        roofline.ceilings_from_table(Table([{"quantity": "matmul_peak", "dtype": "float32", "value": 1.0}]))
    with pytest.raises(KeyError, match="no 'bfloat16' matmul peak"):
        roofline.Ceilings("cpu", 10.0, {"float32": 1.0}).ridge_point("bfloat16")
    assert roofline.plot_roofline([], []) is not None
    assert len(plot_sweep(Table([]), "n", "y", by="k").lines) == 0
    with pytest.raises(KeyError, match=r"no column\(s\) \['y'\]"):
        plot_sweep(Table([{"n": 1}]), "n", "y")
    with pytest.raises(TypeError, match="must return a dict"):
        sweep(lambda n: n, {"n": [1]})
    with pytest.raises(TypeError, match="must be a list of values"):
        sweep(lambda n: {}, {"n": 5})
    assert Table([]).column("x") == [] and repr(Table([])) == "Table(empty)"


def test_read_write_mix_rows_count_the_bytes_they_move():
    from labkernels.ch00_roofline.ops import read_write_mix_rows

    n = 1 << 12
    rows = read_write_mix_rows(n)
    assert {(r["reads"], r["writes"]) for r in rows} == {(0, 1), (1, 1), (2, 1), (3, 1), (1, 0)}
    for r in rows:
        assert r["bytes"] == (r["reads"] + r["writes"]) * n * 4 and r["gbps"] > 0
    assert [r["fraction_of_copy"] for r in rows if (r["reads"], r["writes"]) == (1, 1)] == [1.0]
    with pytest.raises(ValueError, match="positive int"):
        read_write_mix_rows(0)


def test_cpu_ceilings_leave_the_cache_and_take_the_best_matmul(monkeypatch):
    if labkernels.on_gpu():
        pytest.skip("CPU-lane sizes")
    seen = []
    monkeypatch.setattr(roofline, "_copy_bandwidth", lambda nbytes: seen.append(nbytes) or 10.0)
    roofline._copy_bandwidth_once.cache_clear()
    assert roofline.measure_copy_bandwidth() == 10.0
    assert seen and 2 * seen[0] >= 64 << 20  # the rule itself is tested in test_plots.py
    roofline._copy_bandwidth_once.cache_clear()
    rates = {512: 0.05, 1024: 0.2, 2048: 0.1}
    original = roofline.measure_matmul_peak

    def fake(dtype, n=None, tf32=False):
        return original(dtype, None, tf32) if n is None else rates[n]

    monkeypatch.setattr(roofline, "measure_matmul_peak", fake)
    assert roofline.measure_matmul_peak(torch.float32) == 0.2  # the best of the sizes, not the first


def test_sweep_leaves_no_progress_line_in_a_notebook(monkeypatch):
    """In a kernel the bar is shown under a display id and blanked at the end (no frozen '0%' line)."""
    from labkernels import sweep as sweep_module

    shown, updates = [], []

    class Handle:
        def update(self, obj, raw=False):
            updates.append((obj, raw))

    monkeypatch.setattr(sweep_module, "_in_kernel", lambda: True)
    monkeypatch.setattr(
        "IPython.display.display", lambda obj, display_id=False: shown.append(obj) or Handle()
    )
    table = sweep(lambda n: {"y": n}, {"n": [1, 2, 3]}, desc="unit")
    assert table.column("y") == [1, 2, 3]
    assert len(shown) == 1 and updates == [({"text/plain": ""}, True)]


def test_rotating_runs_each_call_in_turn_and_refuses_none():
    from labkernels import timing

    seen = []
    call = timing.rotating([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        call()
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="at least one"):
        timing.rotating([])


def test_host_launch_arithmetic_agrees_with_triton():
    """labkernels.hostmath gives triton.cdiv's and next_power_of_2's answers without their JIT dispatch."""
    import triton

    from labkernels import hostmath

    for x in [*range(0, 300), 2**31 - 1, 2**40 + 3]:
        for y in (1, 2, 3, 7, 64, 128, 1000):
            assert hostmath.cdiv(x, y) == triton.cdiv(x, y)
    for n in [*range(0, 5000), 2**31 - 1, 2**31, 2**31 + 1]:
        assert hostmath.next_power_of_2(n) == triton.next_power_of_2(n), n
