"""Chapter 06 exercises: combine the partial outputs of a split-KV attention, count the bytes a causal forward
asks of memory, find the key blocks of a causal query block when queries and keys differ in length, and write
the dQ kernel of the backward for grouped-query heads and queries and keys of different lengths.

Inputs are drawn at grading time. The dQ kernel's output is NaN-poisoned inside guard bands, and it runs with
torch's matmul/softmax/attention ops switched off and the chapter's kernels forbidden: only the learner's own
kernel can answer.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from labkernels import size, timing
from labkernels.grading.core import CaseFailed, exercise
from labkernels.lane import on_gpu

CHAPTER_KERNELS = ("labkernels.ch06_attention.flash_attention",)

# --- 6.1 combine split-KV partial outputs -------------------------------------------------------------------


def _split_partials(g, scores: torch.Tensor, v: torch.Tensor, bounds: list[int]):
    """Per split of the keys: its normalised output softmax(s_split) v_split and logsumexp; an empty split
    has lse -inf and an output of NaN (undefined)."""
    outs, lses = [], []
    for a, b in zip(bounds, bounds[1:], strict=False):
        if a == b:
            outs.append(torch.full((scores.shape[0], v.shape[1]), math.nan))
            lses.append(torch.full((scores.shape[0],), -math.inf))
            continue
        part = scores[:, a:b].double()
        outs.append((torch.softmax(part, dim=1) @ v[a:b].double()).float())
        lses.append(torch.logsumexp(part, dim=1).float())
    return torch.stack(outs), torch.stack(lses)


@exercise("6.1", "Combine the partial outputs of a split-KV attention", points=3, timeout_s=60)
def _grade_6_1(student, g):
    # student(outs (S, R, D), lses (S, R)) -> (out (R, D), lse (R,)), float32
    def one(rows, keys, head_dim, splits, scale=1.0, empty=0, dead_rows=()):
        scores = g.randn(rows, keys, device="cpu") * scale
        v = g.randn(keys, head_dim, device="cpu")
        cuts = sorted(g.randint(0, keys) for _ in range(splits - 1 - empty))
        bounds = [0, *cuts, keys]
        for _ in range(empty):  # an empty split somewhere
            at = g.randint(0, len(bounds) - 1)
            bounds.insert(at, bounds[at])
        outs, lses = _split_partials(g, scores, v, bounds)
        want_out = torch.softmax(scores.double(), dim=1) @ v.double()
        want_lse = torch.logsumexp(scores.double(), dim=1)
        for r in dead_rows:  # a row that no split saw (every key masked): out 0, lse -inf
            outs[:, r], lses[:, r] = math.nan, -math.inf
            want_out[r], want_lse[r] = 0.0, -math.inf
        perm = torch.randperm(outs.shape[0], generator=torch.Generator().manual_seed(g.randint(0, 10**6)))
        out, lse = student(outs[perm].clone(), lses[perm].clone())
        g.expect(isinstance(out, torch.Tensor) and isinstance(lse, torch.Tensor), "return two tensors")
        g.expect(not torch.isnan(out).any(), "the combined output has NaN")
        # the lses are float32: exp(lse_s - lse) carries their rounding, about 1e-7 of |lse|
        finite = want_lse[torch.isfinite(want_lse)]
        g.check_close(out.double(), want_out, atol=1e-5 + 1e-6 * finite.abs().max().item(), rtol=1e-5)
        g.check_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)

    with g.case("splits of one row of keys, in any order", points=1):
        one(g.randint(3, 20), g.randint(50, 400), g.choice([16, 64]), g.randint(2, 9))
    with g.case("large scores (weights exp(lse_s - lse) <= 1: no overflow)", points=1):
        one(g.randint(3, 20), g.randint(50, 400), 32, g.randint(2, 9), scale=1e3)
    with g.case("empty splits (lse -inf, output NaN) and rows no split saw", points=1):
        rows = g.randint(4, 20)
        one(rows, g.randint(50, 400), 32, g.randint(4, 9), empty=2, dead_rows=(0, rows - 1))


# --- 6.2 the bytes of a causal forward ----------------------------------------------------------------------


def _forward_bytes(batch, heads, n_ctx, head_dim, element_size, block_m, block_n, causal) -> int:
    """Q read and O written once, the fp32 logsumexp written, and per query block the K and V rows of every
    key block it visits (rows past N are masked: they move nothing)."""
    kv_rows = 0
    for q_block in range(-(-n_ctx // block_m)):
        last_row = min((q_block + 1) * block_m, n_ctx) - 1
        visited = -(-(last_row + 1) // block_n) * block_n if causal else n_ctx
        kv_rows += min(visited, n_ctx)
    per_head = 2 * n_ctx * head_dim * element_size + 4 * n_ctx + 2 * kv_rows * head_dim * element_size
    return batch * heads * per_head


@exercise("6.2", "The bytes a causal forward asks of memory", points=3, timeout_s=60, forbids=CHAPTER_KERNELS)
def _grade_6_2(student, g):
    # student(batch, heads, n_ctx, head_dim, element_size, block_m, block_n, causal) -> bytes (int)
    def one(causal, dividing, ragged):
        for _ in range(10):
            block_n = g.choice([16, 32, 64, 128])
            block_m = block_n * g.choice([1, 2, 4]) if dividing else g.choice([48, 64, 96, 128, 192])
            n_ctx = block_m * g.randint(1, 64) + (g.randint(1, block_m - 1) if ragged else 0)
            args = (g.randint(1, 8), g.randint(1, 32), n_ctx, g.choice([32, 64, 128]), g.choice([2, 4]),
                    block_m, block_n, causal)  # fmt: skip
            got, want = student(*args), _forward_bytes(*args)
            g.expect(got == want, f"(B, H, N, D, bytes, BLOCK_M, BLOCK_N, causal) {args}: {got}, not {want}")

    with g.case("not causal: K and V once per query block", points=1):
        one(causal=False, dividing=True, ragged=g.randint(0, 1) == 1)
    with g.case("causal, BLOCK_M a multiple of BLOCK_N, N a multiple of BLOCK_M", points=1):
        one(causal=True, dividing=True, ragged=False)
    with g.case("causal, ragged N and block sizes that do not divide each other", points=1):
        one(causal=True, dividing=False, ragged=True)


# --- 6.3 causal blocks, queries and keys of different lengths -----------------------------------------------


def _blocks_reference(q_block, block_m, block_n, n_q, n_k) -> tuple[list[int], list[int]]:
    """Brute force over the mask aligned at the bottom right: row r sees key c when c <= r + n_k - n_q."""
    rows = range(q_block * block_m, min((q_block + 1) * block_m, n_q))
    full, masked = [], []
    for j in range(math.ceil(n_k / block_n)):
        cols = range(j * block_n, (j + 1) * block_n)  # a ragged last block reaches past n_k
        keep = [c <= r + n_k - n_q and c < n_k for r in rows for c in cols]
        if not any(keep):
            continue
        (full if all(keep) else masked).append(j)
    return full, masked


@exercise("6.3", "Causal key blocks when queries and keys differ in length", points=3, timeout_s=60)
def _grade_6_3(student, g):
    # student(q_block, block_m, block_n, n_q, n_k) -> (full, masked): lists of key-block indices
    def one(block_m, block_n, n_q, n_k):
        for q_block in range(math.ceil(n_q / block_m)):
            got = student(q_block, block_m, block_n, n_q, n_k)
            want = _blocks_reference(q_block, block_m, block_n, n_q, n_k)
            got = tuple(sorted(int(j) for j in part) for part in got)
            g.expect(
                got == want,
                f"BLOCK_M={block_m}, BLOCK_N={block_n}, n_q={n_q}, n_k={n_k}, query block {q_block}: "
                f"got (full, masked) = {got}, expected {want}",
            )

    blocks = lambda: (g.choice([16, 32, 48, 64]), g.choice([16, 32, 64, 80]))  # noqa: E731
    with g.case("as many queries as keys, ragged lengths", points=1):
        for _ in range(8):
            n = g.randint(1, 700)
            one(*blocks(), n, n)
    with g.case("more keys than queries (the queries are the last rows)", points=1):
        for _ in range(8):
            n_q = g.randint(1, 300)
            one(*blocks(), n_q, n_q + g.randint(1, 700))
    with g.case("more queries than keys (the first rows see no key at all)", points=1):
        for _ in range(8):
            n_k = g.randint(1, 300)
            one(*blocks(), n_k + g.randint(1, 700), n_k)


# --- 6.4 the dQ kernel --------------------------------------------------------------------------------------

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


def _visible(n_q: int, n_k: int, causal: bool, device) -> torch.Tensor:
    """(n_q, n_k) bool: which keys each query row sees; causal is aligned at the bottom right as in 6.3 (row r
    sees key c when c <= r + n_k - n_q), so with n_q > n_k the first rows see no key."""
    keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    return keep.tril(diagonal=n_k - n_q) if causal else keep


def _per_query_head(t: torch.Tensor, q_heads: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (B, Hq, N, D): query head h reads kv head h // (Hq / Hkv)."""
    return t.repeat_interleave(q_heads // t.shape[1], dim=1)


def _attention_gqa(q, k, v, causal):
    """float64 attention with grouped-query heads and queries and keys of different lengths: (O, lse). A row
    that sees no key has O = 0 and lse = -inf (its gradient is 0)."""
    k, v = _per_query_head(k, q.shape[1]), _per_query_head(v, q.shape[1])
    keep = _visible(q.shape[-2], k.shape[-2], causal, q.device)
    seen = keep.any(dim=-1, keepdim=True)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~keep, -math.inf).masked_fill(~seen, 0.0)  # a dead row: finite, then zeroed
    o = (torch.softmax(scores, dim=-1) * seen) @ v
    return o, torch.logsumexp(scores, dim=-1).masked_fill(~seen.squeeze(-1), -math.inf)


def _dq_from_formula(q, k, v, do, lse, delta, causal):
    """(dQ, the largest |dS| of each row, scale * |dS| |K|): dQ = scale * dS K with dS = P * (dO V^T - D) and
    P = exp(scale * Q K^T - lse), in float64, for any inputs. The last is what rounding dS to 16 bits (as a
    kernel does before its second tl.dot) can cost: at most half an ulp of each term."""
    q, k, v, do, lse, delta = (t.double() for t in (q, k, v, do, lse, delta))
    k, v = _per_query_head(k, q.shape[1]), _per_query_head(v, q.shape[1])
    scale = q.shape[-1] ** -0.5
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
    p = p.masked_fill(~_visible(q.shape[-2], k.shape[-2], causal, q.device), 0.0)
    ds = p * (do @ v.transpose(-2, -1) - delta[..., None])
    return scale * ds @ k, ds.abs().amax(-1), scale * ds.abs() @ k.abs()


DQ_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-2, 2e-2)}


def _float16_dq_problem(q, k, v, do, lse, delta, dq, causal) -> str | None:
    """None if a float16 dQ is right for any inputs (the speed case's timed repetitions), else why not.

    Those repetitions run on fresh randn inputs, lse included, so P is not a softmax: dS reaches thousands,
    and a float16 kernel (the chapter's too) rounds it to 16 bits before dS K. Where its terms cancel, that
    rounding is most of dQ's error (0.2% of values failed a plain 2e-2 on the H200), so the bound includes
    it: an ulp of float16 on each term. Rows where some dS passes float16's range (65504; inf there), and
    values past it, are not checked: under 1 in 1000, and at least 90% must be."""
    want, ds_max, terms = _dq_from_formula(q, k, v, do, lse, delta, causal)
    fits = (want.abs() < 6e4) & (ds_max < 6e4)[..., None]
    if not bool(fits.double().mean() > 0.9):
        return "fresh inputs left fewer than 90% of dQ checkable"
    err = (dq.double() - want).abs()
    bad = (err > 2e-2 + 2e-2 * want.abs() + 1e-3 * terms) & fits
    if bool(bad.any()):
        return (
            f"dQ wrong at {int(bad.sum())} of {int(fits.sum())} values (greatest error "
            f"{err[fits].max().item():.3g}; allowed 2e-2 + 2e-2 |dQ| + 1e-3 scale |dS| |K|)"
        )
    return None


def _dq_case(student, g, batch, kv_heads, group, n_q, n_k, head_dim, causal, scale=1.0):
    """Fresh (B, Hq, n_q, D) q, do and (B, Hkv, n_k, D) k, v; dQ against float64 autograd."""
    dtype, q_heads = size(cpu=torch.float32, gpu=torch.float16), kv_heads * group
    q, do = (g.randn(batch, q_heads, n_q, head_dim, dtype=dtype) * s for s in (scale, 1))
    k, v = (g.randn(batch, kv_heads, n_k, head_dim, dtype=dtype) * s for s in (scale, 1))
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    o, lse = _attention_gqa(*exact, causal)
    with warnings.catch_warnings():  # on the GPU autograd's device thread warns that it set a CUDA context
        warnings.filterwarnings("ignore", message="Attempting to run cuBLAS")
        (want,) = torch.autograd.grad(o, exact[0], do.double())
    delta = (do.double() * o.detach()).sum(-1).float()
    dq = g.guarded_empty(tuple(q.shape), dtype)
    with _NoTorchCompute():
        student(q, k, v, do, lse.detach().float(), delta, dq, causal)
    atol, rtol = DQ_TOL[dtype]
    try:
        g.check_close(dq, want, atol=atol * max(1.0, want.abs().max().item()), rtol=rtol)
    except CaseFailed as e:
        shape = f"B={batch}, Hq={q_heads}, Hkv={kv_heads}, n_q={n_q}, n_k={n_k}, D={head_dim}"
        raise CaseFailed(f"{shape}, causal={causal}: {e}") from None


def _prime(g, low: int, high: int) -> int:
    """A random prime in [low, high] (an odd length no block size divides)."""
    primes = [n for n in range(max(low, 2), high + 1) if all(n % d for d in range(2, math.isqrt(n) + 1))]
    return g.choice(primes)


@exercise(
    "6.4",
    "A Triton kernel for dQ",
    points=5,
    speed_points=2,
    timeout_s=300,
    requires="triton",
    forbids=CHAPTER_KERNELS,
)
def _grade_6_4(student, g):
    # student(q, k, v, do, lse, delta, dq, causal): contiguous q, do, dq (B, Hq, n_q, D) and k, v
    # (B, Hkv, n_k, D), Hq a multiple of Hkv; fp32 (B, Hq, n_q) lse (natural log, of the scaled scores; -inf
    # for a row that sees no key) and delta = rowsum(dO * O); writes dQ into dq. sm_scale = 1/sqrt(D). Causal
    # is aligned at the bottom right (6.3): row r sees key c when c <= r + n_k - n_q.
    short, long = (3, 31), size(cpu=(37, 131), gpu=(500, 3001))  # every short length below every long one
    dims = lambda: g.choice([32, 64, 128])  # noqa: E731
    with g.case("not causal, n_q != n_k (odd primes), one kv head per query head", points=1):
        lengths = g.choice([(short, long), (long, short), (long, long)])
        n_q, n_k = _prime(g, *lengths[0]), _prime(g, *lengths[1])
        _dq_case(student, g, 2, 1, 1, n_q, n_k + 2 * (n_k == n_q), 64, causal=False)
    with g.case("causal at the bottom right: more keys than queries, and more queries than keys", points=2):
        _dq_case(student, g, 1, 2, 1, _prime(g, *short), _prime(g, *long), dims(), causal=True)
        # the first n_q - n_k rows see no key: lse -inf, dQ 0
        _dq_case(student, g, 1, 1, 2, _prime(g, *long), _prime(g, *short), dims(), causal=True)
    with g.case("grouped-query heads (2 and 4 query heads per kv head), multi-query (one kv head)", points=1):
        for kv_heads, group in ((2, 2), (2, 4), (1, g.choice([3, 5, 8]))):
            n_q, n_k = _prime(g, *long), _prime(g, *long)
            _dq_case(student, g, 1, kv_heads, group, n_q, n_k, dims(), causal=g.choice([False, True]))
    with g.case("large scores; lengths shorter than a block", points=1):
        _dq_case(student, g, 1, 1, 2, _prime(g, *long), _prime(g, *long), dims(), True, scale=3.0)
        _dq_case(student, g, 1, 2, 2, _prime(g, *short), _prime(g, *short), dims(), g.choice([False, True]))
    with g.case("at least 0.7x the speed of the chapter's dQ kernel, (4, 16, 4096, 64) fp16, n_q = n_k",
                points=2, gpu_only=True):  # fmt: skip
        from labkernels.ch06_attention import flash_attention as fa

        q, k, v, do = (g.randn(4, 16, 4096, 64, dtype=torch.float16) for _ in range(4))
        lse = g.randn(4, 16, 4096) + 8.0  # any inputs: the formula is checked as it stands
        delta = g.randn(4, 16, 4096)
        dq = g.guarded_empty(tuple(q.shape), q.dtype)

        def check(q, k, v, do, lse, delta, dq, causal):
            problem = _float16_dq_problem(q, k, v, do, lse, delta, dq, causal)
            g.expect(problem is None, problem or "")

        ours = g.time_answer(lambda: student(q, k, v, do, lse, delta, dq, False), check=check)
        cfg = fa.bwd_config(q, False)[1]
        lse2, chapter_dq = (lse * fa.LOG2E).contiguous(), torch.empty_like(q)
        theirs = timing.time_ms(
            lambda: fa._bwd_launch(
                fa._attn_bwd_dq_kernel, q, k, v, do, lse2, delta, (chapter_dq,), 0.125, False, cfg
            )  # fmt: skip
        )
        g.expect(
            on_gpu() and theirs / ours >= 0.7,
            f"{ours:.3f} ms, the chapter's {theirs:.3f} ms: {theirs / ours:.2f}x its speed, needs 0.7x",
        )
