#include "ops/common/epilogue.h"

#include <ATen/ATen.h>

namespace customconv {
namespace {

struct Named {
  const char* name;
  Activation activation;
};
constexpr Named kActivations[] = {
    {"identity", Activation::kIdentity}, {"relu", Activation::kRelu},
    {"relu6", Activation::kRelu6},       {"silu", Activation::kSilu},
    {"hardswish", Activation::kHardswish}, {"gelu", Activation::kGelu},
    {"sigmoid", Activation::kSigmoid},
};

}  // namespace

Activation parse_activation(const char* op, std::string_view name) {
  for (const Named& a : kActivations) {
    if (name == a.name) return a.activation;
  }
  TORCH_CHECK(false, op, ": activation must be one of identity, relu, relu6, silu, hardswish, ",
              "gelu, sigmoid; got \"", std::string(name), "\"");
}

const char* activation_name(Activation a) {
  for (const Named& n : kActivations) {
    if (n.activation == a) return n.name;
  }
  return "identity";
}

namespace {

// x * clamp(x + 3, 0, 6) / 6, in the tensor's dtype. (at::hardswish on CUDA
// scales by 1/6 rounded to float32 also for float64 data, 1e-8 off.)
at::Tensor hardswish_exact(const at::Tensor& x) { return x * (x + 3).clamp_(0, 6).div_(6); }

}  // namespace

at::Tensor activation_forward(const at::Tensor& pre, Activation a) {
  switch (a) {
    case Activation::kIdentity:
      return pre;
    case Activation::kRelu:
      return at::relu(pre);
    case Activation::kRelu6:
      return at::hardtanh(pre, 0, 6);
    case Activation::kSilu:
      return at::silu(pre);
    case Activation::kHardswish:
      return hardswish_exact(pre);
    case Activation::kGelu:
      return at::gelu(pre);
    case Activation::kSigmoid:
      return at::sigmoid(pre);
  }
  return pre;
}

at::Tensor activation_backward(const at::Tensor& grad_output, const at::Tensor& pre,
                               const at::Tensor& out, Activation a) {
  switch (a) {
    case Activation::kIdentity:
      return grad_output;
    case Activation::kRelu:
      return at::threshold_backward(grad_output, out, 0);
    case Activation::kRelu6:
      return at::hardtanh_backward(grad_output, pre, 0, 6);
    case Activation::kSilu:
      return at::silu_backward(grad_output, pre);
    case Activation::kHardswish:
      return at::hardswish_backward(grad_output, pre);
    case Activation::kGelu:
      return at::gelu_backward(grad_output, pre);
    case Activation::kSigmoid:
      return at::sigmoid_backward(grad_output, out);
  }
  return grad_output;
}

void apply_epilogue_(at::Tensor& out, const ConvEpilogue& e) {
  if (e.has_residual()) out.add_(e.residual);
  switch (e.activation) {
    case Activation::kIdentity:
      break;
    case Activation::kRelu:
      at::relu_(out);
      break;
    case Activation::kRelu6:
      at::hardtanh_(out, 0, 6);
      break;
    case Activation::kSilu:
      at::silu_(out);
      break;
    case Activation::kHardswish:
      out.copy_(hardswish_exact(out));
      break;
    case Activation::kGelu:
      out.copy_(at::gelu(out));
      break;
    case Activation::kSigmoid:
      at::sigmoid_(out);
      break;
  }
}

}  // namespace customconv
