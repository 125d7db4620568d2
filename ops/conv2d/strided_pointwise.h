// conv2d's strided pointwise layers on CUDA (1x1 window, no padding, stride
// above 1, one group; ResNet's downsampling shortcuts) as the pointwise GEMMs
// of pointwise_gemm.h on the positions the window reads, input[:, :, ::sh, ::sw]:
//   forward      those positions gathered into a channels_last tensor, then
//                pointwise_conv2d on it;
//   grad_input   pointwise_conv2d_grad_input into a dense (N, C, Ho, Wo)
//                gradient, spread over the strided positions of the result
//                with zeros everywhere else, in one pass;
//   grad_weight  pointwise_conv2d_grad_weight with the gathered positions.
// The products are cuBLAS's (batched_gemm.h: float32 accumulation for 16-bit
// data, PyTorch's TF32 policy for convolutions). Results are channels_last,
// the format F.conv2d gives these layers' channels_last data; each function
// declines (nullopt) other layers and layouts (conv2d_output_format not
// channels_last), which keep the implicit GEMM. The forward of NCHW data
// (an NCHW-contiguous input, an NCHW result) has its own function:
//   forward_nchw the positions gathered into an NCHW tensor and the GEMMs of
//                pointwise_conv2d_nchw in place, one per image; or
//                (through_channels_last) gathered channels_last, the
//                channels_last GEMM, and the result changed back to NCHW
//                (relayout_cuda.h).
// and so do the gradients of NCHW data, through channels_last:
//   grad_input_nchw   grad_output changed to channels_last, grad_input as
//                     above, the result changed back to NCHW;
//   grad_weight_nchw  grad_output changed to channels_last, the positions
//                     gathered channels_last, grad_weight as above.
// engines_cuda.cpp says where they go first.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ops/common/conv_shapes.h"

namespace customconv {

std::optional<at::Tensor> strided_pointwise_conv2d_cuda(const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const std::optional<at::Tensor>& bias,
                                                        const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> strided_pointwise_conv2d_nchw_cuda(const at::Tensor& input,
                                                             const at::Tensor& weight,
                                                             const std::optional<at::Tensor>& bias,
                                                             const Conv2dShape<int64_t>& s,
                                                             bool through_channels_last);
std::optional<at::Tensor> strided_pointwise_conv2d_grad_input_cuda(const at::Tensor& grad_output,
                                                                   const at::Tensor& input,
                                                                   const at::Tensor& weight,
                                                                   const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> strided_pointwise_conv2d_grad_input_nchw_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> strided_pointwise_conv2d_grad_weight_nchw_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s);
std::optional<at::Tensor> strided_pointwise_conv2d_grad_weight_cuda(const at::Tensor& grad_output,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& weight,
                                                                    const Conv2dShape<int64_t>& s);

}  // namespace customconv
