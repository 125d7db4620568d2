// CPU kernels of every op.
#include <torch/library.h>

#include "ops/columns/column_ops.h"
#include "ops/conv2d/conv2d.h"
#include "ops/depthwise/depthwise.h"
#include "ops/filter2d/filter2d.h"
#include "ops/trilinear/trilinear.h"

namespace customconv {
namespace {

at::Tensor conv2d_cpu(const at::Tensor& input, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  return conv2d_impl(cpu_conv2d_kernels(), input, weight, bias, stride, padding, dilation, groups);
}

at::Tensor conv2d_fused_cpu(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                            c10::string_view activation, const std::optional<at::Tensor>& residual) {
  return conv2d_fused_impl(cpu_conv2d_kernels(), input, weight, bias, stride, padding, dilation,
                           groups, activation, residual);
}

at::Tensor conv2d_grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                 const at::Tensor& weight, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                 int64_t groups) {
  return conv2d_grad_input_impl(cpu_conv2d_kernels(), grad_output, input, weight, stride, padding,
                                dilation, groups);
}

at::Tensor conv2d_grad_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                  const at::Tensor& weight, c10::IntArrayRef stride,
                                  c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                  int64_t groups) {
  return conv2d_grad_weight_impl(cpu_conv2d_kernels(), grad_output, input, weight, stride, padding,
                                 dilation, groups);
}

at::Tensor im2col_cpu_op(const at::Tensor& input, c10::IntArrayRef kernel_size,
                         c10::IntArrayRef stride, c10::IntArrayRef padding,
                         c10::IntArrayRef dilation) {
  return im2col_impl(cpu_column_kernels(), input, kernel_size, stride, padding, dilation);
}

at::Tensor col2im_cpu_op(const at::Tensor& columns, c10::IntArrayRef output_size,
                         c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                         c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return col2im_impl(cpu_column_kernels(), columns, output_size, kernel_size, stride, padding,
                     dilation);
}

at::Tensor depthwise_conv2d_cpu(const at::Tensor& input, const at::Tensor& weight,
                                const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_conv2d_impl(cpu_depthwise_kernels(), input, weight, bias, stride, padding,
                               dilation);
}

at::Tensor depthwise_conv2d_grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                           const at::Tensor& weight, c10::IntArrayRef stride,
                                           c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_conv2d_grad_input_impl(cpu_depthwise_kernels(), grad_output, input, weight,
                                          stride, padding, dilation);
}

at::Tensor depthwise_conv2d_grad_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_conv2d_grad_weight_impl(cpu_depthwise_kernels(), grad_output, input, weight,
                                           stride, padding, dilation);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_conv2d_grad_weight_bias_impl(cpu_depthwise_kernels(), grad_output, input, weight,
                                                stride, padding, dilation);
}

at::Tensor filter2d_cpu(const at::Tensor& input, const at::Tensor& kernel,
                        c10::string_view border) {
  return filter2d_impl(cpu_filter2d_kernels(), input, kernel, border);
}

at::Tensor filter2d_grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& kernel,
                                   c10::string_view border) {
  return filter2d_grad_input_impl(cpu_filter2d_kernels(), grad_output, kernel, border);
}

at::Tensor filter2d_grad_kernel_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                                    const at::Tensor& kernel, c10::string_view border) {
  return filter2d_grad_kernel_impl(cpu_filter2d_kernels(), grad_output, input, kernel, border);
}

at::Tensor trilinear_cpu(const at::Tensor& feats, const at::Tensor& points) {
  return trilinear_impl(cpu_trilinear_kernels(), feats, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_cpu(const at::Tensor& grad_output,
                                                          const at::Tensor& feats,
                                                          const at::Tensor& points) {
  return trilinear_backward_impl(cpu_trilinear_kernels(), grad_output, feats, points);
}

at::Tensor trilinear_grad_feats_cpu(const at::Tensor& grad_output, const at::Tensor& points) {
  return trilinear_grad_feats_impl(cpu_trilinear_kernels(), grad_output, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_with_derivatives_cpu(const at::Tensor& feats,
                                                                  const at::Tensor& points) {
  return trilinear_with_derivatives_impl(cpu_trilinear_kernels(), feats, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_from_derivatives_cpu(
    const at::Tensor& grad_output, const at::Tensor& derivatives, const at::Tensor& points) {
  return trilinear_backward_from_derivatives_impl(cpu_trilinear_kernels(), grad_output,
                                                  derivatives, points);
}

}  // namespace

TORCH_LIBRARY_IMPL(customconv, CPU, m) {
  m.impl("conv2d", &conv2d_cpu);
  m.impl("conv2d_fused", &conv2d_fused_cpu);
  m.impl("conv2d_grad_input", &conv2d_grad_input_cpu);
  m.impl("conv2d_grad_weight", &conv2d_grad_weight_cpu);
  m.impl("conv2d_grad_bias", &conv2d_grad_bias_impl);
  m.impl("depthwise_conv2d", &depthwise_conv2d_cpu);
  m.impl("depthwise_conv2d_grad_input", &depthwise_conv2d_grad_input_cpu);
  m.impl("depthwise_conv2d_grad_weight", &depthwise_conv2d_grad_weight_cpu);
  m.impl("depthwise_conv2d_grad_weight_bias", &depthwise_conv2d_grad_weight_bias_cpu);
  m.impl("filter2d", &filter2d_cpu);
  m.impl("filter2d_grad_input", &filter2d_grad_input_cpu);
  m.impl("filter2d_grad_kernel", &filter2d_grad_kernel_cpu);
  m.impl("trilinear_interpolation", &trilinear_cpu);
  m.impl("trilinear_interpolation_backward", &trilinear_backward_cpu);
  m.impl("trilinear_interpolation_with_derivatives", &trilinear_with_derivatives_cpu);
  m.impl("trilinear_interpolation_backward_from_derivatives",
         &trilinear_backward_from_derivatives_cpu);
  m.impl("trilinear_interpolation_grad_feats", &trilinear_grad_feats_cpu);
  m.impl("im2col", &im2col_cpu_op);
  m.impl("col2im", &col2im_cpu_op);
}

}  // namespace customconv
