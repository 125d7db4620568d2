// conv2d's forward of tiny NCHW problems on CUDA in one launch.
//
// On a tiny layer the device work is a few microseconds and the host's cost
// per call is what a caller waits for. The implicit GEMM reads channels_last,
// so an NCHW forward there is three launches (the input's layout change, the
// kernel, the result's change back) and three allocations; a 1x1 one goes to
// a cuBLAS GEMM (split-K: two kernels) and a bias pass. This route reads
// NCHW in place and writes the NCHW result directly: one allocation, one
// launch.
//
// Takes: CUDA, batched, NCHW-contiguous input whose result F.conv2d would
// give in NCHW (conv2d_output_format), any groups, floating dtypes, where
// outputs x reduction length <= kTinyDirectMacs and the reduction
// (C/groups * kh * kw) <= kTinyDirectReduction; nullopt otherwise.
// Arithmetic: float32 for 16-bit and float32 data (exact float32, not TF32),
// float64 for float64; each output summed in a fixed order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// 2^20 multiply-adds: a few microseconds on CUDA cores, where the routes
// above cost 30-70 us of host time (H100, 8 -> 8 channels at 8x8).
constexpr int64_t kTinyDirectMacs = int64_t(1) << 20;
// The longest reduction one thread sums.
constexpr int64_t kTinyDirectReduction = 2048;

std::optional<at::Tensor> tiny_direct_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s);

}  // namespace customconv
