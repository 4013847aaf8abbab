// Row softmax for wide rows, split over blocks that hold their chunk in SHARED memory while they wait for
// the row's other chunks. An experiment (experiments/softmax_staged.py loads it with ctypes), not a labkernels op.
//
// The shipped split kernel (labkernels/ch06_attention/online_softmax.py, mode "split") holds its chunk in
// registers: a 16384-element chunk takes about 127 registers a thread at 8 warps, so two blocks fit an SM, and
// while one of them waits for its row's other chunks the SM has a single chunk's loads in flight. Without the
// wait the same kernel runs at 0.97-0.98 of a copy (ch06_softmax_variants.csv), with it at 0.82 in bfloat16.
// The question here: is the wait's cost the bytes it leaves idle on the SM? A chunk staged in shared memory
// (cp.async, 16 bytes a copy, no register holds it) leaves the registers free, so 4 to 14 blocks fit an SM and
// the others keep loading while some wait. The price: exp is computed twice an element (once for the sum,
// once for the output), where the register kernel keeps exp(x - m) from the first pass.
//
// Each block: a ticket (atomic, in start order) gives its (row, chunk); it copies the chunk into shared memory,
// reduces it to (m, l) = (max, sum of exp(x - m)), publishes them, counts itself in with a release, polls the
// row's count with acquire loads until every chunk is in (or MAX_SPIN polls: then NaN, never a wrong number),
// merges the row's (m, l) into (M, L) and writes exp(x - M) / L from shared memory. Traffic: read MN, write MN.
// Deadlock freedom as the shipped kernel's: a block that waits has every lower ticket started, and a row's
// chunks fit on the GPU at once many times over.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dtypes.cuh"  // labkernels/csrc/cuda: OpMath, Dtype
#include "softmax_vectors.cuh"  // fast_exp2, lane_of

namespace {

using labkernels::cuda::OpMath;
using labkernels::cuda::experiments::fast_exp2;  // softmax_vectors.cuh
using labkernels::cuda::experiments::lane_of;

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// (m, l) <- the state of both parts: M = max, L = l e^(m - M) + l2 e^(m2 - M). Two empty states stay empty.
__device__ __forceinline__ void merge(float& m, float& l, float m2, float l2) {
  const float big = fmaxf(m, m2);
  if (big == -INFINITY) return;
  l = l * fast_exp2((m - big) * kLog2e) + l2 * fast_exp2((m2 - big) * kLog2e);
  m = big;
}

__device__ __forceinline__ void warp_merge(float& m, float& l) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float l2 = __shfl_xor_sync(0xffffffffu, l, offset);
    merge(m, l, m2, l2);
  }
}

template <typename T>
__global__ void softmax_staged_kernel(const uint4* __restrict__ x, uint4* __restrict__ out, float2* stats,
                                      int* sync, int64_t row_vecs, int64_t x_row_vecs, int64_t out_row_vecs,
                                      int chunk_vecs, int chunks, int max_spin) {
  constexpr int kLanes = 16 / sizeof(T);
  extern __shared__ uint4 staged[];
  __shared__ int s_ticket;
  __shared__ float s_m[32], s_l[32];
  __shared__ float s_max, s_scale;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;

  if (threadIdx.x == 0) s_ticket = atomicAdd(sync, 1);  // relaxed: only a number, in start order
  __syncthreads();
  const int64_t row = s_ticket / chunks;
  const int chunk = s_ticket % chunks;
  const int64_t first = static_cast<int64_t>(chunk) * chunk_vecs;
  const int n = static_cast<int>(min(static_cast<int64_t>(chunk_vecs), row_vecs - first));

  const uint4* src = x + row * x_row_vecs + first;
  for (int i = threadIdx.x; i < n; i += blockDim.x) copy_async_16(&staged[i], &src[i]);  // read N
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();

  // This thread's (m, l) over its vectors (two passes over shared memory: one exp an element), then the block's.
  float m = -INFINITY, l = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint4 v = staged[i];
#pragma unroll
    for (int e = 0; e < kLanes; ++e) m = fmaxf(m, lane_of<T>(v, e));
  }
  if (m != -INFINITY) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint4 v = staged[i];
#pragma unroll
      for (int e = 0; e < kLanes; ++e) l += fast_exp2((lane_of<T>(v, e) - m) * kLog2e);
    }
  }
  warp_merge(m, l);
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
  __syncthreads();

  if (warp == 0) {
    m = lane < warps ? s_m[lane] : -INFINITY;
    l = lane < warps ? s_l[lane] : 0.f;
    warp_merge(m, l);
    if (lane == 0) {  // publish, count in (release), wait for the row (acquire)
      stats[row * chunks + chunk] = make_float2(m, l);
      __threadfence();
      int arrived = atomicAdd(&sync[1 + row], 1) + 1;
      for (int spins = 0; arrived < chunks && spins < max_spin; ++spins) arrived = load_acquire(&sync[1 + row]);
      s_scale = arrived >= chunks ? 1.f : NAN;  // gave up: NaN out, never a wrong number
    }
    __syncwarp();
    // The row's (M, L) from its chunks' states (L2: __ldcg skips L1, which may hold a stale line).
    float big = -INFINITY, total = 0.f;
    for (int c = lane; c < chunks; c += 32) {
      const float2 s = __ldcg(&stats[row * chunks + c]);
      merge(big, total, s.x, s.y);
    }
    warp_merge(big, total);
    if (lane == 0) {
      s_max = big == -INFINITY ? 0.f : big;  // a row of -inf: exp(-inf - 0) / 0 = NaN, as torch.softmax
      s_scale = s_scale / total;
    }
  }
  __syncthreads();

  const float row_max = s_max, scale = s_scale;
  uint4* dst = out + row * out_row_vecs + first;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const uint4 v = staged[i];
    uint4 o;
    T* po = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int e = 0; e < kLanes; ++e) po[e] = OpMath<T>::from(fast_exp2((lane_of<T>(v, e) - row_max) * kLog2e) * scale);
    __stcs(&dst[i], o);  // write N, streaming: not read again
  }
}

template <typename T>
cudaError_t launch(const void* x, void* out, void* stats, int* sync, long long rows, long long row_vecs,
                   long long xs, long long os, int chunk_vecs, int threads, int max_spin, cudaStream_t stream) {
  const int chunks = static_cast<int>((row_vecs + chunk_vecs - 1) / chunk_vecs);
  const size_t smem = static_cast<size_t>(chunk_vecs) * 16;
  cudaError_t err = cudaFuncSetAttribute(softmax_staged_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  err = cudaMemsetAsync(sync, 0, static_cast<size_t>(1 + rows) * sizeof(int), stream);  // ticket, arrivals
  if (err != cudaSuccess) return err;
  softmax_staged_kernel<T><<<static_cast<unsigned>(rows * chunks), threads, smem, stream>>>(
      static_cast<const uint4*>(x), static_cast<uint4*>(out), static_cast<float2*>(stats), sync, row_vecs, xs, os,
      chunk_vecs, chunks, max_spin);
  return cudaGetLastError();
}

template <typename T>
int resident(int chunk_vecs, int threads) {
  const size_t smem = static_cast<size_t>(chunk_vecs) * 16;
  if (cudaFuncSetAttribute(softmax_staged_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem)) != cudaSuccess)
    return -1;
  int n = -1;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, softmax_staged_kernel<T>, threads, smem) == cudaSuccess
             ? n
             : -1;
}

}  // namespace

// dtype: 0 float32, otherwise bfloat16 (launch.h's Dtype tags 0 and 3). Sizes and strides in 16-byte vectors.
extern "C" int lk_softmax_staged(int dtype, const void* x, void* out, void* stats, void* sync, long long rows,
                                 long long row_vecs, long long xs, long long os, int chunk_vecs, int threads,
                                 int max_spin, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* counters = static_cast<int*>(sync);
  return static_cast<int>(
      dtype == 0 ? launch<float>(x, out, stats, counters, rows, row_vecs, xs, os, chunk_vecs, threads, max_spin, s)
                 : launch<__nv_bfloat16>(x, out, stats, counters, rows, row_vecs, xs, os, chunk_vecs, threads,
                                         max_spin, s));
}

// Blocks of this configuration an SM holds at once.
extern "C" int lk_staged_resident(int dtype, int chunk_vecs, int threads) {
  return dtype == 0 ? resident<float>(chunk_vecs, threads) : resident<__nv_bfloat16>(chunk_vecs, threads);
}
