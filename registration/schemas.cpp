// The one table of the API: every op's schema. Kernels for each dispatch key
// are registered in the files beside this one (cpu.cpp, cuda.cpp, meta.cpp,
// autograd.cpp).
#include <torch/library.h>

TORCH_LIBRARY(customconv, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def(
      "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor",
      tags);
  m.def(
      "depthwise_conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1) -> Tensor",
      tags);
  // conv2d, then out = activation(out + residual): the bias, the residual
  // (optional, the output's shape) and the activation (identity, relu, relu6,
  // silu, hardswish, gelu, sigmoid) applied in the convolution's epilogue.
  m.def(
      "conv2d_fused(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1, int groups=1, str activation=\"identity\", "
      "Tensor? residual=None) -> Tensor",
      tags);
  m.def("filter2d(Tensor input, Tensor kernel, str border=\"zeros\") -> Tensor", tags);
  m.def("trilinear_interpolation(Tensor feats, Tensor points) -> Tensor", tags);
  m.def(
      "im2col(Tensor input, int[2] kernel_size, int[2] stride=1, int[2] padding=0, "
      "int[2] dilation=1) -> Tensor",
      tags);
  m.def(
      "col2im(Tensor columns, int[2] output_size, int[2] kernel_size, int[2] stride=1, "
      "int[2] padding=0, int[2] dilation=1) -> Tensor",
      tags);

  // Backward ops (im2col and col2im are each other's backward).
  m.def(
      "conv2d_grad_input(Tensor grad_output, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> Tensor",
      tags);
  m.def(
      "conv2d_grad_weight(Tensor grad_output, Tensor input, Tensor weight, int[2] stride, "
      "int[2] padding, int[2] dilation, int groups) -> Tensor",
      tags);
  // Also the bias gradient of depthwise_conv2d.
  m.def("conv2d_grad_bias(Tensor grad_output) -> Tensor", tags);
  m.def(
      "depthwise_conv2d_grad_input(Tensor grad_output, Tensor input, Tensor weight, "
      "int[2] stride, int[2] padding, int[2] dilation) -> Tensor",
      tags);
  m.def(
      "depthwise_conv2d_grad_weight(Tensor grad_output, Tensor input, Tensor weight, "
      "int[2] stride, int[2] padding, int[2] dilation) -> Tensor",
      tags);
  // depthwise_conv2d's weight and bias gradients in one pass over grad_output.
  m.def(
      "depthwise_conv2d_grad_weight_bias(Tensor grad_output, Tensor input, Tensor weight, "
      "int[2] stride, int[2] padding, int[2] dilation) -> (Tensor, Tensor)",
      tags);
  m.def(
      "trilinear_interpolation_backward(Tensor grad_output, Tensor feats, Tensor points) "
      "-> (Tensor, Tensor)",
      tags);
  // trilinear_interpolation's training pair: the forward also returns the
  // output's derivatives by the points (N, 3, F), and the backward reads them
  // instead of feats (the autograd kernel uses these in float32 and float64,
  // where they move fewer bytes than reading feats twice).
  m.def(
      "trilinear_interpolation_with_derivatives(Tensor feats, Tensor points) -> (Tensor, Tensor)",
      tags);
  m.def(
      "trilinear_interpolation_backward_from_derivatives(Tensor grad_output, Tensor derivatives, "
      "Tensor points) -> (Tensor, Tensor)",
      tags);
  // The feats gradient alone, for points that need no gradient (feats is not
  // needed for it).
  m.def("trilinear_interpolation_grad_feats(Tensor grad_output, Tensor points) -> Tensor", tags);
  m.def("filter2d_grad_input(Tensor grad_output, Tensor kernel, str border) -> Tensor", tags);
  m.def(
      "filter2d_grad_kernel(Tensor grad_output, Tensor input, Tensor kernel, str border) -> Tensor",
      tags);
}
