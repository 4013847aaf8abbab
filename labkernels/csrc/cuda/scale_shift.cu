// scale_shift on CUDA: out = x * a + b, one element per thread of a grid-stride loop, for float, double, half
// and bfloat16 (the torch side is in ops.cpp). Traffic: read n, write n elements.
#include <cstdint>

#include "dtypes.cuh"
#include "launch.h"

namespace labkernels {
namespace cuda {
namespace {

template <typename scalar_t>
__global__ void scale_shift_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t n,
                                   typename OpMath<scalar_t>::type a, typename OpMath<scalar_t>::type b) {
  using M = OpMath<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = M::from(M::to(x[i]) * a + b);
  }
}

}  // namespace

cudaError_t launch_scale_shift(Dtype dtype, const void* x, void* out, int64_t n, double a, double b,
                               cudaStream_t stream) {
  if (n == 0) {
    return cudaSuccess;
  }
  constexpr int threads = 256;
  const int64_t wanted = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);  // the loop covers the rest
  return dispatch(dtype, [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    using acc_t = typename OpMath<scalar_t>::type;
    scale_shift_kernel<scalar_t><<<blocks, threads, 0, stream>>>(
        static_cast<const scalar_t*>(x), static_cast<scalar_t*>(out), n, static_cast<acc_t>(a),
        static_cast<acc_t>(b));
    return cudaGetLastError();
  });
}

}  // namespace cuda
}  // namespace labkernels
