// The launcher of the Hopper forward kernel (implicit_gemm_wgmma.cuh) for
// implicit_gemm.h's fprop_sm90_*: the plan's tile, the kernel's fit on the
// device (cached), the launch on the problem's stream, and the split-K sum.
// Included by translation units compiled for sm_90a only.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/implicit_gemm_wgmma.cuh"
#include "ops/conv2d/split_k_sum.cuh"

namespace customconv::implicit_gemm {

template <typename T, int kM, int kN, int kStages, int kBlocksPerSm>
bool launch_wgmma_fprop(const ConvProblem& pr, const wgmma_fprop::Args& args) {
  using Cfg = wgmma_fprop::Tile<T, kM, kN, kStages>;
  const auto kernel = &wgmma_fprop::fprop_kernel<T, kM, kN, kStages, kBlocksPerSm>;
  static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                             KernelNeeds{90, Cfg::kThreads, size_t(Cfg::kSmemBytes)});
  if (!fit.on(pr.device)) return false;
  const int64_t positions = int64_t(pr.n) * pr.p * pr.q;
  const dim3 grid(unsigned((pr.k + kN - 1) / kN), unsigned((positions + kM - 1) / kM), unsigned(args.split));
  if (grid.y > 65535u) return false;
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, static_cast<cudaStream_t>(pr.stream)>>>(args);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// T: __half, __nv_bfloat16 or float (TF32).
template <typename T>
bool fprop_wgmma(const ConvProblem& pr) {
  constexpr int kStep = wgmma_fprop::kRowBytes / int(sizeof(T));
  const int64_t steps = int64_t(pr.r) * pr.s * pr.c / kStep;
  if (pr.groups != 1 || pr.c % kStep != 0 || pr.k % 8 != 0 || pr.input_strides[0] != 0 ||
      pr.split_k < 1 || pr.split_k > steps || (pr.split_k > 1 && pr.workspace == nullptr)) {
    return false;
  }
  wgmma_fprop::Args a{};
  a.x = pr.input, a.weight = pr.weight, a.y = pr.output, a.bias = pr.bias;
  a.residual = pr.residual, a.activation = pr.activation;
  a.partial = static_cast<float*>(pr.workspace), a.split = pr.split_k;
  a.n = pr.n, a.h = pr.h, a.w = pr.w, a.c = pr.c, a.k = pr.k, a.r = pr.r, a.s = pr.s, a.p = pr.p, a.q = pr.q;
  a.pad_h = pr.pad_h, a.pad_w = pr.pad_w, a.stride_h = pr.stride_h, a.stride_w = pr.stride_w;
  a.dilation_h = pr.dilation_h, a.dilation_w = pr.dilation_w;
  bool launched = false;
  switch (wgmma_fprop_plan(pr).tile) {
    case WgmmaTile::k128x64: launched = launch_wgmma_fprop<T, 128, 64, 4, 2>(pr, a); break;
    case WgmmaTile::k64x128: launched = launch_wgmma_fprop<T, 64, 128, 4, 2>(pr, a); break;
    case WgmmaTile::k128x128: launched = launch_wgmma_fprop<T, 128, 128, 4, 1>(pr, a); break;
    case WgmmaTile::k64x128x3: launched = launch_wgmma_fprop<T, 64, 128, 3, 3>(pr, a); break;
  }
  if (launched && pr.split_k > 1) launch_sum_slices<T>(pr);
  return launched;
}

}  // namespace customconv::implicit_gemm
