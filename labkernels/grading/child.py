"""The worker: the only process that runs the learner's code. `python -I -m labkernels.grading.child IN OUT`.

It talks to the grading process over two pipes (file descriptors IN and OUT, which the learner's notebook
never sees): the grader sends the answer's source once, then one request per call (the arguments it
generated); the worker runs the answer and sends back what it returned and the tensors it was given, as they
are after the call. It never sees a reference, an expected value or a score, and nothing it sends is taken
as a verdict: the grading process compares outputs it reads back against references it computed itself.

Why a process: under the Triton interpreter an unmasked store past a tensor's end silently corrupts the host
heap; on the GPU an illegal address poisons the CUDA context; an answer may hang, exit or patch anything it
can reach. Whatever it does, it does here.
"""

from __future__ import annotations

import importlib.util
import io
import math
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path

SUBMISSION = "submission"


def send(conn: Connection, obj) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    conn.send_bytes(buf.getvalue())


def recv(conn: Connection, *, trusted: bool):
    """Load a message; from the worker (`trusted=False`) only plain data and tensors are accepted."""
    import torch

    return torch.load(io.BytesIO(conn.recv_bytes()), weights_only=not trusted, map_location=None)


def tensors_in(obj) -> list:
    """The tensors inside nested tuples / lists / dicts, in a fixed order."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=repr) for t in tensors_in(obj[key])]
    return []


def replace_tensors(obj, new: list, start: int = 0):
    """`obj` with its tensors replaced, in `tensors_in` order, by `new[start:]`; returns (obj, next index)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return new[start], start + 1
    if isinstance(obj, tuple | list):
        out = []
        for item in obj:
            item, start = replace_tensors(item, new, start)
            out.append(item)
        return type(obj)(out) if isinstance(obj, tuple) else out, start
    if isinstance(obj, dict):
        out = dict(obj)
        for key in sorted(obj, key=repr):
            out[key], start = replace_tensors(obj[key], new, start)
        return out, start
    return obj, start


def view_meta(t) -> tuple:
    return (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), t.storage_offset(), tuple(t.shape))


def plain(obj, depth: int = 0):
    """What the answer returned, as data the grader accepts (numbers, str, tuples, lists, dicts, tensors)."""
    import torch

    if depth > 20:
        raise TypeError("the answer returned a structure nested too deeply")
    if obj is None or isinstance(obj, bool | int | float | str | torch.dtype):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, torch.Size):
        return tuple(int(s) for s in obj)
    if isinstance(obj, tuple | list):
        items = [plain(v, depth + 1) for v in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in obj.items()}
    if type(obj).__module__ == "numpy" and hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()  # a numpy scalar: the same number, as Python's type (int stays int, float float)
    raise TypeError(f"the answer returned a {type(obj).__module__}.{type(obj).__name__}: return plain values")


def reason(e: BaseException) -> str:
    if isinstance(e, SystemExit):
        return f"your code called sys.exit({e.code!r}); the case was stopped there"
    if isinstance(e, KeyboardInterrupt):
        return "your code was interrupted (KeyboardInterrupt / SIGINT)"
    text = str(e).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(e).__name__}: {first}"[:300]


GPU_BUSY_CYCLES = 2_000_000  # about 1 ms at an H200's clock: longer than any answer's launch path


class Worker:
    def __init__(self, setup: dict):
        import labkernels  # noqa: F401  (picks the lane before triton; the grader chose it: LABKERNELS_LANE)
        from labkernels.grading import guard

        self.guard = guard
        self.requires = setup.get("requires")
        self.forbidden = guard.ForbiddenCalls(setup.get("forbids", ()))
        self.launches = guard.TritonLaunches()
        self.launches.install()
        self.libraries = guard.LibraryCalls() if self.requires == "cpp" else None
        self.recorder = None  # GPU lane: records the answer's launches for the grader's replay (`replay`)
        guard.BlockGraderImports.install()
        # Timers taken before the learner's code loads (a later patch of torch.cuda.Event cannot reach them).
        import torch

        self.perf_counter = time.perf_counter
        self.event = torch.cuda.Event if torch.cuda.is_available() else None
        self.synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self.gpu_busy = torch.cuda._sleep if torch.cuda.is_available() else None
        if torch.cuda.is_available() and setup["answer"]["kind"] != "replay":
            from labkernels.grading.replay import LaunchRecorder

            self.recorder = LaunchRecorder()
            self.recorder.install()
        self.modules: dict[str, object] = {}
        self.variants: dict[int, list] = {}
        self.entry = self._load(setup["answer"], Path.cwd())

    def _load(self, answer: dict, workdir: Path):
        if answer["kind"] == "data":
            value = answer["value"]
            return lambda: value
        if answer["kind"] == "replay":  # the grader's timing worker: the learner's kernels, not their Python
            from labkernels.grading.replay import Replay

            return Replay(answer["launches"], workdir)
        path = workdir / "submission.py"
        path.write_text(answer["source"])
        spec = importlib.util.spec_from_file_location(SUBMISSION, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[SUBMISSION] = module
        spec.loader.exec_module(module)
        return getattr(module, answer["entry"])

    # --- one guarded call --------------------------------------------------------------------------------
    def guarded(self, fn, args, kwargs, requires):
        """Run fn; returns a reply: {"status": "ok", "result", "tensors", "aliases"} or a refusal."""
        tensors = tensors_in((args, kwargs))
        before = [view_meta(t) for t in tensors]
        recorder = self.guard.AtenRecorder() if requires else None
        self.launches.launches.clear()
        self.launches.codes.clear()
        self.launches.interpreted.clear()
        self.launches.active = True
        try:
            with self.forbidden:
                if recorder is not None:
                    with recorder:
                        result = fn(*args, **kwargs)
                else:
                    result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001  (SystemExit and KeyboardInterrupt cost the case only)
            return {"status": "raised", "reason": reason(e), "type": type(e).__name__}
        finally:
            self.launches.active = False
        self.forbidden.check_kernels(self.launches.codes)
        if self.forbidden.called:
            return {"status": "refused", "reason": self.forbidden.verdict()}
        why = self.launches.not_compiling()  # any exercise: a launched kernel must be a kernel
        if why:
            return {"status": "refused", "reason": why}
        moved = [i for i, t in enumerate(tensors) if view_meta(t) != before[i]]
        if moved:
            return {
                "status": "refused",
                "reason": f"your answer replaced the memory of tensor argument {moved[0]} (set_, resize_ or "
                "a .data assignment): write the results into the tensors you were given",
            }
        if recorder is not None:
            why = self.guard.verdict(requires, recorder.seen, self.launches.launches)
            if why is None and requires == "cpp" and self.libraries is not None:
                why = self.libraries.verdict()
            if why:
                return {"status": "refused", "reason": why}
        try:
            result = plain(result)
        except TypeError as e:
            return {"status": "raised", "reason": str(e), "type": "TypeError"}
        return {"status": "ok", "result": self._aliased(result, tensors), "tensors": tensors}

    def _aliased(self, result, tensors):
        """Result tensors that are views of an argument come back as a reference to that argument."""
        import torch

        metas = {view_meta(t) + (tuple(t.stride()),): i for i, t in enumerate(tensors)}

        def swap(obj):
            if isinstance(obj, torch.Tensor):
                i = metas.get(view_meta(obj) + (tuple(obj.stride()),))
                return ("__labkernels_arg__", i) if i is not None else obj
            if isinstance(obj, tuple | list):
                items = [swap(v) for v in obj]
                return tuple(items) if isinstance(obj, tuple) else items
            if isinstance(obj, dict):
                return {k: swap(v) for k, v in obj.items()}
            return obj

        return swap(result)

    # --- requests ------------------------------------------------------------------------------------------
    def handle(self, msg: dict) -> dict:
        op = msg["op"]
        if op == "call":
            return self.guarded(self.entry, msg["args"], msg["kwargs"], self.requires)
        if op == "map":
            results = []
            for args in msg["arglist"]:
                reply = self.guarded(self.entry, args, {}, self.requires)
                if reply["status"] != "ok":
                    return {**reply, "index": len(results)}
                results.append(reply["result"])
            return {"status": "ok", "result": results, "tensors": []}
        if op == "build_inline":
            return self.build_inline(msg)
        if op == "module_call":
            fn = getattr(self.modules[msg["module"]], msg["name"])
            return self.guarded(fn, msg["args"], {}, msg.get("requires", self.requires))
        if op == "op_call":
            return self.guarded(self._op(msg["name"]), msg["args"], {}, msg.get("requires", self.requires))
        if op == "op_exists":
            return self.task(lambda: self._op(msg["name"]) and None)
        if op == "opcheck":
            return self.task(lambda: self._opcheck(msg["name"], msg["args"]))
        if op == "compile_call":
            return self.task(lambda: self._compile_call(msg["name"], msg["args"]))
        if op == "time":
            return self.time(msg)
        if op == "record":
            return self.record(msg)
        if op == "fetch":
            missing = [i for i in msg["indices"] if i not in self.variants]
            if missing:
                return {"status": "raised", "reason": f"timed repetition {missing[0]} was not kept"}
            return {"status": "ok", "result": None, "tensors": [self.variants[i] for i in msg["indices"]]}
        return {"status": "raised", "reason": f"unknown request {op!r}"}

    def task(self, fn) -> dict:
        try:
            result = fn()
        except BaseException as e:  # noqa: BLE001
            return {"status": "raised", "reason": reason(e), "type": type(e).__name__}
        return {"status": "ok", "result": result, "tensors": []}

    def build_inline(self, msg: dict) -> dict:
        from labkernels.ch01_jit import diagnostics

        try:
            self.modules[msg["name"]] = diagnostics.build_inline(
                msg["name"], msg["source"], functions=msg["functions"]
            )
        except diagnostics.CompileError as e:
            lines = str(e).splitlines()
            where = f" | {lines[1].strip()}" if len(lines) > 1 and "|" in lines[1] else ""
            return {"status": "raised", "reason": lines[0] + where, "type": "CompileError"}
        except BaseException as e:  # noqa: BLE001
            return {"status": "raised", "reason": reason(e), "type": type(e).__name__}
        return {"status": "ok", "result": None, "tensors": []}

    def _op(self, name: str):
        import torch

        namespace, op = name.split("::")
        try:
            return getattr(getattr(torch.ops, namespace), op).default
        except (AttributeError, RuntimeError):
            raise LookupError(f"there is no torch.ops.{namespace}.{op}") from None

    def _opcheck(self, name: str, args) -> None:
        import torch

        torch.library.opcheck(self._op(name), tuple(args))

    def _compile_call(self, name: str, args):
        import torch

        f = self._op(name)

        def model(x):
            return f(x) * 2 + 1

        return torch.compile(model, fullgraph=True, backend="aot_eager")(*args).detach()

    # --- speed: every timed repetition on inputs it has never seen -----------------------------------------
    def record(self, msg: dict) -> dict:
        """The answer's launches, as data for the grader's replay (`replay`): a first call compiles and
        autotunes, the second is recorded."""
        from labkernels.grading.replay import ReplayError

        if self.recorder is None:
            return {"status": "raised", "reason": "launches are recorded on the GPU lane only"}
        args, kwargs = msg["args"], msg["kwargs"]
        reply = self.guarded(self.entry, args, kwargs, self.requires)
        if reply["status"] != "ok":
            return reply
        self.recorder.start(tensors_in((args, kwargs)))
        try:
            reply = self.guarded(self.entry, args, kwargs, self.requires)
            record = self.recorder.finish()
        except ReplayError as e:
            return {"status": "raised", "reason": f"the grader cannot replay your kernels: {e}"}
        if reply["status"] != "ok":
            return reply
        return {"status": "ok", "result": record, "tensors": []}

    def time(self, msg: dict) -> dict:
        """Time the entry on `warmup + reps` fresh sets of tensors, each made just before its call (so no
        set exists while an earlier one runs). Sets listed in `keep` (all, without it) keep their outputs
        for `fetch`, in host memory."""
        from labkernels.grading.core import make_variants

        template_args, template_kwargs = msg["args"], msg["kwargs"]
        template = tensors_in((template_args, template_kwargs))
        count = msg["warmup"] + msg["reps"]
        keep = set(range(count) if msg.get("keep") is None else msg["keep"])
        self.variants = {}
        times = []
        for i in range(count):
            tensors = make_variants(template, msg["outputs"], i + 1, msg["seed"], only=i)[0]
            (args, kwargs), _ = replace_tensors((template_args, template_kwargs), tensors)
            if i == 0:  # checked like any call (guards, forbidden calls), not timed
                reply = self.guarded(self.entry, args, kwargs, self.requires)
                if reply["status"] != "ok":
                    return reply
                ms = math.nan
            else:
                ms = self._timed(self.entry, args, kwargs)
            if i >= msg["warmup"]:
                times.append(ms)
            if i in keep:
                self.variants[i] = [t.cpu() for t, out in zip(tensors, msg["outputs"], strict=True) if out]
            del tensors, args, kwargs
        return {"status": "ok", "result": times, "tensors": []}

    def _timed(self, fn, args, kwargs) -> float:
        from labkernels.grading.replay import Replay

        if isinstance(fn, Replay):  # scratch copies made here, before the clock starts
            prepared = fn.prepare(args, kwargs)
            call = lambda: Replay.launch(prepared)  # noqa: E731
        else:
            call = lambda: fn(*args, **kwargs)  # noqa: E731
        if self.event is not None:
            start, end = self.event(enable_timing=True), self.event(enable_timing=True)
            # The GPU is idle here (the last repetition was synchronised). Busy it for about a millisecond
            # first, so that `start` runs on the GPU only after the host has run the answer's Python and
            # launched its kernels: the events then time the GPU's work, not the launch latency in front of
            # it (tens of microseconds, which chapter 05 measures on its own and which would dominate a
            # kernel of 50 us).
            self.gpu_busy(GPU_BUSY_CYCLES)
            start.record()
            call()
            end.record()
            self.synchronize()
            return start.elapsed_time(end)
        t0 = self.perf_counter()
        call()
        return (self.perf_counter() - t0) * 1e3


def main(fd_in: int, fd_out: int) -> int:
    conn_in, conn_out = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    setup = recv(conn_in, trusted=True)
    try:
        worker = Worker(setup)
    except BaseException as e:  # noqa: BLE001  (an answer that does not even load fails every case, with why)
        detail = traceback.format_exception_only(type(e), e)[-1].strip()[:300]
        what = "the grader could not replay your kernels" if setup["answer"]["kind"] == "replay" else (
            "your code could not be loaded"
        )
        send(conn_out, {"status": "load_error", "reason": f"{what}: {detail}"})
        return 3
    send(conn_out, {"status": "ready"})
    while True:
        try:
            msg = recv(conn_in, trusted=True)
        except EOFError:
            return 0
        send(conn_out, worker.handle(msg))


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
