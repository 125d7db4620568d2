#include "ops/conv2d/channels_last_direct_cpu.h"
#include "ops/conv2d/channels_last_gemm.h"
#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/few_channels_direct_cpu.h"
#include "ops/conv2d/grouped_direct_cpu.h"

namespace customconv {

std::optional<at::Tensor> cpu_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_cpu(input, weight, bias, s);
  if (auto out = few_channels_direct_conv2d_cpu(input, weight, bias, s)) return out;
  if (auto out = channels_last_direct_conv2d_cpu(input, weight, bias, s)) return out;
  return channels_last_gemm_conv2d(input, weight, bias, s);
}

std::optional<at::Tensor> cpu_conv2d_fused_engine(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue& epilogue) {
  if (s.groups > 1) return std::nullopt;
  return channels_last_direct_conv2d_cpu(input, weight, bias, s, &epilogue);
}

std::optional<at::Tensor> cpu_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  // Stride-1 windows run as the forward of grad_output with the rotated weight.
  if (grad_input_as_forward(s.win)) return std::nullopt;
  if (s.groups <= 1) return channels_last_gemm_conv2d_grad_input(grad_output, input, weight, s);
  return grouped_direct_conv2d_grad_input_cpu(grad_output, input, weight, s);
}

std::optional<at::Tensor> cpu_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_grad_weight_cpu(grad_output, input, weight, s);
  return channels_last_gemm_conv2d_grad_weight(grad_output, input, weight, s);
}

}  // namespace customconv
