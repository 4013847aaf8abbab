"""labkernels.profile: ncu's raw CSV page, the derived columns, the case registry, and (GPU lane with ncu)
one real profile checked against the bytes a copy must move."""

from __future__ import annotations

import pytest
import torch

import labkernels
from labkernels import profile as P
from labkernels.results import Table

# A hand-written FIXTURE in the layout of `ncu --import R --csv --page raw` (header row, units row, quoted
# cells, thousands separators, n/a): made-up numbers that test the parser, not measurements.
METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__time_duration.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "launch__occupancy_limit_blocks",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
]
HEAD = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size"]
HEAD += ["Grid Size", "Device", "CC"]
TILED = "void copy_2d_tiled_kernel<float, true>(const float *, float *, long, long, long, long, long)"
FIXTURE_ROWS = [
    HEAD + METRICS,
    [""] * len(HEAD) + ["Mbyte", "byte", "usecond", "", "sector", "block", "block", "block", "block", "%"],
    ["0", "4242", "python3", "host", TILED, "1", "7", "(32, 8, 1)", "(65536, 1, 1)", "0", "9.0"]
    + ["268.44", "268,435,456", "1,234.5", "2,097,152", "8,388,608", "32", "8", "21", "8", "81.5"],
    ["1", "4242", "python3", "host", "_copy_2d_naive_kernel", "1", "7", "(128, 1, 1)", "(65536, 1, 1)", "0"]
    + ["9.0", "n/a", "1,024", "2", "16", "512", "32", "16", "32", "16", "90"],
]
FIXTURE = "==PROF== a note ncu prints before the table\n" + "".join(
    ",".join(f'"{cell}"' for cell in row) + "\n" for row in FIXTURE_ROWS
)


def test_parse_raw_csv_reads_the_fixture():
    rows = P.parse_raw_csv(FIXTURE)
    assert [r["id"] for r in rows] == [0, 1]
    first, second = rows
    assert first["kernel"].startswith("void copy_2d_tiled_kernel<float, true>(")
    assert first["block"] == "(32, 8, 1)" and first["grid"] == "(65536, 1, 1)"
    assert first["dram__bytes_read.sum"] == pytest.approx(268.44e6)  # Mbyte -> bytes
    assert first["dram__bytes_write.sum"] == 268_435_456  # thousands separators
    assert first["gpu__time_duration.sum"] == pytest.approx(1_234_500.0)  # usecond -> ns
    assert first["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(81.5)
    assert second["dram__bytes_read.sum"] is None  # n/a
    assert "Process ID" not in first and "Device" not in first


def test_parse_raw_csv_refuses_other_text():
    with pytest.raises(ValueError, match="Kernel Name"):
        P.parse_raw_csv("a,b\n1,2\n")


@pytest.mark.parametrize(
    "text, unit, expected",
    [
        ("1,024", "", 1024),
        ("2.5", "Kbyte", 2500.0),
        ("3", "msecond", 3_000_000),
        ("n/a", "", None),
        ("x", "", "x"),
    ],
)
def test_parse_value(text, unit, expected):
    assert P.parse_value(text, unit) == expected


def test_derived_columns():
    first, second = (P.derive(r) for r in P.parse_raw_csv(FIXTURE))
    assert first["sectors_per_request_ld"] == pytest.approx(4.0)  # 8,388,608 / 2,097,152
    assert second["sectors_per_request_ld"] == pytest.approx(32.0)
    assert first["occupancy_limiter"] == "registers=warps"  # 8 blocks each, fewer than 21 and 32
    assert second["occupancy_limiter"] == "registers=warps"
    assert first["dram_bytes"] == pytest.approx(268.44e6 + 268_435_456)
    assert "dram_bytes" not in second  # a missing read count gives no total, not a wrong one
    assert first["time_us"] == pytest.approx(1234.5)


def test_occupancy_limiter_names_the_smallest():
    row = {m: 32 for m in P.LIMITS.values()} | {"launch__occupancy_limit_shared_mem": 3}
    assert P.occupancy_limiter(row) == "shared_mem"
    assert P.occupancy_limiter({}) is None


@pytest.mark.parametrize(
    "name, base",
    [
        ("void copy_2d_tiled_kernel<float, true>(const float *, float *)", "copy_2d_tiled_kernel"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::Foo<float>>(int, float)",
            "vectorized_elementwise_kernel",
        ),
        ("(anonymous namespace)::k<(int)1>(float *)", "k"),
        (  # a parameter whose type lives in an anonymous namespace: the name is still the function's
            "void labkernels::cuda::(anonymous namespace)::copy_strided_kernel<float, int>(const T1 *, T1 *, "
            "labkernels::cuda::(anonymous namespace)::StridedGeometry<T2>, T2)",
            "copy_strided_kernel",
        ),
        ("void ns::<unnamed>::copy_2d_tiled_kernel<float>(const T1 *, T1 *, long)", "copy_2d_tiled_kernel"),
        ("_matmul_tiles", "_matmul_tiles"),
        ("triton_poi_fused_add_relu_0", "triton_poi_fused_add_relu_0"),
    ],
)
def test_kernel_names(name, base):
    assert P.base_name(name) == base
    assert P.kernel_matches(name, f"^{base}$")


def test_kernel_matches_is_a_search():
    assert P.kernel_matches("triton_per_fused__softmax_0", r"triton_\w+_fused_.*softmax")
    assert not P.kernel_matches("_copy_2d_naive_kernel", "^copy_2d_tiled_kernel$")
    assert P.kernel_matches("anything", None)


def test_unknown_metrics_judged_by_listed_families():
    known = {"dram__bytes_read", "sm__warps_active"}
    asked = [
        "dram__bytes_read.sum",
        "dram__no_such.sum",
        "launch__registers_per_thread",
        "sm__warps_active.avg",
    ]
    assert P._unknown(asked, known) == ["dram__no_such.sum"]  # launch__ is not listed at all: not judged
    assert P._unknown(asked, set()) == []


def test_error_text_names_metrics():
    output = "==PROF== Connected\n==ERROR== Failed to find metric sm__pipe_tensor_op_gmma_cycles_active.avg\n"
    asked = ["dram__bytes_read.sum", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    assert P._named_in(output, asked) == asked[1:]  # by base name: the error gave no suffix
    output = "==ERROR== Unknown metric dram__bytes_read.sum.per_second\n"
    asked = ["dram__bytes_read.sum", "dram__bytes_read.sum.per_second", "gpu__time_duration.sum"]
    assert P._named_in(output, asked) == ["dram__bytes_read.sum.per_second"]  # by full name only
    assert P._named_in("==PROF== fine\n", asked) == []


def test_ncu_command_keeps_clocks_and_window():
    command = P._ncu_command(
        "ncu", "ch02.transpose_cuda_tiled", ["a__b.sum", "c__d.sum"], P.Path("r.ncu-rep")
    )
    text = " ".join(command)
    assert "--clock-control none" in text and "--profile-from-start off" in text
    assert "--metrics a__b.sum,c__d.sum" in text
    assert command[-2:] == ["run", "ch02.transpose_cuda_tiled"]


def test_metrics_for_questions():
    metrics = P.metrics_for(["coalescing", "spills"])
    assert metrics[0] == P.TIME
    assert "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum" in metrics
    assert len(metrics) == len(set(metrics))
    with pytest.raises(KeyError, match="unknown profile question.*nonsense"):
        P.metrics_for(["nonsense"])


def test_registry_lists_every_case():
    from labkernels.ch02_strides import profiles as ch02
    from labkernels.ch03_triton import profiles as ch03
    from labkernels.ch04_libraries import profiles as ch04
    from labkernels.ch05_fusion import profiles as ch05
    from labkernels.ch06_attention import profiles as ch06
    from labkernels.ch07_decode import profiles as ch07

    found = P.discover()
    chapters = [
        *ch02.CASES,
        *ch03.CASES,
        *ch04.CASES,
        *ch04.CONV_CASES,
        *ch05.CASES,
        *ch06.CASES,
        *ch07.CASES,
    ]
    for name in chapters:
        assert name in found, name
        assert found[name].doc and found[name].questions
    assert {n.split(".")[0] for n in found} >= {"ch02", "ch03", "ch04", "ch05", "ch06", "ch07"}


def test_chapter_07_cases_carry_the_bytes_each_gemv_must_read():
    """The 4-bit cases read half a byte a weight plus the scales; cuBLAS reads two bytes a weight."""
    from labkernels.ch07_decode import int4
    from labkernels.ch07_decode import profiles as ch07

    found = P.discover()
    m, n, k = ch07.M, ch07.N, ch07.K
    int4_bytes = n * k // 2 + (m * k + n * (k // int4.GROUP) + m * n) * 2
    assert found["ch07.int4_labkernels"].model_bytes == int4_bytes
    assert found["ch07.int4_torch_int4pack"].model_bytes == int4_bytes
    assert found["ch07.int4_cublas_bf16"].model_bytes == (m * k + n * k + m * n) * 2
    assert found["ch07.int4_labkernels"].total  # the one-row kernel and its split-K sum
    assert "in_flight" in found["ch07.int4_labkernels"].questions


def test_chapter_05_and_06_cases_carry_their_traffic_model():
    """The eager and naive cases launch one kernel per op: they are summed; every case has its model."""
    from labkernels import traffic
    from labkernels.ch05_fusion import profiles as ch05
    from labkernels.ch06_attention import profiles as ch06

    found = P.discover()
    n = ch05.N_ELEMENTS
    assert found["ch05.chain_15_eager"].total and found["ch06.attention_naive"].total
    assert not found["ch05.chain_15"].total  # one kernel: its own row is the whole case
    assert found["ch05.chain_15_eager"].model_bytes == 31 * n * 4  # 2N+1 passes over n fp32
    assert found["ch05.chain_60"].model_bytes == found["ch05.chain_2"].model_bytes == 3 * n * 4
    assert found["ch06.attention_naive"].model_bytes == traffic.attention_naive(*ch06.SHAPE).bytes
    assert found["ch06.attention_sdpa_flash"].model_bytes == traffic.flash_attention(*ch06.SHAPE).bytes
    assert all(found[c].model_bytes for c in [*ch05.CASES, *ch06.CASES])
    assert {"spills", "occupancy", "dram"} <= set(found["ch05.chain_60"].questions)
    assert set(found["ch06.attention_labkernels"].questions) == {"dram", "tensor_pipe"}


def test_make_bench_finds_the_profiler_tables_and_the_timings():
    """In a fresh process: here, other tests have already imported the chapters' profiles modules."""
    import subprocess
    import sys

    code = "from labkernels import bench; print(' '.join(sorted(bench.discover())))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = set(done.stdout.split())
    assert {"ch02_profile", "ch03_profile", "ch04_profile", "ch03_grouping", "ch02_transpose"} <= found
    assert {"ch05_profile", "ch06_profile", "ch07_profile"} <= found


def test_unknown_case_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown profile case 'ch99.nothing'"):
        P.get_case("ch99.nothing")
    with pytest.raises(KeyError, match="unknown profile question"):
        P.case("ch99.bad", questions=["nonsense"])
    with pytest.raises(ValueError, match="model_bytes must be a positive int, got 0"):
        P.case("ch99.bad", questions=["dram"], model_bytes=0)


# A second hand-written FIXTURE in the same layout: an eager chain, one kernel per torch op (add, relu, mul),
# made-up numbers. The relu kernel reads 1.5 of its MB from L2's leftovers, so the kernels' bytes differ.
EAGER = "void at::native::vectorized_elementwise_kernel<4, at::native::{}<float>>(int, float)"
EAGER_METRICS = [
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
    "launch__registers_per_thread",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
]
EAGER_ROWS = [
    HEAD + EAGER_METRICS,
    [""] * len(HEAD) + ["Mbyte", "Mbyte", "%", "usecond", "register/thread", "%", "%"],
    ["0", "4242", "python3", "host", EAGER.format("AddFunctor"), "1", "7", "(128, 1, 1)", "(1024, 1, 1)", "0"]
    + ["9.0", "8", "4", "90", "3", "16", "0", "20"],
    [
        "1",
        "4242",
        "python3",
        "host",
        EAGER.format("ReluFunctor"),
        "1",
        "7",
        "(128, 1, 1)",
        "(1024, 1, 1)",
        "0",
    ]
    + ["9.0", "2.5", "4", "60", "1", "18", "n/a", "10"],
    ["2", "4242", "python3", "host", EAGER.format("MulFunctor"), "1", "7", "(128, 1, 1)", "(1024, 1, 1)", "0"]
    + ["9.0", "4", "4", "80", "2", "16", "0", "30"],
]
EAGER_PAGE = "".join(",".join(f'"{cell}"' for cell in row) + "\n" for row in EAGER_ROWS)


def test_total_row_sums_bytes_and_time():
    total = P.total_row(P.parse_raw_csv(EAGER_PAGE))
    assert total["kernels"] == 3
    assert total["dram__bytes_read.sum"] == pytest.approx(14.5e6)  # 8 + 2.5 + 4 MB
    assert total["dram__bytes_write.sum"] == pytest.approx(12e6)
    assert total[P.TIME] == pytest.approx(6_000)  # 3 + 1 + 2 us, in ns
    # % of peak over elapsed time: weighted by each kernel's time, (90*3 + 60*1 + 80*2) / 6
    assert total["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(490 / 6)
    assert total["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(130 / 6)
    assert "launch__registers_per_thread" not in total  # a per-launch setting does not add up
    assert not any("hmma" in m for m in total)  # n/a in one kernel: no total rather than a wrong one
    derived = P.derive(total)
    assert derived["dram_bytes"] == pytest.approx(26.5e6) and derived["time_us"] == pytest.approx(6.0)


@pytest.fixture
def fake_ncu(monkeypatch):
    """Cases registered here only, and an ncu that returns EAGER_PAGE for any case."""
    monkeypatch.setattr(P, "CASES", dict(P.discover()))
    monkeypatch.setattr(P, "run_ncu", lambda name, metrics, keep=None: (EAGER_PAGE, EAGER_METRICS))
    return P.case


def test_a_summed_case_keeps_its_kernels_and_adds_their_sum(fake_ncu):
    fake_ncu("t.eager", questions=["dram"], total=True, model_bytes=20_000_000)(lambda: None)
    table = P.profile("t.eager")
    kernels = [r["kernel"] for r in table.rows]
    assert kernels == ["vectorized_elementwise_kernel"] * 3 + ["sum of 3 kernels"]
    per_kernel, whole = table.rows[:3], table.rows[3]
    assert [r["dram_bytes"] for r in per_kernel] == pytest.approx([12e6, 6.5e6, 8e6])
    assert "kernels" not in per_kernel[0] and "model_bytes" not in per_kernel[0]
    assert whole["case"] == "t.eager" and whole["question"] == "dram" and whole["kernels"] == 3
    assert whole["dram_bytes"] == pytest.approx(26.5e6) and whole["time_us"] == pytest.approx(6.0)
    assert whole["model_bytes"] == 20_000_000 and whole["dram_vs_model"] == pytest.approx(26.5 / 20)
    assert "tensor_pipe_pct" not in whole  # the pipe's % did not add up; the SM's throughput is not it
    assert "launch__registers_per_thread" not in whole


def test_a_case_without_total_keeps_one_row_per_kernel(fake_ncu):
    fake_ncu("t.plain", questions=["dram"], model_bytes=20_000_000)(lambda: None)
    with pytest.warns(UserWarning, match="3 kernels and no total=True"):
        table = P.profile("t.plain")
    assert len(table) == 3 and not any("model_bytes" in r or "kernels" in r for r in table.rows)
    fake_ncu("t.one", questions=["dram"], kernel="MulFunctor", total=True, model_bytes=4_000_000)(
        lambda: None
    )
    (row,) = P.profile("t.one").rows  # one kernel: no sum row, and its own row carries the model
    assert row["dram_bytes"] == pytest.approx(8e6) and row["dram_vs_model"] == pytest.approx(2.0)


def test_summary_shows_a_sum_with_or_without_its_kernels(fake_ncu, tmp_path):
    from labkernels.results import load, record

    fake_ncu("ch05.eager", questions=["dram"], total=True, model_bytes=20_000_000)(lambda: None)
    fake_ncu("ch05.fused", questions=["dram"], kernel="AddFunctor", model_bytes=12_000_000)(lambda: None)
    rows = P.profile("ch05.eager").rows + P.profile("ch05.fused").rows
    table = load(record("t_profile", rows, tmp_path))  # as the notebook reads it: a CSV, "" where absent
    text = P.summary(table, ["dram"], per_kernel=False).splitlines()
    assert text[0].split() == ["case", "kernel", "time_us", "dram_bytes", "dram_%peak", "model_bytes"] + [
        "dram/model"
    ]
    assert [line.split()[:2] for line in text[1:]] == [
        ["eager", "sum"],
        ["fused", "vectorized_elementwise_kernel"],
    ]
    assert text[1].split()[-2:] == ["2e+07", "1.32"] and text[2].split()[-1] == "1"
    assert len(P.summary(table, ["dram"]).splitlines()) == 1 + 4 + 1  # every kernel, then the sum


def test_summary_is_lane_independent_text():
    table = Table(
        [
            {"case": "ch02.c1", "kernel": "k", "sectors_per_request_ld": 4.0, "sectors_per_request_st": 4.0},
            {"case": "ch02.c2", "kernel": "k2", "sectors_per_request_ld": 32.0, "sectors_per_request_st": ""},
            {"case": "ch02.c3", "kernel": "k3", "time_us": 5.0},  # profiled for another question: left out
        ]
    )
    text = P.summary(table, ["coalescing"])
    assert text.splitlines() == [  # short headings; the chapter's prefix dropped from case names
        "case  kernel  sectors/req_ld  sectors/req_st",
        "c1    k                    4               4",
        "c2    k2                  32               -",
    ]


def test_show_without_a_recorded_table(capsys, monkeypatch):
    monkeypatch.setattr(P, "load_reference", lambda name: None)
    P.show("ch02_profile")
    assert "no profiler results recorded yet" in capsys.readouterr().out


@pytest.mark.skipif(labkernels.on_gpu(), reason="CPU-lane behaviour")
def test_not_available_without_a_gpu():
    assert not P.available()
    with pytest.raises(RuntimeError, match="GPU lane"):
        P.profile("ch02.copy_contiguous")


def test_ncu_found_on_path(tmp_path, monkeypatch):
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\n")
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert P.ncu_path() == str(ncu)


@pytest.mark.gpu
@pytest.mark.skipif(not P.available(), reason="needs the GPU lane and ncu")
def test_copy_moves_twice_its_bytes():
    """A contiguous copy of N bytes makes HBM deliver N and take N: ncu's DRAM bytes within 10% of 2N."""
    from labkernels.ch02_strides import profiles as ch02

    table = P.profile("ch02.copy_contiguous", "dram")
    nbytes = ch02.N * ch02.N * torch.float32.itemsize
    assert len(table) == 1
    assert table.rows[0]["dram_bytes"] == pytest.approx(2 * nbytes, rel=0.1)


def test_run_ncu_drops_a_refused_metric_and_retries(monkeypatch):
    """A fake ncu that refuses one metric by name, then profiles: the case runs again without it."""
    import subprocess

    calls = []

    def fake_run(command, timeout):
        calls.append(command)
        if "--import" in command:
            return subprocess.CompletedProcess(command, 0, FIXTURE, "")
        metrics = command[command.index("--metrics") + 1].split(",")
        if "bogus__metric.sum" in metrics:
            return subprocess.CompletedProcess(
                command, 1, "", "==ERROR== Failed to find metric bogus__metric.sum"
            )
        P.Path(command[command.index("--export") + 1]).write_bytes(b"report")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(P, "_require_ncu", lambda: "ncu")
    monkeypatch.setattr(P, "_run", fake_run)
    with pytest.warns(UserWarning, match="bogus__metric.sum"):
        page, measured = P.run_ncu("ch02.copy_contiguous", ["dram__bytes_read.sum", "bogus__metric.sum"])
    assert measured == ["dram__bytes_read.sum"]
    assert len(calls) == 3 and page == FIXTURE


def test_run_ncu_reports_a_failure_it_cannot_fix(monkeypatch):
    import subprocess

    monkeypatch.setattr(P, "_require_ncu", lambda: "ncu")
    monkeypatch.setattr(P, "known_metrics", lambda ncu: set())
    monkeypatch.setattr(
        P, "_run", lambda c, t: subprocess.CompletedProcess(c, 9, "", "==ERROR== out of memory")
    )
    with pytest.raises(RuntimeError, match="(?s)ncu failed on case 'x' \\(exit 9\\).*out of memory"):
        P.run_ncu("x", ["dram__bytes_read.sum"])


def test_make_bench_skips_profiler_tables_without_ncu(monkeypatch, tmp_path):
    """On a GPU without ncu, `make bench` keeps the shipped counter tables and records everything else."""
    import labkernels
    from labkernels import bench

    def needs_ncu():
        raise P.ProfilerUnavailable("ncu (Nsight Compute) not found")

    monkeypatch.setattr(labkernels, "on_gpu", lambda: True)
    monkeypatch.setattr(bench, "discover", lambda: {"t_profile": needs_ncu, "t_plain": lambda: [{"x": 1}]})
    written = bench.run(directory=tmp_path)
    assert [p.rsplit("/", 1)[-1] for p in written] == ["t_plain.csv"]
    assert not (tmp_path / "t_profile.csv").exists()


def test_tensor_pipe_is_the_pipes_own_counter_never_the_sms_throughput():
    """A softmax keeps the SM busy with the tensor cores idle: its tensor-pipe % is the hmma counter's."""
    busy_sm = {
        "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 2.4,
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": 77.3,
    }
    assert P.derive(busy_sm)["tensor_pipe_pct"] == pytest.approx(2.4)
    assert "tensor_pipe_pct" not in P.derive({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 77.3})
