// CUDA kernels of every op. Each entry point pins the input's device; the
// kernels launch on the current stream.
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/columns/column_ops.h"
#include "ops/conv2d/conv2d.h"
#include "ops/depthwise/depthwise.h"
#include "ops/filter2d/filter2d.h"
#include "ops/trilinear/trilinear.h"

namespace customconv {
namespace {

// The device to pin; none for a CPU tensor, which the op's checks then refuse
// with a clear mixed-device error.
std::optional<c10::Device> cuda_device_of(const at::Tensor& t) {
  return t.is_cuda() ? std::optional<c10::Device>(t.device()) : std::nullopt;
}

at::Tensor conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(input));
  return conv2d_impl(cuda_conv2d_kernels(), input, weight, bias, stride, padding, dilation, groups);
}

at::Tensor conv2d_fused_cuda(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                             c10::string_view activation,
                             const std::optional<at::Tensor>& residual) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(input));
  return conv2d_fused_impl(cuda_conv2d_kernels(), input, weight, bias, stride, padding, dilation,
                           groups, activation, residual);
}

at::Tensor conv2d_grad_input_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                  const at::Tensor& weight, c10::IntArrayRef stride,
                                  c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                  int64_t groups) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return conv2d_grad_input_impl(cuda_conv2d_kernels(), grad_output, input, weight, stride, padding,
                                dilation, groups);
}

at::Tensor conv2d_grad_weight_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                   const at::Tensor& weight, c10::IntArrayRef stride,
                                   c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                   int64_t groups) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return conv2d_grad_weight_impl(cuda_conv2d_kernels(), grad_output, input, weight, stride, padding,
                                 dilation, groups);
}

at::Tensor im2col_cuda_op(const at::Tensor& input, c10::IntArrayRef kernel_size,
                          c10::IntArrayRef stride, c10::IntArrayRef padding,
                          c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(input));
  return im2col_impl(cuda_column_kernels(), input, kernel_size, stride, padding, dilation);
}

at::Tensor col2im_cuda_op(const at::Tensor& columns, c10::IntArrayRef output_size,
                          c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                          c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(columns));
  return col2im_impl(cuda_column_kernels(), columns, output_size, kernel_size, stride, padding,
                     dilation);
}

at::Tensor conv2d_grad_bias_cuda(const at::Tensor& grad_output) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return conv2d_grad_bias_impl(grad_output);
}

at::Tensor depthwise_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(input));
  return depthwise_conv2d_impl(cuda_depthwise_kernels(), input, weight, bias, stride, padding,
                               dilation);
}

at::Tensor depthwise_conv2d_grad_input_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return depthwise_conv2d_grad_input_impl(cuda_depthwise_kernels(), grad_output, input, weight,
                                          stride, padding, dilation);
}

at::Tensor depthwise_conv2d_grad_weight_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return depthwise_conv2d_grad_weight_impl(cuda_depthwise_kernels(), grad_output, input, weight,
                                           stride, padding, dilation);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_cuda(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return depthwise_conv2d_grad_weight_bias_impl(cuda_depthwise_kernels(), grad_output, input,
                                                weight, stride, padding, dilation);
}

at::Tensor filter2d_cuda(const at::Tensor& input, const at::Tensor& kernel,
                         c10::string_view border) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(input));
  return filter2d_impl(cuda_filter2d_kernels(), input, kernel, border);
}

at::Tensor filter2d_grad_input_cuda(const at::Tensor& grad_output, const at::Tensor& kernel,
                                    c10::string_view border) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return filter2d_grad_input_impl(cuda_filter2d_kernels(), grad_output, kernel, border);
}

at::Tensor filter2d_grad_kernel_cuda(const at::Tensor& grad_output, const at::Tensor& input,
                                     const at::Tensor& kernel, c10::string_view border) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return filter2d_grad_kernel_impl(cuda_filter2d_kernels(), grad_output, input, kernel, border);
}

at::Tensor trilinear_cuda(const at::Tensor& feats, const at::Tensor& points) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(feats));
  return trilinear_impl(cuda_trilinear_kernels(), feats, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_cuda(const at::Tensor& grad_output,
                                                           const at::Tensor& feats,
                                                           const at::Tensor& points) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(feats));
  return trilinear_backward_impl(cuda_trilinear_kernels(), grad_output, feats, points);
}

at::Tensor trilinear_grad_feats_cuda(const at::Tensor& grad_output, const at::Tensor& points) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return trilinear_grad_feats_impl(cuda_trilinear_kernels(), grad_output, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_with_derivatives_cuda(const at::Tensor& feats,
                                                                   const at::Tensor& points) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(feats));
  return trilinear_with_derivatives_impl(cuda_trilinear_kernels(), feats, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_from_derivatives_cuda(
    const at::Tensor& grad_output, const at::Tensor& derivatives, const at::Tensor& points) {
  const c10::cuda::OptionalCUDAGuard guard(cuda_device_of(grad_output));
  return trilinear_backward_from_derivatives_impl(cuda_trilinear_kernels(), grad_output,
                                                  derivatives, points);
}

}  // namespace

TORCH_LIBRARY_IMPL(customconv, CUDA, m) {
  m.impl("conv2d", &conv2d_cuda);
  m.impl("conv2d_fused", &conv2d_fused_cuda);
  m.impl("conv2d_grad_input", &conv2d_grad_input_cuda);
  m.impl("conv2d_grad_weight", &conv2d_grad_weight_cuda);
  m.impl("conv2d_grad_bias", &conv2d_grad_bias_cuda);
  m.impl("depthwise_conv2d", &depthwise_conv2d_cuda);
  m.impl("depthwise_conv2d_grad_input", &depthwise_conv2d_grad_input_cuda);
  m.impl("depthwise_conv2d_grad_weight", &depthwise_conv2d_grad_weight_cuda);
  m.impl("depthwise_conv2d_grad_weight_bias", &depthwise_conv2d_grad_weight_bias_cuda);
  m.impl("filter2d", &filter2d_cuda);
  m.impl("filter2d_grad_input", &filter2d_grad_input_cuda);
  m.impl("filter2d_grad_kernel", &filter2d_grad_kernel_cuda);
  m.impl("trilinear_interpolation", &trilinear_cuda);
  m.impl("trilinear_interpolation_backward", &trilinear_backward_cuda);
  m.impl("trilinear_interpolation_with_derivatives", &trilinear_with_derivatives_cuda);
  m.impl("trilinear_interpolation_backward_from_derivatives",
         &trilinear_backward_from_derivatives_cuda);
  m.impl("trilinear_interpolation_grad_feats", &trilinear_grad_feats_cuda);
  m.impl("im2col", &im2col_cuda_op);
  m.impl("col2im", &col2im_cuda_op);
}

}  // namespace customconv
