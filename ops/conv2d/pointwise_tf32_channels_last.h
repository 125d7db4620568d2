// The float32 forward of unstrided pointwise layers (1x1 window, stride 1, no
// padding, one group) on channels_last data, in TF32 where PyTorch's policy
// for convolutions allows it: the result's (N*H*W, K) rows = the input's
// (N*H*W, C) rows · w (K, C)^T, one launch of a CUTLASS GEMM (sm80-style
// tensor-core MMA, TF32 products rounded to nearest, float32 sums) on the
// tensors in place, the bias added in its epilogue.
//
// The pointwise GEMM route (pointwise_gemm.h) hands such products, above
// 2^26 multiply-adds, to cublasGemmStridedBatchedEx, whose kernel selection
// runs on every call (3-22 us more host time a call than here) and which on
// some of them (64 -> 384 at 14x14, 32 -> 16 at 112x112) clears a workspace
// with a memset first. On layers of at
// most 10240 multiply-adds a position this GEMM is also faster on the device
// (pointwise_tf32_channels_last_cuda.cu); the engines take it for those above
// 2^26 multiply-adds (engines_cuda.cpp), smaller ones keep the engine's
// implicit GEMM.
//
// Takes: CUDA float32, batched, a channels_last-contiguous input and a
// channels_last result (conv2d_output_format), a weight with a unit channel
// stride, C and K multiples of 4 with C * K at most 10240, 16-byte aligned
// data (a bias contiguous), TF32 allowed for convolutions, sizes within int.
// Others: nullopt, nothing launched.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

// Whether the GEMM takes the layer's shape and dtype under the TF32 policy
// (the data's layout and alignment are checked by the call itself).
bool pointwise_tf32_channels_last_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s);

std::optional<at::Tensor> pointwise_conv2d_channels_last_tf32_cuda(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const Conv2dShape<int64_t>& s);

}  // namespace customconv
