"""Chapter 05 — Fusion: every kind, by hand and by torch.compile.

One fusion kind per module, each read top to bottom (what it fuses and its traffic, a torch `reference()`,
the kernel, the launcher that checks, allocates and launches):

    from labkernels.ch05_fusion.pointwise import mul_add_sigmoid, chain    # pointwise (add+relu is ch03's)
    from labkernels.ch05_fusion.rmsnorm import rmsnorm_residual            # a reduction with its prologue
    from labkernels.ch05_fusion.epilogue import matmul_bias_gelu           # GEMM epilogue (ch03's matmul)
    from labkernels.ch05_fusion.prologue import int8_matmul                # dequantisation in the loads
    from labkernels.ch05_fusion.horizontal import sincos                   # two outputs from one read
    from labkernels.ch05_fusion import inductor, launch                    # reading Inductor; host cost
"""
