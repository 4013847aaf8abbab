// Device-side dtype helpers for the .cu files (CUDA headers only, no torch).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launch.h"

namespace labkernels {
namespace cuda {

// The type a kernel computes in: float for the 16-bit types (so each result rounds once, as torch's
// at::opmath_type does), the type itself otherwise. Conversions are explicit: torch compiles with
// __CUDA_NO_HALF_CONVERSIONS__, which removes the implicit ones.
template <typename T>
struct OpMath {
  using type = T;
  __host__ __device__ static T to(T v) { return v; }
  __host__ __device__ static T from(T v) { return v; }
};
template <>
struct OpMath<__half> {
  using type = float;
  __host__ __device__ static float to(__half v) { return __half2float(v); }
  __host__ __device__ static __half from(float v) { return __float2half_rn(v); }  // round to nearest even
};
template <>
struct OpMath<__nv_bfloat16> {
  using type = float;
  __host__ __device__ static float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  __host__ __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with the CUDA type of `dtype`: this file's AT_DISPATCH_FLOATING_TYPES_AND2.
template <typename F>
cudaError_t dispatch(Dtype dtype, F&& f) {
  switch (dtype) {
    case Dtype::kFloat:
      return f(Tag<float>{});
    case Dtype::kDouble:
      return f(Tag<double>{});
    case Dtype::kHalf:
      return f(Tag<__half>{});
    case Dtype::kBFloat16:
      return f(Tag<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

// relu(a + b) in the op-math type, rounded once; keeps NaN, like torch.relu.
template <typename T>
__device__ __forceinline__ T add_relu_element(T a, T b) {
  using M = OpMath<T>;
  const typename M::type v = M::to(a) + M::to(b);
  return M::from(v < typename M::type(0) ? typename M::type(0) : v);
}

}  // namespace cuda
}  // namespace labkernels
