#include "ops/depthwise/depthwise.h"

#include <ATen/ATen.h>

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"

namespace customconv {
namespace {

// Whether a pass goes to the device's channels_last kernel `kernel` (if it has
// one): a batched channels_last input, channel multiplier 1, a channels_last
// result (F.conv2d's rule), nothing empty.
template <class Kernel>
bool channels_last_route(Kernel kernel, const at::Tensor& input, const Conv2dShape<int64_t>& s,
                         at::MemoryFormat format) {
  return kernel != nullptr && format == at::MemoryFormat::ChannelsLast && s.in.batched &&
         s.k == s.in.c && input.is_contiguous(at::MemoryFormat::ChannelsLast) &&
         s.in.n * s.in.c * s.in.h * s.in.w > 0 && s.oh * s.ow > 0;
}

}  // namespace

at::Tensor depthwise_conv2d_impl(const DepthwiseKernels& kernels, const at::Tensor& input,
                                 const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                 c10::IntArrayRef dilation, Activation activation) {
  const auto s = check_depthwise_conv2d<int64_t>("depthwise_conv2d", input, weight, bias, stride,
                                                 padding, dilation);
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  if (channels_last_route(kernels.channels_last.forward, input, s, format)) {
    at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
    const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
    if (kernels.channels_last.forward(input, weight, b, out, s.win, activation)) return out;
  }
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options());
  if (out.numel() > 0) {
    const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
    kernels.forward(as_batch(input, s.in.batched), weight.contiguous(), b, out, s.win,
                    s.k / s.in.c, activation);
  }
  // F.conv2d's memory format (conv2d_output_format): the kernels write NCHW.
  return unbatch(out, s.in.batched).contiguous(format);
}

at::Tensor depthwise_conv2d_grad_input_impl(const DepthwiseKernels& kernels,
                                            const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_grad_input";
  const auto s = check_depthwise_conv2d_backward<int64_t>(op, grad_output, input, weight, stride,
                                                          padding, dilation);
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  if (channels_last_route(kernels.channels_last.grad_input, input, s, format) &&
      grad_output.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
    if (kernels.channels_last.grad_input(grad_output, weight, gi, s.win)) return gi;
  }
  at::Tensor gi = at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input.options());
  if (gi.numel() > 0) {
    kernels.grad_input(as_batch(grad_output, s.in.batched), weight.contiguous(), gi, s.win,
                       s.k / s.in.c);
  }
  return unbatch(gi, s.in.batched).contiguous(format);
}

namespace {

// The weight gradient and, when with_bias, the bias gradient (else undefined).
std::tuple<at::Tensor, at::Tensor> grad_params(const char* op, const DepthwiseKernels& kernels,
                                               const at::Tensor& grad_output,
                                               const at::Tensor& input, const at::Tensor& weight,
                                               c10::IntArrayRef stride, c10::IntArrayRef padding,
                                               c10::IntArrayRef dilation, bool with_bias) {
  const auto s = check_depthwise_conv2d_backward<int64_t>(op, grad_output, input, weight, stride,
                                                          padding, dilation);
  at::Tensor gw = at::empty(weight.sizes(), weight.options());
  at::Tensor gb = with_bias ? at::empty({s.k}, grad_output.options()) : at::Tensor();
  if (s.in.n == 0) {
    gw.zero_();
    if (with_bias) gb.zero_();
    return {gw.contiguous(conv2d_output_format(input, weight)), gb};
  }
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  if (channels_last_route(kernels.channels_last.grad_weight, input, s, format) &&
      grad_output.is_contiguous(at::MemoryFormat::ChannelsLast) &&
      kernels.channels_last.grad_weight(grad_output, input, gw, gb, s.win)) {
    return {gw.contiguous(format), gb};
  }
  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor in = as_batch(input, s.in.batched);
  const int64_t mult = s.k / s.in.c;
  if (!with_bias) {
    kernels.grad_weight(go, in, gw, s.win, mult);
  } else if (kernels.grad_weight_bias == nullptr ||
             !kernels.grad_weight_bias(go, in, gw, gb, s.win, mult)) {
    kernels.grad_weight(go, in, gw, s.win, mult);
    at::sum_out(gb, go, {0, 2, 3});
  }
  return {gw.contiguous(conv2d_output_format(input, weight)), gb};
}

}  // namespace

at::Tensor depthwise_conv2d_grad_weight_impl(const DepthwiseKernels& kernels,
                                             const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  return std::get<0>(grad_params("depthwise_conv2d_grad_weight", kernels, grad_output, input,
                                 weight, stride, padding, dilation, false));
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_impl(
    const DepthwiseKernels& kernels, const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation) {
  return grad_params("depthwise_conv2d_grad_weight_bias", kernels, grad_output, input, weight,
                     stride, padding, dilation, true);
}

}  // namespace customconv
