#include "ops/conv2d/conv2d.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "ops/common/conv_shapes.h"
#include "ops/common/launch.h"
#include "ops/common/strided_view.h"
#include "ops/common/workspace.h"
#include "ops/conv2d/phase_taps.h"

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
  bool pointwise;                 // 1x1, stride 1, no padding, per image: the input is its own columns
  bool per_image;                 // columns (n, g, rows_g, L), not (g, rows_g, n*L)
  int64_t chunk;                  // images per chunk
  int64_t image_bytes;            // workspace bytes per image of a chunk
  int64_t limit;                  // the workspace limit of the input's device
};

enum class Pass { kForward, kGradInput, kGradWeight };

bool routes_to_depthwise(const Conv2dShape<int64_t>& s) {
  return s.groups == s.in.c && s.in.c > 1;
}

// Bytes of one element of the weight gradient's partial products.
int64_t partial_element_size(const at::Tensor& t) {
  return std::max<int64_t>(t.element_size(), 4);
}

Plan make_plan(const Conv2dShape<int64_t>& s, const at::Tensor& input, Pass pass) {
  Plan p{s, s.groups, s.k / s.groups, (s.in.c / s.groups) * s.win.kh * s.win.kw, s.oh * s.ow,
         false, false, 1, 0};
  p.limit = workspace_limit_bytes(input.device().type());
  p.pointwise = nchw_gemm_in_place(s);  // the input is its own per-image columns
  p.per_image = p.length >= kPerImageMinLength || p.pointwise;
  // Per image: the columns, plus (second layout) the GEMM result or the
  // regrouped grad_output, plus (weight gradient, per image) its partial product.
  const char* op = "conv2d";
  const int64_t elem = input.element_size();
  int64_t bytes = 0;
  if (p.per_image) {
    if (!p.pointwise) bytes = checked_mul(op, "the columns of one image", p.g * p.rows_g, p.length * elem);
    if (pass == Pass::kGradWeight) {
      bytes += checked_mul(op, "the partial weight gradient of one image", p.g * p.kg,
                           p.rows_g * partial_element_size(input));
    }
  } else {
    bytes = checked_mul(op, "the workspace of one image", p.g * p.rows_g + s.k, p.length * elem);
  }
  p.chunk = images_per_chunk(s.in.n, bytes, input.device().type());
  p.image_bytes = bytes;
  return p;
}

// The routes' operands are views made without the dispatcher
// (strided_view.h): an ATen view is a dispatcher call, a microsecond or more
// of host time, and these routes take a few per image, group or chunk.

// The column buffer of a chunk of nc images, in the plan's layout, and that
// layout as im2col/col2im strides.
at::Tensor columns_view(const at::Tensor& buffer, const Plan& p, int64_t nc) {
  const int64_t plane = p.rows_g * p.length;
  const int64_t at = buffer.storage_offset();
  return p.per_image ? strided_view(buffer, {nc, p.g, p.rows_g, p.length},
                                    {p.g * plane, plane, p.length, 1}, at)
                     : strided_view(buffer, {p.g, p.rows_g, nc * p.length},
                                    {nc * plane, nc * p.length, 1}, at);
}

ColumnLayout columns_layout(const Plan& p, int64_t nc) {
  return p.per_image ? ColumnLayout{p.g * p.rows_g * p.length, p.length}
                     : ColumnLayout{p.length, nc * p.length};
}

// Images [n0, n0 + nc) of a contiguous (N, g * per_group, L) tensor viewed
// (nc, g, per_group, L).
at::Tensor grouped(const at::Tensor& t, const Plan& p, int64_t n0, int64_t nc) {
  TORCH_INTERNAL_ASSERT(t.is_contiguous());
  const int64_t per_group = t.size(1) / p.g, image = t.size(1) * p.length;
  return strided_view(t, {nc, p.g, per_group, p.length}, {image, per_group * p.length, p.length, 1},
                      t.storage_offset() + n0 * image);
}

// grad_output images [n0, n0 + nc) regrouped as (g, K/g, nc*L), the second
// layout (go contiguous): one image in place, more by a copy.
at::Tensor grad_output_rows(const Conv2dKernels& kernels, const at::Tensor& go, const Plan& p,
                            int64_t n0, int64_t nc) {
  const int64_t k = p.g * p.kg;
  if (nc == 1) {
    return strided_view(go, {p.g, p.kg, p.length}, {p.kg * p.length, p.length, 1},
                        go.storage_offset() + n0 * k * p.length);
  }
  const at::Tensor part = leading_view(go, n0, nc);
  if (kernels.route.swap_outer_dims != nullptr) {
    at::Tensor rows = at::empty({p.g, p.kg, nc * p.length}, go.options());
    kernels.route.swap_outer_dims(part, rows, nc, k, p.length);  // (nc, K, L) -> (K, nc, L)
    return rows;
  }
  return part.view({nc, p.g, p.kg, p.length})
      .permute({1, 2, 0, 3})
      .reshape({p.g, p.kg, nc * p.length});
}

// c[n, j] = a[n, j] · b[n, j] for every image n and group j: each operand is
// (nc, g, rows, cols); a may be expanded along images (a shared weight).
// Strided-batched GEMMs, batched over images or over groups, whichever is longer.
void gemm_per_image(const Conv2dKernels& kernels, const at::Tensor& a, const at::Tensor& b,
                    const at::Tensor& c) {
  const int64_t nc = b.size(0), g = b.size(1);
  const int64_t dim = nc >= g ? 1 : 0;
  for (int64_t i = 0; i < (nc >= g ? g : nc); ++i) {
    kernels.gemm(select_view(a, dim, i), select_view(b, dim, i), select_view(c, dim, i), false);
  }
}

// The weight (g, K/g, rows_g) as the shared `a` of gemm_per_image.
at::Tensor shared(const at::Tensor& w, int64_t nc) {
  return strided_view(w, {nc, w.size(0), w.size(1), w.size(2)},
                      {0, w.stride(0), w.stride(1), w.stride(2)}, w.storage_offset());
}

// The contiguous weight (K, C/g, kh, kw) as (g, K/g, rows_g), or with
// `transposed` as (g, rows_g, K/g); `wc` is weight.contiguous().
at::Tensor weight_rows(const at::Tensor& wc, const Plan& p, bool transposed) {
  const int64_t group = p.kg * p.rows_g;
  return transposed
             ? strided_view(wc, {p.g, p.rows_g, p.kg}, {group, 1, p.rows_g}, wc.storage_offset())
             : strided_view(wc, {p.g, p.kg, p.rows_g}, {group, p.rows_g, 1}, wc.storage_offset());
}

// How many slices to split the weight gradient's reduction of a chunk of nc
// images into, so that the GEMMs produce enough output tiles for the device;
// the slices' partial products (partial_bytes each) share the workspace with
// the chunk's columns. 1: no split (and no partial products).
int64_t reduction_slices(const Conv2dKernels& kernels, const Plan& p, int64_t nc,
                         int64_t partial_bytes) {
  const int64_t tiles = ((p.kg + 127) / 128) * ((p.rows_g + 127) / 128) * p.g;
  const int64_t wanted = (kernels.gemm_parallelism() + tiles - 1) / tiles;
  const int64_t by_length = std::max<int64_t>(nc * p.length / 512, 1);
  const int64_t free_bytes = p.limit - nc * p.image_bytes;
  const int64_t by_memory = free_bytes / std::max<int64_t>(partial_bytes, 1);
  const int64_t slices = std::min({wanted, by_length, by_memory});
  return slices >= 2 ? slices : 1;
}

// part[s, j] = go_rows[j] · cols[j]^T over slice s of the reduction (the
// second layout: go_rows (g, K/g, T), cols (g, rows_g, T)); the last slice
// also takes the remainder. part is (S, g, K/g, rows_g).
void sliced_weight_gemm(const Conv2dKernels& kernels, const at::Tensor& go_rows,
                        const at::Tensor& cols, const at::Tensor& part) {
  const int64_t slices = part.size(0), total = cols.size(2), len = total / slices;
  for (int64_t j = 0; j < go_rows.size(0); ++j) {
    // (K/g, T), (rows_g, T), both with unit stride along T
    const at::Tensor a = select_view(go_rows, 0, j), b = select_view(cols, 0, j);
    const at::Tensor c = select_view(part, 1, j);
    const int64_t sa = a.stride(0), sb = b.stride(0), ka = a.size(0), kb = b.size(0);
    kernels.gemm(strided_view(a, {slices, ka, len}, {len, sa, 1}, a.storage_offset()),
                 strided_view(b, {slices, len, kb}, {len, 1, sb}, b.storage_offset()), c, false);
    if (slices * len < total) {
      const int64_t rest = total - slices * len, from = slices * len;
      kernels.gemm(strided_view(a, {1, ka, rest}, {ka * sa, sa, 1}, a.storage_offset() + from),
                   strided_view(b, {1, rest, kb}, {kb * sb, 1, sb}, b.storage_offset() + from),
                   leading_view(c, slices - 1, 1), true);
    }
  }
}

// Whether the pointwise GEMMs (pointwise_gemm.h), which read and write
// channels_last, may compute a pass whose result takes `format`: a
// channels_last one, or any where every plane is one position (squeeze-and-
// excitation layers on pooled (N, C, 1, 1) data), whose tensors are NCHW and
// channels_last at once: their layer is one GEMM over the images.
bool pointwise_gemm_applies(at::MemoryFormat format, const Conv2dShape<int64_t>& s) {
  return format == at::MemoryFormat::ChannelsLast || (s.in.h * s.in.w == 1 && s.oh * s.ow == 1);
}

// A pass by the device's engine (null: none; `run_engine` calls it) and the
// pointwise GEMM (where `pointwise` says it applies; `run_pointwise`): the
// engine first where its predicate `before` (null: never) says so, else the
// pointwise GEMM first; nullopt where neither takes the pass.
template <class Engine, class RunEngine, class RunPointwise>
std::optional<at::Tensor> engine_or_pointwise(Engine engine, BeforePointwise before,
                                              const at::Tensor& input, const Conv2dShape<int64_t>& s,
                                              bool pointwise, const RunEngine& run_engine,
                                              const RunPointwise& run_pointwise) {
  const bool engine_first = engine != nullptr && before != nullptr && before(input, s);
  if (engine_first) {
    if (auto out = run_engine()) return out;
  }
  if (pointwise) {
    if (auto out = run_pointwise()) return out;
  }
  if (engine != nullptr && !engine_first) return run_engine();
  return std::nullopt;
}

}  // namespace

at::Tensor conv2d_impl(const Conv2dKernels& kernels, const at::Tensor& input_arg,
                       const at::Tensor& weight_arg, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                       int64_t groups) {
  const auto s = check_conv2d<int64_t>("conv2d", input_arg, weight_arg, bias, stride, padding,
                                       dilation, groups);
  // The routes below compute NCHW; a channels_last result (F.conv2d's rule,
  // conv2d_output_format) is then one layout change, except from the engine,
  // which computes channels_last itself.
  const at::MemoryFormat format = conv2d_output_format(input_arg, weight_arg);
  const auto in_format = [&](const at::Tensor& t) { return t.contiguous(format); };
  if (routes_to_depthwise(s)) {
    return in_format(depthwise_conv2d_impl(kernels.depthwise, input_arg, weight_arg, bias, stride,
                                           padding, dilation));
  }
  const Conv2dEngines& engines = kernels.engines;
  if (auto out = engine_or_pointwise(
          engines.forward, engines.forward_before_pointwise, input_arg, s, pointwise_gemm_applies(format, s),
          [&] { return engines.forward(input_arg, weight_arg, bias, s); },
          [&] { return pointwise_conv2d(kernels.gemm, input_arg, weight_arg, bias, s); })) {
    return *out;
  }
  const Plan p = make_plan(s, input_arg, Pass::kForward);
  if (p.pointwise && p.g == 1 && p.rows_g > 0 && s.in.n * s.k * s.oh * s.ow > 0) {
    // The NCHW GEMMs in place allocate their own result.
    auto out =
        pointwise_conv2d_nchw(kernels.gemm, as_batch(input_arg, s.in.batched), weight_arg, bias, s);
    if (out) return in_format(unbatch(*out, s.in.batched));
  }
  at::Tensor out = at::empty({s.in.n, s.k, s.oh, s.ow}, input_arg.options());
  const bool has_bias = bias.has_value() && bias->defined();
  if (out.numel() == 0) return in_format(unbatch(out, s.in.batched));
  if (p.rows_g == 0) {  // no input channels: the output is the bias alone
    out.zero_();
    if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
    return in_format(unbatch(out, s.in.batched));
  }

  const at::Tensor input = as_batch(input_arg, s.in.batched);
  const at::Tensor wc = weight_arg.contiguous();
  const at::Tensor w = weight_rows(wc, p, /*transposed=*/false);
  if (p.pointwise) {
    gemm_per_image(kernels, shared(w, s.in.n), grouped(input, p, 0, s.in.n),
                   grouped(out, p, 0, s.in.n));
  } else {
    // The columns, then (second layout) the GEMM result (g, K/g, nc*L), in
    // one allocation; the result starts on a 256-byte boundary.
    const int64_t column_elems = p.g * p.rows_g * p.chunk * p.length;
    const int64_t result_at =
        (column_elems * input.element_size() + 255) / 256 * 256 / input.element_size();
    const int64_t result_elems = !p.per_image && p.chunk > 1 ? s.k * p.chunk * p.length : 0;
    const at::Tensor buffer =
        at::empty({result_elems > 0 ? result_at + result_elems : column_elems}, input.options());
    const int64_t image = s.k * p.length;  // elements of an output image
    for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
      const int64_t nc = std::min(p.chunk, s.in.n - n0);
      const at::Tensor cols = columns_view(buffer, p, nc);
      kernels.columns.im2col(leading_view(input, n0, nc), cols, s.win, s.oh, s.ow,
                             columns_layout(p, nc));
      if (p.per_image) {
        gemm_per_image(kernels, shared(w, nc), cols, grouped(out, p, n0, nc));
      } else if (nc == 1) {  // the GEMM result is the output image itself
        kernels.gemm(w, cols,
                     strided_view(out, {p.g, p.kg, p.length}, {p.kg * p.length, p.length, 1},
                                  out.storage_offset() + n0 * image),
                     false);
      } else {
        const int64_t run = nc * p.length;  // a result row: (images, positions)
        const at::Tensor result =
            strided_view(buffer, {p.g, p.kg, run}, {p.kg * run, run, 1}, result_at);
        kernels.gemm(w, cols, result, false);
        // The result (g, K/g, nc, L) into out's images [n0, n0 + nc), (nc, g, K/g, L).
        if (kernels.route.swap_outer_dims != nullptr) {
          kernels.route.swap_outer_dims(result, leading_view(out, n0, nc), s.k, nc, p.length);
        } else {
          strided_view(out, {p.g, p.kg, nc, p.length}, {p.kg * p.length, p.length, image, 1},
                       out.storage_offset() + n0 * image)
              .copy_(strided_view(buffer, {p.g, p.kg, nc, p.length}, {p.kg * run, run, p.length, 1},
                                  result_at));
        }
      }
    }
  }
  if (has_bias) out.add_(bias->view({1, s.k, 1, 1}));
  return in_format(unbatch(out, s.in.batched));
}

at::Tensor conv2d_fused_impl(const Conv2dKernels& kernels, const at::Tensor& input,
                             const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                             c10::IntArrayRef stride, c10::IntArrayRef padding,
                             c10::IntArrayRef dilation, int64_t groups,
                             c10::string_view activation,
                             const std::optional<at::Tensor>& residual) {
  const char* op = "conv2d_fused";
  const ConvEpilogue e{parse_activation(op, activation), residual_or_none(residual)};
  const auto s = check_conv2d_fused<int64_t>(op, input, weight, bias, stride, padding, dilation,
                                             groups, residual);
  if (routes_to_depthwise(s) && !e.has_residual()) {
    const bool arithmetic = e.activation == Activation::kIdentity ||
                            e.activation == Activation::kRelu ||
                            e.activation == Activation::kRelu6 ||
                            e.activation == Activation::kHardswish;
    const bool in_kernel = arithmetic || kernels.depthwise.fast_transcendental_activations;
    at::Tensor out = depthwise_conv2d_impl(kernels.depthwise, input, weight, bias, stride, padding,
                                           dilation, in_kernel ? e.activation : Activation::kIdentity)
                         .contiguous(conv2d_output_format(input, weight));
    if (!in_kernel) apply_epilogue_(out, {e.activation, at::Tensor()});
    return out;
  }
  if (kernels.engines.fused_forward != nullptr && !routes_to_depthwise(s)) {
    if (auto out = kernels.engines.fused_forward(input, weight, bias, s, e)) return *out;
  }
  at::Tensor out = conv2d_impl(kernels, input, weight, bias, stride, padding, dilation, groups);
  apply_epilogue_(out, e);
  return out;
}

namespace {

// The input gradient of a strided layer, groups 1, as one stride-1 forward
// per stride phase (py, px) of the input positions: input row py + sh * a is
// reached from output row a + (py + ph - dh * r) / sh through each tap r for
// which that is a whole number, so the phase's gradient is the forward
// correlation of grad_output with those taps (offsets evenly spaced: a
// dilated window), the weight transposed (C <-> K); taps in order of
// increasing offset, i.e. decreasing r. A phase no tap reaches is zero.
at::Tensor grad_input_by_phases(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                const at::Tensor& weight, const Conv2dShape<int64_t>& s) {
  const Window2d& win = s.win;
  at::Tensor gi =
      at::empty({s.in.n, s.in.c, s.in.h, s.in.w},
                grad_output.options().memory_format(grad_output.suggest_memory_format()));
  // Symmetric padding for a forward whose positions first .. first + len - 1
  // (shifted by it) cover the phase's `len` rows: at least -first at the
  // start, and enough at the end.
  const auto padding = [](const PhaseTaps& t, int64_t len, int64_t out) {
    return std::max(
        {int64_t{0}, -t.first, len + t.first + t.step * (int64_t(t.index.size()) - 1) - out});
  };
  const auto index_tensor = [&](const std::vector<int64_t>& v) {
    return at::tensor(v, weight.options().dtype(at::kLong));
  };
  for (int64_t py = 0; py < win.sh; ++py) {
    for (int64_t px = 0; px < win.sw; ++px) {
      const int64_t hs = (s.in.h - py + win.sh - 1) / win.sh,
                    ws = (s.in.w - px + win.sw - 1) / win.sw;
      if (hs <= 0 || ws <= 0) continue;
      at::Tensor phase = gi.slice(2, py, s.in.h, win.sh).slice(3, px, s.in.w, win.sw);
      const PhaseTaps ty = phase_taps(py, win.kh, win.sh, win.ph, win.dh),
                      tx = phase_taps(px, win.kw, win.sw, win.pw, win.dw);
      if (ty.index.empty() || tx.index.empty() || s.k == 0) {
        phase.zero_();
        continue;
      }
      const int64_t pad_y = padding(ty, hs, s.oh), pad_x = padding(tx, ws, s.ow);
      const at::Tensor sub = weight.index_select(2, index_tensor(ty.index))
                                 .index_select(3, index_tensor(tx.index))
                                 .transpose(0, 1);
      const at::Tensor out = conv2d_impl(kernels, grad_output, sub, std::nullopt, {1, 1},
                                         {pad_y, pad_x}, {ty.step, tx.step}, 1);
      phase.copy_(out.narrow(2, ty.first + pad_y, hs).narrow(3, tx.first + pad_x, ws));
    }
  }
  return gi;
}

}  // namespace

at::Tensor conv2d_grad_input_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                  const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                  c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_input";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  // The gradient takes the forward output's memory format (F.conv2d's rule);
  // the routes after the engines compute NCHW and change it once at the end.
  const at::MemoryFormat format = conv2d_output_format(input_arg, weight_arg);
  const auto in_format = [&](const at::Tensor& t) { return t.contiguous(format); };
  if (routes_to_depthwise(s)) {
    return in_format(depthwise_conv2d_grad_input_impl(kernels.depthwise, grad_output, input_arg,
                                                      weight_arg, stride, padding, dilation));
  }
  const Conv2dEngines& engines = kernels.engines;
  if (engines.grad_input_by_phases != nullptr && engines.grad_input_by_phases(input_arg, s)) {
    return in_format(grad_input_by_phases(kernels, grad_output, weight_arg, s));
  }
  if (auto gi = engine_or_pointwise(
          engines.grad_input, engines.grad_input_before_pointwise, input_arg, s,
          pointwise_gemm_applies(format, s),
          [&] { return engines.grad_input(grad_output, input_arg, weight_arg, s); },
          [&] { return pointwise_conv2d_grad_input(kernels.gemm, grad_output, weight_arg, s); })) {
    return *gi;
  }
  Plan p = make_plan(s, input_arg, Pass::kGradInput);
  if (kernels.grad_input_column_bytes > 0 && p.per_image) {
    const int64_t fit = kernels.grad_input_column_bytes / std::max<int64_t>(p.image_bytes, 1);
    p.chunk = std::clamp<int64_t>(fit, 1, p.chunk);
  }
  // (Allocated where a route below writes it: the forward route returns its own.)
  const auto new_gi = [&] {
    return at::empty({s.in.n, s.in.c, s.in.h, s.in.w}, input_arg.options());
  };
  if (s.in.n * s.in.c * s.in.h * s.in.w == 0) return in_format(unbatch(new_gi(), s.in.batched));
  if (s.k == 0) return in_format(unbatch(new_gi(), s.in.batched).zero_());

  // With stride 1 the input gradient is the full correlation of grad_output
  // with the rotated weight: a forward convolution, whose im2col + GEMM beats
  // GEMM + col2im.
  const Window2d& win = s.win;
  const int64_t fph = win.dh * (win.kh - 1) - win.ph, fpw = win.dw * (win.kw - 1) - win.pw;
  if (win.sh == 1 && win.sw == 1 && fph >= 0 && fpw >= 0 && !p.pointwise) {
    const int64_t cg = s.in.c / p.g;
    // Ungrouped channels_last gradients take the device's rotation kernel
    // (rotated_weight.h): the flipped, transposed view's copy into the
    // engine's layout reads the weight a line per element (the CPU, 512
    // channels at 7x7, N=4: 7.7 of the input gradient's 11.7 ms).
    const at::Tensor rotated =
        kernels.rotated_weight != nullptr && p.g == 1 && format == at::MemoryFormat::ChannelsLast
            ? kernels.rotated_weight(weight_arg)
            : weight_arg.reshape({p.g, p.kg, cg, win.kh, win.kw})
                  .flip({3, 4})
                  .transpose(1, 2)
                  .reshape({s.in.c, p.kg, win.kh, win.kw});
    // grad_output in the gradient's format (F.conv2d's backward reads it so),
    // where the device's forward engine may take it.
    const bool to_engine = kernels.engines.forward != nullptr && grad_output.dim() == 4;
    const at::Tensor go_in = to_engine ? in_format(grad_output) : grad_output;
    return in_format(conv2d_impl(kernels, go_in, rotated, std::nullopt, {1, 1}, {fph, fpw},
                                 {win.dh, win.dw}, p.g));
  }
  const at::Tensor go = as_batch(grad_output, s.in.batched);
  const at::Tensor wc = weight_arg.contiguous();
  const at::Tensor wt = weight_rows(wc, p, /*transposed=*/true);
  at::Tensor gi = new_gi();
  if (p.pointwise) {  // the columns are grad_input itself
    gemm_per_image(kernels, shared(wt, s.in.n), grouped(go, p, 0, s.in.n),
                   grouped(gi, p, 0, s.in.n));
    return in_format(unbatch(gi, s.in.batched));
  }
  const at::Tensor buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, go.options());
  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    const at::Tensor cols = columns_view(buffer, p, nc);
    if (p.per_image) {
      gemm_per_image(kernels, shared(wt, nc), grouped(go, p, n0, nc), cols);
    } else {
      kernels.gemm(wt, grad_output_rows(kernels, go, p, n0, nc), cols, false);
    }
    kernels.columns.col2im(cols, leading_view(gi, n0, nc), s.win, s.oh, s.ow,
                           columns_layout(p, nc));
  }
  return in_format(unbatch(gi, s.in.batched));
}

at::Tensor conv2d_grad_weight_impl(const Conv2dKernels& kernels, const at::Tensor& grad_output,
                                   const at::Tensor& input_arg, const at::Tensor& weight_arg,
                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                   c10::IntArrayRef dilation, int64_t groups) {
  const char* op = "conv2d_grad_weight";
  const auto s = check_conv2d_backward<int64_t>(op, grad_output, input_arg, weight_arg, stride,
                                                padding, dilation, groups);
  // The weight gradient's memory format follows the same rule as grad_input's.
  const at::MemoryFormat format = conv2d_output_format(input_arg, weight_arg);
  const auto in_format = [&](const at::Tensor& t) { return t.contiguous(format); };
  if (routes_to_depthwise(s)) {
    return in_format(depthwise_conv2d_grad_weight_impl(kernels.depthwise, grad_output, input_arg,
                                                       weight_arg, stride, padding, dilation));
  }
  const Conv2dEngines& engines = kernels.engines;
  if (auto gw = engine_or_pointwise(
          engines.grad_weight, engines.grad_weight_before_pointwise, input_arg, s,
          pointwise_gemm_applies(format, s),
          [&] { return engines.grad_weight(grad_output, input_arg, weight_arg, s); },
          [&] { return pointwise_conv2d_grad_weight(kernels.gemm, grad_output, input_arg, s); })) {
    return *gw;
  }
  const Plan p = make_plan(s, input_arg, Pass::kGradWeight);
  const auto dtype = input_arg.scalar_type();
  if (p.g * p.kg * p.rows_g == 0 || s.in.n == 0 || p.length == 0) {
    return at::zeros(weight_arg.sizes(), input_arg.options().memory_format(format));
  }
  // Partial products and their sum: float32 for float16/bfloat16. The sum
  // `acc` has the weight's shape, contiguous: (g, K/g, rows_g) in memory;
  // it is allocated where a route first needs it (a 16-bit gradient summed
  // from one chunk's partial products by route.sum_slices never does).
  const auto acc_options = input_arg.options().dtype(
      partial_element_size(input_arg) > input_arg.element_size() ? at::kFloat : dtype);
  const int64_t acc_bytes =
      weight_arg.numel() * c10::elementSize(acc_options.dtype().toScalarType());
  at::Tensor acc, acc_rows;
  const auto sum = [&]() -> at::Tensor& {
    if (!acc.defined()) {
      acc = at::empty(weight_arg.sizes(), acc_options);
      acc_rows = strided_view(acc, {p.g, p.kg, p.rows_g}, {p.kg * p.rows_g, p.rows_g, 1},
                              acc.storage_offset());
    }
    return acc_rows;
  };
  const at::Tensor input = as_batch(input_arg, s.in.batched);
  const at::Tensor go = as_batch(grad_output, s.in.batched);
  at::Tensor buffer;
  if (!p.pointwise) buffer = at::empty({p.g * p.rows_g * p.chunk * p.length}, input.options());
  at::Tensor partial;  // (S, g, K/g, rows_g)
  for (int64_t n0 = 0; n0 < s.in.n; n0 += p.chunk) {
    const int64_t nc = std::min(p.chunk, s.in.n - n0);
    // The previous chunk's partial products are summed: freed before this
    // chunk's are allocated, so that one chunk's are alive at a time.
    partial.reset();
    at::Tensor cols;
    if (p.pointwise) {
      cols = grouped(input, p, n0, nc);
    } else {
      cols = columns_view(buffer, p, nc);
      kernels.columns.im2col(leading_view(input, n0, nc), cols, s.win, s.oh, s.ow,
                             columns_layout(p, nc));
    }
    if (p.per_image && s.in.n == 1) {  // one image: its product is the sum
      const at::Tensor& rows = sum();
      gemm_per_image(
          kernels, grouped(go, p, 0, 1), transposed_view(cols, 2, 3),
          strided_view(rows, {1, p.g, p.kg, p.rows_g}, {acc.numel(), p.kg * p.rows_g, p.rows_g, 1},
                       acc.storage_offset()));
      continue;
    }
    if (p.per_image) {  // one partial product per image
      partial = at::empty({nc, p.g, p.kg, p.rows_g}, acc_options);
      gemm_per_image(kernels, grouped(go, p, n0, nc), transposed_view(cols, 2, 3), partial);
    } else {
      const at::Tensor go_rows = grad_output_rows(kernels, go, p, n0, nc);
      const int64_t slices = reduction_slices(kernels, p, nc, acc_bytes);
      if (slices == 1) {  // accumulate straight into the result
        kernels.gemm(go_rows, transposed_view(cols, 1, 2), sum(), n0 > 0);
        continue;
      }
      partial = at::empty({slices, p.g, p.kg, p.rows_g}, acc_options);
      sliced_weight_gemm(kernels, go_rows, cols, partial);
    }
    if (nc == s.in.n && kernels.route.sum_slices != nullptr) {
      // One chunk: the sum of its partial products is the result, rounded once.
      at::Tensor gw;
      if (acc_options.dtype() == input_arg.dtype()) {
        sum();
        gw = acc;
      } else {
        gw = at::empty(weight_arg.sizes(), input_arg.options());
      }
      kernels.route.sum_slices(partial, gw);
      return in_format(gw);
    }
    if (n0 == 0) {
      at::sum_out(sum(), partial, {0});
    } else {
      sum().add_(partial.sum(0));
    }
  }
  return in_format(acc.scalar_type() == dtype ? acc : acc.to(dtype));
}

at::Tensor conv2d_grad_bias_impl(const at::Tensor& grad_output) {
  check_dims("conv2d_grad_bias", "grad_output", grad_output, {3, 4});
  check_floating("conv2d_grad_bias", "grad_output", grad_output);
  // at::sum adds 16-bit data in float32 and rounds once, in one kernel.
  const auto dims =
      grad_output.dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{1, 2};
  return at::sum(grad_output, dims);
}

}  // namespace customconv
