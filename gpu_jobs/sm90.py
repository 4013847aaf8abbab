"""Compile a Triton kernel for sm_90 (an H100/H200) on any machine, and ask ptxas what it allocates.

Used by the experiments' `--registers` modes, which run without a GPU: the caller must have removed
TRITON_INTERPRET before importing triton (the kernels must be JIT functions, not interpreted ones).
"""

import os
import subprocess
import tempfile


def compile_sm90(kernel, signature: dict, constexprs: dict, warps: int, aligned: int = 4) -> str:
    """`kernel`'s PTX for sm_90. The first `aligned` arguments (the pointers) are marked 16-byte aligned, as
    a real launch specializes torch's allocations: without it the loads compile to scalar accesses and the
    register counts come out too high."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in range(aligned)}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]


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
