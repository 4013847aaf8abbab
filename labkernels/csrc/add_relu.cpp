// add_relu: out = relu(x + y), fused in one pass.
//
// Traffic: read 2n, write n elements. torch's eager `torch.relu(x + y)` runs two kernels and writes the sum
// to memory and reads it back: read 3n, write 2n. Same FLOPs, 5/3 the bytes: on a memory-bound op the fused
// pass should be up to ~1.67x faster.
//
// This file holds the operator schemas (what Python and torch.compile see) and the CPU implementations; the
// CUDA implementations of the same schemas live in cuda/add_relu.cu and are registered for the CUDA key.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"

namespace labkernels {
namespace {

// Elements per parallel_for chunk: smaller chunks cost more in scheduling than they save.
constexpr int64_t kGrainSize = 32768;

// One element: relu of the sum, computed in the op-math type (float for half and bfloat16), rounded once.
// `v < 0 ? 0 : v` keeps a NaN as NaN, like torch.relu.
template <typename scalar_t>
inline scalar_t add_relu_one(scalar_t a, scalar_t b) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t v = static_cast<acc_t>(a) + static_cast<acc_t>(b);
  return static_cast<scalar_t>(v < acc_t(0) ? acc_t(0) : v);
}

template <typename scalar_t>
void add_relu_range(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y, scalar_t* __restrict__ out,
                    int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    out[i] = add_relu_one(x[i], y[i]);
  }
}

// parallel = false is the "naive" version: one thread walks the whole array.
void add_relu_cpu_into(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, bool parallel) {
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_relu_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (parallel) {
      at::parallel_for(0, n, kGrainSize, [&](int64_t begin, int64_t end) { add_relu_range(xp, yp, op, begin, end); });
    } else {
      add_relu_range(xp, yp, op, 0, n);
    }
  });
}

at::Tensor add_relu_cpu(const at::Tensor& x, const at::Tensor& y) {
  check_elementwise(at::kCPU, x, "x", y, "y");
  at::Tensor out = at::empty_like(x);
  add_relu_cpu_into(x, y, out, /*parallel=*/true);
  return out;
}

at::Tensor add_relu_naive_cpu(const at::Tensor& x, const at::Tensor& y) {
  check_elementwise(at::kCPU, x, "x", y, "y");
  at::Tensor out = at::empty_like(x);
  add_relu_cpu_into(x, y, out, /*parallel=*/false);
  return out;
}

void add_relu_out_cpu(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  check_elementwise(at::kCPU, x, "x", y, "y");
  check_elementwise(at::kCPU, x, "x", out, "out");
  check_no_overlap(out, x, "x");
  check_no_overlap(out, y, "y");
  add_relu_cpu_into(x, y, out, /*parallel=*/true);
}

}  // namespace

// TORCH_LIBRARY may appear once per namespace in a whole program; every chapter's file adds its own ops to
// the `labkernels` namespace with TORCH_LIBRARY_FRAGMENT, so they can all be compiled into one library.
TORCH_LIBRARY_FRAGMENT(labkernels, m) {
  m.def("add_relu(Tensor x, Tensor y) -> Tensor");
  m.def("add_relu_naive(Tensor x, Tensor y) -> Tensor");
  m.def("add_relu_out(Tensor x, Tensor y, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(labkernels, CPU, m) {
  m.impl("add_relu", &add_relu_cpu);
  m.impl("add_relu_naive", &add_relu_naive_cpu);
  m.impl("add_relu_out", &add_relu_out_cpu);
}

}  // namespace labkernels
