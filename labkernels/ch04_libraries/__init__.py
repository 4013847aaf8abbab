"""Chapter 04 — cuBLAS and cuDNN: when the library wins, why, and how to feed it.

from labkernels.ch04_libraries import gemm_model   # FLOPs, bytes, intensity, tiles and waves
from labkernels.ch04_libraries import libraries    # timing cuBLAS/cuDNN, kernel names, TF32 settings
from labkernels.ch04_libraries.splitk import matmul  # split-K, stream-K, TF32 K-major; kernel="auto"
from labkernels.ch04_libraries.conv import conv2d_nhwc  # implicit-GEMM convolution, NHWC
"""
