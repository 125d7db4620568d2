#include "ops/conv2d/pointwise_gemm.h"

#include <ATen/ATen.h>

#include "ops/common/launch.h"
#include "ops/common/strided_view.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

bool takes(const Conv2dShape<int64_t>& s) {
  return s.in.batched && s.groups == 1 && s.win.pointwise() && s.in.n * s.in.h * s.in.w > 0 &&
         s.in.c > 0 && s.k > 0;
}

// The operands are views made without the dispatcher (strided_view.h): an
// ATen view is a dispatcher call, a microsecond or more of host time, which
// small layers pay in full.

// A (1, rows, cols) view of t's storage with the given strides. The batch
// stride is rows * cols, as a packed batch would have: with a batch stride of
// 0, ATen's CPU bmm took another route, 1.6-2x slower (MobileNetV2's 16 -> 96
// layer at 112x112, N=8, 2 threads: 11.5 ms against 5.9).
at::Tensor matrix(const at::Tensor& t, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return strided_view(t, {1, rows, cols}, {rows * cols, row_stride, col_stride},
                      t.storage_offset());
}

// A channels_last (N, C, H, W) tensor as its (1, N*H*W, C) matrix, in place.
at::Tensor rows(const at::Tensor& t) {
  const int64_t c = t.size(1);
  return matrix(t, t.size(0) * t.size(2) * t.size(3), c, c, 1);
}

// The weight (K, C, 1, 1) with a unit channel stride (every layout of a 1x1
// weight has one, unless it is a strided view: then a contiguous copy).
at::Tensor unit_channel_stride(const at::Tensor& w) {
  return w.stride(1) == 1 || w.size(1) == 1 ? w : w.contiguous();
}

// The weight as the (1, K, C) matrix, and as its transpose (1, C, K).
at::Tensor weight_matrix(const at::Tensor& w) {
  return matrix(w, w.size(0), w.size(1), w.stride(0), 1);
}
at::Tensor weight_matrix_t(const at::Tensor& w) {
  return matrix(w, w.size(1), w.size(0), 1, w.stride(0));
}

}  // namespace

std::optional<at::Tensor> pointwise_conv2d(BatchedGemm gemm, const at::Tensor& input,
                                           const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias,
                                           const Conv2dShape<int64_t>& s) {
  if (!takes(s) || !input.is_contiguous(kChannelsLast)) return std::nullopt;
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  const at::Tensor w = unit_channel_stride(weight);
  const bool has_bias = bias.has_value() && bias->defined();
  // at::addmm follows PyTorch's matmul TF32 setting, not the convolutions' one.
  const bool tf32_policy_differs = input.is_cuda() && input.scalar_type() == at::kFloat;
  if (has_bias && !tf32_policy_differs) {
    at::Tensor y = rows(out).squeeze(0);
    at::addmm_out(y, *bias, rows(input).squeeze(0), weight_matrix_t(w).squeeze(0));
    return out;
  }
  gemm(rows(input), weight_matrix_t(w), rows(out), false);
  if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
  return out;
}

std::optional<at::Tensor> pointwise_conv2d_nchw(BatchedGemm gemm, const at::Tensor& input,
                                                const at::Tensor& weight,
                                                const std::optional<at::Tensor>& bias,
                                                const Conv2dShape<int64_t>& s) {
  if (!takes(s) || !input.is_contiguous() ||
      conv2d_output_format(input, weight) != at::MemoryFormat::Contiguous) {
    return std::nullopt;
  }
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input.options());
  const int64_t n = s.in.n, c = s.in.c, k = s.k, l = s.oh * s.ow;
  // The weight is shared by the images: a batch stride of 0.
  const at::Tensor w = unit_channel_stride(weight);
  gemm(strided_view(w, {n, k, c}, {0, w.stride(0), 1}, w.storage_offset()),
       strided_view(input, {n, c, l}, {c * l, l, 1}, input.storage_offset()),
       strided_view(out, {n, k, l}, {k * l, l, 1}, 0), false);
  if (bias.has_value() && bias->defined()) out.add_(bias->view({1, s.k, 1, 1}));
  return out;
}

std::optional<at::Tensor> pointwise_conv2d_grad_input(BatchedGemm gemm,
                                                      const at::Tensor& grad_output,
                                                      const at::Tensor& weight,
                                                      const Conv2dShape<int64_t>& s) {
  if (!takes(s)) return std::nullopt;
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  at::Tensor gi = empty_channels_last(go, s.in.n, s.in.c, s.in.h, s.in.w);
  gemm(rows(go), weight_matrix(unit_channel_stride(weight)), rows(gi), false);
  return gi;
}

std::optional<at::Tensor> pointwise_conv2d_grad_weight(BatchedGemm gemm,
                                                       const at::Tensor& grad_output,
                                                       const at::Tensor& input,
                                                       const Conv2dShape<int64_t>& s) {
  if (!takes(s) || !input.is_contiguous(kChannelsLast)) return std::nullopt;
  const at::Tensor go = grad_output.contiguous(kChannelsLast);
  at::Tensor gw = at::empty({s.k, s.in.c, 1, 1}, input.options());
  gemm(matrix(go, s.k, s.in.n * s.oh * s.ow, 1, s.k), rows(input), matrix(gw, s.k, s.in.c, s.in.c, 1), false);
  return gw;
}

}  // namespace customconv
