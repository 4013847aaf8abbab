// Definitions of the checks declared in checks.h (see there for why they live in a .cpp).
#include "checks.h"

#include <cstdint>
#include <string>
#include <utility>

namespace labkernels {

std::string dims(at::IntArrayRef values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(values[i]);
  }
  return text + "]";
}

bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

void check_float_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), name, " is an undefined tensor");
  TORCH_CHECK(is_supported_float(t.scalar_type()), name,
              " must have dtype float32, float64, float16 or bfloat16, got ", t.scalar_type());
}

void check_device(const at::Tensor& t, const char* name, at::DeviceType device) {
  TORCH_CHECK(t.device().type() == device, name, " must be on ", device, ", got a tensor on ", t.device(),
              " (this is the ", device, " implementation; move the inputs with .to())");
}

void check_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous, got sizes ", dims(t.sizes()), " with strides ",
              dims(t.strides()), ": this kernel walks data_ptr() as a dense array, so call .contiguous() first");
}

void check_same(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  TORCH_CHECK(b.defined(), b_name, " is an undefined tensor");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), a_name, " and ", b_name, " must have the same dtype, got ",
              a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), a_name, " and ", b_name, " must be on the same device, got ",
              a.device(), " and ", b.device());
  TORCH_CHECK(a.sizes() == b.sizes(), a_name, " and ", b_name, " must have the same shape, got ", dims(a.sizes()),
              " and ", dims(b.sizes()));
}

void check_elementwise(at::DeviceType device, const at::Tensor& x, const char* x_name) {
  check_float_tensor(x, x_name);
  check_device(x, x_name, device);
  check_contiguous(x, x_name);
}

void check_elementwise(at::DeviceType device, const at::Tensor& x, const char* x_name,
                              const at::Tensor& y, const char* y_name) {
  check_float_tensor(x, x_name);
  check_same(x, x_name, y, y_name);
  check_device(x, x_name, device);
  check_contiguous(x, x_name);
  check_contiguous(y, y_name);
}

int64_t last_element(const at::Tensor& t) {
  if (t.numel() == 0) {
    return -1;
  }
  int64_t last = t.storage_offset();
  for (int64_t k = 0; k < t.dim(); ++k) {
    last += (t.size(k) - 1) * t.stride(k);
  }
  return last;
}

bool may_overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.device() != b.device()) {
    return false;
  }
  auto range = [](const at::Tensor& t) {
    const auto base = reinterpret_cast<std::uintptr_t>(t.storage().data());
    const auto es = static_cast<std::uintptr_t>(t.itemsize());
    return std::make_pair(base + static_cast<std::uintptr_t>(t.storage_offset()) * es,
                          base + static_cast<std::uintptr_t>(last_element(t) + 1) * es);
  };
  const auto ra = range(a);
  const auto rb = range(b);
  return ra.first < rb.second && rb.first < ra.second;
}

void check_no_overlap(const at::Tensor& out, const at::Tensor& x, const char* x_name) {
  TORCH_CHECK(!may_overlap(out, x), "out overlaps ", x_name,
              " in memory: the kernel would overwrite what it still has to read (pass a separate out)");
}

}  // namespace labkernels
