"""FlashAttention forward: softmax(Q K^T * scale) V without the N x N scores ever reaching HBM.

A program owns BLOCK_M query rows of one (batch, head). It loads its Q block once, then streams K and V in
blocks of BLOCK_N keys: S = Q K^T (a `tl.dot`, fp32 accumulator), the online softmax's running max m and sum
l updated (exp2, with scale * log2(e) folded into one multiply), the accumulator rescaled and P V added. At
the end O = acc / l. Memory O(N): the scores never exist. Traffic per (batch, head): Q and O once, K and V
once per query block (`forward_hbm_bytes`: Theta(N^2 D / BLOCK_M), as the FlashAttention paper's
Theta(N^2 d^2 / M) for SRAM size M); L2 serves most of the re-reads, so DRAM sees near the ideal, each tensor
once (`traffic.attention`). FLOPs 4 N^2 D, half that when causal.
Causal: key blocks entirely above the diagonal are skipped; blocks entirely below it run unmasked; only the
blocks crossing the diagonal are masked (a two-stage loop). Any N: the ragged last block is masked.
The kernel a user calls: q and k/v of different lengths (the causal diagonal at the bottom right), grouped-
and multi-query heads, any head dim up to 256 (padded to a power of two, masked).
Also returned: the logsumexp of each row's scaled scores, (B, H, N) fp32, which the backward uses to recompute
P block by block (two kernels: one for dK and dV per key block, one for dQ per query block, where
FlashAttention-2 has one kernel that adds dQ with atomics; each masks only the diagonal and ragged blocks, and
their block shapes are timed per shape class).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from labkernels.ch06_attention.naive import naive_attention, reference  # noqa: F401  (one reference per op)
from labkernels.lane import LANE, on_gpu, require_device

MAX_HEAD_DIM = 256  # any D up to it; one that is not a power of two runs padded to the next (masked loads)
GPU_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.float32)  # the interpreter's bfloat16 is broken
LOG2E = 1.4426950408889634
TUNE_FROM = 1 << 16  # B*H*N query rows from which configs are timed on the GPU (first call per shape class)
CPU_BLOCKS = (64, 64)  # (BLOCK_M, BLOCK_N) under the interpreter: few programs, few loop steps

# (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA): a short list so first-call tuning stays a few seconds. The
# TMA configs need contiguous inputs; the tuning checks each one's result against a pointer config's.
GPU_CONFIGS = [
    (128, 64, 4, 3, False),
    (128, 64, 8, 3, False),
    (128, 128, 8, 3, False),
    (128, 64, 4, 4, False),
    (64, 64, 4, 3, False),
    (128, 128, 8, 2, False),
    (128, 64, 4, 3, True),
    (128, 128, 8, 3, True),
    (128, 64, 8, 4, True),
    (128, 128, 8, 2, True),
]
# Past D = 128 a 128-row fp32 accumulator no longer fits the registers: 64-row blocks, timed instead of the
# list above (each config compiled is seconds of a first call).
LARGE_HEAD_CONFIGS = [
    (64, 64, 8, 2, False),
    (64, 32, 4, 2, False),
    (64, 64, 4, 2, False),
    (64, 32, 8, 3, False),
    (64, 64, 8, 2, True),
]


@triton.jit
def _attn_fwd_inner(
    acc,
    l_i,
    m_i,
    q,  # (BLOCK_M, BLOCK_D), loaded once
    k_src,  # (BLOCK_N, BLOCK_D) pointers to the first key block, or (TMA) a descriptor of all rows of K
    v_src,
    kv_row0,  # TMA: this head's first key row in the (B*Hkv*N_kv, D) view
    stride_kn,
    stride_vn,
    offs_m,  # the program's query rows
    offs_n,  # 0..BLOCK_N
    d_ok,  # (BLOCK_D,) columns that hold the head dim (all of them unless D is padded to a power of two)
    lo,
    hi,  # the key range [lo, hi) this stage visits
    n_kv,
    shift,  # n_kv - n_q: causal row i sees keys j <= i + shift (the diagonal at the bottom right)
    qk_scale,  # sm_scale * log2(e): scores in base 2
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # diagonal or ragged blocks: mask keys past the diagonal and past n_kv
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,  # load K and V blocks with Hopper's TMA unit instead of pointer loads
    NEGATIVE_SCALE: tl.constexpr,  # sm_scale < 0: the largest scaled score comes from the smallest qk
    PAD_D: tl.constexpr,  # D is not a power of two: the columns past it are loaded as zeros
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        load_ok = (cols[:, None] < n_kv) & d_ok[None, :]  # used only where MASKED or PAD_D
        if TMA:  # rows past n_kv are the next head's (masked below) or zeros past the tensor's end
            k = k_src.load([kv_row0 + start_n, 0])  # read K block
        elif MASKED or PAD_D:
            k = tl.load(k_src + start_n * stride_kn, mask=load_ok, other=0.0)  # read K block
        else:
            k = tl.load(k_src + start_n * stride_kn)
        qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) scores: registers only, never HBM
        if MASKED:
            keep = cols[None, :] < n_kv
            if CAUSAL:
                keep = keep & (offs_m[:, None] + shift >= cols[None, :])
            # -inf, not a large negative number: no finite (or NaN) score of a hidden key can get through.
            qk = tl.where(keep, qk * qk_scale, -float("inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            m_sub = tl.where(m_ij == -float("inf"), 0.0, m_ij)  # no key seen yet: no NaN from -inf - -inf
            qk -= m_sub[:, None]
        else:
            # The max of the scaled scores: max(qk) * scale, or min(qk) * scale when the scale is negative.
            if NEGATIVE_SCALE:
                m_ij = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
            else:
                m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_ij
            qk = qk * qk_scale - m_sub[:, None]  # one fma an element
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_sub)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if TMA:
            v = v_src.load([kv_row0 + start_n, 0])  # read V block
        elif MASKED or PAD_D:
            v = tl.load(v_src + start_n * stride_vn, mask=load_ok, other=0.0)  # read V block
        else:
            v = tl.load(v_src + start_n * stride_vn)
        acc = tl.dot(p.to(v.dtype), v, acc)  # P V, accumulated in fp32
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    q_ptr,  # (B, Hq, N_q, D)
    k_ptr,  # (B, Hkv, N_kv, D): query head h reads key/value head h // (Hq / Hkv)
    v_ptr,
    o_ptr,
    lse_ptr,  # (B, Hq, N_q) fp32, contiguous
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    n_heads,
    n_kv_heads,
    n_q,
    n_kv,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two (tl.arange and tl.dot need one)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    TMA: tl.constexpr,  # q_ptr, k_ptr, v_ptr are TMA descriptors of the (rows, D) views
    NEGATIVE_SCALE: tl.constexpr,
):
    # Causal: the last query blocks do the most work, so they start first (less idle tail).
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)  # 64-bit offsets: B*H*N*D may pass 2^31
    h = (pid_bh % n_heads).to(tl.int64)
    h_kv = h // (n_heads // n_kv_heads)  # grouped-query heads share one key/value head
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = offs_m < n_q
    if TMA:
        # int32 rows: the launcher allows TMA only while each view has fewer than 2^31 rows
        kv_row0 = ((pid_bh // n_heads) * n_kv_heads + h_kv.to(tl.int32)) * n_kv
        q = q_ptr.load([pid_bh * n_q + pid_m * BLOCK_M, 0])  # read Q block, once
        k_src = k_ptr
        v_src = v_ptr
    else:
        kv_row0 = 0
        q_ptrs = q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :]
        k_src = k_ptr + b * stride_kb + h_kv * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :]
        v_src = v_ptr + b * stride_vb + h_kv * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # read Q block, once

    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    shift = n_kv - n_q
    if CAUSAL:
        # Keys [0, seen_by_all) are seen by every row of the block (row i sees keys <= i + shift): stage 1
        # runs the whole blocks of them unmasked. Stage 2 masks the rest up to the last row's diagonal.
        # Key blocks past the diagonal are never visited.
        seen_by_all = tl.minimum(tl.maximum(pid_m * BLOCK_M + shift + 1, 0), n_kv)
        unmasked_end = seen_by_all // BLOCK_N * BLOCK_N
        hi = tl.minimum(tl.maximum(pid_m * BLOCK_M + BLOCK_M + shift, 0), n_kv)
    else:
        # Stage 1: all whole key blocks, unmasked. Stage 2: the ragged last block (none if BLOCK_N divides N).
        unmasked_end = n_kv // BLOCK_N * BLOCK_N
        hi = n_kv
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, kv_row0, stride_kn, stride_vn, offs_m, offs_n, d_ok,
        0, unmasked_end, n_kv, shift, qk_scale, BLOCK_N, False, CAUSAL, TMA, NEGATIVE_SCALE,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, kv_row0, stride_kn, stride_vn, offs_m, offs_n, d_ok,
        unmasked_end, hi, n_kv, shift, qk_scale, BLOCK_N, True, CAUSAL, TMA, NEGATIVE_SCALE,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip

    # A row that saw no key (l = 0: causal, n_q > n_kv) gets O = 0 and logsumexp -inf, not 0 / 0.
    seen = l_i > 0.0
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453  # base 2 back to natural log
    lse = tl.where(seen, lse, -float("inf"))
    tl.store(lse_ptr + pid_bh.to(tl.int64) * n_q + offs_m, lse, mask=row_ok)
    o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, acc.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])  # write O block


def forward_hbm_bytes(batch, heads, n_ctx, head_dim, dtype, block_m: int, causal: bool = False) -> int:
    """The bytes the forward asks of memory: Q read and O written once, the logsumexp written (fp32), and
    every K and V row read once per query block that visits it (all N rows; causal: the rows up to the end
    of the query block's diagonal, BLOCK_M a multiple of BLOCK_N)."""
    size = torch.empty(0, dtype=dtype).element_size()
    q_blocks = -(-n_ctx // block_m)
    if causal:
        kv_rows = sum(min((i + 1) * block_m, n_ctx) for i in range(q_blocks))
    else:
        kv_rows = q_blocks * n_ctx
    per_head = 2 * n_ctx * head_dim * size + 4 * n_ctx + 2 * kv_rows * head_dim * size
    return batch * heads * per_head


def _block_d(head_dim: int) -> int:
    """The head dim rounded up to a power of two of at least 16 (tl.arange's and tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(head_dim))


def _descriptors(q, k, v, block_m: int, block_n: int):
    """TMA descriptors of contiguous (B, H, N, D) tensors seen as (B*H*N, D): Q in BLOCK_M rows, K and V in
    BLOCK_N rows."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    head_dim = q.shape[-1]
    blocks = (block_m, block_n, block_n)
    return tuple(
        TensorDescriptor(
            t.view(-1, head_dim), [t.numel() // head_dim, head_dim], [head_dim, 1], [block, head_dim]
        )
        for t, block in zip((q, k, v), blocks, strict=True)
    )


def _tma_ok(q, k, v) -> bool:
    """TMA here needs contiguous inputs (one 2-D view per tensor), a head dim that is a power of two (a block
    is all of it) and row indices that fit int32."""
    head_dim = q.shape[-1]
    return (
        head_dim == _block_d(head_dim)
        and all(t.is_contiguous() for t in (q, k, v))
        and max(q.numel(), k.numel()) // head_dim < 2**31
    )


def _launch(q, k, v, o, lse, sm_scale: float, causal: bool, cfg: tuple) -> None:
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_kv = k.shape[1], k.shape[2]
    block_m, block_n, warps, stages, tma = cfg
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    sources = _descriptors(q, k, v, block_m, block_n) if tma else (q, k, v)
    _attn_fwd_kernel[grid](
        *sources, o, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        heads, kv_heads, n_q, n_kv, sm_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        TMA=tma, NEGATIVE_SCALE=sm_scale < 0, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _fits(cfg, head_dim: int, element_size: int) -> bool:
    """Shared memory estimate: Q once, K and V per pipeline stage (H200: 227 KB per block); and an fp32
    accumulator of at most 128 registers a thread (past D = 128, only 64-row blocks)."""
    block_m, block_n, warps, stages, _ = cfg
    block_d = _block_d(head_dim)
    smem = (block_m * block_d + 2 * stages * block_n * block_d) * element_size
    registers = block_m * block_d // (32 * warps)
    return smem <= 200 * 1024 and registers <= 128 and not (block_d <= 32 and block_n > 64)


def _bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median"))


@functools.lru_cache(maxsize=256)
def _tuned(heads: int, kv_heads: int, n_q: int, n_kv: int, head_dim: int, dtype, causal: bool, tma: bool):
    """The fastest config for a shape class, timed once on the GPU on fresh inputs of that class. A TMA config
    counts only if its output matches the first pointer config's."""
    q = torch.randn(1, heads, n_q, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(1, kv_heads, n_kv, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = torch.empty_like(q), torch.empty(1, heads, n_q, device="cuda")
    times, errors, expected = {}, [], None
    for cfg in GPU_CONFIGS if head_dim <= 128 else LARGE_HEAD_CONFIGS:
        if not _fits(cfg, head_dim, q.element_size()) or (cfg[4] and not tma):
            continue
        try:
            o.fill_(float("nan"))
            ms = _bench_ms(lambda cfg=cfg: _launch(q, k, v, o, lse, 0.125, causal, cfg))
        except Exception as e:  # noqa: BLE001  (out of resources, or a config this triton cannot compile)
            errors.append(f"{cfg}: {type(e).__name__}")
            continue
        if expected is None and not cfg[4]:
            expected = o.clone()
        if cfg[4] and (expected is None or not torch.allclose(o, expected, atol=2e-2, rtol=0)):
            errors.append(f"{cfg}: wrong result")
            continue
        times[cfg] = ms
    if not times:
        raise RuntimeError(f"flash_attention: no config compiled for head dim {head_dim}, {dtype}: {errors}")
    return min(times, key=times.get)


def _bucket(n: int) -> int:
    return max(128, triton.next_power_of_2(n))


def config(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages, TMA) that flash_attention launches for these inputs."""
    if LANE != "gpu":
        return (*CPU_BLOCKS, 4, 1, False)
    batch, heads, n_q, head_dim = q.shape
    if batch * heads * n_q < TUNE_FROM:  # too small to fill the GPU: a fixed config, no tuning cost
        return (
            GPU_CONFIGS[0] if head_dim <= 64 else GPU_CONFIGS[1] if head_dim <= 128 else LARGE_HEAD_CONFIGS[0]
        )
    # Tuned per power-of-two length of q and of k (heads capped at 64): one tuning run per shape class.
    group = heads // k.shape[1]
    kv_heads = max(1, min(batch * heads, 64) // group)
    n_q, n_kv = _bucket(n_q), _bucket(k.shape[2])
    return _tuned(kv_heads * group, kv_heads, n_q, n_kv, head_dim, q.dtype, causal, _tma_ok(q, k, v))


def _check(q, k, v) -> None:
    dtypes = GPU_DTYPES if on_gpu() else CPU_DTYPES
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_device(t, f"flash_attention: {name}")
        if t.dim() != 4:
            raise ValueError(f"flash_attention: {name} must be (B, H, N, D), got shape {tuple(t.shape)}")
        if t.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise TypeError(f"flash_attention: {name} has dtype {t.dtype}; this lane supports {names}")
        if t.stride(-1) != 1:
            raise ValueError(f"flash_attention: {name}'s last dim must be contiguous (strides {t.stride()})")
        if t.numel() == 0:
            raise ValueError(f"flash_attention: empty input, {name} has shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flash_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if k.shape != v.shape:
        raise ValueError(f"flash_attention: k and v must have one shape (B, Hkv, N_kv, D), got {shapes}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"flash_attention: q, k and v must share batch and head dim (B and D), got {shapes}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"flash_attention: q's heads must be a multiple of k's and v's (grouped-query), got {shapes}"
        )
    if not 1 <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(
            f"flash_attention: head dim {q.shape[-1]} not supported; supported: 1 to {MAX_HEAD_DIM}"
        )


@triton.jit
def _attn_bwd_delta_kernel(
    o_ptr, do_ptr, delta_ptr, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """delta = rowsum(dO * O) in fp32 per query row of contiguous (B*H*N, D) O and dO: read 2 N D, write N."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows < n_rows)[:, None] & (offs_d < HEAD_DIM)[None, :]
    offs = rows[:, None] * HEAD_DIM + offs_d[None, :]
    o = tl.load(o_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=rows < n_rows)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v, q_ptr, do_ptr, lse2_ptr, delta_ptr, q_head, row0, offs_n, offs_d, lo, hi, n_q, n_kv, shift,
    qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    PAD_D: tl.constexpr,
):  # fmt: skip
    """Query blocks [lo, hi) of one query head against one key block: P^T recomputed from the saved
    logsumexp, then dV += P^T dO and dK += dS^T Q with dS = P * (dP - delta). MASKED blocks (the diagonal,
    the ragged end) load with masks and zero what the causal mask or the end hides; the others run without
    a mask on the rows (the head dim's padding, if any, is always masked)."""
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_offs = q_head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            row_ok = offs_m < n_q
            ok = row_ok[:, None] & d_ok[None, :]
            q = tl.load(q_ptr + q_offs, mask=ok, other=0.0)  # read Q block
            do = tl.load(do_ptr + q_offs, mask=ok, other=0.0)  # read dO block
            lse2 = tl.load(lse2_ptr + row0 + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(delta_ptr + row0 + offs_m, mask=row_ok, other=0.0)
        else:
            if PAD_D:
                q = tl.load(q_ptr + q_offs, mask=d_ok[None, :], other=0.0)
                do = tl.load(do_ptr + q_offs, mask=d_ok[None, :], other=0.0)
            else:
                q = tl.load(q_ptr + q_offs)
                do = tl.load(do_ptr + q_offs)
            lse2 = tl.load(lse2_ptr + row0 + offs_m)
            delta = tl.load(delta_ptr + row0 + offs_m)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])  # P^T, (BLOCK_N, BLOCK_M)
        if MASKED:
            keep = (offs_m[None, :] < n_q) & (offs_n[:, None] < n_kv)
            if CAUSAL:
                keep = keep & (offs_m[None, :] + shift >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)  # also a row that sees no key (logsumexp -inf, p_t = inf there)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        ds_t = p_t * (tl.dot(v, tl.trans(do)) - delta[None, :])  # dS^T = P^T * (dP^T - delta)
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dk_ptr, dv_ptr,  # contiguous; lse2, delta (B, Hq, N_q)
    n_heads, n_kv_heads, n_q, n_kv, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    """One program per block of keys of one key/value head: walks the query blocks that see them, in every
    query head of its group (grouped-query attention: dK and dV are sums over the group). Per query head:
    the blocks on the causal diagonal masked, the whole ones below it unmasked, the ragged last one masked;
    blocks that see none of these keys are skipped. Non-causal: every whole block unmasked, the ragged last
    one masked."""
    pid_n = tl.program_id(0)
    bh_kv = tl.program_id(1).to(tl.int64)
    group = n_heads // n_kv_heads
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (offs_n < n_kv)[:, None] & (offs_d < HEAD_DIM)[None, :]
    kv_offs = bh_kv * n_kv * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_offs, mask=kv_ok, other=0.0)  # read K block, once
    v = tl.load(v_ptr + kv_offs, mask=kv_ok, other=0.0)  # read V block, once
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    shift = n_kv - n_q  # query row i sees keys j <= i + shift
    q_whole = n_q // BLOCK_M * BLOCK_M  # where the ragged last query block starts
    first, full_from = 0, 0
    if CAUSAL:
        first = (
            tl.minimum(tl.maximum(start_n - shift, 0), n_q) // BLOCK_M * BLOCK_M
        )  # the first row that sees a key
        sees_all = tl.minimum(
            tl.maximum(start_n + BLOCK_N - 1 - shift, 0), n_q
        )  # rows from here see them all
        full_from = tl.minimum(tl.cdiv(sees_all, BLOCK_M) * BLOCK_M, n_q)
    b = bh_kv // n_kv_heads
    for g in range(group):
        bh_q = b * n_heads + (bh_kv % n_kv_heads) * group + g
        q_head, row0 = bh_q * n_q * HEAD_DIM, bh_q * n_q
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptr, do_ptr, lse2_ptr, delta_ptr, q_head, row0, offs_n, offs_d,
            first, full_from, n_q, n_kv, shift, qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL,
            BLOCK_D != HEAD_DIM,
        )  # fmt: skip
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptr, do_ptr, lse2_ptr, delta_ptr, q_head, row0, offs_n, offs_d,
            full_from, q_whole, n_q, n_kv, shift, qk_scale, HEAD_DIM, BLOCK_M, False, CAUSAL,
            BLOCK_D != HEAD_DIM,
        )  # fmt: skip
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_ptr, do_ptr, lse2_ptr, delta_ptr, q_head, row0, offs_n, offs_d,
            tl.maximum(full_from, q_whole), n_q, n_q, n_kv, shift, qk_scale, HEAD_DIM, BLOCK_M, True, CAUSAL,
            BLOCK_D != HEAD_DIM,
        )  # fmt: skip
    tl.store(dk_ptr + kv_offs, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_ok)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=kv_ok)


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, lse2, delta, k_ptr, v_ptr, kv_head, offs_m, offs_d, lo, hi, n_q, n_kv, shift, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    PAD_D: tl.constexpr,
):  # fmt: skip
    """Key blocks [lo, hi) against one query block: dQ += dS K, masked as in `_attn_bwd_dkdv_inner`."""
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_offs = kv_head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        if MASKED:
            ok = (offs_n < n_kv)[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_offs, mask=ok, other=0.0)  # read K block
            v = tl.load(v_ptr + kv_offs, mask=ok, other=0.0)  # read V block
        elif PAD_D:
            k = tl.load(k_ptr + kv_offs, mask=d_ok[None, :], other=0.0)
            v = tl.load(v_ptr + kv_offs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptr + kv_offs)
            v = tl.load(v_ptr + kv_offs)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            keep = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_kv)
            if CAUSAL:
                keep = keep & (offs_m[:, None] + shift >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse2_ptr, delta_ptr, dq_ptr,
    n_heads, n_kv_heads, n_q, n_kv, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    """One program per block of queries of one query head: walks the key blocks it sees, in its key/value
    head. Causal: the keys every row sees unmasked, the rest up to the diagonal masked. Non-causal: every
    whole key block unmasked, the ragged last one masked."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    bh_kv = bh // n_heads * n_kv_heads + bh % n_heads // (n_heads // n_kv_heads)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q_offs = bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=ok, other=0.0)  # read Q block, once
    do = tl.load(do_ptr + q_offs, mask=ok, other=0.0)  # read dO block, once
    lse2 = tl.load(lse2_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(delta_ptr + bh * n_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    shift = n_kv - n_q
    if CAUSAL:  # as the forward: keys [0, seen_by_all) are seen by every row of the block
        seen_by_all = tl.minimum(tl.maximum(start_m + shift + 1, 0), n_kv)
        unmasked_end = seen_by_all // BLOCK_N * BLOCK_N
        masked_end = tl.minimum(tl.maximum(start_m + BLOCK_M + shift, 0), n_kv)
    else:
        unmasked_end = n_kv // BLOCK_N * BLOCK_N
        masked_end = n_kv
    kv_head = bh_kv * n_kv * HEAD_DIM
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptr, v_ptr, kv_head, offs_m, offs_d,
        0, unmasked_end, n_q, n_kv, shift, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    dq = _attn_bwd_dq_inner(
        dq, q, do, lse2, delta, k_ptr, v_ptr, kv_head, offs_m, offs_d,
        unmasked_end, masked_end, n_q, n_kv, shift, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL,
        BLOCK_D != HEAD_DIM,
    )  # fmt: skip
    tl.store(dq_ptr + q_offs, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=ok)


# Backward configs, (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel. dK/dV: a program keeps a key block
# and its two fp32 accumulators, and streams small query blocks; dQ the other way round. Any pair of sizes
# is correct (each stage's bounds are computed, not assumed aligned). Timed on the first call of a shape
# class, as the forward; past D = 128 the default pair runs untimed (`_bwd_default`).
BWD_DKDV_CONFIGS = [
    (64, 64, 4, 3),
    (64, 64, 8, 3),
    (32, 64, 4, 3),
    (32, 128, 4, 3),
    (32, 128, 8, 3),
    (64, 128, 8, 3),
]
BWD_DQ_CONFIGS = [
    (64, 64, 4, 3),
    (64, 64, 8, 3),
    (64, 32, 4, 3),
    (128, 32, 4, 3),
    (128, 32, 8, 3),
    (128, 64, 8, 3),
]


def _bwd_default(head_dim: int) -> tuple[tuple, tuple]:
    """The untimed (dK/dV, dQ) configs: small inputs, and the reference the tuned ones are checked against."""
    if LANE != "gpu":
        return (*CPU_BLOCKS, 4, 1), (*CPU_BLOCKS, 4, 1)
    if head_dim > 128:  # two fp32 accumulators of a key block in registers: 32-key blocks past D = 128
        return (32, 32, 8, 2), (64, 32, 8, 2)
    cfg = (64, 64, 4, 3) if head_dim <= 64 else (64, 64, 8, 3)
    return cfg, cfg


def _bwd_launch(kernel, q, k, v, do, lse2, delta, outs, sm_scale, causal, cfg) -> None:
    """One of the two backward kernels over contiguous (B, H, N, D) tensors; outs: (dk, dv) or (dq,)."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_kv = k.shape[1], k.shape[2]
    block_m, block_n, warps, stages = cfg
    if kernel is _attn_bwd_dkdv_kernel:
        grid = (triton.cdiv(n_kv, block_n), batch * kv_heads)
    else:
        grid = (triton.cdiv(n_q, block_m), batch * heads)
    kernel[grid](
        q, k, v, do, lse2, delta, *outs, heads, kv_heads, n_q, n_kv, sm_scale, sm_scale * LOG2E,
        HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Another block shape sums in another order: equal up to a few 16-bit steps of the largest value."""
    return bool((got.float() - want.float()).abs().max() <= 2e-2 * want.float().abs().max() + 1e-3)


def _fastest_bwd(kernel, configs, default, inputs: tuple, causal: bool) -> tuple:
    """The config of `kernel` with the least time on `inputs` (q, k, v, do, lse2, delta), among those whose
    result matches the default config's; the default if none does."""
    q, k = inputs[0], inputs[1]
    sm_scale = q.shape[-1] ** -0.5
    outs = (
        (torch.empty_like(k), torch.empty_like(k))
        if kernel is _attn_bwd_dkdv_kernel
        else (torch.empty_like(q),)
    )
    _bwd_launch(kernel, *inputs, outs, sm_scale, causal, default)
    expected = tuple(t.clone() for t in outs)
    times = {}
    for cfg in configs:
        try:
            for t in outs:
                t.fill_(float("nan"))  # poisoned: a config that leaves rows unwritten fails the comparison
            _bwd_launch(kernel, *inputs, outs, sm_scale, causal, cfg)
            matches = all(_close(got, want) for got, want in zip(outs, expected, strict=True))
            ms = _bench_ms(lambda cfg=cfg: _bwd_launch(kernel, *inputs, outs, sm_scale, causal, cfg))
        except Exception:  # noqa: BLE001  (out of resources, or a config this triton cannot compile)
            continue
        if matches:
            times[cfg] = ms
    return min(times, key=times.get) if times else default


@functools.lru_cache(maxsize=256)
def _tuned_bwd(heads: int, kv_heads: int, n_q: int, n_kv: int, head_dim: int, dtype, causal: bool) -> tuple:
    """The fastest (dK/dV, dQ) configs for a shape class, timed on fresh inputs of that class."""
    q, do = (torch.randn(1, heads, n_q, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, n_kv, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = _forward(q, k, v, causal, head_dim**-0.5)
    inputs = (q, k, v, do, (lse * LOG2E).contiguous(), _delta(o, do))
    dkdv_default, dq_default = _bwd_default(head_dim)
    dkdv = _fastest_bwd(_attn_bwd_dkdv_kernel, BWD_DKDV_CONFIGS, dkdv_default, inputs, causal)
    dq = _fastest_bwd(_attn_bwd_dq_kernel, BWD_DQ_CONFIGS, dq_default, inputs, causal)
    return dkdv, dq


def bwd_config(q: torch.Tensor, causal: bool, k: torch.Tensor | None = None) -> tuple[tuple, tuple]:
    """((BLOCK_M, BLOCK_N, num_warps, num_stages) of the dK/dV kernel, the same of the dQ kernel) that the
    backward launches for q (and k: q's shape if not given): fixed for small inputs, timed once per shape
    class on the GPU."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_kv = (heads, n_q) if k is None else (k.shape[1], k.shape[2])
    # Past D = 128 the timed lists spill their accumulators: the default is the config that fits.
    if LANE != "gpu" or batch * heads * n_q < TUNE_FROM or head_dim > 128:
        return _bwd_default(head_dim)
    group = heads // kv_heads
    kv_heads = max(1, min(batch * heads, 64) // group)
    return _tuned_bwd(kv_heads * group, kv_heads, _bucket(n_q), _bucket(n_kv), head_dim, q.dtype, causal)


def _delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """rowsum(dO * O) per query row, fp32 (B, H, N): one read of each, in one kernel."""
    batch, heads, n_ctx, head_dim = o.shape
    delta = torch.empty(batch, heads, n_ctx, device=o.device, dtype=torch.float32)
    n_rows = batch * heads * n_ctx
    block = 64 if LANE == "gpu" else 128
    grid = (triton.cdiv(n_rows, block),)
    _attn_bwd_delta_kernel[grid](  # read 2 N D, write N
        o, do, delta, n_rows, HEAD_DIM=head_dim, BLOCK_D=_block_d(head_dim), BLOCK=block
    )
    return delta


def _backward(q, k, v, o, lse, do, causal: bool, sm_scale: float):
    """dq, dk, dv: delta = rowsum(dO * O), then the dK/dV kernel and the dQ kernel."""
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    delta = _delta(o, do)  # read 2 N D, write N per head
    lse2 = (lse * LOG2E).contiguous()  # the logsumexp in base 2, as the kernels' scores are
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dkdv_cfg, dq_cfg = bwd_config(q, causal, k)
    _bwd_launch(_attn_bwd_dkdv_kernel, q, k, v, do, lse2, delta, (dk, dv), sm_scale, causal, dkdv_cfg)
    _bwd_launch(_attn_bwd_dq_kernel, q, k, v, do, lse2, delta, (dq,), sm_scale, causal, dq_cfg)
    return dq, dk, dv


def _forward(q, k, v, causal: bool, sm_scale: float):
    batch, heads, n_q, _ = q.shape
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(batch, heads, n_q, device=q.device, dtype=torch.float32)
    _launch(q, k, v, o, lse, sm_scale, causal, config(q, k, v, causal))
    return o, lse


# torch.library: the forward and the backward are ops that torch.compile traces without a graph break (their
# fake implementations give the output shapes without running a kernel), tied by an autograd formula.
@torch.library.custom_op("labkernels::ch06_flash_attention", mutates_args=())
def _attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal, sm_scale)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale):
    _check(q, k, v)
    batch, heads, n_q, _ = q.shape
    lse = torch.empty(batch, heads, n_q, device=q.device, dtype=torch.float32)
    return torch.empty(q.shape, device=q.device, dtype=q.dtype), lse


@torch.library.custom_op("labkernels::ch06_flash_attention_backward", mutates_args=())
def _attention_backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(q, k, v, o, lse, do, causal, sm_scale)


@_attention_backward_op.register_fake
def _(q, k, v, o, lse, do, causal, sm_scale):
    return tuple(torch.empty(t.shape, device=t.device, dtype=t.dtype) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, sm_scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.sm_scale = causal, sm_scale
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, do, _dlse):
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():  # backward(create_graph=True)
        raise RuntimeError(
            "flash_attention: second-order gradients are not supported (create_graph=True); "
            "use naive_attention or torch's SDPA math backend for them"
        )
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(q, k, v, o, lse, do, ctx.causal, ctx.sm_scale)
    return dq, dk, dv, None, None


_attention_op.register_autograd(_attention_backward, setup_context=_setup_context)


def flash_attention_with_lse(q, k, v, causal: bool = False, sm_scale: float | None = None):
    """(O, logsumexp): O (B, Hq, N_q, D) in q's dtype, logsumexp (B, Hq, N_q) fp32 of the scaled scores.
    Inputs that require grad get a backward through torch.autograd (the logsumexp has no gradient); the op is
    `torch.ops.labkernels.ch06_flash_attention`, which torch.compile traces without a graph break."""
    _check(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"flash_attention: causal must be a bool, got {type(causal).__name__} {causal!r}")
    if sm_scale is not None and (
        isinstance(sm_scale, bool) or not isinstance(sm_scale, int | float) or not math.isfinite(sm_scale)
    ):
        raise TypeError(f"flash_attention: sm_scale must be a finite number or None, got {sm_scale!r}")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))) or torch.compiler.is_compiling():
        return _attention_op(q, k, v, causal, sm_scale)  # through torch.library: autograd, torch.compile
    return _forward(q, k, v, causal, sm_scale)  # the plain call: no dispatcher on the way to the kernel


def flash_attention(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """softmax(Q K^T * sm_scale [causal mask]) V for q (B, Hq, N_q, D) and k, v (B, Hkv, N_kv, D).

    - Grouped-query attention: Hq a multiple of Hkv; query head h reads key/value head h // (Hq / Hkv)
      (Hkv = 1: multi-query).
    - N_q and N_kv may differ. Causal masks align at the bottom right, as FlashAttention-2 and SDPA's
      `causal_lower_right` do: query row i sees keys j <= i + N_kv - N_q. A row that sees no key (causal,
      N_q > N_kv) gets O = 0 and logsumexp -inf.
    - Any head dim D up to 256: one that is not a power of two runs padded to the next, masked.
    - sm_scale (any sign) defaults to 1/sqrt(D). Masked scores are -inf: a hidden key's score, however large
      or NaN, never reaches a row.

    Inputs that require grad get a first-order backward; second-order gradients raise."""
    return flash_attention_with_lse(q, k, v, causal, sm_scale)[0]
