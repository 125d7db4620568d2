#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "ops/common/async_copy.cuh"
#include "ops/common/launch.h"
#include "ops/trilinear/corner_weights.h"
#include "ops/trilinear/trilinear.h"

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// V consecutive features moved as one aligned access (16 bytes when V > 1).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// dst[0, V) = v as 16-byte vectors where V elements fill whole ones (dst
// then 16-byte aligned), else one element at a time.
template <typename A, int V>
__device__ inline void store_row(A* __restrict__ dst, const A (&v)[V]) {
  constexpr int kVec = 16 / sizeof(A);
  if constexpr (V % kVec == 0 && kVec > 1) {
#pragma unroll
    for (int i = 0; i < V / kVec; ++i) {
      Pack<A, kVec> q;
#pragma unroll
      for (int e = 0; e < kVec; ++e) q.v[e] = v[i * kVec + e];
      reinterpret_cast<Pack<A, kVec>*>(dst)[i] = q;
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) dst[e] = v[e];
  }
}

// v = src[0, V), the loads of store_row.
template <typename A, int V>
__device__ inline void load_row(const A* __restrict__ src, A (&v)[V]) {
  constexpr int kVec = 16 / sizeof(A);
  if constexpr (V % kVec == 0 && kVec > 1) {
#pragma unroll
    for (int i = 0; i < V / kVec; ++i) {
      const Pack<A, kVec> q = reinterpret_cast<const Pack<A, kVec>*>(src)[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[i * kVec + e] = q.v[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = src[e];
  }
}

// The grid-stride loop of the kernels with one thread per (point, pack of V
// features): fn(idx, p, x, cw) for each of this thread's items idx = p * (f /
// V) + x, cw the corner weights of point p.
template <typename T, int V, typename I, typename Fn>
__device__ __forceinline__ void for_each_point_pack(const T* __restrict__ points, I total, I f,
                                                    Fn&& fn) {
  const I fv = f / V;
  for (I idx = blockIdx.x * I(blockDim.x) + threadIdx.x; idx < total;
       idx += I(gridDim.x) * blockDim.x) {
    const I p = idx / fv, x = idx % fv;
    const T* pt = points + 3 * p;
    fn(idx, p, x, corner_weights<at::opmath_type<T>>(pt[0], pt[1], pt[2]));
  }
}

// One thread per (point, pack of V features), neighbouring threads on
// neighbouring packs: each corner row is read coalesced along F, 16 bytes per
// access when V > 1. With kDerivatives the thread also writes the pack's
// three derivatives by the point (rows 3p .. 3p + 2 of deriv). I is the index
// type: 32-bit unsigned where every index fits (its division by F / V is a
// few instructions, 64-bit's a call), else int64_t.
template <typename T, int V, typename I, bool kDerivatives>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ feats, const T* __restrict__ points, T* __restrict__ out,
                   at::opmath_type<T>* __restrict__ deriv, I total, I f) {
  using acc_t = at::opmath_type<T>;
  using P = Pack<T, V>;
  const I fv = f / V;
  for_each_point_pack<T, V>(points, total, f, [&](I idx, I p, I x, const auto& cw) {
    const P* fp = reinterpret_cast<const P*>(feats + p * 8 * f) + x;
    acc_t acc[V] = {}, blend[3][V] = {};
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const P row = fp[c * fv];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const acc_t fe = static_cast<acc_t>(row.v[e]);
        acc[e] += cw.weight[c] * fe;
        if constexpr (kDerivatives) {
#pragma unroll
          for (int a = 0; a < 3; ++a) blend[a][e] += cw.d_point[a][c] * fe;
        }
      }
    }
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = static_cast<T>(acc[e]);
    reinterpret_cast<P*>(out)[idx] = o;
    if constexpr (kDerivatives) {
#pragma unroll
      for (int a = 0; a < 3; ++a) store_row(deriv + (3 * p + a) * f + x * V, blend[a]);
    }
  });
}

// grad_feats alone: one thread per (point, pack of V features), neighbouring
// threads on neighbouring packs; each thread reads its grad-output pack once
// and writes it, scaled by the 8 corner weights, to the point's 8 rows
// (coalesced along F). I as in forward_kernel.
template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    grad_feats_kernel(const T* __restrict__ go, const T* __restrict__ points,
                      T* __restrict__ grad_feats, I total, I f) {
  using acc_t = at::opmath_type<T>;
  using P = Pack<T, V>;
  const I fv = f / V;
  for_each_point_pack<T, V>(points, total, f, [&](I idx, I p, I x, const auto& cw) {
    const P gp = reinterpret_cast<const P*>(go)[idx];
    P* gf = reinterpret_cast<P*>(grad_feats + p * 8 * f) + x;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        o.v[e] = static_cast<T>(cw.weight[c] * static_cast<acc_t>(gp.v[e]));
      }
      gf[c * fv] = o;
    }
  });
}

// d[a] of lane 0 of each group of `width` lanes (a power of two up to a warp)
// becomes the sum over the group, by a fixed shuffle tree (deterministic).
template <typename Acc>
__device__ inline void sum_over_lanes(Acc (&d)[3], int width) {
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    for (int step = width / 2; step > 0; step >>= 1)
      d[a] += __shfl_down_sync(0xffffffffu, d[a], step, width);
  }
}

// A team of S threads (a power of two from 1 to 256: part of a warp, or whole
// warps) per point; teams stride over points. The team's threads stride along
// the point's packs of V features, writing the 8 grad_feats rows coalesced and
// keeping private sums of the 3 point derivatives, which a fixed shuffle tree
// (and, for teams of several warps, a fixed pass over their warps) reduces
// (no atomics: deterministic). With kSaved the derivatives come from the
// forward's deriv rows (3 per point) instead of the 8 feats rows.
template <typename T, int V, bool kSaved>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ go, const T* __restrict__ feats,
                    const at::opmath_type<T>* __restrict__ deriv, const T* __restrict__ points,
                    T* __restrict__ grad_feats, T* __restrict__ grad_points, int64_t n, int64_t f,
                    int team) {
  using acc_t = at::opmath_type<T>;
  using P = Pack<T, V>;
  __shared__ acc_t warp_sums[kThreads / kWarp][3];
  const int64_t fv = f / V;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int member = threadIdx.x % team, first_warp = (threadIdx.x - member) / kWarp;
  const int teams_per_block = kThreads / team;
  const int64_t teams = int64_t(gridDim.x) * teams_per_block;
  // Every thread runs the same number of iterations (the bound is per block),
  // so all reach the barriers.
  const int64_t rounds = (n + teams - 1) / teams;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t p = (round * gridDim.x + blockIdx.x) * teams_per_block + threadIdx.x / team;
    acc_t d[3] = {0, 0, 0};
    if (p < n) {
      const T* pt = points + 3 * p;
      const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
      const P* fp = kSaved ? nullptr : reinterpret_cast<const P*>(feats + p * 8 * f);
      const P* g = reinterpret_cast<const P*>(go + p * f);
      P* gf = reinterpret_cast<P*>(grad_feats + p * 8 * f);
      for (int64_t x = member; x < fv; x += team) {
        const P gp = g[x];
        acc_t gx[V], blend[3][V] = {};
#pragma unroll
        for (int e = 0; e < V; ++e) gx[e] = static_cast<acc_t>(gp.v[e]);
        if constexpr (kSaved) {
#pragma unroll
          for (int a = 0; a < 3; ++a) load_row(deriv + (3 * p + a) * f + x * V, blend[a]);
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          P out;
#pragma unroll
          for (int e = 0; e < V; ++e) out.v[e] = static_cast<T>(cw.weight[c] * gx[e]);
          if constexpr (!kSaved) {
            const P row = fp[c * fv + x];
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const acc_t fvv = static_cast<acc_t>(row.v[e]);
#pragma unroll
              for (int a = 0; a < 3; ++a) blend[a][e] += cw.d_point[a][c] * fvv;
            }
          }
          gf[c * fv + x] = out;
        }
#pragma unroll
        for (int e = 0; e < V; ++e)
#pragma unroll
          for (int a = 0; a < 3; ++a) d[a] += gx[e] * blend[a][e];
      }
    }
    sum_over_lanes(d, team < kWarp ? team : kWarp);
    if (team <= kWarp) {
      if (member == 0 && p < n) {
#pragma unroll
        for (int a = 0; a < 3; ++a) grad_points[3 * p + a] = static_cast<T>(d[a]);
      }
      continue;
    }
    __syncthreads();  // the previous round's warp sums are read
    if (lane == 0) {
#pragma unroll
      for (int a = 0; a < 3; ++a) warp_sums[warp][a] = d[a];
    }
    __syncthreads();
    if (member == 0 && p < n) {
      for (int a = 0; a < 3; ++a) {
        acc_t sum = 0;
        for (int w = 0; w < team / kWarp; ++w) sum += warp_sums[first_warp + w][a];
        grad_points[3 * p + a] = static_cast<T>(sum);
      }
    }
  }
}

// The staged kernels below take rows whose F is not a multiple of 16 bytes'
// worth of elements (rows that do not start on 16-byte boundaries, so the
// kernels above fall back to one element per access). They work on groups of
// kGroup<T> = 16 / sizeof(T) points: a group's feats (kGroup x 8 x F elements)
// and its output or grad-output rows (kGroup x F) are contiguous and start on
// 16-byte boundaries for any F, so the group moves between global and shared
// memory as 16-byte vectors, and the arithmetic reads shared memory one
// element at a time.
template <typename T>
constexpr int kGroup = 16 / sizeof(T);
static_assert(16 / 2 * kWarp <= kThreads, "the backward gives each point of a group one warp");
constexpr int64_t kStagedBytes = 40 * 1024;  // dynamic shared memory of a block, at most

// Bytes of dynamic shared memory a staged kernel needs for rows of f features:
// the group's feats and its kGroup rows of (grad) outputs (the same for every
// element size).
inline int64_t staged_bytes(int64_t f) { return 16 * 9 * f; }

// dst[0, count) = src[0, count), 16-byte vectors then a scalar tail; src and
// dst 16-byte aligned. The block's threads stride over the elements.
template <typename T>
__device__ inline void copy_group(T* __restrict__ dst, const T* __restrict__ src, int count) {
  constexpr int kVec = 16 / sizeof(T);
  const int vecs = count / kVec;
  for (int i = threadIdx.x; i < vecs; i += kThreads)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  for (int i = vecs * kVec + threadIdx.x; i < count; i += kThreads) dst[i] = src[i];
}

// copy_group from global memory into shared memory: on compute capability
// 8.0 and newer the vectors go as cp.async copies, all in flight at once (a
// plain copy waits for each load before its store), and the caller's next
// __syncthreads() follows stage_group_wait().
template <typename T>
__device__ inline void stage_group(T* __restrict__ dst, const T* __restrict__ src, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kVec = 16 / sizeof(T);
  const int vecs = count / kVec;
  const unsigned base = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  for (int i = threadIdx.x; i < vecs; i += kThreads)
    copy_async_16(base + 16 * i, reinterpret_cast<const uint4*>(src) + i);
  for (int i = vecs * kVec + threadIdx.x; i < count; i += kThreads) dst[i] = src[i];
#else
  copy_group(dst, src, count);
#endif
}

// Waits for this thread's stage_group copies.
__device__ inline void stage_group_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  copy_async_wait_all();
#endif
}

// Blocks stride over groups of kGroup points. A block stages the group's
// feats, then thread t computes features t, t + 256, ... of each point of the
// group into a shared output tile (consecutive threads on consecutive
// features: no bank conflicts), which goes out as 16-byte vectors. With
// kDerivatives thread t also writes the derivatives of its features straight
// to deriv (consecutive threads on consecutive elements).
template <typename T, bool kDerivatives>
__global__ void __launch_bounds__(kThreads)
    forward_staged_kernel(const T* __restrict__ feats, const T* __restrict__ points,
                          T* __restrict__ out, at::opmath_type<T>* __restrict__ deriv, int64_t n,
                          int f) {
  using acc_t = at::opmath_type<T>;
  constexpr int kG = kGroup<T>;
  extern __shared__ uint4 staged_raw[];
  T* tile = reinterpret_cast<T*>(staged_raw);  // kG x 8 x f feats
  T* out_tile = tile + kG * 8 * f;              // kG x f outputs
  __shared__ acc_t weights[kG][8];
  __shared__ acc_t d_point[kDerivatives ? kG : 1][3][8];
  for (int64_t p0 = int64_t(blockIdx.x) * kG; p0 < n; p0 += int64_t(gridDim.x) * kG) {
    const int g = static_cast<int>(std::min<int64_t>(kG, n - p0));
    __syncthreads();  // the previous group's tiles are no longer read
    stage_group(tile, feats + p0 * 8 * f, g * 8 * f);
    if (threadIdx.x < g) {
      const T* pt = points + 3 * (p0 + threadIdx.x);
      const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        weights[threadIdx.x][c] = cw.weight[c];
        if constexpr (kDerivatives) {
#pragma unroll
          for (int a = 0; a < 3; ++a) d_point[threadIdx.x][a][c] = cw.d_point[a][c];
        }
      }
    }
    stage_group_wait();
    __syncthreads();
    for (int q = 0; q < g; ++q) {
      for (int x = threadIdx.x; x < f; x += kThreads) {
        acc_t acc = 0, blend[3] = {0, 0, 0};
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const acc_t fe = static_cast<acc_t>(tile[(q * 8 + c) * f + x]);
          acc += weights[q][c] * fe;
          if constexpr (kDerivatives) {
#pragma unroll
            for (int a = 0; a < 3; ++a) blend[a] += d_point[q][a][c] * fe;
          }
        }
        out_tile[q * f + x] = static_cast<T>(acc);
        if constexpr (kDerivatives) {
#pragma unroll
          for (int a = 0; a < 3; ++a) deriv[(3 * (p0 + q) + a) * f + x] = blend[a];
        }
      }
    }
    __syncthreads();
    copy_group(out + p0 * f, out_tile, g * f);
  }
}

// Blocks stride over groups of kGroup points. A block stages the group's feats
// and grad-output rows; thread t then writes the group's grad_feats as
// 16-byte vectors t, t + 256, ... (each 8 consecutive elements of the
// contiguous kGroup x 8 x F block, possibly across a row end), and warp w
// reduces point w's three derivatives, its lanes striding along F, in a fixed
// order (deterministic). With kSaved the block stages the group's rows of the
// forward's derivatives (3 per point) instead of its feats.
template <typename T, bool kSaved>
__global__ void __launch_bounds__(kThreads)
    backward_staged_kernel(const T* __restrict__ go, const T* __restrict__ feats,
                           const at::opmath_type<T>* __restrict__ deriv,
                           const T* __restrict__ points, T* __restrict__ grad_feats,
                           T* __restrict__ grad_points, int64_t n, int f) {
  using acc_t = at::opmath_type<T>;
  constexpr int kVec = 16 / sizeof(T), kG = kGroup<T>;
  extern __shared__ uint4 staged_raw[];
  T* tile = reinterpret_cast<T*>(staged_raw);           // kG x 8 x f feats, or
  acc_t* deriv_tile = reinterpret_cast<acc_t*>(staged_raw);  // kG x 3 x f derivatives
  T* go_tile = kSaved ? reinterpret_cast<T*>(deriv_tile + kG * 3 * f)
                      : tile + kG * 8 * f;  // kG x f grad outputs
  __shared__ acc_t weights[kG][8];
  __shared__ acc_t d_point[kG][3][8];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t p0 = int64_t(blockIdx.x) * kG; p0 < n; p0 += int64_t(gridDim.x) * kG) {
    const int g = static_cast<int>(std::min<int64_t>(kG, n - p0));
    __syncthreads();  // the previous group's tiles are no longer read
    if constexpr (kSaved) {
      stage_group(deriv_tile, deriv + p0 * 3 * f, g * 3 * f);
    } else {
      stage_group(tile, feats + p0 * 8 * f, g * 8 * f);
    }
    stage_group(go_tile, go + p0 * f, g * f);
    if (threadIdx.x < g) {
      const T* pt = points + 3 * (p0 + threadIdx.x);
      const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        weights[threadIdx.x][c] = cw.weight[c];
#pragma unroll
        for (int a = 0; a < 3; ++a) d_point[threadIdx.x][a][c] = cw.d_point[a][c];
      }
    }
    stage_group_wait();
    __syncthreads();
    // grad_feats[p, c, x] = weight[p][c] * go[p, x]; row r = 8p + c of the group.
    T* gf = grad_feats + p0 * 8 * f;
    for (int v = threadIdx.x; v < g * 8 * f / kVec; v += kThreads) {  // g*8*f elements
      int e = v * kVec;
      int r = e / f, x = e - r * f;
      Pack<T, kVec> o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o.v[k] =
            static_cast<T>(weights[r / 8][r % 8] * static_cast<acc_t>(go_tile[(r / 8) * f + x]));
        if (++x == f) x = 0, ++r;
      }
      reinterpret_cast<Pack<T, kVec>*>(gf)[v] = o;
    }
    if (warp < g) {
      acc_t d[3] = {0, 0, 0};
      for (int x = lane; x < f; x += kWarp) {
        const acc_t gx = static_cast<acc_t>(go_tile[warp * f + x]);
        acc_t blend[3] = {0, 0, 0};
        if constexpr (kSaved) {
#pragma unroll
          for (int a = 0; a < 3; ++a) blend[a] = deriv_tile[(warp * 3 + a) * f + x];
        } else {
#pragma unroll
          for (int c = 0; c < 8; ++c) {
            const acc_t fv = static_cast<acc_t>(tile[(warp * 8 + c) * f + x]);
#pragma unroll
            for (int a = 0; a < 3; ++a) blend[a] += d_point[warp][a][c] * fv;
          }
        }
#pragma unroll
        for (int a = 0; a < 3; ++a) d[a] += gx * blend[a];
      }
      sum_over_lanes(d, kWarp);
      if (lane == 0) {
#pragma unroll
        for (int a = 0; a < 3; ++a) grad_points[3 * (p0 + warp) + a] = static_cast<T>(d[a]);
      }
    }
  }
}

// Whether every pointer is 16-byte aligned.
bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* q : ptrs)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  return true;
}

// Whether the staged kernels take rows of f features of elem_size bytes with
// these pointers: F not a multiple of 16 / elem_size (else the packed kernels
// do), the group in shared memory, 16-byte aligned pointers.
bool staged_takes(int64_t f, int64_t elem_size, std::initializer_list<const void*> ptrs) {
  return f % (16 / elem_size) != 0 && staged_bytes(f) <= kStagedBytes && aligned16(ptrs);
}

template <typename T, bool kDerivatives>
void launch_staged_forward(const T* feats, const T* points, T* out, at::opmath_type<T>* deriv,
                           int64_t n, int64_t f, cudaStream_t stream) {
  forward_staged_kernel<T, kDerivatives>
      <<<blocks_for(n, kGroup<T>), kThreads, staged_bytes(f), stream>>>(feats, points, out, deriv,
                                                                         n, static_cast<int>(f));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Dynamic shared memory of backward_staged_kernel: the group's feats (or
// derivatives) and grad-output rows; at most staged_bytes(f).
template <typename T, bool kSaved>
int64_t staged_backward_bytes(int64_t f) {
  const int64_t source = kSaved ? kGroup<T> * 3 * f * int64_t(sizeof(at::opmath_type<T>))
                                : kGroup<T> * 8 * f * int64_t(sizeof(T));
  return source + kGroup<T> * f * int64_t(sizeof(T));
}

template <typename T, bool kSaved>
void launch_staged_backward(const T* go, const T* feats, const at::opmath_type<T>* deriv,
                            const T* points, T* grad_feats, T* grad_points, int64_t n, int64_t f,
                            cudaStream_t stream) {
  backward_staged_kernel<T, kSaved>
      <<<blocks_for(n, kGroup<T>), kThreads, staged_backward_bytes<T, kSaved>(f), stream>>>(
          go, feats, deriv, points, grad_feats, grad_points, n, static_cast<int>(f));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Whether the one-thread-per-(point, pack) kernels can index with 32-bit
// unsigned integers: the largest tensor they address has fewer than 2^31
// elements, and so does the grid-stride loop's last step (below total +
// blocks * kThreads).
bool indices_fit_32(int64_t largest, int64_t total, int64_t blocks) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  return largest < kLimit && total + blocks * kThreads < kLimit;
}

// Features per access: 16 bytes' worth when F and every pointer allow it.
int pack_for(int64_t f, int64_t elem_size, std::initializer_list<const void*> ptrs) {
  const int64_t v = 16 / elem_size;
  if (v <= 1 || f % v != 0 || !aligned16(ptrs)) return 1;
  return static_cast<int>(v);
}

// Calls fn(std::bool_constant<flag>{}).
template <typename Fn>
void with_flag(bool flag, const Fn& fn) {
  if (flag) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

void forward_cuda(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out,
                  const at::Tensor& derivatives) {
  const c10::cuda::CUDAGuard guard(feats.device());
  const int64_t f = feats.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t* fp = feats.const_data_ptr<scalar_t>();
        const scalar_t* pp = points.const_data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        acc_t* dp = derivatives.defined() ? derivatives.data_ptr<acc_t>() : nullptr;
        auto launch = [&](auto v, auto d) {
          constexpr int V = decltype(v)::value;
          constexpr bool D = decltype(d)::value;
          const int64_t total = out.numel() / V;
          const int64_t blocks = blocks_for(total, kThreads);
          // feats has more elements than the derivatives.
          if (indices_fit_32(feats.numel(), total, blocks)) {
            forward_kernel<scalar_t, V, uint32_t, D><<<blocks, kThreads, 0, stream>>>(
                fp, pp, op, dp, uint32_t(total), uint32_t(f));
          } else {
            forward_kernel<scalar_t, V, int64_t, D>
                <<<blocks, kThreads, 0, stream>>>(fp, pp, op, dp, total, f);
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        constexpr int kPack = 16 / sizeof(scalar_t) > 1 ? 16 / sizeof(scalar_t) : 1;
        with_flag(dp != nullptr, [&](auto d) {
          constexpr bool D = decltype(d)::value;
          if (pack_for(f, sizeof(scalar_t), {fp, op, dp}) == kPack) {
            launch(std::integral_constant<int, kPack>{}, d);
          } else if (staged_takes(f, sizeof(scalar_t), {fp, op})) {
            launch_staged_forward<scalar_t, D>(fp, pp, op, dp, feats.size(0), f, stream);
          } else {
            launch(std::integral_constant<int, 1>{}, d);
          }
        });
      });
}

void backward_cuda(const at::Tensor& grad_out, const at::Tensor& source, bool from_derivatives,
                   const at::Tensor& points, const at::Tensor& grad_feats,
                   const at::Tensor& grad_points) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const int64_t n = grad_feats.size(0), f = grad_feats.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "trilinear_interpolation_backward_cuda",
      [&] {
        using acc_t = at::opmath_type<scalar_t>;
        const scalar_t* gp = grad_out.const_data_ptr<scalar_t>();
        const scalar_t* fp = from_derivatives ? nullptr : source.const_data_ptr<scalar_t>();
        const acc_t* dp = from_derivatives ? source.const_data_ptr<acc_t>() : nullptr;
        const scalar_t* pp = points.const_data_ptr<scalar_t>();
        scalar_t* gfp = grad_feats.data_ptr<scalar_t>();
        scalar_t* gpp = grad_points.data_ptr<scalar_t>();
        auto launch = [&](auto v, auto saved) {
          constexpr int V = decltype(v)::value;
          constexpr bool kSaved = decltype(saved)::value;
          // Threads per point: one pack each up to a warp (a warp's accesses
          // then cover whole rows), and for longer rows about four packs
          // each, at most a block.
          int team = 1;
          while (team < kWarp && team * V < f) team *= 2;
          while (team < kThreads && team * V * 4 < f) team *= 2;
          const int64_t blocks = blocks_for(n, kThreads / team);
          backward_kernel<scalar_t, V, kSaved>
              <<<blocks, kThreads, 0, stream>>>(gp, fp, dp, pp, gfp, gpp, n, f, team);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        constexpr int kPack = 16 / sizeof(scalar_t) > 1 ? 16 / sizeof(scalar_t) : 1;
        with_flag(from_derivatives, [&](auto saved) {
          constexpr bool kSaved = decltype(saved)::value;
          if (pack_for(f, sizeof(scalar_t), {gp, fp, dp, gfp}) == kPack) {
            launch(std::integral_constant<int, kPack>{}, saved);
          } else if (staged_takes(f, sizeof(scalar_t), {gp, fp, dp, gfp})) {
            launch_staged_backward<scalar_t, kSaved>(gp, fp, dp, pp, gfp, gpp, n, f, stream);
          } else {
            launch(std::integral_constant<int, 1>{}, saved);
          }
        });
      });
}

void grad_feats_cuda(const at::Tensor& grad_out, const at::Tensor& points,
                     const at::Tensor& grad_feats) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  const int64_t f = grad_feats.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_out.scalar_type(), "trilinear_interpolation_grad_feats_cuda",
      [&] {
        const scalar_t* gp = grad_out.const_data_ptr<scalar_t>();
        const scalar_t* pp = points.const_data_ptr<scalar_t>();
        scalar_t* gfp = grad_feats.data_ptr<scalar_t>();
        auto launch = [&](auto v) {
          constexpr int V = decltype(v)::value;
          const int64_t total = grad_out.numel() / V;
          const int64_t blocks = blocks_for(total, kThreads);
          if (indices_fit_32(grad_feats.numel(), total, blocks)) {
            grad_feats_kernel<scalar_t, V, uint32_t>
                <<<blocks, kThreads, 0, stream>>>(gp, pp, gfp, uint32_t(total), uint32_t(f));
          } else {
            grad_feats_kernel<scalar_t, V, int64_t>
                <<<blocks, kThreads, 0, stream>>>(gp, pp, gfp, total, f);
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        constexpr int kPack = 16 / sizeof(scalar_t) > 1 ? 16 / sizeof(scalar_t) : 1;
        if (pack_for(f, sizeof(scalar_t), {gp, gfp}) == kPack) {
          launch(std::integral_constant<int, kPack>{});
        } else {
          launch(std::integral_constant<int, 1>{});
        }
      });
}

}  // namespace

TrilinearKernels cuda_trilinear_kernels() {
  return {&forward_cuda, &backward_cuda, &grad_feats_cuda};
}

}  // namespace customconv
