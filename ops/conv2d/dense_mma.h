// The weight gradient of ungrouped 3x3 layers on tensor cores (mma.sync):
// ResNet-50's 3x3 layers, whose sm80-style implicit GEMM weight gradient
// (implicit_gemm.h) ran at 0.4-0.7x of cuDNN's in 16-bit, and at 0.7x on its
// 56x56 float32 layers.
//
// Takes: CUDA tensors on a device of compute capability 8.0 or newer,
// batched, groups == 1, input and output channels multiples of 64 (up to
// 4096), a 3x3 window with any stride, padding and dilation; float16 or
// bfloat16, or float32 where PyTorch's TF32 policy for convolutions allows
// TF32 and the layer has more than 6272 output positions (a 14x14 plane at
// N=32; smaller ones ran faster on the implicit GEMM). Declines (nullopt)
// everything else.
//
// The (K x 9 C) product is summed over the output positions with float32
// sums (float32 operands rounded to TF32), the positions cut into slices
// whose float32 planes are added in a fixed order and rounded once:
// bitwise reproducible, no atomics. It reads channels_last input and
// grad_output (NCHW ones are copied into it in chunks of images,
// image_chunks.h), every 16-byte vector aligned, and gives the weight in
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
