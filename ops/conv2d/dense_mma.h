// The weight gradient of ungrouped 3x3 layers on tensor cores (mma.sync),
// float16 and bfloat16: ResNet-50's 3x3 layers, whose sm80-style implicit
// GEMM weight gradient (implicit_gemm.h) ran at 0.4-0.7x of cuDNN's.
//
// Takes: CUDA tensors on a device of compute capability 8.0 or newer,
// batched, groups == 1, input and output channels multiples of 64 (up to
// 4096), a 3x3 window with any stride, padding and dilation, float16 or
// bfloat16. Declines (nullopt) everything else.
//
// The (K x 9 C) product is summed over the output positions with float32
// sums, the positions cut into slices whose float32 planes are added in a
// fixed order and rounded once: bitwise reproducible, no atomics. It reads
// channels_last input and grad_output (others are copied into it), every
// vector of 8 channels 16-byte aligned, and gives the weight in
// conv2d_output_format.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> dense_mma_conv2d_grad_weight(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s);

}  // namespace customconv
