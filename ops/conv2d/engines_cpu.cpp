#include "ops/conv2d/channels_last_gemm.h"
#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/grouped_direct_cpu.h"

namespace customconv {

std::optional<at::Tensor> cpu_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                            const std::optional<at::Tensor>& bias,
                                            const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) return grouped_direct_conv2d_cpu(input, weight, bias, s);
  return channels_last_gemm_conv2d(input, weight, bias, s);
}

std::optional<at::Tensor> cpu_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const Conv2dShape<int64_t>& s) {
  if (s.groups <= 1) return std::nullopt;
  // With stride 1 conv2d_grad_input_impl runs the input gradient as the
  // forward of grad_output with the rotated weight (the grouped forward).
  const Window2d& w = s.win;
  const bool pointwise = w.kh == 1 && w.kw == 1 && w.ph == 0 && w.pw == 0;
  const bool as_forward = w.sh == 1 && w.sw == 1 && w.dh * (w.kh - 1) >= w.ph &&
                          w.dw * (w.kw - 1) >= w.pw && !pointwise;
  if (as_forward) return std::nullopt;
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
