// add_relu on CUDA: the kernels behind the CUDA implementations of ../add_relu.cpp's schemas (the torch side,
// registered for the CUDA dispatch key, is in ops.cpp).
//
// Two kernels, so a learner can measure what a change buys:
//   add_relu_naive_kernel  one element per thread: each thread issues 4-byte loads (fp32).
//   add_relu_vec_kernel    16 bytes per load and store (float4 for fp32, 8 halves for fp16/bf16, 2 doubles),
//                          so a warp moves 512 bytes per instruction; a scalar tail covers n % vec elements.
// Traffic for both: read 2n, write n elements. Both launch on the stream they are given (the current CUDA
// stream), so they order correctly with torch's own kernels.
#include <cstdint>

#include "dtypes.cuh"
#include "launch.h"

namespace labkernels {
namespace cuda {
namespace {

constexpr int kAddReluThreads = 256;

template <typename scalar_t>
__global__ void add_relu_naive_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                                      scalar_t* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = add_relu_element(x[i], y[i]);
  }
}

// 16 bytes of scalar_t, aligned to 16 so that a copy of it is one 128-bit load or store (LDG.128).
template <typename scalar_t>
struct alignas(16) Pack16 {
  static constexpr int kSize = 16 / sizeof(scalar_t);
  scalar_t v[kSize];
};

template <typename scalar_t>
__global__ void add_relu_vec_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                                    scalar_t* __restrict__ out, int64_t n) {
  using P = Pack16<scalar_t>;
  constexpr int kVec = P::kSize;
  const int64_t n_vec = n / kVec;  // whole packs
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n_vec) {
    const P a = reinterpret_cast<const P*>(x)[i];
    const P b = reinterpret_cast<const P*>(y)[i];
    P c;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      c.v[k] = add_relu_element(a.v[k], b.v[k]);
    }
    reinterpret_cast<P*>(out)[i] = c;
  }
  // The scalar tail: the last n % kVec elements, one per thread of the first threads.
  const int64_t j = n_vec * kVec + i;
  if (j < n) {
    out[j] = add_relu_element(x[j], y[j]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_add_relu(Dtype dtype, const void* x, const void* y, void* out, int64_t n, bool vectorized,
                            cudaStream_t stream) {
  if (n == 0) {
    return cudaSuccess;  // a grid of zero blocks is a launch error
  }
  return dispatch(dtype, [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    const auto* xp = static_cast<const scalar_t*>(x);
    const auto* yp = static_cast<const scalar_t*>(y);
    auto* op = static_cast<scalar_t*>(out);
    // A view with a storage offset may start off a 16-byte boundary: then only the naive kernel is safe.
    if (vectorized && aligned16(xp) && aligned16(yp) && aligned16(op)) {
      constexpr int kVec = Pack16<scalar_t>::kSize;
      const int64_t n_vec = n / kVec;
      const int64_t work = n_vec > kVec ? n_vec : kVec;  // threads needed: packs, or the tail alone
      const int64_t blocks = (work + kAddReluThreads - 1) / kAddReluThreads;
      add_relu_vec_kernel<scalar_t><<<blocks, kAddReluThreads, 0, stream>>>(xp, yp, op, n);
    } else {
      const int64_t blocks = (n + kAddReluThreads - 1) / kAddReluThreads;
      add_relu_naive_kernel<scalar_t><<<blocks, kAddReluThreads, 0, stream>>>(xp, yp, op, n);
    }
    return cudaGetLastError();  // a bad launch configuration shows here, not at the next sync
  });
}

}  // namespace cuda
}  // namespace labkernels
