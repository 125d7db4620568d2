// The geometry of a plane correlation as the blocked kernels
// (blocked_correlation.cuh) and the tensor-core kernel
// (tensor_core_correlation.cuh) take it.
#pragma once

#include <c10/macros/Macros.h>

#include "ops/common/activation.h"

namespace customconv {

// Output plane `plane` (image n = plane / out_channels, channel oc) sums `fan`
// input planes: for j < fan, weight row oc * fan + j applied to input channel
// (oc * fan + j) / div of image n. Forward: fan 1, div m (the multiplier).
// Input gradient: fan m, div 1, flip (taps rotated by 180 degrees).
// Planes of h x w inputs and oh x ow outputs, zero padding ph, pw.
// act: applied to each output's sum plus bias as the kernels store it (the
// forward of a fused depthwise layer); identity (the default, and always for
// gradients and filter2d) skips it with one uniform test per thread.
struct BlockedCorrelation {
  int planes, out_channels, in_channels, fan, div;
  int h, w, oh, ow, ph, pw;
  bool flip;
  Activation act = Activation::kIdentity;
};

// v[i] (or v[i][j]) = activation a of it, in place, for the sums (plus bias)
// a thread is about to store; nothing for identity. `a` is the same for every
// thread of a launch: one uniform test on the identity path, then one switch
// with a run of code per activation (not a switch per element). ReLU and
// ReLU6 are inlined (a min / max each); the others call one out-of-line
// function per element (activate_call), since their exp, erf and IEEE
// divisions (with slow-path calls), inlined and interleaved over a thread's
// many sums, raised the register count or spills of whole kernels, identity
// path included (the large-kernel kernel went from 72-96 to 104-113
// registers), and doubled the code.
#if defined(__CUDACC__)
template <Activation A, typename Acc>
__device__ __noinline__ Acc activate_call(Acc x) {
  return activate<Acc>(A, x);
}
#endif
template <Activation A, typename Acc, int M>
CUSTOMCONV_HOST_DEVICE void activate_each(Acc (&v)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) {
#if defined(__CUDA_ARCH__)
    if constexpr (A == Activation::kRelu || A == Activation::kRelu6) {
      v[i] = activate<Acc>(A, v[i]);
    } else {
      v[i] = activate_call<A>(v[i]);
    }
#else
    v[i] = activate<Acc>(A, v[i]);
#endif
  }
}
template <Activation A, typename Acc, int M, int N>
CUSTOMCONV_HOST_DEVICE void activate_each(Acc (&v)[M][N]) {
#pragma unroll
  for (int i = 0; i < M; ++i) activate_each<A>(v[i]);
}

template <typename Array>
CUSTOMCONV_HOST_DEVICE void activate_sums(Activation a, Array& v) {
  switch (a) {
    case Activation::kIdentity: return;
    case Activation::kRelu: return activate_each<Activation::kRelu>(v);
    case Activation::kRelu6: return activate_each<Activation::kRelu6>(v);
    case Activation::kSilu: return activate_each<Activation::kSilu>(v);
    case Activation::kHardswish: return activate_each<Activation::kHardswish>(v);
    case Activation::kGelu: return activate_each<Activation::kGelu>(v);
    case Activation::kSigmoid: return activate_each<Activation::kSigmoid>(v);
  }
}

// Tap (a, b) of the K x K weight plane at w, rotated by 180 degrees when flip
// (the input gradient's taps).
template <int K, typename T>
C10_HOST_DEVICE inline T square_tap(const T* w, int a, int b, bool flip) {
  return flip ? w[(K - 1 - a) * K + (K - 1 - b)] : w[a * K + b];
}

}  // namespace customconv
