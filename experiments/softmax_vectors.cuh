// Helpers the CUDA softmax experiments share (softmax_cluster.cu, softmax_staged.cu): rows are read as 16-byte
// vectors, computed in fp32, and exponentiated with the hardware's base-2 exponential, as Triton's tl.exp2.
#pragma once

#include <cuda_runtime.h>

#include "dtypes.cuh"  // labkernels/csrc/cuda: OpMath (the fp32 compute type of half and bfloat16)

namespace labkernels {
namespace cuda {
namespace experiments {

// 2^v in one instruction (MUFU.EX2), as Triton's tl.exp2: exp(x - m) = 2^((x - m) * log2 e).
__device__ __forceinline__ float fast_exp2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// Element e of a 16-byte vector of scalar_t, in fp32 (4 floats or 8 halves / bfloat16s).
template <typename scalar_t>
__device__ __forceinline__ float lane_of(const uint4& v, int e) {
  return static_cast<float>(OpMath<scalar_t>::to(reinterpret_cast<const scalar_t*>(&v)[e]));
}

}  // namespace experiments
}  // namespace cuda
}  // namespace labkernels
