// conv2d's forward over 16 or more input channels on the CPU, float32, as a
// direct kernel on channels_last data: ResNet's 3x3 layers (and the stride-1
// input gradients, which run as forward convolutions), without the gathered
// columns or shifted-tap GEMMs of channels_last_gemm.h.
//
// Output channels are the vector lanes: a block of 4 vectors of 16 channels
// (x86-64-v4 build, one vector for at most 16 output channels; 2 vectors of 8
// for AVX2, 1 for the baseline) accumulates at 6 output positions at once, each
// input value broadcast to the lanes. Positions are taken grouped by the input
// edges their windows cross, each group in (n, y, x) order: blocks run across
// rows and images (small planes fill them too) and mostly share the taps that
// fall in the padding, which they skip (another position's tap there reads a
// row of zeros). Work items are (block of output channels, run of positions),
// spread over ATen's threads; where all the weight's blocks fit in a core's
// cache together (up to 512 KiB), an item is a run of positions instead, taken
// 48 positions at a time through every block, so that each output row (and
// residual row) is whole while it is in the cache (a 128 -> 512 1x1 layer at
// 28x28, N=8, with a residual: 6.2-6.4 -> 4.9-5.1 ms). Each output is summed in
// the same order whatever the thread count. The weight is read as blocks of
// output channels (weight_blocks_cpu.h), the bias added first.
//
// The input is read channels_last (an NCHW one is changed first; the result
// has F.conv2d's memory format). Measured against the GEMM routes on ResNet-50's
// layers at N=4 (2-core AVX-512 machine): 3x3 4.0-4.5 ms where they took
// 5.1-6.1 ms; stride-2 1x1 3.9-4.3 ms against 4.2-4.8; pointwise 1x1
// 0.5-4.0 ms against 0.56-4.3 (the CPU tries this route before the
// pointwise GEMM, conv2d.h's Conv2dEngines::forward_before_pointwise).
//
// Takes: float32, batched, groups 1, C >= 16; 1x1 windows only on
// channels_last input (an NCHW one is faster by the column route, which reads
// it in place); nullopt otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"

namespace customconv {

// With `epilogue` (conv2d_fused): its residual added and its activation
// applied as each block is stored; nullopt unless the activation is identity,
// relu, relu6 or hardswish and the residual, if any, is float32 channels_last.
std::optional<at::Tensor> channels_last_direct_conv2d_cpu(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s,
                                                          const ConvEpilogue* epilogue = nullptr);

}  // namespace customconv
