#include "ops/depthwise/depthwise.h"

#include <ATen/ATen.h>

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"

namespace customconv {
at::Tensor depthwise_conv2d_impl(const DepthwiseKernels& kernels, const at::Tensor& input,
                                 const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                 c10::IntArrayRef dilation) {
  const auto s = check_depthwise_conv2d<int64_t>("depthwise_conv2d", input, weight, bias, stride,
                                                 padding, dilation);
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options());
  if (out.numel() > 0) {
    const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
    kernels.forward(as_batch(input, s.in.batched), weight.contiguous(), b, out, s.win,
                    s.k / s.in.c);
  }
  return unbatch(out, s.in.batched);
}

at::Tensor depthwise_conv2d_grad_input_impl(const DepthwiseKernels& kernels,
                                            const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_grad_input";
  const auto s = check_depthwise_conv2d_backward<int64_t>(op, grad_output, input, weight, stride,
                                                          padding, dilation);
  at::Tensor gi = at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input.options());
  if (gi.numel() > 0) {
    kernels.grad_input(as_batch(grad_output, s.in.batched), weight.contiguous(), gi, s.win,
                       s.k / s.in.c);
  }
  return unbatch(gi, s.in.batched);
}

at::Tensor depthwise_conv2d_grad_weight_impl(const DepthwiseKernels& kernels,
                                             const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_grad_weight";
  const auto s = check_depthwise_conv2d_backward<int64_t>(op, grad_output, input, weight, stride,
                                                          padding, dilation);
  at::Tensor gw = at::empty(weight.sizes(), weight.options());
  if (s.in.n == 0) return gw.zero_();
  kernels.grad_weight(as_batch(grad_output, s.in.batched), as_batch(input, s.in.batched), gw, s.win,
                      s.k / s.in.c);
  return gw;
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_impl(
    const DepthwiseKernels& kernels, const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_grad_weight_bias";
  const auto s = check_depthwise_conv2d_backward<int64_t>(op, grad_output, input, weight, stride,
                                                          padding, dilation);
  at::Tensor gw = at::empty(weight.sizes(), weight.options());
  at::Tensor gb = at::empty({s.k}, grad_output.options());
  if (s.in.n == 0) return {gw.zero_(), gb.zero_()};
  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor in = as_batch(input, s.in.batched);
  const int64_t mult = s.k / s.in.c;
  if (kernels.grad_weight_bias == nullptr ||
      !kernels.grad_weight_bias(go, in, gw, gb, s.win, mult)) {
    kernels.grad_weight(go, in, gw, s.win, mult);
    at::sum_out(gb, go, {0, 2, 3});
  }
  return {gw, gb};
}

}  // namespace customconv
