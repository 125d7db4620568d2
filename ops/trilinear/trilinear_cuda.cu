#include "ops/trilinear/corner_weights.h"

#include "ops/common/launch.h"
#include "ops/trilinear/trilinear.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <algorithm>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace customconv {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

// One thread per output element (point, feature), neighbouring threads on
// neighbouring features: each corner row is read coalesced along F.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ feats, const T* __restrict__ points, T* __restrict__ out,
                   int64_t total, int64_t f) {
  using acc_t = at::opmath_type<T>;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = idx / f, x = idx % f;
    const T* pt = points + 3 * p;
    const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
    const T* fp = feats + p * 8 * f + x;
    acc_t acc = 0;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc += cw.weight[c] * static_cast<acc_t>(fp[c * f]);
    out[idx] = static_cast<T>(acc);
  }
}

// One warp per point (warps stride over points): lanes stride along F,
// writing the 8 grad_feats rows coalesced and keeping private sums of the 3
// point derivatives, which a fixed shuffle tree then reduces (no atomics:
// deterministic).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    backward_kernel(const T* __restrict__ go, const T* __restrict__ feats,
                    const T* __restrict__ points, T* __restrict__ grad_feats,
                    T* __restrict__ grad_points, int64_t n, int64_t f) {
  using acc_t = at::opmath_type<T>;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t p = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / kWarp; p < n; p += warps) {
    const T* pt = points + 3 * p;
    const auto cw = corner_weights<acc_t>(pt[0], pt[1], pt[2]);
    const T* fp = feats + p * 8 * f;
    const T* g = go + p * f;
    T* gf = grad_feats + p * 8 * f;
    acc_t d[3] = {0, 0, 0};
    for (int64_t x = lane; x < f; x += kWarp) {
      const acc_t gx = static_cast<acc_t>(g[x]);
      acc_t blend[3] = {0, 0, 0};
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const acc_t fv = static_cast<acc_t>(fp[c * f + x]);
        gf[c * f + x] = static_cast<T>(cw.weight[c] * gx);
#pragma unroll
        for (int a = 0; a < 3; ++a) blend[a] += cw.d_point[a][c] * fv;
      }
#pragma unroll
      for (int a = 0; a < 3; ++a) d[a] += gx * blend[a];
    }
#pragma unroll
    for (int a = 0; a < 3; ++a) {
      for (int step = kWarp / 2; step > 0; step >>= 1)
        d[a] += __shfl_down_sync(0xffffffffu, d[a], step);
    }
    if (lane == 0) {
#pragma unroll
      for (int a = 0; a < 3; ++a) grad_points[3 * p + a] = static_cast<T>(d[a]);
    }
  }
}

void forward_cuda(const at::Tensor& feats, const at::Tensor& points, const at::Tensor& out) {
  const c10::cuda::CUDAGuard guard(feats.device());
  const int64_t total = out.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_cuda", [&] {
        forward_kernel<scalar_t><<<blocks_for(total, kThreads), kThreads, 0, stream>>>(
            feats.const_data_ptr<scalar_t>(), points.const_data_ptr<scalar_t>(),
            out.data_ptr<scalar_t>(), total, feats.size(2));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

void backward_cuda(const at::Tensor& grad_out, const at::Tensor& feats, const at::Tensor& points,
                   const at::Tensor& grad_feats, const at::Tensor& grad_points) {
  const c10::cuda::CUDAGuard guard(feats.device());
  const int64_t n = feats.size(0);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, feats.scalar_type(), "trilinear_interpolation_backward_cuda", [&] {
        // Every lane of a warp reaches the shuffles: the loop bound is per warp.
        backward_kernel<scalar_t><<<blocks_for(n, kThreads / kWarp), kThreads, 0, stream>>>(
            grad_out.const_data_ptr<scalar_t>(), feats.const_data_ptr<scalar_t>(),
            points.const_data_ptr<scalar_t>(), grad_feats.data_ptr<scalar_t>(),
            grad_points.data_ptr<scalar_t>(), n, feats.size(2));
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
}

}  // namespace

TrilinearKernels cuda_trilinear_kernels() { return {&forward_cuda, &backward_cuda}; }

}  // namespace customconv
