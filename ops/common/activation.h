// The activations of the fused convolution (conv2d_fused), as one enum and one
// device-callable function, so that every kernel epilogue (CUTLASS, depthwise,
// the CPU loops) computes exactly the same thing. No ATen here: CUDA device
// code includes this header.
//
// Each matches its PyTorch module on float inputs, NaN propagating:
//   identity   x
//   relu       max(x, 0)                       torch.nn.ReLU
//   relu6      min(max(x, 0), 6)               torch.nn.ReLU6
//   silu       x * sigmoid(x)                  torch.nn.SiLU
//   hardswish  x * min(max(x + 3, 0), 6) / 6   torch.nn.Hardswish
//   gelu       x * (1 + erf(x / sqrt(2))) / 2  torch.nn.GELU (approximate="none")
//   sigmoid    1 / (1 + exp(-x))               torch.nn.Sigmoid
#pragma once

#include <cmath>

#include "ops/common/host_device.h"

namespace customconv {

enum class Activation : int { kIdentity = 0, kRelu, kRelu6, kSilu, kHardswish, kGelu, kSigmoid };

// The activation of x, in the precision of T (float for 16-bit data, whose
// epilogues compute in float32; double for float64).
template <typename T>
CUSTOMCONV_HOST_DEVICE T activate(Activation a, T x) {
  const T zero(0), six(6);
  switch (a) {
    case Activation::kIdentity:
      return x;
    case Activation::kRelu:
      return x < zero ? zero : x;
    case Activation::kRelu6:
      return x < zero ? zero : (x > six ? six : x);
    case Activation::kSilu:
      return x / (T(1) + std::exp(-x));
    case Activation::kHardswish: {
      const T t = x + T(3);
      return x * (t < zero ? zero : (t > six ? six : t)) / six;
    }
    case Activation::kGelu:
      return T(0.5) * x * (T(1) + std::erf(x * T(0.70710678118654752440)));
    case Activation::kSigmoid:
      return T(1) / (T(1) + std::exp(-x));
  }
  return x;
}

}  // namespace customconv
