#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

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

// One thread per (point, pack of V features), neighbouring threads on
// neighbouring packs: each corner row is read coalesced along F, 16 bytes per
// access when V > 1.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ feats, const T* __restrict__ points, T* __restrict__ out,
                   int64_t total, int64_t f) {
  using acc_t = at::opmath_type<T>;
  using P = Pack<T, V>;
  const int64_t fv = f / V;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = idx / fv, x = idx % fv;
    const T* pt = points + 3 * p;
    const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
    const P* fp = reinterpret_cast<const P*>(feats + p * 8 * f) + x;
    acc_t acc[V] = {};
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const P row = fp[c * fv];
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += cw.weight[c] * static_cast<acc_t>(row.v[e]);
    }
    P o;
#pragma unroll
    for (int e = 0; e < V; ++e) o.v[e] = static_cast<T>(acc[e]);
    reinterpret_cast<P*>(out)[idx] = o;
  }
}

// A team of S threads (a power of two from 1 to 256: part of a warp, or whole
// warps) per point; teams stride over points. The team's threads stride along
// the point's packs of V features, writing the 8 grad_feats rows coalesced and
// keeping private sums of the 3 point derivatives, which a fixed shuffle tree
// (and, for teams of several warps, a fixed pass over their warps) reduces
// (no atomics: deterministic).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ go, const T* __restrict__ feats,
                    const T* __restrict__ points, T* __restrict__ grad_feats,
                    T* __restrict__ grad_points, int64_t n, int64_t f, int team) {
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
      const P* fp = reinterpret_cast<const P*>(feats + p * 8 * f);
      const P* g = reinterpret_cast<const P*>(go + p * f);
      P* gf = reinterpret_cast<P*>(grad_feats + p * 8 * f);
      for (int64_t x = member; x < fv; x += team) {
        const P gp = g[x];
        acc_t gx[V], blend[3][V] = {};
#pragma unroll
        for (int e = 0; e < V; ++e) gx[e] = static_cast<acc_t>(gp.v[e]);
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const P row = fp[c * fv + x];
          P out;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const acc_t fvv = static_cast<acc_t>(row.v[e]);
            out.v[e] = static_cast<T>(cw.weight[c] * gx[e]);
#pragma unroll
            for (int a = 0; a < 3; ++a) blend[a][e] += cw.d_point[a][c] * fvv;
          }
          gf[c * fv + x] = out;
        }
#pragma unroll
        for (int e = 0; e < V; ++e)
#pragma unroll
          for (int a = 0; a < 3; ++a) d[a] += gx[e] * blend[a][e];
      }
    }
    const int width = team < kWarp ? team : kWarp;
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      for (int step = width / 2; step > 0; step >>= 1)
        d[a] += __shfl_down_sync(0xffffffffu, d[a], step, width);
    }
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

// Features per access: 16 bytes' worth when F and every pointer allow it.
int pack_for(int64_t f, int64_t elem_size, std::initializer_list<const void*> ptrs) {
  const int64_t v = 16 / elem_size;
  if (v <= 1 || f % v != 0) return 1;
  for (const void* q : ptrs)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return 1;
  return static_cast<int>(v);
}

void forward_cuda(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(feats.device());
  const int64_t f = feats.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_cuda", [&] {
        const scalar_t* fp = feats.const_data_ptr<scalar_t>();
        scalar_t* op = out.data_ptr<scalar_t>();
        auto launch = [&](auto v) {
          constexpr int V = decltype(v)::value;
          const int64_t total = out.numel() / V;
          forward_kernel<scalar_t, V><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
              fp, points.const_data_ptr<scalar_t>(), op, total, f);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        constexpr int kPack = 16 / sizeof(scalar_t) > 1 ? 16 / sizeof(scalar_t) : 1;
        if (pack_for(f, sizeof(scalar_t), {fp, op}) == kPack) {
          launch(std::integral_constant<int, kPack>{});
        } else {
          launch(std::integral_constant<int, 1>{});
        }
      });
}

void backward_cuda(const at::Tensor& grad_out, const at::Tensor& feats, const at::Tensor& points,
                   const at::Tensor& grad_feats, const at::Tensor& grad_points) {
  const c10::cuda::CUDAGuard guard(feats.device());
  const int64_t n = feats.size(0), f = feats.size(2);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_backward_cuda", [&] {
        const scalar_t* gp = grad_out.const_data_ptr<scalar_t>();
        const scalar_t* fp = feats.const_data_ptr<scalar_t>();
        scalar_t* gfp = grad_feats.data_ptr<scalar_t>();
        auto launch = [&](auto v) {
          constexpr int V = decltype(v)::value;
          // Threads per point: about four packs each, at most a block.
          int team = 1;
          while (team < kThreads && team * V * 4 < f) team *= 2;
          const int64_t blocks = blocks_for(n, kThreads / team);
          backward_kernel<scalar_t, V>
              <<<blocks, kThreads, 0, stream>>>(gp, fp, points.const_data_ptr<scalar_t>(), gfp,
                                                grad_points.data_ptr<scalar_t>(), n, f, team);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        constexpr int kPack = 16 / sizeof(scalar_t) > 1 ? 16 / sizeof(scalar_t) : 1;
        if (pack_for(f, sizeof(scalar_t), {gp, fp, gfp}) == kPack) {
          launch(std::integral_constant<int, kPack>{});
        } else {
          launch(std::integral_constant<int, 1>{});
        }
      });
}

}  // namespace

TrilinearKernels cuda_trilinear_kernels() { return {&forward_cuda, &backward_cuda}; }

}  // namespace customconv
