// Meta kernels: output shapes from the same checks the CPU and CUDA kernels
// run (ops/common), with symbolic sizes. FakeTensor uses these under
// torch.compile, torch.export and AOTInductor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops/common/conv_shapes.h"
#include "ops/common/epilogue.h"
#include "ops/common/filter_shapes.h"
#include "ops/common/trilinear_shapes.h"

namespace customconv {
namespace {

using Sym = c10::SymInt;

std::vector<Sym> image_sizes(bool batched, Sym n, Sym c, Sym h, Sym w) {
  if (batched) return {std::move(n), std::move(c), std::move(h), std::move(w)};
  return {std::move(c), std::move(h), std::move(w)};
}

at::Tensor conv2d_meta(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  const auto s =
      check_conv2d<Sym>("conv2d", input, weight, bias, stride, padding, dilation, groups);
  return at::empty_symint(image_sizes(s.in.batched, s.in.n, s.k, s.oh, s.ow),
                          input.options().memory_format(conv2d_output_format(input, weight)));
}

at::Tensor conv2d_fused_meta(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                             c10::string_view activation,
                             const std::optional<at::Tensor>& residual) {
  const char* op = "conv2d_fused";
  parse_activation(op, activation);
  const auto s = check_conv2d_fused<Sym>(op, input, weight, bias, stride, padding, dilation,
                                         groups, residual);
  return at::empty_symint(image_sizes(s.in.batched, s.in.n, s.k, s.oh, s.ow),
                          input.options().memory_format(conv2d_output_format(input, weight)));
}

at::Tensor conv2d_grad_input_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                  const at::Tensor& weight, c10::IntArrayRef stride,
                                  c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                  int64_t groups) {
  const char* op = "conv2d_grad_input";
  check_conv2d_backward<Sym>(op, grad_output, input, weight, stride, padding, dilation, groups);
  return at::empty_symint(input.sym_sizes(),
                          input.options().memory_format(conv2d_output_format(input, weight)));
}

at::Tensor conv2d_grad_weight_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                   const at::Tensor& weight, c10::IntArrayRef stride,
                                   c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                   int64_t groups) {
  const char* op = "conv2d_grad_weight";
  check_conv2d_backward<Sym>(op, grad_output, input, weight, stride, padding, dilation, groups);
  return at::empty_symint(weight.sym_sizes(),
                          weight.options().memory_format(conv2d_output_format(input, weight)));
}

at::Tensor conv2d_grad_bias_meta(const at::Tensor& grad_output) {
  check_dims("conv2d_grad_bias", "grad_output", grad_output, {3, 4});
  check_floating("conv2d_grad_bias", "grad_output", grad_output);
  return at::empty_symint({grad_output.sym_size(grad_output.dim() - 3)}, grad_output.options());
}

at::Tensor depthwise_conv2d_meta(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const auto s = check_depthwise_conv2d<Sym>("depthwise_conv2d", input, weight, bias, stride,
                                             padding, dilation);
  return at::empty_symint(image_sizes(s.in.batched, s.in.n, s.k, s.oh, s.ow),
                          input.options().memory_format(conv2d_output_format(input, weight)));
}

// The backward ops return a tensor shaped like `like` (the input or the weight).
at::Tensor depthwise_grad_meta(const char* op, const at::Tensor& grad_output,
                               const at::Tensor& input, const at::Tensor& weight,
                               c10::IntArrayRef stride, c10::IntArrayRef padding,
                               c10::IntArrayRef dilation, const at::Tensor& like) {
  check_depthwise_conv2d_backward<Sym>(op, grad_output, input, weight, stride, padding, dilation);
  return at::empty_symint(like.sym_sizes(),
                          like.options().memory_format(conv2d_output_format(input, weight)));
}

at::Tensor depthwise_conv2d_grad_input_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_grad_meta("depthwise_conv2d_grad_input", grad_output, input, weight, stride,
                             padding, dilation, input);
}

at::Tensor depthwise_conv2d_grad_weight_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return depthwise_grad_meta("depthwise_conv2d_grad_weight", grad_output, input, weight, stride,
                             padding, dilation, weight);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_meta(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const auto s = check_depthwise_conv2d_backward<Sym>(
      "depthwise_conv2d_grad_weight_bias", grad_output, input, weight, stride, padding, dilation);
  return {at::empty_symint(weight.sym_sizes(),
                           weight.options().memory_format(conv2d_output_format(input, weight))),
          at::empty_symint({s.k}, grad_output.options())};
}

at::Tensor filter2d_meta(const at::Tensor& input, const at::Tensor& kernel,
                         c10::string_view border) {
  check_filter2d<Sym>("filter2d", input, kernel, border);
  return at::empty_symint(input.sym_sizes(), input.options());
}

at::Tensor filter2d_grad_input_meta(const at::Tensor& grad_output, const at::Tensor& kernel,
                                    c10::string_view border) {
  check_filter2d<Sym>("filter2d_grad_input", grad_output, kernel, border, "grad_output");
  return at::empty_symint(grad_output.sym_sizes(), grad_output.options());
}

at::Tensor filter2d_grad_kernel_meta(const at::Tensor& grad_output, const at::Tensor& input,
                                     const at::Tensor& kernel, c10::string_view border) {
  check_filter2d_grad_kernel<Sym>("filter2d_grad_kernel", grad_output, input, kernel, border);
  return at::empty_symint(kernel.sym_sizes(), kernel.options());
}

at::Tensor trilinear_meta(const at::Tensor& feats, const at::Tensor& points) {
  check_trilinear<Sym>("trilinear_interpolation", feats, points);
  return at::empty_symint({feats.sym_size(0), feats.sym_size(2)}, feats.options());
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_meta(const at::Tensor& grad_output,
                                                           const at::Tensor& feats,
                                                           const at::Tensor& points) {
  const char* op = "trilinear_interpolation_backward";
  check_trilinear_backward<Sym>(op, grad_output, feats, points);
  return {at::empty_symint(feats.sym_sizes(), feats.options()),
          at::empty_symint(points.sym_sizes(), points.options())};
}

at::Tensor trilinear_grad_feats_meta(const at::Tensor& grad_output, const at::Tensor& points) {
  check_trilinear_grad_feats<Sym>("trilinear_interpolation_grad_feats", grad_output, points);
  return at::empty_symint({grad_output.sym_size(0), 8, grad_output.sym_size(1)},
                          grad_output.options());
}

std::tuple<at::Tensor, at::Tensor> trilinear_with_derivatives_meta(const at::Tensor& feats,
                                                                   const at::Tensor& points) {
  check_trilinear<Sym>("trilinear_interpolation_with_derivatives", feats, points);
  const auto dtype = trilinear_derivatives_dtype(feats.scalar_type());
  return {at::empty_symint({feats.sym_size(0), feats.sym_size(2)}, feats.options()),
          at::empty_symint({feats.sym_size(0), 3, feats.sym_size(2)},
                           feats.options().dtype(dtype))};
}

std::tuple<at::Tensor, at::Tensor> trilinear_backward_from_derivatives_meta(
    const at::Tensor& grad_output, const at::Tensor& derivatives, const at::Tensor& points) {
  check_trilinear_backward_from_derivatives<Sym>(
      "trilinear_interpolation_backward_from_derivatives", grad_output, derivatives, points);
  return {at::empty_symint({derivatives.sym_size(0), 8, derivatives.sym_size(2)},
                           grad_output.options()),
          at::empty_symint(points.sym_sizes(), points.options())};
}

at::Tensor im2col_meta(const at::Tensor& input, c10::IntArrayRef kernel_size,
                       c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation) {
  const auto s = check_im2col<Sym>("im2col", input, kernel_size, stride, padding, dilation);
  const Sym rows = s.in.c * (s.win.kh * s.win.kw);
  std::vector<Sym> sizes{rows, s.oh * s.ow};
  if (s.in.batched) sizes.insert(sizes.begin(), s.in.n);
  return at::empty_symint(sizes, input.options());
}

at::Tensor col2im_meta(const at::Tensor& columns, c10::IntArrayRef output_size,
                       c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const auto s =
      check_col2im<Sym>("col2im", columns, output_size, kernel_size, stride, padding, dilation);
  return at::empty_symint(image_sizes(s.in.batched, s.in.n, s.in.c, s.in.h, s.in.w),
                          columns.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(customconv, Meta, m) {
  m.impl("conv2d", &conv2d_meta);
  m.impl("conv2d_fused", &conv2d_fused_meta);
  m.impl("conv2d_grad_input", &conv2d_grad_input_meta);
  m.impl("conv2d_grad_weight", &conv2d_grad_weight_meta);
  m.impl("conv2d_grad_bias", &conv2d_grad_bias_meta);
  m.impl("depthwise_conv2d", &depthwise_conv2d_meta);
  m.impl("depthwise_conv2d_grad_input", &depthwise_conv2d_grad_input_meta);
  m.impl("depthwise_conv2d_grad_weight", &depthwise_conv2d_grad_weight_meta);
  m.impl("depthwise_conv2d_grad_weight_bias", &depthwise_conv2d_grad_weight_bias_meta);
  m.impl("filter2d", &filter2d_meta);
  m.impl("filter2d_grad_input", &filter2d_grad_input_meta);
  m.impl("filter2d_grad_kernel", &filter2d_grad_kernel_meta);
  m.impl("trilinear_interpolation", &trilinear_meta);
  m.impl("trilinear_interpolation_backward", &trilinear_backward_meta);
  m.impl("trilinear_interpolation_with_derivatives", &trilinear_with_derivatives_meta);
  m.impl("trilinear_interpolation_backward_from_derivatives",
         &trilinear_backward_from_derivatives_meta);
  m.impl("trilinear_interpolation_grad_feats", &trilinear_grad_feats_meta);
  m.impl("im2col", &im2col_meta);
  m.impl("col2im", &col2im_meta);
}

}  // namespace customconv
