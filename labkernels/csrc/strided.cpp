// Stride-aware ops: they read any view through data_ptr() + sizes + strides, and write a contiguous output.
//
// A view's element (i_0, ..., i_{d-1}) lives at data_ptr + sum_k i_k * stride_k (in elements). Transposes,
// steps, narrow and expand (stride 0) are all covered by that one formula; nothing is copied first.
//
//   copy_strided(x)          any rank: out = a contiguous copy of x            read n, write n
//   add_relu_strided(x, y)   any rank, any strides for x and y: relu(x + y)    read 2n, write n
//   copy_2d_tiled(x)         2-D: the same copy, walking 32x32 tiles           read MN, write MN
//
// Each has an `_out` form writing into a given contiguous `out` that must not overlap the inputs. This file
// holds the schemas, the checks (shared with cuda/strided.cu) and the CPU implementations.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "checks.h"

namespace labkernels {
namespace ch02 {

// --- checks, used by the CPU impls here and the CUDA impls in cuda/strided.cu ------------------------------

constexpr int64_t kStridedMaxDims = 8;

void strided_check_input(const at::Tensor& x, const char* name, at::DeviceType device) {
  check_float_tensor(x, name);
  check_device(x, name, device);
  TORCH_CHECK(x.dim() <= kStridedMaxDims, name, " has ", std::to_string(x.dim()), " dims; at most ",
              std::to_string(kStridedMaxDims), " are supported");
  for (int64_t k = 0; k < x.dim(); ++k) {
    TORCH_CHECK(x.stride(k) >= 0, name, " has a negative stride ", std::to_string(x.stride(k)), " in dim ",
                std::to_string(k));
  }
  const int64_t capacity = static_cast<int64_t>(x.storage().nbytes()) / static_cast<int64_t>(x.itemsize());
  TORCH_CHECK(last_element(x) < capacity, name, " reaches storage element ",
              std::to_string(last_element(x)), " but its storage holds ", std::to_string(capacity),
              " elements");
}

void strided_check_out(const at::Tensor& out, const at::Tensor& x, const char* x_name, at::DeviceType device) {
  check_same(x, x_name, out, "out");
  check_device(out, "out", device);
  TORCH_CHECK(out.is_contiguous(), "out must be contiguous, got sizes ", dims(out.sizes()), " with strides ",
              dims(out.strides()));
  check_no_overlap(out, x, x_name);
}

void strided_check_copy(const at::Tensor& x, const at::Tensor& out, at::DeviceType device) {
  strided_check_input(x, "x", device);
  strided_check_out(out, x, "x", device);
}

void strided_check_add_relu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out,
                            at::DeviceType device) {
  strided_check_input(x, "x", device);
  strided_check_input(y, "y", device);
  check_same(x, "x", y, "y");
  strided_check_out(out, x, "x", device);
  strided_check_out(out, y, "y", device);
}

void strided_check_2d(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "x must be 2-D, got sizes ", dims(x.sizes()));
}

namespace {

constexpr int64_t kStridedGrain = 32768;  // elements per parallel_for chunk
constexpr int64_t kCpuTile = 32;          // 32x32 tiles: a tile of x and one of out fit in L1 together

// Walks the elements of a view in logical (row-major) order from a starting flat index, keeping the storage
// offset up to date like an odometer: one add per element, a carry when a dimension wraps.
struct StridedCursor {
  int64_t ndim;
  int64_t sizes[kStridedMaxDims];
  int64_t strides[kStridedMaxDims];
  int64_t index[kStridedMaxDims];
  int64_t offset;

  StridedCursor(const at::Tensor& t, int64_t flat) : ndim(t.dim()), offset(0) {
    for (int64_t k = ndim - 1; k >= 0; --k) {
      sizes[k] = t.size(k);
      strides[k] = t.stride(k);
      index[k] = flat % sizes[k];
      flat /= sizes[k];
      offset += index[k] * strides[k];
    }
  }

  void next() {
    for (int64_t k = ndim - 1; k >= 0; --k) {
      offset += strides[k];
      if (++index[k] < sizes[k]) {
        return;
      }
      offset -= index[k] * strides[k];
      index[k] = 0;
    }
  }
};

template <typename scalar_t>
scalar_t strided_relu_sum(scalar_t a, scalar_t b) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t v = static_cast<acc_t>(a) + static_cast<acc_t>(b);
  return static_cast<scalar_t>(v < acc_t(0) ? acc_t(0) : v);  // keeps NaN, like torch.relu
}

void copy_strided_out_cpu(const at::Tensor& x, at::Tensor& out) {
  strided_check_copy(x, out, at::kCPU);
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "copy_strided_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();  // storage base + storage_offset
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, kStridedGrain, [&](int64_t begin, int64_t end) {
      StridedCursor cur(x, begin);
      for (int64_t i = begin; i < end; ++i, cur.next()) {
        op[i] = xp[cur.offset];  // read through the strides, write contiguous
      }
    });
  });
}

void add_relu_strided_out_cpu(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  strided_check_add_relu(x, y, out, at::kCPU);
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_relu_strided_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, n, kStridedGrain, [&](int64_t begin, int64_t end) {
      StridedCursor cx(x, begin);
      StridedCursor cy(y, begin);
      for (int64_t i = begin; i < end; ++i, cx.next(), cy.next()) {
        op[i] = strided_relu_sum(xp[cx.offset], yp[cy.offset]);
      }
    });
  });
}

// The CPU tiled copy: each task copies whole 32x32 tiles, so the lines of a transposed x it touches are
// reused from L1 for the 32 output rows of the tile instead of being fetched once per element.
void copy_2d_tiled_out_cpu(const at::Tensor& x, at::Tensor& out) {
  strided_check_2d(x);
  strided_check_copy(x, out, at::kCPU);
  const int64_t M = x.size(0);
  const int64_t N = x.size(1);
  if (M == 0 || N == 0) {
    return;
  }
  const int64_t sm = x.stride(0);
  const int64_t sn = x.stride(1);
  const int64_t tiles_m = (M + kCpuTile - 1) / kCpuTile;
  const int64_t tiles_n = (N + kCpuTile - 1) / kCpuTile;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "copy_2d_tiled_cpu", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, tiles_m * tiles_n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t m0 = (t / tiles_n) * kCpuTile;
        const int64_t n0 = (t % tiles_n) * kCpuTile;
        const int64_t m1 = std::min(m0 + kCpuTile, M);
        const int64_t n1 = std::min(n0 + kCpuTile, N);
        for (int64_t m = m0; m < m1; ++m) {
          for (int64_t n = n0; n < n1; ++n) {
            op[m * N + n] = xp[m * sm + n * sn];
          }
        }
      }
    });
  });
}

at::Tensor copy_strided_cpu(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());  // contiguous, whatever x's layout
  copy_strided_out_cpu(x, out);
  return out;
}

at::Tensor add_relu_strided_cpu(const at::Tensor& x, const at::Tensor& y) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  add_relu_strided_out_cpu(x, y, out);
  return out;
}

at::Tensor copy_2d_tiled_cpu(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  copy_2d_tiled_out_cpu(x, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(labkernels, m) {
  m.def("copy_strided(Tensor x) -> Tensor");
  m.def("copy_strided_out(Tensor x, Tensor(a!) out) -> ()");
  m.def("add_relu_strided(Tensor x, Tensor y) -> Tensor");
  m.def("add_relu_strided_out(Tensor x, Tensor y, Tensor(a!) out) -> ()");
  m.def("copy_2d_tiled(Tensor x) -> Tensor");
  m.def("copy_2d_tiled_out(Tensor x, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(labkernels, CPU, m) {
  m.impl("copy_strided", &copy_strided_cpu);
  m.impl("copy_strided_out", &copy_strided_out_cpu);
  m.impl("add_relu_strided", &add_relu_strided_cpu);
  m.impl("add_relu_strided_out", &add_relu_strided_out_cpu);
  m.impl("copy_2d_tiled", &copy_2d_tiled_cpu);
  m.impl("copy_2d_tiled_out", &copy_2d_tiled_out_cpu);
}

}  // namespace ch02
}  // namespace labkernels
