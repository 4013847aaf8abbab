"""Which lane this process runs in, decided once, before triton is imported.

GPU lane: CUDA is available, kernels compile for the real device.
CPU lane: no CUDA; Triton kernels run under the Triton interpreter (TRITON_INTERPRET=1), which must be set
before any `@triton.jit` decorates a kernel, so `import labkernels` does it before importing triton.
"""

from __future__ import annotations

import os
import sys

import torch

_FORCED = os.environ.get("LABKERNELS_LANE")  # "cpu" forces the CPU lane on a GPU machine (tests).


def _decide() -> str:
    if _FORCED in ("cpu", "gpu"):
        if _FORCED == "gpu" and not torch.cuda.is_available():
            raise RuntimeError("LABKERNELS_LANE=gpu but torch sees no CUDA device")
        return _FORCED
    return "gpu" if torch.cuda.is_available() else "cpu"


LANE: str = _decide()

if LANE == "cpu":
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # Kernels decorated before this point would not run under the interpreter.
        raise ImportError(
            "triton was imported before labkernels on a machine without CUDA: "
            "import labkernels first (it sets TRITON_INTERPRET=1 for the CPU lane)"
        )
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = torch.device("cuda" if LANE == "gpu" else "cpu")


def lane() -> str:
    """'gpu' or 'cpu'."""
    return LANE


def on_gpu() -> bool:
    return LANE == "gpu"


def sm_count(device: torch.device | str | None = None) -> int:
    """Streaming multiprocessors of the GPU, the count persistent kernels launch programs by; 4 under the
    interpreter, so that on the CPU lane each persistent program still loops over several tiles or rows."""
    if LANE != "gpu":
        return 4
    return torch.cuda.get_device_properties(device if device is not None else DEVICE).multi_processor_count


def size(*, cpu, gpu):
    """The per-lane problem size: small enough for the interpreter, large enough to fill an H200."""
    return gpu if LANE == "gpu" else cpu


def require_device(t: torch.Tensor, name: str = "tensor") -> None:
    """Raise a clear error if `t` is not on this lane's device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != DEVICE.type:
        raise ValueError(f"{name} is on {t.device}, but this lane ({LANE}) runs kernels on {DEVICE}")
