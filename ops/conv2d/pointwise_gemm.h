// conv2d's forward for 1x1, stride-1, unpadded layers with groups 1 on a
// channels_last input: the input is an (N*H*W, C) matrix as it lies in memory,
// and the output one GEMM with the weight's (K, C) rows, written straight into
// a channels_last output (N*H*W, K) with the bias added by the GEMM. No copy of
// the input, one GEMM for every image. The CPU's forward engine (float32,
// float64; bfloat16 keeps the column route, which accumulates in float32).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// The output, or nullopt when the case is not one this route takes.
std::optional<at::Tensor> pointwise_channels_last_conv2d(const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         const Conv2dShape<int64_t>& s);

}  // namespace customconv
