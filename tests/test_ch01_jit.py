"""Chapter 01: the JIT-built extension's ops (every dtype, weird sizes, poisoned outputs, bad inputs),
opcheck, torch.compile, and the build helpers (sources, compile-error surfacing, stale locks, rebuild facts).

The extension is built once per session into the shared project cache (seconds when cached). CUDA variants
are marked `gpu`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import labkernels  # noqa: F401  (picks the lane first)
from labkernels.ch01_jit import build, cache, diagnostics, ops
from labkernels.ch01_jit.rebuild import measure_rebuilds, rebuild_facts, scenarios

HAS_CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parents[1]
CHILD = dict(cwd=ROOT, env=build.child_env())  # children find labkernels even where it is not installed
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
DEVICES = ["cpu", pytest.param("cuda", marks=gpu)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# One rounding of a float computation to the output dtype, against a float64 reference.
TOL = {
    torch.float32: (1e-6, 1e-6),
    torch.float64: (1e-12, 1e-12),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
}
WEIRD_SIZES = [0, 1, 7, 1023, 4099, 100_003]  # tails of every length, more than one parallel chunk
ADD_RELU_VARIANTS = ["add_relu", "add_relu_naive", "add_relu_out"]


@pytest.fixture(scope="module", autouse=True)
def extension():
    return ops.load()


def _inputs(n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g).to(device=device, dtype=dtype)
    y = torch.randn(n, generator=g).to(device=device, dtype=dtype)
    return x, y


def _run(variant, x, y):
    if variant == "add_relu_out":
        out = torch.full_like(x, float("nan"))  # poisoned: an unwritten element stays NaN
        assert ops.add_relu_out(x, y, out) is out
        return out
    return getattr(ops, variant)(x, y)


def _reference(x, y):
    return torch.relu(x.double() + y.double())


# --- correctness --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ADD_RELU_VARIANTS)
def test_add_relu_matches_float64_reference(variant, dtype, device):
    for n in WEIRD_SIZES:
        x, y = _inputs(n, dtype, device, seed=n)
        out = _run(variant, x, y)
        assert out.dtype == dtype and out.device == x.device and out.shape == x.shape
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(out.double(), _reference(x, y), atol=atol, rtol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_relu_equals_torch_eager_bit_for_bit(dtype, device):
    # Both compute the sum in float (double for float64) and round once: relu does not round.
    x, y = _inputs(50_001, dtype, device)
    assert torch.equal(ops.add_relu(x, y), torch.relu(x + y))


@pytest.mark.parametrize("device", DEVICES)
def test_add_relu_keeps_nan_and_handles_2d(device):
    x, y = _inputs(6 * 777, torch.float32, device)
    x, y = x.view(6, 777), y.view(6, 777)
    x[2, 5] = float("nan")
    out = ops.add_relu(x, y)
    assert out.shape == (6, 777) and torch.isnan(out[2, 5])
    torch.testing.assert_close(out, torch.relu(x + y), equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_scale_shift_every_dtype(dtype, device):
    for n in WEIRD_SIZES:
        x, _ = _inputs(n, dtype, device, seed=n)
        a, b = -1.75, 0.3125  # exact in every dtype
        out = ops.scale_shift(x, a, b)
        assert out.dtype == dtype
        atol, rtol = TOL[dtype]
        torch.testing.assert_close(out.double(), x.double() * a + b, atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_vectorized_handles_misaligned_views(dtype):
    # A view starting one element in is not 16-byte aligned: the launcher must fall back, not fault.
    x, y = _inputs(10_001, dtype, "cuda")
    xs, ys = x[1:], y[1:]
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(ops.add_relu(xs, ys).double(), _reference(xs, ys), atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_runs_on_the_current_stream():
    x, y = _inputs(1 << 20, torch.float32, "cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = ops.add_relu(x, y)
    stream.synchronize()
    torch.testing.assert_close(out, torch.relu(x + y))


# --- bad input: each raises an error that names the problem ------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs_raise_named_errors(device):
    x, y = _inputs(64, torch.float32, device)
    cases = [
        (lambda: ops.add_relu(x, y.double()), RuntimeError, "same dtype"),
        (lambda: ops.add_relu(x, y[:10]), RuntimeError, "same shape"),
        (lambda: ops.add_relu(x[::2], y[::2]), RuntimeError, "must be contiguous"),
        (lambda: ops.add_relu(x.view(8, 8).t(), y.view(8, 8)), RuntimeError, "must be contiguous"),
        (lambda: ops.add_relu(x.int(), y.int()), TypeError, "dtype float32, float64, float16 or bfloat16"),
        (lambda: ops.add_relu(x, 3.0), TypeError, "y must be a torch.Tensor"),
        (lambda: ops.scale_shift(x, "2", 1.0), TypeError, "a must be a Python float"),
        (lambda: ops.scale_shift(x, 10**400, 0), ValueError, "a is an int with 401 digits, too large"),
        (lambda: ops.scale_shift(x, 1.0, -(10**309)), ValueError, "b is an int with 310 digits"),
        (lambda: ops.add_relu_out(x, y, torch.empty(3, device=device)), RuntimeError, "x and out"),
        (
            lambda: ops.add_relu_out(x, y, torch.empty(64, dtype=torch.float64, device=device)),
            RuntimeError,
            "dtype",
        ),
    ]
    for fn, error, words in cases:
        with pytest.raises(error, match=words):
            fn()


def test_cpp_checks_reject_what_python_would_let_through():
    # Calling the operator directly skips the Python wrapper: the C++ TORCH_CHECKs must still hold.
    x, y = _inputs(64, torch.float32, "cpu")
    with pytest.raises(
        RuntimeError, match="x must have dtype float32, float64, float16 or bfloat16, got Int"
    ):
        torch.ops.labkernels.add_relu.default(x.int(), y.int())
    with pytest.raises(RuntimeError, match="x must be contiguous, got sizes \\[32\\] with strides \\[2\\]"):
        torch.ops.labkernels.add_relu.default(x[::2], y[::2])
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        torch.ops.labkernels.scale_shift.default(x[::2], 1.0, 0.0)


def test_mixed_devices_are_rejected_in_python():
    x, _ = _inputs(64, torch.float32, "cpu")
    with pytest.raises(ValueError, match="x and y must be on the same device, got cpu and meta"):
        ops.add_relu(x, torch.empty(64, device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_mixed_devices_are_rejected_in_cpp():
    x, y = _inputs(64, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="x and y must be on the same device"):
        torch.ops.labkernels.add_relu.default(x, y.cuda())


# --- the op as torch sees it: opcheck, torch.compile -------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_opcheck(dtype, device):
    x, y = _inputs(1001, dtype, device)
    torch.library.opcheck(torch.ops.labkernels.add_relu.default, (x, y))
    torch.library.opcheck(torch.ops.labkernels.add_relu_naive.default, (x, y))
    torch.library.opcheck(torch.ops.labkernels.add_relu_out.default, (x, y, torch.empty_like(x)))
    torch.library.opcheck(torch.ops.labkernels.scale_shift.default, (x, 2.0, -1.0))


def test_compiles_fullgraph_without_graph_break():
    x, y = _inputs(1001, torch.float32, "cpu")

    def f(a, b):
        return ops.scale_shift(ops.add_relu(a, b), 2.0, 1.0)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")  # tracing is what is tested: no codegen
    torch.testing.assert_close(compiled(x, y), torch.relu(x + y) * 2 + 1)


# --- the build ----------------------------------------------------------------------------------------------


def test_every_csrc_file_is_in_the_extension():
    unity = (build.build_directory() / "unity_cpu.cpp").read_text()
    for path in build.cpp_sources():
        assert f'#include "{path.as_posix()}"' in unity
    assert build.LAST_BUILD is not None and Path(build.LAST_BUILD.path).exists()


def test_setup_py_lists_the_same_sources():
    root = Path(__file__).resolve().parents[1]
    tree = ast.parse((root / "setup.py").read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "sources" for n in tree.body)
    namespace: dict = {"__name__": "setup_under_test", "__file__": str(root / "setup.py")}
    exec(compile(tree, "setup.py", "exec"), namespace)  # the __main__ guard keeps setup() from running
    cpp = [str(p.relative_to(root)) for p in build.cpp_sources()]
    cuda = [str(p.relative_to(root)) for p in build.cuda_host_sources() + build.cuda_sources()]
    assert namespace["sources"](with_cuda=False) == cpp
    assert namespace["sources"](with_cuda=True) == cpp + cuda


def test_no_torch_header_reaches_nvcc():
    """The .cu files and what they include stay free of torch headers: nvcc would pay for them many times."""
    cuda_dir = build.CSRC / "cuda"
    for path in build.cuda_sources() + sorted(cuda_dir.glob("*.h")) + sorted(cuda_dir.glob("*.cuh")):
        includes = [line for line in path.read_text().splitlines() if line.startswith("#include")]
        assert not [i for i in includes if any(h in i for h in ("ATen/", "torch/", "c10/", "checks.h"))], path


def test_cuda_sources_build_only_with_nvcc_and_a_gpu_to_target(monkeypatch):
    """pip's default torch on Linux is the CUDA build: on a machine without a GPU, torch's arch detection
    finds no device (IndexError in cpp_extension), so CUDA sources are left out unless an arch is named."""
    from torch.utils import cpp_extension

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert not build.with_cuda()  # CUDA build, no GPU: C++ only
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    assert build.with_cuda()  # an arch named: cross-compiling is the user's choice
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert not build.with_cuda()  # no nvcc
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    assert build.with_cuda()
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not build.with_cuda()  # the CPU wheel


def test_build_dir_follows_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build.build_directory().parent == tmp_path
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    assert build.build_directory().parent.name == ".torch_extensions"


def test_unity_file_is_not_rewritten_when_unchanged(tmp_path):
    first = build.unity_files(tmp_path)[0]
    stamp = first.stat().st_mtime_ns
    time.sleep(0.01)
    build.unity_files(tmp_path)
    assert first.stat().st_mtime_ns == stamp  # a rewrite would make ninja rebuild everything


# --- diagnostics: compile errors and stale locks ------------------------------------------------------------

GCC_LOG = """ninja: build stopped: subcommand failed.
[1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=x -isystem /very/long/include/path -c main.cpp -o main.o
FAILED: main.o
/tmp/x/main.cpp: In function 'at::Tensor f(const at::Tensor&)':
/tmp/x/main.cpp:3:12: error: 'const class at::Tensor' has no member named 'frobnicate'
    3 |   return x.frobnicate();
/tmp/x/main.cpp:4:1: error: expected ';' before '}' token
"""


def test_first_compiler_error_is_parsed_from_a_log():
    msg = diagnostics.first_compiler_error(GCC_LOG)
    assert (Path(msg.file).name, msg.line, msg.column) == ("main.cpp", 3, 12)
    assert "frobnicate" in msg.message
    nvcc = diagnostics.first_compiler_error('/tmp/x/cuda.cu(17): error: identifier "blockidx" is undefined\n')
    assert (Path(nvcc.file).name, nvcc.line) == ("cuda.cu", 17)
    link = diagnostics.first_compiler_error(
        "main.o: undefined reference to `foo()'\ncollect2: error: ld returned"
    )
    assert link.file == "<linker>"


def test_compile_error_shows_the_first_error_and_the_learners_line():
    source = "#include <ATen/ATen.h>\n\nat::Tensor f(const at::Tensor& x) {\n  return x.frobnicate();\n}\n"
    with pytest.raises(diagnostics.CompileError) as info:
        diagnostics.build_inline("test_ch01_bad", source, functions=["f"])
    text = str(info.value)
    assert "line 4: error:" in text and "frobnicate" in text and "return x.frobnicate();" in text
    assert len(text.splitlines()) <= 5  # short: not the whole ninja log
    assert "c++" in info.value.log  # which is still there for whoever wants it


@pytest.fixture
def file_baton_torch(monkeypatch):
    """torch's FileBaton lock (torch <= 2.13: the file exists while a build runs), whatever torch this is."""
    monkeypatch.setattr(diagnostics, "torch_builds_hold_an_os_lock", lambda: False)


@pytest.fixture
def os_lock_torch(monkeypatch):
    """torch's OS lock (torch >= 2.14: filelock, its file left behind), whatever torch this is."""
    monkeypatch.setattr(diagnostics, "torch_builds_hold_an_os_lock", lambda: True)


def test_the_lock_kind_is_the_installed_torchs():
    from torch.utils import cpp_extension

    assert diagnostics.torch_builds_hold_an_os_lock() == (not hasattr(cpp_extension, "FileBaton"))


def test_under_an_os_lock_the_file_left_behind_is_neither_stale_nor_a_build(tmp_path, os_lock_torch):
    """torch >= 2.14 leaves `lock` after every build. Before, it counted as a running build for 5 s (so a
    damaged library went unchecked) and then as stale (so every load deleted it, with a warning)."""
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    status = diagnostics.lock_status(tmp_path)
    assert status.os_lock and not status.stale and not status.building
    assert diagnostics.check_lock(tmp_path, fix=True).lock == lock and lock.exists()  # kept, no error
    assert diagnostics.find_stale_locks(tmp_path) == []
    (tmp_path / "ext.so").write_bytes(b"not a library")  # damaged: checked and deleted, lock or not
    with pytest.warns(UserWarning, match="deleted it"):
        assert cache.sound_library(tmp_path / "ext.so") is not None
    assert not (tmp_path / "ext.so").exists()


def test_under_an_os_lock_a_held_lock_is_a_build(tmp_path, os_lock_torch):
    lock = tmp_path / "lock"
    code = (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status = diagnostics.lock_status(tmp_path)
        assert status.building and not status.stale
        (tmp_path / "ext.so").write_bytes(b"being written")  # a build is writing it: left alone
        assert cache.sound_library(tmp_path / "ext.so") is None and (tmp_path / "ext.so").exists()
    finally:
        holder.kill()
        holder.wait()
    assert not diagnostics.lock_status(tmp_path).building  # the kernel released it with its holder


def test_stale_lock_is_detected_explained_and_fixed(tmp_path, file_baton_torch):
    lock = tmp_path / "lock"
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    status = diagnostics.lock_status(tmp_path)
    assert status.stale and status.holders == ()
    with pytest.raises(diagnostics.StaleLockError, match="Stale build lock") as info:
        diagnostics.check_lock(tmp_path)
    assert "clear_stale_lock" in str(info.value) and f"rm {lock}" in str(info.value)
    assert [s.lock for s in diagnostics.find_stale_locks(tmp_path)] == [lock]
    assert diagnostics.clear_stale_lock(tmp_path) and not lock.exists()
    assert diagnostics.check_lock(tmp_path) is None


def test_a_lock_held_by_a_live_build_is_not_stale(tmp_path, file_baton_torch):
    lock = tmp_path / "lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL); time.sleep(30)",
        ],
        **CHILD,
    )
    try:
        for _ in range(200):
            if lock.exists() and diagnostics.lock_holders(lock):
                break
            time.sleep(0.05)
        old = time.time() - 3600
        os.utime(lock, (old, old))
        status = diagnostics.check_lock(tmp_path)  # returned, not raised: waiting for it is right
        assert status is not None and not status.stale and holder.pid in status.holders
        with pytest.raises(RuntimeError, match="It is not stale"):
            diagnostics.clear_stale_lock(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_a_fresh_lock_is_not_stale(tmp_path, file_baton_torch):
    (tmp_path / "lock").touch()
    assert not diagnostics.lock_status(tmp_path).stale


# --- what rebuilds: measured --------------------------------------------------------------------------------


def test_rebuild_facts_match_torch_cpp_extension(tmp_path):
    facts = rebuild_facts(measure_rebuilds(tmp_path))
    assert set(facts) == set(scenarios())
    for (api, edit, process), rebuilt in facts.items():
        # a header is not in torch's hash (same process: the stale library stays), but ninja's depfile has it
        expected = edit in ("comment", "flag") or (edit in ("touch", "header") and process == "new")
        assert rebuilt == expected, (api, edit, process)
