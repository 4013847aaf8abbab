"""Chapter 01: JIT C++/CUDA extensions, from a source file to a PyTorch op.

`labkernels.ch01_jit.ops` holds the course extension's ops (`add_relu`, `add_relu_naive`, `add_relu_out`,
`scale_shift`); the extension is built on the first call, not when this package is imported.
"""
