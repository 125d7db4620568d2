// Grouped convolutions on tensor cores (mma.sync):
//   - grouped_mma_conv2d: the forward of groups of 4, 8 or 16 channels,
//     below;
//   - grouped_mma_conv2d_grad_input, grouped_mma_conv2d_grad_weight: 16-bit
//     3x3 layers with 8, 16 or 32 channels a group, declared further down
//     with their conditions.
//
// grouped_mma_conv2d: groups of 8 input and 8 output channels on tensor
// cores: RegNetY-400MF's 3x3 layers (6, 13, 26 and 55 groups of 8), whose
// group counts no merge into 32-channel tiles divides, so that the merged
// route (implicit_gemm.h) declines them and they ran on the CUDA-core kernels
// (grouped_direct.h), exact but 2x slower than cuDNN. One group's 8 output
// channels are exactly the n = 8 of an mma.sync tile: no arithmetic is spent
// on zeros between groups. Groups of 4 channels run two to a tile, with a
// block-diagonal 8 x 8 weight per tap (half the products are zeros). It goes
// first for ResNeXt-50's 32 groups of 4 and of 8 as well, where it measured
// faster than the merged route (engines_cuda.cpp). In 16-bit, groups of 16
// (ResNeXt-50's 512-channel layers) run on a kernel of the same form whose
// warps take 16 channels, two n = 8 tiles sharing the input's fragments, and
// so do groups of 4 and 8 where the channels are a multiple of 64 (ResNeXt's
// 128 and 256; the weight block-diagonal).
// The stride-1 input gradient runs through it as the forward of grad_output
// with the rotated weight.
//
// Takes: CUDA tensors on a device of compute capability 8.0 or newer,
// batched, 1 < groups < C, C / groups == K / groups == 8, or 4 with an even
// number of groups, or 16 in 16-bit, windows of at most kGroupedMmaMaxTaps
// taps, 8-byte aligned data (4-byte aligned weights), float16 or
// bfloat16 (float32 accumulation), or float32 where PyTorch's TF32 policy for
// convolutions allows TF32 (the products in TF32, rounded to nearest), every
// tensor under 2^31 elements.
// It reads and writes channels_last: a channels_last input in place, an
// NCHW one changed to channels_last and its result back, as the direct
// kernels do; the weight is read as (K, kh, kw, C / groups). Bias, and
// conv2d_fused's residual and activation, in the kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"

namespace customconv {

constexpr int64_t kGroupedMmaMaxTaps = 10;

// With `epilogue` (conv2d_fused), its residual added and its activation
// applied as the results are stored; it declines a residual that is not
// channels_last. The result is in conv2d_output_format, or with
// `channels_last_result` channels_last (for a caller that changes it itself).
std::optional<at::Tensor> grouped_mma_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s,
                                             const ConvEpilogue* epilogue = nullptr,
                                             bool channels_last_result = false);

// The weight gradient of grouped 3x3 layers with 8, 16 or 32 input and
// output channels a group (ResNeXt's 32 groups of 8 to 32, RegNet's groups of
// 8), float16 or bfloat16, on tensor cores: each group's (K/g) x (9 C/g)
// product summed over the output positions with float32 sums, the positions
// cut into slices whose float32 planes are added in a fixed order and
// rounded once (bitwise reproducible, no atomics). Any stride, padding and
// dilation. It reads channels_last input and grad_output (others are copied
// into it), every vector of 8 channels 16-byte aligned, and gives the weight
// in conv2d_output_format. Declines (nullopt) everything else, and devices
// older than compute capability 8.0.
// The input gradient of the same layers (same conditions), on tensor cores:
// the input positions a stride phase at a time, so that each is reached
// only through the taps that reach an output position from it. Reads
// grad_output and the weight channels_last, and gives the input's gradient
// in conv2d_output_format (channels_last with channels_last_result: a
// chunk of images' part, image_chunks.h).
// With `unrounded`, the weight gradient is given in float32, its slices'
// sum not rounded, in any layout: a chunk of images' part of the sum over
// chunks (image_chunks.h).
std::optional<at::Tensor> grouped_mma_conv2d_grad_input(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s,
                                                        bool channels_last_result = false);

std::optional<at::Tensor> grouped_mma_conv2d_grad_weight(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s,
                                                         bool unrounded = false);

}  // namespace customconv
