// The public C++ functions: typed handles on the dispatcher, so C++ callers go
// through autograd and device dispatch like Python callers do.
#include <ATen/core/dispatch/Dispatcher.h>

#include "customconv/customconv.h"

namespace customconv {
namespace {

template <class Signature>
c10::TypedOperatorHandle<Signature> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

using Conv2dSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                             c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, int64_t);
using Conv2dFusedSig = at::Tensor(const at::Tensor&, const at::Tensor&,
                                  const std::optional<at::Tensor>&, c10::IntArrayRef,
                                  c10::IntArrayRef, c10::IntArrayRef, int64_t, c10::string_view,
                                  const std::optional<at::Tensor>&);
using DepthwiseSig = at::Tensor(const at::Tensor&, const at::Tensor&,
                                const std::optional<at::Tensor>&, c10::IntArrayRef,
                                c10::IntArrayRef, c10::IntArrayRef);
using DepthwiseGradSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef);
using TensorPair = std::tuple<at::Tensor, at::Tensor>;
using DepthwiseGradPairSig = TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef);
using Filter2dSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using Filter2dGradKernelSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         c10::string_view);
using Im2colSig = at::Tensor(const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef,
                             c10::IntArrayRef, c10::IntArrayRef);
using Col2imSig = at::Tensor(const at::Tensor&, c10::IntArrayRef, c10::IntArrayRef,
                             c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef);
using Conv2dGradSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 c10::IntArrayRef, c10::IntArrayRef, c10::IntArrayRef, int64_t);

}  // namespace

std::string version() { return CUSTOMCONV_VERSION; }

at::Tensor conv2d(const at::Tensor& input, const at::Tensor& weight,
                  const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                  c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  static const auto op = handle<Conv2dSig>("customconv::conv2d");
  return op.call(input, weight, bias, stride, padding, dilation, groups);
}

at::Tensor conv2d_fused(const at::Tensor& input, const at::Tensor& weight,
                        const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                        c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups,
                        c10::string_view activation, const std::optional<at::Tensor>& residual) {
  static const auto op = handle<Conv2dFusedSig>("customconv::conv2d_fused");
  return op.call(input, weight, bias, stride, padding, dilation, groups, activation, residual);
}

at::Tensor depthwise_conv2d(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  static const auto op = handle<DepthwiseSig>("customconv::depthwise_conv2d");
  return op.call(input, weight, bias, stride, padding, dilation);
}

at::Tensor filter2d(const at::Tensor& input, const at::Tensor& kernel, c10::string_view border) {
  static const auto op = handle<Filter2dSig>("customconv::filter2d");
  return op.call(input, kernel, border);
}

at::Tensor trilinear_interpolation(const at::Tensor& feats, const at::Tensor& points) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>(
      "customconv::trilinear_interpolation");
  return op.call(feats, points);
}

at::Tensor im2col(const at::Tensor& input, c10::IntArrayRef kernel_size, c10::IntArrayRef stride,
                  c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  static const auto op = handle<Im2colSig>("customconv::im2col");
  return op.call(input, kernel_size, stride, padding, dilation);
}

at::Tensor col2im(const at::Tensor& columns, c10::IntArrayRef output_size,
                  c10::IntArrayRef kernel_size, c10::IntArrayRef stride, c10::IntArrayRef padding,
                  c10::IntArrayRef dilation) {
  static const auto op = handle<Col2imSig>("customconv::col2im");
  return op.call(columns, output_size, kernel_size, stride, padding, dilation);
}

namespace detail {

at::Tensor conv2d_grad_input(const at::Tensor& grad_output, const at::Tensor& input,
                             const at::Tensor& weight, c10::IntArrayRef stride,
                             c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  static const auto op = handle<Conv2dGradSig>("customconv::conv2d_grad_input");
  return op.call(grad_output, input, weight, stride, padding, dilation, groups);
}

at::Tensor conv2d_grad_weight(const at::Tensor& grad_output, const at::Tensor& input,
                              const at::Tensor& weight, c10::IntArrayRef stride,
                              c10::IntArrayRef padding, c10::IntArrayRef dilation, int64_t groups) {
  static const auto op = handle<Conv2dGradSig>("customconv::conv2d_grad_weight");
  return op.call(grad_output, input, weight, stride, padding, dilation, groups);
}

at::Tensor conv2d_grad_bias(const at::Tensor& grad_output) {
  static const auto op = handle<at::Tensor(const at::Tensor&)>("customconv::conv2d_grad_bias");
  return op.call(grad_output);
}

at::Tensor depthwise_conv2d_grad_input(const at::Tensor& grad_output, const at::Tensor& input,
                                       const at::Tensor& weight, c10::IntArrayRef stride,
                                       c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  static const auto op = handle<DepthwiseGradSig>("customconv::depthwise_conv2d_grad_input");
  return op.call(grad_output, input, weight, stride, padding, dilation);
}

at::Tensor depthwise_conv2d_grad_weight(const at::Tensor& grad_output, const at::Tensor& input,
                                        const at::Tensor& weight, c10::IntArrayRef stride,
                                        c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  static const auto op = handle<DepthwiseGradSig>("customconv::depthwise_conv2d_grad_weight");
  return op.call(grad_output, input, weight, stride, padding, dilation);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  static const auto op =
      handle<DepthwiseGradPairSig>("customconv::depthwise_conv2d_grad_weight_bias");
  return op.call(grad_output, input, weight, stride, padding, dilation);
}

at::Tensor filter2d_grad_input(const at::Tensor& grad_output, const at::Tensor& kernel,
                               c10::string_view border) {
  static const auto op = handle<Filter2dSig>("customconv::filter2d_grad_input");
  return op.call(grad_output, kernel, border);
}

at::Tensor filter2d_grad_kernel(const at::Tensor& grad_output, const at::Tensor& input,
                                const at::Tensor& kernel, c10::string_view border) {
  static const auto op = handle<Filter2dGradKernelSig>("customconv::filter2d_grad_kernel");
  return op.call(grad_output, input, kernel, border);
}

std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_backward(const at::Tensor& grad_output,
                                                                    const at::Tensor& feats,
                                                                    const at::Tensor& points) {
  static const auto op =
      handle<TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "customconv::trilinear_interpolation_backward");
  return op.call(grad_output, feats, points);
}

at::Tensor trilinear_interpolation_grad_feats(const at::Tensor& grad_output,
                                              const at::Tensor& points) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>(
      "customconv::trilinear_interpolation_grad_feats");
  return op.call(grad_output, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_with_derivatives(
    const at::Tensor& feats, const at::Tensor& points) {
  static const auto op = handle<TensorPair(const at::Tensor&, const at::Tensor&)>(
      "customconv::trilinear_interpolation_with_derivatives");
  return op.call(feats, points);
}

std::tuple<at::Tensor, at::Tensor> trilinear_interpolation_backward_from_derivatives(
    const at::Tensor& grad_output, const at::Tensor& derivatives, const at::Tensor& points) {
  static const auto op =
      handle<TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "customconv::trilinear_interpolation_backward_from_derivatives");
  return op.call(grad_output, derivatives, points);
}

}  // namespace detail

}  // namespace customconv

extern "C" const char* customconv_version() { return CUSTOMCONV_VERSION; }

extern "C" int customconv_link_anchor() { return 0; }
