// Input checks shared by every labkernels op.
//
// A kernel receives raw pointers: it cannot tell a float from a half, a CPU address from a GPU one, or a
// strided view from a dense buffer. So every impl checks first and fails with a message that names the
// argument and the problem, instead of reading the wrong bytes (or segfaulting).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

// Declared here, defined once in checks.cpp and called by both devices' impls, so the wording is the same.
//
// Numbers in messages. On the H200 image (torch 2.11+cu130) a failed check whose message streamed a number
// (an int64, a double, an IntArrayRef) took the process down with SIGSEGV, while text and dtypes raised
// normally. The cause: two copies of libstdc++'s stream and locale code in one process (the system's
// libstdc++.so.6, and one the extension's default link exported). Streaming a number, unlike text, goes
// through the stream's locale (std::num_put, found by a facet id), so a stream could mix the two copies.
// The fix is in the build: the course's builds (build.load, diagnostics.build_inline) link libstdc++
// privately (-static-libstdc++ -Wl,--exclude-libs,ALL), so this library's streams use its own hidden copy
// and TORCH_CHECK(cond, "n = ", n) raises. `python -m labkernels.ch01_jit.abi_probe` shows, on any machine,
// which loaded files provide those symbols and whether such a check raises with each link. These messages
// still format numbers with std::to_string (`dims()` for sizes and strides): that needs no locale, so they
// stay safe where no libstdc++.a exists and the build falls back, with a warning, to the default link.
namespace labkernels {

// "[4, 6]": sizes or strides as text, built with std::to_string alone.
std::string dims(at::IntArrayRef values);

bool is_supported_float(at::ScalarType t);

void check_float_tensor(const at::Tensor& t, const char* name);

void check_device(const at::Tensor& t, const char* name, at::DeviceType device);

void check_contiguous(const at::Tensor& t, const char* name);

// `b` must match `a` in dtype, device and shape.
void check_same(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name);

// Every check an elementwise op over dense tensors of one dtype needs, for the device `device`.
void check_elementwise(at::DeviceType device, const at::Tensor& x, const char* x_name);

// Two operands (or an operand and an output): same dtype, device and shape first, so that a CPU tensor
// mixed with a CUDA one gets "must be on the same device" rather than a message about one of them.
void check_elementwise(at::DeviceType device, const at::Tensor& x, const char* x_name,
                              const at::Tensor& y, const char* y_name);

// Highest storage element (relative to the storage start) a view can reach; -1 for an empty view.
int64_t last_element(const at::Tensor& t);

// True if the byte spans of two views on one device intersect (conservative for interleaved views).
bool may_overlap(const at::Tensor& a, const at::Tensor& b);

// `out` must share no byte with the input `x`. Even `out` *equal* to `x` is refused: the kernels take
// `__restrict__` pointers, a promise to the compiler that no byte is reached through two of them.
void check_no_overlap(const at::Tensor& out, const at::Tensor& x, const char* x_name);

}  // namespace labkernels
