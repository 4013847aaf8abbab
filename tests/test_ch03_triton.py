"""Chapter 03 kernels: correctness in the lane at hand (the interpreter on CPU), weird shapes, poisoned
outputs, bad inputs. Sizes stay small on the CPU lane: the interpreter costs ~1-2 ms per program."""

import math

import pytest
import torch

import labkernels
from labkernels import traffic
from labkernels.ch03_triton import add_relu as add_relu_mod
from labkernels.ch03_triton import bench
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.ch03_triton import vector_add as vector_add_mod
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch03_triton.matmul import matmul, tuned_config
from labkernels.ch03_triton.softmax import softmax
from labkernels.ch03_triton.vector_add import vector_add
from labkernels.lane import sm_count
from labkernels.results import Table

DEVICE = labkernels.DEVICE
gpu = pytest.mark.skipif(not labkernels.on_gpu(), reason="needs the GPU lane")
cpu_lane = pytest.mark.skipif(labkernels.on_gpu(), reason="CPU-lane behaviour (the interpreter)")

ELEMENTWISE_TOL = {torch.float32: (0.0, 0.0), torch.float16: (0.0, 0.0), torch.bfloat16: (0.0, 0.0)}
SOFTMAX_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2), torch.bfloat16: (8e-3, 2e-2)}
LANE_DTYPES = [torch.float32, torch.float16] + [pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, gpu])]
SIZES = [1, 127, 1000, 16385 + 7]


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


# --- vector add and add+relu -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LANE_DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_vector_add(n, dtype):
    x, y = torch.randn(n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    out = _poisoned((n,), dtype)
    got = vector_add(x, y, out)
    assert got is out
    atol, rtol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(out, vector_add_mod.reference(x, y), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", LANE_DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_add_relu(n, dtype):
    x, y = torch.randn(n, device=DEVICE).to(dtype), torch.randn(n, device=DEVICE).to(dtype)
    out = _poisoned((n,), dtype)
    add_relu(x, y, out)
    atol, rtol = ELEMENTWISE_TOL[dtype]
    torch.testing.assert_close(out, add_relu_mod.reference(x, y), atol=atol, rtol=rtol)


def test_add_relu_2d_allocates_and_in_place():
    x, y = torch.randn(33, 71, device=DEVICE), torch.randn(33, 71, device=DEVICE)
    expected = torch.relu(x + y)
    torch.testing.assert_close(add_relu(x, y), expected, atol=0, rtol=0)
    add_relu(x, y, out=x)  # out aliases an input
    torch.testing.assert_close(x, expected, atol=0, rtol=0)


@pytest.mark.parametrize("block_size, num_warps", [(64, 1), (1024, 4), (4096, 8)])
def test_add_relu_explicit_config(block_size, num_warps):
    n = 3 * 4096 + 5
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    out = _poisoned((n,), torch.float32)
    add_relu(x, y, out, block_size=block_size, num_warps=num_warps)
    torch.testing.assert_close(out, torch.relu(x + y), atol=0, rtol=0)


@pytest.mark.parametrize("fn", [vector_add, add_relu])
def test_elementwise_bad_inputs(fn):
    x = torch.randn(10, device=DEVICE)
    with pytest.raises(TypeError, match="dtype"):
        fn(x.int(), x.int())
    with pytest.raises(TypeError, match="share one dtype"):
        fn(x, x.half())
    with pytest.raises(ValueError, match="shapes differ"):
        fn(x, torch.randn(11, device=DEVICE))
    with pytest.raises(ValueError, match="not contiguous"):
        m = torch.randn(4, 6, device=DEVICE)
        fn(m.t(), m.t())
    assert fn(x[:0], x[:0]).shape == (0,)  # empty in, empty out, nothing launched
    with pytest.raises(ValueError, match="is on meta"):
        fn(torch.empty(10, device="meta"), torch.empty(10, device="meta"))
    with pytest.raises(ValueError, match="out must be"):
        fn(x, x, torch.empty(10, device=DEVICE, dtype=torch.float16))
    with pytest.raises(ValueError, match="power of two"):
        fn(x, x, block_size=1000)


@cpu_lane
@pytest.mark.parametrize("fn", [vector_add, add_relu])
def test_elementwise_bf16_refused_on_cpu_lane(fn):
    x = torch.randn(10).bfloat16()
    with pytest.raises(TypeError, match="interpreter"):
        fn(x, x)


# --- softmax -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", LANE_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (5, 33), (37, 1000), (130, 781), (3, 5000), (2, 32768)])
def test_softmax(shape, dtype):
    x = (torch.randn(shape, device=DEVICE) * 5).to(dtype)
    got = softmax(x)
    expected = softmax_mod.reference(x.double()).to(dtype)
    atol, rtol = SOFTMAX_TOL[dtype]
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    assert not got.isnan().any()


def test_softmax_many_narrow_rows_and_strides():
    x = torch.randn(1031, 9, device=DEVICE) * 3
    expected = torch.softmax(x, dim=1)
    torch.testing.assert_close(softmax(x), expected, atol=1e-6, rtol=1e-5)
    # many row blocks for a few persistent programs; one row per program; scalar (unvectorized) accesses
    torch.testing.assert_close(softmax(x, persistent=True), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(softmax(x, rows_per_program=1, num_warps=1), expected, atol=1e-6, rtol=1e-5)
    narrow = x[:, :8]  # rows 16-byte aligned: vectorized by default, scalar with vectorize=False
    for vectorize in (True, False):
        got = softmax(narrow, vectorize=vectorize)
        torch.testing.assert_close(got, torch.softmax(narrow, dim=1), atol=1e-6, rtol=1e-5)
    xt = torch.randn(300, 70, device=DEVICE).t()  # (70, 300), column-major
    torch.testing.assert_close(softmax(xt), torch.softmax(xt, dim=1), atol=1e-6, rtol=1e-5)
    big = torch.randn(4, 100, device=DEVICE) * 1000  # exp would overflow without the max subtracted
    torch.testing.assert_close(softmax(big), torch.softmax(big, dim=1), atol=1e-6, rtol=1e-5)


def test_softmax_vector_width():
    """16-byte vectors only where row length, row strides and base addresses all allow them."""
    width = softmax_mod.vector_width
    x = torch.randn(3, 5000, device=DEVICE)
    assert width(x, torch.empty_like(x)) == 4  # 5000 fp32 = 1250 vectors of 4
    h = x.half()
    assert width(h, torch.empty_like(h)) == 8
    odd = torch.randn(3, 5001, device=DEVICE)
    assert width(odd, torch.empty_like(odd)) == 1
    shifted = torch.randn(3, 5004, device=DEVICE)[:, 1:5001]  # base 4 bytes past a 16-byte boundary
    assert width(shifted, torch.empty(3, 5000, device=DEVICE)) == 1
    column_major = torch.randn(8, 3, device=DEVICE).t()
    assert width(column_major, torch.empty(3, 8, device=DEVICE)) == 1


def test_softmax_bad_inputs():
    with pytest.raises(TypeError, match="dtype"):
        softmax(torch.ones(3, 4, device=DEVICE, dtype=torch.int32))
    with pytest.raises(ValueError, match="2-D"):
        softmax(torch.randn(2, 3, 4, device=DEVICE))
    assert softmax(torch.randn(0, 4, device=DEVICE)).shape == (0, 4)  # empty in, empty out
    with pytest.raises(ValueError, match="longer than"):
        softmax(torch.empty(1, softmax_mod.MAX_COLS + 1, device=DEVICE))
    with pytest.raises(ValueError, match="is on meta"):
        softmax(torch.empty(2, 3, device="meta"))
    with pytest.raises(ValueError, match="power of two"):
        softmax(torch.randn(4, 8, device=DEVICE), rows_per_program=3)


@cpu_lane
def test_softmax_registers_need_a_compiled_kernel():
    with pytest.raises(RuntimeError, match="GPU lane"):
        softmax_mod.registers(torch.randn(4, 100))


@gpu
@pytest.mark.gpu
def test_softmax_registers_read_from_the_compiled_kernel():
    x = torch.randn(4, 8192, device=DEVICE)
    four, eight = softmax_mod.registers(x, num_warps=4), softmax_mod.registers(x, num_warps=8)
    assert 0 < eight < four <= 255  # twice the threads for the same row: fewer elements, registers each
    with pytest.raises(TypeError, match="dtype"):
        softmax_mod.registers(x.int())


@cpu_lane
def test_softmax_bf16_refused_on_cpu_lane():
    with pytest.raises(TypeError, match="interpreter"):
        softmax(torch.randn(2, 3).bfloat16())


# --- matmul ------------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _few_matmul_configs(monkeypatch):
    """On the GPU every new key compiles and times every config; a few per kernel keep this file within
    minutes there (the bench tunes over all of them). Kept: the tiles the H200 reference picks most often, and
    256x128x32, the one whose fp32 tiles fit shared memory."""
    if DEVICE.type != "cuda":
        return
    for kernel, kept in ((matmul_mod._matmul_kernel, (0, 2, 5)), (matmul_mod._matmul_tma_kernel, (0, 3))):
        monkeypatch.setattr(kernel, "configs", [kernel.configs[i] for i in kept])


def _matmul_error(got, a, b, bias=None, activation=None):
    return (got.double() - matmul_mod.reference(a, b, bias, activation)).abs().max().item()


# K = 75 and 200 end in a ragged step (masked loads); K = 128 has none (EVEN_K, unmasked loads).
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (97, 130, 75), (33, 65, 200), (70, 96, 128)])
@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_matmul_fp32(m, n, k, precision):
    for _ in ("autotuned launch", "kept winner's launch"):  # fresh inputs each time
        a, b = torch.randn(m, k, device=DEVICE), torch.randn(k, n, device=DEVICE)
        got = matmul(a, b, input_precision=precision)
        assert got.shape == (m, n) and got.dtype == torch.float32
        tol = 1e-4 if precision == "ieee" else 2e-2  # tf32: 10-bit mantissa inputs, on the GPU only
        torch.testing.assert_close(got.double(), matmul_mod.reference(a, b), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, gpu])])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_matmul_16bit_epilogue(dtype, activation):
    m, n, k = 70, 90, 100
    for _ in ("autotuned launch", "kept winner's launch"):  # fresh inputs each time
        a, b = torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        got = matmul(a, b, bias=bias, activation=activation)
        assert got.dtype == dtype
        # Compare with torch's own error against the fp64 reference instead of a magic tolerance.
        torch_out = matmul_mod.reference(a, b, bias, activation).to(dtype)  # the best rounding possible
        torch_err = _matmul_error(torch_out, a, b, bias, activation)
        assert _matmul_error(got, a, b, bias, activation) <= 2 * torch_err + 1e-3


def _one_config(monkeypatch, kernel, config):
    """The autotuner of `kernel` holds only `config`, and no winner of an earlier test is kept: matmul()
    launches exactly this config (the autotuner times nothing when there is one)."""
    monkeypatch.setattr(kernel, "configs", [config])
    monkeypatch.setattr(kernel, "cache", {})
    monkeypatch.setattr(matmul_mod, "_tuned_launches", {})
    monkeypatch.setattr(matmul_mod, "_auto_choices", {})
    monkeypatch.setattr(matmul_mod, "_launches", matmul_mod.launch_cache.KeyedLaunches())


# Every config of the GPU lists, each alone: the other tests tune among a few, the benchmarks check nothing.
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    "kernel_name, index",
    [("tiled", i) for i in range(len(matmul_mod.GPU_CONFIGS))]
    + [("tma_persistent", i) for i in range(len(matmul_mod.TMA_CONFIGS))],
)
def test_every_gpu_config_is_correct(monkeypatch, kernel_name, index):
    tiled = kernel_name == "tiled"
    kernel = matmul_mod._matmul_kernel if tiled else matmul_mod._matmul_tma_kernel
    config = (matmul_mod.GPU_CONFIGS if tiled else matmul_mod.TMA_CONFIGS)[index]
    _one_config(monkeypatch, kernel, config)
    # a ragged K-step (tiled: K = 150; TMA rows must be 16-byte multiples: K = 152), then an even one
    for m, n, k in ((200, 136, 150 if tiled else 152), (130, 264, 128)):
        a = torch.randn(m, k, device=DEVICE).bfloat16()
        b = torch.randn(k, n, device=DEVICE).bfloat16()
        got = matmul(a, b, kernel=kernel_name)
        assert matmul_mod.tuned_config(a, b, kernel=kernel_name) == (kernel_name, config)
        torch_err = _matmul_error(matmul_mod.reference(a, b).to(torch.bfloat16), a, b)
        assert _matmul_error(got, a, b) <= 2 * torch_err + 1e-3, (m, n, k)


@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, gpu])])
def test_gelu_polynomial_for_16_bit_outputs(dtype):
    """`_gelu_for_16_bit` (ACTIVATION="gelu_poly") through the tiled kernel as c = gelu(x @ [1]): within
    one 16-bit step of the correctly rounded GELU everywhere, mostly equal to it; torch's at the ends."""
    x = torch.cat([torch.linspace(-16, 16, 4001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, -30.0, 30.0])])
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")])
    a = torch.cat([x, specials])[:, None].to(dtype).to(DEVICE)
    b = torch.ones(1, 1, dtype=dtype, device=DEVICE)
    c = _poisoned((a.shape[0], 1), dtype)
    meta = dict(HAS_BIAS=False, ACTIVATION="gelu_poly", INPUT_PRECISION="ieee", BLOCK_SIZE_M=32,
                BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=1, EVEN_K=False, INDEX_64=False)  # fmt: skip
    m, strides = a.shape[0], (*a.stride(), *b.stride(), *c.stride())
    matmul_mod._matmul_tiles[(-(-m // 32),)](a, b, c, c, m, 1, 1, *strides, **meta)
    # x * Phi(x) through erfc: torch's gelu in fp64 is 0.5x(1 + erf), which cancels to -0 below x = -8.3
    # where bf16 (fp32's exponent range) still holds GELU(-13) = -8e-38.
    xd = a.double().flatten()
    want = xd * 0.5 * torch.special.erfc(-xd / math.sqrt(2))
    finite = want.isfinite()
    got, rounded = c.flatten()[finite], want[finite].to(dtype)
    info = torch.finfo(dtype)
    step = info.eps * rounded.double().abs().clamp_min(info.tiny)  # one ulp (at least the smallest normal's)
    # A GPU's exp2 flushes fp32 results under 2^-126 to 0 (ex2.approx.ftz): |GELU| < 16 * 2^-126 may be 0.
    flushed = 16 * torch.finfo(torch.float32).tiny
    assert ((got.double() - rounded.double()).abs() <= step.clamp_min(flushed)).all()
    normal = rounded.double().abs() >= flushed
    assert (got == rounded)[normal].float().mean() > 0.99  # the fit's 1e-5 error flips only ties' neighbours
    specials = torch.nn.functional.gelu(a.double()).flatten()[~finite]  # +-inf, NaN: torch's answers
    torch.testing.assert_close(c.flatten()[~finite].double(), specials, equal_nan=True)


def test_matmul_gelu_into_16_bit_compiles_the_polynomial():
    assert matmul_mod._kernel_activation("gelu", torch.float16) == "gelu_poly"
    assert matmul_mod._kernel_activation("gelu", torch.bfloat16) == "gelu_poly"
    assert matmul_mod._kernel_activation("gelu", torch.float32) == "gelu"  # 2^-23 steps: erf's accuracy
    assert matmul_mod._kernel_activation("relu", torch.float16) == "relu"
    assert matmul_mod._kernel_activation(None, torch.bfloat16) is None


def test_matmul_alignment_told_to_the_tiled_kernel():
    align = matmul_mod.row_alignment  # (N, (a's, b's and C's row and column strides))
    assert align(4096, (4096, 1, 4096, 1, 4096, 1)) == 16  # what Triton would mark by itself
    assert align(5000, (1000, 1, 5000, 1, 5000, 1)) == 8  # 3000 x 5000 x 1000: 16-byte rows of bf16
    assert align(5000, (1002, 1, 5000, 1, 5000, 1)) == 2
    assert align(4097, (4096, 1, 4097, 1, 4097, 1)) == 1
    assert align(64, (1, 64, 64, 1, 64, 1)) == 1  # a column-major a: no claim
    named = dict(zip(("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"),
                     (1000, 1, 5000, 1, 5000, 1), strict=True))  # fmt: skip
    assert matmul_mod._alignment({"N": 5000, **named}) == 8  # the autotuner's heuristic: the same rule


def test_matmul_alignment_is_per_call_not_per_key(monkeypatch):
    """Two calls of one shape whose rows lie 48 and 50 elements apart share a tuned key; each launch must be
    told its own alignment (a claim of 16 bytes for 100-byte rows would misalign 16-byte copies)."""
    told = []
    real_launch = matmul_mod.launch_cache.launch

    def launch(fn, grid, args, meta):
        told.append(meta.get("ALIGN"))
        return real_launch(fn, grid, args, meta)

    monkeypatch.setattr(matmul_mod.launch_cache, "launch", launch)
    m, n, k = 37, 40, 44  # K ragged against every block: the loop's last step is the masked one
    for row_stride in (48, 50):
        a = torch.randn(m, row_stride, device=DEVICE)[:, :k]
        b = torch.randn(k, n, device=DEVICE)
        for _ in range(2):  # tunes or launches the kept winner, then launches it again
            got = matmul(a, b, kernel="tiled")
            torch.testing.assert_close(got.double(), matmul_mod.reference(a, b), atol=1e-4, rtol=1e-4)
    assert told == [8, 2]  # a launcher kept per strides; N = 40 and C's rows: 8; a's rows 48 (16) or 50 (2)


# TMA needs rows 16 bytes apart: N and K multiples of 8 in 16-bit; M is free. 200 is no multiple of 32 or 64.
@pytest.mark.parametrize("m, n, k", [(1, 8, 8), (97, 136, 200), (130, 72, 40)])
@pytest.mark.parametrize("dtype", [torch.float16, pytest.param(torch.bfloat16, marks=[pytest.mark.gpu, gpu])])
def test_matmul_tma_persistent(m, n, k, dtype):
    for activation in (None, "gelu"):  # the first call of each key tunes, the second launches the winner
        a, b = torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        got = matmul(a, b, bias=bias, activation=activation, kernel="tma_persistent")
        assert got.shape == (m, n) and got.dtype == dtype
        torch_out = matmul_mod.reference(a, b, bias, activation).to(dtype)
        assert (
            _matmul_error(got, a, b, bias, activation)
            <= 2 * _matmul_error(torch_out, a, b, bias, activation) + 1e-3
        )


def test_matmul_tma_refuses_operands_it_cannot_describe():
    a, b = torch.randn(16, 100, device=DEVICE).half(), torch.randn(100, 24, device=DEVICE).half()
    with pytest.raises(ValueError, match="200 bytes apart, not a multiple of 16"):
        matmul(a, b, kernel="tma_persistent")  # a's rows: 100 fp16 elements
    with pytest.raises(ValueError, match="rows are not contiguous"):
        matmul(a[:, :96].contiguous(), torch.randn(24, 96, device=DEVICE).half().t(), kernel="tma_persistent")
    with pytest.raises(ValueError, match="rows overlap"):
        matmul(torch.randn(1, 96, device=DEVICE).half().expand(16, 96), b[:96], kernel="tma_persistent")
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        matmul(a.float(), b.float(), kernel="tma_persistent")
    with pytest.raises(ValueError, match="kernel must be one of"):
        matmul(a, b, kernel="fast")
    torch.testing.assert_close(
        matmul(a, b).double(), matmul_mod.reference(a, b), atol=5e-2, rtol=1e-2
    )  # auto


def test_matmul_auto_times_both_kernels_once_where_both_run(monkeypatch):
    monkeypatch.setattr(
        matmul_mod, "_has_tma", lambda: True
    )  # on the CPU lane: pretend, the interpreter runs TMA
    a, b = torch.randn(64, 32, device=DEVICE).half(), torch.randn(32, 56, device=DEVICE).half()
    kernel, _ = tuned_config(a, b)
    assert kernel in ("tiled", "tma_persistent")

    def timed_again(*args, **kwargs):
        raise AssertionError("auto timed the kernels again for a key it had chosen for")

    monkeypatch.setattr(matmul_mod, "graph_autotune_bench", timed_again)  # auto's timer, in both lanes
    a, b = torch.randn(64, 32, device=DEVICE).half(), torch.randn(32, 56, device=DEVICE).half()
    assert tuned_config(a, b)[0] == kernel
    torch.testing.assert_close(matmul(a, b).double(), matmul_mod.reference(a, b), atol=5e-2, rtol=1e-2)
    assert tuned_config(a, b[:, :36])[0] == "tiled"  # b's rows 112 bytes apart, C's 72: no descriptor for C


def test_matmul_configs_pruned_by_shared_memory():
    a = torch.empty(8, 8, dtype=torch.float16)  # 2 bytes per element
    tiles = [matmul_mod._config(128, 256, 64, stages=s, warps=8) for s in (3, 4)]
    kept = matmul_mod._prune_by_shared_memory(tiles, {"a_ptr": a})
    assert kept == tiles  # A and B tiles: 3 x 48 KiB and 4 x 48 KiB both fit 227 KiB
    kept = matmul_mod._prune_by_shared_memory(tiles, {"a_ptr": a}, c_staged=True)
    assert kept == tiles[:1]  # + a 64 KiB tile of C: 208 KiB fits, 256 KiB does not


def test_matmul_configs_pruned_to_snug_tiles():
    """A tile taller than M (or wider than N) rounds up to only masks more rows: the autotuners skip it."""
    shapes = ((64, 128), (128, 64), (256, 128), (64, 64))
    tiles = [matmul_mod._config(m, n, 64, stages=3, warps=4) for m, n in shapes]
    assert matmul_mod.snug_tiles(tiles, 97, 61) == [tiles[1], tiles[3]]  # rows round up to 128, columns 64
    assert matmul_mod.snug_tiles(tiles, 16, 130) == [tiles[0], tiles[3]]  # no tile under 64 rows: 64 is snug
    assert matmul_mod.snug_tiles(tiles, 8, 8) == [tiles[3]]
    assert matmul_mod.snug_tiles(tiles, 4096, 4096) == tiles
    # no tile is both the shortest and the narrowest: the shortest, then the narrowest of those
    assert matmul_mod.snug_tiles(tiles[:3], 16, 16) == tiles[:1]
    for configs, staged in ((matmul_mod.GPU_CONFIGS, False), (matmul_mod.TMA_CONFIGS, True)):
        for dtype in (torch.float32, torch.bfloat16):  # any shape and dtype keeps a config of the GPU lists
            for m, n in ((1, 1), (16, 16), (16, 4096), (4096, 16), (97, 61)):
                args = {"a_ptr": torch.empty(1, 1, dtype=dtype), "M": m, "N": n}
                assert matmul_mod._prune(configs, args, c_staged=staged), (dtype, m, n)
    a = torch.empty(8, 8, dtype=torch.float16)
    snug = [tiles[0], tiles[1], tiles[3]]
    assert matmul_mod.snug_tiles(tiles, 120, 100) == snug
    kept = matmul_mod._prune(tiles, {"a_ptr": a, "M": 120, "N": 100})
    assert kept == matmul_mod.filling_tiles(snug, 120, 100, sm_count())


def test_matmul_configs_pruned_to_tiles_that_fill_the_gpu():
    """Wave quantization: a tile that leaves over 40% of the SMs idle is not tuned when others fill them."""
    gpu = matmul_mod.GPU_CONFIGS

    def shapes(configs):
        return {(c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"]) for c in configs}

    kept = matmul_mod.filling_tiles(gpu, 1536, 1536, 132)
    assert shapes(kept) == {(128, 128), (64, 256), (128, 64), (64, 128)}  # 72 tiles of 128 x 256 dropped
    assert matmul_mod.filling_tiles(gpu, 4096, 4096, 132) == gpu  # 128 tiles or more for every config
    # 1024^3: only 64 x 128 and 128 x 64 make 128 tiles; 128 x 128 makes 64, under 0.6 x 128
    assert shapes(matmul_mod.filling_tiles(gpu, 1024, 1024, 132)) == {(128, 64), (64, 128)}
    # 16 rows: no config fills the GPU; those with the most tiles (the narrowest) stay
    narrow = matmul_mod.filling_tiles(matmul_mod.snug_tiles(gpu, 16, 4096), 16, 4096, 132)
    assert shapes(narrow) == {(64, 128)}  # 32 tiles; 64 x 256 makes 16
    assert matmul_mod.filling_tiles(gpu[:1], 16, 16, 132) == gpu[:1]  # never empty


def test_matmul_strided_operands():
    a = torch.randn(50, 40, device=DEVICE).t()  # (40, 50), column-major
    b = torch.randn(70, 50, device=DEVICE)[::2].t()  # (50, 35), strided rows and columns
    torch.testing.assert_close(matmul(a, b).double(), matmul_mod.reference(a, b), atol=1e-4, rtol=1e-4)


def test_matmul_autotune_caches_per_key():
    kernel = matmul_mod._matmul_kernel
    a, b = torch.randn(45, 23, device=DEVICE), torch.randn(23, 37, device=DEVICE)
    before = len(kernel.cache)
    matmul(a, b)
    assert len(kernel.cache) == before + 1  # first call of a shape tunes
    matmul(a, b)
    assert len(kernel.cache) == before + 1  # second call hits the cache
    assert kernel.best_config in kernel.configs
    matmul(torch.randn(46, 23, device=DEVICE), b)
    assert len(kernel.cache) == before + 2  # a new key re-tunes


def test_matmul_launches_the_kept_winner_without_the_autotuner(monkeypatch):
    a, b = torch.randn(41, 19, device=DEVICE), torch.randn(19, 27, device=DEVICE)
    matmul(a, b)  # tunes this key

    def autotuner_called(*args, **kwargs):
        raise AssertionError("the autotuner ran for a key that was already tuned")

    monkeypatch.setattr(matmul_mod._matmul_kernel, "run", autotuner_called)
    a, b = torch.randn(41, 19, device=DEVICE), torch.randn(19, 27, device=DEVICE)
    torch.testing.assert_close(matmul(a, b).double(), matmul_mod.reference(a, b), atol=1e-4, rtol=1e-4)
    with pytest.raises(AssertionError, match="autotuner ran"):
        matmul(a, b, activation="relu")  # a new key goes through the autotuner


def test_matmul_bad_inputs():
    a, b = torch.randn(4, 5, device=DEVICE), torch.randn(5, 6, device=DEVICE)
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(a, a)
    with pytest.raises(TypeError, match="share one dtype"):
        matmul(a, b.half())
    with pytest.raises(TypeError, match="dtype"):
        matmul(a.int(), b.int())
    with pytest.raises(ValueError, match="2-D"):
        matmul(a[0], b)
    assert matmul(a[:0], b).shape == (0, 6)  # empty in, empty out
    with pytest.raises(ValueError, match="activation"):
        matmul(a, b, activation="tanh")
    with pytest.raises(ValueError, match="input_precision"):
        matmul(a, b, input_precision="tf32x3")
    with pytest.raises(ValueError, match="bias must have shape"):
        matmul(a, b, bias=torch.randn(5, device=DEVICE))
    with pytest.raises(ValueError, match="is on meta"):
        matmul(torch.empty(4, 5, device="meta"), b)


@cpu_lane
def test_matmul_bf16_refused_on_cpu_lane():
    with pytest.raises(TypeError, match="interpreter"):
        matmul(torch.randn(2, 3).bfloat16(), torch.randn(3, 2).bfloat16())


# --- GPU lane: the sizes the benchmarks use ----------------------------------------------------------------


@pytest.mark.gpu
@gpu
def test_gpu_large_shapes():
    n = (1 << 24) + 3
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    torch.testing.assert_close(add_relu(x, y), torch.relu(x + y), atol=0, rtol=0)
    for dtype in (torch.float32, torch.bfloat16):
        s = torch.randn(4096, 5000, device=DEVICE).to(dtype)
        atol, rtol = SOFTMAX_TOL[dtype]
        expected = torch.softmax(s.float(), dim=1).to(dtype)
        torch.testing.assert_close(softmax(s), expected, atol=atol, rtol=rtol)
    a = torch.randn(1000, 1500, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(1500, 700, device=DEVICE, dtype=torch.bfloat16)
    err = _matmul_error(matmul(a, b), a, b)
    assert err <= 2 * _matmul_error(a @ b, a, b) + 1e-2


def test_summarize_softmax_configs_reads_csv_flags_and_skips_failed_configs():
    def row(warps, persistent, vectorize, fraction):  # flags as strings, as a CSV gives them back
        config = {"num_warps": warps, "persistent": str(persistent), "vectorize": str(vectorize)}
        measured = {"fraction_of_copy": fraction, "registers": 200 // warps + persistent}
        return {"rows": 8, "cols": 100, "dtype": "float32", **config, **measured}

    configs = Table(
        [
            row(4, False, True, 0.5),
            row(8, False, True, 0.7),
            row(16, False, True, float("nan")),  # did not fit: never the best
            row(4, True, True, 0.6),
            row(8, False, False, 0.3),
        ]
    )
    (summary,) = bench.summarize_softmax_configs(configs).rows
    assert (summary["one_block"], summary["its_warps"], summary["its_registers"]) == (0.7, 8, 25)
    assert (summary["persistent"], summary["persistent_warps"]) == (0.6, 4)
    assert summary["no_16_byte_access"] == 0.3


def test_softmax_rows_can_add_a_copy_of_the_same_bytes():
    rows = bench.softmax_rows(4, 64, torch.float32, copy_gbps=1.0, naive=False, copy=True)
    assert [r["impl"] for r in rows] == ["triton", "torch", "copy"]
    fused_bytes = traffic.softmax(4, 64).bytes
    for r in rows:  # GB/s from each impl's own traffic model: the copy moves what the fused softmax moves
        assert r["gbps"] == pytest.approx(fused_bytes / (r["ms"] * 1e-3) / 1e9)
