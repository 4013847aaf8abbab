"""Ship a learner's answer to the grader (`bundle`) and grade it (`run`): the answer runs in a worker process.

Why a process: under the Triton interpreter an unmasked store past a tensor's end silently corrupts the
host heap (the process dies later with `free(): invalid next size`); on the GPU an illegal address poisons
the CUDA context. Either would take the learner's notebook down with it. The child gets the answer as
*source*: the function, the module-level functions and `@triton.jit` kernels it calls, the modules it uses
and plain constants, written to a file and imported there (Triton's JIT reads kernel source from files).
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import time
import types

_PLAIN = (int, float, str, bool, type(None))


def _unwrap(obj):
    """The Python function under triton's JITFunction / Autotuner / Heuristics wrappers."""
    seen = 0
    while not inspect.isfunction(obj) and hasattr(obj, "fn") and seen < 8:
        obj, seen = obj.fn, seen + 1
    return obj


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _signature_names(source: str) -> set[str]:
    """Names a `def` uses outside its body: its decorators (`@gluon.jit`) and annotations (`x: gl.constexpr`).
    The body's names are in its code object; these are evaluated once, when the module defines it."""
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    args = node.args
    parts = [*node.decorator_list, node.returns]
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    parts += [a.annotation for a in every if a is not None]
    return {n.id for part in parts if part is not None for n in ast.walk(part) if isinstance(n, ast.Name)}


def _is_plain(value) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, tuple | list):
        return all(_is_plain(v) for v in value)
    return False


class _Collector:
    def __init__(self, home_module: str):
        self.home = home_module
        self.functions: dict[str, str] = {}  # name -> source, in discovery order
        self.imports: dict[str, str] = {}
        self.constants: dict[str, str] = {}

    def visit(self, name: str, obj) -> None:
        if name in self.functions:
            return
        fn = _unwrap(obj)
        if not inspect.isfunction(fn):
            raise TypeError(f"{name!r} is a {type(obj).__name__}, not a function: pass the function itself")
        if fn.__name__ == "<lambda>":
            raise TypeError(f"{name!r} is a lambda: write it as a `def` at the top level of a cell")
        if fn.__closure__:
            raise TypeError(
                f"{name!r} is a closure (defined inside another function): define it at top level"
            )
        try:
            source = textwrap.dedent(inspect.getsource(fn))
        except (OSError, TypeError) as e:
            raise TypeError(f"cannot read the source of {name!r}: {e}") from None
        self.functions[name] = source
        for ref in sorted(_code_names(fn.__code__) | _signature_names(source)):
            # co_names holds attribute names too: `type(x).__name__` names the module's `__name__`, which
            # must not ship (the answer's module is "submission", the name its kernels are known by).
            if ref in fn.__globals__ and not (ref.startswith("__") and ref.endswith("__")):
                self.add_global(ref, fn.__globals__[ref])

    def add_global(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType):
            self.imports[name] = value.__name__
        elif _is_plain(value):
            self.constants[name] = repr(value)
        elif inspect.isfunction(_unwrap(value)) and _unwrap(value).__module__ == self.home:
            self.visit(name, value)
        elif getattr(value, "__module__", None) and getattr(value, "__qualname__", None):
            module, qualname = value.__module__, value.__qualname__
            if "." not in qualname and module not in ("__main__", self.home) and not module.startswith("_"):
                self.imports[name] = f"{module}:{qualname}"
        # Anything else (a tensor, an object built in the notebook) is not shipped: the answer must not
        # depend on state computed earlier, or it could hand back a stale result. It fails as a NameError.

    def module_source(self) -> str:
        lines = ["import torch", "import triton", "import triton.language as tl"]
        for name, target in self.imports.items():
            if ":" in target:
                module, attr = target.split(":")
                lines.append(f"from {module} import {attr} as {name}")
            else:
                lines.append(f"import {target} as {name}")
        lines += [f"{name} = {value}" for name, value in self.constants.items()]
        return "\n".join(lines) + "\n\n\n" + "\n\n".join(self.functions.values())


def bundle(answer) -> dict:
    """Package an answer for the child: a function (shipped as source) or plain data (shipped as JSON)."""
    if callable(answer):
        fn = _unwrap(answer)
        name = getattr(fn, "__name__", None)
        if not name:
            raise TypeError(f"cannot grade a {type(answer).__name__}: pass a function")
        collector = _Collector(getattr(fn, "__module__", "__main__"))
        collector.visit(name, answer)
        return {"kind": "code", "entry": name, "source": collector.module_source()}
    try:
        json.dumps(answer)
    except TypeError as e:
        raise TypeError(
            f"an answer must be a function or plain data (str, numbers, lists, dicts): {e}"
        ) from None
    return {"kind": "data", "value": answer}


def run(ex, answer_bundle: dict, *, speed: bool, timeout_s: float, lane: str | None = None) -> dict:
    """Grade `answer_bundle` for exercise `ex` in this process (the grading process); the answer runs in
    a worker (`remote.Student`). Returns {"cases": [...], "error": str | None, "seconds": float}."""
    from labkernels.grading.core import Grader
    from labkernels.grading.remote import Stop, Student
    from labkernels.lane import LANE

    lane = lane or LANE
    start = time.monotonic()
    grader = Grader(speed=speed, lane=lane)
    student = Student(
        answer_bundle,
        requires=ex.requires,
        forbids=ex.forbids,
        deadline=start + timeout_s,
        lane=lane,
        timeout_s=timeout_s,
    )
    student.grader, grader.student = grader, student
    error = None
    try:
        ex.grade(student, grader)
    except Stop as e:
        error = str(e)
    except Exception as e:  # noqa: BLE001  (the grading function tripped on a malformed answer)
        from labkernels.grading.core import _reason

        error = f"grading stopped: {_reason(e)}"
    finally:
        student.close()
    if student.refusals:  # a kernel exercise answered without the kernel: no case counts
        why = student.refusals[0]
        for case in grader.results:
            if case["status"] == "pass":
                case.update(status="fail", earned=0, reason=f"not counted: {why}")
    if error and grader.current_case is not None:
        name = grader.current_case
        points = _case_points(ex, name)
        grader.results.append(
            {
                "event": "case",
                "case": name,
                "points": points,
                "gpu_only": speed,
                "status": "fail",
                "earned": 0,
            }
            | {"reason": error}
        )
        error = f"{error} during case {name!r}"
    return {"cases": grader.results, "error": error, "seconds": time.monotonic() - start}


def _case_points(ex, name: str) -> float:
    return 0  # the points of an interrupted case are not known here; it scores zero either way


__all__ = ["bundle", "run"]
