// The fused forward's CUTLASS kernels (implicit_gemm.h: conv2d_fused), templated
// on the element type; included by one translation unit per element type.
//
//   out = activation(conv(input, weight) + bias + residual)
//
// computed in float32 from the accumulators and rounded once, in the GEMM's
// epilogue. The main loops are the forward's (implicit_gemm_kernels.cuh: rows
// N*P*Q output positions, columns K output channels, the same tiles); only the
// epilogue differs:
//   dense    CUTLASS's fprop with a broadcast epilogue (EpilogueWithBroadcast):
//            the bias is the per-column broadcast vector, the residual the
//            source tensor C (NPQK), read only where there is one;
//   grouped  the single-group kernel with CUTLASS's plain epilogue: its source
//            is the bias read with zero strides (no residual).
// The activation is a runtime parameter of the functor (BiasActivation): one
// kernel per element type and tile serves all of them. The split-K forward
// is not here: the forward's own kernels apply the epilogue in its sum.
#pragma once

#include <cutlass/array.h>
#include <cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h>
#include <cutlass/numeric_conversion.h>

#include "ops/common/activation.h"
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::implicit_gemm {

// The activations that cost more than a compare (silu, hardswish, gelu,
// sigmoid) on a fragment, not inlined in device code: one copy of their code
// per kernel, called once per fragment (the fragment by value, in registers).
// Inlined at every unrolled epilogue step, the 128 x 128 kernel held 464 KB
// of code (43 KB without activations) and its relu case ran 8% slower; called
// per element, silu and gelu ran 1.5-2x slower (the calls serialize the
// elements' exp/erf); per fragment through memory, relu slowed too (a stack
// frame). Measured on an H200: ResNet's 1x1 64->256 layer at 56x56, N=32.
template <Activation kActivation, int N>
CUTLASS_HOST_DEVICE void activate_all(cutlass::Array<float, N>& y) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < N; ++i) y[i] = activate<float>(kActivation, y[i]);
}

template <int N>
#if defined(__CUDA_ARCH__)
__device__ __noinline__
#else
inline
#endif
cutlass::Array<float, N> activate_out_of_line(Activation a, cutlass::Array<float, N> y) {
  switch (a) {
    case Activation::kSilu: activate_all<Activation::kSilu>(y); break;
    case Activation::kHardswish: activate_all<Activation::kHardswish>(y); break;
    case Activation::kGelu: activate_all<Activation::kGelu>(y); break;
    case Activation::kSigmoid: activate_all<Activation::kSigmoid>(y); break;
    default: activate_all<Activation::kIdentity>(y); break;  // (the others are inlined)
  }
  return y;
}

// The fused epilogue's thread-level functor: one call computes kCount_
// consecutive output channels of one output position (one vector of the
// output tile that the epilogue's thread map gives the thread), as
//   out[i] = round(activation(acc[i] + v[i] + c[i]))
// in float32. It meets two CUTLASS concepts:
//   - EpilogueWithBroadcast's output op (single source, Z stored, no T): the
//     5- and 4-argument operator()s, v the bias vector broadcast over rows
//     (zeros where there is none), c the residual where Params::source;
//   - the plain Epilogue's output op: the 1- and 2-argument operator()s,
//     no v, c the source where Params::source (the grouped kernel's bias,
//     read with zero strides).
// The activation is the same for every thread of the grid: a uniform branch
// on it per call, outside the loop over the kCount_ elements
// (activate<float>() with a constant activation there).
template <typename ElementOut_, int kCount_>
class BiasActivation {
 public:
  using ElementOutput = ElementOut_;
  using ElementC = ElementOut_;
  using ElementD = ElementOut_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementZ = ElementOut_;
  using ElementT = ElementOut_;       // (not stored)
  using ElementVector = ElementOut_;  // the bias
  static int const kCount = kCount_;
  static int const kElementsPerAccess = kCount_;
  static bool const kIsSingleSource = true;
  static bool const kStoreZ = true;
  static bool const kStoreT = false;

  using FragmentAccumulator = cutlass::Array<float, kCount>;
  using FragmentCompute = cutlass::Array<float, kCount>;
  using FragmentC = cutlass::Array<ElementOutput, kCount>;
  using FragmentSource = FragmentC;
  using FragmentOutput = FragmentC;
  using FragmentZ = cutlass::Array<ElementZ, kCount>;
  using FragmentT = cutlass::Array<ElementT, kCount>;

  struct Params {
    Activation activation = Activation::kIdentity;
    bool source = false;  // whether the source tensor is read and added
  };

  CUTLASS_HOST_DEVICE
  explicit BiasActivation(const Params& params) : activation_(params.activation), source_(params.source) {}

  CUTLASS_HOST_DEVICE
  bool is_source_needed() const { return source_; }

  // Serial split-K (never launched here: split_k is 1) would need the
  // activation on the last partition only.
  CUTLASS_HOST_DEVICE
  void set_k_partition(int, int) {}

  // EpilogueWithBroadcast, with the source: z = act(acc + v + c).
  CUTLASS_HOST_DEVICE
  void operator()(FragmentZ& frag_z, FragmentT&, const FragmentAccumulator& acc, const FragmentC& frag_c,
                  const FragmentCompute& v) const {
    FragmentCompute y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) y[i] = acc[i] + v[i] + float(frag_c[i]);
    frag_z = finish(y);
  }

  // EpilogueWithBroadcast, without the source: z = act(acc + v).
  CUTLASS_HOST_DEVICE
  void operator()(FragmentZ& frag_z, FragmentT&, const FragmentAccumulator& acc,
                  const FragmentCompute& v) const {
    FragmentCompute y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) y[i] = acc[i] + v[i];
    frag_z = finish(y);
  }

  // The plain Epilogue, with the source: act(acc + c).
  CUTLASS_HOST_DEVICE
  FragmentOutput operator()(const FragmentAccumulator& acc, const FragmentC& frag_c) const {
    FragmentCompute y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < kCount; ++i) y[i] = acc[i] + float(frag_c[i]);
    return finish(y);
  }

  // The plain Epilogue, without the source: act(acc).
  CUTLASS_HOST_DEVICE
  FragmentOutput operator()(const FragmentAccumulator& acc) const {
    FragmentCompute y = acc;
    return finish(y);
  }

 private:
  // The activation, then one rounding to the output type: the compares
  // (relu, relu6) inlined, the others out of line.
  CUTLASS_HOST_DEVICE
  FragmentOutput finish(FragmentCompute& y) const {
    switch (activation_) {
      case Activation::kIdentity: break;
      case Activation::kRelu: activate_all<Activation::kRelu>(y); break;
      case Activation::kRelu6: activate_all<Activation::kRelu6>(y); break;
      default: y = activate_out_of_line(activation_, y); break;
    }
    return cutlass::NumericArrayConverter<ElementOutput, float, kCount>()(y);
  }

  Activation activation_;
  bool source_;
};

template <typename Element>
using FusedOp = BiasActivation<Element, kVector<Element>>;

// The dense fused forward on a forward tile (Tiles<Element>::Narrow or ::Large).
template <typename Element, typename Tile>
struct FusedFpropKernel {
  using Kernel = typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<
      Element, Layout, Element, Layout, Element, Layout, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Tile::kTile, typename Tile::kWarp,
      typename Tiles<Element>::Instruction, FusedOp<Element>,
      cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, Tile::kStages,
      cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized>::Kernel;
};

template <typename Kernel>
bool launch_fused_fprop(const ConvProblem& pr) {
  using Element = typename Kernel::ElementA;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout out_layout = Layout::packed({pr.n, pr.p, pr.q, pr.k});
  auto* y = as<Element>(pr.output);
  auto* r = as<Element>(pr.residual);
  typename FusedOp<Element>::Params op;
  op.activation = pr.activation;
  op.source = r != nullptr;
  const typename Device::Arguments args(
      problem_size(pr), {as<Element>(pr.input), input_layout(pr)},
      {as<Element>(pr.weight), Layout::packed({pr.k, pr.r, pr.s, pr.c})}, {r ? r : y, out_layout},
      {y, out_layout}, op, cutlass::conv::SplitKMode::kSerial, const_cast<void*>(pr.bias));
  return launch<Kernel>(args, pr);
}

// The grouped fused forward: bias (as the source, zero strides) and activation.
template <typename Kernel>
bool launch_fused_group_fprop(const ConvProblem& pr) {
  using Element = typename Kernel::ElementA;
  using Device = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;
  const Layout out_layout = Layout::packed({pr.n, pr.p, pr.q, pr.k});
  const Layout bias_layout{typename Layout::Stride(0)};
  auto* y = as<Element>(pr.output);
  auto* b = as<Element>(pr.bias);
  typename FusedOp<Element>::Params op;
  op.activation = pr.activation;
  op.source = b != nullptr;
  const typename Device::Arguments args(
      problem_size(pr), {as<Element>(pr.input), input_layout(pr)},
      {as<Element>(pr.weight), Layout::packed({pr.k, pr.r, pr.s, pr.c / pr.groups})},
      {b ? b : y, b ? bias_layout : out_layout}, {y, out_layout}, op);
  return launch<Kernel>(args, pr);
}

// The tile as the forward's: 128 x 64 where there are at most 64 output
// channels, else 128 x 128; grouped layers the forward's group tile. Declines
// (false) split-K problems and grouped ones with a residual.
template <typename Element>
bool fprop_fused(const ConvProblem& pr) {
  using T = Tiles<Element>;
  if (pr.split_k > 1) return false;
  if (pr.groups > 1) {
    if (pr.residual != nullptr) return false;
    return launch_fused_group_fprop<typename GroupFpropKernel<Element, FusedOp<Element>>::Kernel>(pr);
  }
  if (pr.k <= 64) return launch_fused_fprop<typename FusedFpropKernel<Element, typename T::Narrow>::Kernel>(pr);
  return launch_fused_fprop<typename FusedFpropKernel<Element, typename T::Large>::Kernel>(pr);
}

}  // namespace customconv::implicit_gemm
