"""The course extension's chapter-01 ops, as Python functions (thin: check, then call the registered op).

    add_relu(x, y)            relu(x + y) in one pass. CPU: at::parallel_for over the cores. CUDA: 16-byte
                              vector loads and stores (float4 for fp32, 8 halves), a scalar tail.
    add_relu_naive(x, y)      the same, the simple way. CPU: one thread. CUDA: one element per thread.
    add_relu_out(x, y, out)   add_relu into a preallocated `out` (returns `out`).
    scale_shift(x, a, b)      x * a + b, one dtype-generic implementation (AT_DISPATCH_..._AND2).

Each is `torch.ops.labkernels.<name>.default` underneath: an operator with a schema, registered with
`TORCH_LIBRARY_FRAGMENT` and implemented per device with `TORCH_LIBRARY_IMPL`. `register_fake` gives
torch.compile each op's output metadata, so a compiled graph can hold the op without running it, and
`register_autograd` gives add_relu and scale_shift a backward (add_relu_out writes into `out`: no backward,
so inputs that require grad are refused).
The extension is built on the first call (`load()`), not when this module is imported.
Traffic: add_relu reads 2n and writes n elements; scale_shift reads n and writes n.
"""

from __future__ import annotations

import torch

from labkernels.ch01_jit import build

SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_library_path: str | None = None


def load(verbose: bool = False) -> str:
    """Build (the first time: seconds on a laptop, from the cache afterwards) and load the extension."""
    global _library_path
    if _library_path is None:
        path = build.load(verbose=verbose)
        _register_fakes()  # register_fake needs the operators to exist: after the library is loaded
        _library_path = path
    return _library_path


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """add_relu in plain torch: two kernels, the sum goes to memory and back (read 3n, write 2n)."""
    return torch.relu(x + y)


def scale_shift_reference(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return x * a + b


def _check_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float64, float16 or bfloat16, got {t.dtype}")


def _check_same_device(*named: tuple[str, torch.Tensor]) -> None:
    (first_name, first), *rest = named
    for name, t in rest:
        if t.device != first.device:
            raise ValueError(
                f"{first_name} and {name} must be on the same device, got {first.device} and {t.device}"
            )


def _dims(values) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _check_dense_pair(x: torch.Tensor, x_name: str, y: torch.Tensor, y_name: str) -> None:
    """The C++ impls check all of this too; checking here first means bad input never reaches a native
    error path (RuntimeError, with the C++ wording, whichever layer catches it)."""
    if x.dtype != y.dtype:
        raise RuntimeError(f"{x_name} and {y_name} must have the same dtype, got {x.dtype} and {y.dtype}")
    if x.shape != y.shape:
        raise RuntimeError(
            f"{x_name} and {y_name} must have the same shape, got {_dims(x.shape)} and {_dims(y.shape)}"
        )
    _check_contiguous(x, x_name)
    _check_contiguous(y, y_name)


def _check_contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        raise RuntimeError(
            f"{name} must be contiguous, got sizes {_dims(t.shape)} with strides {_dims(t.stride())}: this "
            "kernel walks data_ptr() as a dense array, so call .contiguous() first"
        )


def _check_number(v, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TypeError(f"{name} must be a Python float, got {type(v).__name__}")
    if isinstance(v, int):
        try:
            float(v)  # the op takes a double: an int past ~1.8e308 has none
        except OverflowError:
            raise ValueError(
                f"{name} is an int with {len(str(abs(v)))} digits, too large for a float (the op takes a "
                f"double, at most about 1.8e308 in magnitude)"
            ) from None


def _checked_pair(x: torch.Tensor, y: torch.Tensor) -> None:
    _check_tensor(x, "x")
    _check_tensor(y, "y")
    _check_same_device(("x", x), ("y", y))
    _check_dense_pair(x, "x", y, "y")
    if _library_path is None:
        load()


def add_relu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """relu(x + y) in one pass over contiguous tensors of one shape, dtype and device."""
    _checked_pair(x, y)
    return torch.ops.labkernels.add_relu.default(x, y)


def add_relu_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The teaching version of add_relu (CPU: a single thread; CUDA: one element per thread)."""
    _checked_pair(x, y)
    return torch.ops.labkernels.add_relu_naive.default(x, y)


def _check_no_overlap(out: torch.Tensor, x: torch.Tensor, name: str) -> None:
    """Both are contiguous (checked first), so each spans [data_ptr, data_ptr + nbytes). Even `out is x` is
    refused: the kernels take `__restrict__` pointers, a promise that no byte is reached through two."""
    if out.numel() == 0 or x.numel() == 0 or torch.compiler.is_compiling():
        return  # compiled: the C++ check runs on the real tensors
    a, b = out.data_ptr(), x.data_ptr()
    if a < b + x.numel() * x.element_size() and b < a + out.numel() * out.element_size():
        raise RuntimeError(
            f"out overlaps {name} in memory: the kernel would overwrite what it still has to read "
            "(pass a separate out)"
        )


def add_relu_out(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """add_relu written into `out` (contiguous, same shape, dtype and device as x, sharing no memory with
    x or y); returns `out`. It records no backward: use add_relu() where gradients are needed."""
    _check_tensor(x, "x")
    _check_tensor(y, "y")
    _check_tensor(out, "out")
    _check_same_device(("x", x), ("y", y), ("out", out))
    _check_dense_pair(x, "x", y, "y")
    _check_dense_pair(x, "x", out, "out")
    _check_no_overlap(out, x, "x")
    _check_no_overlap(out, y, "y")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, y, out)):
        raise RuntimeError(
            "add_relu_out writes into out and records no backward, but an argument requires grad: use "
            "add_relu(x, y), which has one, or call it under torch.no_grad()"
        )
    if _library_path is None:
        load()
    torch.ops.labkernels.add_relu_out.default(x, y, out)
    return out


def scale_shift(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """x * a + b, computed in float (double for float64) and rounded once."""
    _check_tensor(x, "x")
    _check_number(a, "a")
    _check_number(b, "b")
    _check_contiguous(x, "x")
    if _library_path is None:
        load()
    return torch.ops.labkernels.scale_shift.default(x, float(a), float(b))


# Fakes: the output's shape, dtype, device and strides from the inputs' alone (what torch.compile traces
# with). They must agree with the real kernels, which `torch.library.opcheck` verifies.
def _add_relu_fake(x, y):
    torch._check(x.shape == y.shape, lambda: f"x and y must have the same shape, got {x.shape} and {y.shape}")
    torch._check(x.dtype == y.dtype, lambda: f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    torch._check(
        x.device == y.device, lambda: f"x and y must be on the same device, got {x.device} and {y.device}"
    )
    return torch.empty_like(x)


def _add_relu_out_fake(x, y, out):
    return None


def _scale_shift_fake(x, a, b):
    return torch.empty_like(x)


# Backward formulas, in torch ops (they run on any device, and under torch.compile).
def _add_relu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _add_relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    g = torch.where(out > 0, grad, torch.zeros_like(grad))  # relu passes the gradient where it passed x+y
    return g, g  # d(x + y)/dx = d(x + y)/dy = 1


def _scale_shift_setup_context(ctx, inputs, output):
    ctx.a = inputs[1]


def _scale_shift_backward(ctx, grad):
    return grad * ctx.a, None, None  # a and b are Python floats: no gradient


def _register_fakes() -> None:
    torch.library.register_fake("labkernels::add_relu", _add_relu_fake)
    torch.library.register_fake("labkernels::add_relu_naive", _add_relu_fake)
    torch.library.register_fake("labkernels::add_relu_out", _add_relu_out_fake)
    torch.library.register_fake("labkernels::scale_shift", _scale_shift_fake)
    for name in ("add_relu", "add_relu_naive"):
        torch.library.register_autograd(
            f"labkernels::{name}", _add_relu_backward, setup_context=_add_relu_setup_context
        )
    torch.library.register_autograd(
        "labkernels::scale_shift", _scale_shift_backward, setup_context=_scale_shift_setup_context
    )
