// scale_shift on CUDA: out = x * a + b, one element per thread of a grid-stride loop, for every dtype that
// AT_DISPATCH_FLOATING_TYPES_AND2(kHalf, kBFloat16, ...) covers. Traffic: read n, write n elements.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../checks.h"

namespace labkernels {
namespace {

template <typename scalar_t>
__global__ void scale_shift_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t n,
                                   at::opmath_type<scalar_t> a, at::opmath_type<scalar_t> b) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<scalar_t>(static_cast<acc_t>(x[i]) * a + b);
  }
}

at::Tensor scale_shift_cuda(const at::Tensor& x, double a, double b) {
  check_elementwise(at::kCUDA, x, "x");
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) {
    return out;
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  constexpr int threads = 256;
  const int64_t wanted = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);  // the loop covers the rest
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scale_shift_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    scale_shift_kernel<scalar_t><<<blocks, threads, 0, stream>>>(
        x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, static_cast<acc_t>(a), static_cast<acc_t>(b));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(labkernels, CUDA, m) {
  m.impl("scale_shift", &scale_shift_cuda);
}

}  // namespace labkernels
