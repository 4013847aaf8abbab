// The torch side of the CUDA ops, compiled by the host compiler (never by nvcc; see launch.h for why): check
// the inputs, allocate outputs, take the current stream, call the launchers in *.cu, and register the CUDA
// implementations of the schemas declared in ../add_relu.cpp, ../scale_shift.cpp and ../strided.cpp.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <string>

#include "../checks.h"
#include "launch.h"

namespace labkernels {

namespace ch02 {
// Defined in ../strided.cpp (same library): one set of checks for both devices.
void strided_check_copy(const at::Tensor& x, const at::Tensor& out, at::DeviceType device);
void strided_check_add_relu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out,
                            at::DeviceType device);
void strided_check_2d(const at::Tensor& x);
}  // namespace ch02

namespace {

// The launchers' dtype tag for a tensor the checks have already accepted.
cuda::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return cuda::Dtype::kFloat;
    case at::kDouble:
      return cuda::Dtype::kDouble;
    case at::kHalf:
      return cuda::Dtype::kHalf;
    case at::kBFloat16:
      return cuda::Dtype::kBFloat16;
    default:
      break;
  }
  TORCH_CHECK(false, "no CUDA kernel for dtype ", t.scalar_type());
  return cuda::Dtype::kFloat;  // not reached: the check above throws
}

// The stream torch is using on x's device (what at::cuda::getCurrentCUDAStream() returns).
cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream(); }

// --- add_relu -----------------------------------------------------------------------------------------------

void add_relu_cuda_into(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, bool vectorized) {
  const c10::cuda::CUDAGuard device_guard(x.device());
  C10_CUDA_CHECK(cuda::launch_add_relu(dtype_of(x), x.const_data_ptr(), y.const_data_ptr(),
                                       out.mutable_data_ptr(), x.numel(), vectorized, current_stream()));
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
  check_no_overlap(out, x, "x");
  check_no_overlap(out, y, "y");
  add_relu_cuda_into(x, y, out, /*vectorized=*/true);
}

// --- scale_shift --------------------------------------------------------------------------------------------

at::Tensor scale_shift_cuda(const at::Tensor& x, double a, double b) {
  check_elementwise(at::kCUDA, x, "x");
  at::Tensor out = at::empty_like(x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  C10_CUDA_CHECK(cuda::launch_scale_shift(dtype_of(x), x.const_data_ptr(), out.mutable_data_ptr(), x.numel(), a,
                                          b, current_stream()));
  return out;
}

// --- strided (chapter 02) -----------------------------------------------------------------------------------

cuda::Geometry geometry(const at::Tensor& t) {
  TORCH_CHECK(t.dim() <= cuda::kStridedDims, "at most ", std::to_string(cuda::kStridedDims), " dims, got ",
              std::to_string(t.dim()));
  cuda::Geometry g{};
  g.ndim = static_cast<int>(t.dim());
  for (int k = 0; k < g.ndim; ++k) {
    g.sizes[k] = t.size(k);
    g.strides[k] = t.stride(k);
  }
  return g;
}

void copy_strided_out_cuda(const at::Tensor& x, at::Tensor& out) {
  ch02::strided_check_copy(x, out, at::kCUDA);
  const c10::cuda::CUDAGuard device_guard(x.device());
  C10_CUDA_CHECK(cuda::launch_copy_strided(dtype_of(x), x.const_data_ptr(), out.mutable_data_ptr(), geometry(x),
                                           x.numel(), current_stream()));
}

void add_relu_strided_out_cuda(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  ch02::strided_check_add_relu(x, y, out, at::kCUDA);
  const c10::cuda::CUDAGuard device_guard(x.device());
  C10_CUDA_CHECK(cuda::launch_add_relu_strided(dtype_of(x), x.const_data_ptr(), y.const_data_ptr(),
                                               out.mutable_data_ptr(), geometry(x), geometry(y), x.numel(),
                                               current_stream()));
}

void copy_2d_tiled_out_cuda(const at::Tensor& x, at::Tensor& out) {
  ch02::strided_check_2d(x);
  ch02::strided_check_copy(x, out, at::kCUDA);
  const int64_t M = x.size(0);
  const int64_t N = x.size(1);
  const int64_t tiles = ((M + 31) / 32) * ((N + 31) / 32);
  TORCH_CHECK(tiles <= INT32_MAX, "x has too many 32x32 tiles for one grid: ", dims(x.sizes()));
  const c10::cuda::CUDAGuard device_guard(x.device());
  C10_CUDA_CHECK(cuda::launch_copy_2d_tiled(dtype_of(x), x.const_data_ptr(), out.mutable_data_ptr(), M, N,
                                            x.stride(0), x.stride(1), current_stream()));
}

at::Tensor copy_strided_cuda(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());  // contiguous, whatever x's layout
  copy_strided_out_cuda(x, out);
  return out;
}

at::Tensor add_relu_strided_cuda(const at::Tensor& x, const at::Tensor& y) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  add_relu_strided_out_cuda(x, y, out);
  return out;
}

at::Tensor copy_2d_tiled_cuda(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  copy_2d_tiled_out_cuda(x, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(labkernels, CUDA, m) {
  m.impl("add_relu", &add_relu_cuda);
  m.impl("add_relu_naive", &add_relu_naive_cuda);
  m.impl("add_relu_out", &add_relu_out_cuda);
  m.impl("scale_shift", &scale_shift_cuda);
  m.impl("copy_strided", &copy_strided_cuda);
  m.impl("copy_strided_out", &copy_strided_out_cuda);
  m.impl("add_relu_strided", &add_relu_strided_cuda);
  m.impl("add_relu_strided_out", &add_relu_strided_out_cuda);
  m.impl("copy_2d_tiled", &copy_2d_tiled_cuda);
  m.impl("copy_2d_tiled_out", &copy_2d_tiled_out_cuda);
}

}  // namespace labkernels
