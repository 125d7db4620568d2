// conv2d's weight for the CPU's direct kernels (few_channels_direct_cpu.h,
// channels_last_direct_cpu.h), whose vector lanes are output channels.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace customconv {

// The weight (K, C, kh, kw), float32, in any layout, as (ceil(K / B), kh, kw,
// C, B): blocks of B output channels (a multiple of 8), contiguous per tap and
// input channel, the channels past K zero. A transpose of the weight's (K,
// C*kh*kw) matrix in 8 x 8 register tiles, spread over ATen's threads (a
// transposed view of a 1x1 weight, as a pointwise input gradient reads it,
// is copied in runs instead).
at::Tensor weight_blocks_cpu(const at::Tensor& weight, int64_t block);

// The same blocks for the weight of a stride-1 input gradient run as a
// forward convolution: (K, C, kh, kw) read as the (C, K, kh, kw) weight
// rotated by 180 degrees, rotated[c, k, i, j] = weight[k, c, kh-1-i, kw-1-j],
// without materializing it (the flipped copy and the transpose cost tiny
// layers more than the packing). One pass on the calling thread: meant for
// the few-channel kernel's small weights.
at::Tensor rotated_weight_blocks_cpu(const at::Tensor& weight, int64_t block);

}  // namespace customconv
