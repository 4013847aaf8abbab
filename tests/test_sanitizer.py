"""The sanitizer registry (labkernels.sanitize): it covers every op and kernel, its entries pass, and on the
GPU compute-sanitizer finds no error in them, while it does find a planted out-of-bounds write.

CPU lane: coverage, and every entry under the Triton interpreter. GPU lane (CUDA and compute-sanitizer):
memcheck over every entry in one process, racecheck over the shared-memory entries, the planted bug. Each
run prints its wall time (pytest -s shows it).
"""

from __future__ import annotations

import importlib
import os
import re
import textwrap
import time

import pytest

from labkernels import on_gpu, sanitize

needs_sanitizer = pytest.mark.skipif(
    not on_gpu() or sanitize.find_compute_sanitizer() is None, reason="needs a CUDA GPU and compute-sanitizer"
)


def test_op_modules_are_found():
    """The discovery the coverage tests rest on sees the chapters' kernel modules."""
    modules = sanitize.op_modules()
    for name in ("ch01_jit.ops", "ch02_strides.ops", "ch03_triton.matmul", "ch06_attention.flash_attention"):
        assert f"labkernels.{name}" in modules
    assert len(sanitize.kernels()) >= 20


def test_registry_covers_every_public_op():
    """A new public op (a function of a kernel module not in NOT_OPS) needs a sanitizer entry."""
    covered = {op for e in sanitize.REGISTRY.values() for op in e.covers}
    public = set(sanitize.public_ops())
    assert not public - covered, f"ops without a sanitizer entry: {sorted(public - covered)}"
    missing = [op for op in covered if not callable(_resolve(op))]
    assert not missing, f"entries cover ops that do not exist: {sorted(missing)}"


def _resolve(op: str):
    module, function = op.split(":")
    return getattr(importlib.import_module(f"labkernels.{module}"), function, None)


@pytest.fixture(scope="module")
def warm_cache():
    """GPU lane: every entry once, each in its own process, several at a time. It fills Triton's cache in
    parallel (a cold cache compiles every autotune config: minutes in one process), so the single-process
    runs below time the kernels, not the compiler. The CPU lane interprets: nothing to warm."""
    if not on_gpu():
        return None
    jobs = min(8, os.cpu_count() or 1)
    start = time.perf_counter()
    results = sanitize.run_in_parallel(sanitize.selected(), jobs, print_fn=lambda line: None)
    seconds = time.perf_counter() - start
    print(f"\nsanitizer registry, {len(results)} processes, {jobs} at a time (cold compile): {seconds:.1f} s")
    return results


def test_parallel_runs_report_each_entry_and_its_failure(tmp_path):
    """--jobs: one process per entry; a failing entry is named with its error, the others pass."""
    failing = tmp_path / "failing.py"
    failing.write_text(FAILING)
    entries = [
        sanitize.REGISTRY["ch03.vector_add"],
        sanitize.Entry("planted.wrong", lambda: None, (), False, False),
    ]
    results = {
        name: error for name, _, error in sanitize.run_in_parallel(entries, 2, [str(failing)], print_fn=print)
    }
    assert results["ch03.vector_add"] is None
    assert "AssertionError" in (results["planted.wrong"] or ""), results


def test_every_entry_passes_and_every_kernel_launches(capsys, warm_cache):
    """Every entry of this lane runs and matches its reference; together they launch every Triton kernel."""
    failed = [f"{name} (own process): {error}" for name, _, error in warm_cache or [] if error]
    assert not failed, "\n".join(failed)
    sanitize.LAUNCHED.clear()
    start = time.perf_counter()
    results = sanitize.run_entries(sanitize.selected())
    failed = [f"{name}: {error}" for name, _, error in results if error]
    assert not failed, "\n".join(failed)
    skipped = set() if on_gpu() else sanitize.GPU_ONLY_KERNELS
    missed = set(sanitize.kernels()) - sanitize.LAUNCHED - skipped
    assert not missed, f"kernels no entry launches: {sorted(missed)}"
    with capsys.disabled():
        seconds = time.perf_counter() - start
        print(f"\nsanitizer registry, no sanitizer: {len(results)} entries, {seconds:.1f} s")


def test_close_fails_on_a_wrong_result():
    t = sanitize.rand(37, 53)
    with pytest.raises(AssertionError, match="poison"):
        sanitize.close(sanitize.poisoned(37, 53), t, "poison")


# --- GPU lane: under compute-sanitizer ----------------------------------------------------------------------


def _report(tool: str, rc: int, output: str, seconds: float) -> None:
    summary = re.findall(r"=+ (?:ERROR|RACECHECK) SUMMARY: .*", output)
    print(f"\ncompute-sanitizer {tool}: exit {rc}, {seconds:.1f} s wall; {summary[-1:] or 'no summary'}")


def _assert_clean(tool: str, rc: int, output: str) -> None:
    assert rc == 0, f"compute-sanitizer {tool} exited {rc}:\n{output[-12000:]}"
    assert re.search(r"(ERROR|RACECHECK) SUMMARY: 0 (errors|hazards)", output), output[-12000:]
    assert re.search(r"\d+/\d+ entries ok", output), output[-4000:]


@needs_sanitizer
def test_memcheck_over_every_op(capsys, warm_cache):
    """Every entry under memcheck in one process, after `warm_cache` built the extension and compiled the
    kernels (the sanitized run then measures the kernels, not the compilers)."""
    args = ["-m", "labkernels.sanitize", "--check-kernels"]
    rc, output, seconds = sanitize.run_under("memcheck", args, timeout=480)
    with capsys.disabled():
        print(output)
        _report("memcheck", rc, output, seconds)
    _assert_clean("memcheck", rc, output)


@needs_sanitizer
def test_racecheck_over_the_shared_memory_kernels(capsys, warm_cache):
    args = ["-m", "labkernels.sanitize", "--shared-memory"]
    rc, output, seconds = sanitize.run_under("racecheck", args, timeout=400)
    with capsys.disabled():
        print(output)
        _report("racecheck", rc, output, seconds)
    _assert_clean("racecheck", rc, output)


# A kernel that writes one element past the end of `out`. 128 float32 = 512 bytes: a whole number of the
# allocator's 512-byte rounding, so the stray element lies outside the cudaMalloc'd block however torch
# rounds it.
PLANTED = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl

    from labkernels import sanitize


    @triton.jit
    def _one_past_the_end_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
        offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        x = tl.load(x_ptr + offs, mask=offs < n_elements, other=0.0)
        tl.store(out_ptr + offs, x, mask=offs < n_elements + 1)  # the bug: one element too many


    @sanitize.entry("planted.one_past_the_end", ())
    def _planted():
        x = sanitize.rand(128)
        out = torch.empty_like(x)
        _one_past_the_end_kernel[(1,)](x, out, 128, BLOCK_SIZE=256)
        sanitize.close(out, x, "planted copy", tol=0)
    """
)


# An entry whose op returns the wrong answer: the parallel runner must name it and its error.
FAILING = textwrap.dedent(
    """
    from labkernels import sanitize


    @sanitize.entry("planted.wrong", ())
    def _wrong():
        x = sanitize.rand(37, 53)
        sanitize.close(x + 1, x, "planted wrong answer", tol=1e-6)
    """
)


@needs_sanitizer
def test_memcheck_catches_a_planted_out_of_bounds_write(tmp_path, capsys):
    """Without this, a clean memcheck run would prove nothing: the same harness must report a stray write."""
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    args = ["-m", "labkernels.sanitize", "--extra", str(planted), "--only", "^planted"]
    rc, output, seconds = sanitize.run_under("memcheck", args, timeout=300)
    with capsys.disabled():
        _report("memcheck (planted bug)", rc, output, seconds)
    assert rc == sanitize.ERROR_EXITCODE, f"exit {rc}, expected {sanitize.ERROR_EXITCODE}:\n{output[-8000:]}"
    assert "Invalid __global__ write" in output, output[-8000:]
    assert "_one_past_the_end_kernel" in output, output[-8000:]
