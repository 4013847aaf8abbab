"""An FA3-style attention forward for Hopper: softmax(Q K^T / sqrt(D)) V, 16-bit, fp32 softmax and sums.

One program owns BLOCK_M = 128 query rows of one (batch, head) and three partitions run side by side:
- the producer, one warp: a TMA load of the program's Q (two halves of 64 rows), then K and V tiles of
  BLOCK_N keys into rings of STAGES shared-memory buffers; it waits on empty[slot], the bytes complete
  ready[slot];
- two consumer warpgroups, one per half of Q (64 rows each, the height of one wgmma): S = Q K^T by wgmma
  from shared memory, the online softmax in registers (chapter 06's), then O += P V by wgmma with P from
  registers. Each releases a K slot as soon as its S is computed and a V slot after its P V, so the producer
  refills behind them. Nothing orders the two warpgroups: FlashAttention-3's ping-pong makes one exponentiate
  while the other's wgmma runs, and the H200's timeline (ch08_attention_timeline.csv) shows these two
  exponentiating together instead.
Causal: a program reads only the key tiles up to its diagonal, and masks only the diagonal tile. The
epilogue writes O through shared memory with a TMA store and the logsumexp (natural log) for chapter 06's
backward. Traffic at best: read Q, K and V once per query tile... K and V once per program (`traffic`).
Hopper (sm_90) GPUs only, and S a multiple of 128 (a tile never crosses into the next head); elsewhere use
chapter 06's `flash_attention`.
"""

from __future__ import annotations

import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from labkernels.ch08_hopper.device import check_hopper, gl_dtype
from labkernels.ch08_hopper.gemm import _globaltimer, _mark
from labkernels.ch08_hopper.models import SMEM_PER_BLOCK

DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
BLOCK_M, HALF_M, BLOCK_N = 128, 64, 128  # query rows a program, a consumer's rows, keys a tile
STAGES = 2
# A third stage fits only if O leaves through Q's buffer, which is free once a warpgroup's last S is back:
# Q 32 KiB + 3 x (K + V) 64 KiB = 224 KiB of the 227 a program may take (D = 128).
STAGE_CHOICES = (2, 3)
# Issue the next tile's S = Q K^T before this tile's softmax (FlashAttention-3's intra-warpgroup overlap).
# Three designs are measured on the H200 (ch08_attention.csv): without it, with it (`ch08_attention_overlap`)
# and with it and three stages; the overlapped one with two stages was the fastest at every measured shape,
# so it is the default.
OVERLAP = True
# TIMELINE: program (0, 0) of the overlapped design writes the SM's clock at each of these events (gemm's
# `_mark`), one row of an int64 (EVENTS, TIMELINE_SLOTS) buffer each, column = the K/V tile. A consumer's
# tile j: it waits for K[j + 1], issues S[j + 1], ends the softmax of S[j], has V[j], has both wgmmas back.
CONSUMER_EVENTS = (
    "wait_k", "s_issued", "softmax_done", "v_ready", "mma_done", "epilogue_start", "epilogue_end"
)  # fmt: skip
EVENTS = (
    ("producer_wait", "producer_issue")
    + tuple(f"c{half}_{event}" for half in (0, 1) for event in CONSUMER_EVENTS)
    + ("clocks",)
)
TIMELINE_SLOTS = 512
_CLOCKS = gl.constexpr(len(EVENTS) - 1)  # the row of the start and end (cycles, ns)
FALLBACK = "labkernels.ch06_attention.flash_attention (chapter 06's kernel, any GPU and the CPU lane)"
LOG2E = 1.4426950408889634


def reference(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """softmax(Q K^T * scale) V in fp64; causal masks key j > query i."""
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = q.double() @ k.double().transpose(-1, -2) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double()


def smem_bytes(head_dim: int, element_bytes: int = 2, stages: int = STAGES) -> int:
    """Shared memory of one program: Q (BLOCK_M x D), STAGES K and V tiles (BLOCK_N x D), the O tile for the
    TMA store (BLOCK_M x D) unless it reuses Q's (three stages), and an 8-byte mbarrier for Q and for each K
    and V slot's ready and empty."""
    q_and_o = (1 if _o_in_q(stages) else 2) * BLOCK_M * head_dim * element_bytes
    rings = 2 * stages * BLOCK_N * head_dim * element_bytes
    return q_and_o + rings + 8 * (1 + 4 * stages)


def _o_in_q(stages: int) -> bool:
    return stages > 2


@gluon.jit
def _max_combine(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _add_combine(a, b):
    return a + b


# Row reductions through gl.reduce with these combines, not gl.max / gl.sum: those wrap triton.language's own
# jit functions, which the CPU lane's interpreter replaces, and the sm_90 compile there (the chapter's
# compile tests) could not call them.


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty,
              q_row, kv_row, n_tiles, timeline_ptr, pid,
              TIMELINE: gl.constexpr, SLOTS: gl.constexpr):  # fmt: skip
    """One warp: Q once, then K and V tile by tile into their rings."""
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    TILE_N: gl.constexpr = k_desc.block_type.shape[0]
    RING: gl.constexpr = k_bufs.type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))  # read BLOCK_M x D once
    tma.async_copy_global_to_shared(q_desc, [q_row + HALF, 0], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        slot = j % RING
        free = ((j // RING) & 1) ^ 1  # the first lap passes at once; later laps wait for both consumers
        if TIMELINE:
            _mark(timeline_ptr, 0, j, pid, SLOTS)
        mbarrier.wait(k_empty.index(slot), free)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [kv_row + j * TILE_N, 0], k_ready.index(slot), k_bufs.index(slot)
        )
        mbarrier.wait(v_empty.index(slot), free)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            v_desc, [kv_row + j * TILE_N, 0], v_ready.index(slot), v_bufs.index(slot)
        )
        if TIMELINE:
            _mark(timeline_ptr, 1, j, pid, SLOTS)


@gluon.jit
def _softmax_step(s, m_i, l_i, acc, rows, j, n_tiles, qk_scale, p_layout: gl.constexpr, dtype: gl.constexpr,
                  CAUSAL: gl.constexpr):  # fmt: skip
    """Chapter 06's online softmax on one tile of scores: (P in 16 bits, the new max, sum and rescaled O)."""
    TILE_N: gl.constexpr = s.type.shape[1]
    s = s * qk_scale  # base 2: exp2(x log2 e) = e^x
    if CAUSAL:
        if j == n_tiles - 1:  # only the diagonal tile has keys past some of its queries
            cols = j * TILE_N + gl.arange(0, TILE_N, layout=gl.SliceLayout(0, s.type.layout))
            s = gl.where(gl.expand_dims(cols, 0) <= gl.expand_dims(rows, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.reduce(s, 1, _max_combine))  # each row sees key 0 first: m_new is finite
    p = gl.exp2(s - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)  # rescales what was summed under the old maximum
    l_i = l_i * alpha + gl.reduce(p, 1, _add_combine)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout)), 1)
    return gl.convert_layout(p.to(dtype), p_layout), m_new, l_i, acc


@gluon.jit
def _epilogue(acc, m_i, l_i, o_desc, o_smem, lse_ptr, q_row, HALF_INDEX: gl.constexpr):
    """O / l through shared memory and a TMA store; the logsumexp (natural log) for chapter 06's backward."""
    HALF: gl.constexpr = o_smem.type.shape[1]
    out = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, acc.type.layout)), 1)
    o_half = o_smem.index(HALF_INDEX)
    o_half.store(out.to(o_smem.dtype))  # write 64 x D through shared memory
    fence_async_shared()  # the generic-proxy store before the TMA unit reads o_half
    tma.async_copy_shared_to_global(o_desc, [q_row + HALF_INDEX * HALF, 0], o_half)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(lse_ptr + q_row + HALF_INDEX * HALF + gl.arange(0, HALF, layout=m_i.type.layout), lse)
    tma.store_wait(pendings=0)


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, o_smem, lse_ptr,
              q_row, q_pos, n_tiles, qk_scale, timeline_ptr, pid, HALF_INDEX: gl.constexpr,
              CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, TIMELINE: gl.constexpr, SLOTS: gl.constexpr,
              num_warps: gl.constexpr):  # fmt: skip
    """One warpgroup, 64 query rows: the online softmax over every key tile, then O and the logsumexp.
    OVERLAP: the next tile's S = Q K^T is issued before this tile's softmax, so the tensor cores compute it
    while this warpgroup exponentiates (FlashAttention-3's intra-warpgroup overlap); without it, each wgmma
    is waited for before the softmax that follows it. TIMELINE marks the overlapped design's EVENTS."""
    EV: gl.constexpr = 2 + HALF_INDEX * 7  # this warpgroup's first row of EVENTS
    HALF: gl.constexpr = q_smem.type.shape[1]
    HEAD_D: gl.constexpr = q_smem.type.shape[2]
    TILE_N: gl.constexpr = k_bufs.type.shape[1]
    RING: gl.constexpr = k_bufs.type.shape[0]
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, TILE_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = q_pos + HALF_INDEX * HALF + gl.arange(0, HALF, layout=row_layout)  # positions in the sequence
    m_i = gl.full([HALF], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([HALF], gl.float32, layout=row_layout)
    acc = gl.zeros([HALF, HEAD_D], gl.float32, layout=o_layout)
    zero_s = gl.zeros([HALF, TILE_N], gl.float32, layout=s_layout)
    q = q_smem.index(HALF_INDEX)
    mbarrier.wait(q_bar, 0)
    if OVERLAP:
        mbarrier.wait(k_ready.index(0), 0)
        s = warpgroup_mma(q, k_bufs.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        mbarrier.arrive(k_empty.index(0), count=1)
        for j in range(n_tiles - 1):
            slot, after = j % RING, (j + 1) % RING
            if TIMELINE:
                _mark(timeline_ptr, EV + 0, j, pid, SLOTS)
            mbarrier.wait(k_ready.index(after), ((j + 1) // RING) & 1)
            s_next = warpgroup_mma(
                q, k_bufs.index(after).permute((1, 0)), zero_s, use_acc=False, is_async=True
            )
            if TIMELINE:
                _mark(timeline_ptr, EV + 1, j, pid, SLOTS)
            p16, m_i, l_i, acc = _softmax_step(
                s, m_i, l_i, acc, rows, j, n_tiles, qk_scale, p_layout, dtype, CAUSAL
            )
            if TIMELINE:
                _mark(timeline_ptr, EV + 2, j, pid, SLOTS)
            mbarrier.wait(v_ready.index(slot), (j // RING) & 1)
            if TIMELINE:
                _mark(timeline_ptr, EV + 3, j, pid, SLOTS)
            acc = warpgroup_mma(p16, v_bufs.index(slot), acc, is_async=True)
            s, acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_next, acc))
            if TIMELINE:
                _mark(timeline_ptr, EV + 4, j, pid, SLOTS)
            mbarrier.arrive(k_empty.index(after), count=1)
            mbarrier.arrive(v_empty.index(slot), count=1)
        last = n_tiles - 1
        p16, m_i, l_i, acc = _softmax_step(
            s, m_i, l_i, acc, rows, last, n_tiles, qk_scale, p_layout, dtype, CAUSAL
        )
        mbarrier.wait(v_ready.index(last % RING), (last // RING) & 1)
        acc = warpgroup_mma(p16, v_bufs.index(last % RING), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(v_empty.index(last % RING), count=1)
    else:
        for j in range(n_tiles):
            slot = j % RING
            full = (j // RING) & 1
            mbarrier.wait(k_ready.index(slot), full)
            s = warpgroup_mma(q, k_bufs.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            mbarrier.arrive(k_empty.index(slot), count=1)  # this warpgroup is done with K[slot]
            p16, m_i, l_i, acc = _softmax_step(
                s, m_i, l_i, acc, rows, j, n_tiles, qk_scale, p_layout, dtype, CAUSAL
            )
            mbarrier.wait(v_ready.index(slot), full)
            acc = warpgroup_mma(p16, v_bufs.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(v_empty.index(slot), count=1)
    if TIMELINE:
        _mark(timeline_ptr, EV + 5, 0, pid, SLOTS)
    _epilogue(acc, m_i, l_i, o_desc, o_smem, lse_ptr, q_row, HALF_INDEX)
    if TIMELINE:
        _mark(timeline_ptr, EV + 6, 0, pid, SLOTS)


@gluon.jit
def _attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, timeline_ptr, seq_len, qk_scale,
                          CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                          TIMELINE: gl.constexpr, SLOTS: gl.constexpr, O_IN_Q: gl.constexpr,
                          num_warps: gl.constexpr):  # fmt: skip
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    TILE_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype
    n_q_tiles = gl.num_programs(0)
    # Causal: the longest rows first, so the short programs fill the last wave.
    q_tile = n_q_tiles - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    head = gl.program_id(1)
    q_pos = q_tile * (2 * HALF)
    q_row = head * seq_len + q_pos  # row of the (B H S, D) view
    kv_row = head * seq_len
    n_tiles = gl.cdiv(q_pos + 2 * HALF, TILE_N) if CAUSAL else gl.cdiv(seq_len, TILE_N)
    q_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_D], q_desc.layout)
    if O_IN_Q:  # each warpgroup writes its O through its own half of Q, after its last S = Q K^T
        o_smem = q_smem
    else:
        o_smem = gl.allocate_shared_memory(dtype, [2, HALF, HEAD_D], o_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_D], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, TILE_N, HEAD_D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pid = gl.program_id(0) + gl.program_id(1) * n_q_tiles  # the timeline records program 0
    if TIMELINE:
        _mark(timeline_ptr, _CLOCKS, 0, pid, SLOTS)  # cycles and nanoseconds at the start
        gl.store(timeline_ptr + _CLOCKS * SLOTS + 1, _globaltimer(), mask=pid == 0)
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)  # completed by the TMA bytes
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=2)  # completed when both consumers arrive
        mbarrier.init(v_empty.index(s), count=2)
    # fmt: off
    gl.warp_specialize(
        [
            (_consumer, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, o_smem,
                         lse_ptr, q_row, q_pos, n_tiles, qk_scale, timeline_ptr, pid, 0, CAUSAL, OVERLAP,
                         TIMELINE, SLOTS, num_warps)),
            (_consumer, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, o_desc, o_smem,
                         lse_ptr, q_row, q_pos, n_tiles, qk_scale, timeline_ptr, pid, 1, CAUSAL, OVERLAP,
                         TIMELINE, SLOTS, num_warps)),
            (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready,
                         v_empty, q_row, kv_row, n_tiles, timeline_ptr, pid, TIMELINE, SLOTS)),
        ],
        [4, 1],  # warps: the second consumer warpgroup (the kernel's own run the first), the producer
        [240, 24],  # registers a thread: the consumers hold S, P and O; the producer scalars
    )
    # fmt: on
    if TIMELINE:
        _mark(timeline_ptr, _CLOCKS, 2, pid, SLOTS)  # cycles and nanoseconds at the end
        gl.store(timeline_ptr + _CLOCKS * SLOTS + 3, _globaltimer(), mask=pid == 0)


def compile_sm90(
    head_dim: int = 128,
    causal: bool = False,
    overlap: bool = OVERLAP,
    seq_len: int = 256,
    heads: int = 6,
    timeline: bool = False,
    stages: int = STAGES,
):
    """The kernel compiled for Hopper on any machine, a CPU included (`offline.compile_for_hopper`)."""
    from labkernels.ch08_hopper.offline import compile_for_hopper, descriptor

    rows = heads * seq_len
    args = {
        "q_desc": descriptor(rows, head_dim, [HALF_M, head_dim]),
        "k_desc": descriptor(rows, head_dim, [BLOCK_N, head_dim]),
        "v_desc": descriptor(rows, head_dim, [BLOCK_N, head_dim]),
        "o_desc": descriptor(rows, head_dim, [HALF_M, head_dim]),
        "lse_ptr": torch.empty(rows),
        "timeline_ptr": torch.empty(len(EVENTS), dtype=torch.int64),
        "seq_len": seq_len,
        "qk_scale": 0.1,
    }
    constexprs = {"CAUSAL": causal, "STAGES": stages, "OVERLAP": overlap, "TIMELINE": timeline,
                  "SLOTS": TIMELINE_SLOTS, "O_IN_Q": _o_in_q(stages), "num_warps": 4}  # fmt: skip
    return compile_for_hopper(_attention_fwd_kernel, args, constexprs, 4)


def _descriptor(t2d: torch.Tensor, block: list[int]) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype(t2d.dtype))
    return TensorDescriptor.from_tensor(t2d, block, layout)


def check_attention(q, k, v, stages: int = STAGES) -> None:
    """Refuse what the kernel cannot take, naming the problem: operands first, then the GPU."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention_forward: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"attention_forward: {name} has dtype {t.dtype}; supported: float16, bfloat16")
        if t.dim() != 4:
            raise ValueError(f"attention_forward: {name} must be (B, H, S, D), got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"attention_forward: {name} must be contiguous, got strides {t.stride()}")
    if not (q.shape == k.shape == v.shape) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            "attention_forward: q, k and v must share one shape and dtype (no GQA here), got "
            f"{q.dtype} {tuple(q.shape)}, {k.dtype} {tuple(k.shape)}, {v.dtype} {tuple(v.shape)}"
        )
    batch, heads, seq_len, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(
            f"attention_forward: head dim {head_dim}; this kernel takes {HEAD_DIMS}. Use {FALLBACK}"
        )
    if seq_len == 0 or seq_len % BLOCK_M:
        raise ValueError(
            f"attention_forward: S = {seq_len} must be a positive multiple of {BLOCK_M} (no tile crosses "
            f"into the next head). Use {FALLBACK}"
        )
    if batch * heads * seq_len >= 2**31:
        raise ValueError(
            f"attention_forward: B H S = {batch * heads * seq_len} rows: TMA coordinates are int32"
        )
    if len({q.device, k.device, v.device}) != 1:
        raise ValueError(f"attention_forward: q, k and v are on {q.device}, {k.device} and {v.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError(
            f"attention_forward: inputs require grad; this forward is inference only. Use {FALLBACK}"
        )
    if stages not in STAGE_CHOICES:
        raise ValueError(f"attention_forward: stages = {stages}; this kernel takes {STAGE_CHOICES}")
    if smem_bytes(head_dim, q.element_size(), stages) > SMEM_PER_BLOCK:
        raise ValueError(f"attention_forward: {stages} stages at D = {head_dim} need more shared memory "
                         f"than a program may take ({SMEM_PER_BLOCK} bytes)")  # fmt: skip
    check_hopper("attention_forward", q, FALLBACK)


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    overlap: bool = OVERLAP,
    stages: int = STAGES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, logsumexp) of softmax(Q K^T * sm_scale) V for (B, H, S, D) 16-bit q, k, v on a Hopper GPU, S a
    multiple of 128, D 64 or 128; O in q's dtype, the logsumexp (B, H, S) fp32 in natural log. `overlap`
    picks the design (OVERLAP), `stages` the K/V ring's depth (STAGE_CHOICES; 3 writes O through Q's
    buffer). Inference only: chapter 06's backward takes the logsumexp."""
    check_attention(q, k, v, stages)
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if torch.compiler.is_compiling():
        return torch.ops.labkernels.ch08_attention_forward(q, k, v, causal, scale, overlap, stages)
    return _forward(q, k, v, causal, scale, overlap, stages)


@torch.library.custom_op(
    "labkernels::ch08_attention_forward",
    mutates_args=(),
    schema="(Tensor q, Tensor k, Tensor v, bool causal, float sm_scale, bool overlap, int stages) -> "
    "(Tensor, Tensor)",
)
def _attention_op(q, k, v, causal, sm_scale, overlap, stages):
    return _forward(q, k, v, causal, sm_scale, overlap, stages)


@_attention_op.register_fake
def _(q, k, v, causal, sm_scale, overlap, stages):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _check_alignment(q, k, v) -> None:
    """TMA needs 16-byte aligned bases. Checked where the kernel launches, not in check_attention: a
    tensor's address is not known while torch.compile traces the call."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16:
            raise ValueError(f"attention_forward: {name} must start on a 16-byte boundary")


def _forward(q, k, v, causal: bool, scale: float, overlap: bool, stages: int = STAGES, timeline=None):
    """(O, logsumexp); `timeline`, an int64 (EVENTS, TIMELINE_SLOTS) buffer, turns the recording on."""
    _check_alignment(q, k, v)
    batch, heads, seq_len, head_dim = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32)
    rows = batch * heads * seq_len
    q_desc = _descriptor(q.view(rows, head_dim), [HALF_M, head_dim])
    k_desc = _descriptor(k.view(rows, head_dim), [BLOCK_N, head_dim])
    v_desc = _descriptor(v.view(rows, head_dim), [BLOCK_N, head_dim])
    o_desc = _descriptor(o.view(rows, head_dim), [HALF_M, head_dim])
    grid = (seq_len // BLOCK_M, batch * heads)
    _attention_fwd_kernel[grid](
        q_desc,
        k_desc,
        v_desc,
        o_desc,
        lse,
        lse if timeline is None else timeline,  # never read unless TIMELINE
        seq_len,
        scale * LOG2E,
        CAUSAL=causal,
        STAGES=stages,
        OVERLAP=overlap,
        TIMELINE=timeline is not None,
        SLOTS=TIMELINE_SLOTS,
        O_IN_Q=_o_in_q(stages),
        num_warps=4,
    )
    return o, lse


def attention_timeline(q, k, v, *, causal: bool = False) -> list[dict]:
    """Run the overlapped forward once with program (0, 0) recording its clock at every event (EVENTS); rows
    (event, index, cycle, ns) as `gemm.gemm_timeline` gives them; tiles past TIMELINE_SLOTS go unrecorded."""
    from labkernels.ch08_hopper.timeline import rows_from_marks

    check_attention(q, k, v)
    marks = torch.full((len(EVENTS), TIMELINE_SLOTS), -1, dtype=torch.int64, device=q.device)
    _forward(q, k, v, causal, 1 / math.sqrt(q.shape[-1]), True, STAGES, timeline=marks)
    return rows_from_marks(marks.cpu(), EVENTS)
