#include "ops/conv2d/conv2d.h"
#include "ops/conv2d/grouped_direct.h"
#include "ops/conv2d/implicit_gemm.h"

namespace customconv {

std::optional<at::Tensor> cuda_conv2d_engine(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s) {
#ifdef CUSTOMCONV_WITH_CUTLASS
  if (auto out = implicit_gemm_conv2d(input, weight, bias, s)) return out;
#endif
  if (s.groups > 1) return grouped_direct_conv2d(input, weight, bias, s);
  return std::nullopt;
}

std::optional<at::Tensor> cuda_conv2d_fused_engine(const at::Tensor& input,
                                                   const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   const Conv2dShape<int64_t>& s,
                                                   const ConvEpilogue& epilogue) {
#ifdef CUSTOMCONV_WITH_CUTLASS
  return implicit_gemm_conv2d_fused(input, weight, bias, s, epilogue);
#else
  (void)input, (void)weight, (void)bias, (void)s, (void)epilogue;
  return std::nullopt;
#endif
}

std::optional<at::Tensor> cuda_conv2d_grad_input_engine(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) {
    if (grad_input_as_forward(s.win)) return std::nullopt;  // the grouped forward's tensor cores
#ifdef CUSTOMCONV_WITH_CUTLASS
    if (auto gi = implicit_gemm_grouped_conv2d_grad_input(grad_output, input, weight, s)) return gi;
#endif
    return grouped_direct_conv2d_grad_input(grad_output, input, weight, s);
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  return implicit_gemm_conv2d_grad_input(grad_output, input, weight, s);
#else
  return std::nullopt;
#endif
}

std::optional<at::Tensor> cuda_conv2d_grad_weight_engine(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s) {
  if (s.groups > 1) {
#ifdef CUSTOMCONV_WITH_CUTLASS
    if (auto gw = implicit_gemm_grouped_conv2d_grad_weight(grad_output, input, weight, s)) return gw;
#endif
    return grouped_direct_conv2d_grad_weight(grad_output, input, weight, s);
  }
#ifdef CUSTOMCONV_WITH_CUTLASS
  return implicit_gemm_conv2d_grad_weight(grad_output, input, weight, s);
#else
  return std::nullopt;
#endif
}

}  // namespace customconv
