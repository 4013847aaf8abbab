"""Chapter 04's cost model (FLOPs, bytes, intensity, tiles, waves) and measurement helpers (TF32 rounding and
settings, kernel-name parsing, cuDNN first calls). GPU-only checks are marked `gpu`."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch

import labkernels
from labkernels.ch04_libraries import gemm_model as gm
from labkernels.ch04_libraries import libraries as lib

gpu = pytest.mark.skipif(not labkernels.on_gpu(), reason="needs the GPU lane")


# --- FLOPs, bytes, intensity -------------------------------------------------------------------------------


@pytest.mark.parametrize("precision, es", [("float32", 4), ("tf32", 4), ("float16", 2), ("bfloat16", 2)])
def test_gemm_counts_flops_and_bytes(precision, es):
    m, n, k = 1823, 781, 97
    t = gm.gemm(m, n, k, precision)
    assert t.flops == 2 * m * n * k
    assert t.bytes == es * (m * k + k * n + m * n)  # read A and B once, write C once
    assert t.intensity == pytest.approx(2 * m * n * k / (es * (m * k + k * n + m * n)))


def test_k_over_2_holds_only_when_m_and_n_dwarf_k():
    k = 10
    assert gm.intensity_limit_large_mn(k, "float32") == k / 2
    assert gm.intensity_limit_large_mn(k, "bfloat16") == k
    assert gm.intensity(10**7, 10**7, k, "float32") == pytest.approx(k / 2, rel=1e-5)
    for s in (96, 1000, 4096):  # a square: 2K / (3 bytes per element), a third of "K/2"
        assert gm.intensity(s, s, s, "float32") == pytest.approx(s / 6)
    # K ≫ M, N: the intensity no longer depends on K
    assert gm.intensity(100, 100, 10**8, "float32") == pytest.approx(2 * 100 * 100 / (4 * 200), rel=1e-5)


def test_gemm_rejects_bad_input():
    with pytest.raises(ValueError, match="precision"):
        gm.gemm(4, 4, 4, "float8")
    with pytest.raises(ValueError, match="positive"):
        gm.gemm(0, 4, 4)
    with pytest.raises(ValueError, match="k must be"):
        gm.intensity_limit_large_mn(0)


@pytest.mark.parametrize("trial", range(5))
def test_conv_model_matches_torch_shapes(trial):
    rng = random.Random()
    b, c, h, w, oc = (
        rng.randint(1, 5),
        rng.randint(1, 9),
        rng.randint(5, 19),
        rng.randint(5, 19),
        rng.randint(1, 7),
    )
    kernel, stride, padding = rng.choice([1, 3, 5]), rng.randint(1, 3), rng.randint(0, 2)
    out = torch.nn.functional.conv2d(
        torch.randn(b, c, h, w), torch.randn(oc, c, kernel, kernel), stride=stride, padding=padding
    )
    assert out.shape[2:] == (
        gm.conv_output_size(h, kernel, stride, padding),
        gm.conv_output_size(w, kernel, stride, padding),
    )
    t = gm.conv2d(b, c, h, w, oc, kernel, stride, padding, dtype=torch.float16)
    assert t.flops == 2 * out.numel() * c * kernel * kernel
    assert t.bytes == 2 * (b * c * h * w + oc * c * kernel * kernel + out.numel())


def test_conv_output_size_refuses_a_kernel_that_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        gm.conv_output_size(2, 5, 1, 0)


# --- tiles and waves ---------------------------------------------------------------------------------------


def test_tiles_count_edge_tiles_as_whole():
    assert gm.tiles(256, 512, 128, 256) == 4
    assert gm.tiles(257, 513, 128, 256) == 9
    assert gm.waves(132) == 1 and gm.waves(133) == 2 and gm.waves(133, sms=200) == 1
    assert gm.wave_efficiency(133) == pytest.approx(133 / 264)


@pytest.mark.parametrize("trial", range(10))
def test_wave_steps_are_where_the_wave_count_changes(trial):
    rng = random.Random()
    m, bm, bn, sms = (
        rng.randint(1, 9000),
        rng.choice([64, 128, 256]),
        rng.choice([64, 128, 256]),
        rng.randint(8, 140),
    )
    n_max = rng.randint(bn, 40 * bn)
    ns = range(1, n_max + 1)
    count = [gm.waves(gm.tiles(m, n, bm, bn), sms) for n in ns]
    brute = [n for n, before, after in zip(ns[1:], count, count[1:], strict=False) if after > before]
    assert gm.wave_steps(m, n_max, bm, bn, sms) == brute


def test_predicted_time_is_flat_within_a_wave_and_steps_between():
    m, k, bm, bn = 2048, 4096, 128, 256
    first, second = gm.wave_steps(m, 8192, bm, bn)[:2]
    at = {n: gm.predicted_ms(m, n, k, bm, bn, peak_tflops=700.0) for n in (1, first - 1, first, second - 1)}
    assert at[1] == at[first - 1] < at[first] == at[second - 1]
    assert at[first] == pytest.approx(2 * at[1])


def test_wave_table_rows():
    rows = gm.wave_table(2048, [256, 2048, 2049], 128, 256)
    assert [r["waves"] for r in rows] == [1, 1, 2]
    assert [r["tiles"] for r in rows] == [16, 128, 144]


# --- TF32 --------------------------------------------------------------------------------------------------


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def test_tf32_rounding_keeps_ten_mantissa_bits_to_nearest_even():
    x = torch.randn(100_003) * torch.logspace(-30, 30, 100_003)
    r = lib.round_to_tf32(x)
    assert int((r.view(torch.int32) & 0x1FFF).abs().sum()) == 0  # the 13 dropped bits are zero
    assert float(((r - x) / x).abs().max()) <= 2.0**-11  # half a unit in the 10th mantissa bit
    tie_down, tie_up = 1 + 2**-11, 1 + 3 * 2**-11  # halfway cases: round to the even neighbour
    got = lib.round_to_tf32(torch.tensor([tie_down, tie_up, -tie_up, _f32(0x7F800000)]))
    assert got.tolist()[:3] == [1.0, 1 + 2**-9, -(1 + 2**-9)]
    assert math.isinf(got[3])
    with pytest.raises(TypeError, match="float32"):
        lib.round_to_tf32(torch.ones(3, dtype=torch.float64))


def test_float_bits():
    assert lib.float_bits(1.0, "float16") == "0 01111 0000000000"
    assert lib.float_bits(-2.0, "bfloat16") == "1 10000000 0000000"
    assert lib.float_bits(1 / 3, "tf32") == "0 01111101 0101010101"
    assert len(lib.float_bits(1 / 3, "float32").replace(" ", "")) == 32


def test_tf32_defaults_and_the_context_manager_restores_them():
    before = lib.tf32_defaults()
    assert before == {"matmul_tf32": False, "cudnn_conv_tf32": True}  # torch's defaults
    with lib.fp32_matmul_precision("tf32"), lib.cudnn_conv_precision("ieee"):
        assert lib.tf32_defaults() == {"matmul_tf32": True, "cudnn_conv_tf32": False}
    assert lib.tf32_defaults() == before
    assert torch.backends.cuda.matmul.allow_tf32 is False  # the legacy flag can still be read: no API mix
    with pytest.raises(ValueError, match="mode"):
        with lib.fp32_matmul_precision("fast"):
            pass


# --- kernel names ------------------------------------------------------------------------------------------


def test_parse_kernel_names():
    nvjet = lib.parse_kernel_name("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN")
    assert nvjet == {"family": "cuBLAS nvjet", "tile": "128x256", "split_k": False, "stream_k": False}
    xmma = lib.parse_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_segment_k_on")
    assert xmma["tile"] == "128x256x64" and xmma["split_k"] and xmma["family"] == "cuBLAS xmma"
    # a one-digit tile side: nvjet's 64x8 tile, then its K step x stages (64x16), which is not the tile
    assert lib.parse_kernel_name("nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT")["tile"] == "64x8"
    fp32 = lib.parse_kernel_name("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize32x32x8_stage3")
    assert fp32["tile"] == "32x32x8"
    assert lib.parse_kernel_name("gemm_streamk_kernel")["stream_k"]
    assert lib.parse_kernel_name("vectorized_elementwise_kernel")["family"] == "other"
    assert lib.conv_algorithm(["sm90_xmma_fprop_implicit_gemm_f16f16"]) == "implicit GEMM"
    assert lib.conv_algorithm(["winograd_nonfused"]) == "Winograd"
    assert lib.conv_algorithm([]) == "unknown"


def test_gemm_sweep_record_tiles_are_what_the_kernel_names_say():
    """ch04_gemm_sweep.csv's `tile` column is derived from its `kernel` column: the two agree on every row."""
    from labkernels.results import load_reference

    rows = load_reference("ch04_gemm_sweep").rows
    assert rows and all(lib.parse_kernel_name(r["kernel"])["tile"] == r["tile"] for r in rows)


# --- measurement helpers (shape of the results, not their speed) -------------------------------------------


def test_time_matmul_and_sweep_rows():
    table = lib.gemm_sweep([(33, 17, 9)], ["float32", "bfloat16"])
    assert table.column("precision") == ["float32", "bfloat16"]
    row = table.rows[0]
    assert row["m"] == 33 and row["ms"] > 0
    assert row["tflops"] == pytest.approx(2 * 33 * 17 * 9 / (row["ms"] * 1e-3) / 1e12)


def test_conv_layout_rows():
    rows = lib.conv_layout_rows(2, 8, 9, "float32")
    assert [r["layout"] for r in rows] == ["nchw", "channels_last"]
    assert rows[0]["speedup_vs_nchw"] == 1.0
    assert rows[1]["break_even_uses"] > 0 and rows[1]["convert_ms"] > 0


@gpu
@pytest.mark.gpu
def test_cublas_kernel_names_are_visible():
    a, b = lib.random_operands(1024, 1024, 1024, "bfloat16")
    names = lib.gpu_kernels(lambda: a @ b)
    assert names, "the profiler saw no CUDA kernel for a bf16 matmul"
    assert lib.parse_kernel_name(max(names, key=len))["family"] != "other", names


@gpu
@pytest.mark.gpu
def test_tf32_matmul_error_is_that_of_rounded_inputs():
    a, b = lib.random_operands(1000, 1000, 1000, "float32")  # 1000: no power of two
    exact = a.double() @ b.double()
    with lib.fp32_matmul_precision("ieee"):
        ieee = a @ b
        emulated = lib.round_to_tf32(a) @ lib.round_to_tf32(b)
    with lib.fp32_matmul_precision("tf32"):
        tf32 = a @ b
    err = {
        name: float((c.double() - exact).norm() / exact.norm())
        for name, c in {"ieee": ieee, "emulated": emulated, "tf32": tf32}.items()
    }
    assert err["ieee"] < 1e-5 < err["tf32"] < 1e-2, err
    assert err["tf32"] <= 2 * err["emulated"], err


@gpu
@pytest.mark.gpu
def test_first_calls_in_a_fresh_process():
    got = lib.first_calls([(4, 64, 14)], benchmark=True, changing=[3, 2])
    assert len(got["first_ms"]) == 1 and got["first_ms"][0] > 0 and got["steady_ms"][0] > 0
    assert got["changing_ms"] > 0


def test_roof_at_least_leaves_no_product_above_its_roof():
    """A product timed faster than the ceilings' own peak run (a busy machine during that run) raises the
    peak to it, and the note says so; products in cache may pass the memory roof, the others raise it."""
    from labkernels.results import Table
    from labkernels.roofline import Ceilings, roof_tflops

    low = Ceilings("busy CPU", bandwidth_gbps=10.0, peak_tflops={"float32": 0.01}, cache_bytes=1 << 20)
    fast = 2 * 512**3 / (0.05 * 1e-3) / 1e12  # 512^3 in 0.05 ms: 5.4 TFLOP/s, far above the 0.01 measured
    table = Table([{"m": 512, "n": 512, "k": 512, "precision": "float32", "ms": 0.05},
                   {"m": 4096, "n": 4096, "k": 1, "precision": "float32", "ms": 1.0}])  # fmt: skip
    raised, note = lib.roof_at_least(low, table)
    assert raised.peak_tflops["float32"] == pytest.approx(fast) and low.peak_tflops["float32"] == 0.01
    assert "peak" in note and "bandwidth" in note  # the 4096 x 4096 x 1 product moved 128 MiB in 1 ms
    for r in table:
        t = gm.gemm(r["m"], r["n"], r["k"], "float32")
        assert t.flops / (r["ms"] * 1e-3) / 1e12 <= roof_tflops(raised, "float32", t.intensity) * (1 + 1e-9)
    same, note = lib.roof_at_least(raised, table)
    assert same.peak_tflops == raised.peak_tflops and "raised" not in note


# --- the H200 records behind the chapter's claims ----------------------------------------------------------


def test_wave_record_steps_by_a_tenth_because_cublas_switches_tiles():
    """Notebook 04, section 3: at each wave step of the tile cuBLAS reported most often (256 x 128, the one
    the plot draws) the measured time grows 5-20%, not the near doubling of a fixed tile, and the tile
    changes across the step; the sweep reported many tiles."""
    from labkernels.results import load_reference

    wave = load_reference("ch04_wave")
    ns, ms, tiles = wave.column("n"), wave.column("ms"), wave.column("tile")
    used = [t for t in tiles if t]
    assert max(set(used), key=used.count) == "256x128" and len(set(used)) >= 10
    m, sms = wave.rows[0]["m"], wave.rows[0]["sms"]
    steps = gm.wave_steps(m, max(ns), 256, 128, sms)
    assert len(steps) == 3
    for step in steps:
        before = max(i for i, n in enumerate(ns) if n < step)
        growth = ms[before + 1] / ms[before] - 1
        fixed_tile = (
            gm.waves(gm.tiles(m, ns[before + 1], 256, 128), sms)
            / gm.waves(gm.tiles(m, ns[before], 256, 128), sms)
            - 1
        )  # what one fixed tile would cost: a whole wave more
        assert 0.05 <= growth <= 0.2 and growth < fixed_tile / 2, (step, growth, fixed_tile)
        assert tiles[before] != tiles[before + 1], step


def test_conv_profile_record_shows_the_grid_that_leaves_sms_idle():
    """Appendix 04, section 6: the implicit-GEMM launch at C = 512 is 100 programs of 128 threads, 0.38 waves
    (32 of 132 SMs without a program), cuDNN's 120 of 384 threads, 0.91 waves."""
    from labkernels.results import load_reference

    rows = {r["case"]: r for r in load_reference("ch04_conv_profile")}
    ours, cudnn = rows["ch04.conv_triton_c512"], rows["ch04.conv_cudnn_c512"]
    assert (ours["launch__grid_size"], ours["launch__block_size"]) == (100, 128)
    assert (cudnn["launch__grid_size"], cudnn["launch__block_size"]) == (120, 384)
    assert ours["launch__waves_per_multiprocessor"] == pytest.approx(0.38)
    assert cudnn["launch__waves_per_multiprocessor"] == pytest.approx(0.91)
    assert gm.H200_SMS - ours["launch__grid_size"] == 32


def test_stream_k_occupancy_table_flags_the_variant_wrong_after_replays():
    """Appendix 04, section 3: one variant (atomic fix-up, 396 programs) ends its graph replays at 0.0188
    relative error, about 11x its first call's; the table flags it and nothing else."""
    from labkernels.ch04_libraries import bench_kernels

    rows = bench_kernels.stream_k_occupancy().rows
    flagged = [r for r in rows if r["flag"]]
    assert len(flagged) == 1
    (bad,) = flagged
    assert bad["fix-up"] == "atomic" and bad["stream-K programs"] == 396
    assert bad["error after replays"] == pytest.approx(0.0188)
    others = [r["error after replays"] for r in rows if not r["flag"]]
    assert bad["error after replays"] > 10 * max(others)


def test_tuning_summary_keeps_only_the_one_launch_tail():
    """Appendix 04's opening table: every design loses to the baseline of its run but the one-launch tail
    (the one `auto` keeps) and the 3000 x 5000 x 1000 variants, which gain less than the noise (0.03)."""
    from labkernels.ch04_libraries import bench_kernels

    for r in bench_kernels.tuning_summary():
        gain = r["best vs cuBLAS"] - r["baseline vs cuBLAS, same run"]
        if r["kept"].startswith("yes"):
            assert gain > 0, r["design"]
        elif "noise" in r["kept"]:
            assert 0 <= gain < 0.03, r["design"]
        elif "host" in r["kept"]:  # faster as graph replays, lost plain calls to the host (one_launch_tail)
            assert gain > 0, r["design"]
        else:
            assert gain < 0, r["design"]
