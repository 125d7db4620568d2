// depthwise_conv2d (== F.conv2d with groups = C, weight (C*m, 1, kh, kw)) as
// direct kernels, and its backward pieces; device-generic: the device's
// kernels come in as a DepthwiseKernels table.
//
// The forward kernels take an activation (ops/common/activation.h) that they
// apply to conv + bias of every output element in their store (the fused
// op's depthwise layers: conv + folded BatchNorm + ReLU6 / SiLU, one pass over
// the output), computed in the accumulator type (float32 for 16-bit data)
// before the one rounding to the output's dtype. Identity: the plain
// convolution. The backward kernels know nothing of it (the caller applies
// the activation's gradient first).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include "ops/common/activation.h"
#include "ops/common/window.h"

namespace customconv {

// Optional kernels on channels_last tensors (input, output, grad_output and
// grad_input batched and stored channels_last; weight (C, 1, kh, kw), bias
// (C,), grad_weight (C, 1, kh, kw) contiguous), channel multiplier 1. Each
// returns false, writing nothing, when it does not take the call (such as
// its dtype); null: the device has none. forward applies `activation` to
// conv + bias in its store.
struct DepthwiseChannelsLastKernels {
  bool (*forward)(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& output, const Window2d& win,
                  Activation activation) = nullptr;
  bool (*grad_input)(const at::Tensor& grad_output, const at::Tensor& weight,
                     const at::Tensor& grad_input, const Window2d& win) = nullptr;
  // A reduction in a fixed order, whatever the thread count; with grad_bias
  // defined ((C,), contiguous), the bias gradient in the same pass.
  bool (*grad_weight)(const at::Tensor& grad_output, const at::Tensor& input,
                      const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                      const Window2d& win) = nullptr;
};

// Kernels on contiguous 4-D tensors: input (N, C, H, W), weight (C*m, 1, kh, kw),
// output / grad_output (N, C*m, oh, ow); `mult` is m. Each writes every element
// of its output.
struct DepthwiseKernels {
  // bias may be undefined; `activation` is applied to conv + bias in the store.
  void (*forward)(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& output, const Window2d& win, int64_t mult,
                  Activation activation);
  void (*grad_input)(const at::Tensor& grad_output, const at::Tensor& weight,
                     const at::Tensor& grad_input, const Window2d& win, int64_t mult);
  // A reduction over batch and space, in a fixed order (deterministic).
  void (*grad_weight)(const at::Tensor& grad_output, const at::Tensor& input,
                      const at::Tensor& grad_weight, const Window2d& win, int64_t mult);
  // Optional (null where the device has none): grad_weight and, in the same
  // pass over grad_output, the bias gradient (grad_output summed over batch
  // and space per channel), in a fixed order. Returns false, writing nothing,
  // when it does not take the geometry.
  bool (*grad_weight_bias)(const at::Tensor& grad_output, const at::Tensor& input,
                           const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                           const Window2d& win, int64_t mult);
  DepthwiseChannelsLastKernels channels_last;
  // Whether forward applies silu, gelu and sigmoid itself at no great cost.
  // The CPU kernels compute them one element at a time, 2-3x slower than the
  // convolution plus ATen's vectorized activation after it, so conv2d_fused
  // gives them only identity, relu, relu6 and hardswish there.
  bool fast_transcendental_activations = true;
};

DepthwiseKernels cpu_depthwise_kernels();
// The CPU's channels_last float32 kernels (depthwise_channels_last_cpu.cpp).
DepthwiseChannelsLastKernels cpu_depthwise_channels_last_kernels();
#ifdef CUSTOMCONV_WITH_CUDA
DepthwiseKernels cuda_depthwise_kernels();
// The forward on channels_last tensors (depthwise_channels_last_cuda.cu).
DepthwiseChannelsLastKernels cuda_depthwise_channels_last_kernels();
#endif

// activation(depthwise_conv2d(...)), the activation applied by the kernels
// as they store (no second pass over the output).
at::Tensor depthwise_conv2d_impl(const DepthwiseKernels& kernels, const at::Tensor& input,
                                 const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 c10::IntArrayRef stride, c10::IntArrayRef padding,
                                 c10::IntArrayRef dilation,
                                 Activation activation = Activation::kIdentity);

at::Tensor depthwise_conv2d_grad_input_impl(const DepthwiseKernels& kernels,
                                            const at::Tensor& grad_output, const at::Tensor& input,
                                            const at::Tensor& weight, c10::IntArrayRef stride,
                                            c10::IntArrayRef padding, c10::IntArrayRef dilation);

at::Tensor depthwise_conv2d_grad_weight_impl(const DepthwiseKernels& kernels,
                                             const at::Tensor& grad_output, const at::Tensor& input,
                                             const at::Tensor& weight, c10::IntArrayRef stride,
                                             c10::IntArrayRef padding, c10::IntArrayRef dilation);

// The weight and bias gradients together: (grad_weight, grad_bias).
std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_grad_weight_bias_impl(
    const DepthwiseKernels& kernels, const at::Tensor& grad_output, const at::Tensor& input,
    const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation);

}  // namespace customconv
