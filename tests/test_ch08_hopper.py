"""Chapter 08: the pipeline models (both lanes), the kernels compiled for sm_90 without a GPU (both lanes),
input checks, and the Gluon kernels themselves against torch (only on a Hopper GPU)."""

import math
import random

import pytest
import torch

import labkernels
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
        args, constexprs, warps = {"in_desc": desc, "out_desc": desc}, {"STAGES": stages}, 1
        kernel = ch08_copy._tma_copy_kernel
    else:
        cfg = ch08_gemm.CONFIGS[name]
        args = {
            "a_desc": descriptor(1000, 512, [cfg.block_m, cfg.block_k]),
            "b_desc": descriptor(512, 776, [cfg.block_k, cfg.block_n]),
            "c_desc": descriptor(1000, 776, [cfg.block_m, cfg.block_n]),
        }
        constexprs = {"STAGES": cfg.stages, "GROUP_M": cfg.group_m, "num_warps": cfg.num_warps}
        kernel, warps = ch08_gemm._gemm_ws_kernel, cfg.num_warps
    k = compile_for_hopper(kernel, args, constexprs, warps)
    ptx = k.asm["ptx"]
    found = {word: word in ptx for word in ("cp.async.bulk.tensor", "wgmma.mma_async", "setmaxnreg")}
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


def test_gemm_refuses_an_unknown_config_and_a_misaligned_start():
    a = torch.zeros(8, 8, dtype=torch.half)
    with pytest.raises(ValueError, match="config must be one of"):
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


@pytest.mark.parametrize("config", sorted(ch08_gemm.CONFIGS))
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
