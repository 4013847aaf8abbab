"""Chapters 01-02 under hostile use: `out` overlapping an input, autograd, torch.compile over the ch02 ops,
NaN and inf, the extension cache (a damaged library, a lock whose owner died), sizes past 2^31 elements
(GPU, one subprocess per kernel: an illegal address kills the process's CUDA context), and a TORCH_CHECK
message with numbers in it (GPU image).

Run as a script (`python tests/test_ch01_ch02_hardening.py big <case> <dtype>`) it is the child process of
the large-size tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import labkernels  # picks the lane first
from labkernels.ch01_jit import abi_probe, build, cache, diagnostics
from labkernels.ch01_jit import ops as ch01
from labkernels.ch02_strides import ops as ch02
from labkernels.ch02_strides import triton_strided as tri

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]
# Every child process runs from the repository root with it on PYTHONPATH: where labkernels is not installed
# (the GPU image runs from a checkout), a child started as `python <file>` or from another directory would
# not find it.
CHILD = dict(cwd=ROOT, env=build.child_env())
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=gpu)]
LANE_DEVICE = labkernels.DEVICE  # where the Triton kernels run
SPECIALS = [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1.0, -1.0]


@pytest.fixture(scope="module", autouse=True)
def extension():
    ch01.load()
    return ch02.ensure_loaded()


def _randn(*shape, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)


# --- finding 2: out overlapping an input --------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_add_relu_out_refuses_any_overlap(device):
    buf = _randn(300, device=device)
    x, y = buf[:100], _randn(100, device=device, seed=1)
    cases = {"partial": buf[50:150], "exact": x, "y": y}
    for case, out in cases.items():
        with pytest.raises(RuntimeError, match="out overlaps (x|y) in memory"):
            ch01.add_relu_out(x, y, out)
            pytest.fail(f"{case} overlap accepted")
        with pytest.raises(RuntimeError, match="out overlaps (x|y) in memory"):  # the C++ check, directly
            torch.ops.labkernels.add_relu_out.default(x, y, out)
    out = buf[100:200]  # adjacent, not overlapping: accepted
    torch.testing.assert_close(ch01.add_relu_out(x, y, out), torch.relu(x + y))


# --- finding 3: autograd ------------------------------------------------------------------------------------


def _leaves(*tensors):
    return tuple(t.detach().requires_grad_() for t in tensors)


@pytest.mark.parametrize("device", DEVICES)
def test_ch01_ops_have_a_backward(device):
    x, y = _leaves(_randn(7, 9, device=device), _randn(7, 9, device=device, seed=1))
    assert torch.autograd.gradcheck(ch01.add_relu, (x, y))
    assert torch.autograd.gradcheck(ch01.add_relu_naive, (x, y))
    assert torch.autograd.gradcheck(lambda t: ch01.scale_shift(t, -1.5, 0.25), (x,))
    ch01.add_relu(x, y).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, (x + y > 0).double())
    for dtype in (torch.float32, torch.float64):
        a, b = _leaves(_randn(33, dtype=dtype, device=device), _randn(33, dtype=dtype, device=device, seed=2))
        torch.library.opcheck(torch.ops.labkernels.add_relu.default, (a, b))
        torch.library.opcheck(torch.ops.labkernels.scale_shift.default, (a, 2.0, -1.0))


@pytest.mark.parametrize("device", DEVICES)
def test_ch02_cpp_ops_have_a_backward(device):
    (base,) = _leaves(_randn(9, 7, device=device))
    (row,) = _leaves(_randn(7, device=device, seed=3))
    xt = base.t()  # (7, 9) transposed view
    assert torch.autograd.gradcheck(ch02.copy_strided, (xt,))
    assert torch.autograd.gradcheck(ch02.copy_2d_tiled, (xt,))
    assert torch.autograd.gradcheck(lambda b, r: ch02.add_relu_strided(b, r.expand(9, 7)), (base, row))
    out = ch02.copy_strided(xt)
    assert out.requires_grad and out.is_contiguous()
    for name in ("copy_strided", "copy_2d_tiled"):
        torch.library.opcheck(getattr(torch.ops.labkernels, name).default, (xt,))
    torch.library.opcheck(torch.ops.labkernels.add_relu_strided.default, (base, row.expand(9, 7)))


@pytest.mark.parametrize("device", DEVICES)
def test_out_forms_refuse_inputs_that_require_grad(device):
    x, y = _leaves(_randn(64, device=device), _randn(64, device=device, seed=1))
    out = torch.empty(64, dtype=torch.float64, device=device)
    with pytest.raises(RuntimeError, match="records no backward"):
        ch01.add_relu_out(x, y, out)
    with pytest.raises(RuntimeError, match="records no backward"):
        ch02.copy_strided(x, out=out)
    with pytest.raises(RuntimeError, match="records no backward"):
        ch02.add_relu_strided(x, y, out=out)
    with torch.no_grad():
        ch01.add_relu_out(x, y, out)  # no graph asked for: fine
    torch.testing.assert_close(out, torch.relu(x + y).detach())


def test_ch02_triton_kernels_refuse_inputs_that_require_grad():
    (x,) = _leaves(_randn(16, 8, dtype=torch.float32, device=LANE_DEVICE))
    for fn in (tri.copy_flat, tri.copy_2d_naive, tri.copy_2d_tiled):
        with pytest.raises(RuntimeError, match="record no backward"):
            fn(x)
    with pytest.raises(RuntimeError, match="record no backward"):
        tri.add_relu_2d(x, x.detach())


# --- finding 10: torch.compile(fullgraph=True) over the ch02 ops --------------------------------------------


def test_ch02_cpp_ops_compile_fullgraph():
    base, row = _randn(33, 17, dtype=torch.float32), _randn(17, dtype=torch.float32, seed=1)

    def f(b, r):
        return ch02.add_relu_strided(ch02.copy_strided(b.t()).t(), r.expand(33, 17)) + ch02.copy_2d_tiled(b)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(base, row), torch.relu(base + row) + base)


def test_ch02_triton_kernels_compile_fullgraph():
    base = _randn(33, 17, dtype=torch.float32, device=LANE_DEVICE)
    row = _randn(17, dtype=torch.float32, device=LANE_DEVICE, seed=1)

    def f(b, r):
        return tri.add_relu_2d(tri.copy_2d_tiled(b.t()).t(), r.expand(33, 17)) + tri.copy_2d_naive(b)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(base, row), torch.relu(base + row) + base)


# --- finding 4: NaN and inf ---------------------------------------------------------------------------------


def _special_pairs(dtype, device):
    a = torch.tensor(SPECIALS, dtype=torch.float64)
    x, y = torch.meshgrid(a, a, indexing="ij")
    return x.to(device=device, dtype=dtype).contiguous(), y.to(device=device, dtype=dtype).contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_nan_and_inf_match_torch(device, dtype):
    x, y = _special_pairs(dtype, device)
    expected = torch.relu(x + y)
    assert expected.isnan().any()  # the table holds NaN cases: a relu that drops NaN fails below
    for name, got in {
        "add_relu": ch01.add_relu(x, y),
        "add_relu_naive": ch01.add_relu_naive(x, y),
        "add_relu_out": ch01.add_relu_out(x, y, torch.full_like(x, 7.0)),
        "add_relu_strided": ch02.add_relu_strided(x.t(), y.t()).t(),
    }.items():
        torch.testing.assert_close(got, expected, equal_nan=True, atol=0, rtol=0, msg=name)
    torch.testing.assert_close(ch01.scale_shift(x, 2.0, 1.0), x * 2.0 + 1.0, equal_nan=True, atol=0, rtol=0)
    # Triton kernels run on the lane's device only; the interpreter computes bf16 wrongly.
    if device == LANE_DEVICE.type and (dtype != torch.bfloat16 or device == "cuda"):
        xt = tri.add_relu_2d(x.t(), y.t()).t()
        torch.testing.assert_close(xt, expected, equal_nan=True, atol=0, rtol=0)


# --- finding 5: the extension cache -------------------------------------------------------------------------

_TINY = 'extern "C" int labkernels_tiny() { return 42; }\n'
_CHILD = textwrap.dedent(
    """
    import sys, warnings
    from pathlib import Path
    from torch.utils import cpp_extension
    from labkernels.ch01_jit import build, cache
    directory = Path(sys.argv[1])
    build.ensure_ninja_on_path()
    def load():
        return cpp_extension.load(name="tiny", sources=[str(directory / "tiny.cpp")],
                                  build_directory=str(directory), is_python_module=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = cache.guarded_load(load, directory / "tiny.so", wait_seconds=float(sys.argv[2]))
    print("WARN", " | ".join(str(w.message) for w in caught))
    print("PATH", path)
    """
)


def _tiny_load(directory: Path, wait_seconds: float = 60.0, timeout: float = 120.0):
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), str(wait_seconds)],
        capture_output=True,
        text=True,
        timeout=timeout,
        **CHILD,
    )


@pytest.fixture
def tiny(tmp_path):
    directory = tmp_path / "tiny"
    directory.mkdir()
    (directory / "tiny.cpp").write_text(_TINY)
    done = _tiny_load(directory)
    assert done.returncode == 0, done.stderr
    return directory


@pytest.mark.parametrize("damage", ["truncated", "zeroed"])
def test_a_damaged_cached_library_is_detected_and_relinked(tiny, damage):
    lib = tiny / "tiny.so"
    size = lib.stat().st_size
    with open(lib, "r+b") as f:
        if damage == "truncated":
            f.truncate(size // 2)
        else:
            f.write(bytes(size))
    later = time.time() + 5  # newer than its sources and objects: ninja would keep it
    os.utime(lib, (later, later))
    assert cache.elf_problem(lib) is not None
    done = _tiny_load(tiny)
    assert done.returncode == 0, done.stderr  # before: the process died loading it (or raised, every time)
    assert "deleted it, so the build links it again" in done.stdout
    assert lib.stat().st_size == size and cache.elf_problem(lib) is None and cache.is_verified(lib)


def test_a_library_that_crashes_its_loader_is_caught_in_a_child(tiny, monkeypatch):
    lib = tiny / "tiny.so"
    assert cache.sound_library(lib) is None  # verified when built: no child process needed
    monkeypatch.setattr(cache, "child_load_problem", lambda path: "killed it with signal 7")
    cache._stamp(lib).unlink()
    with pytest.warns(UserWarning, match="signal 7"):
        assert cache.sound_library(lib) is not None
    assert not lib.exists()


# A relink in progress, as `build.load` makes one after a source changed: the linker removes the old library
# and writes the new one over seconds, its ELF header last. This child does that inside `guarded_load`, then
# checks that the library it wrote is still the one at the path, and loads it.
_RELINK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch
    from labkernels.ch01_jit import cache
    lib = Path(sys.argv[1])
    whole = lib.read_bytes()
    def relink():
        lib.unlink()
        with open(lib, "wb") as f:
            f.write(bytes(len(whole) // 2))  # half written, no header yet
            f.flush()
            print("LINKING", flush=True)
            time.sleep(4)
            f.seek(0)
            f.write(whole)
            inode = os.fstat(f.fileno()).st_ino
        assert lib.exists() and lib.stat().st_ino == inode, "the library being linked was deleted meanwhile"
        torch.ops.load_library(str(lib))
        return str(lib)
    cache.guarded_load(relink, lib, wait_seconds=60)
    print("LOADED", flush=True)
    """
)


def test_a_load_beside_a_relink_waits_for_it_and_deletes_nothing(tiny):
    """The fresh-machine `make test-gpu` failure: a process arriving while another linked the extension judged
    the half-written library damaged and deleted it, and every process that had built or waited for that
    build then failed to load it (`cannot open shared object file`). A load now waits for the relink."""
    lib = tiny / "tiny.so"
    linker = subprocess.Popen(
        [sys.executable, "-c", _RELINK, str(lib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **CHILD,
    )
    try:
        assert linker.stdout.readline().strip() == "LINKING", linker.stderr.read()
        arriving = _tiny_load(tiny)  # arrives mid-link
        stdout, stderr = linker.communicate(timeout=60)
    finally:
        linker.kill()
    assert linker.returncode == 0 and "LOADED" in stdout, stderr[-2000:]
    assert arriving.returncode == 0, arriving.stderr[-2000:]
    assert "deleted it" not in arriving.stdout, arriving.stdout  # before: it deleted the library being linked
    assert cache.elf_problem(lib) is None


def test_a_library_under_a_live_build_lock_is_not_judged(tiny):
    """A build in progress (torch's lock held by a live process) writes the library: checking it then would
    find it half-written and delete it."""
    lib = tiny / "tiny.so"
    with open(lib, "r+b") as f:
        f.write(bytes(64))  # no ELF header, as mid-link
    holder = _hold_lock(tiny / "lock")
    try:
        assert cache.sound_library(lib) is None
    finally:
        holder.kill()
        holder.wait()
    assert lib.exists()


def _hold_lock(lock: Path) -> subprocess.Popen:
    """A live build's lock, as either torch takes it: the file created and held open (FileBaton, up to torch
    2.13) and an OS lock on it (filelock, from torch 2.14)."""
    code = (
        f"import fcntl, os, time; fd = os.open({str(lock)!r}, os.O_CREAT | os.O_RDWR); "
        "fcntl.flock(fd, fcntl.LOCK_EX); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], **CHILD)
    for _ in range(200):
        if lock.exists() and diagnostics.lock_holders(lock) and diagnostics.os_lock_held(lock):
            return holder
        time.sleep(0.05)
    holder.kill()
    raise AssertionError("the lock holder did not start")


file_baton_only = pytest.mark.skipif(
    diagnostics.torch_builds_hold_an_os_lock(),
    reason="torch >= 2.14 builds under an OS lock, which dies with its holder: no lock to recover or bound",
)


@file_baton_only
def test_a_build_whose_lock_owner_dies_recovers(tiny):
    (tiny / "tiny.so").unlink()
    lock = tiny / "lock"
    holder = _hold_lock(lock)
    waiter = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tiny), "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **CHILD,
    )
    time.sleep(3)  # the waiter waits on a live lock (or, still starting, will find a dead one)
    holder.kill()  # the owner dies mid-build: its lock stays behind
    holder.wait()
    try:
        stdout, stderr = waiter.communicate(timeout=60)  # before: waited forever
    finally:
        waiter.kill()
    assert waiter.returncode == 0, stderr
    assert "removed a stale build lock" in stdout and not lock.exists() and (tiny / "tiny.so").exists()


@file_baton_only
def test_a_live_lock_is_waited_on_for_a_bounded_time(tiny):
    (tiny / "tiny.so").unlink()
    lock = tiny / "lock"
    holder = _hold_lock(lock)
    try:
        done = _tiny_load(tiny, wait_seconds=1.0, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    assert "BuildLockTimeout" in done.stderr and f"held by process {holder.pid}" in done.stderr
    assert f"rm {lock}" in done.stderr


# --- finding 9: a TORCH_CHECK message that streams numbers --------------------------------------------------

_STREAMED = r"""
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

namespace {
void streamed(int64_t n, double x) {
  const std::vector<int64_t> sizes{4, 6};
  TORCH_CHECK(n < 0, "n = ", n, ", x = ", x, ", sizes = ", c10::IntArrayRef(sizes));
}
}  // namespace

TORCH_LIBRARY(lk_streamed_check, m) { m.def("streamed(int n, float x) -> ()", &streamed); }
"""

# A process set up like the course's (torch, triton, CUDA, the course extension), then the op.
_STREAMED_CHILD = """
import sys
import labkernels, torch, triton  # noqa: F401
if torch.cuda.is_available():
    torch.cuda.init()
from labkernels.ch01_jit import ops
ops.load()
torch.ops.load_library(sys.argv[1])
try:
    torch.ops.lk_streamed_check.streamed(7, 0.5)
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0])
"""


def test_a_check_that_streams_numbers_raises_with_them():
    """On the H200 image, with extensions linked the default way, this killed the process (SIGSEGV) instead
    of raising: the regression test of the private libstdc++ link of `build_inline` (and `build.load`). In a
    child process, so that a crash fails this test instead of ending the run."""
    path = diagnostics.build_inline("lk_streamed_check", _STREAMED)
    done = subprocess.run(
        [sys.executable, "-c", _STREAMED_CHILD, path], capture_output=True, text=True, timeout=300, **CHILD
    )
    assert done.returncode == 0, (
        f"exit {done.returncode} (negative: killed by that signal): {done.stderr[-3000:]}"
    )
    assert "RuntimeError: n = 7, x = 0.5, sizes = [4, 6]" in done.stdout, done.stdout + done.stderr[-3000:]


def test_the_course_extension_keeps_its_libstdcxx_private():
    """The course extension links libstdc++ privately and exports none of its stream or locale symbols (on
    the H200 image the default link exported `std::locale::classic` and the number inserters)."""
    flags = build.private_libstdcxx_flags()
    if not flags:
        pytest.skip("no libstdc++.a for this compiler (or not Linux): extensions link the default way")
    lib = os.path.realpath(ch01.load())
    ninja = (Path(lib).parent / "build.ninja").read_text()
    assert all(flag in ninja for flag in flags), "the link line lacks the private libstdc++ flags"
    for symbol in abi_probe.SYMBOLS:
        providers = [os.path.realpath(p) for p in abi_probe.providers(symbol)]
        assert providers and lib not in providers, (symbol, providers)


def test_without_a_static_libstdcxx_the_build_warns_and_links_the_default_way(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert build.static_libstdcxx() is None
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(build, "static_libstdcxx", lambda: None)
    build.private_libstdcxx_flags.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"no libstdc\+\+\.a .*abi_probe"):
            assert build.private_libstdcxx_flags() == ()
    finally:
        build.private_libstdcxx_flags.cache_clear()  # the next call looks at the real compiler again


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_streamed_numbers_in_a_check_message_raise():
    """The probe builds the failing check with each link in a child and reports which library resolves the
    stream's symbols; `streamed:` is the result for the link the course uses."""
    done = subprocess.run(
        [sys.executable, "-m", "labkernels.ch01_jit.abi_probe"],
        capture_output=True,
        text=True,
        timeout=300,
        **CHILD,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "streamed: raised" in done.stdout


# --- finding 1: past 2^31 elements (GPU) --------------------------------------------------------------------

_N = 2**31 + 4099  # 1-D cases: past 2^31, and not a multiple of any vector width or block
_BIG = 46_349  # 46349^2 = 2^31 + 745_703 elements
_NEAR = 46_000  # 46000^2 < 2^31 - 1: int32 offsets, but i + grid-stride passes 2^31
BIG_CASES = [
    ("add_relu", torch.float16),
    ("add_relu_naive", torch.bfloat16),
    ("scale_shift", torch.float16),
    ("copy_strided_near", torch.bfloat16),
    ("copy_strided", torch.float16),
    ("add_relu_strided_near", torch.float16),
    ("add_relu_strided", torch.bfloat16),
    ("cpp_copy_2d_tiled", torch.bfloat16),
    ("triton_copy_flat", torch.float16),
    ("triton_copy_2d_naive", torch.bfloat16),
    ("triton_copy_2d_tiled", torch.float16),
    ("triton_add_relu_2d", torch.bfloat16),
]


def _samples(n: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    head, tail = torch.arange(4096), torch.arange(n - 4096, n)
    return torch.cat([head, tail, torch.randint(0, n, (8192,), generator=g)]).to(device)


def _big_case(case: str, dtype: torch.dtype, dev: str = "cuda") -> None:
    """Run one kernel past 2^31 elements and compare head, tail and random samples to torch."""
    if case in ("add_relu", "add_relu_naive", "scale_shift", "triton_copy_flat"):
        n = _N
        x = torch.randn(n, device=dev, dtype=dtype)
        y = torch.randn(n, device=dev, dtype=dtype)
        fn = {
            "add_relu": lambda: ch01.add_relu(x, y),
            "add_relu_naive": lambda: ch01.add_relu_naive(x, y),
            "scale_shift": lambda: ch01.scale_shift(x, -1.5, 0.25),
            "triton_copy_flat": lambda: tri.copy_flat(x),
        }[case]
        ref = {
            "add_relu": lambda i: torch.relu(x[i].float() + y[i].float()),
            "add_relu_naive": lambda i: torch.relu(x[i].float() + y[i].float()),
            "scale_shift": lambda i: x[i].float() * -1.5 + 0.25,
            "triton_copy_flat": lambda i: x[i].float(),
        }[case]
        out = fn()
        i = _samples(n, dev)
        # one rounding to dtype from float (an FMA on the GPU may round x * a + b differently in float)
        tol = dict(atol=0, rtol=0) if "copy" in case else dict(atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(out[i].float(), ref(i).to(dtype).float(), **tol)
        return
    side = _NEAR if case.endswith("_near") else _BIG
    base = torch.randn(side, side, device=dev, dtype=dtype)
    x = base.t()  # a transposed view: strided reads
    name = case.removesuffix("_near")
    if "add_relu" in name:
        row = torch.randn(side, device=dev, dtype=dtype)
        y = row.expand(side, side)  # stride 0
        fn = {"add_relu_strided": ch02.add_relu_strided, "triton_add_relu_2d": tri.add_relu_2d}[name]
        out = fn(x, y)
    else:
        fn = {
            "copy_strided": ch02.copy_strided,
            "cpp_copy_2d_tiled": ch02.copy_2d_tiled,
            "triton_copy_2d_naive": tri.copy_2d_naive,
            "triton_copy_2d_tiled": lambda v: tri.copy_2d_tiled(v, block_m=64, block_n=64),
        }[name]
        out = fn(x)
        y = None
    i = _samples(side * side, dev)
    m, k = i // side, i % side
    expected = (
        x[m, k].float() if y is None else torch.relu(x[m, k].float() + y[m, k].float()).to(dtype).float()
    )
    assert out.is_contiguous()
    tol = dict(atol=0, rtol=0) if y is None else dict(atol=1e-2, rtol=1e-2)  # copies are exact
    torch.testing.assert_close(out.view(-1)[i].float(), expected, **tol)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_every_kernel_past_2_31_elements():
    """Each kernel in its own process, four at a time (an H200 holds them all)."""

    def run(case):
        name, dtype = case
        done = subprocess.run(
            [sys.executable, __file__, "big", name, str(dtype).removeprefix("torch.")],
            capture_output=True,
            text=True,
            timeout=170,
            **CHILD,
        )
        return name, done.returncode, (done.stdout + done.stderr).strip().splitlines()[-3:]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, BIG_CASES))
    failed = [(name, rc, tail) for name, rc, tail in results if rc != 0]
    print(f"{len(results) - len(failed)}/{len(results)} kernels correct past 2^31 elements")
    assert not failed, failed


if __name__ == "__main__" and sys.argv[1:2] == ["big"]:
    _big_case(sys.argv[2], getattr(torch, sys.argv[3]))
    torch.cuda.synchronize()
    print("ok")
