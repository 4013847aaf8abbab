// Stride-aware copies on CUDA: the kernels behind ../strided.cpp's schemas on the CUDA key (the torch side is
// in ops.cpp).
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
#include <cstdint>

#include "dtypes.cuh"
#include "launch.h"

namespace labkernels {
namespace cuda {
namespace {

constexpr int kStridedThreads = 256;
constexpr int kTile = 32;     // tile edge, = warp size
constexpr int kTileRows = 8;  // thread rows per block: each thread copies kTile / kTileRows = 4 elements

// Geometry with the index type the kernel computes in (int32 where every offset fits: see below).
template <typename index_t>
struct StridedGeometry {
  int ndim;
  index_t sizes[kStridedDims];
  index_t strides[kStridedDims];
};

template <typename index_t>
StridedGeometry<index_t> narrow(const Geometry& g) {
  StridedGeometry<index_t> out{};
  out.ndim = g.ndim;
  for (int k = 0; k < g.ndim; ++k) {
    out.sizes[k] = static_cast<index_t>(g.sizes[k]);
    out.strides[k] = static_cast<index_t>(g.strides[k]);
  }
  return out;
}

int64_t strided_blocks(int64_t n) {
  const int64_t blocks = (n + kStridedThreads - 1) / kStridedThreads;
  return blocks < 65535 * 32 ? blocks : 65535 * 32;  // grid-stride loop covers the rest
}

// True when every index the kernel computes fits in int32: the largest offset the view reaches, and the
// grid-stride loop's `i += stride`, which a thread takes one last time past n (n + the grid's thread
// count), not just n itself.
bool fits_int32(const Geometry& g, int64_t n) {
  int64_t last = 0;
  for (int k = 0; k < g.ndim; ++k) {
    last += (g.sizes[k] - 1) * g.strides[k];
  }
  return n + strided_blocks(n) * kStridedThreads <= INT32_MAX && last <= INT32_MAX;
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

template <typename scalar_t, typename index_t>
__global__ void add_relu_strided_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y,
                                        scalar_t* __restrict__ out, StridedGeometry<index_t> gx,
                                        StridedGeometry<index_t> gy, index_t n) {
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = add_relu_element(x[strided_offset(i, gx)], y[strided_offset(i, gy)]);
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

}  // namespace

cudaError_t launch_copy_strided(Dtype dtype, const void* x, void* out, const Geometry& gx, int64_t n,
                                cudaStream_t stream) {
  if (n == 0) {
    return cudaSuccess;
  }
  return dispatch(dtype, [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    const auto* xp = static_cast<const scalar_t*>(x);
    auto* op = static_cast<scalar_t*>(out);
    if (fits_int32(gx, n)) {  // 32-bit index math: a 64-bit division costs several times more
      copy_strided_kernel<scalar_t, int32_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, op, narrow<int32_t>(gx), static_cast<int32_t>(n));
    } else {
      copy_strided_kernel<scalar_t, int64_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, op, narrow<int64_t>(gx), n);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_add_relu_strided(Dtype dtype, const void* x, const void* y, void* out, const Geometry& gx,
                                    const Geometry& gy, int64_t n, cudaStream_t stream) {
  if (n == 0) {
    return cudaSuccess;
  }
  return dispatch(dtype, [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    const auto* xp = static_cast<const scalar_t*>(x);
    const auto* yp = static_cast<const scalar_t*>(y);
    auto* op = static_cast<scalar_t*>(out);
    if (fits_int32(gx, n) && fits_int32(gy, n)) {
      add_relu_strided_kernel<scalar_t, int32_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, yp, op, narrow<int32_t>(gx), narrow<int32_t>(gy), static_cast<int32_t>(n));
    } else {
      add_relu_strided_kernel<scalar_t, int64_t><<<strided_blocks(n), kStridedThreads, 0, stream>>>(
          xp, yp, op, narrow<int64_t>(gx), narrow<int64_t>(gy), n);
    }
    return cudaGetLastError();
  });
}

cudaError_t launch_copy_2d_tiled(Dtype dtype, const void* x, void* out, int64_t M, int64_t N, int64_t stride_xm,
                                 int64_t stride_xn, cudaStream_t stream) {
  if (M == 0 || N == 0) {
    return cudaSuccess;
  }
  const int64_t tiles_m = (M + kTile - 1) / kTile;
  const int64_t tiles_n = (N + kTile - 1) / kTile;
  if (tiles_m * tiles_n > INT32_MAX) {
    return cudaErrorInvalidConfiguration;  // ops.cpp checks first, with a message
  }
  const dim3 block(kTile, kTileRows);
  const unsigned int grid = static_cast<unsigned int>(tiles_m * tiles_n);
  // Load along m when x's m stride is the smaller one (a transposed view); a size-1 dim never decides.
  const bool along_m = N > 1 && M > 1 && stride_xm < stride_xn;
  return dispatch(dtype, [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    const auto* xp = static_cast<const scalar_t*>(x);
    auto* op = static_cast<scalar_t*>(out);
    if (along_m) {
      copy_2d_tiled_kernel<scalar_t, true><<<grid, block, 0, stream>>>(xp, op, M, N, stride_xm, stride_xn,
                                                                       tiles_n);
    } else {
      copy_2d_tiled_kernel<scalar_t, false><<<grid, block, 0, stream>>>(xp, op, M, N, stride_xm, stride_xn,
                                                                        tiles_n);
    }
    return cudaGetLastError();
  });
}

}  // namespace cuda
}  // namespace labkernels
