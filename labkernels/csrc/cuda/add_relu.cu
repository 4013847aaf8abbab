// add_relu on CUDA: the same schemas as ../add_relu.cpp, registered for the CUDA dispatch key.
//
// Two kernels, so a learner can measure what a change buys:
//   add_relu_naive_kernel  one element per thread: each thread issues 4-byte loads (fp32).
//   add_relu_vec_kernel    16 bytes per load and store (float4 for fp32, 8 halves for fp16/bf16, 2 doubles),
//                          so a warp moves 512 bytes per instruction; a scalar tail covers n % vec elements.
// Traffic for both: read 2n, write n elements. Both launch on the current CUDA stream, so they order
// correctly with torch's own kernels.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "../checks.h"

namespace labkernels {
namespace {

constexpr int kAddReluThreads = 256;

template <typename scalar_t>
__device__ __forceinline__ scalar_t add_relu_element(scalar_t a, scalar_t b) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t v = static_cast<acc_t>(a) + static_cast<acc_t>(b);
  return static_cast<scalar_t>(v < acc_t(0) ? acc_t(0) : v);  // keeps NaN, like torch.relu
}

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

void add_relu_cuda_into(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, bool vectorized) {
  const int64_t n = x.numel();
  if (n == 0) {
    return;  // a grid of zero blocks is a launch error
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();  // what at::cuda::getCurrentCUDAStream() returns
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_relu_cuda", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
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
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor add_relu_cuda(const at::Tensor& x, const at::Tensor& y) {
  check_elementwise(at::kCUDA, x, "x", y, "y");
  at::Tensor out = at::empty_like(x);
  add_relu_cuda_into(x, y, out, /*vectorized=*/true);
  return out;
}

at::Tensor add_relu_naive_cuda(const at::Tensor& x, const at::Tensor& y) {
  check_elementwise(at::kCUDA, x, "x", y, "y");
  at::Tensor out = at::empty_like(x);
  add_relu_cuda_into(x, y, out, /*vectorized=*/false);
  return out;
}

void add_relu_out_cuda(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  check_elementwise(at::kCUDA, x, "x", y, "y");
  check_elementwise(at::kCUDA, x, "x", out, "out");
  add_relu_cuda_into(x, y, out, /*vectorized=*/true);
}

}  // namespace

TORCH_LIBRARY_IMPL(labkernels, CUDA, m) {
  m.impl("add_relu", &add_relu_cuda);
  m.impl("add_relu_naive", &add_relu_naive_cuda);
  m.impl("add_relu_out", &add_relu_out_cuda);
}

}  // namespace labkernels
