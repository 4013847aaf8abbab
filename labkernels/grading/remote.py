"""The learner's answer as the grading function sees it: a proxy whose calls run in a worker process.

`student(x, y, out)` sends the arguments (copies) to the worker (`child.py`), which runs the answer there;
the proxy then checks what came back and copies only the *outputs* (tensors the grader made with
`guarded_empty` or marked with `g.output`) back into the grader's tensors:

- every other tensor argument is an input: the grader's own copy is never touched, so a reference computed
  from it before or after the call is the reference of the inputs the grader drew; an answer that changed
  its inputs (zeroed them, `x.set_(out)`) fails the case, saying so;
- an argument whose memory the answer replaced (`out.set_(...)`, `resize_`) or whose layout changed fails;
- the answer never shares memory, frames or modules with the grader: it cannot read a reference, patch a
  comparison or see a score.

A worker that dies (crash, `os._exit`) fails the case it was in and is restarted for the next one; one that
hangs past the exercise's time limit is killed and the exercise stops there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch

from labkernels.grading import isolation, zygote
from labkernels.grading.child import recv, replace_tensors, send, tensors_in
from labkernels.grading.core import CaseFailed, _Skip

MAX_RESTARTS = 4


class Stop(BaseException):  # noqa: N818  (not an Exception: a case's `except Exception` must not swallow it)
    """The exercise cannot go on (time limit reached, the worker keeps dying)."""


# `python -I` ignores PYTHONPATH and the working directory (the learner's code cannot put a module of its own
# ahead of ours), so the worker is told where labkernels lives: installed or not (a checkout run from its
# root, as on a GPU image), it imports the same package as the grader.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_WORKER_MAIN = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('labkernels.grading.child', run_name='__main__', alter_sys=True)"
)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class Student:
    def __init__(
        self,
        answer: dict,
        *,
        requires: str | None,
        deadline: float,
        lane: str,
        timeout_s: float,
        forbids: tuple[str, ...] = (),
    ):
        self.answer = answer
        self.requires = requires
        self.forbids = forbids
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.lane = lane
        self.grader = None  # set by the runner: which tensors are outputs
        self._proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._restarts = 0
        self._under_init = False
        self._capture: list | None = None
        self.load_error: str | None = None
        self.refusals: list[str] = []  # calls the guard refused (torch compute ops, a kernel not its own)

    # --- the worker's life --------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._restarts > MAX_RESTARTS:
            raise Stop(f"your code ended its process {self._restarts} times; grading stopped")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self._proc = self._spawn(to_child_r, from_child_w)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        send(self._out, {"answer": self.answer, "requires": self.requires, "forbids": list(self.forbids)})
        reply = self._reply()
        if reply.get("status") == "load_error":
            self.load_error = str(reply.get("reason"))[:400]
            self.close()
            raise CaseFailed(self.load_error)

    def _spawn(self, fd_in: int, fd_out: int):
        """The worker process, in its own session and folder (the answer's prints go to a log there),
        sandboxed where grading uses a sandbox (`isolation`). Forked from the zygote where there is no CUDA
        device; a fresh interpreter where there is."""
        env = worker_env(self.lane)
        sandboxed = isolation.enabled(PACKAGE_ROOT)
        if not torch.cuda.is_available():
            for _ in range(2):  # an answer may have killed the zygote: a new one is started once
                try:
                    z = zygote.zygote_for(env, PACKAGE_ROOT, sandboxed)
                    self._tmp = tempfile.TemporaryDirectory(prefix="labkernels-worker-", dir=z.area)
                    return z.fork(fd_in, fd_out, self._tmp.name, os.path.join(self._tmp.name, "output.log"))
                except (ConnectionError, OSError):
                    continue
        self._tmp = tempfile.TemporaryDirectory(prefix="labkernels-worker-")
        sandbox = []
        self._under_init = sandboxed  # a process of its own under the sandbox's init (`isolation._init`)
        if sandboxed:
            os.mkdir(os.path.join(self._tmp.name, "root"))
            sandbox = isolation.prefix([self._tmp.name], PACKAGE_ROOT, os.path.join(self._tmp.name, "root"))
        with open(os.path.join(self._tmp.name, "output.log"), "wb") as log:
            return subprocess.Popen(
                [*sandbox, sys.executable, "-I", "-c", _WORKER_MAIN, PACKAGE_ROOT, str(fd_in), str(fd_out)],
                pass_fds=(fd_in, fd_out),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self._tmp.name,
                env=env,
                start_new_session=True,
            )

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            for conn in (self._in, self._out):
                conn.close()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _reply(self) -> dict:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0 or not self._in.poll(remaining):
            self.close()
            raise Stop(f"timed out after {self.timeout_s:.0f} s (an infinite loop, or a grid far too large?)")
        try:
            reply = recv(self._in, trusted=False)
        except (EOFError, OSError):
            raise CaseFailed(self._died()) from None
        except Exception as e:  # noqa: BLE001  (what came back is not plain data: refuse it)
            self.close()
            raise CaseFailed(f"your answer sent back something the grader does not read: {e}"[:300]) from None
        if not isinstance(reply, dict):
            raise CaseFailed("the answer's process sent back garbage")
        return reply

    def _died(self) -> str:
        proc = self._proc
        code = proc.wait() if proc is not None else None
        self.close()
        self._restarts += 1
        if code is not None and code > 128 and self._under_init:  # the init reports signal N as 128 + N
            code = 128 - code
        if code is not None and code < 0:
            return f"the process running your code crashed ({_signal_name(-code)})"
        if code == 0:
            return "your code ended its process with exit code 0 (os._exit?) before the case finished"
        return f"your code ended its process with exit code {code} before the case finished"

    def request(self, msg: dict) -> dict:
        if self.load_error:
            raise CaseFailed(self.load_error)
        if self._proc is None:
            self._start()
        try:
            send(self._out, msg)
        except (BrokenPipeError, OSError):
            raise CaseFailed(self._died()) from None
        reply = self._reply()
        if reply.get("status") == "refused":
            self.refusals.append(str(reply.get("reason"))[:400])
        if reply.get("status") != "ok":
            raise CaseFailed(str(reply.get("reason", "the answer failed"))[:400])
        return reply

    # --- calls ---------------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self.grader is not None and self.grader._skipping:
            raise _Skip  # a case not graded in this run: stop before running the answer
        if self._capture is not None:  # expect_bandwidth learns which call to time
            self._capture.append((args, kwargs))
            return None
        return self._call({"op": "call", "args": args, "kwargs": kwargs}, args, kwargs)

    def _call(self, msg: dict, args, kwargs):
        sent = tensors_in((args, kwargs))
        reply = self.request(msg)
        back = reply.get("tensors", [])
        if len(back) != len(sent):
            raise CaseFailed("the answer's process sent back the wrong number of tensors")
        self._take_outputs(sent, back)
        return self._resolve(reply.get("result"), sent)

    def map(self, arglist: list[tuple]) -> list:
        """Call the answer on each argument tuple (plain data), in one round trip; raises at an error."""
        return list(self.request({"op": "map", "arglist": [tuple(a) for a in arglist]})["result"])

    def build_inline(self, name: str, source: str, functions: list[str]) -> RemoteModule:
        self.request({"op": "build_inline", "name": name, "source": source, "functions": functions})
        return RemoteModule(self, name)

    def op(self, name: str):
        """A torch op the answer registered ("my_ops::relu_sq"), called in the worker."""

        def call(*args):
            return self._call({"op": "op_call", "name": name, "args": args}, args, {})

        return call

    def opcheck_exists(self, name: str) -> None:
        self.request({"op": "op_exists", "name": name})

    def opcheck(self, name: str, args: tuple) -> None:
        self.request({"op": "opcheck", "name": name, "args": args})

    def compile_call(self, name: str, args: tuple):
        return self.request({"op": "compile_call", "name": name, "args": args})["result"]

    @contextlib.contextmanager
    def capturing(self):
        self._capture = []
        try:
            yield self._capture
        finally:
            self._capture = None

    def time(
        self, args, kwargs, outputs: list[bool], *, seed: int, warmup: int, reps: int, keep=None
    ) -> list[float]:
        msg = {"op": "time", "args": args, "kwargs": kwargs, "outputs": outputs, "seed": seed, "keep": keep}
        return list(self.request({**msg, "warmup": warmup, "reps": reps})["result"])

    def record(self, args, kwargs) -> dict:
        """The answer's kernel launches on these arguments, as data (`replay.LaunchRecorder`)."""
        return self.request({"op": "record", "args": args, "kwargs": kwargs})["result"]

    def replayed(self, record: dict) -> Student:
        """A timing worker that replays `record` (the grader's launcher; none of the answer's Python)."""
        return Student(
            {"kind": "replay", "launches": record},
            requires=None,
            deadline=self.deadline,
            lane=self.lane,
            timeout_s=self.timeout_s,
        )

    def fetch(self, indices: list[int]) -> list[list[torch.Tensor]]:
        back = self.request({"op": "fetch", "indices": indices})["tensors"]
        return [list(v) for v in back]

    # --- what came back ------------------------------------------------------------------------------------
    def _take_outputs(self, sent: list[torch.Tensor], back: list) -> None:
        outputs = self.grader.output_storages() if self.grader is not None else set()
        storages_back: dict[int, int] = {}
        for i, (mine, theirs) in enumerate(zip(sent, back, strict=True)):
            if not isinstance(theirs, torch.Tensor) or not _same_layout(mine, theirs):
                raise CaseFailed(
                    f"tensor argument {i} came back with another shape, layout or dtype: write the results "
                    "into the tensors you were given"
                )
            key = mine.untyped_storage().data_ptr()
            other = storages_back.setdefault(theirs.untyped_storage().data_ptr(), key)
            if other != key:
                raise CaseFailed(f"tensor argument {i} now shares memory with another argument (set_?)")
        for i, (mine, theirs) in enumerate(zip(sent, back, strict=True)):
            if mine.untyped_storage().data_ptr() in outputs:
                _storage_bytes(mine).copy_(_storage_bytes(theirs).to(mine.device))
            elif not torch.equal(_storage_bytes(mine), _storage_bytes(theirs).to(mine.device)):
                raise CaseFailed(
                    f"your answer changed its input (tensor argument {i}); "
                    "inputs must stay as they were given"
                )

    def _resolve(self, result, sent):
        if isinstance(result, tuple) and len(result) == 2 and result[0] == "__labkernels_arg__":
            i = result[1]
            if isinstance(i, int) and 0 <= i < len(sent):
                return sent[i]
            raise CaseFailed("the answer's process sent back garbage")
        if isinstance(result, tuple | list):
            items = [self._resolve(v, sent) for v in result]
            return tuple(items) if isinstance(result, tuple) else items
        if isinstance(result, dict):
            return {k: self._resolve(v, sent) for k, v in result.items()}
        return result


class RemoteModule:
    """A C++ extension the worker built from the answer's source: attribute calls run there, guarded."""

    def __init__(self, student: Student, name: str):
        self._student, self._name = student, name

    def __getattr__(self, fn_name: str):
        def call(*args):
            msg = {"op": "module_call", "module": self._name, "name": fn_name, "args": args}
            return self._student._call(msg, args, {})

        return call


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and tuple(a.stride()) == tuple(b.stride())
        and a.storage_offset() == b.storage_offset()
        and a.untyped_storage().nbytes() == b.untyped_storage().nbytes()
    )


# The instructor's variables a grading process passes on; every other variable is built from scratch, so
# nothing the notebook's kernel set reaches the worker (or, in `make grade`, the next notebook).
PASS_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_EXTENSIONS_DIR",
    "CC",
    "CXX",
)


def worker_env(lane: str) -> dict:
    env = {k: os.environ[k] for k in PASS_ENV if k in os.environ}
    env["LABKERNELS_LANE"] = lane
    env["PYTHONHASHSEED"] = "0"
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env


__all__ = ["RemoteModule", "Stop", "Student", "replace_tensors", "worker_env"]
