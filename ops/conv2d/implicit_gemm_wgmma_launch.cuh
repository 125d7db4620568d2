// The launcher of the Hopper forward kernel (implicit_gemm_wgmma.cuh) for
// implicit_gemm.h's fprop_sm90_f32: the plan's box, the tensor maps, the
// kernel's fit on the device (cached), the launch on the problem's stream,
// and the split-K sum. Included by translation units compiled for sm_90a only.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/implicit_gemm_wgmma.cuh"
#include "ops/conv2d/split_k_sum.cuh"

namespace customconv::implicit_gemm {

// T: float (TF32; the kernel is written for __half and __nv_bfloat16 too,
// which were timed but are not routed here: bench/NOTES.md). False (nothing launched) where
// the plan declines the problem, the device cannot run the kernel or the
// driver refuses the tensor maps.
template <typename T>
bool fprop_wgmma(const ConvProblem& pr) {
  constexpr int kM = 128, kN = 128, kStages = 4;
  using Cfg = wgmma_fprop::Tile<T, kM, kN, kStages>;
  const WgmmaPlan plan = wgmma_fprop_plan(pr, int(sizeof(T)));
  if (!plan.take || pr.split_k != plan.split || (pr.split_k > 1 && pr.workspace == nullptr)) return false;
  const auto kernel = &wgmma_fprop::fprop_tma_kernel<T, kM, kN, kStages>;
  static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                             KernelNeeds{90, Cfg::kThreads, size_t(Cfg::kSmemBytes)});
  if (!fit.on(pr.device)) return false;
  wgmma_fprop::Args a{};
  a.y = pr.output, a.bias = pr.bias, a.residual = pr.residual, a.activation = pr.activation;
  a.partial = static_cast<float*>(pr.workspace), a.split = pr.split_k;
  a.n = pr.n, a.k = pr.k, a.p = pr.p, a.q = pr.q, a.r = pr.r, a.s = pr.s, a.c = pr.c;
  a.pad_h = pr.pad_h, a.pad_w = pr.pad_w, a.stride_h = pr.stride_h, a.stride_w = pr.stride_w;
  a.dilation_h = pr.dilation_h, a.dilation_w = pr.dilation_w;
  const Box& box = plan.box;
  a.bw = box.bw, a.bh = box.bh, a.bn = box.bn, a.tw = box.tw, a.th = box.th, a.tn = box.tn;
  CUtensorMap xmap, wmap;
  if (!wgmma_fprop::make_maps<T, kN>(&xmap, &wmap, pr.input, pr.weight, pr.n, pr.h, pr.w, pr.c, pr.k,
                                     pr.r * pr.s, a)) {
    return false;
  }
  const int64_t tiles = box.tiles() * ((pr.k + kN - 1) / kN) * pr.split_k;
  const unsigned blocks = unsigned(std::min<int64_t>(tiles, fit.on(pr.device).resident_blocks()));
  kernel<<<blocks, Cfg::kThreads, Cfg::kSmemBytes, static_cast<cudaStream_t>(pr.stream)>>>(xmap, wmap, a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (pr.split_k > 1) launch_sum_slices<T>(pr);
  return true;
}

}  // namespace customconv::implicit_gemm
