// depthwise_conv2d's CUDA kernels on channels_last tensors (the table's
// entries: cuda_depthwise_channels_last_kernels, depthwise.h).
//
// They take square windows of 3, 5 or 7 taps, stride 1 or 2, no dilation,
// padding under the window, channel multiplier 1, channels a whole number of
// 16-byte vectors (8 in 16-bit, 4 in float32), 16-byte aligned data;
// float16, bfloat16 and float32. Other calls return false, writing nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include "ops/common/activation.h"
#include "ops/common/window.h"

namespace customconv {

// Whether the kernels take `t` (the input, or grad_output: dtype, channels,
// alignment, sizes) with window `win`.
bool channels_last_cuda_takes(const at::Tensor& t, const Window2d& win);

// The float32 3x3 stride-2 forward by output rows a thread
// (depthwise_channels_last_rows_cuda.cu), on a call the tiled kernel takes:
// `image` (N, C, H, W) channels_last, `weight` contiguous, `result` (N, C,
// OH, OW) channels_last, padding pad_h and pad_w. False, launching nothing,
// for other dtypes, a weight or bias not 16-byte aligned, or a grid too large.
bool depthwise_rows_channels_last_cuda(const at::Tensor& image, const at::Tensor& weight,
                                       const at::Tensor& bias, const at::Tensor& result,
                                       int pad_h, int pad_w, Activation act);

// The input gradient at stride 2 (depthwise_channels_last_grad_cuda.cu).
bool depthwise_grad_input_stride2_channels_last_cuda(const at::Tensor& grad_output,
                                                     const at::Tensor& weight,
                                                     const at::Tensor& grad_input,
                                                     const Window2d& win);

// The weight gradient and, with grad_bias defined, the bias gradient, in a
// fixed order (bitwise reproducible).
bool depthwise_grad_weight_channels_last_cuda(const at::Tensor& grad_output,
                                              const at::Tensor& input,
                                              const at::Tensor& grad_weight,
                                              const at::Tensor& grad_bias, const Window2d& win);

}  // namespace customconv
