// CUTLASS 3's Hopper implicit-GEMM convolutions behind implicit_gemm.h's
// wgrad_sm90_* and fprop_sm90_f16/bf16: built with the conv and epilogue
// collective builders for sm_90a (TMA loads, warpgroup MMA; a producer warp
// feeds a consumer warpgroup through a shared-memory pipeline). Included by translation units
// compiled for sm_90a only.
//
// The GEMM per pass (CUTLASS's mapping, as in implicit_gemm_kernels.cuh):
//   fprop  rows: output positions (N*P*Q), columns: K, reduction over (r, s, c);
//   wgrad  rows: K, columns: (r, s, c), reduction over N*P*Q.
// A block computes M x N of the result; its reduction steps are K deep.
// Everything accumulates in float32 and is rounded once in the epilogue.
// The kernel's parameters (TMA descriptors, which hold the tensors'
// addresses) are built on every call: measured, they cost no time that the
// kernel does not hide (bench/tune).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cute/tensor.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/conv/dispatch_policy.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <type_traits>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/implicit_gemm.h"

namespace customconv::implicit_gemm {

using ConvOperator = cutlass::conv::Operator;

// Clusters of CM x CN blocks (along M and N) share, by TMA multicast, the
// operand tiles their rows or columns have in common.
template <ConvOperator kOp, typename Element, typename Out, int M, int N, int K, int CM = 1, int CN = 1>
struct Sm90Conv {
  using LayoutAct = cutlass::layout::TensorNHWC;
  // The weight gradient's result is (K, r, s, C), which CUTLASS tags KCSR.
  using LayoutOut = std::conditional_t<kOp == ConvOperator::kWgrad, cutlass::layout::TensorKCSR, LayoutAct>;
  using TileN = std::conditional_t<kOp == ConvOperator::kWgrad, cute::Shape<cute::Int<N>>, cute::Int<N>>;
  using TileShape = cute::Shape<cute::Int<M>, TileN, cute::Shape<cute::Int<K>>>;
  using ClusterShape = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;
  static constexpr int kAlignOut = 128 / cutlass::sizeof_bits<Out>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Out, LayoutOut, kAlignOut, Out, LayoutOut,
      kAlignOut, cutlass::epilogue::collective::EpilogueScheduleAuto>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp, Element, LayoutAct, kAlign, Element, LayoutAct,
      kAlign, float, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<int(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
  using Problem = cutlass::conv::ConvProblemShape<kOp, Mainloop::NumSpatialDimensions>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<Problem, Mainloop, Epilogue>;
  using Device = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

  // One problem over `n` images of pr's geometry: act (n, h, w, c); for fprop
  // `in` is the filter (k, r, s, c) and `out` (n, p, q, k); for wgrad `in` is
  // grad_output (n, p, q, k) and `out` the filter's gradient. False (nothing
  // launched) where CUTLASS refuses the problem or the device cannot run the
  // kernel (sm_90 only).
  static bool run(const ConvProblem& pr, int n, const void* act, const void* in, void* out) {
    static CachedKernelFit fit(reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>),
                               KernelNeeds{90, int(Kernel::MaxThreadsPerBlock), size_t(Kernel::SharedStorageSize)});
    if (!fit.on(pr.device)) return false;
    const Problem problem(cutlass::conv::Mode::kCrossCorrelation, {n, pr.h, pr.w, pr.c}, {pr.k, pr.r, pr.s, pr.c},
                          {pr.pad_h, pr.pad_w}, {pr.pad_h, pr.pad_w}, {pr.stride_h, pr.stride_w},
                          {pr.dilation_h, pr.dilation_w}, 1);
    typename Kernel::StrideC dc{};
    typename Kernel::StrideD dd{};
    if constexpr (kOp == ConvOperator::kWgrad) {
      dc = cutlass::make_cute_packed_stride(dc, problem.shape_C, problem.stride_C, kOp);
      dd = cutlass::make_cute_packed_stride(dd, problem.shape_C, problem.stride_C, kOp);
    } else {  // the output's (q, p, n) strides, innermost first
      cute::for_each(cute::make_seq<cute::rank<0>(decltype(dc){})>{},
                     [&](auto i) { cute::get<0, i>(dc) = problem.stride_C[Problem::RankT - 2 - i]; });
      cute::for_each(cute::make_seq<cute::rank<0>(decltype(dd){})>{},
                     [&](auto i) { cute::get<0, i>(dd) = problem.stride_C[Problem::RankT - 2 - i]; });
    }
    typename Device::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = problem;
    if constexpr (kOp == ConvOperator::kWgrad) {  // A: grad_output, B: the activation
      args.mainloop = {static_cast<const Element*>(in), static_cast<const Element*>(act)};
    } else {
      args.mainloop = {static_cast<const Element*>(act), static_cast<const Element*>(in)};
    }
    args.epilogue = {{1.0f, 0.0f}, static_cast<const Out*>(out), dc, static_cast<Out*>(out), dd};
    if (Device::can_implement(args) != cutlass::Status::kSuccess || Device::get_workspace_size(args) != 0) {
      return false;
    }
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
    const bool launched = Device::run(params, static_cast<cudaStream_t>(pr.stream)) == cutlass::Status::kSuccess;
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return launched;
  }
};

// The weight gradient in one pass, written in the element type: 128 x 64
// blocks of the (K, r*s*C) result, 64-deep reduction steps.
template <typename Element>
bool wgrad_sm90(const ConvProblem& pr) {
  if (pr.split_k != 1) return false;
  return Sm90Conv<ConvOperator::kWgrad, Element, Element, 128, 64, 64>::run(pr, pr.n, pr.input, pr.output,
                                                                             pr.weight);
}

// The 16-bit forward in one pass, written in the element type: 64 x 128
// blocks of the (N*P*Q, K) result, 64-deep reduction steps, in clusters of
// two blocks along K that share their input tile (TMA multicast). On an H100,
// ResNet-50's 512-channel 3x3 layers at N=32, float16, as bench.py times
// them (us): 7x7 plane 24.3 unclustered, 23.1 so, 28.7 in clusters along the
// positions (sharing the weight's tile), 33.6 on 128 x 128 blocks in those;
// 14x14 stride 2 25.1, 22.7, 28.0, 34.5 (cuDNN 20.4-21.0). The epilogue only
// stores: false where the problem has a bias, a residual, an activation,
// groups, a split reduction or an input other than packed NHWC.
template <typename Element>
bool fprop_sm90_16bit(const ConvProblem& pr) {
  if (pr.split_k != 1 || pr.groups != 1 || pr.input_strides[0] != 0 || pr.bias != nullptr ||
      pr.residual != nullptr || pr.activation != Activation::kIdentity) {
    return false;
  }
  return Sm90Conv<ConvOperator::kFprop, Element, Element, 64, 128, 64, 1, 2>::run(pr, pr.n, pr.input,
                                                                                  pr.weight, pr.output);
}

}  // namespace customconv::implicit_gemm
