// The CUTLASS implicit-GEMM convolutions behind implicit_gemm.h, templated on
// the element type and the tile; included by one translation unit per pass and
// element type.
//
// Each pass is a GEMM over the NHWC / KRSC / NPQK tensors (CUTLASS's mapping):
//   fprop  rows: output positions (N*P*Q), columns: output channels (K),
//          reduction over (r, s, c);
//   dgrad  rows: input positions (N*H*W; with stride > 1, one sub-problem per
//          stride phase, so that every row's taps are regular), columns: input
//          channels (C), reduction over (r, s, k), the weight read in place;
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

#include <type_traits>

#include <cutlass/conv/conv2d_problem_size.h>
#include <cutlass/conv/device/implicit_gemm_convolution.h>
#include <cutlass/conv/kernel/default_conv2d_dgrad.h>
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/conv/kernel/default_conv2d_group_fprop.h>
#include <cutlass/conv/kernel/default_conv2d_wgrad.h>
#include <cutlass/conv/threadblock/threadblock_swizzle.h>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/threadblock/threadblock_swizzle.h>

#include "ops/common/activation.h"
#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/split_k_sum.cuh"

namespace customconv::implicit_gemm {

using cutlass::gemm::GemmShape;
using Layout = cutlass::layout::TensorNHWC;

template <typename Element>
constexpr int kVector = 128 / cutlass::sizeof_bits<Element>::value;

// A block tile, its warp tile and its pipeline depth.
template <typename kTile_, typename kWarp_, int kStages_>
struct TileConfig {
  using kTile = kTile_;
  using kWarp = kWarp_;
  static constexpr int kStages = kStages_;
};

// The tiles per element type. 16-bit: 16 x 8 x 16 instructions, 64-deep
// reduction steps. float32: TF32 instructions (16 x 8 x 8; CUTLASS rounds each
// float operand to TF32 in the warp's MMA), 32-deep steps (the same bytes).
template <typename Element>
struct Tiles {
  using Instruction = GemmShape<16, 8, 16>;
  using Narrow = TileConfig<GemmShape<128, 64, 64>, GemmShape<64, 32, 64>, 4>;
  using Large = TileConfig<GemmShape<128, 128, 64>, GemmShape<64, 64, 64>, 3>;
  using Wgrad = TileConfig<GemmShape<128, 128, 32>, GemmShape<64, 64, 32>, 4>;
  using WgradSmall = TileConfig<GemmShape<64, 64, 64>, GemmShape<32, 32, 64>, 5>;
  using WgradNarrow = TileConfig<GemmShape<128, 64, 64>, GemmShape<64, 32, 64>, 4>;
};
template <>
struct Tiles<float> {
  using Instruction = GemmShape<16, 8, 8>;
  using Narrow = TileConfig<GemmShape<128, 64, 32>, GemmShape<64, 32, 32>, 4>;
  using Large = TileConfig<GemmShape<128, 128, 32>, GemmShape<64, 64, 32>, 3>;
  using Wgrad = TileConfig<GemmShape<128, 128, 32>, GemmShape<64, 64, 32>, 3>;
  using WgradWide = TileConfig<GemmShape<256, 128, 16>, GemmShape<64, 64, 16>, 3>;
  using WgradSmall = TileConfig<GemmShape<64, 64, 32>, GemmShape<32, 32, 32>, 5>;
};

// ElementOut: the output's type (float32 for split-K partial sums).
template <typename Element, typename Tile, typename ElementOut = Element>
struct FpropKernel {
  using Epilogue =
      cutlass::epilogue::thread::LinearCombination<ElementOut, kVector<ElementOut>, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
      Element, Layout, Element, Layout, ElementOut, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Tile::kTile, typename Tile::kWarp,
      typename Tiles<Element>::Instruction, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, Tile::kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

// Grouped fprop (CUTLASS's single-group mode): a block computes 128 output
// positions x kGroupTile output channels of one group, its reduction steps
// kGroupTile channels of that group's input, so that no step reads another
// group's channels; 4 warps of 32 x 32. Epilogue_: the thread-level output
// functor (the fused forward's adds its activation).
template <typename Element,
          typename Epilogue_ = cutlass::epilogue::thread::LinearCombination<Element, kVector<Element>, float, float>>
struct GroupFpropKernel {
  using Tile = TileConfig<GemmShape<128, kGroupTile, kGroupTile>, GemmShape<32, 32, kGroupTile>,
                          sizeof(Element) == 2 ? 4 : 3>;
  using Epilogue = Epilogue_;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dGroupFprop<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Tile::kTile, typename Tile::kWarp,
      typename Tiles<Element>::Instruction, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, Tile::kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::GroupMode::kSingleGroup,
      cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

// kUnity: stride 1, each input position's taps the output positions around it.
// kStrided: stride > 1, one sub-problem per stride phase (no dilation), with
// its own swizzle.
template <typename Element, typename Tile, cutlass::conv::StrideSupport kStride>
struct DgradKernel {
  using Epilogue = cutlass::epilogue::thread::LinearCombination<Element, kVector<Element>, float, float>;
  using Swizzle = std::conditional_t<kStride == cutlass::conv::StrideSupport::kUnity,
                                     cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>,
                                     cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dDgrad<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Tile::kTile, typename Tile::kWarp,
      typename Tiles<Element>::Instruction, Epilogue, Swizzle, Tile::kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized, kStride>::Kernel;
};

// A float32 output (the caller sums the slices and rounds once).
template <typename Element, typename Tile>
struct WgradKernel {
  using Epilogue = cutlass::epilogue::thread::LinearCombination<float, 4, float, float>;
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dWgrad<
      Element, Layout, Element, Layout, float, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Tile::kTile, typename Tile::kWarp,
      typename Tiles<Element>::Instruction, Epilogue,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, Tile::kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

inline cutlass::conv::Conv2dProblemSize problem_size(const ConvProblem& pr, int split_k = 1) {
  return cutlass::conv::Conv2dProblemSize(
      pr.n, pr.h, pr.w, pr.c, pr.k, pr.r, pr.s, pr.p, pr.q, pr.pad_h, pr.pad_w, pr.stride_h,
      pr.stride_w, pr.dilation_h, pr.dilation_w, cutlass::conv::Mode::kCrossCorrelation, split_k,
      pr.groups);
}

// The input activation's layout as fprop and wgrad read it: its strides
// where given (an overlapping view: the packed stems' folded columns,
// implicit_gemm.cpp), else packed NHWC.
inline Layout input_layout(const ConvProblem& pr) {
  if (pr.input_strides[0] == 0) return Layout::packed({pr.n, pr.h, pr.w, pr.c});
  typename Layout::Stride stride;
  for (int i = 0; i < 3; ++i) stride[i] = pr.input_strides[i];
  return Layout(stride);
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

template <typename Kernel>
bool launch_fprop(const ConvProblem& pr) {
  using Element = typename Kernel::ElementA;
  using ElementOut = typename Kernel::ElementC;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout out_layout = Layout::packed({pr.n, pr.p, pr.q, pr.k});
  // The bias as the epilogue's source: element (n, p, q, k) at offset k.
  const Layout bias_layout{typename Layout::Stride(0)};
  const bool split = pr.split_k > 1;
  auto* y = split ? static_cast<ElementOut*>(pr.workspace) : as<ElementOut>(pr.output);
  auto* b = split ? nullptr : as<ElementOut>(pr.bias);
  const typename Device::Arguments args(
      problem_size(pr, pr.split_k), {as<Element>(pr.input), input_layout(pr)},
      {as<Element>(pr.weight), Layout::packed({pr.k, pr.r, pr.s, pr.c / pr.groups})},
      {b ? b : y, b ? bias_layout : out_layout}, {y, out_layout}, {1.0f, b ? 1.0f : 0.0f},
      split ? cutlass::conv::SplitKMode::kParallel : cutlass::conv::SplitKMode::kSerial);
  return launch<Kernel>(args, pr);
}

// The split-K forward with Tile: its slices' float32 partial outputs into
// pr.workspace, then sum_slices into pr.output.
template <typename Element, typename Tile>
bool fprop_split(const ConvProblem& pr) {
  if (!launch_fprop<typename FpropKernel<Element, Tile, float>::Kernel>(pr)) return false;
  launch_sum_slices<Element>(pr);
  return true;
}

// The tile for the problem: 128 x 64 outputs where there are at most 64
// output channels (a 128-wide tile would be half empty), 128 x 128 otherwise;
// with pr.split_k > 1 (small planes, whose 128 x 128 tiles leave
// multiprocessors idle) the reduction is split into float32 partial sums in
// pr.workspace, then added by sum_slices, with the fused forward's residual
// and activation where given (the single-pass kernels decline those).
template <typename Element>
bool fprop(const ConvProblem& pr) {
  using T = Tiles<Element>;
  if (pr.split_k <= 1 && (pr.residual != nullptr || pr.activation != Activation::kIdentity)) return false;
  if (pr.groups > 1) return launch_fprop<typename GroupFpropKernel<Element>::Kernel>(pr);
  if (pr.k <= 64) return launch_fprop<typename FpropKernel<Element, typename T::Narrow>::Kernel>(pr);
  if (pr.split_k <= 1) return launch_fprop<typename FpropKernel<Element, typename T::Large>::Kernel>(pr);
  return fprop_split<Element, typename T::Large>(pr);
}

template <typename Kernel>
bool launch_dgrad(const ConvProblem& pr) {
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

// 128 x 64 tiles where there are at most 64 input channels, or where 128 x
// 128 tiles would fill at most half the multiprocessors (7x7 planes at N=32:
// 0.043 -> 0.032 ms in float16 on ResNet-50's last 3x3 layer); else 128 x 128.
template <typename Element, cutlass::conv::StrideSupport kStride>
bool dgrad_with(const ConvProblem& pr) {
  using T = Tiles<Element>;
  const int64_t tiles = ((int64_t(pr.n) * pr.h * pr.w + 127) / 128) * ((pr.c + 127) / 128);
  if (pr.c <= 64 || 2 * tiles <= pr.multiprocessors) {
    return launch_dgrad<typename DgradKernel<Element, typename T::Narrow, kStride>::Kernel>(pr);
  }
  return launch_dgrad<typename DgradKernel<Element, typename T::Large, kStride>::Kernel>(pr);
}

template <typename Element>
bool dgrad(const ConvProblem& pr) {
  if (pr.stride_h == 1 && pr.stride_w == 1) {
    return dgrad_with<Element, cutlass::conv::StrideSupport::kUnity>(pr);
  }
  return dgrad_with<Element, cutlass::conv::StrideSupport::kStrided>(pr);
}

template <typename Element, typename Tile>
bool wgrad_with(const ConvProblem& pr) {
  using Kernel = typename WgradKernel<Element, Tile>::Kernel;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout w_layout = Layout::packed({pr.k, pr.r, pr.s, pr.c});
  auto* gw = static_cast<float*>(pr.weight);
  typename Device::Arguments args(
      problem_size(pr, pr.split_k), {as<Element>(pr.output), Layout::packed({pr.n, pr.p, pr.q, pr.k})},
      {as<Element>(pr.input), input_layout(pr)}, {gw, w_layout},
      {gw, w_layout}, {1.0f, 0.0f},
      pr.split_k > 1 ? cutlass::conv::SplitKMode::kParallel : cutlass::conv::SplitKMode::kSerial);
  return launch<Kernel>(args, pr);
}

// The weight gradient with the kernel pr.wgrad_tile names (kSm90 is not
// one of these: wgrad_sm90_*).
template <typename Element>
bool wgrad(const ConvProblem& pr) {
  using T = Tiles<Element>;
  if (pr.wgrad_tile == WgradTile::kSmall) return wgrad_with<Element, typename T::WgradSmall>(pr);
  if constexpr (std::is_same_v<Element, float>) {
    if (pr.wgrad_tile == WgradTile::kWide) return wgrad_with<Element, typename T::WgradWide>(pr);
  } else {
    if (pr.wgrad_tile == WgradTile::kNarrow) return wgrad_with<Element, typename T::WgradNarrow>(pr);
  }
  if (pr.wgrad_tile != WgradTile::kLarge) return false;
  return wgrad_with<Element, typename T::Wgrad>(pr);
}

}  // namespace customconv::implicit_gemm
