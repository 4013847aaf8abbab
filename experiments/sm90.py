"""Compile a Triton kernel for sm_90 (an H100/H200) on any machine, and ask ptxas what it allocates.

Used by the experiments' `--registers` modes, which run without a GPU: the caller must have removed
TRITON_INTERPRET before importing triton (the kernels must be JIT functions, not interpreted ones).
"""

import os
import subprocess
import tempfile


def compile_sm90(
    kernel, signature: dict, constexprs: dict, warps: int, aligned=4, stages: int | None = None
) -> str:
    """`kernel`'s PTX for sm_90. The first `aligned` arguments (the pointers) are marked 16-byte aligned, as
    a real launch specializes torch's allocations: without it the loads compile to scalar accesses and the
    register counts come out too high. `aligned` may instead name the arguments to mark: pointers, and the
    integers a launch would find divisible by 16 (sizes and strides of 4096). `stages`: Triton's num_stages
    (its default when None)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    marked = range(aligned) if isinstance(aligned, int) else [kernel.arg_names.index(n) for n in aligned]
    attrs = {(i,): [["tt.divisibility", 16]] for i in marked}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": warps} | ({} if stages is None else {"num_stages": stages})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def ptxas_info(ptx: str) -> str:
    """What Triton's bundled ptxas reports for `ptx` on sm_90a (`-v`: registers, spills, shared memory)."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
            capture_output=True,
            text=True,
            check=True,
        )
    return done.stderr


def sass_and_ptxas(ptx: str) -> tuple[str, str]:
    """`ptx` assembled for sm_90a by Triton's bundled ptxas: the SASS (its bundled cuobjdump) and ptxas's
    `-v` report (registers, spill stores and loads)."""
    import triton

    tools = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin")
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/k.ptx", "w") as f:
            f.write(ptx)
        ptxas = [f"{tools}/ptxas", "-arch=sm_90a", "-v", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"]
        info = subprocess.run(ptxas, capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([f"{tools}/cuobjdump", "-sass", f"{tmp}/k.cubin"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    return sass, info


def opcodes(sass: str):
    """One count per instruction line (`/*0120*/  @!P0 LDG.E.128 R4, ...`), by opcode without modifiers."""
    import collections
    import re

    found = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, re.M)
    return collections.Counter(found)


def compiled_meta() -> dict:
    """The reference columns of a count compiled here: no device, this machine's torch and triton, today,
    and the revision."""
    import datetime

    import torch
    import triton

    from labkernels.env import git_revision  # $LABKERNELS_GIT_REV, else this checkout's HEAD

    return {"device": "sm_90 (compiled, no GPU)", "torch": torch.__version__, "triton": triton.__version__,
            "cuda": "", "date": datetime.date.today().isoformat(), "git": git_revision()}  # fmt: skip


def write_reference(path: str, fields: list[str], rows: list[dict]) -> None:
    """`rows` as a reference CSV (CRLF lines, as every file in labkernels/reference)."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows -> {path}")
