"""Rotary embedding and the cache append of a decode step, in one kernel.

After the QKV projection each sequence's new token is one row of (Hq + 2 Hkv) D values. In torch, turning q
and k by their position (`decode_step.rotary`) is about ten small kernels (the angles, cos, sin, the halves,
the products, the concatenation) and the append one more; at B = 1 each moves a few kilobytes and costs its
launch, a few microseconds even in a CUDA graph. Here one program a sequence reads its row once, turns q and k
in registers (the half-split form: the pair (x_i, x_{i + D/2}) turned by position * inv_freq_i), writes q, and
writes k and v straight into their slot of the paged cache: read (Hq + 2 Hkv) D, write the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from labkernels.ch07_decode import paged
from labkernels.hostmath import next_power_of_2
from labkernels.lane import require_device


def inv_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """The rotary frequencies theta^(-2i/D), i < D/2, in fp32 (`decode_step.rotary` uses the same)."""
    return theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)


def reference(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads: int):
    """Plain torch: turn q and k, append k and v through the table (writes the pools); q (B, Hq, 1, D)."""
    batch = qkv.shape[0]
    head_dim = inv_freq.shape[0] * 2
    kv_heads = (qkv.shape[1] // head_dim - q_heads) // 2
    q, k, v = qkv.view(batch, -1, 1, head_dim).split([q_heads, kv_heads, kv_heads], dim=1)
    angle = positions.float()[:, None, None, None] * inv_freq  # (B, 1, 1, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)

    def turn(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    paged.paged_append(k_pool, v_pool, block_table, positions, turn(k), v.contiguous(), validate=False)
    return turn(q)


@triton.jit
def _turn(x1, x2, cos, sin):
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _rope_append_kernel(
    qkv_ptr, pos_ptr, freq_ptr, q_out_ptr, k_pool_ptr, v_pool_ptr, table_ptr,
    stride_row, stride_pb, stride_ph, stride_pn, stride_tb, table_pages, pool_blocks,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr,  # HQ, HKV: pow. of 2
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HEAD_DIM // 2)
    pos = tl.load(pos_ptr + b)
    angle = pos.to(tl.float32) * tl.load(freq_ptr + half)  # (D/2,)
    cos, sin = tl.cos(angle)[None, :], tl.sin(angle)[None, :]
    row = qkv_ptr + b * stride_row
    # q: read Hq x D, turn, write Hq x D
    hq = tl.arange(0, HQ)[:, None]
    q_mask = hq < Q_HEADS
    q1 = tl.load(row + hq * HEAD_DIM + half[None, :], mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(row + hq * HEAD_DIM + HEAD_DIM // 2 + half[None, :], mask=q_mask, other=0.0).to(tl.float32)
    o1, o2 = _turn(q1, q2, cos, sin)
    q_out = q_out_ptr + b * Q_HEADS * HEAD_DIM + hq * HEAD_DIM + half[None, :]
    tl.store(q_out, o1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_out + HEAD_DIM // 2, o2.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    # k and v: their slot in the paged cache (a block id outside the pool writes nothing)
    page_no = pos // PAGE_SIZE
    page = tl.load(table_ptr + b * stride_tb + page_no, mask=(pos >= 0) & (page_no < table_pages), other=-1)
    inside = (pos >= 0) & (page >= 0) & (page < pool_blocks)
    hk = tl.arange(0, HKV)[:, None]
    kv_mask = (hk < KV_HEADS) & inside
    slot = page.to(tl.int64) * stride_pb + hk * stride_ph + (pos % PAGE_SIZE) * stride_pn + half[None, :]
    k_row = row + Q_HEADS * HEAD_DIM + hk * HEAD_DIM + half[None, :]
    k1 = tl.load(k_row, mask=kv_mask, other=0.0).to(tl.float32)
    k2 = tl.load(k_row + HEAD_DIM // 2, mask=kv_mask, other=0.0).to(tl.float32)
    t1, t2 = _turn(k1, k2, cos, sin)
    tl.store(k_pool_ptr + slot, t1.to(k_pool_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(k_pool_ptr + slot + HEAD_DIM // 2, t2.to(k_pool_ptr.dtype.element_ty), mask=kv_mask)
    v_row = k_row + KV_HEADS * HEAD_DIM
    tl.store(v_pool_ptr + slot, tl.load(v_row, mask=kv_mask), mask=kv_mask)
    tl.store(v_pool_ptr + slot + HEAD_DIM // 2, tl.load(v_row + HEAD_DIM // 2, mask=kv_mask), mask=kv_mask)


def _check(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads) -> None:
    name = "rope_append"
    paged._check_pools(name, k_pool, v_pool)
    for label, t in (("qkv", qkv), ("inv_freq", inv_freq)):
        require_device(t, f"{name}: {label}")
    head_dim = k_pool.shape[3]
    if inv_freq.dtype != torch.float32 or inv_freq.shape != (head_dim // 2,):
        raise ValueError(
            f"{name}: inv_freq must be float32 of shape ({head_dim // 2},), got {tuple(inv_freq.shape)}"
        )
    width = (q_heads + 2 * k_pool.shape[1]) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width or qkv.stride(1) != 1 or qkv.dtype != k_pool.dtype:
        raise ValueError(
            f"{name}: qkv must be (B, (Hq + 2 Hkv) D) = (B, {width}) {k_pool.dtype} with contiguous rows, "
            f"got {qkv.dtype} {tuple(qkv.shape)}"
        )
    if torch.is_grad_enabled() and qkv.requires_grad:
        raise RuntimeError(f"{name}: qkv requires grad; the decode step is inference only")
    paged._check_table(name, block_table, positions, qkv.shape[0])


def _forward(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads):
    batch, head_dim, kv_heads = qkv.shape[0], k_pool.shape[3], k_pool.shape[1]
    q = torch.empty(batch, q_heads, 1, head_dim, device=qkv.device, dtype=qkv.dtype)
    _rope_append_kernel[(batch,)](
        qkv, positions, inv_freq, q, k_pool, v_pool, block_table,
        qkv.stride(0), *k_pool.stride()[:3], block_table.stride(0), block_table.shape[1], k_pool.shape[0],
        Q_HEADS=q_heads, KV_HEADS=kv_heads, HQ=next_power_of_2(q_heads),
        HKV=next_power_of_2(kv_heads), HEAD_DIM=head_dim, PAGE_SIZE=k_pool.shape[2],
    )  # fmt: skip
    return q


@torch.library.custom_op("labkernels::ch07_rope_append", mutates_args=("k_pool", "v_pool"))
def _rope_append_op(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    q_heads: int,
) -> torch.Tensor:
    return _forward(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads)


@_rope_append_op.register_fake
def _(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads):
    return qkv.new_empty((qkv.shape[0], q_heads, 1, k_pool.shape[3]))


def rope_append(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads: int) -> torch.Tensor:
    """One new token per sequence: qkv (B, (Hq + 2 Hkv) D) from the QKV projection; positions (B,) int32, the
    tokens already cached. Writes the turned k and v at those positions of the paged cache and returns the
    turned q (B, Hq, 1, D). No host read of any tensor: a CUDA graph can capture it."""
    _check(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads)
    if torch.compiler.is_compiling():
        return torch.ops.labkernels.ch07_rope_append(
            qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads
        )
    return _forward(qkv, positions, inv_freq, k_pool, v_pool, block_table, q_heads)
