"""Chapter 03 kernels under hostile input (issue 12): sizes past 2^31 elements, `out` overlapping an input,
autograd and torch.compile, NaN and inf, and clear errors for bad launch parameters.

The CPU lane checks the index logic with small proxies (the choice of the int64 path, and that path's results
at small sizes); the GPU lane runs every kernel above 2^31 elements, each in its own process (an illegal
memory access would leave the CUDA context unusable for the rest of the run)."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import labkernels
from labkernels.ch03_triton import add_relu as add_relu_mod
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.ch03_triton import vector_add as vector_add_mod
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch03_triton.matmul import matmul
from labkernels.ch03_triton.softmax import softmax
from labkernels.ch03_triton.vector_add import vector_add

# NaN and inf inputs: numpy, under the interpreter, warns about the invalid values it was given on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
DEVICE = labkernels.DEVICE
gpu = pytest.mark.skipif(not labkernels.on_gpu(), reason="needs the GPU lane")
INT32_MAX = 2**31 - 1
SOFTMAX_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2)}
ELEMENTWISE = [vector_add, add_relu]
ELEMENTWISE_REF = {vector_add: torch.add, add_relu: lambda x, y: torch.relu(x + y)}


def _meta(shape, stride=None, dtype=torch.float16):
    """A tensor with shape and strides and no memory: enough for the index-width choice."""
    stride = stride or torch.empty(shape, device="meta").stride()
    return torch.empty_strided(shape, stride, device="meta", dtype=dtype)


@pytest.fixture(autouse=True)
def _few_matmul_configs(monkeypatch):
    """On the GPU each new key compiles and times every config: one per kernel keeps this file quick."""
    if DEVICE.type == "cuda":
        monkeypatch.setattr(matmul_mod._matmul_kernel, "configs", matmul_mod._matmul_kernel.configs[2:3])
        monkeypatch.setattr(
            matmul_mod._matmul_tma_kernel, "configs", matmul_mod._matmul_tma_kernel.configs[3:4]
        )


# --- 1. 64-bit offsets: the choice, and the int64 path's results at small sizes -----------------------------


def test_elementwise_int64_chosen_exactly_when_offsets_pass_int32():
    need = vector_add_mod.needs_int64
    assert not need(2**20, 1024)
    assert not need(INT32_MAX - 1024, 1024)  # the last block's offsets still fit
    assert need(INT32_MAX - 1023, 1024)  # they reach 2^31 - 1 + 1 = 2^31: no longer
    assert need(2**31 + 4099, 1024)
    assert need(2**31 - 8192, add_relu_mod.MAX_TUNED_BLOCK)  # autotuned: the largest config's block counts


def test_softmax_int64_chosen_from_shape_and_strides():
    need = softmax_mod.needs_int64
    assert not need(_meta((2**18 - 1, 8192)))
    assert need(_meta((2**31 // 8192 + 3, 8192)))  # row * 8192 passes 2^31
    assert need(_meta((2**33, 1)))  # narrow rows, 2^33 of them: the row index itself needs int64
    assert need(_meta((300, 8192), (1, 2**19)))  # column-major: cols * stride_xn is what is large
    assert not need(_meta((300, 4096), (1, 300)))


def test_matmul_int64_chosen_from_operands_and_result():
    need = matmul_mod.needs_int64
    b = _meta((64, 16))
    assert not need(_meta((4096, 64)), b)
    assert need(_meta((2**31 // 64 + 3, 64)), b)  # A past 2^31 elements
    assert need(_meta((2**21, 8)), _meta((8, 2**10 + 8)))  # A and B small, C past 2^31
    # Column-major A of 2^29 elements: each offset fits, but a step of BLOCK_SIZE_K columns may not.
    assert need(_meta((2**23, 64), (1, 2**23)), b)
    assert need(_meta((64, 64)), _meta((64, 2**25), (1, 64)))  # column-major B with 2^31 elements
    why = matmul_mod._why_not_tma(_meta((2**31 + 8, 8)), _meta((8, 8)))
    assert why is not None and "int32" in why  # a TMA descriptor's dimensions are int32


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_int64_path_is_correct(fn, monkeypatch):
    module = vector_add_mod if fn is vector_add else add_relu_mod
    launched = []
    kernel = module._vector_add_kernel if fn is vector_add else module._add_relu_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs["INDEX_64"])
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(module, "needs_int64", lambda n, block: True)
    monkeypatch.setattr(module, "_vector_add_kernel" if fn is vector_add else "_add_relu_kernel", Spy())
    n = 3 * 4096 + 11
    x, y = torch.randn(n, device=DEVICE), torch.randn(n, device=DEVICE)
    out = torch.full_like(x, float("nan"))
    fn(x, y, out, block_size=4096)
    assert launched == [True]
    torch.testing.assert_close(out, ELEMENTWISE_REF[fn](x, y), atol=0, rtol=0)


def test_softmax_int64_path_is_correct(monkeypatch):
    monkeypatch.setattr(softmax_mod, "needs_int64", lambda x: True)
    x = torch.randn(37, 300, device=DEVICE) * 4
    xt = torch.randn(300, 37, device=DEVICE).t()  # column-major: cols * stride in int64 too
    for options in ({}, {"persistent": True}, {"vectorize": False, "rows_per_program": 1}):
        for v in (x, xt):
            out, plan = softmax_mod._prepare(v, None, options.get("rows_per_program"), False, None, True)
            assert plan.index_64
            torch.testing.assert_close(softmax(v, **options), torch.softmax(v, dim=1), atol=1e-6, rtol=1e-5)


def test_matmul_int64_path_is_correct(monkeypatch):
    monkeypatch.setattr(matmul_mod, "needs_int64", lambda a, b: True)
    a = torch.randn(75, 67, device=DEVICE).t()  # (67, 75) column-major; K = 75: a ragged last step
    b = torch.randn(75, 41, device=DEVICE)
    bias = torch.randn(41, device=DEVICE)
    got = matmul(a, b, bias=bias, activation="relu", kernel="tiled")
    key = matmul_mod._matmul(a, b, bias, "relu", "ieee", "tiled")[1]
    assert matmul_mod._tuned_launches[key].meta["INDEX_64"] is True
    torch.testing.assert_close(got.double(), matmul_mod.reference(a, b, bias, "relu"), atol=1e-4, rtol=1e-4)


# --- 2. out overlapping an input ---------------------------------------------------------------------------


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_out_partially_overlapping_an_input_is_refused(fn):
    n = 1000
    buf = torch.randn(2 * n + 1, device=DEVICE)
    x, y = buf[:n], torch.randn(n, device=DEVICE)
    with pytest.raises(ValueError, match="out partially overlaps x"):
        fn(x, y, buf[1 : n + 1])
    with pytest.raises(ValueError, match="out partially overlaps y"):
        fn(y, x, buf[n // 2 : n // 2 + n])  # x is now the second argument, y
    # Adjacent is not overlapping; exactly the same buffer is in place, which the kernel is written for.
    expected = ELEMENTWISE_REF[fn](x, y)
    out = buf[n : 2 * n]
    fn(x, y, out)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    fn(x, y, x)
    torch.testing.assert_close(x, expected, atol=0, rtol=0)
    y_copy = y.clone()
    fn(y_copy, y, y)
    torch.testing.assert_close(y, ELEMENTWISE_REF[fn](y_copy, y_copy), atol=0, rtol=0)


# --- 3. autograd, torch.compile, and a plain call that stays plain -----------------------------------------


class _OpsSeen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _labkernels_ops(fn) -> list[str]:
    with _OpsSeen() as seen:
        fn()
    return [name for name in seen.names if name.startswith("labkernels.")]


def test_a_plain_call_launches_directly_and_a_grad_call_goes_through_the_op():
    x, y = torch.randn(8, 16, device=DEVICE), torch.randn(8, 16, device=DEVICE)
    b = torch.randn(16, 4, device=DEVICE)
    for fn in (lambda: add_relu(x, y), lambda: vector_add(x, y), lambda: softmax(x), lambda: matmul(x, b)):
        assert _labkernels_ops(fn) == []
    xg = x.clone().requires_grad_()
    assert _labkernels_ops(lambda: softmax(xg)) == ["labkernels.ch03_softmax.default"]
    with torch.no_grad():
        assert _labkernels_ops(lambda: softmax(xg)) == []


def _grads(fn, *inputs):
    """fn's output and the gradients of <output, fixed random weights> with respect to inputs."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    return out.detach(), grads


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_gradients_match_torch(fn):
    x, y = torch.randn(33, 70, device=DEVICE), torch.randn(33, 70, device=DEVICE)
    out, grads = _grads(fn, x, y)
    ref_out, ref_grads = _grads(ELEMENTWISE_REF[fn], x, y)
    torch.testing.assert_close(out, ref_out, atol=0, rtol=0)
    for got, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="out= does not support autograd"):
        fn(x.requires_grad_(), y, torch.empty_like(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_gradients_match_torch(dtype):
    x = (torch.randn(13, 300, device=DEVICE) * 3).to(dtype)
    out, (grad,) = _grads(softmax, x)
    ref_out, (ref_grad,) = _grads(lambda v: torch.softmax(v.double(), dim=1), x)
    atol, rtol = SOFTMAX_TOL[dtype]
    torch.testing.assert_close(out, ref_out.to(dtype), atol=atol, rtol=rtol)
    torch.testing.assert_close(grad, ref_grad.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_matmul_gradients_match_torch(activation):
    a, b = torch.randn(37, 29, device=DEVICE), torch.randn(29, 43, device=DEVICE)
    bias = torch.randn(43, device=DEVICE)
    out, grads = _grads(lambda a, b, bias: matmul(a, b, bias=bias, activation=activation), a, b, bias)
    ref_out, ref_grads = _grads(
        lambda a, b, bias: matmul_mod.reference(a, b, bias, activation).float(), a, b, bias
    )
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    for got, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_ops_pass_torch_library_opcheck():
    x, y = torch.randn(5, 40, device=DEVICE), torch.randn(5, 40, device=DEVICE)
    b, bias = torch.randn(40, 24, device=DEVICE), torch.randn(24, device=DEVICE)
    ops = torch.ops.labkernels
    cases = [
        (ops.ch03_vector_add.default, (x, y)),
        (ops.ch03_add_relu.default, (x, y)),
        (ops.ch03_softmax.default, (x,)),
        (ops.ch03_matmul.default, (x, b, bias, "gelu")),
    ]
    tests = ("test_schema", "test_autograd_registration", "test_faketensor")
    for op, args in cases:
        args = tuple(t.requires_grad_() if isinstance(t, torch.Tensor) else t for t in args)
        torch.library.opcheck(op, args, test_utils=tests)


def test_torch_compile_fullgraph_over_the_four_ops():
    def block(x, y, b, bias):
        h = add_relu(vector_add(x, y), y)
        return softmax(matmul(h, b, bias=bias, activation="relu"))

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    x, y = torch.randn(16, 32, device=DEVICE), torch.randn(16, 32, device=DEVICE)
    b, bias = torch.randn(32, 24, device=DEVICE), torch.randn(24, device=DEVICE)
    out, grads = _grads(compiled, x, y, b, bias)
    ref_out, ref_grads = _grads(block, x, y, b, bias)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    for got, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


# --- 4. NaN and inf, as torch -------------------------------------------------------------------------------

SPECIALS = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1.5, -1.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_nan_and_inf_as_torch(fn, dtype):
    values = torch.tensor(SPECIALS, device=DEVICE)
    x = values.repeat_interleave(len(SPECIALS)).to(dtype)  # every pair of specials, in a weird length
    y = values.repeat(len(SPECIALS)).to(dtype)
    r = torch.randn(1000, device=DEVICE).to(dtype)
    x, y = torch.cat([x, r]), torch.cat([y, -r.roll(1)])  # sums of both signs, some exactly 0
    got = fn(x, y, block_size=64)  # several blocks: specials at block edges too
    torch.testing.assert_close(got, ELEMENTWISE_REF[fn](x, y), atol=0, rtol=0, equal_nan=True)
    assert got[: len(SPECIALS) ** 2].isnan().sum() > 0  # the case of the issue: relu(NaN) is NaN
    torch.testing.assert_close(fn(x, y), ELEMENTWISE_REF[fn](x, y), atol=0, rtol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softmax_nan_and_inf_rows_as_torch(dtype):
    inf, nan = float("inf"), float("nan")
    x = torch.randn(9, 37, device=DEVICE)
    x[0, 3] = inf  # one +inf: a row of NaN (inf - inf)
    x[1, :] = -inf  # all -inf: NaN (-inf - -inf)
    x[2, 5] = nan
    x[3, ::2] = -inf  # some -inf: zeros there, the rest a softmax
    x[4, 0], x[4, 1] = inf, -inf
    x[5, :] = 1e4  # large but finite: the max subtracted keeps it finite
    x[6, 7] = -inf
    x = x.to(dtype)
    expected = torch.softmax(x.float(), dim=1).to(dtype)
    atol, rtol = SOFTMAX_TOL[dtype]
    for options in ({}, {"persistent": True}, {"rows_per_program": 1, "vectorize": False}):
        got = softmax(x, **options)
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True)
    assert got[1].isnan().all() and not got[3].isnan().any()


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_matmul_nan_and_inf_as_torch(activation):
    a = torch.randn(40, 16, device=DEVICE)
    b = torch.randn(16, 24, device=DEVICE)
    a[3, 2] = float("nan")  # row 3 of C: NaN everywhere, and relu must keep it
    a[7, 0] = float("inf")  # row 7: +inf or -inf by the sign of b[0]; relu turns -inf into 0
    bias = torch.randn(24, device=DEVICE)
    bias[5] = float("nan")  # column 5: NaN
    kernels = ["tiled"] + (["tma_persistent"] if DEVICE.type == "cpu" or matmul_mod._has_tma() else [])
    for kernel in kernels:
        for dtype in (torch.float32, torch.float16):
            if kernel == "tma_persistent" and dtype == torch.float32:
                continue
            ad, bd, biasd = a.to(dtype), b.to(dtype), bias.to(dtype)
            got = matmul(ad, bd, bias=biasd, activation=activation, kernel=kernel)
            expected = matmul_mod.reference(ad, bd, biasd, activation).to(dtype)
            assert got[3].isnan().all() and got[:, 5].isnan().all()
            torch.testing.assert_close(got, expected, atol=2e-2, rtol=1e-2, equal_nan=True)


# --- 5. clear errors, and empty inputs ----------------------------------------------------------------------


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_bad_launch_parameters(fn):
    x = torch.randn(100, device=DEVICE)
    limit = vector_add_mod.MAX_BLOCK_NUMEL
    with pytest.raises(ValueError, match="block_size is 2097152, above the limit of 1048576"):
        fn(x, x, block_size=2 * limit)
    for bad in (1024.0, "1024", True):
        with pytest.raises(TypeError, match="block_size must be an int"):
            fn(x, x, block_size=bad)
    with pytest.raises(ValueError, match="num_warps must be a positive power of two, got 3"):
        fn(x, x, block_size=128, num_warps=3)
    with pytest.raises(ValueError, match="num_warps is 64, above"):
        fn(x, x, block_size=4096, num_warps=64)
    for bad in (4.0, False):
        with pytest.raises(TypeError, match="num_warps must be an int"):
            fn(x, x, block_size=128, num_warps=bad)
    with pytest.raises(ValueError, match="power of two, got 0"):
        fn(x, x, block_size=0)


@pytest.mark.parametrize("fn", ELEMENTWISE)
def test_elementwise_empty_inputs(fn):
    x = torch.randn(0, 5, device=DEVICE)
    got = fn(x, x)
    assert got.shape == (0, 5) and got.dtype == x.dtype
    out = torch.empty(0, 5, device=DEVICE)
    assert fn(x, x, out) is out


def test_softmax_bad_launch_parameters_and_empty_inputs():
    x = torch.randn(4, 8, device=DEVICE)
    for bad in (2.0, True, "2"):
        with pytest.raises(TypeError, match="rows_per_program must be an int"):
            softmax(x, rows_per_program=bad)
    with pytest.raises(ValueError, match="rows_per_program=1048576 rows of 8 lanes .* above Triton's limit"):
        softmax(x, rows_per_program=2**20)
    with pytest.raises(ValueError, match="num_warps must be a positive power of two, got 6"):
        softmax(x, num_warps=6)
    with pytest.raises(TypeError, match="num_warps must be an int"):
        softmax(x, num_warps=4.5)
    with pytest.raises(ValueError, match="num_stages must be a positive"):
        softmax(x, num_stages=0)
    with pytest.raises(TypeError, match="persistent must be True or False"):
        softmax(x, persistent="yes")
    for shape in ((0, 8), (3, 0), (0, 0)):
        got = softmax(torch.randn(shape, device=DEVICE))
        assert got.shape == shape and got.dtype == torch.float32


def test_matmul_empty_inputs_as_torch():
    a, b = torch.randn(5, 0, device=DEVICE), torch.randn(0, 7, device=DEVICE)
    bias = torch.randn(7, device=DEVICE)
    for activation in (None, "relu", "gelu"):  # K = 0: the sum of nothing, plus bias
        got = matmul(a, b, bias=bias, activation=activation)
        torch.testing.assert_close(
            got.double(), matmul_mod.reference(a, b, bias, activation), atol=1e-6, rtol=0
        )
    assert matmul(torch.randn(0, 3, device=DEVICE), torch.randn(3, 7, device=DEVICE)).shape == (0, 7)
    assert matmul(torch.randn(4, 3, device=DEVICE), torch.randn(3, 0, device=DEVICE)).shape == (4, 0)
    with pytest.raises(ValueError, match="nothing tuned"):
        matmul_mod.tuned_config(a, b)


# --- GPU lane: every kernel above 2^31 elements, each in a fresh process ------------------------------------

_BIG_PRELUDE = """
import torch
import labkernels
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton.add_relu import add_relu
from labkernels.ch03_triton.matmul import matmul
from labkernels.ch03_triton.softmax import softmax
from labkernels.ch03_triton.vector_add import vector_add

torch.manual_seed(0)
BIG = 2**31


def sample(n, k=1 << 16):
    '''Indices to check: the head, everything past 2^31, and random ones between.'''
    head = torch.arange(0, k, device="cuda")
    tail = torch.arange(min(n, BIG) - k, n, device="cuda")
    return torch.cat([head, tail, torch.randint(0, n, (k,), device="cuda")])
"""

_BIG_CASES = {
    "vector_add": """
n = BIG + 4099
x = torch.randn(n, device="cuda", dtype=torch.float16)
y = torch.randn(n, device="cuda", dtype=torch.float16)
i = sample(n)
for options in ({}, {"block_size": 4096, "num_warps": 8}):
    out = vector_add(x, y, **options)
    assert torch.equal(out[i], x[i] + y[i]), options  # an add gathered is the same add
    del out
""",
    "add_relu": """
n = BIG + 4099
x = torch.randn(n, device="cuda", dtype=torch.float16)
y = torch.randn(n, device="cuda", dtype=torch.float16)
i = sample(n)
for options in ({}, {"block_size": 1024}):
    out = add_relu(x, y, **options)
    assert torch.equal(out[i], torch.relu(x[i] + y[i])), options
    del out
""",
    "softmax": """
rows, cols = BIG // 8192 + 3, 8192
x = torch.randn(rows, cols, device="cuda", dtype=torch.float16) * 3
r = torch.cat([torch.arange(0, 8, device="cuda"), torch.arange(rows - 8, rows, device="cuda"),
               torch.randint(0, rows, (64,), device="cuda")])
for options in ({}, {"persistent": True}):
    out = softmax(x, **options)
    torch.testing.assert_close(out[r], torch.softmax(x[r].float(), dim=1).half(), atol=1e-3, rtol=1e-2)
    del out
del x
xt = (torch.randn(cols, rows, device="cuda", dtype=torch.float16) * 3).t()  # column-major (rows, cols)
out = softmax(xt)
torch.testing.assert_close(out[r], torch.softmax(xt[r].float(), dim=1).half(), atol=1e-3, rtol=1e-2)
""",
    "matmul": """
matmul_mod._matmul_kernel.configs = matmul_mod._matmul_kernel.configs[2:3]  # one config: no tuning
matmul_mod._matmul_tma_kernel.configs = matmul_mod._matmul_tma_kernel.configs[3:4]


def check(a, b, kernel, rows):
    c = matmul(a, b, kernel=kernel)
    expected = (a[rows].float() @ b.float()).half()
    torch.testing.assert_close(c[rows], expected, atol=2e-2, rtol=1e-2, msg=lambda m: f"{kernel}: {m}")


M, K, N = BIG // 64 + 3, 64, 16  # A past 2^31 elements, a small N
b = torch.randn(K, N, device="cuda", dtype=torch.float16)
rows = torch.cat([torch.arange(0, 256, device="cuda"), torch.arange(M - 256, M, device="cuda"),
                  torch.randint(0, M, (4096,), device="cuda")])
a = torch.randn(M, K, device="cuda", dtype=torch.float16)
for kernel in ("tiled", "tma_persistent"):
    check(a, b, kernel, rows)
del a
a = torch.randn(K, M, device="cuda", dtype=torch.float16).t()  # column-major: a K step is 64 * M elements
check(a, b, "tiled", rows)
del a
M, K, N = 2**21, 16, 2**10 + 8  # C past 2^31 elements from small operands
a = torch.randn(M, K, device="cuda", dtype=torch.float16)
b = torch.randn(K, N, device="cuda", dtype=torch.float16)
rows = torch.cat([torch.arange(0, 64, device="cuda"), torch.arange(M - 64, M, device="cuda")])
for kernel in ("tiled", "tma_persistent"):
    check(a, b, kernel, rows)
""",
}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("kernel", sorted(_BIG_CASES))
def test_kernel_above_2_to_31_elements(kernel):
    """2^31 + a few fp16 elements (4 GiB per tensor, < 20 GB per process); a sample of the result against
    torch on the same elements. A fresh process: an illegal address would poison this one's CUDA context."""
    code = textwrap.dedent(_BIG_PRELUDE) + textwrap.dedent(_BIG_CASES[kernel]) + "\nprint('OK')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (done.stdout + done.stderr)[-4000:]
