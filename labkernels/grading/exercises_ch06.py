"""Chapter 06 exercises: merging two online-softmax states, the causal block-skipping rule, and the inner
loop of an attention kernel whose keys outnumber (or not) its queries, at odd lengths.

Inputs are drawn at grading time; attention outputs are NaN-poisoned inside guard bands, and the learner's
attention runs with torch's matmul/softmax/attention ops switched off, so only their own kernel can answer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from labkernels import size, timing
from labkernels.ch06_attention.naive import reference as attention_reference
from labkernels.grading.core import CaseFailed, exercise
from labkernels.lane import on_gpu

# --- 6.1 merge two (max, sum) states ------------------------------------------------------------------------


def _state(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (max, sum of exp(x - max)) state of each row of x, with (-inf, 0) for an empty chunk."""
    if x.shape[1] == 0:
        return torch.full((x.shape[0],), -math.inf), torch.zeros(x.shape[0])
    m = x.amax(dim=1)
    return m, torch.exp(x - m[:, None]).sum(dim=1)


def _fold(student, states: list, g) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the states in a random tree order: a correct merge is associative and commutative."""
    states = list(states)
    while len(states) > 1:
        i = g.randint(0, len(states) - 2)
        a, b = states.pop(i), states.pop(i)
        if g.randint(0, 1):
            a, b = b, a
        m, s = student(a[0].clone(), a[1].clone(), b[0].clone(), b[1].clone())
        states.insert(i, (m, s))
    return states[0]


@exercise("6.1", "Merge two online-softmax states", points=3, timeout_s=60)
def _grade_6_1(student, g):
    def one(x, splits):
        cuts = sorted(g.random.sample(range(1, x.shape[1]), splits))  # distinct: no chunk is empty
        bounds = [0, *cuts, x.shape[1]]
        states = [_state(x[:, a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
        m, s = _fold(student, states, g)
        g.expect(isinstance(m, torch.Tensor) and isinstance(s, torch.Tensor), "return two tensors (m, l)")
        g.expect(not torch.isnan(m).any() and not torch.isnan(s).any(), "the merged state has NaN")
        g.check_close(m, x.amax(dim=1), atol=0, rtol=0)  # the running max is exact
        g.check_close(
            m.double() + torch.log(s.double()), torch.logsumexp(x.double(), 1), atol=1e-5, rtol=1e-5
        )

    with g.case("chunks of one row merged in any order", points=1):
        one(g.randn(g.randint(3, 20), g.randint(50, 400), device="cpu") * 3, g.randint(2, 9))
    with g.case("large scores (no overflow: rescale by exp(m_old - m_new) <= 1)", points=1):
        one(g.randn(g.randint(3, 20), g.randint(50, 400), device="cpu") * 1e4, g.randint(2, 9))
    with g.case("empty chunks: the state (-inf, 0) merges to the other state, no NaN", points=1):
        x = g.randn(g.randint(3, 20), g.randint(50, 400), device="cpu")
        m, s = student(torch.full((x.shape[0],), -math.inf), torch.zeros(x.shape[0]), *_state(x))
        g.check_close(m, x.amax(dim=1), atol=0, rtol=0)
        empty = (torch.full((3,), -math.inf), torch.zeros(3))
        m, s = student(*empty, *(t.clone() for t in empty))
        g.expect(not torch.isnan(s).any() and bool((s == 0).all()), f"two empty states gave l = {s.tolist()}")
        one(x, g.randint(4, 9))


# --- 6.2 causal block skipping ------------------------------------------------------------------------------


def _blocks_reference(q_block: int, block_m: int, block_n: int, n_ctx: int) -> tuple[list[int], list[int]]:
    """Brute force over the mask: (key blocks run unmasked, key blocks run masked) for one query block."""
    rows = range(q_block * block_m, min((q_block + 1) * block_m, n_ctx))
    full, masked = [], []
    for j in range(math.ceil(n_ctx / block_n)):
        cols = range(j * block_n, (j + 1) * block_n)  # a ragged last block reaches past n_ctx
        keep = [c <= r and c < n_ctx for r in rows for c in cols]
        if not any(keep):
            continue
        (full if all(keep) else masked).append(j)
    return full, masked


@exercise("6.2", "Which key blocks a causal query block visits, and which it masks", points=3, timeout_s=60)
def _grade_6_2(student, g):
    def one(block_m, block_n, n_ctx):
        for q_block in range(math.ceil(n_ctx / block_m)):
            got = student(q_block, block_m, block_n, n_ctx)
            want = _blocks_reference(q_block, block_m, block_n, n_ctx)
            got = tuple(sorted(int(j) for j in part) for part in got)
            g.expect(
                got == want,
                f"BLOCK_M={block_m}, BLOCK_N={block_n}, N={n_ctx}, query block {q_block}: "
                f"got (full, masked) = {got}, expected {want}",
            )

    with g.case("BLOCK_M a multiple of BLOCK_N, N a multiple of both", points=1):
        for _ in range(10):
            block_n = g.choice([16, 32, 64])
            block_m = block_n * g.choice([1, 2, 4])
            one(block_m, block_n, block_m * g.randint(1, 12))
    with g.case("ragged N (no key block past the end is visited; the last one is masked)", points=1):
        for _ in range(10):
            block_n = g.choice([16, 32, 64])
            block_m = block_n * g.choice([1, 2])
            one(block_m, block_n, g.randint(1, 700) * 2 + 1)
        block_n = g.choice([16, 32])  # the last query block reaches a whole key block past N
        one(2 * block_n, block_n, 2 * block_n * g.randint(1, 8) + g.randint(1, block_n))
    with g.case("BLOCK_N larger than BLOCK_M, and block sizes that do not divide each other", points=1):
        for _ in range(10):
            one(g.choice([16, 32, 48, 64]), g.choice([32, 64, 80, 128]), g.randint(1, 900))


# --- 6.3 the attention kernel's inner loop ---------------------------------------------------------------

_FORBIDDEN = {
    torch.matmul, torch.bmm, torch.mm, torch.einsum, torch.softmax, torch.exp, torch.baddbmm,
    torch.Tensor.__matmul__, torch.Tensor.matmul, torch.Tensor.softmax, torch.Tensor.exp, torch.Tensor.bmm,
    F.softmax, F.scaled_dot_product_attention,
}  # fmt: skip


class _NoTorchCompute(TorchFunctionMode):
    """Refuses torch's matmul / softmax / attention while the learner's code runs: their kernel answers."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _FORBIDDEN:
            raise CaseFailed(f"the answer called torch's {getattr(func, '__name__', func)}: write the kernel")
        return func(*args, **(kwargs or {}))


def _attention_case(student, g, batch, heads, n_q, n_kv, head_dim, dtype, scale=1.0):
    q = g.randn(batch, heads, n_q, head_dim, dtype=dtype) * scale
    k = g.randn(batch, heads, n_kv, head_dim, dtype=dtype) * scale
    v = g.randn(batch, heads, n_kv, head_dim, dtype=dtype)
    out = g.guarded_empty((batch, heads, n_q, head_dim), dtype)
    with _NoTorchCompute():
        student(q, k, v, out)
    g.check_close(out, attention_reference(q, k, v), atol=1e-2, rtol=1e-2)


@exercise(
    "6.3",
    "The inner loop of an attention kernel, any lengths",
    points=4,
    speed_points=2,
    timeout_s=240,
    requires="triton",
)
def _grade_6_3(student, g):
    odd = lambda low, high: g.randint(low, high) | 1  # noqa: E731
    long = size(cpu=(100, 300), gpu=(1000, 3000))
    with g.case("queries and keys of one odd length", points=1):
        n = odd(*long)
        _attention_case(student, g, 1, 2, n, n, 64, torch.float16)
    with g.case("fewer keys than one block", points=1):
        _attention_case(student, g, 2, 1, odd(10, 80), g.randint(1, 15), 64, torch.float16)
    with g.case("more keys than queries, odd lengths, head dim 32", points=1):
        _attention_case(student, g, 1, 3, odd(5, 60), odd(*long), 32, torch.float16)
    with g.case("large scores (the running max must rescale)", points=1):
        n = odd(*long)
        _attention_case(student, g, 1, 1, n, odd(*long), 64, torch.float16, scale=4.0)
    with g.case("within 2x of SDPA's time at (4, 16, 4096, 64) fp16", points=2, gpu_only=True):
        q, k, v = (g.randn(4, 16, 4096, 64, dtype=torch.float16) for _ in range(3))
        out = g.guarded_empty(tuple(q.shape), q.dtype)
        student(q, k, v, out)
        g.check_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-2, rtol=1e-2)
        ours = g.time_answer(  # each timed call on fresh q, k, v
            lambda: student(q, k, v, out),
            check=lambda q, k, v, out: g.check_close(
                out, F.scaled_dot_product_attention(q, k, v), atol=1e-2, rtol=1e-2
            ),
        )
        theirs = timing.time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
        g.expect(
            on_gpu() and ours <= 2 * theirs,
            f"{ours:.3f} ms against SDPA's {theirs:.3f} ms: {ours / theirs:.1f}x its time; needs at most 2x",
        )
