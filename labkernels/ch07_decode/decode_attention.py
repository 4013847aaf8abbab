"""Split-KV decode attention (Flash-Decoding) with grouped query heads.

A decoding step brings T = 1-8 new query tokens per sequence and must read the whole KV cache: K and V,
2·B·Hkv·L·D elements, against a query and an output of B·Hq·T·D each. Nothing is reused, so the op sits far
left on the roofline and its speed is the speed of one read of the cache (`traffic`).

Two ideas make that read fast. Grouped heads (GQA): the Hq/Hkv query heads that share a KV head are handled by
one program, so each K and V row is read once per group, not once per query head. Split-KV: with few sequences
there are too few (sequence, KV head) pairs to keep 132 SMs reading, so the keys are cut into `num_splits`
ranges; each program returns a partial state (m, l, O) of its range, and a second kernel merges them with
chapter 06's rescaling: M = max m_s, O = sum exp(m_s - M) O_s / sum exp(m_s - M) l_s. A split left with no
keys returns (-inf, 0, 0) and adds nothing. Causal within the new tokens: token t sees L - T + t + 1 keys.
The same kernel reads a paged cache (`labkernels.ch07_decode.paged`) through its block table.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from labkernels import traffic as traffic_mod
from labkernels.hostmath import cdiv, next_power_of_2
from labkernels.lane import LANE, on_gpu, require_device, sm_count

GPU_DTYPES = (torch.float16, torch.bfloat16)
CPU_DTYPES = (torch.float16, torch.float32)  # the interpreter's bfloat16 is broken
HEAD_DIMS = (64, 128)
GROUPS = (1, 2, 4, 8)  # query heads per KV head
MAX_TOKENS = 8
LOG2E = 1.4426950408889634
# The split model (`num_splits`): programs wanted per SM, the fewest keys worth a split (its partial state and
# the combine must stay small beside the keys it reads), and a cap that keeps the combine's tile in registers.
PROGRAMS_PER_SM = 2
MIN_SPLIT_KEYS = 256
MAX_SPLITS = 64
# Keys per loop step: 64 when the keys are split; 128 with one split a program, where the (sequence, KV head)
# pairs alone give several programs an SM (the H200's configs, gpu_jobs/ch07_decode.py --explore).
BLOCK_N, BLOCK_N_WHOLE = (64, 128) if LANE == "gpu" else (32, 32)
NUM_WARPS, NUM_STAGES = (4, 3) if LANE == "gpu" else (4, 1)


def reference(q, k, v, seq_lens=None, sm_scale: float | None = None) -> torch.Tensor:
    """fp64 attention of q (B, Hq, T, D) over a contiguous cache k, v (B, Hkv, L, D): query token t of
    sequence b sees the first seq_lens[b] - T + t + 1 keys (seq_lens defaults to L for every sequence)."""
    batch, q_heads, n_tokens, head_dim = q.shape
    group = q_heads // k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    kd = k.double().repeat_interleave(group, dim=1)  # (B, Hq, L, D): each KV head serves `group` query heads
    vd = v.double().repeat_interleave(group, dim=1)
    scores = (q.double() @ kd.transpose(-2, -1)) * scale  # (B, Hq, T, L)
    lens = torch.full((batch,), k.shape[2]) if seq_lens is None else seq_lens.cpu()
    keys = torch.arange(k.shape[2])
    sees = lens[:, None] - n_tokens + torch.arange(n_tokens)[None, :] + 1  # (B, T) keys each token sees
    keep = keys[None, None, :] < sees[:, :, None]  # (B, T, L)
    scores = scores.masked_fill(~keep[:, None].to(scores.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ vd


def traffic(
    batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, dtype=torch.bfloat16
) -> traffic_mod.Traffic:
    """Read K and V once (2·B·Hkv·L·D) plus Q, write O (B·Hq·T·D each); 4·B·Hq·T·L·D FLOPs. The partial
    states of the splits (a few % at the split counts `num_splits` picks) are not counted: the ideal."""
    e = traffic_mod.element_size(dtype)
    cache = 2 * batch * kv_heads * seq_len * head_dim
    queries = 2 * batch * q_heads * n_tokens * head_dim
    return traffic_mod.Traffic(
        "decode_attention", (cache + queries) * e, 4 * batch * q_heads * n_tokens * seq_len * head_dim
    )


def num_splits(batch: int, kv_heads: int, max_len: int, sms: int | None = None) -> int:
    """How many key ranges each (sequence, KV head) is cut into: enough programs for PROGRAMS_PER_SM on every
    SM, but no split shorter than MIN_SPLIT_KEYS keys, and at most MAX_SPLITS."""
    sms = sm_count() if sms is None else sms
    pairs = batch * kv_heads
    # Rounded down: a last round of programs that fills only part of the GPU costs a whole round.
    wanted = PROGRAMS_PER_SM * sms // pairs
    worth = cdiv(max_len, MIN_SPLIT_KEYS)
    return max(1, min(wanted, worth, MAX_SPLITS))


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr,  # q (B, Hq, T, D); contiguous: k, v (B, Hkv, L, D); paged: pools (blocks, Hkv, P, D)
    out_ptr, part_o_ptr, part_ml_ptr,  # out (B, Hq, T, D); partials (B Hkv, splits, GT, D) and (..., GT, 2)
    table_ptr, lens_ptr,  # paged only: block table (B, pages) int32, lengths (B,) int32
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_kn,  # contiguous: (sequence, head, key); paged: (block, head, slot)
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_ot,
    stride_tb,
    kv_heads, cache_len, keys_per_split, table_pages, pool_blocks, qk_scale,
    GROUP: tl.constexpr, N_TOKENS: tl.constexpr, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, SPLIT: tl.constexpr,
    TILE_PAGES: tl.constexpr,  # paged: blocks a tile of BLOCK_N keys spans (1 when P >= BLOCK_N)
):  # fmt: skip
    split = tl.program_id(0)
    pair = tl.program_id(1)  # one (sequence, KV head): all GROUP query heads that read it
    b = (pair // kv_heads).to(tl.int64)  # 64-bit: b * stride may pass 2^31
    kvh = (pair % kv_heads).to(tl.int64)
    if PAGED:
        seq_len = tl.load(lens_ptr + b)
    else:
        seq_len = cache_len
    # Row r of the program's tile is query head kvh * GROUP + r // T, token r % T (rows past GROUP * T:
    # padding for tl.dot's 16-row minimum, never stored).
    rows = tl.arange(0, ROWS)
    row_ok = rows < GROUP * N_TOKENS
    head = kvh * GROUP + rows // N_TOKENS
    token = rows % N_TOKENS
    sees = seq_len - N_TOKENS + token + 1  # causal within the new tokens
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = q_ptr + b * stride_qb + head[:, None] * stride_qh + token[:, None] * stride_qt + offs_d[None, :]
    q = tl.load(q_rows, mask=row_ok[:, None], other=0.0)  # read Q: GROUP * T rows, once

    m_i = tl.zeros([ROWS], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, seq_len)  # an empty range (lo >= hi) leaves (-inf, 0, 0)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < hi
        if PAGED:
            # Key `col` lives in slot col % P of block table[b, col // P]. A block id outside the pool (a
            # table the caller did not validate) masks its keys: never a read outside the pool.
            if TILE_PAGES == 1:  # P >= BLOCK_N: the tile sits in one block; one table entry, one base address
                page_no = start // PAGE_SIZE
                page = tl.load(table_ptr + b * stride_tb + page_no, mask=page_no < table_pages, other=-1)
                page_ok = (page >= 0) & (page < pool_blocks)
                slot = start % PAGE_SIZE + offs_n
                k_rows = page.to(tl.int64) * stride_kb + kvh * stride_kh + slot * stride_kn
                v_rows = page.to(tl.int64) * stride_vb + kvh * stride_vh + slot * stride_vn
                col_ok = col_ok & page_ok
            else:  # P < BLOCK_N: BLOCK_N / P blocks a tile; each key reads its entry (the same few, cached)
                page_no = cols // PAGE_SIZE
                page = tl.load(
                    table_ptr + b * stride_tb + page_no, mask=col_ok & (page_no < table_pages), other=-1
                )
                page_ok = (page >= 0) & (page < pool_blocks)
                slot = cols % PAGE_SIZE
                k_rows = page.to(tl.int64) * stride_kb + kvh * stride_kh + slot * stride_kn
                v_rows = page.to(tl.int64) * stride_vb + kvh * stride_vh + slot * stride_vn
                col_ok = col_ok & page_ok
        else:
            k_rows = b * stride_kb + kvh * stride_kh + cols.to(tl.int64) * stride_kn
            v_rows = b * stride_vb + kvh * stride_vh + cols.to(tl.int64) * stride_vn
        k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=col_ok[:, None], other=0.0)  # read K tile
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (ROWS, BLOCK_N) scores, base 2
        keep = col_ok[None, :] & (cols[None, :] < sees[:, None])
        s = tl.where(keep, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # no key yet: no -inf - -inf
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=col_ok[:, None], other=0.0)  # read V tile
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new

    if SPLIT:  # the partial state: O unnormalised, m and l beside it (fp32)
        slot = (pair.to(tl.int64) * tl.num_programs(0) + split) * (GROUP * N_TOKENS) + rows
        tl.store(part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ml_ptr + slot * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + slot * 2 + 1, l_i, mask=row_ok)
    else:  # one split: normalise here, no combine (a token that sees no key gets 0)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        o_rows = out_ptr + b * stride_ob + head[:, None] * stride_oh + token[:, None] * stride_ot
        tl.store(o_rows + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _combine_kernel(
    part_o_ptr, part_ml_ptr, out_ptr, stride_ob, stride_oh, stride_ot, kv_heads, n_splits,
    GROUP: tl.constexpr, N_TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    """One query row (sequence, query head, token): merge its n_splits partial states, chapter 06's merge."""
    pid = tl.program_id(0).to(tl.int64)
    gt = GROUP * N_TOKENS
    pair, row = pid // gt, pid % gt
    s = tl.arange(0, SPLITS)
    s_ok = s < n_splits
    slot = (pair * n_splits + s) * gt + row
    m = tl.load(part_ml_ptr + slot * 2, mask=s_ok, other=-float("inf"))  # read splits x 2
    l_s = tl.load(part_ml_ptr + slot * 2 + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == -float("inf"), 0.0, m_max)  # every split empty: weights 0, output 0
    w = tl.math.exp2(m - m_max)  # exp(m_s - M) <= 1; an empty split (-inf) weighs 0
    total = tl.sum(l_s * w, 0)
    offs_d = tl.arange(0, HEAD_DIM)
    o = tl.load(part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total > 0, total, 1.0)  # read splits x D
    b, kvh = pair // kv_heads, pair % kv_heads
    head, token = kvh * GROUP + row // N_TOKENS, row % N_TOKENS
    o_row = out_ptr + b * stride_ob + head * stride_oh + token * stride_ot
    tl.store(o_row + offs_d, out.to(out_ptr.dtype.element_ty))  # write D


def check_query(name: str, q: torch.Tensor, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    """Checks shared by the contiguous and the paged launchers: q (B, Hq, T, D) against the cache's heads."""
    dtypes = GPU_DTYPES if on_gpu() else CPU_DTYPES
    require_device(q, f"{name}: q")
    if q.dim() != 4:
        raise ValueError(f"{name}: q must be (B, Hq, T, D), got shape {tuple(q.shape)}")
    if q.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{name}: q has dtype {q.dtype}; this lane supports {names}")
    if q.dtype != dtype:
        raise TypeError(f"{name}: q is {q.dtype} but the cache is {dtype}; pass one dtype")
    batch, q_heads, n_tokens, d = q.shape
    if batch == 0 or q_heads == 0:
        raise ValueError(f"{name}: q is empty, shape {tuple(q.shape)}")
    if not 1 <= n_tokens <= MAX_TOKENS:
        raise ValueError(f"{name}: q has {n_tokens} new tokens; decode supports 1 to {MAX_TOKENS}")
    if d != head_dim or d not in HEAD_DIMS:
        raise ValueError(f"{name}: head dim {d} (cache {head_dim}); supported: {HEAD_DIMS}, the same in both")
    if q_heads % kv_heads or q_heads // kv_heads not in GROUPS:
        raise ValueError(
            f"{name}: {q_heads} query heads over {kv_heads} KV heads; Hq / Hkv must be one of {GROUPS}"
        )
    if q.stride(-1) != 1:
        raise ValueError(f"{name}: q's last dim must be contiguous (strides {q.stride()})")
    if torch.is_grad_enabled() and q.requires_grad:
        raise RuntimeError(
            f"{name}: q requires grad; decode attention is inference only (use torch.no_grad())"
        )


def check_cache(name: str, k: torch.Tensor, v: torch.Tensor) -> None:
    for label, t in (("k", k), ("v", v)):
        require_device(t, f"{name}: {label}")
        if t.dim() != 4:
            raise ValueError(f"{name}: {label} must be 4-D, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {label}'s last dim must be contiguous (strides {t.stride()})")
        if torch.is_grad_enabled() and t.requires_grad:
            raise RuntimeError(f"{name}: {label} requires grad; decode attention is inference only")
    if k.shape != v.shape or k.dtype != v.dtype:
        raise ValueError(
            f"{name}: k and v must match, got {k.dtype} {tuple(k.shape)} and {v.dtype} {tuple(v.shape)}"
        )


def launch(
    q, k, v, out, *, seq_lens=None, block_table=None, page_size: int = 1, max_len: int, sm_scale, splits,
    block_n: int | None = None, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES,
):  # fmt: skip
    """Both kernels for a contiguous cache (block_table None) or a paged one. `max_len` bounds every
    sequence's length (the split model needs it without reading the lengths from the device)."""
    batch, q_heads, n_tokens, head_dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    rows = max(16, next_power_of_2(group * n_tokens))
    splits = num_splits(batch, kv_heads, max_len) if splits is None else splits
    paged = block_table is not None
    block_n = block_n or (BLOCK_N_WHOLE if splits == 1 else BLOCK_N)
    keys_per_split = cdiv(cdiv(max_len, splits), block_n) * block_n
    splits = max(1, cdiv(max_len, keys_per_split))  # no split starts past the longest sequence
    gt = group * n_tokens
    if splits > 1:
        part_o = torch.empty(batch * kv_heads * splits * gt * head_dim, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(batch * kv_heads * splits * gt * 2, device=q.device, dtype=torch.float32)
    else:
        part_o = part_ml = out  # unused
    table = block_table if paged else out
    lens = seq_lens if paged else out
    _decode_split_kernel[(splits, batch * kv_heads)](
        q, k, v, out, part_o, part_ml, table, lens,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        block_table.stride(0) if paged else 0,
        kv_heads, k.shape[2], keys_per_split,
        block_table.shape[1] if paged else 0, k.shape[0], sm_scale * LOG2E,
        GROUP=group, N_TOKENS=n_tokens, ROWS=rows, HEAD_DIM=head_dim, BLOCK_N=block_n,
        PAGED=paged, PAGE_SIZE=page_size, SPLIT=splits > 1,
        TILE_PAGES=max(1, block_n // page_size), num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if splits > 1:
        _combine_kernel[(batch * kv_heads * gt,)](
            part_o, part_ml, out, out.stride(0), out.stride(1), out.stride(2), kv_heads, splits,
            GROUP=group, N_TOKENS=n_tokens, HEAD_DIM=head_dim, SPLITS=next_power_of_2(splits),
            num_warps=4,
        )  # fmt: skip
    return out


def _check(q, k, v) -> None:
    check_cache("decode_attention", k, v)
    check_query("decode_attention", q, k.shape[1], k.shape[3], k.dtype)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"decode_attention: q has batch {q.shape[0]} but the cache has {k.shape[0]}")
    if k.shape[2] < q.shape[2]:
        raise ValueError(
            f"decode_attention: the cache holds {k.shape[2]} tokens, fewer than the {q.shape[2]} new ones "
            "(append the new tokens' K and V first)"
        )


def _forward(q, k, v, sm_scale, splits):
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    return launch(q, k, v, out, max_len=k.shape[2], sm_scale=sm_scale, splits=splits)


@torch.library.custom_op(
    "labkernels::ch07_decode_attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, float sm_scale, int? splits=None) -> Tensor",
)
def _decode_attention_op(q, k, v, sm_scale, splits=None):
    return _forward(q, k, v, sm_scale, splits)


@_decode_attention_op.register_fake
def _(q, k, v, sm_scale, splits=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def decode_attention(q, k, v, sm_scale: float | None = None, *, splits: int | None = None) -> torch.Tensor:
    """softmax(q K^T * sm_scale) V over a contiguous KV cache, causal within the new tokens.

    q (B, Hq, T, D) with T <= 8; k, v (B, Hkv, L, D) holding the new tokens last; Hq / Hkv in 1, 2, 4, 8;
    D in 64, 128; last dims contiguous. `splits` overrides the split model (`num_splits`). Inference only."""
    _check(q, k, v)
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"decode_attention: splits must be a positive int, got {splits!r}")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if torch.compiler.is_compiling():
        return torch.ops.labkernels.ch07_decode_attention(q, k, v, sm_scale, splits)
    return _forward(q, k, v, sm_scale, splits)
