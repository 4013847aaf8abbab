"""A paged KV cache: a pool of fixed-size blocks, a block table per sequence, the decode kernel reading it.

A contiguous cache reserves max_len tokens for every sequence. A paged cache (vLLM's PagedAttention layout)
keeps K and V in pools of shape (num_blocks, Hkv, P, D), P tokens a block (a power of two), and gives each
sequence a row of a block table: token i of sequence b lives in slot i % P of block `block_table[b, i // P]`.
Sequences of any lengths share one pool, and a sequence grows by taking one more block. Traffic is the
contiguous cache's plus one 4-byte table entry per P keys (`traffic`).

The table is data, so it can be wrong: `validate_block_table` refuses, with the sequence and the block named,
an id outside the pool, a block used twice, or a row too short for the sequence's length. The kernels mask any
key whose block id is outside the pool, so even an unvalidated table never reads or writes outside it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from labkernels import traffic as traffic_mod
from labkernels.ch07_decode import decode_attention as dec
from labkernels.hostmath import cdiv, next_power_of_2
from labkernels.lane import require_device

TABLE_DTYPE = torch.int32


def reference(q, k_pool, v_pool, block_table, seq_lens, sm_scale: float | None = None) -> torch.Tensor:
    """fp64: gather each sequence's keys from the pool into a contiguous cache, then `decode_attention`'s
    reference."""
    k, v = gather(k_pool, v_pool, block_table, seq_lens)
    return dec.reference(q, k, v, seq_lens, sm_scale)


def gather(k_pool, v_pool, block_table, seq_lens) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous (B, Hkv, max(seq_lens), D) cache a paged one stands for (zeros past each length)."""
    block_size = k_pool.shape[2]
    lens = seq_lens.tolist()
    longest = max(lens)
    batch = len(lens)
    k = k_pool.new_zeros(batch, k_pool.shape[1], longest, k_pool.shape[3])
    v = torch.zeros_like(k)
    for b, n in enumerate(lens):
        idx = torch.arange(n, device=k_pool.device)
        blocks = block_table[b].long()[idx // block_size]
        k[b, :, :n] = k_pool[blocks, :, idx % block_size].transpose(0, 1)
        v[b, :, :n] = v_pool[blocks, :, idx % block_size].transpose(0, 1)
    return k, v


def traffic(batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, block_size, dtype=torch.bfloat16):
    """`decode_attention.traffic` plus the block table: one int32 per block of each sequence."""
    base = dec.traffic(batch, q_heads, kv_heads, n_tokens, seq_len, head_dim, dtype)
    table = 4 * batch * cdiv(seq_len, block_size)
    return traffic_mod.Traffic("paged_decode_attention", base.bytes + table, base.flops)


def paginate(k, v, block_size: int, *, spare_blocks: int = 0, generator=None):
    """(k_pool, v_pool, block_table) holding a contiguous (B, Hkv, L, D) cache in blocks of `block_size`
    tokens, the blocks in a random order in the pool (as after many sequences came and went)."""
    batch, kv_heads, length, head_dim = k.shape
    pages = cdiv(length, block_size)
    num_blocks = batch * pages + spare_blocks
    order = torch.randperm(num_blocks, generator=generator)[: batch * pages].to(k.device)
    k_pool = k.new_zeros(num_blocks, kv_heads, block_size, head_dim)
    v_pool = torch.zeros_like(k_pool)
    pad = pages * block_size - length
    for pool, cache in ((k_pool, k), (v_pool, v)):
        padded = torch.nn.functional.pad(cache, (0, 0, 0, pad))  # (B, Hkv, pages * P, D)
        blocks = padded.view(batch, kv_heads, pages, block_size, head_dim).permute(0, 2, 1, 3, 4)
        pool[order] = blocks.reshape(batch * pages, kv_heads, block_size, head_dim)
    return k_pool, v_pool, order.view(batch, pages).to(TABLE_DTYPE)


def _check_table(name: str, block_table, seq_lens, batch: int) -> None:
    for label, t, dims in (("block_table", block_table, 2), ("seq_lens", seq_lens, 1)):
        require_device(t, f"{name}: {label}")
        if t.dtype != TABLE_DTYPE or t.dim() != dims:
            raise TypeError(
                f"{name}: {label} must be a {dims}-D torch.int32 tensor, got {t.dtype} {tuple(t.shape)}"
            )
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(
            f"{name}: block_table has {block_table.shape[0]} rows and seq_lens {seq_lens.shape[0]} entries; "
            f"the batch has {batch} sequences"
        )
    if block_table.stride(1) != 1 or not seq_lens.is_contiguous():
        raise ValueError(f"{name}: block_table's rows and seq_lens must be contiguous")


def validate_block_table(
    block_table, seq_lens, num_blocks: int, block_size: int, name: str = "paged"
) -> None:
    """Refuse a table the kernels would read wrongly: a length below 0, a row too short for its sequence, a
    block id outside the pool, or a block used twice (by one sequence or two). Reads the table on the host."""
    table = block_table.cpu()
    lens = seq_lens.cpu()
    owner: dict[int, tuple[int, int]] = {}
    for b, n in enumerate(lens.tolist()):
        if n < 0:
            raise ValueError(f"{name}: sequence {b} has length {n}")
        pages = math.ceil(n / block_size)
        if pages > table.shape[1]:
            raise ValueError(
                f"{name}: sequence {b} holds {n} tokens, {pages} blocks of {block_size}, but the block table "
                f"has {table.shape[1]} columns: the table is too short for its length"
            )
        for i, block in enumerate(table[b, :pages].tolist()):
            if not 0 <= block < num_blocks:
                raise ValueError(
                    f"{name}: block_table[{b}, {i}] = {block} is outside the pool of {num_blocks} blocks"
                )
            if block in owner:
                ob, oi = owner[block]
                raise ValueError(
                    f"{name}: block {block} is used twice, at block_table[{ob}, {oi}] and [{b}, {i}]: "
                    "one sequence would overwrite the other's keys"
                )
            owner[block] = (b, i)


def _check_pools(name, k_pool, v_pool) -> None:
    dec.check_cache(name, k_pool, v_pool)
    block_size = k_pool.shape[2]
    if block_size & (block_size - 1):
        raise ValueError(f"{name}: the block size (pool dim 2) must be a power of two, got {block_size}")
    if k_pool.stride() != v_pool.stride():
        raise ValueError(
            f"{name}: k_pool and v_pool must have the same strides ({k_pool.stride()}, {v_pool.stride()})"
        )


@triton.jit
def _append_kernel(
    k_pool_ptr, v_pool_ptr, k_new_ptr, v_new_ptr, table_ptr, pos_ptr,
    stride_pb, stride_ph, stride_pn, stride_nb, stride_nh, stride_nt, stride_tb,
    kv_heads, table_pages, pool_blocks,
    N_TOKENS: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
):  # fmt: skip
    """Token t of sequence b, all KV heads: read (Hkv, D) of K and of V, write them into their slot."""
    pid = tl.program_id(0)
    b = (pid // N_TOKENS).to(tl.int64)
    t = pid % N_TOKENS
    pos = tl.load(pos_ptr + b) + t  # where the token goes: after the pos[b] tokens already cached
    page_no = pos // PAGE_SIZE
    page = tl.load(table_ptr + b * stride_tb + page_no, mask=(pos >= 0) & (page_no < table_pages), other=-1)
    inside = (pos >= 0) & (page >= 0) & (page < pool_blocks)  # else nothing is written: never out of the pool
    h = tl.arange(0, HEADS)
    d = tl.arange(0, HEAD_DIM)
    mask = (h < kv_heads)[:, None] & inside
    src = b * stride_nb + h[:, None] * stride_nh + t * stride_nt + d[None, :]
    dst = page.to(tl.int64) * stride_pb + h[:, None] * stride_ph + (pos % PAGE_SIZE) * stride_pn + d[None, :]
    tl.store(k_pool_ptr + dst, tl.load(k_new_ptr + src, mask=mask), mask=mask)  # read, write Hkv x D
    tl.store(v_pool_ptr + dst, tl.load(v_new_ptr + src, mask=mask), mask=mask)


def _check_append(k_pool, v_pool, block_table, positions, k_new, v_new) -> None:
    name = "paged_append"
    _check_pools(name, k_pool, v_pool)
    for label, t in (("k_new", k_new), ("v_new", v_new)):
        require_device(t, f"{name}: {label}")
        if t.dim() != 4 or t.dtype != k_pool.dtype or t.stride(-1) != 1:
            raise ValueError(
                f"{name}: {label} must be (B, Hkv, T, D) {k_pool.dtype} with a contiguous last dim, got "
                f"{t.dtype} {tuple(t.shape)}"
            )
        if t.shape[1] != k_pool.shape[1] or t.shape[3] != k_pool.shape[3]:
            raise ValueError(f"{name}: {label} {tuple(t.shape)} does not match the pool's (Hkv, D)")
        if torch.is_grad_enabled() and t.requires_grad:
            raise RuntimeError(f"{name}: {label} requires grad; the cache is inference only")
    if k_new.shape != v_new.shape:
        raise ValueError(f"{name}: k_new {tuple(k_new.shape)} and v_new {tuple(v_new.shape)} differ")
    _check_table(name, block_table, positions, k_new.shape[0])
    if _overlaps(k_pool, v_pool) or any(_overlaps(p, n) for p in (k_pool, v_pool) for n in (k_new, v_new)):
        raise ValueError(f"{name}: the pools overlap each other or the new tokens")


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():  # traced tensors have no address: the op checks again when it runs
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    a1 = a0 + sum((s - 1) * st for s, st in zip(a.shape, a.stride(), strict=True)) * a.element_size() + 1
    b1 = b0 + sum((s - 1) * st for s, st in zip(b.shape, b.stride(), strict=True)) * b.element_size() + 1
    return a0 < b1 and b0 < a1


def _append(k_pool, v_pool, block_table, positions, k_new, v_new) -> None:
    batch, kv_heads, n_tokens, head_dim = k_new.shape
    _append_kernel[(batch * n_tokens,)](
        k_pool, v_pool, k_new, v_new, block_table, positions,
        *k_pool.stride()[:3], *k_new.stride()[:3], block_table.stride(0),
        kv_heads, block_table.shape[1], k_pool.shape[0],
        N_TOKENS=n_tokens, HEADS=next_power_of_2(kv_heads), HEAD_DIM=head_dim,
        PAGE_SIZE=k_pool.shape[2],
    )  # fmt: skip


@torch.library.custom_op("labkernels::ch07_paged_append", mutates_args=("k_pool", "v_pool"))
def _append_op(
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
) -> None:
    _check_append(k_pool, v_pool, block_table, positions, k_new, v_new)
    _append(k_pool, v_pool, block_table, positions, k_new, v_new)


@_append_op.register_fake
def _(k_pool, v_pool, block_table, positions, k_new, v_new):
    return None


def paged_append(k_pool, v_pool, block_table, positions, k_new, v_new, *, validate: bool = True) -> None:
    """Write k_new, v_new (B, Hkv, T, D) into the pools at token positions positions[b] + t, through the block
    table. With `validate` (a read of the table on the host) a table without room for positions + T is
    refused; without it, a token whose block is outside the pool is dropped, never written out of bounds."""
    _check_append(k_pool, v_pool, block_table, positions, k_new, v_new)
    if validate:
        ends = positions.cpu() + k_new.shape[2]
        validate_block_table(
            block_table, ends.to(TABLE_DTYPE), k_pool.shape[0], k_pool.shape[2], "paged_append"
        )
    if torch.compiler.is_compiling():
        torch.ops.labkernels.ch07_paged_append(k_pool, v_pool, block_table, positions, k_new, v_new)
    else:
        _append(k_pool, v_pool, block_table, positions, k_new, v_new)


def _attention_checks(q, k_pool, v_pool, block_table, seq_lens) -> None:
    name = "paged_decode_attention"
    _check_pools(name, k_pool, v_pool)
    dec.check_query(name, q, k_pool.shape[1], k_pool.shape[3], k_pool.dtype)
    _check_table(name, block_table, seq_lens, q.shape[0])


def _forward(q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits, **config):
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    max_len = block_table.shape[1] * k_pool.shape[2]  # what the table can hold: known without a device read
    return dec.launch(
        q, k_pool, v_pool, out, seq_lens=seq_lens, block_table=block_table, page_size=k_pool.shape[2],
        max_len=max(max_len, 1), sm_scale=sm_scale, splits=splits, **config,
    )  # fmt: skip


@torch.library.custom_op(
    "labkernels::ch07_paged_decode_attention",
    mutates_args=(),
    schema="(Tensor q, Tensor k_pool, Tensor v_pool, Tensor block_table, Tensor seq_lens, float sm_scale, "
    "int? splits=None) -> Tensor",
)
def _paged_op(q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits=None):
    return _forward(q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits)


@_paged_op.register_fake
def _(q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def paged_decode_attention(
    q, k_pool, v_pool, block_table, seq_lens, sm_scale: float | None = None, *, validate: bool = True,
    splits: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """`decode_attention` over a paged cache: q (B, Hq, T, D); pools (num_blocks, Hkv, P, D); block_table
    (B, pages) int32; seq_lens (B,) int32, each counting the T new tokens (appended first). `validate` reads
    the table on the host (leave it off inside a CUDA graph: the kernel still masks ids outside the pool).
    The split count is planned for what the table can hold (its width x P tokens), known without reading the
    lengths: a table far wider than the lengths it serves gets splits that find no keys."""
    _attention_checks(q, k_pool, v_pool, block_table, seq_lens)
    if validate:
        validate_block_table(
            block_table, seq_lens, k_pool.shape[0], k_pool.shape[2], "paged_decode_attention"
        )
        if int(seq_lens.min()) < q.shape[2]:
            raise ValueError(
                f"paged_decode_attention: a sequence is shorter than the {q.shape[2]} new tokens "
                "(seq_lens counts them: append them first)"
            )
    if splits is not None and (not isinstance(splits, int) or splits < 1):
        raise ValueError(f"paged_decode_attention: splits must be a positive int, got {splits!r}")
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if torch.compiler.is_compiling():
        return torch.ops.labkernels.ch07_paged_decode_attention(
            q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits
        )
    return _forward(q, k_pool, v_pool, block_table, seq_lens, sm_scale, splits)


class PagedKVCache:
    """Pools, block table and lengths of a batch of sequences, with a free list of blocks on the host.

    `reserve(b, n)` gives sequence b blocks for n tokens in all; `append(k, v)` writes the new tokens of every
    sequence and advances the lengths; `attend(q)` runs paged decode attention over them."""

    def __init__(self, num_blocks, block_size, kv_heads, head_dim, *, batch, max_pages, dtype, device):
        if min(num_blocks, block_size, kv_heads, head_dim, batch, max_pages) < 1:
            raise ValueError("PagedKVCache: every size must be a positive int")
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.block_table = torch.full((batch, max_pages), -1, dtype=TABLE_DTYPE, device=device)
        self.seq_lens = torch.zeros(batch, dtype=TABLE_DTYPE, device=device)
        self.block_size = block_size
        self._free = list(range(num_blocks))
        self._pages = [0] * batch

    def reserve(self, seq: int, tokens: int) -> None:
        pages = math.ceil(tokens / self.block_size)
        if pages > self.block_table.shape[1]:
            raise ValueError(
                f"PagedKVCache: {tokens} tokens need {pages} blocks; a row holds {self.block_table.shape[1]}"
            )
        more = pages - self._pages[seq]
        if more > len(self._free):
            raise RuntimeError(f"PagedKVCache: out of blocks ({more} wanted, {len(self._free)} free)")
        if more > 0:
            new = [self._free.pop() for _ in range(more)]
            self.block_table[seq, self._pages[seq] : pages] = torch.tensor(new, dtype=TABLE_DTYPE)
            self._pages[seq] = pages

    def append(self, k_new, v_new, *, validate: bool = True) -> None:
        paged_append(
            self.k_pool, self.v_pool, self.block_table, self.seq_lens, k_new, v_new, validate=validate
        )
        self.seq_lens += k_new.shape[2]  # on the device: a CUDA graph replays it

    def attend(self, q, sm_scale: float | None = None, *, validate: bool = True) -> torch.Tensor:
        return paged_decode_attention(
            q, self.k_pool, self.v_pool, self.block_table, self.seq_lens, sm_scale, validate=validate
        )
