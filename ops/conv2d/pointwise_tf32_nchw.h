// The float32 forward of unstrided pointwise layers (1x1 window, stride 1, no
// padding, one group) on NCHW data, in TF32 where PyTorch's policy for
// convolutions allows it: out[n] (K, H*W) = w (K, C) · x[n] (C, H*W) for every
// image n, one launch of a CUTLASS strided-batched GEMM (sm80-style tensor-core
// MMA, TF32 products rounded to nearest, float32 sums) on the tensors in place.
//
// The per-image GEMMs it replaces (pointwise_gemm.h on cuBLAS) are as fast on
// the device, but cuBLAS's TF32 product costs the host more than a whole
// F.conv2d call: on an H200, 512 -> 1024 channels at 14x14, N=32, the
// cuBLAS call alone took 1.0-1.2x F.conv2d's whole call, its plain float32
// product 0.4-0.6x (the product's compute type set to 32F instead of
// 32F_FAST_TF32, all else equal). Summed over a forward's unstrided 1x1
// layers (their 7x7 ones, whose planes are not a multiple of 4, keep cuBLAS),
// the host's time went from 1.20x F.conv2d's to 1.02x in ResNet-50, from
// 1.15x to 0.95x in MobileNetV2 and from 1.26x to 1.13x in EfficientNet-B0.
//
// Takes: CUDA float32, batched, an NCHW-contiguous input and an NCHW result
// (conv2d_output_format), a weight with a unit channel stride, C and H*W
// multiples of 4 and 16-byte aligned data, TF32 allowed for convolutions,
// sizes within int, and output channels K >= C or K of 64 or 128 (the
// reducing layers where cuBLAS ran faster on the device keep it: the rule
// and its measurements are in pointwise_tf32_nchw_cuda.cu); nullopt
// otherwise (the caller's other routes take it). The bias, if any, is added
// in one more pass.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> pointwise_conv2d_nchw_tf32_cuda(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s);

}  // namespace customconv
