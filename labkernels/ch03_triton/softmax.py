"""Fused row softmax: one read and one write of the matrix, whatever the row length.

softmax(x)_ij = exp(x_ij - max_j x_ij) / sum_j exp(x_ij - max_j x_ij)  (subtracting the max avoids overflow)

Written as five torch ops (max, subtract, exp, sum, divide) the intermediates go through HBM: read 5MN + 2M,
write 3MN + 2M elements. One kernel that keeps a whole row in registers reads MN and writes MN
(`labkernels.traffic.softmax`), a ~4x saving, so a fused softmax should run at copy bandwidth.

The kernel teaches:
- a program owns whole rows: BLOCK_SIZE_N = next_power_of_2(n_cols), with the lanes past the row's end
  masked and loaded as -inf, so they add exp(-inf) = 0 to the sum; any row length works;
- narrow rows are packed BLOCK_SIZE_M to a tile, so each program still moves a few KB;
- 16-byte accesses for any row length whose rows start 16-byte aligned (VEC, below); `vectorize=False`
  shows what plain int arguments cost at a row length such as 5000;
- what a program holds, and what it computes, is what limits it: the row stays in registers from its load
  until the sum is known, so registers per thread decide how many programs share an SM (bytes in flight),
  and every element costs an exp on the SM's few special-function units. The output is exp(x - max) * (1/sum):
  each exp is computed once and kept, and one reciprocal per row replaces a division per element. The
  compiler, not the source, decides what is held: it widens a bf16 row to fp32 where it takes the max, so
  a bf16 row costs nearly as many registers as an fp32 one. `registers(x)` reads the count from the compiled
  kernel (GPU lane), and `make bench` records it per configuration (ch03_softmax_configs).
Programs either take one row block each (the default) or, `persistent=True`, loop over row blocks grid-stride
as in Triton's fused-softmax tutorial, with about as many programs as the SMs hold at once. On the H200 the
one-block-per-program schedule won at wide rows (`make bench` records the comparison: ch03_softmax_configs);
the loop also costs registers. One kernel: a constexpr PERSISTENT branch around one body (`_softmax_block`).
Compute is fp32 whatever the storage dtype; the result is stored in the input's dtype.

Rows holding inf or NaN come out as torch.softmax's do (a NaN or +inf in a row makes the whole row NaN:
x - max is inf - inf there). Offsets are int32 unless x or the output reaches past 2^31 - 1 elements: then
the INDEX_64 variant computes `row * stride` in int64 (a constexpr, so the common case compiles without
it). The op is registered with torch.library (`labkernels::ch03_softmax`, with a fake and a backward) for
autograd and torch.compile; a plain call launches the kernel directly.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton.vector_add import (
    BF16_ON_CPU,
    INT32_MAX,
    MAX_BLOCK_NUMEL,
    check_count,
    check_num_warps,
)
from labkernels.lane import LANE, on_gpu, require_device

MAX_COLS = 32768  # a row must fit one program's registers; longer rows need an online (looped) softmax
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CONTIGUOUS = torch.contiguous_format  # bound once: the known-shape path allocates with it on every call


def reference(x: torch.Tensor) -> torch.Tensor:
    """The naive composition: five kernels, read 5MN + 2M, write 3MN + 2M elements."""
    x_max = x.max(dim=1, keepdim=True).values  # read MN, write M
    z = x - x_max  # read MN + M, write MN
    num = torch.exp(z)  # read MN, write MN
    den = num.sum(dim=1, keepdim=True)  # read MN, write M
    return num / den  # read MN + M, write MN


@triton.jit
def _softmax_block(
    out_ptr,
    x_ptr,
    step,  # which block of BLOCK_SIZE_M rows
    n_rows,
    n_cols,
    stride_xm,
    stride_xn,
    stride_om,
    stride_on,
    BLOCK_SIZE_M: tl.constexpr,  # rows per block
    BLOCK_SIZE_N: tl.constexpr,  # next_power_of_2(n_cols)
    INDEX_64: tl.constexpr,  # row * stride may pass 2^31 - 1: compute offsets in int64
):
    cols = tl.arange(0, BLOCK_SIZE_N)
    if INDEX_64:
        step = tl.cast(step, tl.int64)  # then rows and rows * stride are int64 (step may be a plain int)
        cols = cols.to(tl.int64)  # a column-major x: cols * stride_xn can be as large
    col_mask = cols < n_cols
    rows = step * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    row_mask = rows < n_rows
    # Rows past the end re-read the last row (never stored): no -inf - -inf = NaN in dead lanes.
    safe_rows = tl.minimum(rows, n_rows - 1)
    x_ptrs = x_ptr + safe_rows[:, None] * stride_xm + cols[None, :] * stride_xn
    x = tl.load(x_ptrs, mask=col_mask[None, :], other=-float("inf"))  # read MN
    x_max = tl.max(x, axis=1).to(tl.float32)[:, None]  # exact in any dtype
    # exp(x - max) as exp2: the hardware's exponential is base 2. Padded lanes: exp2(-inf) = 0.
    num = tl.exp2((x.to(tl.float32) - x_max) * 1.4426950408889634)
    # One reciprocal per row and a multiply per element, not a division per element.
    out = num * (1.0 / tl.sum(num, axis=1))[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on
    mask = row_mask[:, None] & col_mask[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)  # write MN


@triton.jit
def _softmax_kernel(
    out_ptr,
    x_ptr,
    n_rows,
    n_col_vecs,  # the row length in whole VEC-element vectors
    x_row_vecs,  # x's row stride, in vectors
    stride_xn,
    out_row_vecs,  # out's row stride, in vectors
    stride_on,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    VEC: tl.constexpr,  # elements per 16-byte vector that every row length and row start is a multiple of
    PERSISTENT: tl.constexpr,  # loop over row blocks grid-stride, or one block per program
    NUM_STAGES: tl.constexpr,  # persistent: loads of the next rows in flight while this one is reduced
    INDEX_64: tl.constexpr,  # offsets past 2^31 - 1 elements: int64 arithmetic
):
    # Multiplying by the constexpr VEC lets the compiler prove what the launcher checked: rows start on a
    # 16-byte boundary and the mask is the same for all VEC lanes of a vector. It then emits 128-bit loads
    # and stores. Passed as plain ints, a row length such as 5000 (not a multiple of 16) would give
    # element-by-element 4-byte accesses, several times as many memory instructions for the same bytes.
    n_cols, stride_xm, stride_om = n_col_vecs * VEC, x_row_vecs * VEC, out_row_vecs * VEC
    if PERSISTENT:
        # A few programs per SM, each looping over row blocks (Triton's fused-softmax tutorial). The loop
        # costs registers: compiled for the H200 the same body uses more per thread inside it
        # (`registers(x, persistent=True)` shows it), so fewer programs fit on an SM. A constexpr branch: the
        # other kernel compiled from this source has no loop at all.
        n_steps = tl.cdiv(n_rows, BLOCK_SIZE_M)
        for step in tl.range(tl.program_id(axis=0), n_steps, tl.num_programs(axis=0), num_stages=NUM_STAGES):
            _softmax_block(
                out_ptr,
                x_ptr,
                step,
                n_rows,
                n_cols,
                stride_xm,
                stride_xn,
                stride_om,
                stride_on,
                BLOCK_SIZE_M,
                BLOCK_SIZE_N,
                INDEX_64,
            )
    else:
        step = tl.program_id(axis=0)
        _softmax_block(
            out_ptr,
            x_ptr,
            step,
            n_rows,
            n_cols,
            stride_xm,
            stride_xn,
            stride_om,
            stride_on,
            BLOCK_SIZE_M,
            BLOCK_SIZE_N,
            INDEX_64,
        )


def vector_width(x: torch.Tensor, out: torch.Tensor) -> int:
    """The most elements (up to 16 bytes' worth) that the row length and both row strides are multiples of,
    with unit column strides and 16-byte aligned buffers: else 1 (scalar accesses, always correct)."""
    vec = 16 // x.element_size()
    if x.stride(1) != 1 or out.stride(1) != 1 or x.data_ptr() % 16 or out.data_ptr() % 16:
        return 1
    n_cols = x.shape[1]
    while vec > 1 and (n_cols % vec or x.stride(0) % vec or out.stride(0) % vec):
        vec //= 2
    return vec


def _tile(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    """(BLOCK_SIZE_M, BLOCK_SIZE_N, num_warps) for a matrix shape, from the H200 sweeps of warps and rows per
    program (ch03_softmax_configs): tiles of at least 2048 elements, about 64 elements per thread."""
    block_n = triton.next_power_of_2(n_cols)
    elements = 2048 if on_gpu() else 16384  # per program: a few KB on the GPU; big tiles for the interpreter
    block_m = max(1, min(elements // block_n, triton.next_power_of_2(n_rows)))
    num_warps = min(32, max(4, block_m * block_n // 2048))
    return block_m, block_n, num_warps


class _Plan(NamedTuple):
    """One launch configuration: rows and lanes per program, warps, vector width, schedule."""

    block_m: int
    block_n: int
    num_warps: int
    vec: int
    persistent: bool
    num_stages: int
    index_64: bool


@functools.lru_cache(maxsize=4096)
def _plan(
    n_rows: int,
    n_cols: int,
    vec: int,
    num_warps: int | None,
    rows_per_program: int | None,
    persistent: bool,
    num_stages: int | None,
    index_64: bool = False,
) -> _Plan:
    """The launch configuration softmax() uses: the defaults from the shape, overridden by what was passed.

    Cached, because it runs on every call: on an H200 a softmax of a hundred MB is over in tens of
    microseconds, about what the host needs to launch one Triton kernel, so every microsecond of Python
    before the launch can leave the GPU waiting (a kernel that fast is then timed at the host's pace)."""
    block_m, block_n, auto_warps = _tile(n_rows, n_cols)
    return _Plan(
        block_m=rows_per_program or block_m,
        block_n=block_n,
        num_warps=num_warps or auto_warps,
        vec=vec,
        persistent=persistent,
        num_stages=num_stages or (2 if persistent else 1),
        index_64=index_64,
    )


@functools.cache
def _meta(plan: _Plan) -> dict:
    """The kernel's constexprs and launch options: one dict per plan, shared, only ever unpacked."""
    meta = {"BLOCK_SIZE_M": plan.block_m, "BLOCK_SIZE_N": plan.block_n, "VEC": plan.vec}
    meta |= {"PERSISTENT": plan.persistent, "NUM_STAGES": plan.num_stages, "INDEX_64": plan.index_64}
    return meta | {"num_warps": plan.num_warps, "num_stages": plan.num_stages}


def _launch_arguments(x: torch.Tensor, out: torch.Tensor, plan: _Plan) -> tuple[tuple, dict]:
    """The kernel's arguments for x and out: lengths and row strides in whole VEC-element vectors."""
    n_rows, n_cols = x.shape
    vec = plan.vec
    strides = (x.stride(0) // vec, x.stride(1), out.stride(0) // vec, out.stride(1))
    return (out, x, n_rows, n_cols // vec, *strides), _meta(plan)


def _compiled(x: torch.Tensor, out: torch.Tensor, plan: _Plan):
    """The kernel compiled for these arguments (GPU lane), without running it: n_regs, n_spills, shared."""
    args, meta = _launch_arguments(x, out, plan)
    compiled = _softmax_kernel.warmup(*args, **meta, grid=(1,))
    compiled._init_handles()  # loads the binary: n_regs and n_spills are read from it
    return compiled


@functools.cache
def _programs_per_sm(plan: _Plan, dtype: torch.dtype) -> int:
    """How many programs one SM holds at once (registers, shared memory, threads): Triton's softmax tutorial
    compiles the kernel once and reads its register and shared-memory use."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    by_threads = max(1, props.max_threads_per_multi_processor // (32 * plan.num_warps))
    try:
        device = triton.runtime.driver.active.get_current_device()
        limits = triton.runtime.driver.active.utils.get_device_properties(device)
        x = torch.empty((2, plan.block_n), device="cuda", dtype=dtype)
        compiled = _compiled(x, x, plan)
        by_regs = limits["max_num_regs"] // max(1, compiled.n_regs * 32 * plan.num_warps)
        shared = compiled.metadata.shared
        by_smem = limits["max_shared_mem"] // shared if shared else by_threads
        return max(1, min(by_threads, by_regs, by_smem))
    except Exception:  # internal APIs that move between triton versions: fall back on a guess
        return max(1, min(by_threads, 2))


def needs_int64(x: torch.Tensor) -> bool:
    """True when an element offset of x (through its strides) or of its contiguous output passes 2^31 - 1:
    int32 `row * stride` would wrap there. Uses shapes and strides only (meta tensors work)."""
    (n_rows, n_cols), (stride_m, stride_n) = x.shape, x.stride()
    return (n_rows - 1) * stride_m + (n_cols - 1) * stride_n > INT32_MAX or n_rows * n_cols > INT32_MAX


def _check(x: torch.Tensor) -> None:
    require_device(x, "softmax: x")
    if x.dtype not in DTYPES:
        raise TypeError(f"softmax: x has dtype {x.dtype}; supported: float16, bfloat16, float32")
    if x.dtype == torch.bfloat16 and not on_gpu():
        raise TypeError(f"softmax: {BF16_ON_CPU}")
    if x.dim() != 2:
        raise ValueError(
            f"softmax: x must be 2-D (rows, cols), got shape {tuple(x.shape)}; use x.reshape(-1, x.shape[-1])"
        )
    if x.shape[1] > MAX_COLS:
        raise ValueError(
            f"softmax: a row of {x.shape[1]} elements is longer than the {MAX_COLS} this kernel holds in one "
            "program's registers"
        )


_DEFAULT_OPTIONS = (None, None, None, False, True)


def _check_options(num_warps, rows_per_program, persistent, num_stages, vectorize) -> None:
    """Launch options: ints where ints are due (not bools or floats), flags that are bools."""
    if num_warps is not None:
        check_num_warps("softmax", num_warps)
    if rows_per_program is not None:
        check_count("softmax", "rows_per_program", rows_per_program, maximum=MAX_BLOCK_NUMEL)
    if num_stages is not None:
        check_count("softmax", "num_stages", num_stages, maximum=16, power_of_two=False)
    for name, flag in (("persistent", persistent), ("vectorize", vectorize)):
        if not isinstance(flag, bool):
            raise TypeError(f"softmax: {name} must be True or False, got {type(flag).__name__} {flag!r}")


def _prepare(
    x: torch.Tensor,
    num_warps: int | None,
    rows_per_program: int | None,
    persistent: bool,
    num_stages: int | None,
    vectorize: bool,
) -> tuple[torch.Tensor, _Plan | None]:
    """Checks x, allocates the contiguous output and picks the launch plan: what softmax() launches and what
    registers() compiles are the same kernel by construction. No plan (None) for an empty x."""
    _check(x)
    if (num_warps, rows_per_program, num_stages, persistent, vectorize) != _DEFAULT_OPTIONS:
        _check_options(num_warps, rows_per_program, persistent, num_stages, vectorize)
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if out.numel() == 0:
        return out, None
    vec = vector_width(x, out) if vectorize else 1
    plan = _plan(*x.shape, vec, num_warps, rows_per_program, persistent, num_stages, needs_int64(x))
    if plan.block_m * plan.block_n > MAX_BLOCK_NUMEL:
        raise ValueError(
            f"softmax: rows_per_program={plan.block_m} rows of {plan.block_n} lanes is "
            f"{plan.block_m * plan.block_n} elements per program, above Triton's limit of {MAX_BLOCK_NUMEL}"
        )
    return out, plan


# What each plain call would recompute, kept per key: the checks passed, the plan, the grid and the launcher
# (`labkernels.launch_cache`: after the first call, a thin one that calls the compiled kernel directly).
_launches = launch_cache.KeyedLaunches()


def _launch_key(x, num_warps, rows_per_program, persistent, num_stages, vectorize) -> tuple:
    """Everything the checks, the plan and Triton's specialization read from x and the options. Other than
    the defaults, options carry their types: persistent=1 must not pass for persistent=True (the checks
    refuse it)."""
    options = None  # the defaults, told apart by identity: cheap
    unset = num_warps is None and rows_per_program is None and num_stages is None
    if not (unset and persistent is False and vectorize is True):
        options = (num_warps, rows_per_program, num_stages, persistent, vectorize)
        options += tuple(map(type, options))
    return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0, options)


def _softmax(x, num_warps, rows_per_program, persistent, num_stages, vectorize) -> torch.Tensor:
    """Check, allocate, launch: the kernel's path without autograd. Known keys only allocate and launch."""
    try:
        key = _launch_key(x, num_warps, rows_per_program, persistent, num_stages, vectorize)
        launcher = _launches.get(key)
    except Exception:  # not a tensor, an unhashable option, a tensor without storage: the checks say so
        key = launcher = None
    if launcher is not None:
        out = torch.empty_like(x, memory_format=CONTIGUOUS)  # less to parse than torch.empty(shape, ...)
        launcher(out, x)  # read MN, write MN
        return out
    out, plan = _prepare(x, num_warps, rows_per_program, persistent, num_stages, vectorize)
    if plan is None:
        return out  # empty: nothing to launch
    n_programs = n_steps = triton.cdiv(x.shape[0], plan.block_m)
    if persistent and LANE == "gpu":
        n_sm = torch.cuda.get_device_properties(x.device).multi_processor_count
        n_programs = min(n_steps, n_sm * _programs_per_sm(plan, x.dtype))
    elif persistent:
        n_programs = min(n_steps, 8)  # a few, so that each program loops
    args, meta = _launch_arguments(x, out, plan)
    launcher = launch_cache.launch(_softmax_kernel, (n_programs,), args, meta)
    if key is not None:
        _launches[key] = launcher
    return out


@torch.library.custom_op(
    "labkernels::ch03_softmax",
    mutates_args=(),
    schema="(Tensor x, int? num_warps=None, int? rows_per_program=None, bool persistent=False, "
    "int? num_stages=None, bool vectorize=True) -> Tensor",
)
def _softmax_op(x, num_warps=None, rows_per_program=None, persistent=False, num_stages=None, vectorize=True):
    return _softmax(x, num_warps, rows_per_program, persistent, num_stages, vectorize)


@_softmax_op.register_fake
def _(x, num_warps=None, rows_per_program=None, persistent=False, num_stages=None, vectorize=True):
    _check(x)
    return torch.empty(x.shape, device=x.device, dtype=x.dtype)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    # dx = y * (grad - sum(grad * y)) per row: torch's own formula, from the saved output alone.
    return torch.ops.aten._softmax_backward_data(grad, y, 1, y.dtype), None, None, None, None, None


_softmax_op.register_autograd(_softmax_backward, setup_context=_setup_context)


def softmax(
    x: torch.Tensor,
    *,
    num_warps: int | None = None,
    rows_per_program: int | None = None,
    persistent: bool = False,
    num_stages: int | None = None,
    vectorize: bool = True,
) -> torch.Tensor:
    """Row softmax of a 2-D (rows, cols) tensor; any strides; result contiguous, in x's dtype.

    num_warps and rows_per_program (a power of two) default to a choice from the row width; persistent=True
    runs a few programs per SM that loop over the row blocks, with num_stages loads in flight (pass these to
    experiment: `bench.softmax_configs` sweeps them); vectorize=False passes the row length and strides as
    plain ints, so the compiler cannot prove 16-byte alignment. Differentiable; compiles with torch.compile.
    """
    try:
        wants_grad = x.requires_grad and torch.is_grad_enabled()
    except AttributeError:  # not a tensor: the checks say so
        wants_grad = False
    if wants_grad or torch.compiler.is_compiling():
        options = (num_warps, rows_per_program, persistent, num_stages, vectorize)
        return torch.ops.labkernels.ch03_softmax(x, *options)
    return _softmax(x, num_warps, rows_per_program, persistent, num_stages, vectorize)


def registers(
    x: torch.Tensor,
    *,
    num_warps: int | None = None,
    rows_per_program: int | None = None,
    persistent: bool = False,
    num_stages: int | None = None,
    vectorize: bool = True,
) -> int:
    """Registers per thread of the kernel that `softmax(x, same options)` launches, read from the compiled
    binary: what the compiler decided to hold, which the source does not say. GPU lane only."""
    if LANE != "gpu":
        raise RuntimeError(
            "softmax.registers needs the GPU lane: under the Triton interpreter no kernel is compiled, "
            "so there is no register count to read"
        )
    out, plan = _prepare(x, num_warps, rows_per_program, persistent, num_stages, vectorize)
    if plan is None:
        raise ValueError(f"softmax.registers: x is empty, shape {tuple(x.shape)}: no kernel is launched")
    return int(_compiled(x, out, plan).n_regs)
