"""Timing a Triton answer from outside the learner's process: its kernels, replayed by the grader.

On the GPU lane a speed case of a Triton exercise is timed in two processes:

1. The learner's worker calls the answer twice on the grader's arguments (the first call compiles and
   autotunes). During the second, every launch of a compiled kernel is recorded: the kernel's binary (cubin)
   and metadata, the grid, and each argument as data: a tensor argument as "argument k of the call, at byte
   offset d", a buffer the answer allocated itself as scratch (its bytes as they were before the launch), a
   number as itself. `describe_launch` makes a record; nothing in it is code the grader runs on the host.
2. A fresh worker that never loads the learner's Python (`Replay`) rebuilds those kernels with Triton's own
   loader and launcher, makes every timed repetition's inputs just before it runs, launches the recorded
   sequence on them between CUDA events, and keeps the outputs the grader checks in host memory, where no
   later kernel can reach them. The learner's process holds no clock that counts: patching `torch.cuda.Event`,
   `time` or `torch.cuda.synchronize` there changes nothing.

What the replay relies on, and says when it fails: the answer's work is its Triton kernels. Torch operations
between its launches are not replayed (a buffer the wrapper zeroes is replayed as it was before the launch,
so zeroed scratch still works); launches that depend on the input values (not only on shapes) replay the
recorded call's choices. Host-side TensorDescriptor arguments are refused (pointers, or descriptors made
inside the kernel, work).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import torch

MAX_KERNELS, MAX_LAUNCHES, MAX_CUBIN_BYTES = 16, 256, 32 << 20
MAX_SCRATCH_BYTES = 512 << 20
# The launcher of triton 3.6 generates C source from these type names: anything else is refused.
_TYPE = re.compile(r"\*k?[a-z0-9]{1,10}|[iu](1|8|16|32|64)|fp(8e4nv|8e5|8e4b15|16|32|64)|bf16|f32|constexpr")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,200}")


class ReplayError(ValueError):
    """The recorded launches cannot be replayed (or were not made by Triton)."""


# --- the learner's worker: a launch as data --------------------------------------------------------------
def _extent_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first element to one past its last (what a kernel given t may address)."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def describe_arg(arg, template: list[torch.Tensor], scratch: dict) -> list:
    """One kernel argument as data. `template`: the call's tensor arguments; `scratch`: the buffers found so
    far ({storage pointer: [index, nbytes, bytes before the first launch that used it]})."""
    if isinstance(arg, torch.Tensor):
        ptr = arg.data_ptr()
        for k, t in enumerate(template):
            start = t.data_ptr()
            if start <= ptr < start + max(_extent_bytes(t), 1):
                return ["tensor", k, ptr - start]
        base = arg.untyped_storage().data_ptr()
        if base not in scratch:
            nbytes = arg.untyped_storage().nbytes()
            if nbytes > MAX_SCRATCH_BYTES:
                raise ReplayError(f"a buffer of {nbytes} bytes your wrapper allocated is too large to replay")
            raw = torch.empty(0, dtype=torch.uint8, device=arg.device).set_(arg.untyped_storage())
            scratch[base] = [len(scratch), nbytes, raw.to("cpu", copy=True)]  # as before this launch
        return ["scratch", scratch[base][0], ptr - base]
    if arg is None or isinstance(arg, bool | int | float):
        return ["value", arg]
    if type(arg).__name__ == "TensorDescriptor":
        raise ReplayError(
            "the grader replays kernels given pointers; a host-side TensorDescriptor argument is not "
            "replayed "
            "(make the descriptor inside the kernel with tl.make_tensor_descriptor, or pass the tensor)"
        )
    return ["value", None]  # a constexpr (its value is compiled into the kernel; the launcher skips it)


def describe_kernel(kernel) -> dict:
    """A compiled kernel (triton's CompiledKernel) as data: its cubin, metadata and argument types."""
    json_path = next(Path(p) for name, p in kernel.metadata_group.items() if name.endswith(".json"))
    return {
        "hash": str(kernel.hash),
        "cubin": bytes(kernel.asm["cubin"]),
        "metadata": json_path.read_text(),
        "signature": [[str(n), str(t)] for n, t in kernel.src.signature.items()],
    }


class LaunchRecorder:
    """Installed in the learner's worker (GPU lane): while `recording`, each launch of a compiled Triton
    kernel is described (before it runs: scratch is read as the kernel will find it)."""

    def __init__(self):
        self.template: list[torch.Tensor] | None = None
        self.kernels: dict[str, dict] = {}
        self.launches: list[dict] = []
        self.scratch: dict[int, list] = {}
        self.error: str | None = None

    def install(self) -> None:
        from triton.compiler.compiler import CompiledKernel

        original = CompiledKernel.__dict__["run"]
        if getattr(original.fget, "_labkernels_wrapped", False):
            return
        recorder = self

        def run(kernel):
            launcher = original.fget(kernel)
            if recorder.template is None:
                return launcher

            def recorded(gx, gy, gz, stream, function, packed, meta, enter, leave, *args):
                recorder.add(kernel, (gx, gy, gz), args)
                return launcher(gx, gy, gz, stream, function, packed, meta, enter, leave, *args)

            return recorded

        run._labkernels_wrapped = True
        CompiledKernel.run = property(run)

    def start(self, template: list[torch.Tensor]) -> None:
        self.template, self.kernels, self.launches, self.scratch, self.error = template, {}, [], {}, None

    def add(self, kernel, grid, args) -> None:
        if self.error is not None:
            return
        try:
            key = str(kernel.hash)
            if key not in self.kernels:
                self.kernels[key] = describe_kernel(kernel)
            described = [describe_arg(a, self.template, self.scratch) for a in args]
            self.launches.append({"kernel": key, "grid": [int(g) for g in grid], "args": described})
        except ReplayError as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001  (said, never hidden: the replay then cannot run)
            self.error = f"a launch could not be recorded: {type(e).__name__}: {e}"[:300]

    def finish(self) -> dict:
        self.template = None
        if self.error is not None:
            raise ReplayError(self.error)
        if not self.launches:
            raise ReplayError("your answer launched no compiled Triton kernel: there is nothing to time")
        order = list(self.kernels)
        scratch = sorted(self.scratch.values())
        return {
            "kernels": [self.kernels[k] for k in order],
            "launches": [{**launch, "kernel": order.index(launch["kernel"])} for launch in self.launches],
            "scratch": [raw for _, _, raw in scratch],
        }


# --- the grader's timing worker: the launches, rebuilt and run ---------------------------------------------
def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ReplayError(f"the recorded launches are malformed: {what}")


def validate(record) -> None:
    """Refuse anything that is not the plain data `LaunchRecorder.finish` makes, within its limits."""
    _check(isinstance(record, dict), "not a dict")
    kernels, launches, scratch = record.get("kernels"), record.get("launches"), record.get("scratch")
    _check(isinstance(kernels, list) and 0 < len(kernels) <= MAX_KERNELS, "kernel list")
    _check(isinstance(launches, list) and 0 < len(launches) <= MAX_LAUNCHES, "launch list")
    _check(isinstance(scratch, list) and all(isinstance(s, torch.Tensor) for s in scratch), "scratch list")
    _check(all(s.dtype == torch.uint8 and s.dim() == 1 and s.numel() <= MAX_SCRATCH_BYTES for s in scratch),
           "scratch buffers")  # fmt: skip
    for kernel in kernels:
        _check(isinstance(kernel, dict) and isinstance(kernel.get("cubin"), bytes), "a kernel's binary")
        _check(len(kernel["cubin"]) <= MAX_CUBIN_BYTES, "a kernel's binary is too large")
        signature = kernel.get("signature")
        _check(isinstance(signature, list) and len(signature) <= 256, "a kernel's signature")
        for item in signature:
            _check(isinstance(item, list) and len(item) == 2, "a signature entry")
            name, ty = item
            _check(isinstance(name, str) and _NAME.fullmatch(name) is not None, "an argument name")
            _check(isinstance(ty, str) and _TYPE.fullmatch(ty) is not None, f"argument type {ty!r}")
        try:
            meta = json.loads(kernel.get("metadata") if isinstance(kernel.get("metadata"), str) else "null")
        except ValueError:
            meta = None
        _check(isinstance(meta, dict), "metadata")
        _check(_NAME.fullmatch(str(meta.get("name", ""))) is not None, "the kernel's name")
        _check(isinstance(meta.get("target"), dict) and meta["target"].get("backend") == "cuda", "target")
    for launch in launches:
        _check(isinstance(launch, dict) and isinstance(launch.get("kernel"), int), "a launch")
        _check(0 <= launch["kernel"] < len(kernels), "a launch's kernel")
        grid = launch.get("grid")
        _check(isinstance(grid, list) and len(grid) == 3 and all(isinstance(g, int) for g in grid), "grid")
        _check(0 < grid[0] < 2**31 and 0 < grid[1] < 2**16 and 0 < grid[2] < 2**16, "grid size")
        args = launch.get("args")
        signature = kernels[launch["kernel"]]["signature"]
        _check(isinstance(args, list) and len(args) == len(signature), "argument count")
        for arg in args:
            _check(isinstance(arg, list) and len(arg) in (2, 3) and arg[0] in ("tensor", "scratch", "value"),
                   "an argument")  # fmt: skip
            if arg[0] == "value":
                _check(arg[1] is None or isinstance(arg[1], bool | int | float), "a scalar argument")
            else:
                _check(len(arg) == 3 and all(isinstance(v, int) and v >= 0 for v in arg[1:]), "a pointer")
                _check(arg[0] == "tensor" or arg[1] < len(scratch), "a scratch buffer")


class Replay:
    """The recorded launches as a callable: `replay(*args)` runs them on these arguments (tensors in
    `tensors_in` order, as the grader made them). Built in a worker that never imports the learner's code."""

    def __init__(self, record: dict, workdir: Path):
        validate(record)
        import triton
        from triton.compiler.compiler import CompiledKernel

        # Kernels that need global scratch (descriptors made in the kernel) get it from torch's allocator.
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        self.kernels = []
        for i, kernel in enumerate(record["kernels"]):
            folder = workdir / f"replay_{i}"
            folder.mkdir(parents=True, exist_ok=True)
            meta, cubin = folder / "kernel.json", folder / "kernel.cubin"
            meta.write_text(kernel["metadata"])
            cubin.write_bytes(kernel["cubin"])
            signature = dict(kernel["signature"])
            names = SimpleNamespace(arg_names=list(signature))
            src = SimpleNamespace(signature=signature, constants={}, fn=names)
            group = {"kernel.json": str(meta), "kernel.cubin": str(cubin)}
            self.kernels.append(CompiledKernel(src, group, f"replay{i}"))
        self.launches = record["launches"]
        self.pristine = [s.cuda() for s in record["scratch"]]  # copied into fresh buffers before each call

    def prepare(self, args, kwargs) -> list:
        """Each launch's arguments for this call: tensor arguments into these tensors, scratch fresh (GPU
        copies, stream-ordered before the timed window opens)."""
        from labkernels.grading.child import tensors_in

        tensors = tensors_in((args, kwargs))
        scratch = [p.clone() for p in self.pristine]
        calls = []
        for launch in self.launches:
            values = []
            for arg in launch["args"]:
                if arg[0] == "value":
                    values.append(arg[1])
                elif arg[0] == "tensor":
                    values.append(_at(tensors, arg[1], arg[2]))
                else:
                    values.append(_bytes_from(scratch[arg[1]], arg[2]))
            calls.append((self.kernels[launch["kernel"]], launch["grid"], values))
        return [calls, scratch]  # scratch held until the launches ran

    @staticmethod
    def launch(prepared: list) -> None:
        calls, _ = prepared
        stream = torch.cuda.current_stream().cuda_stream
        for kernel, (gx, gy, gz), values in calls:
            run = kernel.run  # loads the binary and builds the launcher on first use
            run(gx, gy, gz, stream, kernel.function, kernel.packed_metadata, None, None, None, *values)

    def __call__(self, *args, **kwargs) -> None:
        self.launch(self.prepare(args, kwargs))


def _bytes_from(buffer: torch.Tensor, offset: int) -> torch.Tensor:
    if offset >= max(buffer.numel(), 1):
        raise ReplayError("a recorded pointer lies outside its buffer")
    return buffer[offset:]


def _at(tensors: list, k: int, offset: int) -> torch.Tensor:
    """A byte view of tensor argument k starting `offset` bytes after its first element."""
    if k >= len(tensors):
        raise ReplayError("a recorded pointer names a tensor argument the call does not have")
    t = tensors[k]
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
    return _bytes_from(raw, t.storage_offset() * t.element_size() + offset)


__all__ = ["LaunchRecorder", "Replay", "ReplayError", "describe_arg", "validate"]
