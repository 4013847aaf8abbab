"""Submissions for the test exercise T.1: one right answer and every way of getting it wrong."""

import triton
import triton.language as tl

BLOCK = 128
_cache = {}


@triton.jit
def _twice_plus_one_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.jit
def _unmasked_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n, other=0.0) + 1)  # store has no mask


def correct(x, out):
    _twice_plus_one_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def raises(x, out):
    raise RuntimeError("something went wrong in my kernel")


def hangs(x, out):
    while True:
        pass


def wrong_answer(x, out):
    out.copy_(2 * x)


def partial_write(x, out):
    half = x.numel() // 2
    out[:half] = 2 * x[:half] + 1


def out_of_bounds(x, out):
    _unmasked_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)


def stale_cache(x, out):
    if "answer" not in _cache:
        _cache["answer"] = (2 * x + 1).clone()
    answer = _cache["answer"]
    k = min(answer.numel(), out.numel())
    out[:k] = answer[:k]


def crashes(x, out):
    import os

    os.abort()


EARLIER_RESULT = None  # replaced by a tensor in the test: the grader must not ship it


def returns_earlier_result(x, out):
    out.copy_(EARLIER_RESULT)
