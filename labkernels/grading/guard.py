"""What the learner's answer did while it ran, recorded inside the worker process (see `worker`).

A kernel exercise asks for a kernel: the answer may allocate, view and copy tensors, but the values must come
from the learner's own Triton kernel (or C++ op), not from torch's compute ops, nor from a kernel of the
course. Two recorders run around every call of the answer:

- `AtenRecorder`, a TorchDispatchMode, sees every ATen op dispatched, including those a C++ extension's
  pybind function calls (`at::clamp` goes through the dispatcher too); a custom op (`my_ops::relu_sq`) is
  seen as itself, and its kernels must be registered from C++ (`python_kernels` reads the dispatcher's table);
- `TritonLaunches` wraps Triton's launch (compiled and interpreted) and records which kernel ran, and from
  which module: the learner's code is loaded as the module `submission`.

`verdict(...)` turns what they saw into the reason the learner reads, or None. These run in the process that
runs the learner's code, so a submission written to attack them could switch them off; they catch answers
that call torch or the course instead of writing the kernel, the verdicts themselves are decided elsewhere.
"""

from __future__ import annotations

import collections
import importlib.abc
import importlib.util
import os
import sys

from torch.utils._python_dispatch import TorchDispatchMode

SUBMISSION = "submission"  # the module name the learner's code is loaded under in the worker

# ATen ops an answer may call in a kernel exercise: allocation, views, metadata, copies and fills. Anything
# else in the aten namespace computes values, and a kernel exercise asks the learner's kernel to do that.
ALLOWED_ATEN = frozenset(
    """
    empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like
    new_zeros new_ones new_full fill_ zero_ copy_ _to_copy to clone contiguous detach alias lift_fresh
    view _unsafe_view as_strided _reshape_alias reshape t transpose permute expand expand_as unsqueeze squeeze
    slice select narrow split unbind flatten unflatten view_as movedim swapaxes numel size stride
    is_contiguous sym_size sym_stride sym_numel sym_storage_offset _local_scalar_dense item resize_
    is_same_size
    arange scalar_tensor _has_compatible_shallow_copy_type set_ record_stream
    """.split()
)


def _op_name(func) -> str:
    return func._schema.name  # "aten::relu", "my_ops::relu_sq"


class AtenRecorder(TorchDispatchMode):
    """Counts every op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _op_name(func)
        self.seen[name] += 1
        return func(*args, **(kwargs or {}))


def python_kernels(op_name: str) -> list[str]:
    """The dispatch keys whose kernel for `op_name` was registered from a Python file (not compiled code)."""
    import torch

    try:
        dump = torch._C._dispatch_dump(op_name)
    except RuntimeError:
        return []
    found = []
    for line in dump.splitlines():
        key, _, rest = line.partition(": registered at ")
        if rest and key.strip() not in ("debug", "Meta") and ".py:" in rest.split(" ::")[0]:
            found.append(key.strip())
    return found


class TritonLaunches:
    """Records (module, kernel name) of every Triton launch while `active`."""

    def __init__(self):
        self.launches: list[tuple[str, str]] = []
        self.codes: list = []  # the launched kernels' Python code objects (ForbiddenCalls.check_kernels)
        self.interpreted: dict[tuple, tuple] = {}  # interpreter launches to compile (`not_compiling`)
        self._compiled: dict[tuple, str | None] = {}
        self.active = False

    def install(self) -> None:
        import triton.runtime.jit as jit

        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:  # pragma: no cover - older triton
            pass
        for cls in classes:
            original = cls.run
            if getattr(original, "_labkernels_wrapped", False):
                continue

            def run(fn_self, *args, _original=original, **kwargs):
                if self.active:
                    fn = getattr(fn_self, "fn", None)
                    module = getattr(fn, "__module__", None) or "?"
                    self.launches.append((module, getattr(fn, "__name__", "?")))
                    if hasattr(fn, "__code__"):
                        self.codes.append(fn.__code__)
                    if type(fn_self).__name__ == "InterpretedFunction":
                        self._record_interpreted(fn_self, args, kwargs)
                return _original(fn_self, *args, **kwargs)

            run._labkernels_wrapped = True
            cls.run = run

    # --- the CPU lane: an interpreted kernel must still be a kernel ----------------------------------------
    # Under TRITON_INTERPRET=1 a kernel's body runs as Python, so host Python inside it (an import, a call of
    # torch or numpy) works there and nowhere else. Each distinct launch is compiled for an sm_90 target
    # (no GPU needed): Triton's front end refuses what a GPU could not run.

    LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

    def _record_interpreted(self, fn_self, args, kwargs) -> None:
        try:
            import inspect

            from triton.runtime.jit import mangle_type

            params = inspect.signature(fn_self.fn).parameters
            bound = dict(zip(params, args, strict=False)) | {k: v for k, v in kwargs.items() if k in params}
            for name, param in params.items():
                if name not in bound and param.default is not inspect.Parameter.empty:
                    bound[name] = param.default
            constexprs = {n: v for n, v in bound.items() if _is_constexpr(fn_self.fn, n)}
            types = {n: "constexpr" if n in constexprs else mangle_type(v) for n, v in bound.items()}
            constexprs |= {n: bound[n] for n, t in types.items() if t == "constexpr"}  # None: a constant
            options = {k: kwargs[k] for k in self.LAUNCH_OPTIONS if kwargs.get(k) is not None}
            key = (id(fn_self), tuple(types.items()), repr(sorted(constexprs.items())), repr(options))
        except Exception:  # noqa: BLE001  (a launch this cannot describe is not checked, never refused)
            return
        self.interpreted.setdefault(key, (fn_self, types, constexprs, options))

    def not_compiling(self) -> str | None:
        """Why a kernel launched under the interpreter does not compile for a GPU, or None."""
        for key, (fn_self, types, constexprs, options) in self.interpreted.items():
            if key not in self._compiled:
                self._compiled[key] = _compile_error(fn_self, types, constexprs, options)
            if self._compiled[key]:
                return (
                    f"your kernel {fn_self.fn.__name__} does not compile for a GPU: {self._compiled[key]} "
                    "(the interpreter runs a kernel's body as Python; Triton's compiler does not)"
                )
        return None


def _is_constexpr(fn, name: str) -> bool:
    annotation = fn.__annotations__.get(name)
    return annotation is not None and "constexpr" in str(getattr(annotation, "__name__", annotation))


def _as_jit(interpreted, made: dict):
    """A JITFunction for an interpreted kernel, the @jit helpers it calls made JITFunctions too (their
    globals hold interpreted functions)."""
    import types

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if id(interpreted) in made:
        return made[id(interpreted)]
    fn = interpreted.fn
    scope = dict(fn.__globals__)
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__module__, copy.__qualname__ = fn.__module__, fn.__qualname__
    copy.__annotations__, copy.__doc__ = fn.__annotations__, fn.__doc__
    made[id(interpreted)] = jit = JITFunction(copy)
    for name in fn.__code__.co_names:
        if isinstance(scope.get(name), InterpretedFunction):
            scope[name] = _as_jit(scope[name], made)
    return jit


def _compile_error(interpreted, types: dict, constexprs: dict, options: dict) -> str | None:
    """The first line of Triton's error for a language construct no kernel can hold, compiling this launch
    for an sm_90 target; else None. Only that error refuses: other compile errors here also came from
    kernels that compile and run on the H200 (the course's solutions), so they may be this check's own."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.errors import UnsupportedLanguageConstruct

    try:
        source = ASTSource(fn=_as_jit(interpreted, {}), signature=types, constexprs=constexprs)
        triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    except UnsupportedLanguageConstruct as e:  # Python no kernel can hold: an import, a with, a try, ...
        lines = [line for line in str(e).splitlines() if line.strip()]
        return lines[-1].strip()[:200] if lines else type(e).__name__
    except Exception:  # noqa: BLE001  (other failures here may be this check's, not the kernel's)
        return None
    return None


# --- what a learner's C++ library calls: its undefined dynamic symbols --------------------------------------
# A C++ answer can call ATen's CPU kernels directly (`at::cpu::clamp`, `at::native::...`): no dispatcher, so
# AtenRecorder never sees them. The library's dynamic symbol table names every function it needs from torch.

# Namespaces whose functions are operator kernels called without the dispatcher.
DIRECT_KERNEL_NAMESPACES = frozenset(
    """native cpu cuda meta compositeexplicitautograd compositeexplicitautogradnonfunctional
    compositeimplicitautograd""".split()
)


def undefined_symbols(path: str) -> list[str]:
    """The undefined symbols in an ELF64 little-endian library's dynamic symbol table: what it imports."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a 64-bit little-endian ELF library")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize or 24):
            name_at, _, _, shndx = struct.unpack_from("<IBBH", data, at)
            if shndx == 0 and name_at:  # undefined: provided by another library
                end = data.index(b"\0", strtab + name_at)
                names.append(data[strtab + name_at : end].decode("ascii", "replace"))
    return names


def _nested_name(symbol: str) -> list[str]:
    """The leading components of an Itanium-mangled nested name: "_ZN2at4_ops5clamp4callE..." ->
    ["at", "_ops", "clamp", "call"]."""
    if not symbol.startswith("_ZN"):
        return []
    i, parts = 3, []
    while i < len(symbol) and symbol[i] in "KVr":  # cv-qualifiers of a member function
        i += 1
    while i < len(symbol) and symbol[i].isdigit():
        j = i
        while symbol[j].isdigit():
            j += 1
        n = int(symbol[i:j])
        parts.append(symbol[j : j + n])
        i = j + n
    return parts


def _ops_structs() -> dict[str, str]:
    """at::_ops struct name -> op name ("add_Tensor" -> "add"), for every ATen op registered."""
    import torch

    structs = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, full = qualified.partition("::")
        if namespace == "aten":
            name, _, overload = full.partition(".")
            structs[f"{name}_{overload}" if overload else name] = name
    return structs


def aten_compute_calls(path: str) -> list[str]:
    """ATen compute functions the library at `path` imports: `at::_ops::<op>` (dispatched) and kernels called
    directly (`at::cpu::<op>` ...), other than allocation, views and copies (ALLOWED_ATEN)."""
    structs, found = None, set()
    for symbol in undefined_symbols(path):
        parts = _nested_name(symbol)
        if len(parts) < 3 or parts[0] != "at":
            continue
        if parts[1] == "_ops":
            structs = structs if structs is not None else _ops_structs()
            op = structs.get(parts[2], parts[2])
        elif parts[1] in DIRECT_KERNEL_NAMESPACES:
            op = parts[2].removesuffix("_outf").removesuffix("_out").removesuffix("_symint")
        else:
            continue
        if op not in ALLOWED_ATEN and op.rstrip("_") not in ALLOWED_ATEN:
            found.add(f"at::{parts[1]}::{parts[2]}")
    return sorted(found)


def loaded_libraries() -> set[str]:
    """The shared libraries mapped into this process now (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return set()
    return {p for p in paths if p.startswith("/") and (p.endswith(".so") or ".so." in p)}


class LibraryCalls:
    """The ATen compute functions that libraries loaded after `__init__` import (the learner's extensions)."""

    def __init__(self):
        self.before = loaded_libraries()
        self._checked: dict[tuple[str, int], list[str]] = {}

    def verdict(self) -> str | None:
        # torch, the venv and the system load libraries lazily too: only those built elsewhere are answers
        installed = tuple({sys.prefix, sys.base_prefix, "/usr", "/lib", "/lib64", "/opt"})
        for path in sorted(loaded_libraries() - self.before):
            if path.startswith(installed):
                continue
            try:
                key = (path, os.stat(path).st_mtime_ns)
                if key not in self._checked:
                    self._checked[key] = aten_compute_calls(path)
            except (OSError, ValueError, IndexError):
                continue  # gone, or not an ELF64 library: nothing to read
            calls = self._checked[key]
            if calls:
                shown = ", ".join(calls[:4]) + (" ..." if len(calls) > 4 else "")
                name = os.path.basename(path)
                return (
                    f"your library {name} calls torch's {shown}; this exercise asks for a C++ kernel that "
                    "computes the values itself"
                )
        return None


def verdict(requires: str | None, seen: collections.Counter, launches: list[tuple[str, str]]) -> str | None:
    """Why this call does not count for an exercise that `requires` a kernel ("triton" / "cpp"), or None."""
    if requires is None:
        return None
    foreign = sorted({f"{m}.{n}" for m, n in launches if m != SUBMISSION})
    if foreign:
        return (
            f"your answer launched {', '.join(foreign)}, a kernel that is not yours; "
            f"this exercise asks for your own {_kind(requires)}"
        )
    custom = sorted(n for n in seen if not n.startswith(("aten::", "prims::")))
    if requires == "triton" and custom:
        return f"your answer called the op {', '.join(custom)}; this exercise asks for a Triton kernel"
    for name in custom:
        keys = python_kernels(name)
        if keys:
            return (
                f"{name}'s kernel ({', '.join(keys)}) is registered from Python; "
                "this exercise asks for a C++ kernel"
            )
    compute = sorted(
        n for n in seen if n.startswith(("aten::", "prims::")) and n.split("::")[1] not in ALLOWED_ATEN
    )
    if compute:
        shown = ", ".join(compute[:4]) + (" ..." if len(compute) > 4 else "")
        return f"your answer called {shown}; this exercise asks for {_kind(requires)}, not torch's ops"
    if requires == "triton" and not launches:
        return "your answer launched no Triton kernel; this exercise asks for a Triton kernel"
    return None


def _kind(requires: str) -> str:
    return {"triton": "a Triton kernel", "cpp": "a C++ kernel"}.get(requires, requires)


class ForbiddenCalls:
    """While active (`with`), records the first call into a function defined in one of `modules`: the course's
    own answer to an exercise that asks the learner to write it. A profile hook sees Python calls however
    they are reached (imported by name, through `labkernels.<module>`, or from a helper of the learner's), in
    threads the answer starts too; a copy of that code run under another file name (`exec` of its source) is
    known by its bytecode; an answer that switches the hook off is refused for that."""

    SWITCHED_OFF = "<the profile hook, switched off>"
    # A code object this small (`return self._x`, a list comprehension) may be written the same way by anyone:
    # not a fingerprint. Docstrings are constants, so a helper typed from a public tutorial does not match.
    MIN_FINGERPRINT_BYTES = 120

    def __init__(self, modules):
        self.files: dict[str, str] = {}  # source file -> module name
        self.fingerprints: dict[tuple, str] = {}  # fingerprint -> "module.qualname"
        for name in modules:
            spec = importlib.util.find_spec(name)
            if spec is None or not spec.origin:
                raise ValueError(f"forbids names {name!r}, which is not an importable module")
            self.files[os.path.realpath(spec.origin)] = name
            self._fingerprint_file(spec.origin, name)
        self._by_filename: dict[str, str | None] = {}
        self._by_code: dict[object, str | None] = {}
        self.called: str | None = None
        self._previous = self._previous_threads = None

    @staticmethod
    def fingerprint(code) -> tuple | None:
        """What a copy keeps whatever its file, function and local names: the bytecode, the global and
        attribute names it uses and its plain constants."""
        if len(code.co_code) < ForbiddenCalls.MIN_FINGERPRINT_BYTES:
            return None
        consts = tuple(repr(c) for c in code.co_consts if not hasattr(c, "co_code"))
        return code.co_code, code.co_names, consts

    def _fingerprint_file(self, path: str, module: str) -> None:
        with open(path, encoding="utf-8") as f:
            todo = [compile(f.read(), path, "exec")]
        while todo:  # every function, method and nested function of the module
            code = todo.pop()
            todo += [c for c in code.co_consts if hasattr(c, "co_code")]
            key = self.fingerprint(code)
            if key is not None and code.co_name != "<module>":
                self.fingerprints.setdefault(key, f"{module}.{code.co_qualname}")

    def _identify(self, code) -> str | None:
        module = self._by_filename.get(code.co_filename, ...)
        if module is ...:  # the first call from this file: resolve it once
            module = self._by_filename[code.co_filename] = self.files.get(os.path.realpath(code.co_filename))
        if module is not None:
            return f"{module}.{code.co_qualname}"
        return self.fingerprints.get(self.fingerprint(code))

    def _hook(self, frame, event, arg):
        if event == "call" and self.called is None:
            code = frame.f_code
            if code not in self._by_code:
                self._by_code[code] = self._identify(code)
            self.called = self._by_code[code]

    def __enter__(self):
        self.called = None
        if self.files:
            import threading

            self._previous, self._previous_threads = sys.getprofile(), threading.getprofile()
            threading.setprofile(self._hook)  # threads the answer starts
            sys.setprofile(self._hook)  # a bound method: a new object each time, compared with == below
        return self

    def __exit__(self, *exc):
        if self.files:
            import threading

            if sys.getprofile() != self._hook and self.called is None:
                self.called = self.SWITCHED_OFF
            sys.setprofile(self._previous)
            threading.setprofile(self._previous_threads)
        return False

    def check_kernels(self, codes) -> None:
        """Triton kernels the answer launched, by their Python code: a compiled launch runs no Python frame
        the hook could see, so a copied kernel is known here."""
        for code in codes:
            if self.called is None and self.files:
                self.called = self._identify(code)

    def verdict(self) -> str:
        if self.called == self.SWITCHED_OFF:
            return (
                "your answer switched off the grader's record of calls (sys.setprofile); an answer must "
                "leave the grader alone"
            )
        return (
            f"your answer called {self.called}, the course's own code for this; the exercise asks you to "
            "write it yourself"
        )


class BlockGraderImports(importlib.abc.MetaPathFinder):
    """The grader's own modules (their references are answers) cannot be imported by the learner's code."""

    PREFIXES = ("labkernels.grading.exercises_", "grading_fixtures", "labkernels.grading.registry")

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.PREFIXES):
            raise ImportError(f"{fullname} is the grader's: an answer cannot import it")
        return None

    @classmethod
    def install(cls) -> None:
        for name in list(sys.modules):
            if name.startswith(cls.PREFIXES):
                del sys.modules[name]
        sys.meta_path.insert(0, cls())
