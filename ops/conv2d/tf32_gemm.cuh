// CUTLASS's sm80-style TF32 GEMM as the pointwise forwards use it
// (pointwise_tf32_nchw.h, pointwise_tf32_channels_last.h): A row-major, the
// layouts of B and of C/D per route, float32 operands read with 16-byte
// vectors (4 elements), TF32 products rounded to nearest, float32 sums.
// A block computes a Tile::M x Tile::N block of the result with (Tile / Warp)
// warps, each a Warp tile of 16 x 8 x 8 TF32 mma.sync instructions, the next
// Stages - 1 reduction steps of Tile::K in flight with cp.async; the epilogue
// computes alpha * sum + beta * C.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/gemm.h>
#include <cutlass/gemm/kernel/default_gemm_universal.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include "ops/common/kernel_fit.h"

namespace customconv {

template <typename LayoutB, typename LayoutC, typename Tile, typename Warp, int Stages>
using Tf32Gemm = typename cutlass::gemm::kernel::DefaultGemmUniversal<
    float, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 4, float, LayoutB,
    cutlass::ComplexTransform::kNone, 4, float, LayoutC, float, cutlass::arch::OpClassTensorOp,
    cutlass::arch::Sm80, Tile, Warp, cutlass::gemm::GemmShape<16, 8, 8>,
    cutlass::epilogue::thread::LinearCombination<float, 4, float, float>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<1>, Stages,
    cutlass::arch::OpMultiplyAdd>::GemmKernel;

// Launches Kernel (a Tf32Gemm) on args on the current stream of `device`.
// False, launching nothing, where the device cannot run it (before sm_80, or
// not enough shared memory), CUTLASS refuses the arguments, or the grid needs
// more than CUDA's 65535 blocks in y or z.
template <typename Kernel>
bool launch_tf32_gemm(const typename Kernel::Arguments& args, int device) {
  constexpr int kThreads = Kernel::kThreadCount;
  constexpr int kShared = int(sizeof(typename Kernel::SharedStorage));
  static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::Kernel2<Kernel>),
                             KernelNeeds{80, kThreads, size_t(kShared)});
  const KernelFit& f = fit.on(device);
  if (!f || Kernel::can_implement(args) != cutlass::Status::kSuccess) return false;
  const typename Kernel::Params params(args, f.sms, f.blocks_per_sm);
  const dim3 grid = params.get_grid_dims();
  if (grid.y > 65535 || grid.z > 65535) return false;
  cutlass::Kernel2<Kernel><<<grid, kThreads, kShared, at::cuda::getCurrentCUDAStream()>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace customconv
