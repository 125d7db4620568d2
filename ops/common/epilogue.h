// The epilogue of the fused convolution op (conv2d_fused):
//   out = activation(conv(input, weight) + bias + residual),
// the residual (optional) added before the activation, ResNet's order. Here:
// the argument checks (one place for the CPU, CUDA and meta kernels), and the
// epilogue as ATen operations, for routes whose kernels have none of their own
// and for the autograd kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>

#include "ops/common/activation.h"
#include "ops/common/conv_shapes.h"

namespace customconv {

// The epilogue a kernel applies after the convolution and its bias. residual:
// undefined for none, else the output's shape, dtype and device.
struct ConvEpilogue {
  Activation activation = Activation::kIdentity;
  at::Tensor residual;
  bool has_residual() const { return residual.defined(); }
  bool empty() const { return activation == Activation::kIdentity && !has_residual(); }
};

// The activation named `name` (identity, relu, relu6, silu, hardswish, gelu,
// sigmoid); any other name is an error naming the argument and the choices.
Activation parse_activation(const char* op, std::string_view name);
const char* activation_name(Activation a);

// The arguments of conv2d_fused: conv2d's, a known activation name, and a
// residual (optional) of the output's shape, dtype and device. Templated on the
// integer type like check_conv2d (int64_t for the kernels, SymInt for meta).
template <class I>
Conv2dShape<I> check_conv2d_fused(const char* op, const at::Tensor& input,
                                  const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups,
                                  const std::optional<at::Tensor>& residual) {
  auto s = check_conv2d<I>(op, input, weight, bias, stride, padding, dilation, groups);
  if (residual.has_value() && residual->defined()) {
    const at::Tensor& r = *residual;
    check_dims(op, "residual", r, {input.dim()});
    check_same_dtype_device(op, "residual", r, "input", input);
    const int64_t o = s.in.batched ? 1 : 0;
    TORCH_CHECK((!s.in.batched || dim_size<I>(r, 0) == s.in.n) && dim_size<I>(r, o) == s.k &&
                    dim_size<I>(r, o + 1) == s.oh && dim_size<I>(r, o + 2) == s.ow,
                op, ": residual has shape ", r.sym_sizes(), " but the convolution's output is (",
                s.in.n, ", ", s.k, ", ", s.oh, ", ", s.ow, ")");
  }
  return s;
}

// The residual as a ConvEpilogue holds it: undefined for none.
inline at::Tensor residual_or_none(const std::optional<at::Tensor>& residual) {
  return residual.has_value() ? *residual : at::Tensor();
}

// out = activation(out + residual), in place, as ATen operations (one or two
// passes over out).
void apply_epilogue_(at::Tensor& out, const ConvEpilogue& e);

// The activation as ATen operations (a new tensor), and the gradient of the
// activation's input given grad_output, its input `pre` and its output `out`.
at::Tensor activation_forward(const at::Tensor& pre, Activation a);
at::Tensor activation_backward(const at::Tensor& grad_output, const at::Tensor& pre,
                               const at::Tensor& out, Activation a);

}  // namespace customconv
