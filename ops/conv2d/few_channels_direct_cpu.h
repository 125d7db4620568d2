// conv2d's forward over windows of few input channels (C < 16: ResNet's RGB
// 7x7 stride-2 stem, VGG's 3x3 first layer) on the CPU, float32, as a direct
// kernel. The column routes copy such windows in runs of C floats, too short
// to copy well, and hand the GEMM a reduction of only C*kh*kw values.
//
// Output channels are the vector lanes: a block of up to 4 vectors of 16
// channels (x86-64-v4 build, one vector for at most 16 output channels; 2
// vectors of 8 for AVX2, 1 for the baseline) accumulates at several output
// positions of one row at once, each input value broadcast to the lanes. The
// input is read in place through its strides (NCHW, channels_last or any other
// layout: no copy), the weight as blocks of output channels (a small copy,
// zero-padded to whole blocks), the bias added first. The result has F.conv2d's
// memory format: channels_last is written directly; NCHW is transposed from a
// buffer as each output row is finished. Output rows are spread over ATen's
// threads (small layers run on the calling thread: parallel_cpu.h's
// kInlineWork).
//
// Takes: float32, batched, groups 1, 1 <= C < 16, any window (kernel size,
// stride, padding, dilation); nullopt otherwise (the other routes take it).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> few_channels_direct_conv2d_cpu(const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         const Conv2dShape<int64_t>& s);

// The input gradient of a stride-1 layer of few output channels (K < 16) whose
// rotated padding is not negative (grad_input_as_forward's windows, and 1x1
// ones): the forward convolution of grad_output with the weight rotated by 180
// degrees, its blocks packed straight from the layer's weight (no flipped
// copy, no second op); the result in F.conv2d's format. nullopt where the
// forward route above would not take it.
std::optional<at::Tensor> few_channels_direct_conv2d_grad_input_cpu(const at::Tensor& grad_output,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& weight,
                                                                    const Conv2dShape<int64_t>& s);

}  // namespace customconv
