"""Compile a Gluon kernel for Hopper (sm_90) on any machine, a CPU included: no GPU is needed to see the
shared memory the compiler allocates or the instructions it emits, only to run the result.

It drives `triton.compile` the way a launch would, from example arguments: tensor descriptors (over CPU
tensors: only their shapes, strides and dtype matter) and constexpr values. It uses Triton internals that
exist in 3.6 and 3.7 (`native_specialize_impl`, `GluonASTSource`).
"""

from __future__ import annotations

import torch
from triton import compile as triton_compile
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from labkernels.ch08_hopper.device import gl_dtype

HOPPER = GPUTarget("cuda", 90, 32)


def descriptor(
    rows: int, cols: int, block: list[int], dtype: torch.dtype = torch.bfloat16
) -> TensorDescriptor:
    """A TMA descriptor over a (rows, cols) tensor in `block` tiles, with the default swizzled layout."""
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype(dtype))
    return TensorDescriptor.from_tensor(torch.empty(rows, cols, dtype=dtype), block, layout)


def compile_for_hopper(kernel, args: dict, constexprs: dict, num_warps: int):
    """The compiled kernel (`.metadata.shared`: bytes of shared memory; `.asm["ptx"]`: the PTX) for sm_90."""
    signature, constants = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name], constants[(i,)] = "constexpr", constexprs[name]
        else:
            signature[name] = native_specialize_impl(BaseBackend, args[name], False, True, True)[0]
    source = GluonASTSource(kernel, signature, constants)
    return triton_compile(source, target=HOPPER, options={"num_warps": num_warps})
