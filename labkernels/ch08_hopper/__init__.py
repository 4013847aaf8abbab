"""Chapter 08: Hopper by hand in Gluon: TMA copies, mbarrier pipelines, wgmma and warp specialization.

`models` (plain Python, both lanes) holds the arithmetic; `copy` and `gemm` the Gluon kernels (sm_90 only).
"""
