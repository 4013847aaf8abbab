"""A probe for "a TORCH_CHECK whose message streams a number kills the process" (seen on the H200 image,
torch 2.11+cu130, with extensions linked the default way).

Streaming text into a `std::ostringstream` writes bytes; streaming a number goes through the stream's locale
(`std::num_put`, found by a facet id). If two copies of libstdc++'s locale code live in one process (a
library that linked libstdc++ statically and exports it), an extension can bind the facet lookup to one copy
and the locale to the other: text works, numbers crash (the pattern of pytorch/pytorch#109923). On the H200
image the course extension, linked the default way, exported its own definitions of `std::locale::classic`
and the `ostream` number inserters beside the system's libstdc++.so.6: two providers.

`python -m labkernels.ch01_jit.abi_probe` builds a tiny op whose check streams an int64 and a double, calls
it in a fresh process set up like the course's (torch, triton, CUDA, the course extension loaded), and
prints which loaded files provide the stream and locale symbols: more than one provider is the diagnosis.
The same op is also built with libstdc++ linked privately into it (`-static-libstdc++`, symbols hidden):
the fix, which the course's builds (`build.load`, `diagnostics.build_inline`) now use wherever the compiler
has a `libstdc++.a`. The last line, `streamed:`, is the result for the link the course uses on this machine.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

_SOURCE = """
#include <c10/util/Exception.h>
#include <torch/library.h>
#include <cstdint>

namespace {
void streamed(int64_t n, double x) { TORCH_CHECK(false, "n = ", n, ", x = ", x); }
}  // namespace

TORCH_LIBRARY(NAMESPACE, m) { m.def("streamed(int n, float x) -> ()", &streamed); }
"""

#: torch's own link, and the course's private one (`build.PRIVATE_LIBSTDCXX`).
VARIANTS = {"default": [], "private_libstdcxx": ["-static-libstdc++", "-Wl,--exclude-libs,ALL"]}

#: ostream << long, << double, the classic locale, the ostringstream constructor (new string ABI).
SYMBOLS = (
    "_ZNSo9_M_insertIlEERSoT_",
    "_ZNSo9_M_insertIdEERSoT_",
    "_ZNSt6locale7classicEv",
    "_ZNSt7__cxx1119basic_ostringstreamIcSt11char_traitsIcESaIcEEC1Ev",
)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def providers(symbol: str) -> list[str]:
    """Every loaded file whose own definition of `symbol` a lookup through it would find."""
    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    found = set()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if ".so" in line.split()[-1]}
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL | 4)  # RTLD_NOLOAD: only already-loaded files
            address = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
        info = _DlInfo()
        if libdl.dladdr(address, ctypes.byref(info)) and info.dli_fname:
            found.add(info.dli_fname.decode())
    return sorted(found)


def build(variant: str) -> str:
    from labkernels.ch01_jit.diagnostics import build_inline

    name = f"lk_abi_probe_{variant}"
    return build_inline(
        name,
        _SOURCE.replace("NAMESPACE", name),
        extra_ldflags=VARIANTS[variant],
        unique=False,
        private_libstdcxx=False,  # exactly the variant's flags
    )


_CHILD = """
import sys
import labkernels, torch, triton  # noqa: F401  (the course's process: same libraries, same order)
if torch.cuda.is_available():
    torch.cuda.init()
from labkernels.ch01_jit import ops
ops.load()
torch.ops.load_library(sys.argv[1])
try:
    getattr(torch.ops, sys.argv[2]).streamed(7, 0.5)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0])
"""


def run_variant(variant: str) -> str:
    from labkernels.ch01_jit.build import child_env

    try:
        path = build(variant)
    except RuntimeError as e:  # e.g. no libstdc++.a for the private link
        return "could not build: " + (str(e).strip().splitlines() or ["?"])[0]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, path, f"lk_abi_probe_{variant}"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=600,
    )
    if done.returncode < 0:
        return f"crashed with signal {-done.returncode}"
    if done.returncode:
        return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1]
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    import torch
    import triton  # noqa: F401

    import labkernels  # noqa: F401
    from labkernels.ch01_jit import build, ops

    if torch.cuda.is_available():
        torch.cuda.init()
    ops.load()
    for symbol in SYMBOLS:
        print(f"{symbol}: provided by {providers(symbol) or ['(not loaded)']}")
    results = {variant: run_variant(variant) for variant in VARIANTS}
    for variant, result in results.items():
        print(f"{variant}: {result}")
    course = "private_libstdcxx" if build.private_libstdcxx_flags() else "default"
    print(f"the course links libstdc++ the {course} way on this machine")
    print("streamed:", "raised" if results[course].startswith("raised") else results[course])
    return 0


if __name__ == "__main__":
    sys.exit(main())
