#include "ops/conv2d/pointwise_gemm.h"

#include <ATen/ATen.h>

namespace customconv {

std::optional<at::Tensor> pointwise_channels_last_conv2d(const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return std::nullopt;
  if (!s.in.batched || s.groups != 1 || w.kh != 1 || w.kw != 1 || w.sh != 1 || w.sw != 1 ||
      w.ph != 0 || w.pw != 0 || s.in.c == 0) {
    return std::nullopt;
  }
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast)) return std::nullopt;
  // (N*H*W, C) rows of the input times the weight's (K, C) rows: (N*H*W, K),
  // which is the channels_last output.
  const int64_t rows = s.in.n * s.in.h * s.in.w;
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow},
                             input.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  const at::Tensor x = input.permute({0, 2, 3, 1}).reshape({rows, s.in.c});   // a view
  at::Tensor y = out.permute({0, 2, 3, 1}).view({rows, s.k});                 // a view
  const at::Tensor wt = weight.reshape({s.k, s.in.c}).t();
  if (bias.has_value() && bias->defined()) {
    at::addmm_out(y, *bias, x, wt);
  } else {
    at::mm_out(y, x, wt);
  }
  return out;
}

}  // namespace customconv
