#include "ops/conv2d/conv2d.h"

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"
#include "ops/common/workspace.h"

#include <ATen/ATen.h>

namespace customconv {
namespace {

// Output planes of at least this many positions get per-image columns: their
// GEMMs are large enough on their own, and writing the NCHW output directly
// saves a pass over it (see conv2d.h).
constexpr int64_t kPerImageMinLength = 1024;

// The int64 geometry of one call, with the grouped-GEMM view and the chunking.
struct Plan {
  Conv2dShape<int64_t> s;
  int64_t g, kg, rows_g, length;  // groups, K/groups, C/groups*kh*kw, oh*ow
  bool pointwise;                 // 1x1, stride 1, no padding: the input is its own columns
  bool per_image;                 // columns (n, g, rows_g, L), not (g, rows_g, n*L)
  int64_t chunk;                  // images per chunk
};

bool routes_to_depthwise(const Conv2dShape<int64_t>& s) {
  return s.groups == s.in.c && s.in.c > 1;
}

// `weight_grad`: the weight gradient, which always takes the (g, rows_g, n*L) layout.
Plan make_plan(const Conv2dShape<int64_t>& s, const at::Tensor& input, bool weight_grad) {
  Plan p{s, s.groups, s.k / s.groups, (s.in.c / s.groups) * s.win.kh * s.win.kw, s.oh * s.ow,
         false, false, 1};
  const Window2d& w = s.win;
  p.pointwise = w.kh == 1 && w.kw == 1 && w.sh == 1 && w.sw == 1 && w.ph == 0 && w.pw == 0;
  p.per_image = !weight_grad && (p.pointwise || p.length >= kPerImageMinLength);
  // Per image: the columns, plus (second layout) the GEMM result or the
  // regrouped grad_output.
  const int64_t elements = p.per_image ? (p.pointwise ? 0 : p.g * p.rows_g * p.length)
                                       : (p.g * p.rows_g + s.k) * p.length;
  const int64_t per_image = checked_mul("conv2d", "the workspace of one image", elements,
                                        static_cast<int64_t>(input.element_size()));
  p.chunk = images_per_chunk(s.in.n, per_image);
  return p;
}

// The column buffer of a chunk of nc images, in the plan's layout, and that
// layout as im2col/col2im strides.
at::Tensor columns_view(const at::Tensor& buffer, const Plan& p, int64_t nc) {
  const at::Tensor flat = buffer.narrow(0, 0, p.g * p.rows_g * nc * p.length);
  return p.per_image ? flat.view({nc, p.g, p.rows_g, p.length})
                     : flat.view({p.g, p.rows_g, nc * p.length});
}

ColumnLayout columns_layout(const Plan& p, int64_t nc) {
  return p.per_image ? ColumnLayout{p.g * p.rows_g * p.length, p.length}
                     : ColumnLayout{p.length, nc * p.length};
}

// A chunk of images (nc, g * per_group, L) viewed (nc, g, per_group, L).
at::Tensor grouped(const at::Tensor& t, const Plan& p, int64_t n0, int64_t nc) {
  return t.narrow(0, n0, nc).view({nc, p.g, -1, p.length});
}

// grad_output images [n0, n0 + nc) regrouped as (g, K/g, nc*L), the second layout.
at::Tensor grad_output_rows(const at::Tensor& go, const Plan& p, int64_t n0, int64_t nc) {
  const at::Tensor part = go.narrow(0, n0, nc);
  if (nc == 1) return part.view({p.g, p.kg, p.length});
  return part.view({nc, p.g, p.kg, p.length})
      .permute({1, 2, 0, 3})
      .reshape({p.g, p.kg, nc * p.length});
}

// c[n, j] = a[j] · b[n, j] for every image n and group j: a (g, m, k) is shared
// by the images, b is (nc, g, k, L) and c (nc, g, m, L). Strided-batched GEMMs,
// batched over images or over groups, whichever is longer.
void gemm_per_image(const Conv2dKernels& kernels, const at::Tensor& a, const at::Tensor& b,
                    const at::Tensor& c) {
  const int64_t nc = b.size(0), g = b.size(1);
  if (nc >= g) {
    for (int64_t j = 0; j < g; ++j) {
      const at::Tensor aj = a.select(0, j);
      kernels.gemm(aj.unsqueeze(0).expand({nc, aj.size(0), aj.size(1)}), b.select(1, j),
                   c.select(1, j), false);
    }
  } else {
    for (int64_t n = 0; n < nc; ++n) kernels.gemm(a, b.select(0, n), c.select(0, n), false);
  }
}

}  // namespace

at::Tensor conv2d_impl(const Conv2dKernels& kernels, const at::Tensor& input_arg,
                       const at::Tensor& weight_arg, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups) {
  const auto s = check_conv2d<int64_t>("conv2d", input_arg, weight_arg, bias, stride, padding,
                                       dilation, groups);
  if (routes_to_depthwise(s)) {
    return depthwise_conv2d_impl(kernels.depthwise, input_arg, weight_arg, bias, stride, padding,
                                 dilation);
  }
  const Plan p = make_plan(s, input_arg, false);
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
  if (p.pointwise) {
    gemm_per_image(kernels, w, grouped(input, p, 0, s.in.n), grouped(out, p, 0, s.in.n));
  } else {
    const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, input.options());
    at::Tensor result;  // second layout: the GEMM result, (g, K/g, nc*L)
    if (!p.per_image && p.chunk > 1) result = at::empty({s.k * p.chunk * p.length}, input.options());
    for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
      const int64_t nc = std::min(p.chunk, s.in.n - n0);
      const at::Tensor cols = columns_view(buffer, p, nc);
      kernels.columns.im2col(input.narrow(0, n0, nc), cols, s.win, s.oh, s.ow,
                             columns_layout(p, nc));
      if (p.per_image) {
        gemm_per_image(kernels, w, cols, grouped(out, p, n0, nc));
      } else if (nc == 1) {  // the GEMM result is the output image itself
        kernels.gemm(w, cols, out.select(0, n0).view({p.g, p.kg, p.length}), false);
      } else {
        const at::Tensor res = result.narrow(0, 0, s.k * nc * p.length).view({p.g, p.kg, nc * p.length});
        kernels.gemm(w, cols, res, false);
        grouped(out, p, n0, nc).permute({1, 2, 0, 3}).copy_(res.view({p.g, p.kg, nc, p.length}));
      }
    }
  }
  if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
  return unbatch(out, s.in.batched);
}

at::Tensor conv2d_grad_input_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_input";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  if (routes_to_depthwise(s)) {
    return depthwise_conv2d_grad_input_impl(kernels.depthwise, grad_output, input_arg, weight_arg,
                                            stride, padding, dilation);
  }
  const Plan p = make_plan(s, input_arg, false);
  at::Tensor gi = at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input_arg.options());
  if (gi.numel() == 0) return unbatch(gi, s.in.batched);
  if (s.k == 0) return unbatch(gi, s.in.batched).zero_();

  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor wt = weight_arg.contiguous().view({p.g, p.kg, p.rows_g}).transpose(1, 2);
  if (p.pointwise) {  // the columns are grad_input itself
    gemm_per_image(kernels, wt, grouped(go, p, 0, s.in.n), grouped(gi, p, 0, s.in.n));
    return unbatch(gi, s.in.batched);
  }
  const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, go.options());
  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    const at::Tensor cols = columns_view(buffer, p, nc);
    if (p.per_image) {
      gemm_per_image(kernels, wt, grouped(go, p, n0, nc), cols);
    } else {
      kernels.gemm(wt, grad_output_rows(go, p, n0, nc), cols, false);
    }
    kernels.columns.col2im(cols, gi.narrow(0, n0, nc), s.win, s.oh, s.ow, columns_layout(p, nc));
  }
  return unbatch(gi, s.in.batched);
}

at::Tensor conv2d_grad_weight_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_weight";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  if (routes_to_depthwise(s)) {
    return depthwise_conv2d_grad_weight_impl(kernels.depthwise, grad_output, input_arg,
                                             weight_arg, stride, padding, dilation);
  }
  const Plan p = make_plan(s, input_arg, true);
  const auto dtype = input_arg.scalar_type();
  const bool low_precision = dtype == at::kHalf || dtype == at::kBFloat16;
  const auto acc_options = input_arg.options().dtype(low_precision ? at::kFloat : dtype);
  if (p.g * p.kg * p.rows_g == 0 || s.in.n == 0 || p.length == 0) {
    return at::zeros(weight_arg.sizes(), input_arg.options());
  }
  at::Tensor acc = at::empty({p.g, p.kg, p.rows_g}, acc_options);
  const at::Tensor input = as_batch(input_arg, s.in.batched);
  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, input.options());
  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    const at::Tensor cols = columns_view(buffer, p, nc);
    kernels.columns.im2col(input.narrow(0, n0, nc), cols, s.win, s.oh, s.ow, columns_layout(p, nc));
    kernels.gemm(grad_output_rows(go, p, n0, nc), cols.transpose(1, 2), acc, n0 > 0);
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
