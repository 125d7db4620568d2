// conv2d as im2col + GEMM, and its three backward pieces, device-generic: the
// device's column kernels come in as a ColumnKernels pair; GEMMs go through
// ATen (cuBLAS on CUDA, the CPU BLAS on CPU).
//
// Images are processed in chunks bounded by workspace_limit_bytes(); a chunk's
// columns are laid out (groups, C/groups*kh*kw, images*L) so that the chunk is
// one batched GEMM with the weight viewed (groups, K/groups, C/groups*kh*kw).
#pragma once

#include <optional>

#include "ops/columns/column_kernels.h"

namespace customconv {

at::Tensor conv2d_impl(const ColumnKernels& kernels, const at::Tensor& input,
                       const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups);

// d(loss)/d(input): GEMM with the transposed weight, then col2im.
at::Tensor conv2d_grad_input_impl(const ColumnKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input, const at::Tensor& weight,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(weight): im2col, then GEMM with grad_output, accumulated over chunks
// (in float32 for float16/bfloat16).
at::Tensor conv2d_grad_weight_impl(const ColumnKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input, const at::Tensor& weight,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(bias): grad_output summed over batch and space (float32 accumulation).
at::Tensor conv2d_grad_bias_impl(const at::Tensor& grad_output);

}  // namespace customconv
