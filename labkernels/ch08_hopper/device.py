"""What every chapter-08 launcher checks first: a tensor on a Hopper GPU, the only place Gluon's sm_90
instructions (TMA, mbarrier, wgmma) run. Anywhere else the error names the kernel to use instead."""

from __future__ import annotations

import functools

import torch
from triton.experimental.gluon import language as gl

_GL_DTYPES = {
    torch.float16: gl.float16,
    torch.bfloat16: gl.bfloat16,
    torch.float32: gl.float32,
    torch.float8_e4m3fn: gl.float8e4nv,
}


def gl_dtype(dtype: torch.dtype):
    """The Gluon element type of a torch dtype the chapter's kernels take."""
    return _GL_DTYPES[dtype]


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def hopper_problem(device: torch.device) -> str | None:
    """None if `device` is a Hopper GPU (compute capability 9.x), else why the chapter's kernels cannot run
    there. wgmma is sm_90a only: Blackwell (10.x) has other tensor-core instructions."""
    if device.type != "cuda":
        return (
            f"the tensor is on {device}, and Gluon kernels run only on a CUDA GPU (not under the interpreter)"
        )
    major, minor = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if major != 9:
        return f"this GPU has compute capability {major}.{minor}, and these kernels need Hopper's sm_90"
    return None


def check_hopper(op: str, t: object, fallback: str) -> None:
    """Raise a clear error unless `t` is a tensor on a Hopper GPU; the message names `fallback`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: expected a torch.Tensor, got {type(t).__name__}")
    problem = hopper_problem(t.device)
    if problem is not None:
        raise RuntimeError(f"{op} needs a Hopper GPU: {problem}. Use {fallback} instead.")
