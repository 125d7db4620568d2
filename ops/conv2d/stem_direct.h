// conv2d's forward of RGB stems with 3x3 windows on CUDA cores.
//
// The first layer of MobileNet, EfficientNet and RegNet (3 -> 16..64
// channels, 3x3, stride 2, at 224x224) is 27 multiply-adds an output: too
// short a reduction for the tensor cores, which the implicit GEMM feeds 64
// channels a step (packed by space-to-depth it still ran 0.079 ms in float16
// at N=32 on an H100, against cuDNN's 0.032). Here each thread sums the 27
// terms for 8, 16 or 32 output channels of one position in float32 (exact,
// not TF32), the weight and the bias read from shared memory, the input read in place
// through its strides (any layout), the result written in the layout
// F.conv2d gives (conv2d_output_format), with conv2d_fused's activation in
// the same pass.
//
// Takes: CUDA, batched, groups 1, 1 to 4 input channels, 3x3 windows (any
// stride, padding and dilation), output channels a multiple of 8 up to 64,
// float16, bfloat16 or float32, no residual; nullopt otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/activation.h"
#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> stem_direct_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  Activation activation);

}  // namespace customconv
