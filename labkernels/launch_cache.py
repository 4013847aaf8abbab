"""Thin launches: the second call of a kernel with the same arguments skips Triton's per-call Python.

`kernel[grid](*args, **meta)` runs `JITFunction.run` on every call: it binds the arguments to the signature,
specializes each one (dtype, 16-byte alignment, int width, == 1), builds the cache key from them, looks the
compiled kernel up, and evaluates the grid, all in Python, before the C launcher is called. That is most of a
labkernels call's host time on a GPU (the ch03_launch benchmark takes a call apart). A wrapper that has
already checked its inputs knows when none of that can change: same shapes, strides, dtypes, device, pointer
alignment and launch options give the same compiled kernel and the same scalar arguments. `launch()` does
one normal launch, which returns the `CompiledKernel`, and gives back a launcher for that key: it calls the
compiled kernel's C launcher directly, with the current stream, the tensors of this call and the scalars and
constexprs of the first.

Triton 3.6 and 3.7 call it the same way (`JITFunction.run`, last lines):
    compiled.run(grid_0, grid_1, grid_2, stream, compiled.function, compiled.packed_metadata,
                 launch_metadata, launch_enter_hook, launch_exit_hook, *bound_args.values())
with every parameter of the kernel in signature order, constexprs included (the C launcher skips them);
stream = torch._C._cuda_getCurrentRawStream(device), device = torch.cuda.current_device(). Global scratch
(device-side tensor descriptors) is allocated inside `compiled.run`, through `triton.set_allocator`.

Guards: the thin launcher is built only on the GPU lane, for a verified triton version, when the compiled
kernel's recorded constexprs and 16-byte-divisible integers match the arguments it will replay, and while no
launch hook (a profiler) is installed; any mismatch or exception means the normal `kernel[grid]` path, for
good for that key. `LABKERNELS_THIN_LAUNCH=0` turns thin launches off (`=force` allows an unverified
triton 3.x); `set_enabled()` does the same at run time.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton

from labkernels.lane import LANE

VERIFIED_TRITON = ((3, 6), (3, 7))  # read against these releases' jit.py, compiler.py and nvidia driver.py
_TRITON = tuple(int(p) for p in triton.__version__.split(".")[:2])


def enabled_from_env(environ=os.environ) -> bool:
    """What LABKERNELS_THIN_LAUNCH asks for: off for "0", on for a verified triton (or any 3.x: "force")."""
    setting = environ.get("LABKERNELS_THIN_LAUNCH", "1").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    return _TRITON in VERIFIED_TRITON or (setting == "force" and _TRITON[0] == 3)


_enabled = enabled_from_env()
_caches: list[dict] = []  # every KeyedLaunches: emptied when thin launches are switched


class KeyedLaunches(dict):
    """A wrapper's cache: its key (shapes, strides, dtypes, device, alignment, options) -> what it launches.
    Emptied by `set_enabled`, so no launcher built under the other setting survives."""

    def __init__(self):
        super().__init__()
        _caches.append(self)


def enabled() -> bool:
    """Whether `launch` builds thin launchers (the GPU lane only: the interpreter has no compiled kernel)."""
    return _enabled and LANE == "gpu"


def set_enabled(flag: bool) -> None:
    """Thin launches on or off from now on; every cached launcher is dropped."""
    global _enabled
    _enabled = bool(flag)
    for cache in _caches:
        cache.clear()


def _leading_tensors(args: tuple) -> int:
    n = 0
    while n < len(args) and isinstance(args[n], torch.Tensor):
        n += 1
    return n


def normal_launcher(jitfn, grid: tuple, args: tuple, meta: dict) -> Callable[..., None]:
    """launcher(*tensors): `jitfn[grid](*tensors, *scalars, **meta)`, Triton's own path on every call."""
    n = _leading_tensors(args)
    scalars = args[n:]

    def launch(*tensors):
        jitfn[grid](*tensors, *scalars, **meta)

    launch.kind = "normal"
    return launch


def launch(jitfn, grid: tuple, args: tuple, meta: dict) -> Callable[..., None]:
    """Launch `jitfn[grid](*args, **meta)` the normal way; return a launcher for later calls whose leading
    tensor arguments differ and whose scalars, constexprs, grid and specialization are the same (the
    caller's key guarantees it). Thin when `enabled()` and the compiled kernel passes `_replayable`."""
    compiled = jitfn[grid](*args, **meta)
    normal = normal_launcher(jitfn, grid, args, meta)
    if not enabled() or compiled is None:
        return normal
    try:
        full = (*args, *(meta[name] for name in jitfn.arg_names[len(args) :]))
        if not _replayable(compiled, jitfn, full):
            return normal
        return _thin_launcher(compiled, grid, full, _leading_tensors(args), normal)
    except Exception:  # a triton whose objects are not as read: Triton's own path
        return normal


def _param_index(jitfn, path) -> int | None:
    """A constants/attrs key of the compiled source: an argument name, or a path tuple (top level only)."""
    if isinstance(path, str):
        return jitfn.arg_names.index(path)
    return path[0] if len(path) == 1 else None


def _replayable(compiled, jitfn, full: tuple) -> bool:
    """True when `compiled` was compiled for the values in `full`: same argument count, each recorded
    constant (constexprs and integers specialized as 1) equal, each integer recorded 16-divisible still so."""
    src = compiled.src
    if getattr(src, "fn", None) is not jitfn or len(src.signature) != len(full):
        return False
    if not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
        return False
    for path, value in src.constants.items():
        i = _param_index(jitfn, path)
        if i is None or not (full[i] is value or full[i] == value):
            return False
    for path, attrs in getattr(src, "attrs", {}).items():
        i = _param_index(jitfn, path)
        divisible = any(a[0] == "tt.divisibility" for a in attrs)
        if i is None or (divisible and isinstance(full[i], int) and full[i] % 16):
            return False
    return True


def _device_and_stream():
    """Triton's own sources of both (backends/driver.py: GPUDriver), bound once."""
    get_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
    get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_stream is None:
        get_stream = lambda index: torch.cuda.current_stream(index).cuda_stream  # noqa: E731
    return get_device, get_stream


def _hooks_idle(runtime) -> bool:
    """No launch hook installed (a profiler such as proton installs one): None, or an empty HookChain."""
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def _thin_launcher(compiled, grid: tuple, full: tuple, n_tensors: int, normal) -> Callable[..., None]:
    runtime = triton.knobs.runtime
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]
    tail = full[n_tensors:]  # scalars and constexprs of the first call, in signature order
    get_device, get_stream = _device_and_stream()
    device = get_device()  # the function handle was loaded in this device's context
    state = {"broken": False}

    def launch(*tensors):
        if state["broken"] or get_device() != device or not _hooks_idle(runtime):
            return normal(*tensors)
        try:
            stream = get_stream(device)
            run(grid_0, grid_1, grid_2, stream, function, packed, None, None, None, *tensors, *tail)
        except Exception:  # arguments refused before the launch: Triton's path from now on, with its errors
            state["broken"] = True
            normal(*tensors)

    launch.kind = "thin"
    return launch
