"""Tiled matmul with `tl.dot`: C = A @ B (+ bias, then an optional activation), fp32 accumulation.

Each program computes one BLOCK_SIZE_M x BLOCK_SIZE_N tile of C. It walks K in steps of BLOCK_SIZE_K,
loading a tile of A and a tile of B per step (masked at the ragged end of K) and accumulating their product
in fp32 registers; `tl.dot` maps to the tensor cores. A tile of A is reused BLOCK_SIZE_N times and a tile
of B BLOCK_SIZE_M times from on-chip memory: that reuse is what lifts matmul from memory-bound to
compute-bound. At best A and B are read once and C written once (`labkernels.traffic.matmul`); 2MNK FLOPs.

Grouped ordering: programs are numbered so that GROUP_SIZE_M consecutive programs share the same columns
of B and walk down a few rows of tiles, instead of sweeping a full row of tiles. Tiles loaded by one
program are then still in L2 when its neighbours need them.

Rows of A and columns of B past the matrix edge are wrapped (`% M`, `% N`) instead of masked: they read
valid memory, compute a few rows nobody stores, and keep the loads unmasked and fast; the store is masked.

The epilogue (bias add, ReLU or GELU) is applied to the fp32 accumulator before the single store, so a
linear layer's activation costs no extra HBM traffic (chapter 05 measures it).
fp32 inputs take `input_precision`: "ieee" (exact fp32 products, no tensor cores) or "tf32" (inputs rounded
to a 10-bit mantissa, tensor cores: several times faster, ~1e-3 relative error).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels.ch03_triton.vector_add import BF16_ON_CPU
from labkernels.lane import LANE, on_gpu, require_device
from labkernels.timing import autotune_bench

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATIONS = (None, "relu", "gelu")
SHARED_MEMORY_BYTES = 227 * 1024  # an H100/H200 program's shared-memory limit: larger configs are pruned


def _config(m: int, n: int, k: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    meta = {"BLOCK_SIZE_M": m, "BLOCK_SIZE_N": n, "BLOCK_SIZE_K": k, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# Hopper configs, after Triton's matmul tutorial and an H200 sweep at 4096^3: big tiles for big squares
# (the `config` column of the ch03_matmul reference shows which one the autotuner picked per shape: 128x256x64
# for bf16, 256x128x32 for fp32, whose fp32 tiles fit shared memory at 4 stages), smaller ones so that skinny
# shapes still make enough tiles to fill 132 SMs.
GPU_CONFIGS = [
    _config(128, 256, 64, stages=4, warps=8),
    _config(128, 256, 64, stages=3, warps=8),
    _config(256, 128, 32, stages=4, warps=8),
    _config(256, 128, 64, stages=3, warps=8),
    _config(128, 128, 64, stages=4, warps=8),
    _config(128, 128, 64, stages=4, warps=4),
    _config(64, 256, 32, stages=4, warps=4),
    _config(128, 64, 64, stages=4, warps=4),
    _config(64, 128, 64, stages=4, warps=4),
]
# Under the interpreter a config costs per program: two big tiles, so autotuning is quick to watch.
CPU_CONFIGS = [
    _config(32, 32, 32, stages=1, warps=4, group=4),
    _config(64, 64, 32, stages=1, warps=4, group=4),
]


def reference(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """In fp64 (a higher-precision reference for the tests), returned in fp64."""
    c = a.double() @ b.double()  # read MK + KN, write MN
    if bias is not None:
        c = c + bias.double()
    if activation == "relu":
        c = torch.relu(c)
    elif activation == "gelu":
        c = torch.nn.functional.gelu(c)
    return c


def _prune_by_shared_memory(configs, named_args, **kwargs):
    """Drop configs whose pipelined tiles (stages x (BM*BK + BK*BN) elements) exceed shared memory."""
    a = named_args.get("a_ptr", kwargs.get("a_ptr"))
    es = a.element_size() if a is not None else 4

    def shared_bytes(c):
        m, n, k = c.kwargs["BLOCK_SIZE_M"], c.kwargs["BLOCK_SIZE_N"], c.kwargs["BLOCK_SIZE_K"]
        return c.num_stages * (m * k + k * n) * es

    fits = [c for c in configs if shared_bytes(c) <= SHARED_MEMORY_BYTES]
    return fits or [min(configs, key=shared_bytes)]


@triton.jit
def _matmul_tiles(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,  # None, "relu" or "gelu"
    INPUT_PRECISION: tl.constexpr,  # fp32 inputs only: "ieee" or "tf32"
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
    EVEN_K: tl.constexpr,  # K is a multiple of BLOCK_SIZE_K: no step is ragged, the loads need no mask
):
    # Grouped ordering: program ids run down GROUP_SIZE_M rows of tiles before moving one column right.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)  # the last group may be short
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M  # wrapped: always valid rows
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak  # (BM, BK)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn  # (BK, BN)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)  # read BM x BK
            b = tl.load(b_ptrs)  # read BK x BN
        else:  # the last step is ragged: masked lanes load 0 and add nothing
            k_remaining = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # Epilogue on the fp32 accumulator, before the one store of C.
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_bn).to(tl.float32)[None, :]
    if ACTIVATION == "relu":
        acc = tl.maximum(acc, 0.0)
    elif ACTIVATION == "gelu":
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))  # exact (erf) GELU, as torch's default
    c = acc.to(c_ptr.dtype.element_ty)

    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))  # write MN


def _even_k(args: dict) -> bool:
    return args["K"] % args["BLOCK_SIZE_K"] == 0


# The autotuned kernel: the same tiles, with EVEN_K derived from the config and the config chosen per key by
# timing every config on the first call.
_matmul_kernel = triton.autotune(
    configs=GPU_CONFIGS if LANE == "gpu" else CPU_CONFIGS,
    key=["M", "N", "K", "HAS_BIAS", "ACTIVATION", "INPUT_PRECISION"],  # tensor dtypes are added by triton
    prune_configs_by={"early_config_prune": _prune_by_shared_memory},
    do_bench=autotune_bench,
)(triton.heuristics({"EVEN_K": _even_k})(_matmul_tiles))


# Per call, the autotuner rebuilds its key and three dicts of arguments before it launches: host time that a
# 1024^3 matmul, a few microseconds on an H200, cannot hide. So matmul() lets the autotuner choose once per
# key, keeps the winner here with its grid, and from then on launches `_matmul_tiles` directly.
class _Tuned(NamedTuple):
    config: triton.Config
    grid: tuple[int]
    meta: dict  # constexprs and launch options: the config's, the call's options, EVEN_K


_tuned_launches: dict[tuple, _Tuned] = {}


def _check(a, b, bias, activation, input_precision) -> None:
    require_device(a, "matmul: a")
    require_device(b, "matmul: b")
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in DTYPES:
            raise TypeError(f"matmul: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dim() != 2:
            raise ValueError(f"matmul: {name} must be 2-D, got shape {tuple(t.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"matmul: {BF16_ON_CPU}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: inner dimensions differ, a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError(f"matmul: empty operand, a is {tuple(a.shape)} and b is {tuple(b.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"matmul: activation must be one of {ACTIVATIONS}, got {activation!r}")
    if input_precision not in ("ieee", "tf32"):
        raise ValueError(f"matmul: input_precision must be 'ieee' or 'tf32', got {input_precision!r}")
    if bias is not None:
        require_device(bias, "matmul: bias")
        if bias.shape != (b.shape[1],):
            raise ValueError(f"matmul: bias must have shape ({b.shape[1]},), got {tuple(bias.shape)}")
        if bias.dtype not in DTYPES or (bias.dtype == torch.bfloat16 and not on_gpu()):
            raise TypeError(f"matmul: bias has unsupported dtype {bias.dtype}")


def _prepare(a, b, bias, activation, input_precision) -> tuple[torch.Tensor, tuple, dict, tuple]:
    """Checks the operands, allocates C and lays out the kernel's arguments: (c, args, options, key)."""
    _check(a, b, bias, activation, input_precision)
    (M, K), N = a.shape, b.shape[1]
    bias = bias.contiguous() if bias is not None else None  # N elements: a negligible copy if strided
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    precision = input_precision if a.dtype == torch.float32 else "tf32"  # ignored for 16-bit inputs
    args = (a, b, c, c if bias is None else bias, M, N, K, *a.stride(), *b.stride(), *c.stride())
    options = {"HAS_BIAS": bias is not None, "ACTIVATION": activation, "INPUT_PRECISION": precision}
    key = (M, N, K, a.dtype, args[3].dtype, *options.values())  # what the autotuner keys on, dtypes included
    return c, args, options, key


def _tune(key: tuple, args: tuple, options: dict) -> None:
    """Run the autotuner for this key: it times every config, keeps the fastest and launches it once."""
    M, N, K = args[4:7]
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)
    _matmul_kernel[grid](*args, **options)
    config = _matmul_kernel.best_config
    meta = config.all_kwargs() | options
    meta["EVEN_K"] = _even_k({"K": K, **meta})
    _tuned_launches[key] = _Tuned(config, grid(meta), meta)


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    input_precision: str = "ieee",
) -> torch.Tensor:
    """activation(a @ b + bias) for a (M, K) and b (K, N) of one dtype; any strides. Result: (M, N) in a's
    dtype, accumulated in fp32. `input_precision` ("ieee" or "tf32") applies to float32 inputs. The first
    call for a shape and dtype autotunes (`tuned_config` shows the winner)."""
    c, args, options, key = _prepare(a, b, bias, activation, input_precision)
    tuned = _tuned_launches.get(key)
    if tuned is None:
        _tune(key, args, options)  # the autotuner's own launch of the winner computes c
    else:
        _matmul_tiles[tuned.grid](*args, **tuned.meta)  # read MK + KN at best, write MN
    return c


def tuned_config(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    input_precision: str = "ieee",
) -> triton.Config:
    """The config that `matmul(same arguments)` launches; autotunes first if this key has not been seen."""
    _, args, options, key = _prepare(a, b, bias, activation, input_precision)
    if key not in _tuned_launches:
        _tune(key, args, options)
    return _tuned_launches[key].config
