"""A pipelined copy through Hopper's TMA unit: global -> shared -> global, with no registers in between.

Each program copies a band of BLOCK_ROWS rows, BLOCK_COLS columns at a time, through a ring of STAGES
shared-memory buffers. The TMA unit moves whole tiles, described by a tensor descriptor (base, shape,
strides, tile shape), and signals an mbarrier when a load has landed; a TMA store then writes the same
buffer back out. STAGES - 1 loads are in flight while one store drains: that is what Little's law asks of
a copy (`models.stages_to_hide_latency`). Traffic: read n, write n elements (`labkernels.traffic.copy`).

It teaches the machinery alone: descriptors, `mbarrier.expect` (bytes the barrier waits for), waiting on
a phase's parity, and `tma.store_wait` (stores complete in order, in groups). Hopper GPUs only (sm_90);
Gluon kernels do not run under the Triton interpreter. Registered as `labkernels::ch08_tma_copy`.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from labkernels.ch08_hopper import models
from labkernels.ch08_hopper.device import check_hopper, gl_dtype

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FALLBACK = "torch.Tensor.copy_ (or chapter 03's Triton kernels, which run on any GPU and on the CPU lane)"


def reference(x: torch.Tensor) -> torch.Tensor:
    return x.clone()  # read n, write n


@gluon.jit
def _tma_copy_kernel(in_desc, out_desc, STAGES: gl.constexpr):
    BLOCK_ROWS: gl.constexpr = in_desc.block_type.shape[0]
    BLOCK_COLS: gl.constexpr = in_desc.block_type.shape[1]
    row = gl.program_id(0) * BLOCK_ROWS
    steps = gl.cdiv(in_desc.shape[1], BLOCK_COLS)

    # A ring of STAGES tiles in shared memory, and one mbarrier per tile that completes when its load lands.
    bufs = gl.allocate_shared_memory(in_desc.dtype, [STAGES, BLOCK_ROWS, BLOCK_COLS], in_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)

    # Prologue: request the first STAGES - 1 tiles.
    for j in gl.static_range(STAGES - 1):
        if j < steps:
            mbarrier.expect(bars.index(j), in_desc.block_type.nbytes)  # complete when these bytes land
            tma.async_copy_global_to_shared(in_desc, [row, j * BLOCK_COLS], bars.index(j), bufs.index(j))

    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(bars.index(slot), (i // STAGES) & 1)  # the slot's (i // STAGES)-th load has landed
        tma.async_copy_shared_to_global(out_desc, [row, i * BLOCK_COLS], bufs.index(slot))  # write the tile
        # Stores complete in order: at most this one pending means the previous one has read its buffer,
        # which is the buffer the next load goes into.
        tma.store_wait(pendings=1)
        ahead = i + STAGES - 1
        if ahead < steps:
            bar = bars.index(ahead % STAGES)
            mbarrier.expect(bar, in_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                in_desc, [row, ahead * BLOCK_COLS], bar, bufs.index(ahead % STAGES)
            )

    tma.store_wait(pendings=0)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))


def check_copy(x: torch.Tensor, stages: int, block_rows: int, block_cols: int) -> None:
    """Refuse what the TMA copy cannot take, naming the problem: tensor and tiles first, then the GPU."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tma_copy: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"tma_copy: x has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.dim() != 2:
        raise ValueError(f"tma_copy: x must be 2-D, got shape {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"tma_copy: x must be contiguous, got strides {x.stride()}")
    if x.shape[1] * x.element_size() % 16 or x.data_ptr() % 16:
        raise ValueError(
            f"tma_copy: a TMA descriptor needs rows 16-byte aligned; x has {x.shape[1]} columns of "
            f"{x.element_size()} bytes, starting at an address that is {x.data_ptr() % 16} mod 16"
        )
    if max(x.shape) > 2**31 - 1:
        raise ValueError(f"tma_copy: a descriptor's dimensions are int32, x is {tuple(x.shape)}")
    if not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 8:
        raise ValueError(f"tma_copy: stages must be an int in [2, 8], got {stages!r}")
    for name, value in (("block_rows", block_rows), ("block_cols", block_cols)):
        if not isinstance(value, int) or not 1 <= value <= 256 or value & (value - 1):
            raise ValueError(
                f"tma_copy: {name} must be a power of two in [1, 256] (a TMA box), got {value!r}"
            )
    smem = models.copy_smem_bytes(block_rows, block_cols, stages, x.element_size())
    if smem > models.SMEM_PER_BLOCK:
        raise ValueError(
            f"tma_copy: {stages} stages of {block_rows} x {block_cols} {x.dtype} need {smem} bytes of shared "
            f"memory, more than a program's {models.SMEM_PER_BLOCK}: use fewer stages or smaller blocks"
        )
    check_hopper("tma_copy", x, FALLBACK)


def _tma_copy(x: torch.Tensor, stages: int, block_rows: int, block_cols: int) -> torch.Tensor:
    check_copy(x, stages, block_rows, block_cols)
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    block = [block_rows, block_cols]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype(x.dtype))
    in_desc = TensorDescriptor.from_tensor(x, block, layout)
    out_desc = TensorDescriptor.from_tensor(out, block, layout)
    # One warp is plenty: the TMA unit moves the data, the warp only issues copies and waits.
    _tma_copy_kernel[(triton.cdiv(x.shape[0], block_rows),)](in_desc, out_desc, stages, num_warps=1)
    return out


@torch.library.custom_op(
    "labkernels::ch08_tma_copy",
    mutates_args=(),
    schema="(Tensor x, int stages=4, int block_rows=64, int block_cols=128) -> Tensor",
)
def _tma_copy_op(x, stages=4, block_rows=64, block_cols=128):
    return _tma_copy(x, stages, block_rows, block_cols)


@_tma_copy_op.register_fake
def _(x, stages=4, block_rows=64, block_cols=128):
    return torch.empty_like(x)


_tma_copy_op.register_autograd(lambda ctx, grad: (grad, None, None, None))  # a copy passes its gradient on


def tma_copy(
    x: torch.Tensor, *, stages: int = 4, block_rows: int = 64, block_cols: int = 128
) -> torch.Tensor:
    """A copy of the 2-D contiguous tensor `x` through shared memory with the TMA unit, `stages` tiles of
    block_rows x block_cols in flight per program. Hopper (sm_90) GPUs only. Differentiable."""
    try:
        wants_grad = x.requires_grad and torch.is_grad_enabled()
    except AttributeError:  # not a tensor: the checks say so
        wants_grad = False
    if wants_grad or torch.compiler.is_compiling():
        return torch.ops.labkernels.ch08_tma_copy(x, stages, block_rows, block_cols)
    return _tma_copy(x, stages, block_rows, block_cols)
