#include "ops/conv2d/pointwise_gemm.h"

#include <ATen/ATen.h>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

bool takes(const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  return s.in.batched && s.groups == 1 && w.kh == 1 && w.kw == 1 && w.sh == 1 && w.sw == 1 &&
         w.ph == 0 && w.pw == 0 && s.in.n * s.in.h * s.in.w > 0 && s.in.c > 0 && s.k > 0;
}

// A channels_last (N, C, H, W) tensor as its (1, N*H*W, C) matrix, in place.
at::Tensor rows(const at::Tensor& t) { return channels_last_rows(t).unsqueeze(0); }

// The weight (K, C, 1, 1) as a (1, K, C) matrix (a view: every layout of a
// 1x1 weight with unit channel stride is one).
at::Tensor weight_matrix(const at::Tensor& w) {
  const at::Tensor m = w.flatten(1);
  return (m.stride(1) == 1 ? m : m.contiguous()).unsqueeze(0);
}

}  // namespace

std::optional<at::Tensor> pointwise_conv2d(BatchedGemm gemm, const at::Tensor& input,
                                           const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias,
                                           const Conv2dShape<int64_t>& s) {
  if (!takes(s) || !input.is_contiguous(kChannelsLast)) return std::nullopt;
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  const at::Tensor w = weight_matrix(weight);
  const bool has_bias = bias.has_value() && bias->defined();
  // at::addmm follows PyTorch's matmul TF32 setting, not the convolutions' one.
  const bool tf32_policy_differs = input.is_cuda() && input.scalar_type() == at::kFloat;
  if (has_bias && !tf32_policy_differs) {
    at::Tensor y = rows(out).squeeze(0);
    at::addmm_out(y, *bias, rows(input).squeeze(0), w.squeeze(0).t());
    return out;
  }
  gemm(rows(input), w.transpose(1, 2), rows(out), false);
  if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
  return out;
}

std::optional<at::Tensor> pointwise_conv2d_grad_input(BatchedGemm gemm,
                                                      const at::Tensor& grad_output,
                                                      const at::Tensor& weight,
                                                      const Conv2dShape<int64_t>& s) {
  if (!takes(s)) return std::nullopt;
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  at::Tensor gi = empty_channels_last(go, s.in.n, s.in.c, s.in.h, s.in.w);
  gemm(rows(go), weight_matrix(weight), rows(gi), false);
  return gi;
}

std::optional<at::Tensor> pointwise_conv2d_grad_weight(BatchedGemm gemm,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const Conv2dShape<int64_t>& s) {
  if (!takes(s) || !input.is_contiguous(kChannelsLast)) return std::nullopt;
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  at::Tensor gw = at::empty({s.k, s.in.c, 1, 1}, input.options());
  gemm(rows(go).transpose(1, 2), rows(input), gw.view({1, s.k, s.in.c}), false);
  return gw;
}

}  // namespace customconv
