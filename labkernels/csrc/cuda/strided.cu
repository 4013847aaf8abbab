// Stride-aware ops on CUDA: the schemas of ../strided.cpp, registered for the CUDA dispatch key.
//
//   copy_strided / add_relu_strided   the naive version: one thread per output element splits its flat index
//                                     into (i_0, ..., i_{d-1}) and reads data_ptr + sum_k i_k * stride_k.
//                                     Writes are coalesced; reads of a transposed view are not (a warp's 32
//                                     reads land M elements apart: 32 sectors for 128 useful bytes).
//   copy_2d_tiled                     the classic shared-memory transpose: a 32x8 thread block copies a 32x32
//                                     tile. It reads the tile walking x's contiguous dimension, parks it in
//                                     shared memory, and writes it walking out's rows, so both are coalesced.
//                                     The tile is 32x33: the padding column puts a tile column's 32 elements
//                                     in 32 different banks, so reading a column costs one pass, not 32.
// Traffic: read n, write n elements for the copies; read 2n, write n for add_relu.
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
namespace ch02 {

// Defined in ../strided.cpp (same library): one set of checks for both devices.
void strided_check_copy(const at::Tensor& x, const at::Tensor& out, at::DeviceType device);
void strided_check_add_relu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& out,
                            at::DeviceType device);
void strided_check_2d(const at::Tensor& x);

namespace {

constexpr int kStridedDims = 8;  // = kStridedMaxDims in ../strided.cpp
constexpr int kStridedThreads = 256;
constexpr int kTile = 32;     // tile edge, = warp size
constexpr int kTileRows = 8;  // thread rows per block: each thread copies kTile / kTileRows = 4 elements

// Sizes and strides passed by value in the kernel's parameter space (no device allocation needed).
template <typename index_t>
struct StridedGeometry {
  int ndim;
  index_t sizes[kStridedDims];
  index_t strides[kStridedDims];
};

template <typename index_t>
StridedGeometry<index_t> strided_geometry(const at::Tensor& t) {
  StridedGeometry<index_t> g{};
  g.ndim = static_cast<int>(t.dim());
  for (int k = 0; k < g.ndim; ++k) {
    g.sizes[k] = static_cast<index_t>(t.size(k));
    g.strides[k] = static_cast<index_t>(t.stride(k));
  }
  return g;
}

// Storage offset (in elements, from data_ptr) of the view element with row-major flat index `flat`.
template <typename index_t>
__device__ __forceinline__ index_t strided_offset(index_t flat, const StridedGeometry<index_t>& g) {
  index_t offset = 0;
  for (int k = g.ndim - 1; k >= 0; --k) {
    const index_t q = flat / g.sizes[k];
    offset += (flat - q * g.sizes[k]) * g.strides[k];
    flat = q;
  }
  return offset;
}

template <typename scalar_t, typename index_t>
__global__ void copy_strided_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out,
                                    StridedGeometry<index_t> gx, index_t n) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = x[strided_offset(i, gx)];
  }
}

template <typename scalar_t>
__device__ __forceinline__ scalar_t strided_relu_sum(scalar_t a, scalar_t b) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t v = static_cast<acc_t>(a) + static_cast<acc_t>(b);
  return static_cast<scalar_t>(v < acc_t(0) ? acc_t(0) : v);  // keeps NaN, like torch.relu
}

template <typename scalar_t, typename index_t>
__global__ void add_relu_strided_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                                        scalar_t* __restrict__ out, StridedGeometry<index_t> gx,
                                        StridedGeometry<index_t> gy, index_t n) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = strided_relu_sum(x[strided_offset(i, gx)], y[strided_offset(i, gy)]);
  }
}

// One block = one 32x32 tile of the (M, N) output. kLoadAlongM: x is contiguous along m (stride_xm == 1,
// e.g. a transposed matrix), so consecutive threads read consecutive m; otherwise consecutive n.
template <typename scalar_t, bool kLoadAlongM>
__global__ void copy_2d_tiled_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out, int64_t M,
                                     int64_t N, int64_t stride_xm, int64_t stride_xn, int64_t tiles_n) {
  __shared__ scalar_t tile[kTile][kTile + 1];  // [m][n]; +1 column against bank conflicts
  const int64_t m0 = (static_cast<int64_t>(blockIdx.x) / tiles_n) * kTile;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) % tiles_n) * kTile;
  const int tx = threadIdx.x;  // 0..31: the lane in the warp
  const int ty = threadIdx.y;  // 0..7
  if (kLoadAlongM) {
    for (int j = ty; j < kTile; j += kTileRows) {  // a warp reads 32 consecutive m of column n0 + j
      const int64_t m = m0 + tx;
      const int64_t n = n0 + j;
      if (m < M && n < N) {
        tile[tx][j] = x[m * stride_xm + n * stride_xn];  // column write: 33-word stride, 32 banks
      }
    }
  } else {
    for (int i = ty; i < kTile; i += kTileRows) {  // a warp reads 32 consecutive n of row m0 + i
      const int64_t m = m0 + i;
      const int64_t n = n0 + tx;
      if (m < M && n < N) {
        tile[i][tx] = x[m * stride_xm + n * stride_xn];
      }
    }
  }
  __syncthreads();
  for (int i = ty; i < kTile; i += kTileRows) {  // a warp writes 32 consecutive n of output row m0 + i
    const int64_t m = m0 + i;
    const int64_t n = n0 + tx;
    if (m < M && n < N) {
      out[m * N + n] = tile[i][tx];
    }
  }
}

int64_t strided_blocks(int64_t n) {
  const int64_t blocks = (n + kStridedThreads - 1) / kStridedThreads;
  return blocks < 65535 * 32 ? blocks : 65535 * 32;  // grid-stride loop covers the rest
}

bool strided_fits_int32(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t k = 0; k < t.dim(); ++k) {
    last += (t.size(k) - 1) * t.stride(k);
  }
  return t.numel() < INT32_MAX && last < INT32_MAX;
}

void copy_strided_out_cuda(const at::Tensor& x, at::Tensor& out) {
  strided_check_copy(x, out, at::kCUDA);
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "copy_strided_cuda", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (strided_fits_int32(x)) {  // 32-bit index math: a 64-bit division costs several times more
      copy_strided_kernel<scalar_t, int32_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, op, strided_geometry<int32_t>(x), static_cast<int32_t>(n));
    } else {
      copy_strided_kernel<scalar_t, int64_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, op, strided_geometry<int64_t>(x), n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void add_relu_strided_out_cuda(const at::Tensor& x, const at::Tensor& y, at::Tensor& out) {
  strided_check_add_relu(x, y, out, at::kCUDA);
  const int64_t n = x.numel();
  if (n == 0) {
    return;
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "add_relu_strided_cuda", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (strided_fits_int32(x) && strided_fits_int32(y)) {
      add_relu_strided_kernel<scalar_t, int32_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, yp, op, strided_geometry<int32_t>(x), strided_geometry<int32_t>(y), static_cast<int32_t>(n));
    } else {
      add_relu_strided_kernel<scalar_t, int64_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, yp, op, strided_geometry<int64_t>(x), strided_geometry<int64_t>(y), n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void copy_2d_tiled_out_cuda(const at::Tensor& x, at::Tensor& out) {
  strided_check_2d(x);
  strided_check_copy(x, out, at::kCUDA);
  const int64_t M = x.size(0);
  const int64_t N = x.size(1);
  if (M == 0 || N == 0) {
    return;
  }
  const int64_t tiles_m = (M + kTile - 1) / kTile;
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  TORCH_CHECK(tiles_m * tiles_n <= INT32_MAX, "x has too many 32x32 tiles for one grid: ", dims(x.sizes()));
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 block(kTile, kTileRows);
  const unsigned int grid = static_cast<unsigned int>(tiles_m * tiles_n);
  // Load along m when x's m stride is the smaller one (a transposed view); a size-1 dim never decides.
  const bool along_m = N > 1 && M > 1 && x.stride(0) < x.stride(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "copy_2d_tiled_cuda", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    if (along_m) {
      copy_2d_tiled_kernel<scalar_t, true><<<grid, block, 0, stream>>>(xp, op, M, N, x.stride(0), x.stride(1),
                                                                       tiles_n);
    } else {
      copy_2d_tiled_kernel<scalar_t, false><<<grid, block, 0, stream>>>(xp, op, M, N, x.stride(0), x.stride(1),
                                                                        tiles_n);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

at::Tensor copy_strided_cuda(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());
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
  m.impl("copy_strided", &copy_strided_cuda);
  m.impl("copy_strided_out", &copy_strided_out_cuda);
  m.impl("add_relu_strided", &add_relu_strided_cuda);
  m.impl("add_relu_strided_out", &add_relu_strided_out_cuda);
  m.impl("copy_2d_tiled", &copy_2d_tiled_cuda);
  m.impl("copy_2d_tiled_out", &copy_2d_tiled_out_cuda);
}

}  // namespace ch02
}  // namespace labkernels
