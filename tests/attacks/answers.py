"""Hostile answers, graded as functions (the way `check(...)` ships them). Each docstring says what it
tries."""

import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _twice_plus_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.jit
def _twice_plus_one_host_python(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    import math  # noqa: F401  (host Python: the interpreter runs it, Triton's compiler refuses it)

    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def twice_plus_one_with_host_python(x, out):
    """T.1 by a kernel whose body holds host Python (an import): right under the interpreter, and a kernel
    that no GPU compiler accepts."""
    _twice_plus_one_host_python[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def forge_results_and_exit(x, out):
    """Writes pass records into the results file the grading child reads, then exits non-zero."""
    import json
    import os
    import sys

    for path in sys.argv[1:]:
        if path.endswith(".jsonl"):
            with open(path, "a") as f:
                for i in range(500):
                    rec = {"event": "case", "case": f"c{i}", "points": 1, "status": "pass", "earned": 1}
                    f.write(json.dumps({**rec, "reason": ""}) + "\n")
    os._exit(1)


def peek_caller_frames(x, out):
    """Copies the grader's `expected` tensor out of the caller's stack frame."""
    import inspect

    frame = inspect.currentframe().f_back
    while frame is not None:
        if "expected" in frame.f_locals:
            out.copy_(frame.f_locals["expected"])
            return
        frame = frame.f_back


def patch_comparison(x, out):
    """Replaces the grader's comparison and guard check with no-ops, then writes nothing."""
    from labkernels.grading import core

    core.Grader.check_close = lambda self, *a, **k: None
    core.Grader.check_guards = lambda self: None


# Not a function here: its default argument would run when this module is imported (in the test's own
# process). Graded from source, the way the grader receives a notebook's function.
PATCH_AT_DEFINITION = {
    "kind": "code",
    "entry": "patch_at_definition",
    "source": """
import labkernels.grading.core


def patch_at_definition(
    x, out, _=setattr(labkernels.grading.core.Grader, "check_close", lambda *a, **k: None)
):
    out.zero_()
""",
}


def exit_zero_midway(x, out):
    """Passes the first case, then calls sys.exit(0)."""
    import builtins
    import sys

    calls = getattr(builtins, "_attack_calls", 0)
    builtins._attack_calls = calls + 1
    if calls:
        sys.exit(0)
    _twice_plus_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def hard_exit_zero(x, out):
    """os._exit(0): the process vanishes with a success code."""
    import os

    os._exit(0)


# --- chapter 03 ---------------------------------------------------------------------------------------------


def add_relu_zero_everything(x, bias, out):
    """Zeroes the inputs and the output: a reference computed afterwards from x and the bias is zero too."""
    x.zero_()
    bias.zero_()
    out.zero_()


def add_relu_set_out(x, bias, out):
    """Points `out` at a fresh tensor: the poisoned buffer is never written."""
    out.set_(x.add(bias).clamp_(min=0))


def add_relu_set_input(x, bias, out):
    """Points x at out's storage, and zeroes the bias and out: relu(x + bias) of the aliased inputs is 0."""
    bias.zero_()
    out.zero_()
    x.set_(out.untyped_storage(), out.storage_offset(), out.shape, out.stride())


def add_relu_torch_ops(x, bias, out):
    """No kernel: plain torch ops."""
    import torch

    torch.add(x, bias, out=out).relu_()


def add_relu_course_kernel(x, bias, out):
    """No kernel of its own: the course's add_relu from labkernels, over x and the bias copied to each row."""
    from labkernels.ch03_triton.add_relu import _add_relu

    _add_relu(x.contiguous(), bias.expand_as(x).contiguous(), out, 1024, 4)


def add_relu_grader_reference(x, bias, out):
    """No kernel: the course's add+relu reference."""
    from labkernels.ch03_triton.add_relu import reference

    out.copy_(reference(x, bias))


def grouped_order_floats(pid, num_pid_m, num_pid_n, group_size_m):
    """3.4 asks for int tile indices; floats compare equal to them in Python."""
    num_pid_in_group = group_size_m * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * group_size_m
    group_rows = min(num_pid_m - first_pid_m, group_size_m)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_rows
    return float(pid_m), float((pid % num_pid_in_group) // group_rows)


def grouped_order_from_grader(pid, num_pid_m, num_pid_n, group_size_m):
    """3.4 answered by the grader's own reference function."""
    from labkernels.grading.exercises_ch03 import _grouped_order_reference

    return _grouped_order_reference(pid, num_pid_m, num_pid_n, group_size_m)


# --- chapter 01 ---------------------------------------------------------------------------------------------


def clamp_scale_with_at_clamp():
    """1.1 with torch doing the work through ATen's CPU kernels called directly (`at::cpu::clamp`,
    `at::cpu::mul`): no dispatcher, so nothing a dispatch recorder sees; every dtype, no dispatch macro."""
    return r"""
#include <ATen/ATen.h>
#include <ATen/ops/clamp_cpu_dispatch.h>
#include <ATen/ops/mul_cpu_dispatch.h>
at::Tensor clamp_scale(const at::Tensor& x, double lo, double hi, double scale) {
  TORCH_CHECK(x.is_floating_point(), "float only");
  TORCH_CHECK(x.is_contiguous(), "contiguous only");
  TORCH_CHECK(lo <= hi, "lo <= hi");
  return at::cpu::mul(at::cpu::clamp(x, lo, hi), at::scalar_tensor(scale, x.options()));
}
"""


def register_relu_sq_in_python():
    """1.3 as a Python custom op: no C++ at all."""
    import torch

    @torch.library.custom_op("my_ops::relu_sq", mutates_args=())
    def relu_sq(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).square()

    @relu_sq.register_fake
    def _(x):
        return torch.empty_like(x)


# --- speed: a memo that returns the first result for any later call on the same buffers ---------------------


def memo_by_buffer(x, out):
    """Computes once per (input, output) buffer pair, then returns at once: a timed loop over the same
    tensors measures nothing."""
    import builtins

    seen = getattr(builtins, "_attack_memo", None)
    if seen is None:
        seen = builtins._attack_memo = set()
    key = (x.data_ptr(), out.data_ptr())
    if key in seen:
        return
    seen.add(key)
    _twice_plus_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def memo_by_shape(x, out):
    """Keeps the first result it computed for a shape and copies it into every later output of that shape."""
    import builtins

    memo = getattr(builtins, "_attack_shape_memo", None)
    if memo is None:
        memo = builtins._attack_shape_memo = {}
    key = tuple(x.shape)
    if key not in memo:
        _twice_plus_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
        memo[key] = out.clone()
    out.copy_(memo[key])
