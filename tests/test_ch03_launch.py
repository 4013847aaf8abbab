"""Cached launches of chapter 03's softmax and matmul (`labkernels.launch_cache`).

CPU lane: the per-key cache in the wrappers (what the key separates, that a known key skips the checks and
still computes right, that errors still come), the switch, and the thin launcher's guards against a stand-in
compiled kernel. GPU lane: the thin launch gives bitwise the normal launch's result, on the current stream
(a CUDA graph captures it), and LABKERNELS_THIN_LAUNCH=0 keeps Triton's path. No timings: `ch03_launch`
(make bench) measures the host cost."""

import os
import subprocess
import sys

import pytest
import torch

import labkernels
from labkernels import launch_cache
from labkernels.ch03_triton import matmul as matmul_mod
from labkernels.ch03_triton import softmax as softmax_mod
from labkernels.ch03_triton.matmul import matmul
from labkernels.ch03_triton.softmax import softmax

triton = launch_cache.triton  # imported by labkernels, after the lane is chosen

DEVICE = labkernels.DEVICE
gpu = pytest.mark.skipif(not labkernels.on_gpu(), reason="needs the GPU lane")
SOFTMAX_TOL = {torch.float32: (1e-6, 1e-5), torch.float16: (1e-3, 1e-2), torch.bfloat16: (8e-3, 2e-2)}


@pytest.fixture(autouse=True)
def _thin_launches_restored():
    """Each test starts and ends with the setting from the environment, every cached launcher dropped."""
    launch_cache.set_enabled(launch_cache.enabled_from_env(), direct=launch_cache.direct_from_env())
    yield
    launch_cache.set_enabled(launch_cache.enabled_from_env(), direct=launch_cache.direct_from_env())


@pytest.fixture
def _few_matmul_configs(monkeypatch):
    """On the GPU each new key compiles and times every config: one per kernel keeps this file quick."""
    if DEVICE.type == "cuda":
        monkeypatch.setattr(matmul_mod._matmul_kernel, "configs", matmul_mod._matmul_kernel.configs[2:3])
        tma = matmul_mod._matmul_tma_kernel
        monkeypatch.setattr(tma, "configs", tma.configs[3:4])


def _softmax_launcher(x, **options):
    opts = {"num_warps": None, "rows_per_program": None, "persistent": False, "num_stages": None}
    opts |= {"vectorize": True} | options
    return softmax_mod._launches.get(softmax_mod._launch_key(x, **opts))


def _matmul_launcher(a, b, bias=None, activation=None, input_precision="ieee", kernel="auto"):
    known = matmul_mod._launches.get(matmul_mod._launch_key(a, b, bias, activation, input_precision, kernel))
    return None if known is None else known.launcher


# --- the switch --------------------------------------------------------------------------------------------


def test_switch_reads_the_environment():
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    assert launch_cache.enabled_from_env({"LABKERNELS_THIN_LAUNCH": "0"}) is False
    assert launch_cache.enabled_from_env({"LABKERNELS_THIN_LAUNCH": "off"}) is False
    assert launch_cache.enabled_from_env({}) is (version in launch_cache.VERIFIED_TRITON)
    assert launch_cache.enabled_from_env({"LABKERNELS_THIN_LAUNCH": "force"}) is (version[0] == 3)


def test_interpreter_lane_never_launches_thin():
    if labkernels.on_gpu():
        pytest.skip("CPU-lane behaviour (the interpreter)")
    launch_cache.set_enabled(True)
    assert not launch_cache.enabled()
    x = torch.randn(5, 33, device=DEVICE)
    softmax(x)
    assert _softmax_launcher(x).kind == "normal"


def test_set_enabled_drops_cached_launchers():
    x = torch.randn(3, 40, device=DEVICE)
    softmax(x)
    assert _softmax_launcher(x) is not None
    launch_cache.set_enabled(False)
    assert _softmax_launcher(x) is None
    softmax(x)
    assert _softmax_launcher(x).kind == "normal"


# --- softmax: the key, and a known key's call --------------------------------------------------------------


def test_softmax_known_key_skips_the_checks_and_computes_right(monkeypatch):
    x = torch.randn(7, 300, device=DEVICE)
    softmax(x)  # first call of the key: checks, plan, launch
    calls = []
    prepare = softmax_mod._prepare
    monkeypatch.setattr(softmax_mod, "_prepare", lambda *a: calls.append(1) or prepare(*a))
    fresh = torch.randn(7, 300, device=DEVICE) * 5  # same key, other values and storage
    got = softmax(fresh)
    assert calls == []
    atol, rtol = SOFTMAX_TOL[torch.float32]
    torch.testing.assert_close(got.double(), softmax_mod.reference(fresh.double()), atol=atol, rtol=rtol)
    softmax(torch.randn(7, 301, device=DEVICE))  # another shape: another key, checked
    assert calls == [1]


def test_softmax_key_separates_what_the_plan_and_triton_read():
    base = torch.randn(6, 64, device=DEVICE)
    key = lambda t, **o: softmax_mod._launch_key(t, None, None, o.get("p", False), None, True)  # noqa: E731
    buffer = torch.randn(6 * 64 + 1, device=DEVICE)
    shifted = buffer[1:].view(6, 64)  # 4 bytes past a 16-byte boundary: other vector width, other kernel
    variants = [
        torch.randn(6, 65, device=DEVICE),
        torch.randn(64, 6, device=DEVICE).t(),  # other strides
        base.half(),
        shifted,
    ]
    assert all(key(v) != key(base) for v in variants)
    assert key(torch.randn(6, 64, device=DEVICE)) == key(base)  # values and storage are not in it
    assert key(base, p=1) != key(base, p=True)  # persistent=1 is refused by the checks, not taken for True


def test_softmax_errors_still_come_after_a_key_is_known():
    x = torch.randn(4, 64, device=DEVICE)
    softmax(x, persistent=True)
    with pytest.raises(TypeError, match="persistent must be True or False"):
        softmax(x, persistent=1)
    with pytest.raises(TypeError, match="dtype"):
        softmax(x.int())
    with pytest.raises(TypeError, match="torch.Tensor"):
        softmax(x.tolist())
    with pytest.raises(ValueError, match="2-D"):
        softmax(x[0])


def test_softmax_unaligned_rows_after_an_aligned_key():
    buffer = torch.randn(9 * 40 + 1, device=DEVICE)
    aligned, shifted = buffer[:-1].view(9, 40), buffer[1:].view(9, 40)
    softmax(aligned)
    softmax(aligned)
    got = softmax(shifted)  # same shape and strides; its rows do not start 16-byte aligned
    assert _softmax_launcher(shifted) is not _softmax_launcher(aligned)
    torch.testing.assert_close(got, torch.softmax(shifted, dim=1), atol=1e-6, rtol=1e-5)


# --- matmul: the key, and a known key's call ---------------------------------------------------------------


def test_matmul_known_key_skips_the_checks_and_computes_right(monkeypatch, _few_matmul_configs):
    a, b = torch.randn(19, 24, device=DEVICE), torch.randn(24, 13, device=DEVICE)
    bias = torch.randn(26, device=DEVICE)[::2]  # strided: copied to a contiguous one on every call
    matmul(a, b, bias=bias, activation="relu", kernel="tiled")  # tunes
    matmul(a, b, bias=bias, activation="relu", kernel="tiled")  # keeps the launcher
    calls = []
    check = matmul_mod._check
    monkeypatch.setattr(matmul_mod, "_check", lambda *args: calls.append(1) or check(*args))
    a2, b2 = torch.randn(19, 24, device=DEVICE), torch.randn(24, 13, device=DEVICE)
    bias2 = torch.randn(26, device=DEVICE)[::2]
    got = matmul(a2, b2, bias=bias2, activation="relu", kernel="tiled")
    assert calls == []
    expected = matmul_mod.reference(a2, b2, bias2, "relu")
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)
    kernel, config = matmul_mod.tuned_config(a2, b2, bias=bias2, activation="relu", kernel="tiled")
    assert kernel == "tiled" and isinstance(config, triton.Config)


def test_matmul_errors_still_come_after_a_key_is_known(_few_matmul_configs):
    a, b = torch.randn(8, 16, device=DEVICE), torch.randn(16, 8, device=DEVICE)
    matmul(a, b, kernel="tiled")
    matmul(a, b, kernel="tiled")
    with pytest.raises(ValueError, match="activation"):
        matmul(a, b, activation="tanh", kernel="tiled")
    with pytest.raises(ValueError, match="bias"):
        matmul(a, b, bias=torch.randn(9, device=DEVICE), kernel="tiled")
    with pytest.raises(TypeError, match="share one dtype"):
        matmul(a, b.half(), kernel="tiled")
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul(a, torch.randn(15, 8, device=DEVICE), kernel="tiled")


def test_matmul_key_carries_types_and_bias():
    a, b = torch.randn(4, 8, device=DEVICE), torch.randn(8, 4, device=DEVICE)
    key = matmul_mod._launch_key
    assert key(a, b, None, None, "ieee", "tiled") != key(
        a, b, torch.randn(4, device=DEVICE), None, "ieee", "tiled"
    )
    assert key(a, b, None, None, "ieee", "tiled") != key(
        a, b.t().contiguous().t(), None, None, "ieee", "tiled"
    )
    assert key(a, b, None, None, "ieee", "tiled") != key(a, b, None, None, "tf32", "tiled")


# --- the thin launcher's guards, against a stand-in compiled kernel ----------------------------------------


class _Src:
    def __init__(self, fn, n, constants=None, attrs=None):
        self.fn, self.signature = fn, {f"p{i}": "i32" for i in range(n)}
        self.constants, self.attrs = constants or {}, attrs or {}


class _Compiled:
    def __init__(self, src, run):
        self.src, self.run, self.function, self.packed_metadata = src, run, 7, (4, 1, 0)


class _Jit:
    arg_names = ["out", "n", "BLOCK"]


def _stand_in(monkeypatch, run, constants=None):
    """A thin launcher over a fake compiled kernel (out, n, BLOCK: constexpr); the launches it makes."""
    monkeypatch.setattr(launch_cache, "_device_and_stream", lambda: (lambda: 0, lambda device: 1234))
    normal_calls = []
    jit = _Jit()
    compiled = _Compiled(_Src(jit, 3, constants if constants is not None else {(2,): 64}), run)
    full = ("OUT", 10, 64)
    assert launch_cache._replayable(compiled, jit, full) == (constants is None)
    launcher = launch_cache._thin_launcher(compiled, (5,), full, 1, lambda *t: normal_calls.append(t))
    return launcher, normal_calls


def test_thin_launcher_calling_convention(monkeypatch):
    runs = []
    launcher, normal_calls = _stand_in(monkeypatch, lambda *args: runs.append(args))
    launcher("OUT2")
    # grid padded to 3-D, the current stream, no launch metadata or hooks, every argument, constexprs included
    assert runs == [(5, 1, 1, 1234, 7, (4, 1, 0), None, None, None, "OUT2", 10, 64)]
    assert normal_calls == [] and launcher.kind == "thin, through compiled.run"  # no C launch to call


class _Run:
    """A stand-in for the driver's CudaLauncher: its C `launch` (a callable object, not a Python function)."""

    def __init__(self, global_scratch_size=0, launch=None):
        self.launches = []
        self.launch = launch if launch is not None else _Recorder(self.launches)
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.arg_annotations, self.kernel_signature = "ANNOTATIONS", b"SIG"

    def __call__(self, *args):  # compiled.run's Python step
        self.launches.append(("through run", *args))


class _Recorder:
    def __init__(self, into):
        self.into = into

    def __call__(self, *args):
        self.into.append(args)


class _Tensor:
    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


@pytest.mark.parametrize("version", [(3, 6), (3, 7)])
def test_thin_launcher_calls_tritons_c_launch_with_addresses(monkeypatch, version):
    monkeypatch.setattr(launch_cache, "_TRITON", version)
    run = _Run()
    launcher, normal_calls = _stand_in(monkeypatch, run)
    launcher(_Tensor(0xABC0))
    if version == (3, 6):  # grid, stream, function, flags, scratch, metadata, hooks, then every argument
        expected = (5, 1, 1, 1234, 7, 0, 1, None, None, (4, 1, 0), None, None, None, 0xABC0, 10, 64)
    else:  # flags, metadata, hooks, scratch, the signature, then the arguments as one tuple
        expected = (5, 1, 1, 1234, 7, 0, 1, (4, 1, 0), None, None, None, None, None, "ANNOTATIONS", b"SIG",
                    (0xABC0, 10, 64))  # fmt: skip
    assert run.launches == [expected]
    assert normal_calls == [] and launcher.kind == "thin"


class _Descriptor:
    """A stand-in host TMA descriptor: what `make_tensordesc_arg` reads."""

    def __init__(self, address, shape=(4, 8), block_shape=(2, 8)):
        self.base, self.shape, self.strides = _Tensor(address), shape, (shape[1], 1)
        self.block_shape, self.padding = block_shape, "zero"


def _descriptor_wrapper(launcher, tensordesc_indices, tensordesc_meta):
    """Shaped as triton 3.6's `wrap_handle_tensordesc` result: a Python `inner` over those three names."""

    def inner(*args):
        raise AssertionError("the thin launcher expands the descriptors itself", launcher, tensordesc_indices,
                             tensordesc_meta)  # fmt: skip

    return inner


def test_thin_launcher_expands_host_descriptors_and_keeps_their_encoding(monkeypatch):
    import triton.backends.nvidia.driver as driver

    monkeypatch.setattr(launch_cache, "_TRITON", (3, 6))
    encodings = []

    def encode(arg, meta):  # Triton's expansion: a CUtensorMap, then the shape and strides
        encodings.append((arg.base.data_ptr(), meta))
        return [f"MAP@{arg.base.data_ptr():x}", *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", encode)
    run = _Run()
    run.launch = _descriptor_wrapper(_Recorder(run.launches), {0}, [{"swizzle": 128}])
    launcher, normal_calls = _stand_in(monkeypatch, run)
    assert launcher.kind == "thin, descriptors kept"
    launcher(_Descriptor(0xA00))
    launcher(_Descriptor(0xA00))  # the same address, shape and box: encoded once
    launcher(_Descriptor(0xB00))  # another address: encoded again
    head = (5, 1, 1, 1234, 7, 0, 1, None, None, (4, 1, 0), None, None, None)
    assert run.launches == [
        (*head, "MAP@a00", 4, 8, 8, 1, 10, 64),
        (*head, "MAP@a00", 4, 8, 8, 1, 10, 64),
        (*head, "MAP@b00", 4, 8, 8, 1, 10, 64),
    ]
    assert encodings == [(0xA00, {"swizzle": 128}), (0xB00, {"swizzle": 128})] and normal_calls == []
    launcher(_Descriptor(0xA00, shape=(6, 8)))  # another shape at a kept address: a new encoding
    assert encodings[-1] == (0xA00, {"swizzle": 128}) and run.launches[-1][13:17] == ("MAP@a00", 6, 8, 8)
    monkeypatch.setattr(launch_cache, "_TRITON", (3, 7))  # another wrapper: through compiled.run
    assert launch_cache._host_descriptors(_Compiled(None, run)) is None


def test_thin_launcher_goes_through_run_when_the_c_launch_is_not_enough(monkeypatch):
    monkeypatch.setattr(launch_cache, "_TRITON", (3, 7))
    scratch = _Run(global_scratch_size=128)  # device-side tensor descriptors: compiled.run allocates them
    launcher, _ = _stand_in(monkeypatch, scratch)
    launcher("T")
    assert scratch.launches[0][:2] == ("through run", 5) and launcher.kind == "thin, through compiled.run"

    def wrapper(*args):  # tensor descriptors unpacked in Python: wrap_handle_tensordesc's `inner`
        raise AssertionError("not called")

    wrapped = _Run(launch=wrapper)
    launcher, _ = _stand_in(monkeypatch, wrapped)
    launcher("T")
    assert wrapped.launches[0][0] == "through run"
    monkeypatch.setattr(launch_cache, "_TRITON", (3, 8))  # a calling convention not read
    assert launch_cache._c_launch(_Compiled(None, _Run())) is None


def test_thin_launcher_through_run_when_asked(monkeypatch):
    monkeypatch.setattr(launch_cache, "_TRITON", (3, 7))
    launch_cache.set_enabled(True, direct=False)
    run = _Run()
    launcher, _ = _stand_in(monkeypatch, run)
    launcher("T")
    assert run.launches[0][0] == "through run"
    assert launch_cache.direct_from_env({"LABKERNELS_THIN_LAUNCH": "run"}) is False
    assert launch_cache.direct_from_env({}) is True


def test_thin_launcher_falls_back_for_good_on_an_exception(monkeypatch):
    def refuse(*args):
        raise TypeError("argument 10 is not an int")

    launcher, normal_calls = _stand_in(monkeypatch, refuse)
    launcher("A")
    launcher("B")
    assert normal_calls == [("A",), ("B",)]


def test_thin_launcher_leaves_hooked_launches_to_triton(monkeypatch):
    runs = []
    launcher, normal_calls = _stand_in(monkeypatch, lambda *args: runs.append(args))
    chain = type(triton.knobs.runtime.launch_enter_hook)()
    chain.add(lambda metadata: None)  # a profiler's hook wants launch metadata: Triton's path builds it
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", chain)
    launcher("A")
    assert runs == [] and normal_calls == [("A",)]


def test_replayable_refuses_other_constexprs(monkeypatch):
    _stand_in(monkeypatch, lambda *args: None, constants={(2,): 128})  # compiled for BLOCK=128, not 64
    jit = _Jit()
    divisible = _Compiled(_Src(jit, 3, {(2,): 64}, {(1,): [["tt.divisibility", 16]]}), None)
    assert not launch_cache._replayable(divisible, jit, ("OUT", 10, 64))  # 10 is not a multiple of 16
    assert launch_cache._replayable(divisible, jit, ("OUT", 32, 64))
    assert not launch_cache._replayable(divisible, jit, ("OUT", 32))  # an argument short


def test_tma_configs_carry_every_constexpr_the_launcher_does_not_pass():
    """A kept launcher replays the tuned config's constexprs by name: one left to its default would not be
    found, and the launch would fall back to Triton's path for good."""
    passed = {"HAS_BIAS", "ACTIVATION", "NUM_PROGRAMS"}  # `_tune`'s options for the TMA kernel
    constexprs = set(matmul_mod._matmul_tma_persistent.arg_names[10:])
    for config in matmul_mod.TMA_CONFIGS + matmul_mod.CPU_TMA_CONFIGS:
        assert constexprs <= set(config.kwargs) | passed, constexprs - set(config.kwargs) - passed


# --- GPU lane: thin and normal launches, bitwise -----------------------------------------------------------

SOFTMAX_CASES = [
    ((64, 256), torch.float32, False),
    ((37, 1000), torch.float16, False),
    ((129, 5000), torch.bfloat16, False),
    ((300, 77), torch.float32, True),  # column-major input
]


def _softmax_input(shape, dtype, transposed):
    if transposed:
        return torch.randn(shape[::-1], device=DEVICE).to(dtype).t()
    return torch.randn(shape, device=DEVICE).to(dtype)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize(("shape", "dtype", "transposed"), SOFTMAX_CASES)
def test_softmax_thin_equals_normal_bitwise(shape, dtype, transposed, persistent):
    x = _softmax_input(shape, dtype, transposed)
    launch_cache.set_enabled(False)
    expected = softmax(x, persistent=persistent)
    assert _softmax_launcher(x, persistent=persistent).kind == "normal"
    launch_cache.set_enabled(True)
    first = softmax(x, persistent=persistent)  # builds the thin launcher
    assert _softmax_launcher(x, persistent=persistent).kind == "thin"
    second = softmax(x, persistent=persistent)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # another stream: launched there, ordered after x's producer
        on_side = softmax(x, persistent=persistent)
    torch.cuda.current_stream().wait_stream(side)
    for got in (first, second, on_side):
        assert torch.equal(got, expected)
    atol, rtol = SOFTMAX_TOL[dtype]
    torch.testing.assert_close(expected.double(), softmax_mod.reference(x.double()), atol=atol, rtol=rtol)


@gpu
@pytest.mark.gpu
def test_direct_c_launch_equals_the_launch_through_run_bitwise():
    """The default thin launcher calls Triton's C launch with addresses; through compiled.run it passes the
    tensors. Same kernel, same result; on another stream too."""
    x = torch.randn(37, 1000, device=DEVICE).half()
    launch_cache.set_enabled(True, direct=False)
    softmax(x)
    via_run = softmax(x)
    assert _softmax_launcher(x).kind == "thin, through compiled.run"
    launch_cache.set_enabled(True, direct=True)
    softmax(x)
    assert _softmax_launcher(x).kind == "thin"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        direct = softmax(x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(direct, via_run) and torch.equal(softmax(x), via_run)


@gpu
@pytest.mark.gpu
def test_softmax_thin_launch_goes_to_the_current_stream():
    """A CUDA graph captures only what is launched on its capture stream: replaying it must recompute."""
    x = torch.randn(48, 512, device=DEVICE)
    softmax(x)
    softmax(x)
    assert _softmax_launcher(x).kind == "thin"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        softmax(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = softmax(x)
    fresh = torch.randn(48, 512, device=DEVICE) * 3
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    launch_cache.set_enabled(False)
    assert torch.equal(out, softmax(fresh))


MATMUL_CASES = [
    ((64, 64, 64), torch.float16, None, None, "tiled"),
    ((64, 64, 64), torch.float16, None, None, "tma_persistent"),
    ((100, 72, 40), torch.float32, "bias", "relu", "tiled"),
    ((256, 136, 192), torch.bfloat16, "bias", "gelu", "auto"),
    ((33, 65, 17), torch.float16, None, None, "tiled"),  # rows 34 bytes apart: no TMA, unaligned K
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize(("mnk", "dtype", "with_bias", "activation", "kernel"), MATMUL_CASES)
def test_matmul_thin_equals_normal_bitwise(mnk, dtype, with_bias, activation, kernel, _few_matmul_configs):
    m, n, k = mnk
    if kernel == "tma_persistent" and not matmul_mod._has_tma():
        pytest.skip("needs the TMA unit (Hopper or later)")
    a, b = torch.randn(m, k, device=DEVICE).to(dtype), torch.randn(k, n, device=DEVICE).to(dtype)
    bias = torch.randn(n, device=DEVICE).to(dtype) if with_bias else None
    call = lambda: matmul(a, b, bias=bias, activation=activation, kernel=kernel)  # noqa: E731
    launch_cache.set_enabled(False)
    call()  # tunes
    expected = call()
    assert _matmul_launcher(a, b, bias, activation, kernel=kernel).kind == "normal"
    launch_cache.set_enabled(True)
    first = call()
    known = matmul_mod._launches[matmul_mod._launch_key(a, b, bias, activation, "ieee", kernel)]
    # the TMA kernel's device-side descriptors need scratch memory, which compiled.run allocates
    via_run = known.key[0] == "tma_persistent"
    assert known.launcher.kind == ("thin, through compiled.run" if via_run else "thin")
    second = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = call()
    torch.cuda.current_stream().wait_stream(side)
    for got in (first, second, on_side):
        assert torch.equal(got, expected)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    reference = matmul_mod.reference(a, b, bias, activation)
    torch.testing.assert_close(expected.double(), reference, atol=tol * k**0.5, rtol=tol)


@gpu
@pytest.mark.gpu
def test_thin_launch_off_from_the_environment():
    code = (
        "import torch, labkernels\n"
        "from labkernels.ch03_triton import softmax as s\n"
        "x = torch.randn(8, 128, device='cuda')\n"
        "s.softmax(x); s.softmax(x)\n"
        "print(s._launches[s._launch_key(x, None, None, False, None, True)].kind)\n"
    )
    env = os.environ | {"LABKERNELS_THIN_LAUNCH": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "normal"


def test_host_us_per_step_applies_each_steps_mark_and_restores_the_setting():
    seen = {}

    def recorder(name):
        return lambda: seen.setdefault(name, (launch_cache._enabled, launch_cache._direct))

    steps = {
        "plain": recorder("plain"),
        "off": launch_cache.thin_off(recorder("off")),
        "run": launch_cache.through_run(recorder("run")),
    }
    times = launch_cache.host_us_per_step(steps, calls=3)
    assert list(times) == ["plain", "off", "run"] and all(us > 0 for us in times.values())
    env = (launch_cache.enabled_from_env(), launch_cache.direct_from_env())
    assert seen == {"plain": env, "off": (False, env[1]), "run": (env[0], False)}
    assert (launch_cache._enabled, launch_cache._direct) == env
