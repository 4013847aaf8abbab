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

import functools
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
DEFAULT_CONFIG = "128x256x64_s3_w8"  # the timeline's and the big squares' config
AUTO = "auto"  # gemm's default: `choose_config` picks by the output's tile count
# FP8 (e4m3) operands, bf16 output: K tiles of 128 bytes as in 16 bits, and one byte a value.
FP8_CONFIGS = {"128x256x128_s3_w8": GemmConfig(128, 256, 128, stages=3, num_warps=8)}
FP8_DEFAULT = "128x256x128_s3_w8"
FP8_FALLBACK = "torch._scaled_mm (cuBLAS's FP8 GEMM)"


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)  # fp32 products and sums, rounded once: read MK + KN, write MN


# The timeline (`gemm_timeline`): program 0 writes the SM's cycle counter at each of these events into row
# EVENT of an int64 (EVENTS, TIMELINE_SLOTS) buffer, column = the load or K step (tiles, for the epilogue).
EVENTS = ("producer_wait", "producer_issue", "consumer_wait", "consumer_mma", "consumer_release",
          "epilogue_start", "epilogue_end", "clocks")  # fmt: skip
TIMELINE_SLOTS = 512


@gluon.jit
def _clock():
    """The SM's cycle counter (%clock64): one counter for every warp of the SM, so the partitions' events
    line up."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _globaltimer():
    """Nanoseconds (%globaltimer), to turn cycles into time: read with the clock at the start and the end."""
    return gl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
    )


@gluon.jit
def _mark(timeline_ptr, event: gl.constexpr, slot, pid, SLOTS: gl.constexpr):
    """Program 0 writes the clock into (event, slot) of the timeline."""
    gl.store(timeline_ptr + event * SLOTS + slot, _clock(), mask=(pid == 0) & (slot < SLOTS))


@gluon.jit
def _grouped_tile(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """models.grouped_tile, on the device."""
    tiles_per_group = GROUP_M * num_n
    first_m = (tile // tiles_per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % tiles_per_group) % rows, (tile % tiles_per_group) // rows


@gluon.jit
def _producer(
    a_desc, b_desc, a_bufs, b_bufs, ready_bars, empty_bars, pid, num_programs, timeline_ptr,
    GROUP_M: gl.constexpr, TIMELINE: gl.constexpr, SLOTS: gl.constexpr, B_KMAJOR: gl.constexpr,
):  # fmt: skip
    """One warp: fills the ring with TMA loads, one A tile and one B tile per slot. B_KMAJOR: B is given as
    B^T (N, K) row-major, the layout fp8 wgmma needs (and torch._scaled_mm's column-major B)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0] if B_KMAJOR else b_desc.block_type.shape[1]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    num_m = gl.cdiv(a_desc.shape[0], BLOCK_M)
    num_n = gl.cdiv(b_desc.shape[0] if B_KMAJOR else b_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0  # loads issued by this program so far, over all its tiles: the ring position
    for tile in range(pid, num_m * num_n, num_programs):
        pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
        for ks in range(k_steps):
            slot = it % STAGES
            if TIMELINE:
                _mark(timeline_ptr, 0, it, pid, SLOTS)
            # models.empty_parity: the first lap passes at once, later laps wait for the consumer's release
            mbarrier.wait(empty_bars.index(slot), ((it // STAGES) & 1) ^ 1)
            if TIMELINE:
                _mark(timeline_ptr, 1, it, pid, SLOTS)
            ready = ready_bars.index(slot)
            mbarrier.expect(ready, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(
                a_desc, [pid_m * BLOCK_M, ks * BLOCK_K], ready, a_bufs.index(slot)
            )
            if B_KMAJOR:
                tma.async_copy_global_to_shared(
                    b_desc, [pid_n * BLOCK_N, ks * BLOCK_K], ready, b_bufs.index(slot)
                )
            else:
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
    timeline_ptr,
    scale_a_ptr,
    scale_b_ptr,
    GROUP_M: gl.constexpr,
    TIMELINE: gl.constexpr,
    SLOTS: gl.constexpr,
    B_KMAJOR: gl.constexpr,
    SCALED: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The kernel's warps: wgmma from the ring into fp32 registers, then the epilogue via shared memory.
    SCALED: the product is multiplied by the per-tensor scales *scale_a_ptr * *scale_b_ptr (fp8)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    INSTR_K: gl.constexpr = 256 // a_bufs.dtype.primitive_bitwidth  # 32 bytes of K an instruction
    # wgmma's accumulator layout: warps stacked along M (16 rows each), one instruction spanning BLOCK_N.
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, INSTR_K]
    )
    scale = 1.0
    if SCALED:
        scale = gl.load(scale_a_ptr) * gl.load(scale_b_ptr)  # read 8 bytes
    num_m = gl.cdiv(c_desc.shape[0], BLOCK_M)
    num_n = gl.cdiv(c_desc.shape[1], BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    it = 0
    done = 0  # tiles finished by this program
    if TIMELINE:
        _mark(timeline_ptr, 7, 0, pid, SLOTS)  # cycles and nanoseconds at the start
        gl.store(timeline_ptr + 7 * SLOTS + 1, _globaltimer(), mask=pid == 0)
    for tile in range(pid, num_m * num_n, num_programs):
        pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=acc_layout)
        for ks in range(k_steps):
            slot = it % STAGES
            if TIMELINE:
                _mark(timeline_ptr, 2, it, pid, SLOTS)
            mbarrier.wait(ready_bars.index(slot), (it // STAGES) & 1)  # models.ready_parity
            if TIMELINE:
                _mark(timeline_ptr, 3, it, pid, SLOTS)
            if B_KMAJOR:
                b_tile = b_bufs.index(slot).permute((1, 0))  # the (BLOCK_K, BLOCK_N) view of a K-major tile
            else:
                b_tile = b_bufs.index(slot)
            acc = warpgroup_mma(a_bufs.index(slot), b_tile, acc, is_async=True)
            # One MMA stays in flight; the one before it has finished reading its slot: release that slot.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES), pred=ks > 0)
            if TIMELINE:
                _mark(timeline_ptr, 4, it, pid, SLOTS)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty_bars.index((it + STAGES - 1) % STAGES))  # the tile's last slot
        if TIMELINE:
            _mark(timeline_ptr, 5, done, pid, SLOTS)
        # Epilogue: registers -> shared memory -> TMA store (clipped at the matrix edges). write BM x BN
        tma.store_wait(pendings=0)  # the previous tile's store has finished reading c_smem
        if SCALED:
            acc = acc * scale
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()  # order the generic-proxy store before the async-proxy TMA read of c_smem
        tma.async_copy_shared_to_global(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_smem)
        if TIMELINE:
            _mark(timeline_ptr, 6, done, pid, SLOTS)
        done += 1
    tma.store_wait(pendings=0)
    if TIMELINE:
        _mark(timeline_ptr, 7, 2, pid, SLOTS)  # cycles and nanoseconds at the end
        gl.store(timeline_ptr + 7 * SLOTS + 3, _globaltimer(), mask=pid == 0)


@gluon.jit
def _gemm_ws_kernel(
    a_desc, b_desc, c_desc, timeline_ptr, scale_a_ptr, scale_b_ptr, STAGES: gl.constexpr,
    GROUP_M: gl.constexpr, TIMELINE: gl.constexpr, SLOTS: gl.constexpr, B_KMAJOR: gl.constexpr,
    SCALED: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
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
                    timeline_ptr,
                    scale_a_ptr,
                    scale_b_ptr,
                    GROUP_M,
                    TIMELINE,
                    SLOTS,
                    B_KMAJOR,
                    SCALED,
                    num_warps,
                ),
            ),
            (
                _producer,
                (
                    a_desc,
                    b_desc,
                    a_bufs,
                    b_bufs,
                    ready_bars,
                    empty_bars,
                    pid,
                    num_programs,
                    timeline_ptr,
                    GROUP_M,
                    TIMELINE,
                    SLOTS,
                    B_KMAJOR,
                ),
            ),  # fmt: skip
        ],
        [1],  # the producer's warps
        [24],  # and its registers per thread: it holds only scalars
    )


def choose_config(m: int, n: int, sms: int) -> str:
    """The config `gemm` runs when given "auto": the 128 x 256 tile when it gives every SM at least two tiles,
    else the 128 x 128 one. With fewer, the big tile leaves SMs idle (`models.wave_efficiency`). On the H200
    (ch08_gemm.csv, graph timings) the small tile was faster, or within 2%, at every shape of chapter 04's
    set with under two big tiles an SM, and the big one as fast or faster at every shape with more (3.6 to
    15.5 an SM)."""
    big = CONFIGS["128x256x64_s3_w8"]
    tiles = -(-m // big.block_m) * -(-n // big.block_n)
    return "128x256x64_s3_w8" if tiles >= 2 * sms else "128x128x64_s4_w4"


def check_gemm(a: torch.Tensor, b: torch.Tensor, config: str = AUTO) -> None:
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
    if config != AUTO and config not in CONFIGS:
        raise ValueError(f"gemm: config must be {AUTO!r} or one of {sorted(CONFIGS)}, got {config!r}")
    if a.device != b.device:
        raise ValueError(f"gemm: a is on {a.device} but b is on {b.device}")
    check_hopper("gemm", a, FALLBACK)


@functools.cache
def _shared_layout(block: tuple[int, ...], dtype: torch.dtype):
    # built once per (block, dtype): building it took a fifth of a small GEMM's host time on the H200
    return gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(dtype))


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, block, _shared_layout(tuple(block), t.dtype))


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _launch(a_desc, b_desc, c_desc, cfg: GemmConfig, tiles: int, device, *, timeline=None, scales=None,
            b_kmajor: bool = False) -> None:  # fmt: skip
    """The persistent kernel over `tiles` output tiles: one program per SM, each looping over tiles."""
    sms = _sm_count(device)
    unused = c_desc.base  # a pointer the kernel never reads when its switch is off
    scale_a, scale_b = scales if scales is not None else (unused, unused)
    _gemm_ws_kernel[(min(sms, tiles),)](
        a_desc, b_desc, c_desc, timeline if timeline is not None else unused, scale_a, scale_b, cfg.stages,
        cfg.group_m, TIMELINE=timeline is not None, SLOTS=TIMELINE_SLOTS, B_KMAJOR=b_kmajor,
        SCALED=scales is not None, num_warps=cfg.num_warps,
    )  # fmt: skip


def _gemm(
    a: torch.Tensor, b: torch.Tensor, config: str, timeline: torch.Tensor | None = None
) -> torch.Tensor:
    check_gemm(a, b, config)
    (m, k), n = a.shape, b.shape[1]
    if config == AUTO:
        config = choose_config(m, n, _sm_count(a.device))
    cfg = CONFIGS[config]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=a.dtype, device=a.device)  # an empty sum is zero
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    a_desc = _descriptor(a, [cfg.block_m, cfg.block_k])
    b_desc = _descriptor(b, [cfg.block_k, cfg.block_n])
    c_desc = _descriptor(c, [cfg.block_m, cfg.block_n])
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    _launch(a_desc, b_desc, c_desc, cfg, tiles, a.device, timeline=timeline)
    return c


def check_gemm_fp8(a, b_t, scale_a, scale_b, config: str = FP8_DEFAULT) -> None:
    """Refuse what the FP8 kernel cannot take, naming the problem: operands, scales, then the GPU."""
    for name, t in (("a", a), ("b_t", b_t)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm_fp8: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float8_e4m3fn:
            raise TypeError(f"gemm_fp8: {name} has dtype {t.dtype}; this kernel takes torch.float8_e4m3fn")
        if t.dim() != 2 or not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(
                f"gemm_fp8: {name} must be 2-D, contiguous and 16-byte aligned, got shape {tuple(t.shape)}, "
                f"strides {t.stride()}"
            )
    if a.shape[1] != b_t.shape[1]:
        raise ValueError(
            f"gemm_fp8: a is (M, K) = {tuple(a.shape)} and b_t is (N, K) = {tuple(b_t.shape)}: K differs"
        )
    if a.shape[1] % 16 or b_t.shape[0] % 8:
        raise ValueError(
            f"gemm_fp8: K = {a.shape[1]} must be a multiple of 16 and N = {b_t.shape[0]} of 8 (TMA rows of "
            "16 bytes, in fp8 and in the bf16 output)"
        )
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
            raise ValueError(f"gemm_fp8: {name} must be a one-element float32 tensor (a per-tensor scale)")
        if t.device != a.device:
            raise ValueError(f"gemm_fp8: {name} is on {t.device} but a is on {a.device}")
    if b_t.device != a.device:
        raise ValueError(f"gemm_fp8: a is on {a.device} but b_t is on {b_t.device}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (a, b_t, scale_a, scale_b)):
        raise RuntimeError("gemm_fp8: inputs require grad; this FP8 GEMM is inference only")
    if config not in FP8_CONFIGS:
        raise ValueError(f"gemm_fp8: config must be one of {sorted(FP8_CONFIGS)}, got {config!r}")
    check_hopper("gemm_fp8", a, FP8_FALLBACK)


def gemm_fp8(
    a: torch.Tensor,
    b_t: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    *,
    config: str = FP8_DEFAULT,
) -> torch.Tensor:
    """(a @ b_t^T) * scale_a * scale_b in bfloat16, for e4m3 a (M, K) and b_t (N, K) (B column-major, as
    torch._scaled_mm takes it) with one-element fp32 scales; fp32 accumulation. Hopper only; no autograd."""
    check_gemm_fp8(a, b_t, scale_a, scale_b, config)
    cfg = FP8_CONFIGS[config]
    (m, k), n = a.shape, b_t.shape[0]
    c = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    a_desc = _descriptor(a, [cfg.block_m, cfg.block_k])
    b_desc = _descriptor(b_t, [cfg.block_n, cfg.block_k])  # K-major: fp8 wgmma reads B this way only
    c_desc = _descriptor(c, [cfg.block_m, cfg.block_n])
    tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
    _launch(a_desc, b_desc, c_desc, cfg, tiles, a.device, scales=(scale_a, scale_b), b_kmajor=True)
    return c


def compile_sm90(
    config: str = DEFAULT_CONFIG, *, timeline: bool = False, fp8: bool = False, shape=(1024, 1024, 1024)
):
    """The kernel of `config` (of FP8_CONFIGS with `fp8`) compiled for Hopper on any machine, a CPU included
    (offline.compile_for_hopper: `.metadata.shared` is its shared memory, `.asm["ptx"]` its PTX); `timeline`
    compiles the recording in."""
    from labkernels.ch08_hopper.offline import compile_for_hopper, descriptor

    cfg = (FP8_CONFIGS if fp8 else CONFIGS)[config]
    m, n, k = shape
    operands = torch.float8_e4m3fn if fp8 else torch.bfloat16
    args = {
        "a_desc": descriptor(m, k, [cfg.block_m, cfg.block_k], operands),
        "b_desc": descriptor(n, k, [cfg.block_n, cfg.block_k], operands)
        if fp8
        else descriptor(k, n, [cfg.block_k, cfg.block_n], operands),
        "c_desc": descriptor(m, n, [cfg.block_m, cfg.block_n]),
        "timeline_ptr": torch.empty(len(EVENTS), dtype=torch.int64),
        "scale_a_ptr": torch.ones(1),
        "scale_b_ptr": torch.ones(1),
    }
    constexprs = {"STAGES": cfg.stages, "GROUP_M": cfg.group_m, "TIMELINE": timeline, "SLOTS": TIMELINE_SLOTS}
    constexprs |= {"B_KMAJOR": fp8, "SCALED": fp8, "num_warps": cfg.num_warps}
    return compile_for_hopper(_gemm_ws_kernel, args, constexprs, cfg.num_warps)


def gemm_timeline(a: torch.Tensor, b: torch.Tensor, *, config: str = DEFAULT_CONFIG) -> list[dict]:
    """Run the GEMM once with program 0 recording its clock at every wait, issue, release and epilogue
    (EVENTS); rows (event, index, cycle, ns), cycles counted from the program's start, ns from the cycles
    and the program's own nanosecond timer. Slots past TIMELINE_SLOTS are not recorded."""
    check_gemm(a, b, config)
    marks = torch.full((len(EVENTS), TIMELINE_SLOTS), -1, dtype=torch.int64, device=a.device)
    _gemm(a, b, config, timeline=marks)
    from labkernels.ch08_hopper.timeline import rows_from_marks

    return rows_from_marks(marks.cpu(), EVENTS)


@torch.library.custom_op(
    "labkernels::ch08_gemm",
    mutates_args=(),
    schema=f"(Tensor a, Tensor b, str config='{AUTO}') -> Tensor",
)
def _gemm_op(a, b, config=AUTO):
    return _gemm(a, b, config)


@_gemm_op.register_fake
def _(a, b, config=AUTO):
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


def gemm(a: torch.Tensor, b: torch.Tensor, *, config: str = AUTO) -> torch.Tensor:
    """a @ b for row-major float16/bfloat16 a (M, K) and b (K, N) with K and N multiples of 8, on a Hopper
    GPU; fp32 accumulation, result in a's dtype. `config` names an entry of CONFIGS, or "auto" for
    `choose_config`'s pick. Differentiable."""
    try:
        wants_grad = (a.requires_grad or b.requires_grad) and torch.is_grad_enabled()
    except AttributeError:  # not tensors: the checks say so
        wants_grad = False
    if wants_grad or torch.compiler.is_compiling():
        return torch.ops.labkernels.ch08_gemm(a, b, config)
    return _gemm(a, b, config)
