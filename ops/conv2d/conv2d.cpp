#include "ops/conv2d/conv2d.h"

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"
#include "ops/common/workspace.h"

#include <ATen/ATen.h>

namespace customconv {
namespace {

// The int64 geometry of one call, with the grouped-GEMM view and the chunking.
struct Plan {
  Conv2dShape<int64_t> s;
  int64_t g, kg, rows_g, length;  // groups, K/groups, C/groups*kh*kw, oh*ow
  int64_t chunk;                  // images per chunk
};

Plan make_plan(const Conv2dShape<int64_t>& s, const at::Tensor& input) {
  Plan p{s, s.groups, s.k / s.groups, (s.in.c / s.groups) * s.win.kh * s.win.kw, s.oh * s.ow, 1};
  const int64_t per_image =
      checked_mul("conv2d", "the workspace of one image", (p.rows_g + p.kg) * p.g * p.length,
                  static_cast<int64_t>(input.element_size()));
  p.chunk = images_per_chunk(s.in.n, per_image);
  return p;
}

// The first nc images' worth of the column buffer, viewed (groups, rows_g, nc*L).
at::Tensor chunk_view(const at::Tensor& buffer, const Plan& p, int64_t nc) {
  return buffer.narrow(0, 0, p.g * p.rows_g * nc * p.length).view({p.g, p.rows_g, nc * p.length});
}

ColumnLayout chunk_layout(const Plan& p, int64_t nc) { return {p.length, nc * p.length}; }

// grad_output images [n0, n0 + nc) as the GEMM operand (groups, K/groups, nc*L).
at::Tensor grad_chunk(const at::Tensor& go, const Plan& p, int64_t n0, int64_t nc) {
  const at::Tensor part = go.narrow(0, n0, nc);
  if (nc == 1) return part.view({p.g, p.kg, p.length});
  return part.view({nc, p.g, p.kg, p.length})
      .permute({1, 2, 0, 3})
      .reshape({p.g, p.kg, nc * p.length});
}

}  // namespace

at::Tensor conv2d_impl(const ColumnKernels& kernels, const at::Tensor& input_arg,
                       const at::Tensor& weight_arg, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups) {
  const auto s = check_conv2d<int64_t>("conv2d", input_arg, weight_arg, bias, stride, padding,
                                       dilation, groups);
  const Plan p = make_plan(s, input_arg);
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input_arg.options());
  const bool has_bias = bias.has_value() && bias->defined();
  if (out.numel() == 0) return unbatch(out, s.in.batched);
  if (p.rows_g == 0) {  // no input channels: the output is the bias alone
    out.zero_();
    if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
    return unbatch(out, s.in.batched);
  }

  const at::Tensor input = as_batch(input_arg, s.in.batched);
  const at::Tensor w = weight_arg.contiguous().view({p.g, p.kg, p.rows_g});
  const at::Tensor b = has_bias ? bias->contiguous().view({p.g, p.kg, 1}) : at::Tensor();
  const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, input.options());

  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    const at::Tensor cols = chunk_view(buffer, p, nc);
    kernels.im2col(input.narrow(0, n0, nc), cols, s.win, s.oh, s.ow, chunk_layout(p, nc));
    if (nc == 1) {  // the GEMM result is the output image itself
      at::Tensor dst = out.select(0, n0).view({p.g, p.kg, p.length});
      if (has_bias) {
        at::baddbmm_out(dst, b.expand({p.g, p.kg, p.length}), w, cols);
      } else {
        at::bmm_out(dst, w, cols);
      }
      continue;
    }
    const at::Tensor res =
        has_bias ? at::baddbmm(b.expand({p.g, p.kg, nc * p.length}), w, cols) : at::bmm(w, cols);
    out.narrow(0, n0, nc)
        .view({nc, p.g, p.kg, p.length})
        .permute({1, 2, 0, 3})
        .copy_(res.view({p.g, p.kg, nc, p.length}));
  }
  return unbatch(out, s.in.batched);
}

at::Tensor conv2d_grad_input_impl(const ColumnKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_input";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  const Plan p = make_plan(s, input_arg);
  at::Tensor gi = at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input_arg.options());
  if (gi.numel() == 0) return unbatch(gi, s.in.batched);
  if (s.k == 0) return unbatch(gi, s.in.batched).zero_();

  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor wt = weight_arg.contiguous().view({p.g, p.kg, p.rows_g}).transpose(1, 2);
  const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, go.options());
  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    at::Tensor cols = chunk_view(buffer, p, nc);
    at::bmm_out(cols, wt, grad_chunk(go, p, n0, nc));
    kernels.col2im(cols, gi.narrow(0, n0, nc), s.win, s.oh, s.ow, chunk_layout(p, nc));
  }
  return unbatch(gi, s.in.batched);
}

at::Tensor conv2d_grad_weight_impl(const ColumnKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_weight";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  const Plan p = make_plan(s, input_arg);
  const auto dtype = input_arg.scalar_type();
  const bool low_precision = dtype == at::kHalf || dtype == at::kBFloat16;
  at::Tensor acc = at::zeros({p.g, p.kg, p.rows_g},
                             input_arg.options().dtype(low_precision ? at::kFloat : dtype));
  if (acc.numel() > 0 && s.in.n > 0) {
    const at::Tensor input = as_batch(input_arg, s.in.batched);
    const at::Tensor go = as_batch(grad_output, s.in.batched);
    const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, input.options());
    for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
      const int64_t nc = std::min(p.chunk, s.in.n - n0);
      const at::Tensor cols = chunk_view(buffer, p, nc);
      kernels.im2col(input.narrow(0, n0, nc), cols, s.win, s.oh, s.ow, chunk_layout(p, nc));
      const at::Tensor g = grad_chunk(go, p, n0, nc);
      if (low_precision) {
        acc.add_(at::bmm(g, cols.transpose(1, 2)));
      } else {
        acc.baddbmm_(g, cols.transpose(1, 2));
      }
    }
  }
  return acc.to(dtype).view(weight_arg.sizes());
}

at::Tensor conv2d_grad_bias_impl(const at::Tensor& grad_output) {
  check_dims("conv2d_grad_bias", "grad_output", grad_output, {3, 4});
  check_floating("conv2d_grad_bias", "grad_output", grad_output);
  const auto dtype = grad_output.scalar_type();
  const bool low_precision = dtype == at::kHalf || dtype == at::kBFloat16;
  const auto dims =
      grad_output.dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{1, 2};
  return at::sum(grad_output, dims, false, low_precision ? at::kFloat : dtype).to(dtype);
}

}  // namespace customconv
