"""Python front of the stride-aware C++/CUDA ops (labkernels/csrc/strided.cpp, csrc/cuda/strided.cu).

Each function checks its inputs here first (clear Python errors, and the same checks run again in C++),
allocates a contiguous `out` if none is given, and calls the `_out` op. The ops run on CPU tensors
(at::parallel_for) and, where torch has CUDA, on CUDA tensors. `register_fake` tells torch.compile the
output's shape without running anything.

    copy_strided(x)        any rank, any strides: a contiguous copy (CUDA: one thread per element)
    copy_2d_tiled(x)       2-D: the same copy by 32x32 tiles (CUDA: shared-memory transpose)
    add_relu_strided(x, y) any rank, any strides for x and y: relu(x + y), contiguous
"""

from __future__ import annotations

import functools

import torch

from labkernels.ch02_strides.views import check_out, check_view

_OPS = ("copy_strided", "copy_2d_tiled", "add_relu_strided")


@functools.cache
def _library() -> str:
    """Build (first call: about half a minute on a laptop) and load the course extension once."""
    from labkernels.ch01_jit import build

    path = build.load()
    for name in _OPS:
        torch.library.register_fake(f"labkernels::{name}", _fake_like_first)
        torch.library.register_fake(f"labkernels::{name}_out", _fake_out)
    return path


def _fake_like_first(x, *rest):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's strides


def _fake_out(*args):
    return None


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


def copy_strided(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous copy of any view (sizes, strides, storage offset, stride 0), in C++/CUDA."""
    check_view(x, "x")
    _check_device(x)
    out = check_out(out, x.shape, x, {"x": x})
    _library()
    torch.ops.labkernels.copy_strided_out.default(x, out)  # read n, write n
    return out


def copy_2d_tiled(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A contiguous copy of any 2-D view by tiles (CUDA: 32x32 shared-memory transpose)."""
    check_view(x, "x", ndim=2)
    _check_device(x)
    out = check_out(out, x.shape, x, {"x": x})
    _library()
    torch.ops.labkernels.copy_2d_tiled_out.default(x, out)  # read MN, write MN
    return out


def add_relu_strided(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """relu(x + y) for two views of one shape and dtype with any strides; the result is contiguous."""
    check_view(x, "x")
    check_view(y, "y")
    _check_device(x, y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise TypeError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    out = check_out(out, x.shape, x, {"x": x, "y": y})
    _library()
    torch.ops.labkernels.add_relu_strided_out.default(x, y, out)  # read 2n, write n
    return out
