"""Python front of the stride-aware C++/CUDA ops (labkernels/csrc/strided.cpp, csrc/cuda/strided.cu).

Each function checks its inputs here first (clear Python errors, and the same checks run again in C++),
then calls the functional op (which allocates a contiguous output and has a backward) or, given `out`, the
`_out` op (no backward: inputs that require grad are refused). The ops run on CPU tensors
(at::parallel_for) and, where torch has CUDA, on CUDA tensors. `register_fake` tells torch.compile the
output's shape without running anything, so the ops compile with `fullgraph=True`.

    copy_strided(x)        any rank, any strides: a contiguous copy (CUDA: one thread per element)
    copy_2d_tiled(x)       2-D: the same copy by 32x32 tiles (CUDA: shared-memory transpose)
    add_relu_strided(x, y) any rank, any strides for x and y: relu(x + y), contiguous
"""

from __future__ import annotations

import torch

from labkernels.ch02_strides.views import check_out, check_view

_OPS = ("copy_strided", "copy_2d_tiled", "add_relu_strided")
_library_path: str | None = None


def _library() -> str:
    """Build (first call: seconds to a minute) and load the course extension once; register the fakes
    (torch.compile) and backward formulas (autograd) of its chapter-02 ops."""
    global _library_path
    if _library_path is None:
        from labkernels.ch01_jit import build

        path = build.load()
        for name in _OPS:
            torch.library.register_fake(f"labkernels::{name}", _fake_like_first)
            torch.library.register_fake(f"labkernels::{name}_out", _fake_out)
        for name in ("copy_strided", "copy_2d_tiled"):
            torch.library.register_autograd(f"labkernels::{name}", _copy_backward)
        torch.library.register_autograd(
            "labkernels::add_relu_strided", _add_relu_backward, setup_context=_add_relu_setup_context
        )
        _library_path = path
    return _library_path


def _fake_like_first(x, *rest):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's strides


def _fake_out(*args):
    return None


def _copy_backward(ctx, grad):
    # out[i] = x[i] element by element (only the layout differs), so the gradient of x is the gradient of out
    # at the same logical index; autograd lays it out as x's view (a transposed x gets a transposed grad)
    return grad


def _add_relu_setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _add_relu_backward(ctx, grad):
    (out,) = ctx.saved_tensors
    g = torch.where(out > 0, grad, torch.zeros_like(grad))
    return g, g  # an expanded y (stride 0) gets its gradient summed by autograd's expand backward


def ensure_loaded() -> str:
    """The path of the loaded extension (building it if needed)."""
    return _library()


_MAX_DIMS = 8  # kStridedMaxDims in csrc/strided.cpp


def _check_device(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dim() > _MAX_DIMS:
            raise ValueError(f"the C++ ops take at most {_MAX_DIMS} dims, got shape {tuple(t.shape)}")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"the C++ ops run on cpu or cuda tensors, got one on {t.device}")
    first = tensors[0]
    for t in tensors[1:]:
        if t.device != first.device:
            raise ValueError(f"all tensors must be on one device, got {first.device} and {t.device}")


def _check(x: torch.Tensor, name: str, ndim: int | None = None) -> None:
    """The Python-side checks; under torch.compile (fake tensors: no storage to inspect) only those that
    read metadata, and the C++ checks run on the real tensors."""
    if torch.compiler.is_compiling():
        if not isinstance(x, torch.Tensor) or (ndim is not None and x.dim() != ndim):
            check_view(x, name, ndim=ndim)
        return
    check_view(x, name, ndim=ndim)


def _check_no_grad(out: torch.Tensor, *inputs: torch.Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in (out, *inputs)):
        raise RuntimeError(
            "an out= call writes into out and records no backward, but an argument requires grad: call "
            "without out= (that form has a backward), or under torch.no_grad()"
        )


def copy_strided(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous copy of any view (sizes, strides, storage offset, stride 0), in C++/CUDA."""
    _check(x, "x")
    _check_device(x)
    if _library_path is None:
        _library()
    if out is None:
        return torch.ops.labkernels.copy_strided.default(x)  # read n, write n
    out = check_out(out, x.shape, x, {"x": x})
    _check_no_grad(out, x)
    torch.ops.labkernels.copy_strided_out.default(x, out)  # read n, write n
    return out


def copy_2d_tiled(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous copy of any 2-D view by tiles (CUDA: 32x32 shared-memory transpose)."""
    _check(x, "x", ndim=2)
    _check_device(x)
    if _library_path is None:
        _library()
    if out is None:
        return torch.ops.labkernels.copy_2d_tiled.default(x)  # read MN, write MN
    out = check_out(out, x.shape, x, {"x": x})
    _check_no_grad(out, x)
    torch.ops.labkernels.copy_2d_tiled_out.default(x, out)  # read MN, write MN
    return out


def add_relu_strided(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """relu(x + y) for two views of one shape and dtype with any strides; the result is contiguous."""
    _check(x, "x")
    _check(y, "y")
    _check_device(x, y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise TypeError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    if _library_path is None:
        _library()
    if out is None:
        return torch.ops.labkernels.add_relu_strided.default(x, y)  # read 2n, write n
    out = check_out(out, x.shape, x, {"x": x, "y": y})
    _check_no_grad(out, x, y)
    torch.ops.labkernels.add_relu_strided_out.default(x, y, out)  # read 2n, write n
    return out
