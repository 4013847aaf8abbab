"""Vector add: the first Triton kernel, and the block programming model in twelve lines.

A CUDA kernel is written for one *thread*; a Triton kernel is written for one *program*, which owns a whole
block of BLOCK_SIZE elements. `tl.program_id(0)` says which block, `tl.arange(0, BLOCK_SIZE)` gives the
block's lanes, and a mask switches off the lanes past the end of the data. Triton turns contiguous offsets
into wide, coalesced memory transactions by itself.

Traffic: read 2n elements, write n (`labkernels.traffic.add`). One add per element: ~0.08 FLOP/byte in
fp32, far left of any GPU's ridge point, so the best possible time is bytes / copy bandwidth.

Offsets are int32 unless a launch needs more: `pid * BLOCK_SIZE` wraps past 2^31 - 1 elements, so a tensor
that large gets the INDEX_64 variant of the kernel (a constexpr: the common case compiles without it).

Autograd and torch.compile: the op is registered with torch.library (`labkernels::ch03_vector_add`, with a
fake and a backward). A plain call (no input requires grad, not compiling) launches the kernel directly, so
the registration costs the common case nothing.

This module also holds the checks every launcher of the chapter shares (dtypes, block sizes, warps, `out`).
"""

from __future__ import annotations

import operator

import torch
import triton
import triton.language as tl

from labkernels.lane import LANE, on_gpu, require_device

# The interpreter pays ~1-2 ms per program instance whatever its size: big blocks on the CPU lane.
DEFAULT_BLOCK_SIZE = 1024 if LANE == "gpu" else 16384
ELEMENTWISE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BF16_ON_CPU = "bfloat16 is computed wrongly by the Triton interpreter; use float16 or float32 on the CPU lane"
INT32_MAX = 2**31 - 1
# The most elements one Triton block (tl.arange, a tile) may hold.
MAX_BLOCK_NUMEL = int(getattr(tl, "TRITON_MAX_TENSOR_NUMEL", 1048576))


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y  # read 2n, write n


@triton.jit
def _vector_add_kernel(
    x_ptr,  # *Pointer* to the first input
    y_ptr,  # *Pointer* to the second input
    out_ptr,  # *Pointer* to the output
    n_elements,  # how many elements in each
    BLOCK_SIZE: tl.constexpr,  # elements per program; a compile-time constant (a power of two)
    INDEX_64: tl.constexpr,  # offsets reach past 2^31 - 1: compute them in int64
):
    pid = tl.program_id(axis=0)  # which block this program owns
    if INDEX_64:
        pid = pid.to(tl.int64)  # else pid * BLOCK_SIZE wraps to a negative int32 past 2^31 elements
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # contiguous: one coalesced access per warp
    mask = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


# --- checks shared by the chapter's launchers ---------------------------------------------------------------


def needs_int64(n_elements: int, block_size: int) -> bool:
    """True when the offsets of a flat launch (up to cdiv(n, block) * block - 1) do not fit int32."""
    return n_elements + block_size > INT32_MAX


def check_count(fn: str, name: str, value, *, maximum: int | None = None, power_of_two: bool = True) -> int:
    """A launch parameter that must be a positive int (a power of two, at most `maximum`), not a bool or
    a float: Triton would otherwise fail deep inside its compiler, or silently truncate."""
    if type(value) is int and 0 < value <= (maximum or value) and not (power_of_two and value & (value - 1)):
        return value  # the usual case, decided in a few comparisons
    if isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be an int, got the bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{fn}: {name} must be an int, got {type(value).__name__} {value!r}") from None
    if value < 1 or (power_of_two and value & (value - 1)):
        raise ValueError(f"{fn}: {name} must be a positive power of two, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{fn}: {name} is {value}, above the limit of {maximum}")
    return value


def check_block_size(fn: str, block_size, name: str = "block_size") -> int:
    return check_count(fn, name, block_size, maximum=MAX_BLOCK_NUMEL)


def check_num_warps(fn: str, num_warps) -> int:
    return check_count(fn, "num_warps", num_warps, maximum=32)  # 32 warps = 1024 threads, the CUDA limit


def grad_wanted(*tensors) -> bool:
    """Autograd would record this call: grad mode is on and an input requires grad (None and non-tensors
    do not; the checks name those)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def check_out_overlap(fn: str, out: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
    """Refuse an `out` that partly overlaps an input, as torch does (`at::assert_no_partial_overlap`): blocks
    run in any order, so one program would overwrite elements another has still to read. The same buffer
    exactly (out is x) is fine for an elementwise kernel: each element is read before it is written, by the
    same program. All tensors here are contiguous, so their bytes are one interval each (ch02's `may_overlap`
    handles any view)."""
    start = out.data_ptr()
    end = start + out.numel() * out.element_size()
    for name, t in inputs.items():
        t_start = t.data_ptr()
        if t_start == start:
            continue  # exact aliasing: same shape, dtype and contiguity were checked
        if t_start < end and start < t_start + t.numel() * t.element_size():
            raise ValueError(
                f"{fn}: out partially overlaps {name} in memory (bytes {start:#x}..{end:#x} and "
                f"{t_start:#x}..): blocks would overwrite elements that others still read; pass a separate "
                f"out, or {name} itself for in place"
            )


def check_elementwise(name: str, *tensors: torch.Tensor, out: torch.Tensor | None = None) -> None:
    """The checks every elementwise launcher of this chapter makes, each with a message naming the problem."""
    labels = "xyzw"
    first = tensors[0]
    for label, t in zip(labels, tensors, strict=False):
        require_device(t, f"{name}: {label}")
        if t.dtype not in ELEMENTWISE_DTYPES:
            raise TypeError(f"{name}: {label} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dtype != first.dtype:
            raise TypeError(f"{name}: inputs must share one dtype, got {first.dtype} and {t.dtype}")
        if t.shape != first.shape:
            raise ValueError(f"{name}: shapes differ, {tuple(first.shape)} vs {tuple(t.shape)}")
        if t is not first and t.get_device() != first.get_device():  # e.g. cuda:1 and cuda:0
            raise ValueError(f"{name}: {label} is on {t.device}, x on {first.device}")
        if not t.is_contiguous():
            raise ValueError(
                f"{name}: {label} is not contiguous (strides {t.stride()}); this kernel walks flat memory, "
                "so pass t.contiguous() (a copy)"
            )
    if first.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"{name}: {BF16_ON_CPU}")
    if out is not None:
        require_device(out, f"{name}: out")
        if out.dtype != first.dtype or out.shape != first.shape or out.device != first.device:
            raise ValueError(
                f"{name}: out must be {first.dtype} {tuple(first.shape)} on {first.device}, got {out.dtype} "
                f"{tuple(out.shape)} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError(f"{name}: out is not contiguous (strides {out.stride()})")
        if grad_wanted(*tensors):
            raise RuntimeError(
                f"{name}: out= does not support autograd (as in torch), but an input requires grad; "
                "call it without out"
            )
        check_out_overlap(name, out, dict(zip(labels, tensors, strict=False)))


# --- the launcher -------------------------------------------------------------------------------------------


def _vector_add(x, y, out, block_size, num_warps) -> torch.Tensor:
    """Check, allocate, launch: the kernel's path without autograd."""
    check_elementwise("vector_add", x, y, out=out)
    block_size = DEFAULT_BLOCK_SIZE if block_size is None else check_block_size("vector_add", block_size)
    num_warps = check_num_warps("vector_add", num_warps)
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if n == 0:
        return out  # nothing to launch: a grid of zero programs is an error in Triton
    grid = (triton.cdiv(n, block_size),)
    index_64 = needs_int64(n, block_size)
    _vector_add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, INDEX_64=index_64, num_warps=num_warps)
    return out


@torch.library.custom_op(
    "labkernels::ch03_vector_add",
    mutates_args=(),
    schema="(Tensor x, Tensor y, int? block_size=None, int num_warps=4) -> Tensor",
)
def _vector_add_op(x, y, block_size=None, num_warps=4):
    return _vector_add(x, y, None, block_size, num_warps)


@_vector_add_op.register_fake
def _(x, y, block_size=None, num_warps=4):
    check_elementwise("vector_add", x, y)
    return torch.empty_like(x)


def _vector_add_backward(ctx, grad):
    return grad, grad, None, None  # d(x + y)/dx = d(x + y)/dy = 1


_vector_add_op.register_autograd(_vector_add_backward)


def vector_add(
    x: torch.Tensor,
    y: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    block_size: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """x + y with one Triton program per BLOCK_SIZE elements. `out` may be given (x or y itself for in
    place; a partial overlap is refused). Differentiable, and compiles with torch.compile (without `out`)."""
    try:
        wants_grad = (x.requires_grad or y.requires_grad) and torch.is_grad_enabled()
    except AttributeError:  # not tensors: the checks say so
        wants_grad = False
    if out is None and (wants_grad or torch.compiler.is_compiling()):
        return torch.ops.labkernels.ch03_vector_add(x, y, block_size, num_warps)
    return _vector_add(x, y, out, block_size, num_warps)
