"""Chapter 08: the pipeline models (both lanes), the kernels compiled for sm_90 without a GPU (both lanes),
input checks, and the Gluon kernels themselves against torch (only on a Hopper GPU)."""

import math
import random

import pytest
import torch
import torch.nn.functional as F

import labkernels
from labkernels.ch08_hopper import attention as ch08_attention
from labkernels.ch08_hopper import copy as ch08_copy
from labkernels.ch08_hopper import gemm as ch08_gemm
from labkernels.ch08_hopper import models
from labkernels.ch08_hopper.device import hopper_problem
from labkernels.ch08_hopper.offline import compile_for_hopper, descriptor

ON_HOPPER = labkernels.on_gpu() and hopper_problem(labkernels.DEVICE) is None
hopper = pytest.mark.skipif(
    not ON_HOPPER, reason="Gluon's TMA/wgmma kernels run only on a Hopper (sm_90) GPU"
)


# --- Little's law and stages --------------------------------------------------------------------------------


def test_bytes_in_flight_is_bandwidth_times_latency():
    assert models.bytes_in_flight(4e12, 500e-9) == pytest.approx(2e6)  # 4 TB/s x 500 ns = 2 MB
    assert models.bytes_in_flight(1e9, 1e-6) == pytest.approx(1000)


def test_stages_to_hide_latency_by_hand():
    # 2 MB in flight over 100 programs of 16 KB stages: 2e6 / 1.6e6 = 1.25 -> 2 stages each
    assert models.stages_to_hide_latency(4e12, 500e-9, 16_000, 100) == 2
    # exactly divisible: 1.6e6 / (100 x 16_000) = 1 stage
    assert models.stages_to_hide_latency(3.2e12, 500e-9, 16_000, 100) == 1


def test_stages_to_hide_latency_is_the_least_that_suffices():
    rng = random.Random(8)
    for _ in range(200):
        bw, lat = rng.uniform(1e11, 5e12), rng.uniform(1e-7, 2e-6)
        stage, programs = rng.choice([4096, 16384, 49152]), rng.randint(1, 264)
        s = models.stages_to_hide_latency(bw, lat, stage, programs)
        assert s * stage * programs >= bw * lat * (1 - 1e-12)
        assert (s - 1) * stage * programs < bw * lat


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "4", True])
def test_models_refuse_nonsense(bad):
    with pytest.raises(ValueError, match="positive"):
        models.bytes_in_flight(bad, 1e-6)
    with pytest.raises(ValueError, match="positive"):
        models.gemm_stage_bytes(128, bad, 64)


# --- shared-memory budget -----------------------------------------------------------------------------------


def test_gemm_shared_memory_by_hand():
    assert models.gemm_stage_bytes(128, 256, 64) == (128 * 64 + 64 * 256) * 2 == 49152
    # 3 stages of 48 KB + a 64 KB output tile + 6 barriers
    assert models.gemm_smem_bytes(128, 256, 64, 3) == 3 * 49152 + 65536 + 48
    assert models.max_gemm_stages(128, 256, 64) == 3  # a 4th stage would need 262_208 > 232_448 bytes
    assert models.max_gemm_stages(128, 128, 64) == 6
    assert models.max_gemm_stages(256, 256, 128, budget=1000) == 0


def test_max_gemm_stages_is_the_largest_that_fits():
    for bm, bn, bk in [(64, 64, 32), (128, 128, 64), (128, 256, 64), (256, 128, 64), (64, 256, 128)]:
        s = models.max_gemm_stages(bm, bn, bk)
        assert s == 0 or models.gemm_smem_bytes(bm, bn, bk, s) <= models.SMEM_PER_BLOCK
        assert models.gemm_smem_bytes(bm, bn, bk, s + 1) > models.SMEM_PER_BLOCK


def test_copy_shared_memory_by_hand():
    assert models.copy_smem_bytes(64, 128, 4, 2) == 4 * (64 * 128 * 2 + 8) == 65568
    assert models.SMEM_PER_SM - models.SMEM_PER_BLOCK == 1024  # 1 KB of each SM is reserved


# --- mbarrier phases ----------------------------------------------------------------------------------------


def test_ring_phases_by_hand():
    stages = 3
    assert [models.ring_slot(i, stages) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [models.ready_parity(i, stages) for i in range(7)] == [0, 0, 0, 1, 1, 1, 0]
    assert [models.empty_parity(i, stages) for i in range(7)] == [1, 1, 1, 0, 0, 0, 1]


def test_a_fresh_mbarrier_has_passed_parity_one():
    bar = models.MBarrier(count=2)
    assert bar.passed(1) and not bar.passed(0)
    bar.arrive()
    assert not bar.passed(0)  # one of two arrivals: the phase is not complete
    bar.arrive()
    assert bar.passed(0) and not bar.passed(1)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 7])
def test_ring_delivers_every_item_in_order_under_any_interleaving(stages):
    for seed in range(40):
        iterations = random.Random(seed).randint(0, 5 * stages + 3)
        assert models.simulate_ring(iterations, stages, seed=seed) == list(range(iterations))


def test_ring_simulation_catches_wrong_parities():
    # The producer waiting for the consumer's parity deadlocks at once: no buffer ever looks empty.
    with pytest.raises(RuntimeError, match="deadlock"):
        models.simulate_ring(5, 2, empty=models.ready_parity)
    # A consumer that waits for the opposite parity reads a slot before its load lands.
    with pytest.raises((RuntimeError, AssertionError)):
        assert models.simulate_ring(6, 2, ready=models.empty_parity) == list(range(6))


@pytest.mark.parametrize("bad", [(-1, 2), (0, 0), (1.5, 2)])
def test_ring_refuses_bad_iterations(bad):
    with pytest.raises(ValueError):
        models.ready_parity(*bad)


# --- persistent schedule ------------------------------------------------------------------------------------


def test_grouped_tile_by_hand():
    # 3 x 2 tiles, groups of 2 rows: ids run down rows 0-1 of column 0, then column 1, then the short group
    order = [models.grouped_tile(t, 3, 2, 2) for t in range(6)]
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (2, 1)]


def test_grouped_tile_is_a_bijection():
    rng = random.Random(0)
    for _ in range(50):
        num_m, num_n, group = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
        tiles = [models.grouped_tile(t, num_m, num_n, group) for t in range(num_m * num_n)]
        assert sorted(tiles) == [(m, n) for m in range(num_m) for n in range(num_n)]


def test_persistent_schedule_covers_each_tile_once_and_balances():
    assert models.persistent_schedule(5, 2) == [[0, 2, 4], [1, 3]]
    for tiles, programs in [(0, 3), (1, 132), (132, 132), (1056, 132), (1057, 132), (17, 4)]:
        schedule = models.persistent_schedule(tiles, programs)
        assert sorted(t for p in schedule for t in p) == list(range(tiles))
        sizes = [len(p) for p in schedule]
        assert max(sizes) - min(sizes) <= 1 and max(sizes) == math.ceil(tiles / programs)


def test_wave_efficiency_by_hand():
    assert models.wave_efficiency(132, 132) == 1.0
    assert models.wave_efficiency(133, 132) == pytest.approx(133 / 264)
    # 4096^2 in 128 x 256 tiles: 32 x 16 = 512 tiles on 132 SMs, 4 waves, the last one short
    assert models.wave_efficiency(512, 132) == pytest.approx(512 / 528)


# --- the kernels, compiled for sm_90 without a GPU: the model's shared memory is what the compiler allocates
# Each compile runs in a fresh process. In a test worker that ran interpreted Triton kernels before, the
# same compiles failed at times ("'ir.value' object has no attribute 'dtype'", 5 tests of one clean-clone run
# under -n 2, none alone): the interpreter patches triton.language while it runs, so a compile in that process
# depends on which tests the worker ran first.

COPY_CASES = [(torch.float32, 2), (torch.bfloat16, 3), (torch.bfloat16, 4)]


def _compile_case(case: str) -> dict:
    """What the compiler made of one case: its shared memory and which instructions its PTX holds."""
    kind, _, name = case.partition(":")
    if kind == "copy":
        dtype, stages = COPY_CASES[int(name)]
        desc = descriptor(300, 1000, [64, 128], dtype)
        k = compile_for_hopper(
            ch08_copy._tma_copy_kernel, {"in_desc": desc, "out_desc": desc}, {"STAGES": stages}, 1
        )
    elif kind == "attention":
        timeline, name = name.endswith("+timeline"), name.removesuffix("+timeline")
        stages, name = (3, name.removesuffix("+3stages")) if name.endswith("+3stages") else (2, name)
        head_dim, causal, overlap = int(name.split("/")[0]), "/causal" in name, name.endswith("+overlap")
        k = ch08_attention.compile_sm90(head_dim, causal, overlap, timeline=timeline, stages=stages)
    elif kind == "gemm_fp8":
        k = ch08_gemm.compile_sm90(name, fp8=True)
    else:
        k = ch08_gemm.compile_sm90(name.removesuffix("+timeline"), timeline=name.endswith("+timeline"))
    ptx = k.asm["ptx"]
    words = ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg", "%clock64", "e4m3")
    found = {word: word in ptx for word in words}
    return {"shared": k.metadata.shared, **found}


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every case of this section compiled in one fresh Python process: {case: _compile_case(case)}."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    cases = [f"copy:{i}" for i in range(len(COPY_CASES))] + [f"gemm:{c}" for c in sorted(ch08_gemm.CONFIGS)]
    cases += [f"attention:{case}" for case in ATTENTION_CASES] + [f"gemm:{ch08_gemm.DEFAULT_CONFIG}+timeline"]
    cases += ["attention:128/causal+overlap+timeline"]
    cases += [f"gemm_fp8:{config}" for config in ch08_gemm.FP8_CONFIGS]
    here = Path(__file__).resolve().parent
    code = (
        "import json, sys; import test_ch08_hopper as t; "
        "print(json.dumps({c: t._compile_case(c) for c in sys.argv[1:]}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{here.parent}"}
    done = subprocess.run(
        [sys.executable, "-c", code, *cases], capture_output=True, text=True, timeout=600, env=env, cwd=here
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(COPY_CASES)))
def test_copy_compiles_for_sm90_with_the_modelled_shared_memory(compiled, case):
    dtype, stages = COPY_CASES[case]
    k = compiled[f"copy:{case}"]
    assert k["shared"] == models.copy_smem_bytes(64, 128, stages, dtype.itemsize)
    assert k["cp.async.bulk.tensor"]  # the loads and stores are TMA copies


@pytest.mark.parametrize("config", sorted(ch08_gemm.CONFIGS))
def test_gemm_compiles_for_sm90_with_the_modelled_shared_memory(compiled, config):
    cfg = ch08_gemm.CONFIGS[config]
    k = compiled[f"gemm:{config}"]
    # The model counts tiles and barriers; the compiler adds a few bytes of its own (under 256).
    assert 0 <= k["shared"] - cfg.smem_bytes() < 256
    assert k["shared"] <= models.SMEM_PER_BLOCK
    assert k["wgmma.mma_async"] and k["cp.async.bulk.tensor"] and k["setmaxnreg"]


def test_gemm_timeline_compiles_in_only_when_asked(compiled):
    """The clock reads are constexpr-gated: the GEMM that runs for speed has none."""
    with_timeline = compiled[f"gemm:{ch08_gemm.DEFAULT_CONFIG}+timeline"]
    assert with_timeline["%clock64"] and with_timeline["wgmma.mma_async"]
    assert not compiled[f"gemm:{ch08_gemm.DEFAULT_CONFIG}"]["%clock64"]


def test_attention_timeline_compiles_in_only_when_asked(compiled):
    """As the GEMM's: the forward that runs for speed reads no clock, and the recording adds no buffer."""
    recording = compiled["attention:128/causal+overlap+timeline"]
    plain = compiled["attention:128/causal+overlap"]
    assert recording["%clock64"] and recording["wgmma.mma_async"] and not plain["%clock64"]
    assert 0 <= recording["shared"] - plain["shared"] < 64


@pytest.mark.parametrize("config", sorted(ch08_gemm.FP8_CONFIGS))
def test_fp8_gemm_compiles_for_sm90_with_e4m3_wgmma_and_the_modelled_shared_memory(compiled, config):
    cfg = ch08_gemm.FP8_CONFIGS[config]
    k = compiled[f"gemm_fp8:{config}"]
    model = models.gemm_smem_bytes(
        cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages, 1, 2
    )  # fp8 in, bf16 out
    assert 0 <= k["shared"] - model < 256 and k["shared"] <= models.SMEM_PER_BLOCK
    assert k["wgmma.mma_async"] and k["e4m3"] and k["cp.async.bulk.tensor"] and k["setmaxnreg"]


def _fp8_operands(m, n, k, device=None):
    device = device or labkernels.DEVICE
    a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
    b_t = torch.randn(n, k, device=device).to(torch.float8_e4m3fn)
    scale_a = torch.tensor([0.5], device=device)
    scale_b = torch.tensor([0.25], device=device)
    return a, b_t, scale_a, scale_b


@pytest.mark.parametrize(
    "change, error, match",
    [
        ("bf16 a", TypeError, "float8_e4m3fn"),
        ("K differs", ValueError, "K differs"),
        ("K = 24", ValueError, "multiple of 16"),
        ("a scale of two elements", ValueError, "one-element float32"),
        ("a float16 scale", ValueError, "one-element float32"),
        ("an unknown config", ValueError, "config must be one of"),
    ],
)
def test_fp8_gemm_refuses_bad_inputs(change, error, match):
    a, b_t, scale_a, scale_b = _fp8_operands(64, 64, 64)
    config = ch08_gemm.FP8_DEFAULT
    if change == "bf16 a":
        a = a.to(torch.bfloat16)
    elif change == "K differs":
        b_t = b_t[:, :32].contiguous()
    elif change == "K = 24":
        a, b_t = a[:, :24].contiguous(), b_t[:, :24].contiguous()
    elif change == "a scale of two elements":
        scale_a = torch.ones(2, device=scale_a.device)
    elif change == "a float16 scale":
        scale_b = scale_b.half()
    elif change == "an unknown config":
        config = "128x128x64_s4_w4"
    with pytest.raises(error, match=match):
        ch08_gemm.gemm_fp8(a, b_t, scale_a, scale_b, config=config)


def test_fp8_gemm_off_hopper_names_the_fallback():
    if ON_HOPPER:
        pytest.skip("this GPU is a Hopper: the kernel runs")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*_scaled_mm"):
        ch08_gemm.gemm_fp8(*_fp8_operands(64, 64, 64))


@pytest.mark.parametrize("shape", [(1000, 776, 512), (128, 256, 128), (17, 8, 16), (4096, 4096, 4096)])
@pytest.mark.gpu
@hopper
def test_fp8_gemm_matches_scaled_mm(shape):
    m, n, k = shape
    a, b_t, scale_a, scale_b = _fp8_operands(m, n, k, "cuda")
    expected = (a.double() @ b_t.double().T) * 0.125
    _poison_next(m * n, torch.bfloat16)
    ours = ch08_gemm.gemm_fp8(a, b_t, scale_a, scale_b)
    assert ours.dtype == torch.bfloat16 and not ours.isnan().any()
    # torch._scaled_mm takes multiples of 16 only: zero padding adds nothing to any product
    pad = lambda t, rows: F.pad(t.view(torch.uint8), (0, -k % 16, 0, -rows % 16)).view(t.dtype)  # noqa: E731
    # Our wgmma keeps the tensor core's FP8 accumulator for all of K, like torch's use_fast_accum=True
    # (the default promotes partial sums to fp32 now and then): the bound is the looser of torch's two errors.
    errs = {}
    for fast in (False, True):
        theirs = torch._scaled_mm(pad(a, m), pad(b_t, n).T, scale_a=scale_a, scale_b=scale_b,
                                  out_dtype=torch.bfloat16, use_fast_accum=fast)[:m, :n]  # fmt: skip
        errs[fast] = float((theirs.double() - expected).abs().max())
    ours_err = float((ours.double() - expected).abs().max())
    assert ours_err <= 2 * max(errs.values()) + 1e-6, f"error {ours_err} against torch._scaled_mm's {errs}"


ATTENTION_CASES = ["64/full", "128/full", "128/causal", "128/full+overlap", "128/causal+overlap",
                   "64/full+overlap+3stages", "128/causal+overlap+3stages"]  # fmt: skip


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_compiles_for_sm90_with_the_modelled_shared_memory(compiled, case):
    """Both designs (OVERLAP: the next S issued before the softmax) take the same shared memory; a third
    stage fits because O then leaves through Q's buffer."""
    k = compiled[f"attention:{case}"]
    head_dim, stages = int(case.split("/")[0]), 3 if case.endswith("+3stages") else 2
    # Q, O and the K/V rings as modelled; the compiler adds its barriers' alignment and the warp
    # specialization's own few hundred bytes.
    assert 0 <= k["shared"] - ch08_attention.smem_bytes(head_dim, stages=stages) < 512
    assert k["shared"] <= models.SMEM_PER_BLOCK
    assert k["wgmma.mma_async"] and k["cp.async.bulk.tensor"] and k["setmaxnreg"]


# --- input checks (any lane) --------------------------------------------------------------------------------


def test_tma_copy_takes_any_stage_count_that_fits():
    # The ring's arithmetic needs no power of two (the GEMM's 3 stages ran on the H200): 3 and 6 stages pass
    # the checks and reach the GPU check (or, on a Hopper, run: test_tma_copy_is_exact).
    if ON_HOPPER:
        pytest.skip("this GPU is a Hopper: the kernel runs")
    for stages in (3, 6):
        with pytest.raises(RuntimeError, match="needs a Hopper GPU"):
            ch08_copy.tma_copy(torch.zeros(8, 8), stages=stages)


def test_off_hopper_the_error_names_the_fallback():
    if ON_HOPPER:
        pytest.skip("this GPU is a Hopper: the kernels run")
    a = torch.zeros(16, 16, dtype=torch.float16, device=labkernels.DEVICE)
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*ch03_triton.matmul"):
        ch08_gemm.gemm(a, a)
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*copy_"):
        ch08_copy.tma_copy(a)


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        ("x", torch.zeros(8, 8), TypeError, "a must be a torch.Tensor"),
        (torch.zeros(8, 8), torch.zeros(8, 8), TypeError, "float16, bfloat16"),
        (torch.zeros(8, 8, 1, dtype=torch.half), torch.zeros(8, 8, dtype=torch.half), ValueError, "2-D"),
        (torch.zeros(8, 16, dtype=torch.half), torch.zeros(8, 8, dtype=torch.half), ValueError, "inner"),
        (torch.zeros(8, 12, dtype=torch.half), torch.zeros(12, 8, dtype=torch.half), ValueError, "K = 12"),
        (torch.zeros(8, 8, dtype=torch.half), torch.zeros(8, 12, dtype=torch.half), ValueError, "N = 12"),
        (torch.zeros(8, 8, dtype=torch.half), torch.zeros(8, 8, dtype=torch.bfloat16), TypeError, "share"),
        (
            torch.zeros(16, 8, dtype=torch.half).t(),
            torch.zeros(16, 8, dtype=torch.half),
            ValueError,
            "contig",
        ),
    ],
)
def test_gemm_refuses_bad_inputs(a, b, error, match):
    with pytest.raises(error, match=match):
        ch08_gemm.gemm(a, b)


@pytest.mark.parametrize(
    "shape, chosen",
    [
        ((4096, 4096), "128x256x64_s3_w8"),  # 512 big tiles: about 4 an SM
        ((3000, 5000), "128x256x64_s3_w8"),  # 480, the last ones partial
        ((2048, 2048), "128x128x64_s4_w4"),  # 128 big tiles: under one an SM
        ((16, 4096), "128x128x64_s4_w4"),
        ((2112, 4096), "128x256x64_s3_w8"),  # 17 x 16 = 272 big tiles: just over two an SM
        ((2048, 4096), "128x128x64_s4_w4"),  # 256 big tiles: just under
    ],
)
def test_auto_takes_the_big_tile_only_when_every_sm_gets_two(shape, chosen):
    assert ch08_gemm.choose_config(*shape, sms=132) == chosen


def test_gemm_refuses_an_unknown_config_and_a_misaligned_start():
    a = torch.zeros(8, 8, dtype=torch.half)
    with pytest.raises(ValueError, match="config must be 'auto' or one of"):
        ch08_gemm.gemm(a, a, config="huge")
    misaligned = torch.zeros(72, dtype=torch.half)[1:65].view(8, 8)
    with pytest.raises(ValueError, match="16-byte boundary"):
        ch08_gemm.gemm(misaligned, a)


@pytest.mark.parametrize(
    "x, options, error, match",
    [
        (3, {}, TypeError, "torch.Tensor"),
        (torch.zeros(8, 8, dtype=torch.int32), {}, TypeError, "dtype"),
        (torch.zeros(8), {}, ValueError, "2-D"),
        (torch.zeros(8, 8).t()[:, :4], {}, ValueError, "contiguous"),
        (torch.zeros(8, 6, dtype=torch.half), {}, ValueError, "16-byte"),
        (torch.zeros(8, 8), {"block_rows": 48}, ValueError, "power of two"),
        (torch.zeros(8, 8), {"stages": 1}, ValueError, "stages"),
        (torch.zeros(8, 8), {"stages": 9}, ValueError, "stages"),
        (torch.zeros(8, 8), {"block_cols": 512}, ValueError, "block_cols"),
        (torch.zeros(8, 8), {"stages": 8, "block_rows": 128}, ValueError, "shared memory"),
    ],
)
def test_tma_copy_refuses_bad_inputs(x, options, error, match):
    with pytest.raises(error, match=match):
        ch08_copy.tma_copy(x, **options)


# --- the kernels on a Hopper GPU ----------------------------------------------------------------------------


def _poison_next(numel, dtype):
    """NaN in a freed block of this size: the launcher's torch.empty of the same size gets it back."""
    torch.full((numel,), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("shape", [(777, 1000), (3, 8), (64, 128)])
@pytest.mark.gpu
@hopper
def test_tma_copy_is_exact(dtype, stages, shape):
    x = torch.randn(shape, device="cuda").to(dtype)
    _poison_next(x.numel(), dtype)
    assert torch.equal(ch08_copy.tma_copy(x, stages=stages), x)


def _qkv(shape, dtype=torch.bfloat16, device=None):
    return [torch.randn(shape, device=device or labkernels.DEVICE).to(dtype) for _ in range(3)]


@pytest.mark.parametrize(
    "change, error, match",
    [
        ("float32", TypeError, "float16, bfloat16"),
        ("3-D", ValueError, r"\(B, H, S, D\)"),
        ("S = 200", ValueError, "multiple of 128.*ch06_attention"),
        ("D = 96", ValueError, "head dim 96.*ch06_attention"),
        ("k of another shape", ValueError, "one shape and dtype"),
        ("transposed", ValueError, "contiguous"),
        ("4 stages", ValueError, r"stages = 4.*\(2, 3\)"),
    ],
)
def test_attention_refuses_bad_inputs(change, error, match):
    q, k, v = _qkv((1, 2, 128, 64))
    if change == "float32":
        q, k, v = q.float(), k.float(), v.float()
    elif change == "3-D":
        q, k, v = q[0], k[0], v[0]
    elif change == "S = 200":
        q, k, v = _qkv((1, 2, 200, 64))
    elif change == "D = 96":
        q, k, v = _qkv((1, 2, 128, 96))
    elif change == "k of another shape":
        k = k[:, :1].contiguous()
    elif change == "transposed":
        q = q.transpose(2, 3).contiguous().transpose(2, 3)
    stages = 4 if change == "4 stages" else ch08_attention.STAGES
    with pytest.raises(error, match=match):
        ch08_attention.attention_forward(q, k, v, stages=stages)


def test_attention_off_hopper_names_the_fallback():
    if ON_HOPPER:
        pytest.skip("this GPU is a Hopper: the kernel runs")
    with pytest.raises(RuntimeError, match="needs a Hopper GPU.*ch06_attention"):
        ch08_attention.attention_forward(*_qkv((1, 2, 128, 64)))


def test_attention_shared_memory_by_hand():
    # D = 128, bf16: Q and O 2 x 128 x 128 x 2 B, K and V rings 2 x 2 x 128 x 128 x 2 B, 9 barriers of 8 B
    assert ch08_attention.smem_bytes(128) == 65536 + 131072 + 72
    assert ch08_attention.smem_bytes(128) <= models.SMEM_PER_BLOCK
    # three stages: O through Q's buffer, 3 x 64 KiB of K and V, 13 barriers
    assert ch08_attention.smem_bytes(128, stages=3) == 32768 + 196608 + 104 <= models.SMEM_PER_BLOCK


@pytest.mark.parametrize("design", ["plain", "overlap", "overlap+3stages"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2, 128, 64), (2, 3, 384, 128), (1, 1, 1024, 128)])
@pytest.mark.gpu
@hopper
def test_attention_forward_matches_float64(shape, dtype, causal, design):
    q, k, v = _qkv(shape, dtype, "cuda")
    expected = ch08_attention.reference(q, k, v, causal)
    _poison_next(q.numel(), dtype)
    overlap, stages = design != "plain", 3 if design.endswith("3stages") else 2
    o, lse = ch08_attention.attention_forward(q, k, v, causal=causal, overlap=overlap, stages=stages)
    assert not o.isnan().any() and not lse.isnan().any()
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ours, torchs = (o.double() - expected).abs().max(), (theirs.double() - expected).abs().max()
    assert ours <= 2 * torchs + 1e-6, f"error {ours} against torch's {torchs}"
    s = q.double() @ k.double().mT / math.sqrt(shape[-1])
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
@hopper
def test_attention_opcheck_and_a_fullgraph_compile():
    q, k, v = _qkv((1, 2, 256, 64), torch.bfloat16, "cuda")
    op = torch.ops.labkernels.ch08_attention_forward.default
    torch.library.opcheck(op, (q, k, v, True, 0.125, False, 2))
    compiled = torch.compile(lambda q, k, v: ch08_attention.attention_forward(q, k, v)[0] * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), ch08_attention.attention_forward(q, k, v)[0] * 2)


def test_attention_refuses_inputs_that_require_grad():
    q, k, v = _qkv((1, 2, 128, 64))
    with pytest.raises(RuntimeError, match="require grad.*ch06_attention"):
        ch08_attention.attention_forward(q.requires_grad_(), k, v)


@pytest.mark.parametrize("config", [*sorted(ch08_gemm.CONFIGS), ch08_gemm.AUTO])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1000, 776, 520), (128, 256, 64), (17, 8, 8)])
@pytest.mark.gpu
@hopper
def test_gemm_matches_torch(config, dtype, shape):
    m, n, k = shape
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(k, n, device="cuda").to(dtype)
    expected = a.double() @ b.double()
    _poison_next(m * n, dtype)
    c = ch08_gemm.gemm(a, b, config=config)
    assert not c.isnan().any()
    ours = (c.double() - expected).abs().max()
    torchs = ((a @ b).double() - expected).abs().max()
    assert ours <= 2 * torchs + 1e-6, f"error {ours} against torch's {torchs}"


@pytest.mark.gpu
@hopper
def test_gemm_gradients_and_opcheck():
    a = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(32, 48, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ch08_gemm.gemm(a, b).float().sum().backward()
    torch.testing.assert_close(
        a.grad, torch.ones(64, 48, device="cuda", dtype=torch.bfloat16) @ b.detach().mT
    )
    torch.library.opcheck(torch.ops.labkernels.ch08_gemm.default, (a.detach(), b.detach()))


@pytest.mark.gpu
@hopper
def test_gemm_of_empty_k_is_zero():
    a = torch.empty(5, 0, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(0, 8, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(ch08_gemm.gemm(a, b), torch.zeros(5, 8, device="cuda", dtype=torch.bfloat16))


# --- the timeline inside one program ------------------------------------------------------------------------


def _fake_timeline(steps=4, stages=2, load_ns=100.0, mma_ns=60.0):
    """Events of a ring where the consumer is slower than the loads: the producer runs ahead by the ring's
    size, then waits for releases."""
    rows, consumer_free = [], 0.0
    arrive = {}
    for i in range(steps):
        issue = 0.0 if i < stages else rows_by(rows, "consumer_release", i - stages)
        rows += [dict(event="producer_wait", index=i, ns=issue - 5 if i else 0.0),
                 dict(event="producer_issue", index=i, ns=issue)]  # fmt: skip
        arrive[i] = issue + load_ns
        start = max(consumer_free, arrive[i])
        rows += [dict(event="consumer_wait", index=i, ns=consumer_free),
                 dict(event="consumer_mma", index=i, ns=start),
                 dict(event="consumer_release", index=i, ns=start + mma_ns)]  # fmt: skip
        consumer_free = start + mma_ns
    rows += [dict(event="epilogue_start", index=0, ns=consumer_free),
             dict(event="epilogue_end", index=0, ns=consumer_free + 30)]  # fmt: skip
    return [r | {"cycle": int(r["ns"] * 2)} for r in rows]


def rows_by(rows, event, index):
    return next(r["ns"] for r in rows if r["event"] == event and r["index"] == index)


def test_timeline_intervals_by_hand():
    from labkernels.ch08_hopper import timeline

    spans = timeline.intervals(_fake_timeline())
    consumer = [(k, s, e) for lane, k, s, e in spans if lane == "consumer warpgroups"]
    # step 0 waits the whole first load; step 1's bytes arrived while step 0 computed
    assert consumer[0] == ("waits for data", 0.0, 100.0) and consumer[1] == ("MMA in flight", 100.0, 160.0)
    assert consumer[2] == ("waits for data", 160.0, 160.0)
    assert consumer[-1] == ("epilogue", consumer[-2][2], consumer[-2][2] + 30)
    assert all(e >= s for _, _, s, e in spans)


def test_timeline_shares_add_up_and_show_who_waits():
    from labkernels.ch08_hopper import timeline

    shares = timeline.shares(_fake_timeline(steps=8, load_ns=300.0, mma_ns=50.0))
    for lane in shares.values():
        assert sum(lane.values()) == pytest.approx(1.0)
    assert shares["consumer warpgroups"]["waits for data"] > shares["consumer warpgroups"]["MMA in flight"]


def test_timeline_picture_draws_every_kind_it_has(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkernels.ch08_hopper import timeline

    fig, ax = plt.subplots(figsize=(8, 2.5))
    timeline.plot_timeline(_fake_timeline(), ax, title="fake")
    drawn = {text.get_text() for text in ax.get_legend().get_texts()}
    assert drawn == set(timeline.KINDS)
    assert len(ax.collections) >= 4  # one bar set per (lane, kind) with intervals
    fig.savefig(tmp_path / "timeline.png")
    plt.close(fig)


def _fake_attention_timeline(tiles=3, half_offset=7.0):
    """An attention record by hand: each consumer's tile j waits 10 ns for K, 40 of softmax, 5 for V and 20
    for its wgmmas; the second warpgroup runs `half_offset` ns behind the first."""
    rows = [dict(event="producer_wait", index=j, ns=30.0 * j) for j in range(tiles)]
    rows += [dict(event="producer_issue", index=j, ns=30.0 * j + 2) for j in range(tiles)]
    for half in (0, 1):
        t = half * half_offset
        for j in range(tiles - 1):
            for event, step in (("wait_k", 10), ("s_issued", 40), ("softmax_done", 5), ("v_ready", 20)):
                rows.append(dict(event=f"c{half}_{event}", index=j, ns=t))
                t += step
            rows.append(dict(event=f"c{half}_mma_done", index=j, ns=t))
        rows += [dict(event=f"c{half}_epilogue_start", index=0, ns=t + 1),
                 dict(event=f"c{half}_epilogue_end", index=0, ns=t + 16)]  # fmt: skip
    return [r | {"cycle": int(r["ns"] * 2)} for r in rows]


def test_attention_timeline_intervals_and_shares_by_hand():
    from labkernels.ch08_hopper import timeline

    spans = timeline.intervals(_fake_attention_timeline())
    second = [(k, s, e) for lane, k, s, e in spans if lane == "consumer warpgroup 1"]
    assert second[:4] == [("waits for K", 7.0, 17.0), ("softmax, next S in flight", 17.0, 57.0),
                          ("waits for V", 57.0, 62.0), ("waits for its wgmmas", 62.0, 82.0)]  # fmt: skip
    assert second[-1] == ("epilogue", 158.0, 173.0)
    shares = timeline.shares(_fake_attention_timeline())
    assert set(shares) == set(timeline.ATTENTION_LANES)
    consumer = shares["consumer warpgroup 0"]
    assert sum(consumer.values()) == pytest.approx(1.0)
    assert consumer["softmax, next S in flight"] == pytest.approx(80 / (150 + 15))


@pytest.mark.parametrize("offset, share", [(0.0, 1.0), (7.0, 66 / 80), (40.0, 5 / 80)])
def test_concurrent_share_is_how_much_of_one_softmax_the_other_shares(offset, share):
    from labkernels.ch08_hopper import timeline

    # warpgroup 0 exponentiates in [10, 50] and [85, 125]; warpgroup 1 the same, `offset` ns later
    assert timeline.concurrent_share(_fake_attention_timeline(half_offset=offset)) == pytest.approx(share)
    with pytest.raises(ValueError, match="no recorded time"):
        timeline.concurrent_share(_fake_timeline())  # a GEMM record has no warpgroup softmax


def test_attention_timeline_picture_has_a_lane_per_warpgroup(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from labkernels.ch08_hopper import timeline

    fig, ax = plt.subplots(figsize=(8, 3))
    timeline.plot_timeline(_fake_attention_timeline(), ax)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(timeline.ATTENTION_LANES)
    assert {t.get_text() for t in ax.get_legend().get_texts()} == set(timeline.ATTENTION_KINDS)
    fig.savefig(tmp_path / "attention_timeline.png")
    plt.close(fig)


def test_rows_from_marks_counts_from_the_start_and_skips_unreached_slots():
    from labkernels.ch08_hopper import timeline

    marks = torch.full((3, 4), -1, dtype=torch.int64)
    marks[0, :2] = torch.tensor([1100, 1300])
    marks[1, 0] = 1500
    marks[2] = torch.tensor([1000, 50_000, 3000, 51_000])  # cycles and ns at the start, then at the end
    rows = timeline.rows_from_marks(marks, ("a", "b", "clocks"))
    assert rows == [{"event": "a", "index": 0, "cycle": 100, "ns": 50.0},
                    {"event": "a", "index": 1, "cycle": 300, "ns": 150.0},
                    {"event": "b", "index": 0, "cycle": 500, "ns": 250.0}]  # fmt: skip


@pytest.mark.gpu
@hopper
def test_attention_timeline_records_every_tile_of_both_warpgroups_in_order():
    q, k, v = (torch.randn(1, 2, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    rows = ch08_attention.attention_timeline(q, k, v)
    tiles = 1024 // ch08_attention.BLOCK_N
    for half in (0, 1):
        steps = [sorted((r["index"], r["cycle"]) for r in rows if r["event"] == f"c{half}_{e}")
                 for e in ch08_attention.CONSUMER_EVENTS[:5]]  # fmt: skip
        assert all(len(s) == tiles - 1 for s in steps)  # the loop's tiles; the last one is outside it
        for marks in zip(*steps, strict=True):
            cycles = [c for _, c in marks]
            assert cycles == sorted(cycles) and cycles[0] >= 0  # each tile's events in program order
    issued = sorted(r["index"] for r in rows if r["event"] == "producer_issue")
    assert issued == list(range(tiles))


@pytest.mark.gpu
@hopper
def test_gemm_timeline_records_every_step_of_program_0_in_order():
    a = torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    rows = ch08_gemm.gemm_timeline(a, b)
    cfg = ch08_gemm.CONFIGS[ch08_gemm.DEFAULT_CONFIG]
    tiles = -(-1024 // cfg.block_m) * -(-1024 // cfg.block_n)
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    mine = len(range(0, tiles, programs))  # program 0's tiles
    steps = mine * -(-512 // cfg.block_k)
    got = {
        e: sorted((r["index"], r["cycle"]) for r in rows if r["event"] == e) for e in ch08_gemm.EVENTS[:-1]
    }
    assert len(got["consumer_mma"]) == len(got["producer_issue"]) == steps
    assert len(got["epilogue_end"]) == mine
    cycles = [c for _, c in got["consumer_mma"]]
    assert cycles == sorted(cycles) and cycles[0] >= 0
    for (i, issued), (j, used) in zip(got["producer_issue"], got["consumer_mma"], strict=True):
        assert i == j and used >= issued  # no step's MMA before its load was issued


def test_every_step_of_the_h200_job_exists():
    """gpu_jobs/ch08_hopper.sh runs `python gpu_jobs/ch08_hopper.py STEP` per step: a step it names and the
    script lacks fails only on the GPU (it once did: KeyError), so the names are checked here."""
    import importlib.util
    import re
    from pathlib import Path

    jobs = Path(__file__).resolve().parent.parent / "gpu_jobs"
    spec = importlib.util.spec_from_file_location("ch08_job", jobs / "ch08_hopper.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    named = re.findall(r"^step \S+ \d+ (\S+)", (jobs / "ch08_hopper.sh").read_text(), flags=re.M)
    assert len(named) >= 10 and not set(named) - set(job.STEPS)
