"""Pointwise fusion: a chain of elementwise ops in one pass over memory.

Each eager torch op is one kernel that reads its inputs from HBM and writes its result back. A chain of N
ops that starts with a binary op (`x + y`) and continues with N-1 unary ops therefore moves 3 + 2(N-1) =
2N+1 tensors; fused, the intermediates stay in registers and it moves 3: read x and y, write the result
(`labkernels.traffic.pointwise_chain`). The longer the chain, the bigger the saving, as long as the fused
kernel stays memory-bound.

- `mul_add_sigmoid(x, a, b)`: sigmoid(x * a + b), three eager kernels (8n elements moved) in one (4n).
- `chain(x, y, n_ops)`: relu/scale/shift/sigmoid after `x + y`, N ops; `n_ops=2` is chapter 03's add+relu.
Compute is fp32 whatever the storage dtype; results are stored in the inputs' dtype.
A call without `out` whose key (shapes, strides, dtypes, devices, 16-byte alignment, grad mode) was seen
before skips the checks and Triton's per-call Python: it allocates the result and launches through a cached
launcher (`labkernels.launch_cache`), as chapter 03's softmax does. A fused kernel that saves HBM passes is
only worth it if its one launch costs less host time than the eager ops' several.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from labkernels import launch_cache
from labkernels.ch03_triton.vector_add import check_elementwise
from labkernels.lane import LANE

MAX_OPS = 64
UNARY_OPS = ("relu", "scale", "shift", "sigmoid")  # op i (i >= 1) of a chain is UNARY_OPS[(i - 1) % 4]
SCALE, SHIFT = 0.75, 0.25


def reference_mul_add_sigmoid(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x * a + b)  # 3 kernels: read 2n write n; read 2n write n; read n write n


def reference_chain(x: torch.Tensor, y: torch.Tensor, n_ops: int) -> torch.Tensor:
    """N eager kernels: `x + y` (read 2n, write n), then N-1 unary ops (read n, write n each)."""
    _check_n_ops(n_ops)
    z = x + y
    for i in range(1, n_ops):
        op = UNARY_OPS[(i - 1) % len(UNARY_OPS)]
        if op == "relu":
            z = torch.relu(z)
        elif op == "scale":
            z = z * SCALE
        elif op == "shift":
            z = z + SHIFT
        else:
            z = torch.sigmoid(z)
    return z


@triton.jit
def _offsets(n_elements, BLOCK_SIZE: tl.constexpr, INT64: tl.constexpr):
    pid = tl.program_id(axis=0)
    if INT64:  # past 2^31 elements pid * BLOCK_SIZE overflows int32
        pid = pid.to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    return offsets, offsets < n_elements


@triton.jit
def _mul_add_sigmoid_kernel(
    x_ptr, a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr, INT64: tl.constexpr
):
    offsets, mask = _offsets(n_elements, BLOCK_SIZE, INT64)
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # read 3n
    a = tl.load(a_ptr + offsets, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask).to(tl.float32)
    out = tl.sigmoid(x * a + b)  # the product and the sum never leave registers
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)  # write n


@triton.jit
def _chain_kernel(
    x_ptr,
    y_ptr,
    out_ptr,
    n_elements,
    N_OPS: tl.constexpr,
    SCALE: tl.constexpr,
    SHIFT: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    INT64: tl.constexpr,
):
    offsets, mask = _offsets(n_elements, BLOCK_SIZE, INT64)
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # read 2n
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    z = x + y
    # Unrolled at compile time: one kernel per N_OPS, each op a few instructions on registers.
    for i in tl.static_range(1, N_OPS):
        if (i - 1) % 4 == 0:
            z = tl.maximum(z, 0.0)
        elif (i - 1) % 4 == 1:
            z = z * SCALE
        elif (i - 1) % 4 == 2:
            z = z + SHIFT
        else:
            z = tl.sigmoid(z)
    tl.store(out_ptr + offsets, z.to(out_ptr.dtype.element_ty), mask=mask)  # write n


@functools.lru_cache(maxsize=1024)
def launch_config(n: int) -> tuple[int, int, bool]:
    """(BLOCK_SIZE, num_warps, INT64) for n elements. From the H200's ch03_block_sweep: 1024 elements with
    4 warps runs within a few % of the best config from 2^24 elements up; below that, fewer and larger
    programs (4096, 8 warps) waste less per program. The interpreter pays per program: one big block."""
    if LANE == "cpu":
        block, warps = 16384, 4
    elif n <= 1 << 22:
        block, warps = 4096, 8
    else:
        block, warps = 1024, 4
    return block, warps, n + block >= 2**31


def _no_grad(name: str, *tensors: torch.Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(
            f"{name}: inputs require grad, but this fused kernel has no backward; call it under "
            "torch.no_grad() or use the reference (torch ops) for training"
        )


def _check_n_ops(n_ops: int) -> None:
    if not isinstance(n_ops, int) or isinstance(n_ops, bool) or not 1 <= n_ops <= MAX_OPS:
        raise ValueError(f"chain: n_ops must be an int in 1..{MAX_OPS}, got {n_ops!r}")


def _check_out(name: str, out: torch.Tensor | None, *inputs: torch.Tensor) -> None:
    """An `out` that partly overlaps an input would be read after another program wrote it."""
    if out is None:
        return
    for t in inputs:
        if out.data_ptr() == t.data_ptr():
            continue  # exact aliasing is fine: each element is read before it is written, by one program
        lo, hi = out.data_ptr(), out.data_ptr() + out.numel() * out.element_size()
        t_lo, t_hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        if lo < t_hi and t_lo < hi:
            raise ValueError(
                f"{name}: out partly overlaps an input; pass a separate tensor or the input itself"
            )


# Calls without `out`, per key: the launcher that the checked first call of the key built.
_launches = launch_cache.KeyedLaunches()


def _launch_key(op, *tensors: torch.Tensor) -> tuple:
    """Everything the checks and Triton's specialization read from the inputs. Grad mode too: a call whose
    inputs require grad raises, so its key is never kept, and a later one under no_grad has another key."""
    key = (op, torch.is_grad_enabled())
    for t in tensors:
        key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0, t.requires_grad)
    return key


def _known_launcher(key, out):
    """The cached launcher of `key`, or None: calls with `out` always take the checked path (its overlap
    checks read the storage of this call's tensors)."""
    if out is not None:
        return None
    try:
        return _launches.get(key())
    except Exception:  # not tensors, tensors without storage: the checks say so
        return None


def _launch_and_keep(kernel, key, n: int, tensors: tuple, meta: dict, keep: bool) -> None:
    """Launch; with `keep`, also build and keep the key's launcher (a call with out= builds none: its
    checks run every time, and building a launcher costs more than one launch)."""
    block, warps, int64 = launch_config(n)
    meta = meta | {"BLOCK_SIZE": block, "INT64": int64, "num_warps": warps}
    grid = (triton.cdiv(n, block),)
    if keep:
        _launches[key()] = launch_cache.launch(kernel, grid, (*tensors, n), meta)
    else:
        kernel[grid](*tensors, n, **meta)


# torch.library: under torch.compile the public functions call these ops, which it traces without a graph
# break (their fakes give the output's shape); out= is then a copy of the op's result.
@torch.library.custom_op(
    "labkernels::ch05_mul_add_sigmoid", mutates_args=(), schema="(Tensor x, Tensor a, Tensor b) -> Tensor"
)
def _mul_add_sigmoid_op(x, a, b):
    return mul_add_sigmoid(x, a, b)


@_mul_add_sigmoid_op.register_fake
def _(x, a, b):
    check_elementwise("mul_add_sigmoid", x, a, b)
    return torch.empty_like(x)


@torch.library.custom_op(
    "labkernels::ch05_chain", mutates_args=(), schema="(Tensor x, Tensor y, int n_ops) -> Tensor"
)
def _chain_op(x, y, n_ops):
    return chain(x, y, n_ops)


@_chain_op.register_fake
def _(x, y, n_ops):
    _check_n_ops(n_ops)
    check_elementwise("chain", x, y)
    return torch.empty_like(x)


def _compiled(op, name: str, out: torch.Tensor | None, *inputs: torch.Tensor) -> torch.Tensor:
    """Inside torch.compile: the op (traced, no kernel runs while tracing); out= receives a copy."""
    check_elementwise(name, *inputs)
    _no_grad(name, *inputs)
    x = inputs[0]
    if out is not None and (out.dtype != x.dtype or out.shape != x.shape):
        wanted, got = f"{x.dtype} {tuple(x.shape)}", f"{out.dtype} {tuple(out.shape)}"
        raise ValueError(f"{name}: out must be {wanted}, got {got}")
    result = op()
    return result if out is None else out.copy_(result)


def mul_add_sigmoid(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """sigmoid(x * a + b) in one kernel: read 3n, write n (eager: read 5n, write 3n)."""
    if torch.compiler.is_compiling():
        return _compiled(lambda: _mul_add_sigmoid_op(x, a, b), "mul_add_sigmoid", out, x, a, b)
    key = lambda: _launch_key("mul_add_sigmoid", x, a, b)  # noqa: E731
    launcher = _known_launcher(key, out)
    if launcher is not None:  # checked before: only allocate and launch
        out = torch.empty_like(x)
        launcher(x, a, b, out)  # read 3n, write n
        return out
    check_elementwise("mul_add_sigmoid", x, a, b, out=out)
    _check_out("mul_add_sigmoid", out, x, a, b)
    _no_grad("mul_add_sigmoid", x, a, b)
    keep = out is None
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if n == 0:
        return out  # nothing to launch: a grid of zero programs is an error in Triton
    _launch_and_keep(_mul_add_sigmoid_kernel, key, n, (x, a, b, out), {}, keep)
    return out


def chain(x: torch.Tensor, y: torch.Tensor, n_ops: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The N-op chain of `reference_chain` in one kernel: read 2n, write n, whatever N."""
    if torch.compiler.is_compiling():
        _check_n_ops(n_ops)
        return _compiled(lambda: _chain_op(x, y, n_ops), "chain", out, x, y)
    key = lambda: _launch_key(("chain", type(n_ops), n_ops), x, y)  # noqa: E731  (n_ops=True is refused)
    launcher = _known_launcher(key, out)
    if launcher is not None:
        out = torch.empty_like(x)
        launcher(x, y, out)  # read 2n, write n
        return out
    _check_n_ops(n_ops)
    check_elementwise("chain", x, y, out=out)
    _check_out("chain", out, x, y)
    _no_grad("chain", x, y)
    keep = out is None
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if n == 0:
        return out
    meta = {"N_OPS": n_ops, "SCALE": SCALE, "SHIFT": SHIFT}
    _launch_and_keep(_chain_kernel, key, n, (x, y, out), meta, keep)
    return out


def chain_registers(n_ops: int, dtype: torch.dtype = torch.float32) -> tuple[int, int]:
    """(registers per thread, spilled registers) of the compiled chain kernel for N ops, read from the
    binary (GPU lane): a longer chain holds no more values, so fusing it costs no registers."""
    if LANE != "gpu":
        raise RuntimeError("chain_registers needs the GPU lane: the interpreter compiles no kernel")
    n = 1 << 24
    x = torch.empty(n, device="cuda", dtype=dtype)
    block, warps, int64 = launch_config(n)
    compiled = _chain_kernel.warmup(
        x,
        x,
        x,
        n,
        N_OPS=n_ops,
        SCALE=SCALE,
        SHIFT=SHIFT,
        BLOCK_SIZE=block,
        INT64=int64,
        num_warps=warps,
        grid=(1,),
    )
    compiled._init_handles()
    return int(compiled.n_regs), int(compiled.n_spills)
