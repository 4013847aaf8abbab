"""An OS sandbox for a learner's code: unprivileged Linux namespaces (`unshare`), no daemon, no root needed.

`make grade` runs two kinds of process that execute a submission: the notebook's kernel and the worker that
runs each handed-in answer. Both start as `prefix(...) + argv`, which runs this file inside new user, mount,
PID, network and IPC namespaces; it builds a root from an allow-list, pivots into it and execs argv:

- `/usr`, `/etc`, the interpreter and the venv, PYTHONPATH's folders, the compilers (Triton's launcher and C++
  extensions build inside) and the course package, read-only at their own paths
  (interpreters, shebangs and `.pth` files keep working); the grader's exercise files (their references are
  answers) hidden under empty files; nothing else of the machine: not `solutions/`, not the instructor's
  home, not other students' folders;
- a fresh `/tmp` (also `$HOME`) and `/dev/shm`, in memory: nothing persists to the next run;
- the run's own folder, read-write, at its own path: the notebook's copy and its hand-in file;
- the compiler caches (torch extensions, Triton) as overlays: the instructor's builds are reused, what the
  learner writes lands in memory and is never seen by anyone else;
- its own PID namespace (the grader, other students, Jupyter servers: invisible, so nothing to attach to or
  signal), argv its PID 2 under a small init (`_init`): when argv ends, the namespace ends; and a network
  with no interface up.

Its mounts are made by "root" of the first user namespace; the learner's code then runs in a second one, so
it can neither unmount nor remount them (the kernel locks mounts inherited from a more privileged namespace).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys

# mount(2) flags
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

NAMESPACES = ["--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--fork", "--kill-child"]
DEVICES = ["null", "zero", "full", "random", "urandom", "tty"]
SYSTEM_RO = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"]
HOME = "/tmp/home"


class Unavailable(RuntimeError):
    """No sandbox can start on this machine."""


# `make grade` says whether its processes run sandboxed ("on") or not ("off", the instructor's --unsafe);
# unset (`check` at home, the tests), a sandbox is used wherever one starts.
ENV = "LABKERNELS_SANDBOX"
SANDBOXED = "sandboxed (user, mount, PID, network namespaces)"
UNSAFE = "UNSAFE: not sandboxed (--unsafe)"


def require(unsafe: bool, package_root: str) -> str:
    """The mode `make grade` grades in (recorded in its reports); refuses when no sandbox starts here."""
    why = why_unavailable(package_root)
    if why and not unsafe:
        raise Unavailable(
            f"cannot start the grading sandbox here ({why}). Submissions must not run as you, beside "
            "your files: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
            "on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), grade in the course's container, or "
            "pass --unsafe to grade without a sandbox, at your own risk"
        )
    os.environ[ENV] = "off" if unsafe else "on"
    return UNSAFE if unsafe else SANDBOXED


def enabled(package_root: str) -> bool:
    setting = os.environ.get(ENV)
    if setting in ("on", "off"):
        return setting == "on"
    return why_unavailable(package_root) is None


def mode(package_root: str) -> str:
    if enabled(package_root):
        return SANDBOXED
    return UNSAFE if os.environ.get(ENV) == "off" else "not sandboxed (no sandbox starts here)"


# --- the grader's side --------------------------------------------------------------------------------------


def spec(rw: list[str], package_root: str) -> dict:
    """What the sandbox shows: `rw` folders read-write, the rest read-only (see the module's docstring)."""
    package = os.path.join(package_root, "labkernels")
    ro = [p for p in SYSTEM_RO if os.path.lexists(p)]
    ro += [sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)), package]
    ro += python_path_dirs(package_root) + toolchain_dirs(package_root)
    hide = sorted(glob.glob(os.path.join(package, "grading", "exercises_ch*.py")))
    hide += sorted(glob.glob(os.path.join(package, "grading", "__pycache__", "exercises_ch*")))
    gpu = sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri"))
    caches = {"TORCH_EXTENSIONS_DIR": torch_extensions_root(), "TRITON_CACHE_DIR": triton_cache()}
    return {
        "ro": sorted(set(ro) | ({"/sys"} if gpu else set())),  # CUDA reads the PCI tree in /sys
        "rw": [os.path.realpath(p) for p in rw],
        "hide": hide,
        "devices": gpu,
        "caches": {var: lower for var, lower in caches.items() if lower and os.path.isdir(lower)},
    }


def _shareable(path: str, package_root: str) -> bool:
    """A folder the sandbox may show read-only: not the root, /tmp or a home, and no folder of the course's
    own: not one that holds it (and so `solutions/`), not one inside it (the package and a venv there are
    shown on their own)."""
    course = os.path.realpath(package_root)
    homes = {os.path.realpath(os.path.expanduser("~")), "/", "/home", "/root", "/tmp"}
    if not os.path.isdir(path) or path in homes:
        return False
    return not (course == path or course.startswith(path + os.sep) or path.startswith(course + os.sep))


def toolchain_dirs(package_root: str) -> list[str]:
    """Where the compilers live that Triton (its launcher) and torch's C++ extensions call, and the folders on
    LD_LIBRARY_PATH: outside /usr (the GPU image's gcc is /opt/gcc/bin/gcc) the sandbox showed none, so no
    kernel or extension built inside it. A compiler's install prefix is shown whole (its headers, libraries
    and helpers sit beside bin/)."""
    found = []
    tools = [os.environ.get(var, "") for var in ("CC", "CXX")]
    tools += [shutil.which(name) or "" for name in ("cc", "c++", "gcc", "g++", "clang", "nvcc")]
    for tool in filter(None, tools):
        for path in {os.path.abspath(tool), os.path.realpath(tool)}:
            folder = os.path.dirname(path)
            found.append(os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder)
    found += [os.environ.get(var, "") for var in ("CUDA_HOME", "CUDA_PATH")]
    found += os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    system = tuple(p.rstrip("/") + "/" for p in SYSTEM_RO)
    shown = []
    for path in (os.path.realpath(p) for p in found if p):
        if _shareable(path, package_root) and not (path + "/").startswith(system) and path not in shown:
            shown.append(path)
    return shown


def python_path_dirs(package_root: str) -> list[str]:
    """Folders the grader's Python imports packages from outside its prefix: `PYTHONPATH` entries and the
    user site (`pip install --user`, or `--target` as on the GPU image). Without them the notebook's kernel
    finds no nbformat or ipykernel inside. A folder that holds the course (and so `solutions/`), the root or
    a home is left out: the package is bound on its own."""
    import site

    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep) + [site.getusersitepackages()]
    return [os.path.realpath(e) for e in entries if e and _shareable(os.path.realpath(e), package_root)]


def torch_extensions_root() -> str:
    """Where torch builds C++ extensions for this process (the folder `TORCH_EXTENSIONS_DIR` names)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.path.realpath(os.environ["TORCH_EXTENSIONS_DIR"])
    import torch
    import torch.utils.cpp_extension as ext

    # Unset, torch builds below its default root in a folder per interpreter and accelerator.
    accelerator = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(ext.get_default_build_root(), f"{python}_{accelerator}")


def triton_cache() -> str:
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def prefix(rw: list[str], package_root: str, root: str) -> list[str]:
    """The command to put in front of argv: argv then runs sandboxed. `root` is an empty folder that becomes
    the sandbox's root (it stays empty outside)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise Unavailable("no `unshare` command (util-linux) on this machine")
    body = dict(spec(rw, package_root), root=root)
    return [
        unshare,
        *NAMESPACES,
        sys.executable,
        "-I",
        "-S",
        os.path.abspath(__file__),
        json.dumps(body),
        "--",
    ]


_probed: dict[str, str | None] = {}


def why_unavailable(package_root: str) -> str | None:
    """None if a sandbox starts here (tried once per process, for real), else why not."""
    if package_root not in _probed:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="labkernels-probe-") as tmp:
            root, shared = os.path.join(tmp, "root"), os.path.join(tmp, "shared")
            os.mkdir(root)
            os.mkdir(shared)
            check = "import os; open('ok', 'w').write(f'{os.getppid()} {os.getpid()}')"
            try:
                cmd = prefix([shared], package_root, root) + [sys.executable, "-I", "-c", check]
                proc = subprocess.run(cmd, cwd=shared, capture_output=True, text=True, timeout=60)
            except (Unavailable, OSError, subprocess.SubprocessError) as e:
                _probed[package_root] = str(e)
                return _probed[package_root]
            found = os.path.join(shared, "ok")
            ok = os.path.exists(found) and open(found).read() == "1 2"  # PID 2, under the sandbox's init
            last = (proc.stderr.strip().splitlines() or ["no error message"])[-1]
            why = f"a sandboxed process did not start in a PID namespace of its own: {last}"
            _probed[package_root] = None if ok else why
    return _probed[package_root]


# --- inside: runs as "root" of the new user namespace, before the learner's code ----------------------------

_libc = None


def _sys(name: str, *args) -> None:
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args[:2]}: {os.strerror(err)}")


def _mount(source, target, fstype=None, flags=0, data=None) -> None:
    enc = [None if a is None else a.encode() for a in (source, target, fstype, data)]
    _sys("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def _bind(path: str, root: str, *, read_only: bool) -> None:
    target = root + path
    if os.path.islink(path):  # /bin -> usr/bin on a merged /usr: the same link
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    # Recursive: a tree with mounts below it (/sys and its cgroup mounts) came into this user namespace
    # locked together, and binding its top alone fails (EINVAL, as on the GPU machine's /sys).
    _mount(path, target, None, MS_BIND | MS_REC)
    if read_only:  # each mount of the tree, top first: a remount covers one mount, not those below it
        for point in _mounts_under(target):
            _read_only(point)


def _mounts_under(target: str) -> list[str]:
    """Mount points at or below `target`, parents first (from /proc/self/mountinfo)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")  # octal escapes: "\040" is a space
            if point == target or point.startswith(target.rstrip("/") + "/"):
                points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"))


def _read_only(point: str) -> None:
    """Remount read-only; a remount may add read-only, and must keep the flags the mount is locked with."""
    flags = os.statvfs(point).f_flag
    kept = flags & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
    kept |= MS_RELATIME if flags & 4096 else 0  # ST_RELATIME
    _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _overlay(lower: str, root: str, inside: str, scratch: str) -> None:
    """The instructor's cache read through, writes kept in memory; an empty folder where overlays fail."""
    os.makedirs(root + inside)
    os.makedirs(scratch + "/upper")
    os.makedirs(scratch + "/work")
    try:
        options = f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work"
        _mount("overlay", root + inside, "overlay", MS_NOSUID | MS_NODEV, options)
    except OSError:
        pass  # a cold cache: slower (every build again), never less safe


def build_root(body: dict) -> None:
    root = body["root"]
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")  # the new root: in memory, empty
    os.makedirs(root + "/tmp")
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")  # fresh /tmp and $HOME
    os.makedirs(root + HOME)
    for path in sorted(body["ro"], key=lambda p: p.count("/")):  # parents before what is below them
        if os.path.lexists(path):
            _bind(path, root, read_only=True)
    for path in body["rw"]:  # the run's own folder: the notebook's copy, the hand-in file, kernel sockets
        _bind(path, root, read_only=False)
    open(root + "/.empty", "w").close()
    for path in body["hide"]:  # the grader's references: an empty, read-only file in their place
        _mount(root + "/.empty", root + path, None, MS_BIND)
        _mount(None, root + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/dev")  # a minimal /dev: no disks, no other terminals; GPUs on the GPU lane only
    _mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "mode=0755")
    for dev in [f"/dev/{d}" for d in DEVICES] + body["devices"]:
        if os.path.exists(dev):
            _bind(dev, root, read_only=False)
    os.makedirs(root + "/dev/shm")
    _mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for name, target in [("fd", "/proc/self/fd"), ("stdin", "fd/0"), ("stdout", "fd/1"), ("stderr", "fd/2")]:
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")  # this PID namespace's processes only
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for i, (var, lower) in enumerate(sorted(body["caches"].items())):
        _overlay(lower, root, f"/tmp/cache/{var.lower()}", f"{root}/tmp/.overlay{i}")
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)  # the root itself: read-only


def enter(body: dict, argv: list[str]) -> None:
    """Build the root, pivot into it, drop into a second user namespace, exec argv. Never returns."""
    cwd = os.getcwd()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here propagates back to the machine
    build_root(body)
    os.chdir(body["root"])
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"no pivot_root syscall number for {os.uname().machine}")
    _sys("syscall", ctypes.c_long(number), b".", b".")  # the new root on top of the old one ...
    _sys("umount2", b".", MNT_DETACH)  # ... and the old one gone: no path leads back to the machine
    os.chdir(cwd if os.path.isdir(cwd) else "/tmp")
    uid, gid = os.getuid(), os.getgid()
    _sys("unshare", CLONE_NEWUSER)  # mounts locked from here on (see the module's docstring)
    for name, text in [("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")]:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    _sys("prctl", PR_SET_PDEATHSIG, 9)  # killed with `unshare` (its parent), whatever else happens
    env = dict(os.environ, HOME=HOME, TMPDIR="/tmp")
    for var in body["caches"]:
        env[var] = f"/tmp/cache/{var.lower()}"
    for var in (
        "XDG_RUNTIME_DIR",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "JUPYTER_RUNTIME_DIR",
    ):
        env.pop(var, None)  # folders of the instructor's, not visible here
    # A pid of the grader's namespace, meaningless here: with it ipykernel watches its parent, sees PID 1
    # (the init below) and exits at once, as a kernel whose launcher died would.
    env.pop("JPY_PARENT_PID", None)
    _init(argv, env)


def _init(argv: list[str], env: dict) -> None:
    """PID 1 of the namespace: runs argv as its child, reaps orphans, ends with the child's status. Never
    returns. argv is not PID 1 itself because PID 1 ignores every signal it has no handler for, those it
    sends itself included: as PID 1 an answer's abort() ended in SIGSEGV, not SIGABRT, and a SIGTERM it sent
    itself did nothing (what `docker run --init` fixes the same way). A child killed by signal N is reported
    as exit code 128 + N, as a shell does: PID 1 cannot end itself with a signal."""
    pid = os.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    os.closerange(3, 4096)  # the grader's pipes: the child alone holds them, so its death reads as EOF
    _sys("prctl", PR_SET_DUMPABLE, 0)  # no process here may attach to this one
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)  # then the kernel ends the namespace's orphans


if __name__ == "__main__":
    split = sys.argv.index("--")
    enter(json.loads(sys.argv[1]), sys.argv[split + 1 :])
