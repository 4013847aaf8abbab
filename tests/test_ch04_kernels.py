"""Chapter 04 kernels (split-K / stream-K matmul, implicit-GEMM conv): correctness against fp64 references on
odd shapes, reproducibility, the auto rule, bad inputs. CPU lane: the interpreter, tiny shapes."""

import subprocess
import sys

import pytest
import torch

import labkernels
from labkernels.ch04_libraries import conv as conv_mod
from labkernels.ch04_libraries import splitk
from labkernels.ch04_libraries.conv import conv2d_nhwc
from labkernels.ch04_libraries.splitk import matmul

DEVICE = labkernels.DEVICE
gpu = pytest.mark.skipif(not labkernels.on_gpu(), reason="needs the GPU lane")
GPU_DTYPES = [pytest.param(d, marks=[pytest.mark.gpu, gpu]) for d in (torch.float16, torch.bfloat16)]
# |error| <= atol + rtol |ref|, with products summed over K in fp32; 16-bit outputs round once at the end.
MATMUL_TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-2, 2e-3), torch.bfloat16: (1e-1, 1e-2)}
TF32_TOL = (5e-2, 5e-3)  # 10-bit mantissa products; the interpreter may compute them exactly


def _operands(m, n, k, dtype=torch.float32):
    return torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)


def _assert_matmul(c, a, b, tol):
    atol, rtol = tol
    assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == a.dtype
    assert not c.isnan().any()  # every element written (outputs are fresh torch.empty; see the poisoned test)
    torch.testing.assert_close(c.double(), splitk.reference(a, b), atol=atol * a.shape[1] ** 0.5, rtol=rtol)


# --- matmul ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(37, 53, 301), (5, 7, 1000), (64, 33, 64)])
@pytest.mark.parametrize(
    "kernel, options",
    [
        ("split_k", {"split_k": 3, "deterministic": True}),
        ("split_k", {"split_k": 2, "deterministic": False}),
        ("split_k", {}),
        ("stream_k", {}),
        ("k_major", {}),
        ("auto", {}),
    ],
)
def test_matmul_fp32(shape, kernel, options):
    a, b = _operands(*shape)
    _assert_matmul(matmul(a, b, kernel=kernel, **options), a, b, MATMUL_TOL[torch.float32])


@pytest.mark.parametrize("shape", [(37, 21, 301), (70, 40, 97)])
def test_stream_k_shares_tiles(shape):
    """Shapes whose tiles are split between programs (the fix-up path), on the interpreter's 4 programs."""
    m, n, k = shape
    config = splitk.CPU_CONFIGS[0].kwargs if not labkernels.on_gpu() else None
    if config is not None:
        tiles = -(-m // config["BLOCK_SIZE_M"]) * -(-n // config["BLOCK_SIZE_N"])
        steps = -(-k // config["BLOCK_SIZE_K"])
        per_program = -(-tiles * steps // splitk.num_sms())
        assert per_program % steps != 0  # program ranges end inside tiles: the fix-up runs
    a, b = _operands(m, n, k)
    c1 = matmul(a, b, kernel="stream_k")
    _assert_matmul(c1, a, b, MATMUL_TOL[torch.float32])
    assert torch.equal(c1, matmul(a, b, kernel="stream_k"))  # fixed order of the fix-up: bitwise equal


def test_split_k_deterministic_bitwise():
    a, b = _operands(19, 45, 777)
    first = matmul(a, b, kernel="split_k", split_k=3, deterministic=True)
    for _ in range(2):
        assert torch.equal(first, matmul(a, b, kernel="split_k", split_k=3, deterministic=True))
    _assert_matmul(first, a, b, MATMUL_TOL[torch.float32])


def test_split_k_more_splits_than_chunks():
    """split_k larger than K allows: each split keeps >= SPLIT_K_GRANULE of K, the result is unchanged."""
    a, b = _operands(9, 11, 300)
    _assert_matmul(matmul(a, b, kernel="split_k", split_k=50), a, b, MATMUL_TOL[torch.float32])
    assert splitk.split_chunk(300, 50) == splitk.SPLIT_K_GRANULE


def test_matmul_strided_and_transposed():
    a = torch.randn(70, 41, device=DEVICE).t()  # (41, 70), column-major
    b = torch.randn(70, 90, device=DEVICE)[:, ::2]  # (70, 45), every other column
    for kernel in ("split_k", "stream_k", "k_major"):
        _assert_matmul(matmul(a, b, kernel=kernel), a, b, MATMUL_TOL[torch.float32])


def test_matmul_tf32_tolerant():
    """Under the interpreter TF32 may be exact or emulated; on the GPU it rounds to a 10-bit mantissa."""
    a, b = _operands(33, 40, 130)
    for kernel in ("auto", "split_k", "stream_k"):
        _assert_matmul(matmul(a, b, kernel=kernel, allow_tf32=True), a, b, TF32_TOL)


def test_matmul_empty():
    a, b = _operands(0, 5, 7)
    assert matmul(a, b).shape == (0, 5)
    a, b = _operands(3, 4, 0)
    torch.testing.assert_close(matmul(a, b), torch.zeros(3, 4, device=DEVICE), atol=0, rtol=0)


def test_matmul_backward():
    a, b = _operands(23, 17, 41)
    a.requires_grad_(True)
    b.requires_grad_(True)
    grad = torch.randn(23, 17, device=DEVICE)
    matmul(a, b, kernel="split_k", split_k=2, deterministic=True).backward(grad)
    torch.testing.assert_close(a.grad.double(), grad.double() @ b.detach().double().t(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(b.grad.double(), a.detach().double().t() @ grad.double(), atol=1e-4, rtol=1e-5)


def test_matmul_bad_inputs():
    a, b = _operands(4, 5, 6)
    with pytest.raises(TypeError, match="dtype"):
        matmul(a.int(), b.int())
    with pytest.raises(TypeError, match="share one dtype"):
        matmul(a, b.half())
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(a, a)
    with pytest.raises(ValueError, match="2-D"):
        matmul(a[None], b)
    with pytest.raises(ValueError, match="kernel must be one of"):
        matmul(a, b, kernel="cutlass")
    with pytest.raises(ValueError, match="split_k must be"):
        matmul(a, b, kernel="split_k", split_k=0)
    with pytest.raises(ValueError, match="split_k applies"):
        matmul(a, b, kernel="stream_k", split_k=2)
    with pytest.raises(TypeError, match="deterministic"):
        matmul(a, b, deterministic="yes")
    with pytest.raises(ValueError, match="is on meta"):
        matmul(torch.empty(4, 6, device="meta"), torch.empty(6, 5, device="meta"))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        matmul(a.tolist(), b)


def test_auto_rule():
    """The choice function: split-K where tiles are few and K deep, stream-K where the last wave is thin,
    chapter 03's kernels where tiles fill the SMs; TF32 goes K-major."""
    cand = splitk.auto_candidates
    bf16 = torch.bfloat16
    # Tiles filling at most a quarter of the SMs: split-K alone, with no timing (a timed choice that counted
    # host cost once preferred the one-launch tiled kernel at 16 x 4096 x 4096).
    assert cand(16, 4096, 4096, 132, bf16) == ["split_k"]
    assert cand(4096, 16, 4096, 132, bf16) == ["split_k"]
    assert cand(128, 128, 65536, 132, bf16) == ["split_k"]
    assert cand(8192, 8192, 8192, 132, bf16) == ["ch03"]
    assert cand(4096, 4096, 512, 132, bf16) == ["ch03"]
    assert "stream_k" in cand(1536, 1536, 1536, 132, bf16)  # 144 tiles: a second wave 9% full
    assert cand(1024, 1024, 1024, 132, bf16) == ["ch03", "split_k"]  # 64 tiles: both timed
    assert cand(3000, 5000, 1000, 132, bf16) == ["stream_k", "ch03"]  # 960 tiles: 7 waves and 36 tiles
    assert "split_k" not in cand(1024, 1024, 256, 132, bf16)  # K too shallow to split
    assert cand(4096, 4096, 4096, 132, torch.float32, allow_tf32=True) == ["k_major"]
    assert cand(4096, 4096, 4096, 132, torch.float32) == ["ch03"]
    assert splitk.split_for(16, 4096, 4096, 132) == 4  # 32 tiles of 16 x 128 -> 4 splits fill 128 SMs
    assert splitk.split_for(128, 128, 65536, 132) == splitk.MAX_SPLIT
    assert splitk.split_for(4096, 4096, 4096, 132) == 1


@pytest.mark.skipif(labkernels.on_gpu(), reason="the CPU lane picks by rule alone")
def test_auto_follows_rule_on_cpu_lane():
    a, b = _operands(8, 40, 2048, torch.float16)  # 1 tile for 4 "SMs", K deep: split-K
    assert splitk.auto_candidates(8, 40, 2048, splitk.num_sms(), torch.float16)[0] == "split_k"
    assert splitk.chosen_kernel(a, b) == "split_k"
    _assert_matmul(matmul(a, b), a, b, MATMUL_TOL[torch.float16])


class _PoisonedTorch:
    """torch, except that `empty` returns NaN-filled floating tensors: a kernel that skips an element of
    its output (or reads workspace it never wrote) leaves a NaN."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        t = torch.empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t


@pytest.mark.parametrize(
    "kernel, options",
    [
        ("split_k", {"split_k": 3, "deterministic": True}),
        ("split_k", {"split_k": 2}),
        ("stream_k", {}),
        ("k_major", {}),
    ],
)
def test_matmul_poisoned_buffers(monkeypatch, kernel, options):
    monkeypatch.setattr(splitk, "torch", _PoisonedTorch())
    monkeypatch.setattr(splitk, "_stream_k_scratch", {})  # fresh, poisoned partial-tile slots
    a, b = _operands(37, 21, 301)
    _assert_matmul(matmul(a, b, kernel=kernel, **options), a, b, MATMUL_TOL[torch.float32])


def test_conv_poisoned_output(monkeypatch):
    monkeypatch.setattr(conv_mod, "torch", _PoisonedTorch())
    x, w, bias = _conv_operands(2, 7, 9, 5, 6, 3)
    y = conv2d_nhwc(x, w, bias, stride=2, padding=1)
    torch.testing.assert_close(
        y.double(), conv_mod.reference(x, w, bias, stride=2, padding=1), atol=1e-4, rtol=1e-5
    )


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (4096, 16, 4096), (1000, 1536, 1003), (129, 257, 8191)])
def test_matmul_16bit_gpu(shape, dtype):
    a, b = _operands(*shape, dtype)
    kernels = (
        ("split_k", "stream_k", "auto") if shape[0] == 16 else ("split_k", "stream_k")
    )  # auto: slow to tune
    for kernel in kernels:
        out = matmul(a, b, kernel=kernel)
        _assert_matmul(out, a, b, MATMUL_TOL[dtype])
    first = matmul(a, b, kernel="split_k", deterministic=True)
    assert torch.equal(first, matmul(a, b, kernel="split_k", deterministic=True))


@pytest.mark.gpu
@gpu
def test_matmul_tf32_gpu():
    a, b = _operands(1000, 777, 2051)
    _assert_matmul(matmul(a, b, allow_tf32=True), a, b, TF32_TOL)
    assert splitk.chosen_kernel(a, b, allow_tf32=True) == "k_major"


BIG_MATMUL = """
import torch, labkernels
from labkernels.ch04_libraries.splitk import matmul
k = 2**27 + 1000  # a (16, k) and b (k, 16): 2^31+ elements each, offsets past int32
a = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
b = torch.randn(k, 16, device="cuda", dtype=torch.bfloat16)
ref = a.float() @ b.float()
for deterministic in (True, False):
    c = matmul(a, b, kernel="split_k", deterministic=deterministic).float()
    err = (c - ref).abs().max().item()
    assert err < 0.05 * k**0.5, (deterministic, err)  # a wrong offset errs by ~sqrt(k)
print("ok")
"""


@pytest.mark.gpu
@gpu
def test_matmul_beyond_int32_offsets():
    done = subprocess.run([sys.executable, "-c", BIG_MATMUL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# --- convolution -------------------------------------------------------------------------------------------


CONV_CASES = [  # (batch, H, W, C, K_out, R, stride, padding)
    (2, 7, 9, 5, 6, 3, 1, 1),
    (1, 9, 6, 20, 17, 3, 2, 1),
    (2, 5, 5, 8, 3, 1, 1, 0),
    (1, 8, 7, 3, 4, 1, 2, 0),
    (1, 6, 7, 4, 5, 3, 2, 0),
    (1, 5, 5, 40, 9, 3, 1, 0),
]
CONV_TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-2, 5e-3), torch.bfloat16: (1e-1, 2e-2)}


def _conv_operands(batch, h, w, c, k_out, r, dtype=torch.float32):
    x = torch.randn(batch, h, w, c, device=DEVICE).to(dtype)
    weights = torch.randn(k_out, r, r, c, device=DEVICE).to(dtype)
    return x, weights, torch.randn(k_out, device=DEVICE).to(dtype)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv(case, with_bias):
    *shape, stride, padding = case
    x, w, bias = _conv_operands(*shape)
    bias = bias if with_bias else None
    y = conv2d_nhwc(x, w, bias, stride=stride, padding=padding)
    expected = conv_mod.reference(x, w, bias, stride=stride, padding=padding)
    assert y.shape == expected.shape and y.is_contiguous()
    assert not y.isnan().any()
    atol, rtol = CONV_TOL[torch.float32]
    torch.testing.assert_close(y.double(), expected, atol=atol, rtol=rtol)


def test_conv_weight_from_torch_matches_conv2d():
    x, w, _ = _conv_operands(1, 6, 5, 7, 4, 3)
    torch_w = w.permute(0, 3, 1, 2).contiguous()  # (K_out, C, R, S)
    assert torch.equal(conv_mod.weight_from_torch(torch_w), w)
    y = conv2d_nhwc(x, conv_mod.weight_from_torch(torch_w), padding=1)
    expected = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), torch_w, padding=1).permute(0, 2, 3, 1)
    torch.testing.assert_close(y, expected, atol=1e-4, rtol=1e-5)


def test_conv_bad_inputs():
    x, w, bias = _conv_operands(1, 5, 5, 4, 3, 3)
    with pytest.raises(TypeError, match="dtype"):
        conv2d_nhwc(x.int(), w.int())
    with pytest.raises(TypeError, match="share one dtype"):
        conv2d_nhwc(x, w.half())
    with pytest.raises(ValueError, match="channels differ"):
        conv2d_nhwc(x, w[..., :3].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        conv2d_nhwc(x.permute(0, 2, 1, 3), w)
    with pytest.raises(ValueError, match="4-D"):
        conv2d_nhwc(x[0], w)
    with pytest.raises(ValueError, match="bias must have shape"):
        conv2d_nhwc(x, w, bias[:2])
    with pytest.raises(ValueError, match="stride must be"):
        conv2d_nhwc(x, w, stride=0)
    with pytest.raises(TypeError, match="padding must be an int"):
        conv2d_nhwc(x, w, padding=(1, 1))
    with pytest.raises(ValueError, match="larger than the padded input"):
        conv2d_nhwc(x[:, :2, :2].contiguous(), w)
    with pytest.raises(ValueError, match="no backward"):
        conv2d_nhwc(x, w.requires_grad_(True))
    with torch.no_grad():  # without grad mode, inputs that require grad are fine
        assert conv2d_nhwc(x, w).shape == (1, 3, 3, 3)


def test_conv_empty_batch():
    x, w, _ = _conv_operands(1, 5, 5, 4, 3, 3)
    assert conv2d_nhwc(x[:0], w).shape == (0, 3, 3, 3)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize(
    "case", [(32, 14, 14, 256, 256, 3, 1, 1), (3, 17, 13, 64, 96, 3, 2, 1), (4, 28, 28, 256, 64, 1, 1, 0)]
)
def test_conv_16bit_gpu(case, dtype):
    *shape, stride, padding = case
    x, w, bias = _conv_operands(*shape, dtype=dtype)
    y = conv2d_nhwc(x, w, bias, stride=stride, padding=padding)
    expected = conv_mod.reference(x, w, bias, stride=stride, padding=padding)
    atol, rtol = CONV_TOL[dtype]
    fan_in = shape[3] * shape[5] ** 2
    torch.testing.assert_close(y.double(), expected, atol=atol * fan_in**0.5, rtol=rtol)


BIG_CONV = """
import torch, labkernels
from labkernels.ch04_libraries.conv import conv2d_nhwc
x = torch.randn(2, 4097, 4097, 64, device="cuda", dtype=torch.float16)  # 2^31+ elements
w = torch.randn(16, 1, 1, 64, device="cuda", dtype=torch.float16)
y = conv2d_nhwc(x, w)
tail = x[1, -3:].float() @ w[:, 0, 0].float().t()  # the last pixels, past offset 2^31
err = (y[1, -3:].float() - tail).abs().max().item()
assert err < 0.1, err
print("ok")
"""


@pytest.mark.gpu
@gpu
def test_conv_beyond_int32_offsets():
    done = subprocess.run([sys.executable, "-c", BIG_CONV], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
