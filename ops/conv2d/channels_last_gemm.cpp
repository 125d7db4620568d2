#include "ops/conv2d/channels_last_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "ops/common/launch.h"
#include "ops/common/workspace.h"

namespace customconv {
namespace {

// rows (nc*P*Q, kh*kw*C) of images [n0, n0 + nc): row (n, p, q) holds, for
// each tap (r, s) in order, the C channels of input pixel
// (p*sh - ph + r*dh, q*sw - pw + s*dw) of image n0 + n, or zeros outside.
template <typename T>
void gather_windows(const T* x, T* cols, const Conv2dShape<int64_t>& s, int64_t n0, int64_t nc) {
  const Window2d& w = s.win;
  const int64_t c = s.in.c, h = s.in.h, wd = s.in.w;
  const int64_t row_len = w.kh * w.kw * c;
  const int64_t rows = nc * s.oh * s.ow;
  at::parallel_for(0, rows, grain_for(row_len), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const int64_t q = m % s.ow, p = (m / s.ow) % s.oh, n = n0 + m / (s.ow * s.oh);
      T* dst = cols + m * row_len;
      for (int64_t r = 0; r < w.kh; ++r) {
        const int64_t iy = p * w.sh - w.ph + r * w.dh;
        for (int64_t t = 0; t < w.kw; ++t, dst += c) {
          const int64_t ix = q * w.sw - w.pw + t * w.dw;
          if (iy < 0 || iy >= h || ix < 0 || ix >= wd) {
            std::memset(dst, 0, c * sizeof(T));
          } else {
            std::memcpy(dst, x + ((n * h + iy) * wd + ix) * c, c * sizeof(T));
          }
        }
      }
    }
  });
}

// The input gradient of images [n0, n0 + nc), channels_last, from their
// columns (nc*P*Q, kh*kw*C): grad_output's rows times the (K, kh*kw*C)
// weight. Input pixel (iy, ix) gets the sum, over the output positions (p, q)
// and taps (r, t) with iy = p*sh - ph + r*dh and ix = q*sw - pw + t*dw, of
// tap (r, t)'s run of C channels in row (p, q): the transpose of
// gather_windows, written as a gather so that a thread owns each pixel it
// writes. Threads take whole input rows (n, iy); the channel loop is the
// vectorized one.
template <typename T>
void sum_windows(const T* cols, T* gx, const Conv2dShape<int64_t>& s, int64_t n0, int64_t nc) {
  const Window2d& w = s.win;
  const int64_t c = s.in.c, h = s.in.h, wd = s.in.w;
  const int64_t row_len = w.kh * w.kw * c;
  at::parallel_for(0, nc * h, grain_for(wd * c * w.kh), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const int64_t n = m / h, iy = m % h;
      T* dst_row = gx + ((n0 + n) * h + iy) * wd * c;
      std::fill(dst_row, dst_row + wd * c, T(0));
      for (int64_t r = 0; r < w.kh; ++r) {
        const int64_t py = iy + w.ph - r * w.dh;
        if (py < 0 || py % w.sh != 0 || py / w.sh >= s.oh) continue;
        const T* src_row = cols + (n * s.oh + py / w.sh) * s.ow * row_len + r * w.kw * c;
        for (int64_t ix = 0; ix < wd; ++ix) {
          T* __restrict__ dst = dst_row + ix * c;
          for (int64_t t = 0; t < w.kw; ++t) {
            const int64_t qx = ix + w.pw - t * w.dw;
            if (qx < 0 || qx % w.sw != 0 || qx / w.sw >= s.ow) continue;
            const T* __restrict__ src = src_row + (qx / w.sw) * row_len + t * c;
            for (int64_t k = 0; k < c; ++k) dst[k] += src[k];
          }
        }
      }
    }
  });
}

// Whether the route takes the case: float32/float64, batched, groups 1, a
// channels_last input; not pointwise (pointwise_gemm.h's) and 16 channels or
// more. Fewer channels make the gathered runs too short to copy well (the
// 3-channel 7x7 stem at N4, 224^2 on a 2-core machine: 15.4 ms this way, 12.0
// by the column route): the column route takes those.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const auto dtype = input.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble) return false;
  if (!s.in.batched || s.groups != 1 || s.in.c < 16) return false;
  if (!input.is_contiguous(at::MemoryFormat::ChannelsLast)) return false;
  return !s.win.pointwise();
}

// Calls fn(cols, n0, nc) for each chunk of images [n0, n0 + nc), cols being
// their gathered windows (nc*P*Q, kh*kw*C); chunks keep the columns within
// workspace_limit_bytes() (at least one image).
template <typename Fn>
void for_each_chunk(const at::Tensor& input, const Conv2dShape<int64_t>& s, Fn fn) {
  const int64_t positions = s.oh * s.ow;
  const int64_t row_len = s.win.kh * s.win.kw * s.in.c;
  const int64_t image_bytes =
      checked_mul("conv2d", "the columns of one image", positions, row_len * input.element_size());
  const int64_t chunk = images_per_chunk(s.in.n, image_bytes, input.device().type());
  const at::Tensor cols = at::empty({chunk * positions, row_len}, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "conv2d_channels_last_gemm", [&] {
    for (int64_t n0 = 0; n0 < s.in.n; n0 += chunk) {
      const int64_t nc = std::min(chunk, s.in.n - n0);
      gather_windows<scalar_t>(input.const_data_ptr<scalar_t>(), cols.mutable_data_ptr<scalar_t>(),
                               s, n0, nc);
      fn(cols.narrow(0, 0, nc * positions), n0, nc);
    }
  });
}



// Stride 1 on planes whose padding adds at most a fifth: the padded input of a
// chunk of images, as (nc*Hp*Wp, C) rows, times each tap's (C, K) weight,
// shifted by that tap's offset (r*dh*Wp + s*dw rows), accumulates into an
// output grid over every padded position; the grid's top-left P x Q corner
// of each image is the output. No gathered copy of the windows: each GEMM
// reads the padded input in place. (Measured on a 2-core machine, N=8, 3x3,
// float32: 12.8 ms against 55.9 by gathering for 64 channels on 56x56; at
// 14x14 the two are level, at 7x7 the grid's overhead loses.)
bool shifted_taps_pay(const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  if (w.sh != 1 || w.sw != 1) return false;
  const int64_t hp = s.in.h + 2 * w.ph, wp = s.in.w + 2 * w.pw;
  return 5 * hp * wp <= 6 * s.oh * s.ow;
}

// The shifted-tap route's geometry: the padded plane (hp x wp positions), the
// grid rows a chunk's GEMMs cover (those of every output position: all but the
// last tap's offset, max_offset), and the images per chunk, whose padded input
// and grid rows stay within workspace_limit_bytes().
struct ShiftedGrid {
  int64_t hp, wp, plane, max_offset, chunk;

  ShiftedGrid(const at::Tensor& input, const Conv2dShape<int64_t>& s, const char* op) {
    const Window2d& w = s.win;
    hp = s.in.h + 2 * w.ph, wp = s.in.w + 2 * w.pw, plane = hp * wp;
    max_offset = w.dh * (w.kh - 1) * wp + w.dw * (w.kw - 1);
    chunk = images_per_chunk(s.in.n,
                             checked_mul(op, "the padded plane of one image", plane,
                                         (s.in.c + s.k) * input.element_size()),
                             input.device().type());
  }
  // Images [n0, n0 + nc) of `input`, zero-padded, as (nc*hp*wp, C) rows.
  static at::Tensor padded_rows(const at::Tensor& input, const Window2d& w, int64_t n0, int64_t nc) {
    return channels_last_rows(at::constant_pad_nd(input.narrow(0, n0, nc), {w.pw, w.pw, w.ph, w.ph})
                                  .contiguous(at::MemoryFormat::ChannelsLast));
  }
  // Row offset of tap (r, t) in the padded rows.
  int64_t offset(const Window2d& w, int64_t r, int64_t t) const { return r * w.dh * wp + t * w.dw; }
  // The (nc, hp, wp, K) grid's output corner (nc, P, Q, K).
  at::Tensor corner(const at::Tensor& grid_buffer, const Conv2dShape<int64_t>& s, int64_t nc) const {
    return grid_buffer.narrow(0, 0, nc * plane).view({nc, hp, wp, s.k}).narrow(1, 0, s.oh).narrow(2, 0, s.ow);
  }
};

void shifted_taps_forward(const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias, const Conv2dShape<int64_t>& s,
                          const at::Tensor& out) {
  const Window2d& w = s.win;
  const ShiftedGrid g(input, s, "conv2d");
  // (kh, kw, C, K): each tap's weight a contiguous (C, K) matrix.
  const at::Tensor taps = weight.permute({2, 3, 1, 0}).contiguous();
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor grid_buffer = at::empty({g.chunk * g.plane, s.k}, input.options());
  for (int64_t n0 = 0; n0 < s.in.n; n0 += g.chunk) {
    const int64_t nc = std::min(g.chunk, s.in.n - n0);
    const at::Tensor rows = ShiftedGrid::padded_rows(input, w, n0, nc);
    const int64_t m = nc * g.plane - g.max_offset;
    at::Tensor grid = grid_buffer.narrow(0, 0, m);
    for (int64_t r = 0; r < w.kh; ++r) {
      for (int64_t t = 0; t < w.kw; ++t) {
        const at::Tensor a = rows.narrow(0, g.offset(w, r, t), m);
        const at::Tensor b = taps[r][t];
        if (r > 0 || t > 0) {
          grid.addmm_(a, b);
        } else if (has_bias) {
          at::addmm_out(grid, *bias, a, b);
        } else {
          at::mm_out(grid, a, b);
        }
      }
    }
    out.permute({0, 2, 3, 1}).narrow(0, n0, nc).copy_(g.corner(grid_buffer, s, nc));
  }
}

// The weight gradient of the same layers, the forward's transpose: grad_output
// placed on the zero grid over every padded position (its P x Q corner per
// image), and each tap's (K, C) gradient the grid's rows, transposed, times the
// padded input's rows shifted by that tap's offset, accumulated over the
// chunks in order. No gathered copy of the windows. Returns the (K, C, kh, kw)
// gradient, channels_last.
at::Tensor shifted_taps_grad_weight(const at::Tensor& grad_output, const at::Tensor& input,
                                    const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  const ShiftedGrid g(input, s, "conv2d_grad_weight");
  // (kh, kw, K, C): each tap's gradient a contiguous (K, C) matrix.
  const at::Tensor taps = at::empty({w.kh, w.kw, s.k, s.in.c}, input.options());
  const at::Tensor grid_buffer = at::zeros({g.chunk * g.plane, s.k}, input.options());
  // grad_output (N, K, P, Q) channels_last as (N, P, Q, K).
  const at::Tensor go = grad_output.permute({0, 2, 3, 1});
  for (int64_t n0 = 0; n0 < s.in.n; n0 += g.chunk) {
    const int64_t nc = std::min(g.chunk, s.in.n - n0);
    const at::Tensor rows = ShiftedGrid::padded_rows(input, w, n0, nc);
    // The corner is rewritten per chunk; the rest of the grid stays zero.
    g.corner(grid_buffer, s, nc).copy_(go.narrow(0, n0, nc));
    const int64_t m = nc * g.plane - g.max_offset;
    const at::Tensor grid_t = grid_buffer.narrow(0, 0, m).t();  // (K, m)
    for (int64_t r = 0; r < w.kh; ++r) {
      for (int64_t t = 0; t < w.kw; ++t) {
        const at::Tensor b = rows.narrow(0, g.offset(w, r, t), m);
        at::Tensor tap = taps[r][t];
        if (n0 == 0) {
          at::mm_out(tap, grid_t, b);
        } else {
          tap.addmm_(grid_t, b);
        }
      }
    }
  }
  at::Tensor gw = at::empty({s.k, s.in.c, w.kh, w.kw},
                            input.options().memory_format(at::MemoryFormat::ChannelsLast));
  gw.copy_(taps.permute({2, 3, 0, 1}));
  return gw;
}

}  // namespace

std::optional<at::Tensor> channels_last_gemm_conv2d(const at::Tensor& input,
                                                    const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias,
                                                    const Conv2dShape<int64_t>& s) {
  if (!takes(input, s)) return std::nullopt;
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out;
  if (shifted_taps_pay(s)) {
    shifted_taps_forward(input, weight, bias, s, out);
    return out;
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const int64_t positions = s.oh * s.ow;
  const int64_t row_len = s.win.kh * s.win.kw * s.in.c;
  // (K, kh*kw*C): the weight with channels innermost, as the columns hold them.
  const at::Tensor wt = weight.permute({0, 2, 3, 1}).reshape({s.k, row_len}).t();
  const at::Tensor out_rows = channels_last_rows(out);
  for_each_chunk(input, s, [&](const at::Tensor& cols, int64_t n0, int64_t nc) {
    at::Tensor y = out_rows.narrow(0, n0 * positions, nc * positions);
    if (has_bias) {
      at::addmm_out(y, *bias, cols, wt);
    } else {
      at::mm_out(y, cols, wt);
    }
  });
  return out;
}

std::optional<at::Tensor> channels_last_gemm_conv2d_grad_weight(const at::Tensor& grad_output,
                                                                const at::Tensor& input,
                                                                const at::Tensor& weight,
                                                                const Conv2dShape<int64_t>& s) {
  if (!takes(input, s) || s.in.n * s.oh * s.ow == 0 || s.k == 0) return std::nullopt;
  const at::Tensor go_cl = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  if (shifted_taps_pay(s)) return shifted_taps_grad_weight(go_cl, input, s);
  const int64_t positions = s.oh * s.ow;
  const at::Tensor go_rows = channels_last_rows(go_cl);
  // (K, kh*kw*C), accumulated over the chunks in order: (K, kh, kw, C) in memory.
  at::Tensor acc = at::empty({s.k, s.win.kh * s.win.kw * s.in.c}, input.options());
  for_each_chunk(input, s, [&](const at::Tensor& cols, int64_t n0, int64_t nc) {
    const at::Tensor go = go_rows.narrow(0, n0 * positions, nc * positions).t();
    if (n0 == 0) {
      at::mm_out(acc, go, cols);
    } else {
      acc.addmm_(go, cols);
    }
  });
  return acc.view({s.k, s.win.kh, s.win.kw, s.in.c}).permute({0, 3, 1, 2});
}

std::optional<at::Tensor> channels_last_gemm_conv2d_grad_input(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& weight,
                                                               const Conv2dShape<int64_t>& s) {
  if (!takes(input, s)) return std::nullopt;
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  if (gi.numel() == 0) return gi;
  const int64_t positions = s.oh * s.ow;
  if (positions == 0 || s.k == 0) return gi.zero_();
  const int64_t row_len = s.win.kh * s.win.kw * s.in.c;
  const at::Tensor go_rows =
      channels_last_rows(grad_output.contiguous(at::MemoryFormat::ChannelsLast));
  // (K, kh*kw*C): the weight with channels innermost, as the columns hold them.
  const at::Tensor wt = weight.permute({0, 2, 3, 1}).reshape({s.k, row_len});
  const int64_t image_bytes = checked_mul("conv2d_grad_input", "the columns of one image", positions,
                                          row_len * input.element_size());
  const int64_t chunk = images_per_chunk(s.in.n, image_bytes, input.device().type());
  const at::Tensor cols = at::empty({chunk * positions, row_len}, input.options());
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "conv2d_grad_input_channels_last_gemm", [&] {
    for (int64_t n0 = 0; n0 < s.in.n; n0 += chunk) {
      const int64_t nc = std::min(chunk, s.in.n - n0);
      at::Tensor part = cols.narrow(0, 0, nc * positions);
      at::mm_out(part, go_rows.narrow(0, n0 * positions, nc * positions), wt);
      sum_windows<scalar_t>(part.const_data_ptr<scalar_t>(), gi.mutable_data_ptr<scalar_t>(), s, n0,
                            nc);
    }
  });
  return gi;
}

}  // namespace customconv
