// Grouped convolutions with few channels per group (ResNeXt's 3x3 layers: 32
// groups of 4 to 32 channels; RegNet's: groups of 8 to 64) as direct kernels
// on CUDA cores, one launch per pass: the exact route (float32 without TF32,
// float64) and what the implicit GEMMs decline (implicit_gemm.h: they take the
// 16-bit and TF32 forward where groups merge into 32-channel tiles, and the
// gradients of up to 32 groups as dense problems) and the tensor-core kernel
// for groups of 8 channels (grouped_mma.h) declines. A GEMM per group is too small there to
// fill the device or its tensor cores: each group multiplies a
// (K/groups) x (C/groups * kh * kw) matrix, 4 x 36 on ResNeXt's first stage.
//
// Takes: CUDA tensors, batched, 1 < groups < C (groups == C goes to the
// depthwise kernels before this), at most kGroupedMaxChannels input and output
// channels per group, any floating dtype (float32 arithmetic for 16-bit data
// and float32, float64 for float64; no TF32). The kernels read and write
// channels_last: a channels_last input is read in place and gives a
// channels_last result, as F.conv2d does; an NCHW input is changed to
// channels_last for the kernel and its result back to NCHW. The weight is read as (K, kh, kw, C/groups):
// a channels_last weight in place, another copied into that layout (it is
// small). Channels are read in vectors of up to 16 bytes where the per-group
// channel counts and the pointers allow.
//
// Routes, each declining (nullopt) where it does not apply:
//   forward      per thread, a vector of output channels of one group at 4
//                neighbouring output positions; bias added before the store;
//   grad_input   the same mapping over input positions, gathering the taps
//                that reach each position (any stride, padding, dilation);
//   grad_weight  per cell, up to 4 output x 4 input channels of one group at
//                up to 3 neighbouring taps of a window row, summed in
//                registers along output rows (at stride 1 or 2 each position
//                loads only the input columns the previous one did not),
//                the 8 warps of a block on different rows of one slice of
//                the N*P rows, then added in shared memory into the slice's
//                own float32 plane (float64 for float64); the planes are
//                summed in a fixed order and rounded once: bitwise
//                reproducible, no atomics. It goes before the implicit GEMM's
//                dense problem (`groups` times the work) from 8 groups on in
//                float32 and from 32 in 16-bit (engines_cuda.cpp).

#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// The most channels per group (input and output) the direct kernels take;
// wider groups have GEMMs large enough for the other routes.
constexpr int64_t kGroupedMaxChannels = 64;

std::optional<at::Tensor> grouped_direct_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> grouped_direct_conv2d_grad_input(const at::Tensor& grad_output,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const Conv2dShape<int64_t>& s);
// With `unrounded`, the weight gradient is given in float32 (float64 for
// float64), its slices' sum not rounded, in any layout: a chunk of images'
// part of the sum over chunks (image_chunks.h).
std::optional<at::Tensor> grouped_direct_conv2d_grad_weight(const at::Tensor& grad_output,
                                                            const at::Tensor& input,
                                                            const at::Tensor& weight,
                                                            const Conv2dShape<int64_t>& s,
                                                            bool unrounded = false);

}  // namespace customconv
