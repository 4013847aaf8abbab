// Row softmax for wide rows on Hopper (sm_90+): one thread-block CLUSTER per row. An experiment
// (experiments/softmax_cluster.py loads it with ctypes through the C entry points at the end), not a labkernels op.
//
// A row too wide for one block is split over the `cluster` blocks of a cluster. Each block loads its chunk into
// registers once, reduces it to (m, l) = (max, sum of exp(x - m)), and the blocks of the row exchange their
// (m, l) through distributed shared memory (DSMEM): a block reads the others' shared memory directly, after a
// hardware cluster barrier. Then each block writes exp(x - M) / L from the registers it loaded.
// Traffic: read MN, write MN (as a copy); the exchange is cluster * 8 bytes a row, on chip.
//
// Why a cluster and not Triton's split kernel (labkernels/ch06_attention/online_softmax.py, mode "split"):
// Triton has no clusters, so its chunks meet in global memory: an atomic ticket to start, an atomic count of
// arrivals, and polling until the row is complete, each a round trip to L2 while the chunk sits in registers.
// A cluster's blocks are scheduled together by the hardware (no ticket, no deadlock to reason about), and the
// barrier and the DSMEM reads stay inside a GPC.
#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>

#include "dtypes.cuh"  // labkernels/csrc/cuda: OpMath (the fp32 compute type of half and bfloat16)
#include "softmax_vectors.cuh"  // fast_exp2, lane_of

namespace labkernels {
namespace cuda {

// Sizes and strides in 16-byte vectors (the row length and both row strides whole vectors, the pointers
// 16-byte aligned: the caller checks). Block r of a row's cluster covers vectors [r * c, (r + 1) * c),
// c = ceil(row_vecs / cluster), with vecs_per_thread vectors a thread.
struct SoftmaxClusterArgs {
  const void* x;
  void* out;
  int64_t rows;
  int64_t row_vecs;
  int64_t x_row_vecs;
  int64_t out_row_vecs;
  int cluster;          // blocks a row: 1 to 16 (above 8 is non-portable; an H100/H200 allows 16)
  int threads;          // a block: a multiple of 32, at most 1024 (512 at 8 vectors a thread)
  int vecs_per_thread;  // 1, 2, 4 or 8
  bool persistent;      // launch only the clusters the GPU holds at once, each walking rows (else one a row)
};

namespace {

namespace cg = cooperative_groups;

constexpr int kClusterMaxThreads = 1024;
constexpr float kClusterLog2e = 1.4426950408889634f;

using experiments::fast_exp2;  // softmax_vectors.cuh
using experiments::lane_of;

template <typename scalar_t>
__device__ __forceinline__ void set_lane(uint4& v, int e, float f) {
  reinterpret_cast<scalar_t*>(&v)[e] = OpMath<scalar_t>::from(f);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Every thread of the block gets op over all threads' v: a warp shuffle tree, then each thread reads the warps'
// results from `scratch` (32 floats; a separate array per reduction, so no barrier is needed before reuse).
template <typename Op>
__device__ __forceinline__ float block_all_reduce(float v, float* scratch, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  if (threadIdx.x % 32 == 0) {
    scratch[threadIdx.x / 32] = v;
  }
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
    v = op(v, scratch[w]);
  }
  return v;
}

// The split cluster barrier: arrive says "this block is done with what came before" (release), wait blocks
// until every block of the cluster has arrived (acquire). All threads of every block execute both.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// At 8 vectors a thread (64 bf16 values held), 1024 threads' 64-register cap spills: 512 threads, 128 cap.
constexpr int max_threads_for(int vecs) { return vecs == 8 ? 512 : kClusterMaxThreads; }

// One block's share of one row: vectors [begin, end) of the row, kVecs a thread, strided by the block size so
// that a warp's 32 loads are 512 consecutive bytes.
struct ChunkSpan {
  int64_t begin, end;
  __device__ int64_t at(int j) const { return begin + j * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
  __device__ bool has(int j) const { return at(j) < end; }
};

template <int kVecs>
__device__ __forceinline__ void load_chunk(uint4 (&v)[kVecs], const uint4* x_row, const ChunkSpan& span) {
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    if (span.has(j)) {
#ifdef LK_SOFTMAX_PLAIN_ACCESS
      v[j] = x_row[span.at(j)];
#else
      v[j] = __ldcs(x_row + span.at(j));  // read N (streaming: read once, not kept in L1)
#endif
    }
  }
}

// Grid: clusters of `cluster` consecutive blocks; block r of a cluster holds vectors [r * chunk_vecs,
// (r + 1) * chunk_vecs) of a row, kVecs 16-byte vectors a thread. Cluster k does rows k, k + K, k + 2K, ...
// (K clusters in the grid): launched with one cluster a row, each does one row; launched persistent (K = the
// clusters the GPU holds at once), each loads its next row while it reduces and writes this one, so the SM's
// loads do not stop for the reductions, the exchange and the stores.
template <typename scalar_t, int kVecs>
__global__ void __launch_bounds__(max_threads_for(kVecs))
    softmax_cluster_kernel(const uint4* __restrict__ x, uint4* __restrict__ out, int64_t rows, int64_t row_vecs,
                           int64_t chunk_vecs, int64_t x_row_vecs, int64_t out_row_vecs) {
  constexpr int kLanes = 16 / sizeof(scalar_t);
  __shared__ float max_scratch[32];
  __shared__ float sum_scratch[32];
  // This block's (m, l) for the other blocks of the cluster to read (DSMEM). Two slots, by row parity: a peer
  // still reading row k's slot cannot have passed row k + 1's barrier, so row k + 2 may write it.
  __shared__ float2 chunk_stat[2];
  __shared__ float2 row_stat;  // the row's (M, 1 / L), for every thread of this block

  cg::cluster_group cluster = cg::this_cluster();
  const unsigned blocks = cluster.dim_blocks().x;
  const int64_t row_step = gridDim.x / blocks;
  ChunkSpan span;
  span.begin = static_cast<int64_t>(cluster.block_rank()) * chunk_vecs;
  span.end = span.begin + chunk_vecs < row_vecs ? span.begin + chunk_vecs : row_vecs;

  int64_t row = blockIdx.x / blocks;  // 64-bit: row * stride may pass 2^31
  uint4 upcoming[kVecs];              // the next row's chunk, as loaded (16-bit values stay packed)
  if (row < rows) {
    load_chunk(upcoming, x + row * x_row_vecs, span);
  }
  for (int parity = 0; row < rows; row += row_step, parity ^= 1) {
    uint4 v[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) v[j] = upcoming[j];
    if (row + row_step < rows) {  // issued before v is first used: using v waits for its load
      load_chunk(upcoming, x + (row + row_step) * x_row_vecs, span);
    }

    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (span.has(j)) {
#pragma unroll
        for (int e = 0; e < kLanes; ++e) m = fmaxf(m, lane_of<scalar_t>(v[j], e));
      }
    }
    m = block_all_reduce(m, max_scratch, MaxOp{});
    const float m_safe = m == -INFINITY ? 0.f : m;  // a chunk of -inf (or none): no NaN from -inf - -inf
    // exp(x - m) once, kept for the output, as labkernels' split kernel does (fewer instructions an element).
    float num[kVecs][kLanes];
    float l = 0.f;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
#pragma unroll
      for (int e = 0; e < kLanes; ++e) {
        num[j][e] = span.has(j) ? fast_exp2((lane_of<scalar_t>(v[j], e) - m_safe) * kClusterLog2e) : 0.f;
        l += num[j][e];
      }
    }
    l = block_all_reduce(l, sum_scratch, SumOp{});
    if (threadIdx.x == 0) {
      chunk_stat[parity] = make_float2(m, l);
    }
    cluster_arrive();  // release: this block's chunk_stat is written
    cluster_wait();    // acquire: every block's is

    // Merge: lane r of warp 0 reads block r's (m_r, l_r) from its shared memory; M = max m_r,
    // L = sum l_r * exp(m_r - M).
    if (threadIdx.x < 32) {
      const unsigned lane = threadIdx.x;
      float2 st = make_float2(-INFINITY, 0.f);
      if (lane < blocks) {
        st = *cluster.map_shared_rank(&chunk_stat[parity], lane);
      }
      float row_max = st.x;
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
      }
      row_max = row_max == -INFINITY ? 0.f : row_max;
      float row_sum = st.y == 0.f ? 0.f : st.y * fast_exp2((st.x - row_max) * kClusterLog2e);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) {
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, offset);
      }
      if (lane == 0) {
        row_stat = make_float2(row_max, row_sum);
      }
    }
    __syncthreads();  // row_stat is written
    // exp(x - M) / L = exp(x - m) * exp(m - M) / L; a chunk of -inf gives 0 (not 0 * an overflowed exp), a
    // row of -inf (L = 0) NaN, as torch.softmax.
    const float2 rs = row_stat;
    const float rescale = m == -INFINITY && rs.y > 0.f ? 0.f : fast_exp2((m_safe - rs.x) * kClusterLog2e) / rs.y;
    uint4* out_row = out + row * out_row_vecs;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      if (span.has(j)) {
        uint4 y;
#pragma unroll
        for (int e = 0; e < kLanes; ++e) {
          set_lane<scalar_t>(y, e, num[j][e] * rescale);
        }
#ifdef LK_SOFTMAX_PLAIN_ACCESS
        out_row[span.at(j)] = y;
#else
        __stcs(out_row + span.at(j), y);  // write N (streaming)
#endif
      }
    }
  }
  // A block's shared memory must outlive every read of it: no block leaves before all have merged.
  cluster_arrive();
  cluster_wait();
}

// The launch configuration of `kernel` for `a`, with the cluster dimension in `attribute` (none for clusters of
// one block: a plain launch).
inline cudaLaunchConfig_t cluster_config(const SoftmaxClusterArgs& a, int64_t clusters, cudaLaunchAttribute* attribute,
                                         cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(clusters * a.cluster));
  config.blockDim = dim3(static_cast<unsigned>(a.threads));
  config.stream = stream;
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(a.cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = a.cluster > 1 ? 1 : 0;
  return config;
}

template <typename scalar_t, int kVecs>
cudaError_t launch_cluster_kernel(const SoftmaxClusterArgs& a, cudaStream_t stream) {
  auto kernel = softmax_cluster_kernel<scalar_t, kVecs>;
  if (a.cluster > 8) {  // 16 blocks a cluster is beyond the portable 8: the kernel must opt in
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err != cudaSuccess) {
      return err;
    }
  }
  cudaLaunchAttribute attribute[1];
  int64_t clusters = a.rows;
  if (a.persistent) {  // as many clusters as the GPU holds at once, each walking rows
    cudaLaunchConfig_t probe = cluster_config(a, a.rows, attribute, stream);
    int resident = 0;
    const cudaError_t err = a.cluster > 1 ? cudaOccupancyMaxActiveClusters(&resident, kernel, &probe)
                                          : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel,
                                                                                          a.threads, 0);
    if (err != cudaSuccess) {
      return err;
    }
    if (a.cluster == 1) {
      int device = 0, sms = 0;
      cudaGetDevice(&device);
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      resident *= sms;
    }
    clusters = resident > 0 && resident < a.rows ? resident : a.rows;
  }
  cudaLaunchConfig_t config = cluster_config(a, clusters, attribute, stream);
  const int64_t chunk_vecs = (a.row_vecs + a.cluster - 1) / a.cluster;
  return cudaLaunchKernelEx(&config, kernel, static_cast<const uint4*>(a.x), static_cast<uint4*>(a.out), a.rows,
                            a.row_vecs, chunk_vecs, a.x_row_vecs, a.out_row_vecs);
}

template <typename scalar_t>
cudaError_t launch_for_vecs(const SoftmaxClusterArgs& a, cudaStream_t stream) {
  switch (a.vecs_per_thread) {
    case 1:
      return launch_cluster_kernel<scalar_t, 1>(a, stream);
    case 2:
      return launch_cluster_kernel<scalar_t, 2>(a, stream);
    case 4:
      return launch_cluster_kernel<scalar_t, 4>(a, stream);
    case 8:
      return launch_cluster_kernel<scalar_t, 8>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

const char* softmax_cluster_config_error(const SoftmaxClusterArgs& a) {
  if (a.cluster < 1 || a.cluster > 16) return "cluster must be 1 to 16 blocks";
  if (a.threads < 32 || a.threads > max_threads_for(a.vecs_per_thread) || a.threads % 32)
    return "threads must be a multiple of 32, at most 1024 (512 at 8 vectors a thread)";
  if (a.vecs_per_thread != 1 && a.vecs_per_thread != 2 && a.vecs_per_thread != 4 && a.vecs_per_thread != 8)
    return "vecs_per_thread must be 1, 2, 4 or 8";
  if (a.row_vecs < 1 || a.rows < 1) return "empty input";
  if ((a.row_vecs + a.cluster - 1) / a.cluster > static_cast<int64_t>(a.threads) * a.vecs_per_thread)
    return "cluster * threads * vecs_per_thread vectors do not cover a row";
  if (a.rows * a.cluster > 0x7fffffff) return "rows * cluster exceeds the grid's 2^31 - 1 blocks";
  return nullptr;
}

cudaError_t launch_softmax_cluster(Dtype dtype, const SoftmaxClusterArgs& a, cudaStream_t stream) {
  if (softmax_cluster_config_error(a) != nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (dtype) {
    case Dtype::kFloat:
      return launch_for_vecs<float>(a, stream);
    case Dtype::kHalf:
      return launch_for_vecs<__half>(a, stream);
    case Dtype::kBFloat16:
      return launch_for_vecs<__nv_bfloat16>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace labkernels

// --- C entry points for ctypes ------------------------------------------------------------------------

using labkernels::cuda::Dtype;
using labkernels::cuda::SoftmaxClusterArgs;

static SoftmaxClusterArgs args_of(const void* x, void* out, long long rows, long long row_vecs, long long xs,
                                  long long os, int cluster, int threads, int vecs, int persistent) {
  return SoftmaxClusterArgs{x, out, rows, row_vecs, xs, os, cluster, threads, vecs, persistent != 0};
}

extern "C" int lk_softmax_cluster(int dtype, const void* x, void* out, long long rows, long long row_vecs,
                                  long long xs, long long os, int cluster, int threads, int vecs, int persistent,
                                  void* stream) {
  const SoftmaxClusterArgs a = args_of(x, out, rows, row_vecs, xs, os, cluster, threads, vecs, persistent);
  return static_cast<int>(labkernels::cuda::launch_softmax_cluster(static_cast<Dtype>(dtype), a,
                                                                   static_cast<cudaStream_t>(stream)));
}

// How many clusters of this configuration the GPU holds at once (cudaOccupancyMaxActiveClusters).
template <typename T>
static int active_clusters(int cluster, int threads, int vecs) {
  void* kernels[] = {
      reinterpret_cast<void*>(labkernels::cuda::softmax_cluster_kernel<T, 1>),
      reinterpret_cast<void*>(labkernels::cuda::softmax_cluster_kernel<T, 2>),
      reinterpret_cast<void*>(labkernels::cuda::softmax_cluster_kernel<T, 4>),
      reinterpret_cast<void*>(labkernels::cuda::softmax_cluster_kernel<T, 8>)};
  void* kernel = kernels[vecs == 1 ? 0 : vecs == 2 ? 1 : vecs == 4 ? 2 : 3];
  if (cluster > 8) cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster * 1024);
  config.blockDim = dim3(threads);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = cluster;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int n = -1;
  const cudaError_t err = cudaOccupancyMaxActiveClusters(&n, kernel, &config);
  return err == cudaSuccess ? n : -static_cast<int>(err);
}

extern "C" int lk_active_clusters(int dtype, int cluster, int threads, int vecs) {
  switch (static_cast<Dtype>(dtype)) {
    case Dtype::kFloat:
      return active_clusters<float>(cluster, threads, vecs);
    case Dtype::kHalf:
      return active_clusters<__half>(cluster, threads, vecs);
    default:
      return active_clusters<__nv_bfloat16>(cluster, threads, vecs);
  }
}
