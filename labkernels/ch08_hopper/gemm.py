"""A warp-specialized persistent GEMM for Hopper: C = A @ B, 16-bit operands, fp32 accumulation.

One program per SM loops over output tiles in grouped order (`models.grouped_tile`). Inside a program two
partitions run side by side:
- the producer, one warp, issues TMA loads of a BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile
  of B into a ring of STAGES shared-memory buffers; it waits on empty[slot], the loads complete ready[slot];
- the consumer, the kernel's `num_warps` warps (one or two warpgroups), waits on ready[slot], issues an
  asynchronous warpgroup MMA (wgmma) that reads both tiles straight from shared memory, keeps one MMA in
  flight and releases the slot of the MMA before it; after the last K step it writes the tile through
  shared memory with a TMA store.
The producer runs ahead across tiles, so the next tile's loads overlap this tile's epilogue. Traffic at best:
read A and B once, write C once (`labkernels.traffic.matmul`); 2MNK FLOPs. Past the matrix edges the TMA
unit fills zeros on loads and clips stores, so any M, N, K whose rows are 16-byte aligned work.
Hopper (sm_90) GPUs only; elsewhere use chapter 03's `matmul`. Registered as `labkernels::ch08_gemm`.
"""

from __future__ import annotations

from typing import NamedTuple

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

from labkernels.ch08_hopper import models
from labkernels.ch08_hopper.device import check_hopper, gl_dtype

DTYPES = (torch.float16, torch.bfloat16)
FALLBACK = "labkernels.ch03_triton.matmul.matmul (chapter 03's kernel, any GPU and the CPU lane)"


class GemmConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    stages: int
    num_warps: int  # the consumer's warps: 4 per warpgroup
    group_m: int = 8

    def smem_bytes(self, element_bytes: int = 2) -> int:
        return models.gemm_smem_bytes(self.block_m, self.block_n, self.block_k, self.stages, element_bytes)


CONFIGS = {
    # two consumer warpgroups, each 64 rows x 256 columns of the accumulator (128 fp32 registers a thread)
    "128x256x64_s3_w8": GemmConfig(128, 256, 64, stages=3, num_warps=8),
    # one consumer warpgroup, 128 x 128
    "128x128x64_s4_w4": GemmConfig(128, 128, 64, stages=4, num_warps=4),
}
DEFAULT_CONFIG = "128x256x64_s3_w8"


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)  # fp32 products and sums, rounded once: read MK + KN, write MN


@gluon.jit
def _grouped_tile(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """models.grouped_tile, on the device."""
    tiles_per_group = GROUP_M * num_n
    first_m = (tile // tiles_per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % tiles_per_group) % rows, (tile % tiles_per_group) // rows


@gluon.jit
def _producer(
    a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, pid, num_programs, GROUP_M: gl.constexpr
):
    """One warp: fills the ring with TMA loads, one A tile and one B tile per slot."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    num_n = gl.cdiv(b_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0  # loads issued by this program so far, over all its tiles: the ring position
    for tile in range(pid, num_m * num_n, num_programs):
        pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
        for ks in range(k_steps):
            slot = it % STAGES
            # models.empty_parity: the first lap passes at once, later laps wait for the consumer's release
            mbarrier.wait(empty_bars.index(slot), ((it // STAGES) & 1) ^ 1)
            ready = ready_bars.index(slot)
            mbarrier.expect(ready, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                a_desc, [pid_m * BLOCK_M, ks * BLOCK_K], ready, a_bufs.index(slot)
            )
            tma.async_copy_global_to_shared(
                b_desc, [ks * BLOCK_K, pid_n * BLOCK_N], ready, b_bufs.index(slot)
            )
            it += 1


@gluon.jit
def _consumer(
    a_bufs,
    b_bufs,
    ready_bars,
    empty_bars,
    c_desc,
    c_smem,
    pid,
    num_programs,
    K,
    GROUP_M: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The kernel's warps: wgmma from the ring into fp32 registers, then the epilogue via shared memory."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    # wgmma's accumulator layout: warps stacked along M (16 rows each), one instruction spanning BLOCK_N.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    num_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    it = 0
    for tile in range(pid, num_m * num_n, num_programs):
        pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ks in range(k_steps):
            slot = it % STAGES
            mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)  # models.ready_parity
            acc = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot), acc, is_async=True)
            # One MMA stays in flight; the one before it has finished reading its slot: release that slot.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ks > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))  # the tile's last slot
        # Epilogue: registers -> shared memory -> TMA store (clipped at the matrix edges). write BM x BN
        tma.store_wait(pendings=0)  # the previous tile's store has finished reading c_smem
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()  # order the generic-proxy store before the async-proxy TMA read of c_smem
        tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _gemm_ws_kernel(
    a_desc, b_desc, c_desc, STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr
):
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready_bars.index(s), count=1)  # completed by the TMA bytes (one expect)
        mbarrier.init(empty_bars.index(s), count=1)  # completed by one consumer arrive
    pid = gl.program_id(0)
    num_programs = gl.num_programs(0)
    gl.warp_specialize(
        [
            (
                _consumer,
                (
                    a_bufs,
                    b_bufs,
                    ready_bars,
                    empty_bars,
                    c_desc,
                    c_smem,
                    pid,
                    num_programs,
                    a_desc.shape[1],
                    GROUP_M,
                    num_warps,
                ),
            ),
            (_producer, (a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, pid, num_programs, GROUP_M)),
        ],
        [1],  # the producer's warps
        [24],  # and its registers per thread: it holds only scalars
    )


def check_gemm(a: torch.Tensor, b: torch.Tensor, config: str = DEFAULT_CONFIG) -> None:
    """Refuse what the kernel cannot take, naming the problem: operands first, then the GPU."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"gemm: {name} has dtype {t.dtype}; supported: float16, bfloat16")
        if t.dim() != 2:
            raise ValueError(f"gemm: {name} must be 2-D, got shape {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"gemm: {name} must be contiguous (row-major), got strides {t.stride()}")
        if t.data_ptr() % 16:
            raise ValueError(f"gemm: {name} must start on a 16-byte boundary")
        if max(t.shape) > 2**31 - 1:
            raise ValueError(f"gemm: a descriptor's dimensions are int32, {name} is {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"gemm: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm: inner dimensions differ, a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    for name, n in (("K", a.shape[1]), ("N", b.shape[1])):
        if n * a.element_size() % 16:
            raise ValueError(f"gemm: {name} = {n}: TMA rows must be a multiple of 16 bytes (8 elements)")
    if config not in CONFIGS:
        raise ValueError(f"gemm: config must be one of {sorted(CONFIGS)}, got {config!r}")
    if a.device != b.device:
        raise ValueError(f"gemm: a is on {a.device} but b is on {b.device}")
    check_hopper("gemm", a, FALLBACK)


def _gemm(a: torch.Tensor, b: torch.Tensor, config: str) -> torch.Tensor:
    check_gemm(a, b, config)
    cfg = CONFIGS[config]
    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=a.dtype, device=a.device)  # an empty sum is zero
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    dtype = gl_dtype(a.dtype)
    a_block, b_block, c_block = (
        [cfg.block_m, cfg.block_k],
        [cfg.block_k, cfg.block_n],
        [cfg.block_m, cfg.block_n],
    )
    a_desc = TensorDescriptor.from_tensor(a, a_block, gl.NVMMASharedLayout.get_default_for(a_block, dtype))
    b_desc = TensorDescriptor.from_tensor(b, b_block, gl.NVMMASharedLayout.get_default_for(b_block, dtype))
    c_desc = TensorDescriptor.from_tensor(c, c_block, gl.NVMMASharedLayout.get_default_for(c_block, dtype))
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(sms, tiles),)  # persistent: one program per SM, each looping over tiles
    _gemm_ws_kernel[grid](a_desc, b_desc, c_desc, cfg.stages, cfg.group_m, num_warps=cfg.num_warps)
    return c


@torch.library.custom_op(
    "labkernels::ch08_gemm",
    mutates_args=(),
    schema=f"(Tensor a, Tensor b, str config='{DEFAULT_CONFIG}') -> Tensor",
)
def _gemm_op(a, b, config=DEFAULT_CONFIG):
    return _gemm(a, b, config)


@_gemm_op.register_fake
def _(a, b, config=DEFAULT_CONFIG):
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output):
    a, b, _ = inputs
    ctx.save_for_backward(a, b)


def _gemm_backward(ctx, grad):
    """C = A @ B: dA = dC @ B^T, dB = A^T @ dC (torch's matmul: the transposed operands are not row-major)."""
    a, b = ctx.saved_tensors
    da = grad @ b.mT if ctx.needs_input_grad[0] else None
    db = a.mT @ grad if ctx.needs_input_grad[1] else None
    return da, db, None


_gemm_op.register_autograd(_gemm_backward, setup_context=_setup_context)


def gemm(a: torch.Tensor, b: torch.Tensor, *, config: str = DEFAULT_CONFIG) -> torch.Tensor:
    """a @ b for row-major float16/bfloat16 a (M, K) and b (K, N) with K and N multiples of 8, on a Hopper
    GPU; fp32 accumulation, result in a's dtype. `config` names an entry of CONFIGS. Differentiable."""
    try:
        wants_grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    except AttributeError:  # not tensors: the checks say so
        wants_grad = False
    if wants_grad or torch.compiler.is_compiling():
        return torch.ops.labkernels.ch08_gemm(a, b, config)
    return _gemm(a, b, config)
