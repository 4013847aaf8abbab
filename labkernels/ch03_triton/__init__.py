"""Chapter 03 — Triton: thinking in blocks.

One op per module, read top to bottom: what it teaches and its traffic, a torch `reference()`, the
`_name_kernel`, and the `name()` launcher that checks its inputs, allocates and launches:

    from labkernels.ch03_triton.vector_add import vector_add
    from labkernels.ch03_triton.add_relu import add_relu
    from labkernels.ch03_triton.softmax import softmax
    from labkernels.ch03_triton.matmul import matmul
"""
