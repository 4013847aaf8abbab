// The interface between the CUDA kernels (*.cu, compiled by nvcc) and their torch glue (ops.cpp, compiled by
// the host compiler). Plain C++ types only: raw pointers, sizes, a dtype tag and a stream.
//
// Why the split: the torch headers cost far more to compile than our kernels, and nvcc pays for them several
// times over (it preprocesses and parses the file for the host and for the device): on the H200 host nvcc
// spends tens of seconds on <ATen/ATen.h> or <torch/library.h> alone, while a .cu that includes only the CUDA
// headers compiles in seconds (chapter 01 times the build). So the .cu files see no torch header: they get
// pointers and launch kernels, and everything that needs torch (checks, allocation, the current stream,
// TORCH_LIBRARY_IMPL) lives in ops.cpp, which the host compiler builds in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace labkernels {
namespace cuda {

enum class Dtype { kFloat, kDouble, kHalf, kBFloat16 };

// add_relu.cu — out = relu(x + y) over n dense elements; read 2n, write n.
//   vectorized: 16-byte loads and stores with a scalar tail (needs 16-byte aligned pointers); else one
//   element per thread.
cudaError_t launch_add_relu(Dtype dtype, const void* x, const void* y, void* out, int64_t n, bool vectorized,
                            cudaStream_t stream);

// scale_shift.cu — out = x * a + b over n dense elements; read n, write n.
cudaError_t launch_scale_shift(Dtype dtype, const void* x, void* out, int64_t n, double a, double b,
                               cudaStream_t stream);

// strided.cu — sizes and strides of a view, in elements, passed to the kernel by value.
constexpr int kStridedDims = 8;
struct Geometry {
  int ndim;
  int64_t sizes[kStridedDims];
  int64_t strides[kStridedDims];
};

// out (dense, n elements) = the view x described by gx; read n, write n.
cudaError_t launch_copy_strided(Dtype dtype, const void* x, void* out, const Geometry& gx, int64_t n,
                                cudaStream_t stream);

// out (dense) = relu(x + y) for views x and y of one shape; read 2n, write n.
cudaError_t launch_add_relu_strided(Dtype dtype, const void* x, const void* y, void* out, const Geometry& gx,
                                    const Geometry& gy, int64_t n, cudaStream_t stream);

// out (dense M x N) = the 2-D view x, through 32x32 shared-memory tiles; read MN, write MN.
cudaError_t launch_copy_2d_tiled(Dtype dtype, const void* x, void* out, int64_t M, int64_t N, int64_t stride_xm,
                                 int64_t stride_xn, cudaStream_t stream);

}  // namespace cuda
}  // namespace labkernels
