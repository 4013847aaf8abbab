"""Exercise 4.5 (split-K's fixed-order reduction as a Triton kernel): the grader passes a right kernel and
refuses an answer that adds in another order, one that writes past C, and one that launches no kernel."""

import os
import sys
from pathlib import Path

import pytest

import labkernels  # first: it picks the lane before triton is imported

# isort: split
import triton
import triton.language as tl

from labkernels.grading import format_record, grade

ROOT = Path(__file__).resolve().parent.parent
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(Path(__file__).parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
)
sys.path.insert(0, str(Path(__file__).parent))


@triton.jit
def _reduce_kernel(partials_ptr, c_ptr, n_elements, n_splits, BLOCK: tl.constexpr, REVERSED: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(n_splits):
        s = n_splits - 1 - i if REVERSED else i
        total += tl.load(partials_ptr + s * n_elements + offs, mask=mask, other=0.0)
    tl.store(c_ptr + offs, total.to(c_ptr.dtype.element_ty), mask=mask)


def in_order(partials, c):
    """Right: s = 0, 1, ... in order (0 + p0 is p0 exactly); the solution's blocks (gpu_jobs/ch04_issue43.sh
    times it on the H200)."""
    n = c.numel()
    block = 2048 if labkernels.on_gpu() else 4096
    _reduce_kernel[(triton.cdiv(n, block),)](partials, c, n, partials.shape[0], BLOCK=block, REVERSED=False,
                                             num_warps=8)  # fmt: skip


def reversed_order(partials, c):
    """The right sum in the wrong order: equal within rounding, not bitwise."""
    n = c.numel()
    _reduce_kernel[(triton.cdiv(n, 4096),)](partials, c, n, partials.shape[0], BLOCK=4096, REVERSED=True)


def unmasked_tail(partials, c):
    """Stores a whole block past the end of C: the guard band catches it."""
    n = c.numel()
    _reduce_kernel[(triton.cdiv(n, 4096),)](partials, c, triton.cdiv(n, 4096) * 4096, partials.shape[0],
                                            BLOCK=4096, REVERSED=False)  # fmt: skip


def torch_sum(partials, c):
    """No kernel: torch adds (in its own order) and copies."""
    c.copy_(partials.sum(0))


def test_exercise_4_5_passes_a_right_kernel():
    rec = grade("4.5", in_order)
    assert rec["earned"] == rec["possible"] == 4, format_record(rec)


@pytest.mark.parametrize(
    "answer, most, reason",
    [
        (reversed_order, 2, "added in order"),  # one split, and fp16 where the cast hides the order
        (unmasked_tail, 0, "wrote outside the output"),
        (torch_sum, 0, "aten::sum"),
    ],
)
def test_exercise_4_5_refuses_wrong_order_bad_writes_and_no_kernel(answer, most, reason):
    rec = grade("4.5", answer)
    text = format_record(rec)
    assert rec["earned"] <= most and reason in text, text


def no_tap_anywhere(n, p, q, r, s, c, height, width, channels, stride, padding):
    """Wrong everywhere: every case fails on its first example, which its message shows."""
    return -2


def test_exercise_4_3_cases_show_the_shapes_their_titles_name():
    """Before, the case titled "padding" could show an example with padding=0, and the case titled "stride 2
    and 3" one with stride=1: their shapes drew padding from 0 and stride from 1."""
    for _ in range(4):
        reasons = {c["case"]: c["reason"] for c in grade("4.3", no_tap_anywhere)["cases"]}
        padded = reasons["padding: taps outside the image read nothing (-1)"]
        strided = reasons["stride 2 and 3 with padding"]
        assert "padding=" in padded and "padding=0" not in padded, padded
        assert "stride=1 " in padded  # the padding case keeps stride 1
        assert "padding=0" not in strided and "stride=1 " not in strided, strided
