// conv2d as im2col + GEMM, and its three backward pieces, device-generic: the
// device's kernels come in as a Conv2dKernels table.
//
// Images are processed in chunks bounded by workspace_limit_bytes(). Routes:
//   * the device's forward engine where it takes the case (on CUDA: the
//     implicit GEMM of implicit_gemm.h for channels_last 16-bit data; on the
//     CPU: channels_last_gemm.h, GEMMs over the positions of channels_last data);
//   * depthwise (groups == C_in > 1, weight (C*m, 1, kh, kw)): the depthwise kernels;
//   * pointwise (1x1, stride 1, no padding) with planes of at least 128
//     positions: the input is its own column buffer, so forward and grad input
//     are GEMMs straight on the NCHW tensors;
//   * otherwise im2col into a column buffer, then GEMMs. With large output
//     planes the columns are per image, (n, groups, C/groups*kh*kw, L), and one
//     strided-batched GEMM per group writes the NCHW output directly; with small
//     planes they are (groups, C/groups*kh*kw, n*L), so that the chunk is one
//     large GEMM per group, whose result is then copied into place.
// The weight gradient takes the same layout choice. Per image, it computes one
// partial product per image (batched), reading grad_output and, for pointwise
// convolutions, the input in place; otherwise one GEMM per group over the
// chunk, its long reduction split into slices until the GEMMs fill the device.
// Partial products (float32 for float16/bfloat16) are summed in a fixed order.
#pragma once

#include <optional>

#include "ops/columns/column_kernels.h"
#include "ops/common/conv_shapes.h"
#include "ops/conv2d/batched_gemm.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/channels_last_gemm.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {

// A device's forward engine that computes the whole convolution where it takes
// the case (the output), or declines (nullopt) and leaves it to im2col + GEMM.
using Conv2dForwardEngine = std::optional<at::Tensor> (*)(const at::Tensor& input,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s);

struct Conv2dKernels {
  ColumnKernels columns;
  BatchedGemm gemm;
  GemmParallelism gemm_parallelism;
  DepthwiseKernels depthwise;
  Conv2dForwardEngine forward_engine = nullptr;
};

inline Conv2dKernels cpu_conv2d_kernels() {
  return {cpu_column_kernels(), &batched_gemm_cpu, &gemm_parallelism_cpu, cpu_depthwise_kernels(),
          &channels_last_gemm_conv2d};
}
#ifdef CUSTOMCONV_WITH_CUDA
inline Conv2dKernels cuda_conv2d_kernels() {
#ifdef CUSTOMCONV_WITH_CUTLASS
  constexpr Conv2dForwardEngine engine = &implicit_gemm_conv2d;
#else
  constexpr Conv2dForwardEngine engine = nullptr;
#endif
  return {cuda_column_kernels(), &batched_gemm_cuda, &gemm_parallelism_cuda,
          cuda_depthwise_kernels(), engine};
}
#endif

at::Tensor conv2d_impl(const Conv2dKernels& kernels, const at::Tensor& input,
                       const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups);

// d(loss)/d(input): GEMM with the transposed weight, then col2im.
at::Tensor conv2d_grad_input_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input, const at::Tensor& weight,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(weight): im2col, then GEMM with grad_output, accumulated over chunks.
at::Tensor conv2d_grad_weight_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input, const at::Tensor& weight,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups);

// d(loss)/d(bias): grad_output summed over batch and space (float32 accumulation).
at::Tensor conv2d_grad_bias_impl(const at::Tensor& grad_output);

}  // namespace customconv
