// scale_shift: out = x * a + b for a tensor x and two Python floats, one dtype-generic implementation.
//
// AT_DISPATCH_FLOATING_TYPES_AND2(kHalf, kBFloat16, ...) instantiates the lambda once per dtype with
// `scalar_t` bound to float, double, at::Half and at::BFloat16, and picks one at run time from x's dtype.
// (Plain AT_DISPATCH_FLOATING_TYPES covers float and double only: a half tensor gets an error.)
// Traffic: read n, write n elements.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "checks.h"

namespace labkernels {
namespace {

// A #pragma cannot sit inside a macro argument (AT_DISPATCH_... is a macro), so the loop lives here.
template <typename scalar_t, typename acc_t>
void scale_shift_range(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, acc_t a, acc_t b,
                       int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    out[i] = static_cast<scalar_t>(static_cast<acc_t>(x[i]) * a + b);
  }
}

at::Tensor scale_shift_cpu(const at::Tensor& x, double a, double b) {
  check_elementwise(at::kCPU, x, "x");
  at::Tensor out = at::empty_like(x);
  const int64_t n = x.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "scale_shift_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;  // float for half and bfloat16: one rounding at the end
    const acc_t sa = static_cast<acc_t>(a);
    const acc_t sb = static_cast<acc_t>(b);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) { scale_shift_range(xp, op, sa, sb, begin, end); });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(labkernels, m) {
  m.def("scale_shift(Tensor x, float a, float b) -> Tensor");
}

TORCH_LIBRARY_IMPL(labkernels, CPU, m) {
  m.impl("scale_shift", &scale_shift_cpu);
}

}  // namespace labkernels
