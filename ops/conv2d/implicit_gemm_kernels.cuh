// The CUTLASS implicit-GEMM convolutions behind implicit_gemm.h, templated on
// the element type and the tile; included by one translation unit per pass and
// element type.
//
// Each pass is a GEMM over the NHWC / KRSC / NPQK tensors (CUTLASS's mapping):
//   fprop  rows: output positions (N*P*Q), columns: output channels (K),
//          reduction over (r, s, c);
//   dgrad  rows: input positions (N*H*W; with stride > 1, one sub-problem per
//          stride phase, so that every row's taps are regular), columns: input
//          channels (C), reduction over (r, s, k);
//   wgrad  rows: output channels (K), columns: (r, s, c), reduction over the
//          output positions (N*P*Q), split into `split_k` slices, each written
//          to its own float32 plane of the output (parallel split-K).
// A block of kTile::kM x kTile::kN results is computed by (kM / kWarp::kM) x
// (kN / kWarp::kN) warps, each a kWarp tile of 16 x 8 x 16 mma.sync
// instructions; the operand tiles of the next kStages - 1 reduction steps are
// in flight with cp.async. The epilogue computes alpha * acc + beta * source
// in float32 and rounds once (fprop: the source is the bias, read with zero
// strides for n, p and q).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cutlass/conv/conv2d_problem_size.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>
#include <cutlass/conv/kernel/default_conv2d_dgrad.h>
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/conv/kernel/default_conv2d_wgrad.h>
#include <cutlass/conv/threadblock/threadblock_swizzle.h>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"

namespace customconv::implicit_gemm {

using cutlass::gemm::GemmShape;
using Layout = cutlass::layout::TensorNHWC;
using Instruction = GemmShape<16, 8, 16>;

template <typename Element>
constexpr int kVector = 128 / cutlass::sizeof_bits<Element>::value;

template <typename Element, typename kTile, typename kWarp, int kStages>
struct FpropKernel {
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kVector<Element>, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, kTile, kWarp, Instruction, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

// Stride > 1 (stride 1 goes through fprop with the rotated weight).
template <typename Element, typename kTile, typename kWarp, int kStages>
struct DgradKernel {
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kVector<Element>, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dDgrad<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, kTile, kWarp, Instruction, Epilogue,
      cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>, kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized,
      cutlass::conv::StrideSupport::kStrided>::Kernel;
};

// A float32 output (the caller sums the slices and rounds once).
template <typename Element, typename kTile, typename kWarp, int kStages>
struct WgradKernel {
  using Epilogue = cutlass::epilogue::thread::LinearCombination<float, 4, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dWgrad<
      Element, Layout, Element, Layout, float, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, kTile, kWarp, Instruction, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

inline cutlass::conv::Conv2dProblemSize problem_size(const ConvProblem& pr, int split_k = 1) {
  return cutlass::conv::Conv2dProblemSize(
      pr.n, pr.h, pr.w, pr.c, pr.k, pr.r, pr.s, pr.p, pr.q, pr.pad_h, pr.pad_w, pr.stride_h,
      pr.stride_w, pr.dilation_h, pr.dilation_w, cutlass::conv::Mode::kCrossCorrelation, split_k);
}

template <typename Element>
Element* as(const void* p) {
  return static_cast<Element*>(const_cast<void*>(p));
}

// Launches Kernel on its arguments; false (nothing launched) when CUTLASS
// refuses the problem or the device cannot run the kernel. The shared-memory
// attribute is set once per device (kernel_fit), not per call.
template <typename Kernel>
bool launch(const typename cutlass::conv::device::ImplicitGemmConvolution<Kernel>::Arguments& args,
            const ConvProblem& pr) {
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  if (Device::can_implement(args) != cutlass::Status::kSuccess) return false;
  constexpr int kShared = int(sizeof(typename Kernel::SharedStorage));
  constexpr int kThreads = 32 * Device::kWarpCount;
  static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::Kernel<Kernel>),
                             KernelNeeds{80, kThreads, size_t(kShared)});
  if (!fit.on(pr.device)) return false;
  const typename Kernel::Params params(args, nullptr);
  typename Kernel::ThreadblockSwizzle swizzle;
  const dim3 grid = swizzle.get_grid_shape(params.grid_tiled_shape);
  cutlass::Kernel<Kernel><<<grid, kThreads, kShared, static_cast<cudaStream_t>(pr.stream)>>>(params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

template <typename Config>
bool launch_fprop(const ConvProblem& pr) {
  using Kernel = typename Config::Kernel;
  using Element = typename Kernel::ElementA;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout out_layout = Layout::packed({pr.n, pr.p, pr.q, pr.k});
  // The bias as the epilogue's source: element (n, p, q, k) at offset k.
  const Layout bias_layout{typename Layout::Stride(0)};
  auto* y = as<Element>(pr.output);
  auto* b = as<Element>(pr.bias);
  const typename Device::Arguments args(
      problem_size(pr), {as<Element>(pr.input), Layout::packed({pr.n, pr.h, pr.w, pr.c})},
      {as<Element>(pr.weight), Layout::packed({pr.k, pr.r, pr.s, pr.c})},
      {b ? b : y, b ? bias_layout : out_layout}, {y, out_layout}, {1.0f, b ? 1.0f : 0.0f});
  return launch<Kernel>(args, pr);
}

// The tile for the problem: 128 x 64 outputs where there are at most 64 output
// channels (a 128-wide tile would be half empty); 64 x 64 where 128 x 128
// tiles would leave multiprocessors idle (small planes: 7x7 and 14x14 at N=32);
// 128 x 128 otherwise.
template <typename Element>
bool fprop(const ConvProblem& pr) {
  using Small = FpropKernel<Element, GemmShape<64, 64, 64>, GemmShape<32, 32, 64>, 5>;
  using Narrow = FpropKernel<Element, GemmShape<128, 64, 64>, GemmShape<64, 32, 64>, 4>;
  using Large = FpropKernel<Element, GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 3>;
  if (pr.k <= 64) return launch_fprop<Narrow>(pr);
  const int64_t rows = int64_t(pr.n) * pr.p * pr.q;
  const int64_t large_tiles = ((rows + 127) / 128) * ((pr.k + 127) / 128);
  static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::Kernel<typename Large::Kernel>),
                             KernelNeeds{80, 128, sizeof(typename Large::Kernel::SharedStorage)});
  if (large_tiles < fit.on(pr.device).sms) return launch_fprop<Small>(pr);
  return launch_fprop<Large>(pr);
}

template <typename Config>
bool launch_dgrad(const ConvProblem& pr) {
  using Kernel = typename Config::Kernel;
  using Element = typename Kernel::ElementA;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout in_layout = Layout::packed({pr.n, pr.h, pr.w, pr.c});
  auto* gx = as<Element>(pr.input);
  const typename Device::Arguments args(
      problem_size(pr), {as<Element>(pr.output), Layout::packed({pr.n, pr.p, pr.q, pr.k})},
      {as<Element>(pr.weight), Layout::packed({pr.k, pr.r, pr.s, pr.c})}, {gx, in_layout},
      {gx, in_layout}, {1.0f, 0.0f});
  return launch<Kernel>(args, pr);
}

// 128 x 64 tiles where there are at most 64 input channels, else 128 x 128.
template <typename Element>
bool dgrad(const ConvProblem& pr) {
  if (pr.stride_h == 1 && pr.stride_w == 1) return false;
  if (pr.c <= 64) {
    return launch_dgrad<DgradKernel<Element, GemmShape<128, 64, 64>, GemmShape<64, 32, 64>, 4>>(pr);
  }
  return launch_dgrad<DgradKernel<Element, GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 3>>(pr);
}

// The wgrad tile (rows: K, columns: r*s*c), as implicit_gemm.h states it.
using WgradTile = GemmShape<kWgradTileRows, kWgradTileCols, 32>;
template <typename Element>
using Wgrad = WgradKernel<Element, WgradTile, GemmShape<64, 64, 32>, 4>;

template <typename Element>
bool wgrad(const ConvProblem& pr) {
  using Kernel = typename Wgrad<Element>::Kernel;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout w_layout = Layout::packed({pr.k, pr.r, pr.s, pr.c});
  auto* gw = static_cast<float*>(pr.weight);
  typename Device::Arguments args(
      problem_size(pr, pr.split_k), {as<Element>(pr.output), Layout::packed({pr.n, pr.p, pr.q, pr.k})},
      {as<Element>(pr.input), Layout::packed({pr.n, pr.h, pr.w, pr.c})}, {gw, w_layout},
      {gw, w_layout}, {1.0f, 0.0f},
      pr.split_k > 1 ? cutlass::conv::SplitKMode::kParallel : cutlass::conv::SplitKMode::kSerial);
  return launch<Kernel>(args, pr);
}

template <typename Element>
int64_t wgrad_resident(int device) {
  using Kernel = typename Wgrad<Element>::Kernel;
  static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::Kernel<Kernel>),
                             KernelNeeds{80, Kernel::kThreadCount, sizeof(typename Kernel::SharedStorage)});
  return fit.on(device).resident_blocks();
}

}  // namespace customconv::implicit_gemm
