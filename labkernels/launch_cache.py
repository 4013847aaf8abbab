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

`compiled.run` is itself Python (the driver's CudaLauncher.__call__): it allocates scratch, then calls the
C function `compiled.run.launch`, whose argument order differs between 3.6 (a launcher compiled per
kernel) and 3.7 (one launcher, given the signature per call). For a kernel with no scratch and no tensor
descriptors the thin launcher calls that C function itself, with each tensor's address as an int, which
also spares the C side a driver call per tensor (it translates a tensor's data_ptr() through
cuPointerGetAttribute). A kernel given host TMA descriptors (triton 3.6) is launched the same way, its
descriptors encoded once per address and kept (`_described_call`). Other kernels, and
`LABKERNELS_THIN_LAUNCH=run`, go through `compiled.run`.

Guards: the thin launcher is built only on the GPU lane, for a verified triton version, when the compiled
kernel's recorded constexprs and 16-byte-divisible integers match the arguments it will replay, and while no
launch hook (a profiler) is installed; any mismatch or exception means the normal `kernel[grid]` path, for
good for that key. `LABKERNELS_THIN_LAUNCH=0` turns thin launches off (`=force` allows an unverified
triton 3.x); `set_enabled()` does the same at run time.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from labkernels.lane import LANE

VERIFIED_TRITON = ((3, 6), (3, 7))  # read against these releases' jit.py, compiler.py and nvidia driver.py
_TRITON = tuple(int(p) for p in triton.__version__.split(".")[:2])


def enabled_from_env(environ=os.environ) -> bool:
    """What LABKERNELS_THIN_LAUNCH asks for: off for "0", on for a verified triton (or any 3.x: "force")."""
    setting = environ.get("LABKERNELS_THIN_LAUNCH", "1").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    return _TRITON in VERIFIED_TRITON or (setting == "force" and _TRITON[0] == 3)


def direct_from_env(environ=os.environ) -> bool:
    """Whether thin launchers call Triton's C launch themselves (the default) or go through compiled.run
    (LABKERNELS_THIN_LAUNCH=run: the step `ch03_launch` times apart)."""
    return environ.get("LABKERNELS_THIN_LAUNCH", "1").strip().lower() != "run"


_enabled = enabled_from_env()
_direct = direct_from_env()
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


def set_enabled(flag: bool, *, direct: bool | None = None) -> None:
    """Thin launches on or off from now on, and (if given) whether they call Triton's C launch directly or
    through compiled.run; every cached launcher is dropped."""
    global _enabled, _direct
    _enabled = bool(flag)
    if direct is not None:
        _direct = bool(direct)
    for cache in _caches:
        cache.clear()


def _leading_tensors(args: tuple) -> int:
    """How many leading arguments change from call to call: tensors, and host TMA descriptors (each holds
    a tensor's address; Triton turns it into a CUtensorMap on every launch)."""
    n = 0
    while n < len(args) and isinstance(args[n], (torch.Tensor, TensorDescriptor)):
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


def _c_launch(compiled) -> Callable | None:
    """Triton's C launch function for `compiled`, when the thin launcher may call it itself: no Python in
    front of it that matters (no tensor-descriptor wrapper, no per-call scratch buffer) and a calling
    convention read for this triton. Else None: the launcher goes through `compiled.run`."""
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    if c_launch is None or isinstance(c_launch, types.FunctionType):  # a Python wrapper (tensor descriptors)
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None  # compiled.run allocates those per launch
    if _TRITON not in VERIFIED_TRITON:
        return None
    return c_launch


def _direct_call(compiled, grid: tuple, tail: tuple, device: int, get_stream) -> Callable[[list], None]:
    """call(pointers): what `compiled.run(...)` ends in, Triton's C launch, with its Python step skipped.

    The tensors go in as integer addresses. Given a tensor, the C launcher calls its data_ptr() and then
    asks the driver to translate the address (cuPointerGetAttribute), once per tensor per launch; the
    wrapper has already checked that every tensor lives on this device, so the address is the answer."""
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    c_launch = _c_launch(compiled)
    grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]
    flags = (int(run.launch_cooperative_grid), int(run.launch_pdl))
    if _TRITON == (3, 6):  # a launcher compiled per kernel: scratch pointers, then metadata, then arguments

        def call(pointers):
            c_launch(grid_0, grid_1, grid_2, get_stream(device), function, *flags, None, None, packed,
                     None, None, None, *pointers, *tail)  # fmt: skip

    else:  # 3.7: one launcher for every kernel, told the signature on each call
        annotations, signature = run.arg_annotations, run.kernel_signature

        def call(pointers):
            c_launch(grid_0, grid_1, grid_2, get_stream(device), function, *flags, packed, None, None, None,
                     None, None, annotations, signature, (*pointers, *tail))  # fmt: skip

    return call


def _host_descriptors(compiled) -> tuple[Callable, dict] | None:
    """For a kernel given host TMA descriptors (triton 3.6): the C launch under Triton's Python wrapper and
    {parameter index: the descriptor's compile-time metadata}, read from that wrapper (driver.py's
    `wrap_handle_tensordesc`, whose `inner` turns each descriptor into a CUtensorMap on every launch).
    None when the kernel has none, or another triton, or anything is not as read."""
    run = compiled.run
    wrapper = getattr(run, "launch", None)
    if _TRITON != (3, 6) or not isinstance(wrapper, types.FunctionType) or not wrapper.__closure__:
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
        return None
    contents = (cell.cell_contents for cell in wrapper.__closure__)
    cells = dict(zip(wrapper.__code__.co_freevars, contents, strict=True))
    c_launch, indices, metas = (cells.get(n) for n in ("launcher", "tensordesc_indices", "tensordesc_meta"))
    if c_launch is None or isinstance(c_launch, types.FunctionType) or not indices or not metas:
        return None
    if len(metas) != len(indices) or any(m is None for m in metas):
        return None
    return c_launch, dict(zip(sorted(indices), metas, strict=True))


def _described_call(compiled, grid: tuple, tail: tuple, device: int, get_stream, described):
    """call(leading): Triton 3.6's C launch for a kernel whose leading arguments include host TMA
    descriptors, each expanded as Triton's wrapper does (`make_tensordesc_arg`: a CUtensorMap, its shape and
    strides) but encoded once per (address, shape, strides, box) and kept: the encoding is a driver call
    (cuTensorMapEncodeTiled) and depends on nothing else, so a kept one is exactly what a new one would be.
    Tensors go in as addresses, as in `_direct_call`."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    c_launch, metas = described
    function, packed = compiled.function, compiled.packed_metadata
    grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]
    flags = (int(compiled.run.launch_cooperative_grid), int(compiled.run.launch_pdl))
    encoded: dict[tuple, tuple] = {}

    def expand(i, arg) -> tuple:
        if i not in metas:
            return (arg.data_ptr(),)
        key = (i, arg.base.data_ptr(), *arg.shape, *arg.strides, *arg.block_shape, arg.padding)
        found = encoded.get(key)
        if found is None:
            if len(encoded) >= 64:  # addresses come and go: keep the recent ones
                encoded.clear()
            found = encoded[key] = tuple(make_tensordesc_arg(arg, metas[i]))
        return found

    def call(leading):
        flat = [value for i, arg in enumerate(leading) for value in expand(i, arg)]
        c_launch(grid_0, grid_1, grid_2, get_stream(device), function, *flags, None, None, packed,
                 None, None, None, *flat, *tail)  # fmt: skip

    return call


def _thin_launcher(compiled, grid: tuple, full: tuple, n_tensors: int, normal) -> Callable[..., None]:
    tail = full[n_tensors:]  # scalars and constexprs of the first call, in signature order
    get_device, get_stream = _device_and_stream()
    device = get_device()  # the function handle was loaded in this device's context
    if _direct and _c_launch(compiled) is not None:
        call = _direct_call(compiled, grid, tail, device, get_stream)
        return _guarded(lambda tensors: call([t.data_ptr() for t in tensors]), device, normal, "thin")
    described = _host_descriptors(compiled) if _direct else None
    if described is not None and all(i < n_tensors for i in described[1]):
        call = _described_call(compiled, grid, tail, device, get_stream, described)
        return _guarded(call, device, normal, "thin, descriptors kept")
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    grid_0, grid_1, grid_2 = (*grid, 1, 1)[:3]

    def through_run(tensors):
        run(grid_0, grid_1, grid_2, get_stream(device), function, packed, None, None, None, *tensors, *tail)

    return _guarded(through_run, device, normal, "thin, through compiled.run")


def _guarded(call, device: int, normal, kind: str) -> Callable[..., None]:
    """launcher(*tensors): call(tensors) unless another device is current or a launch hook is installed
    (then Triton's path); after an exception, Triton's path for good."""
    runtime = triton.knobs.runtime
    get_device = _device_and_stream()[0]
    state = {"broken": False}

    def launch(*tensors):
        if state["broken"] or get_device() != device or not _hooks_idle(runtime):
            return normal(*tensors)
        try:
            call(tensors)
        except Exception:  # arguments refused before the launch: Triton's path from now on, with its errors
            state["broken"] = True
            normal(*tensors)

    launch.kind = kind
    return launch


# --- timing a call step by step (the ch03_launch and ch05_launch benchmarks) -------------------------------


def thin_off(fn):
    """Mark a step for `host_us_per_step` to time with thin launches off: Triton's own launch path, as
    LABKERNELS_THIN_LAUNCH=0 gives."""
    fn.thin_off = True
    return fn


def through_run(fn):
    """Mark a step for `host_us_per_step` to time with thin launchers that go through compiled.run, as
    LABKERNELS_THIN_LAUNCH=run gives: Triton's Python step before its C launch, a driver call per tensor."""
    fn.through_run = True
    return fn


def host_us_per_step(steps: dict, calls: int = 2000) -> dict[str, float]:
    """{step: host µs per call} (`timing.host_us`), each step timed on its own under the setting its mark
    asks for; one untimed call first, so that a key's checked first call stays out of the loop. The setting
    from the environment comes back afterwards."""
    from labkernels import timing

    times = {}
    for step, fn in steps.items():
        enabled = not getattr(fn, "thin_off", False) and enabled_from_env()
        set_enabled(enabled, direct=not getattr(fn, "through_run", False) and direct_from_env())
        try:
            fn()
            times[step] = timing.host_us(fn, calls=calls)
        finally:
            set_enabled(enabled_from_env(), direct=direct_from_env())
    return times
