// Pointwise conv2d (1x1 window, stride 1, no padding, groups 1) on
// channels_last data, every device and floating dtype: a channels_last
// (N, C, H, W) tensor lies in memory as an (N*H*W, C) matrix, so each pass is
// one matrix product read and written in place (conv2d.cpp also gives them
// NCHW layers whose planes are one position, such as squeeze-and-excitation
// layers on pooled data: those tensors are channels_last as well):
//   forward      out (NHW, K)  = x (NHW, C) · w (K, C)^T  (+ bias)
//   grad_input   gx  (NHW, C)  = go (NHW, K) · w (K, C)
//   grad_weight  gw  (K, C)    = go (NHW, K)^T · x (NHW, C)
// The products are the device's conv2d GEMM (batched_gemm.h: float32
// accumulation for 16-bit data, PyTorch's TF32 policy for convolutions); a
// bias is added by at::addmm's epilogue where that follows the same policy
// (16-bit and float64; the CPU), else by one more pass. Results are
// channels_last. Each function declines (nullopt) where the case is not one it
// takes, and conv2d.cpp tries it before the other routes, except that the
// CPU's float32 forward goes to its direct kernel first
// (channels_last_direct_cpu.h, few_channels_direct_cpu.h; measured faster
// than ATen's GEMM on ResNet-50's 1x1 layers).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"
#include "ops/conv2d/batched_gemm.h"

namespace customconv {

std::optional<at::Tensor> pointwise_conv2d(BatchedGemm gemm, const at::Tensor& input,
                                           const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias,
                                           const Conv2dShape<int64_t>& s);
// The forward of an NCHW-contiguous batched input with an NCHW result, one
// group: out[n] (K, H*W) = w (K, C) · x[n] (C, H*W) for every image n, one
// strided-batched GEMM on the tensors in place (then the bias, one pass).
// Declines (nullopt) other cases.
std::optional<at::Tensor> pointwise_conv2d_nchw(BatchedGemm gemm, const at::Tensor& input,
                                                const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> pointwise_conv2d_grad_input(BatchedGemm gemm,
                                                      const at::Tensor& grad_output,
                                                      const at::Tensor& weight,
                                                      const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> pointwise_conv2d_grad_weight(BatchedGemm gemm,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const Conv2dShape<int64_t>& s);

}  // namespace customconv
