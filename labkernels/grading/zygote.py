"""Workers forked from a process that has already imported torch: the CPU lane's way to start them.

A fresh `python -I` worker spends 2.5-3.5 s importing torch and labkernels before it runs a line of the
answer, and a chapter's solutions start a worker per exercise (25 for the course's, more for a class). The
zygote is started once per grading process, the way a worker is (an isolated interpreter, the worker's
environment, a session of its own), imports what every worker imports first (`labkernels.grading.child`),
and from then on only forks. Each fork becomes one worker: its own session, folder and output log, the
grader's two pipes, then `child.main`, exactly what a fresh worker runs. The zygote never runs the learner's
code and is never sent any; it reports how each of its workers ended (the exit code, or the signal).

Only where there is no CUDA device: a process that has touched the CUDA driver cannot hand it on across a
fork, so on a GPU machine every worker is started fresh (`remote.Student`).

    python -I -c <ZYGOTE_MAIN> PACKAGE_ROOT SOCKET_FD     # what `Zygote` runs; `serve` is the loop
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

_MAIN = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('labkernels.grading.zygote', run_name='__main__', alter_sys=True)"
)


class Zygote:
    """The grading process's end: `fork` a worker, `wait` for one to end. One per worker environment.

    Sandboxed (`isolation`), the zygote and its workers share one sandbox, whose only writable folder of the
    machine is `area`: each worker's folder is made there. Pids it reports are its namespace's own."""

    def __init__(self, env: dict, package_root: str, sandboxed: bool = False):
        from labkernels.grading import isolation

        self.env, self.sandboxed = env, sandboxed
        self.area = tempfile.mkdtemp(prefix="labkernels-zygote-")
        os.mkdir(os.path.join(self.area, "root"))
        sandbox = (
            isolation.prefix([self.area], package_root, os.path.join(self.area, "root")) if sandboxed else []
        )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # one message per request
        self.proc = subprocess.Popen(
            [*sandbox, sys.executable, "-I", "-c", _MAIN, package_root, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=tempfile.gettempdir(),
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _ask(self, request: dict, fds: tuple = ()) -> dict:
        socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
        reply = self.sock.recv(4096)
        if not reply:
            raise ConnectionError("the zygote ended")
        return json.loads(reply)

    def fork(self, fd_in: int, fd_out: int, cwd: str, log: str) -> ForkedWorker:
        """A worker reading requests from fd_in and writing replies to fd_out, in folder cwd."""
        pid = self._ask({"op": "fork", "cwd": cwd, "log": log}, (fd_in, fd_out))["pid"]
        return ForkedWorker(self, pid, self.host_pid(pid))

    def host_pid(self, pid: int) -> int:
        """This process's pid for the zygote's child `pid` (a pid in the sandbox's namespace)."""
        if not self.sandboxed:
            return pid
        from labkernels.grading.notebooks import _descendants

        for candidate in _descendants(self.proc.pid):
            try:
                status = open(f"/proc/{candidate}/status").read()
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
            if nspid and nspid[-1] == str(pid):
                return candidate
        raise ConnectionError(f"the zygote's worker {pid} is not among its processes")

    def close(self) -> None:
        self.sock.close()  # the zygote reads EOF and exits
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # `unshare --kill-child`: the sandbox's first process, and with it all the rest
            self.proc.wait()
        shutil.rmtree(self.area, ignore_errors=True)


class ForkedWorker:
    """What `remote.Student` needs of a worker process: its pid (its process group's id) and `wait()`."""

    def __init__(self, zygote: Zygote, inner_pid: int, pid: int):
        self.zygote, self.inner_pid, self.pid = zygote, inner_pid, pid
        self.returncode: int | None = None

    def wait(self) -> int | None:
        """Exit code (negative: the signal that ended it); None if the zygote died before it could tell."""
        if self.returncode is None:
            try:
                self.returncode = self.zygote._ask({"op": "wait", "pid": self.inner_pid})["code"]
            except (ConnectionError, OSError, ValueError):
                return None
        return self.returncode


_zygotes: dict[str, Zygote] = {}


@atexit.register
def _close_all() -> None:
    """At the grading process's exit: each zygote told to end, and waited for."""
    for z in _zygotes.values():
        z.close()
    _zygotes.clear()


def zygote_for(env: dict, package_root: str, sandboxed: bool = False) -> Zygote:
    """The running zygote for this environment, started (again) if there is none or it died."""
    key = json.dumps([env, sandboxed], sort_keys=True)
    z = _zygotes.get(key)
    if z is None or not z.alive():
        for stale in list(_zygotes.values()):  # one at a time: an environment that changed ends the old one
            stale.close()
        _zygotes.clear()
        z = _zygotes[key] = Zygote(env, package_root, sandboxed)
    return z


# --- the zygote's side -------------------------------------------------------------------------------------
def serve(sock_fd: int) -> int:
    from labkernels.grading import child  # torch, labkernels and the lane: what a fresh worker imports first

    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 65536, 2)
        except OSError:
            return 0
        if not msg:
            return 0  # the grading process closed its end, or ended
        request = json.loads(msg)
        if request["op"] == "fork":
            pid = os.fork()
            if pid == 0:
                sock.close()
                _become_worker(child, request, *fds)
            for fd in fds:
                os.close(fd)
            reply = {"pid": pid}
        else:
            try:
                _, status = os.waitpid(request["pid"], 0)
                reply = {"code": os.waitstatus_to_exitcode(status)}
            except ChildProcessError:
                reply = {"code": None}
        sock.send(json.dumps(reply).encode())


def _become_worker(child, request: dict, fd_in: int, fd_out: int) -> None:
    """In the forked process: what `subprocess.Popen(..., cwd, stdout=log, start_new_session=True)` would have
    set up, then the worker's loop. Never returns."""
    import random
    import traceback

    code = 1
    try:
        os.setsid()
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        random.seed()  # not the zygote's sequence, as a fresh process would not have it
        code = child.main(fd_in, fd_out)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001  (reported in the worker's log, as an uncaught error would be)
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110  (a closed stream: nothing left to write)
                pass
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1])))
