// Grouped convolutions (1 < groups < C) on the CPU, float32, as direct
// kernels on channels_last data for the forward (which the stride-1 input
// gradient runs as), the strided input gradient and the weight gradient: ResNeXt's and RegNet's grouped
// layers, whose GEMMs per group are too small for the CPU's BLAS.
//
// Output channels are taken 8 at a time as one vector (a "lane block"): with
// 8 or more output channels per group (a multiple of 8) the block lies in one
// group and each input value is broadcast to the 8 lanes; with 1, 2 or 4 per
// group the block spans 8, 4 or 2 groups and each lane reads its own group's
// input. In the forward, blocks of 4 output positions share each weight
// vector; rows of output positions (or, for weights over 256 KB, images x
// chunks of lane blocks) are spread over ATen's threads. Groups of 8 input
// channels (and a multiple of 8 output channels) take a forward without
// broadcasts instead: the group's 8 input channels are the lanes, 8 output
// channels' sums are reduced at the end by an in-register transpose. A channels_last
// input is read in place (an NCHW one is changed to channels_last first), the
// result has F.conv2d's memory format; the weight is read as (K/8, kh, kw,
// C/groups, 8), a small copy. On AVX-512 machines, groups of a multiple of 16
// output channels (ResNeXt's 14x14 and 7x7 stages) take 16 output channels of
// a group as one vector instead, in the forward and the weight gradient
// (2-core AVX-512 machine, N=4: 16 a group at 14x14 weight gradient 0.90 ->
// 0.50 ms, 32 a group at 7x7 1.09 -> 0.56 ms and forward 0.71-0.74 -> 0.62
// ms, oneDNN 0.57-0.61 each).
//
// Takes: float32, batched, K a multiple of 8, K/groups 1, 2, 4 or a multiple
// of 8, at most 64 input channels per group; nullopt otherwise (the column
// route takes the call).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> grouped_direct_conv2d_cpu(const at::Tensor& input,
                                                    const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias,
                                                    const Conv2dShape<int64_t>& s);
// The input gradient where the stride-1 route (the forward with the rotated
// weight) does not take it: input channels 8 at a time as the vector, the
// same lane mapping with the roles of input and output channels swapped.
std::optional<at::Tensor> grouped_direct_conv2d_grad_input_cpu(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& weight,
                                                               const Conv2dShape<int64_t>& s);
// The weight gradient: per item (8 output channels, a tap, up to 8 input
// channels of their groups; on AVX-512, 16 or 32 output channels of a group
// with a multiple of 16), a sum over every output position in order, the
// items spread over threads (the same result with any thread count);
// channels_last, or F.conv2d's format.
std::optional<at::Tensor> grouped_direct_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                                const at::Tensor& input,
                                                                const at::Tensor& weight,
                                                                const Conv2dShape<int64_t>& s);

// The weight gradient of small ungrouped layers (at most 2M multiply-adds) of
// 8 output channels over a multiple of 8 input channels (at most 64) and rows
// of 3 taps: the channel-lane items above with one group of all the channels,
// where the column route's im2col and GEMM took it (1x8x8x8 3x3 layer on a
// 2-core machine: NCHW 13.4 -> 6.3 us, channels_last 18-30 -> 5.5; F.conv2d
// 13-15). nullopt elsewhere.
std::optional<at::Tensor> eight_channel_direct_conv2d_grad_weight_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s);

// The weight gradient of tiny pointwise layers (at most 64K multiply-adds),
// float32, NCHW or channels_last: one pass on the calling thread, where the
// GEMM routes' setup and threads cost more than the arithmetic. nullopt
// elsewhere.
bool small_pointwise_grad_weight_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> small_pointwise_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                                 const at::Tensor& input,
                                                                 const at::Tensor& weight,
                                                                 const Conv2dShape<int64_t>& s);

// The weight gradient of ungrouped layers with a multiple of 16 output
// channels, on AVX-512 machines: the 16-lane items above with one group of all
// the channels, over chunks of about 64 KB of grad_output (at least 512
// positions) so that it stays in the core's cache while the items sweep it
// (ResNet-50's 3x3 layers at N=4: 4.1-4.2 ms where the GEMM over gathered
// columns took 5.4-7.2, oneDNN 4.1-4.5). nullopt elsewhere.
bool direct_conv2d_grad_weight_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> direct_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s);

}  // namespace customconv
