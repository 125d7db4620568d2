// The CUTLASS implicit-GEMM forward convolution behind implicit_gemm.h,
// templated on the element type and the tile; included by one translation
// unit per element type.
//
// The GEMM: rows are the output positions (N * P * Q), columns the output
// channels (K), the reduction runs over (r, s, c). A block of kTile::kM x
// kTile::kN outputs is computed by (kM / kWarp::kM) x (kN / kWarp::kN) warps,
// each a kWarp tile of 16 x 8 x 16 mma.sync instructions; the input and weight
// tiles of the next kStages - 1 reduction steps are in flight with cp.async.
// The epilogue computes acc + bias[k] in float32 (the bias is the epilogue's
// source tensor, read with zero strides for n, p and q) and rounds once.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cutlass/conv/conv2d_problem_size.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"

namespace customconv::implicit_gemm {

template <typename Element, typename kTile, typename kWarp, int kStages>
struct FpropKernel {
  using ElementT = Element;
  static constexpr int kVector = 128 / cutlass::sizeof_bits<Element>::value;
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kVector, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
      Element, cutlass::layout::TensorNHWC, Element, cutlass::layout::TensorNHWC, Element,
      cutlass::layout::TensorNHWC, float, cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
      kTile, kWarp, cutlass::gemm::GemmShape<16, 8, 16>, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
};

// Launches the kernel on the problem; false (nothing launched) when CUTLASS
// refuses the problem or the device cannot run the kernel.
template <typename Config>
bool launch_fprop(const FpropProblem& pr) {
  using Element = typename Config::ElementT;
  using Layout = cutlass::layout::TensorNHWC;
  using Device = typename Config::Device;
  const cutlass::conv::Conv2dProblemSize problem(
      pr.n, pr.h, pr.w, pr.c, pr.k, pr.r, pr.s, pr.p, pr.q, pr.pad_h, pr.pad_w, pr.stride_h,
      pr.stride_w, pr.dilation_h, pr.dilation_w, cutlass::conv::Mode::kCrossCorrelation);
  auto* x = static_cast<Element*>(const_cast<void*>(pr.input));
  auto* w = static_cast<Element*>(const_cast<void*>(pr.weight));
  auto* y = static_cast<Element*>(pr.output);
  auto* b = static_cast<Element*>(const_cast<void*>(pr.bias));
  const Layout out_layout = Layout::packed({pr.n, pr.p, pr.q, pr.k});
  // The bias as the epilogue's source: element (n, p, q, k) at offset k.
  const Layout bias_layout{typename Layout::Stride(0)};
  typename Device::Arguments args(problem, {x, Layout::packed({pr.n, pr.h, pr.w, pr.c})},
                                  {w, Layout::packed({pr.k, pr.r, pr.s, pr.c})},
                                  {b ? b : y, b ? bias_layout : out_layout}, {y, out_layout},
                                  {1.0f, b ? 1.0f : 0.0f});
  if (Device::can_implement(args) != cutlass::Status::kSuccess) return false;

  constexpr int kShared = int(sizeof(typename Config::Kernel::SharedStorage));
  constexpr int kThreads = 32 * Device::kWarpCount;
  static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::Kernel<typename Config::Kernel>),
                             KernelNeeds{80, kThreads, size_t(kShared)});
  if (!fit.on(pr.device)) return false;

  const typename Config::Kernel::Params params(args, nullptr);
  typename Config::Kernel::ThreadblockSwizzle swizzle;
  const dim3 grid = swizzle.get_grid_shape(params.grid_tiled_shape);
  cutlass::Kernel<typename Config::Kernel>
      <<<grid, kThreads, kShared, static_cast<cudaStream_t>(pr.stream)>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// The tile for the problem: 128 x 64 outputs where there are at most 64
// output channels (a 128-wide tile would be half empty), 128 x 128 otherwise.
template <typename Element>
bool fprop(const FpropProblem& pr) {
  using cutlass::gemm::GemmShape;
  if (pr.k <= 64) {
    return launch_fprop<FpropKernel<Element, GemmShape<128, 64, 64>, GemmShape<64, 32, 64>, 4>>(pr);
  }
  return launch_fprop<FpropKernel<Element, GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 3>>(pr);
}

}  // namespace customconv::implicit_gemm
