#include "ops/conv2d/few_channels_direct_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/common/cpu_simd.h"
#include "ops/common/launch.h"
#include "ops/common/parallel_cpu.h"
#include "ops/conv2d/weight_blocks_cpu.h"

namespace customconv {
namespace {

constexpr int64_t kMaxChannels = 15;  // input channels the route takes, at most

struct Geometry {
  int64_t n, c, h, w, k, p, q;  // input (n, c, h, w), output (n, k, p, q)
  int64_t xn, xc, xh, xw;       // the input's strides, in floats
  Window2d win;
  int64_t block;    // output channels per weight block (B)
  int64_t kp;       // output channels padded to whole blocks
  bool nchw_out;    // the result is NCHW (else channels_last)
};

// The window rows of output row y that lie inside the image: [i0, i1).
struct TapRange {
  int64_t i0, i1;
};
inline TapRange rows_inside(const Geometry& g, int64_t y) {
  const Window2d& k = g.win;
  const int64_t iy0 = y * k.sh - k.ph;
  const int64_t i0 = iy0 >= 0 ? 0 : (-iy0 + k.dh - 1) / k.dh;
  const int64_t last = g.h - 1 - iy0;  // the last window row inside is i <= last / dh
  const int64_t i1 = last < 0 ? 0 : std::min(k.kh, last / k.dh + 1);
  return {i0, std::max(i0, i1)};
}
// The same for the window columns of output column x.
inline TapRange cols_inside(const Geometry& g, int64_t x) {
  const Window2d& k = g.win;
  const int64_t ix0 = x * k.sw - k.pw;
  const int64_t j0 = ix0 >= 0 ? 0 : (-ix0 + k.dw - 1) / k.dw;
  const int64_t last = g.w - 1 - ix0;
  const int64_t j1 = last < 0 ? 0 : std::min(k.kw, last / k.dw + 1);
  return {j0, std::max(j0, j1)};
}

// What one row's blocks share: the image, the window rows inside it, the
// (column, channel) offsets of a window row and the positions' spacing.
struct RowArgs {
  const float* img;      // the image's first element
  const int64_t* offs;   // offs[j * C + c]: input offset of window column j, channel c
  int64_t row_step;      // input offset between window rows (dh * the row stride)
  int64_t pos_step;      // input offset between neighbouring output positions
  int64_t taps_per_row;  // kw * C
  TapRange rows;
};

// P output positions x0..x0+P-1 (input offsets origin + t * pos_step of
// their windows' top-left corners) x NV vectors of W output channels: P * NV
// accumulators, started from the bias. For each window row inside the image
// and each (column j, channel c) of it in [e0, e1) (e = j * C + c: the columns
// inside the image are one range), the P input values are each broadcast and
// multiplied by the NV weight vectors of that tap, read from wt: (kh, kw, C,
// WS floats) with the block's channels first. The P results go to dst + t *
// dst_step; lanes past `valid` are not stored.
template <class V, int NV, int P, int WS>
__attribute__((always_inline)) inline void window_block(const RowArgs& a, int64_t origin,
                                                        int64_t e0, int64_t e1, const float* wt,
                                                        const float* bias, float* dst,
                                                        int64_t dst_step, int64_t valid) {
  constexpr int W = kLanes<V>;
  V acc[P][NV];
  for (int v = 0; v < NV; ++v) {
    const V b = loadv<V>(bias + v * W);
    for (int t = 0; t < P; ++t) acc[t][v] = b;
  }
  for (int64_t i = a.rows.i0; i < a.rows.i1; ++i) {
    const int64_t o = origin + i * a.row_step;
    const float* w = wt + i * a.taps_per_row * WS;
    for (int64_t e = e0; e < e1; ++e) {
      V wv[NV];
      for (int v = 0; v < NV; ++v) wv[v] = loadv<V>(w + e * WS + v * W);
      const float* x = a.img + (o + a.offs[e]);
      for (int t = 0; t < P; ++t) {
        const float b = x[t * a.pos_step];  // a scalar: one broadcast from memory
        for (int v = 0; v < NV; ++v) acc[t][v] += wv[v] * b;
      }
    }
  }
  for (int t = 0; t < P; ++t) {
    float* d = dst + t * dst_step;
    store_lanes<V, NV>(d, acc[t], valid);
  }
}

// Output row y of one image for the block of output channels [k0, k0 + NV * W)
// (weights wt, bias padded): positions whose windows lie inside the row's
// columns in blocks of P, then one at a time; those crossing the left or right
// edge one at a time over their columns inside. The output lines of the next
// block are prefetched for writing (a store that misses the cache stalls the
// blocks otherwise: the N=4 stem 4.6 -> 4.4 ms).
template <class V, int NV, int P, int WS>
__attribute__((always_inline)) inline void row_block(const Geometry& g, const RowArgs& a,
                                                     int64_t y, const float* wt, const float* bias,
                                                     float* orow, int64_t ostep, int64_t valid) {
  const Window2d& k = g.win;
  const int64_t x_lo = std::min(g.q, (k.pw + k.sw - 1) / k.sw);  // first column inside
  const int64_t right = g.w - 1 + k.pw - (k.kw - 1) * k.dw;      // x * sw <= right: inside
  const int64_t x_hi = right < 0 ? x_lo : std::max(x_lo, std::min(g.q, right / k.sw + 1));
  const int64_t full = k.kw * g.c;
  const int64_t row_origin = (y * k.sh - k.ph) * g.xh;
  const auto origin = [&](int64_t x) { return row_origin + (x * k.sw - k.pw) * g.xw; };
  const auto edge = [&](int64_t x) {
    const TapRange j = cols_inside(g, x);
    window_block<V, NV, 1, WS>(a, origin(x), j.i0 * g.c, j.i1 * g.c, wt, bias, orow + x * ostep,
                               ostep, valid);
  };
  for (int64_t x = 0; x < x_lo; ++x) edge(x);
  int64_t x = x_lo;
  for (; x + P <= x_hi; x += P) {
    if (x + 2 * P <= x_hi) {  // the next block's output lines, for writing
      for (int t = 0; t < P; ++t) {
        const float* d = orow + (x + P + t) * ostep;
        for (int v = 0; v < NV * kLanes<V>; v += 16) __builtin_prefetch(d + v, 1, 3);
      }
    }
    window_block<V, NV, P, WS>(a, origin(x), 0, full, wt, bias, orow + x * ostep, ostep, valid);
  }
  for (; x < x_hi; ++x) {
    window_block<V, NV, 1, WS>(a, origin(x), 0, full, wt, bias, orow + x * ostep, ostep, valid);
  }
  for (x = x_hi; x < g.q; ++x) edge(x);
}

// A finished output row, (q, kp) channels_last in `buffer`, into row y of
// the K planes of an NCHW image (dst: that row of plane 0): W x W tiles
// transposed in registers, the last q % W columns one at a time.
template <class V>
__attribute__((always_inline)) inline void transpose_row(const float* buffer, const Geometry& g,
                                                         float* dst) {
  constexpr int W = kLanes<V>;
  const int64_t plane = g.p * g.q;
  int64_t x = 0;
  for (; x + W <= g.q; x += W) {
    for (int64_t k0 = 0; k0 < g.k; k0 += W) {
      V rows[W];
      for (int r = 0; r < W; ++r) rows[r] = loadv<V>(buffer + (x + r) * g.kp + k0);
      transpose_tile(rows);
      const int64_t kn = std::min<int64_t>(W, g.k - k0);
      for (int64_t r = 0; r < kn; ++r) storev(dst + (k0 + r) * plane + x, rows[r]);
    }
  }
  for (; x < g.q; ++x) {
    for (int64_t kk = 0; kk < g.k; ++kk) dst[kk * plane + x] = buffer[x * g.kp + kk];
  }
}

// Output rows [r0, r1) (r = n * p + y), every block of output channels. The
// weight is (kp / B, kh, kw, C, B), B = NVMAX * W; `buffer` (q * kp floats)
// holds a row on its way to an NCHW result.
template <class V, int NVMAX, int P>
__attribute__((always_inline)) inline void forward_rows(const float* in, const float* wt,
                                                        const float* bias, const int64_t* offs,
                                                        float* out, float* buffer,
                                                        const Geometry& g, int64_t r0,
                                                        int64_t r1) {
  constexpr int W = kLanes<V>, B = NVMAX * W;
  const Window2d& k = g.win;
  const int64_t block_floats = k.kh * k.kw * g.c * B;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.p, y = r % g.p;
    const RowArgs a{in + n * g.xn, offs, k.dh * g.xh, k.sw * g.xw, k.kw * g.c, rows_inside(g, y)};
    float* orow = g.nchw_out ? buffer : out + r * g.q * g.k;
    const int64_t ostep = g.nchw_out ? g.kp : g.k;
    for (int64_t k0 = 0; k0 < g.k; k0 += B) {
      const int64_t valid = g.nchw_out ? B : std::min<int64_t>(B, g.k - k0);
      const float* wb = wt + (k0 / B) * block_floats;
      const int64_t vectors = (std::min<int64_t>(B, g.k - k0) + W - 1) / W;
      float* o = orow + k0;
      if (vectors >= NVMAX) {
        row_block<V, NVMAX, P, B>(g, a, y, wb, bias + k0, o, ostep, valid);
      } else if constexpr (NVMAX > 1) {
        // The last block, where K is not a multiple of B: its vectors only.
        switch (vectors) {
          case 1: row_block<V, 1, P, B>(g, a, y, wb, bias + k0, o, ostep, valid); break;
          case 2:
            if constexpr (NVMAX > 2) row_block<V, 2, P, B>(g, a, y, wb, bias + k0, o, ostep, valid);
            break;
          default:
            if constexpr (NVMAX > 3) row_block<V, 3, P, B>(g, a, y, wb, bias + k0, o, ostep, valid);
            break;
        }
      }
    }
    if (g.nchw_out) transpose_row<V>(buffer, g, out + n * g.k * g.p * g.q + y * g.q);
  }
}

// One build of forward_rows per instruction set, picked at run time.
using ForwardRows = void (*)(const float*, const float*, const float*, const int64_t*, float*,
                             float*, const Geometry&, int64_t, int64_t);
struct ForwardIsa {
  ForwardRows run;
  int64_t block;  // output channels per weight block
};

void forward_rows_base(const float* in, const float* wt, const float* bias, const int64_t* offs,
                       float* out, float* buffer, const Geometry& g, int64_t r0, int64_t r1) {
  forward_rows<Float8, 1, 4>(in, wt, bias, offs, out, buffer, g, r0, r1);
}
#if CUSTOMCONV_CPU_ISA_BUILDS
__attribute__((target("arch=x86-64-v3"))) void forward_rows_v3(
    const float* in, const float* wt, const float* bias, const int64_t* offs, float* out,
    float* buffer, const Geometry& g, int64_t r0, int64_t r1) {
  forward_rows<Float8, 2, 6>(in, wt, bias, offs, out, buffer, g, r0, r1);
}
__attribute__((target("arch=x86-64-v4"))) void forward_rows_v4(
    const float* in, const float* wt, const float* bias, const int64_t* offs, float* out,
    float* buffer, const Geometry& g, int64_t r0, int64_t r1) {
  forward_rows<Float16, 4, 6>(in, wt, bias, offs, out, buffer, g, r0, r1);
}
// The narrow build's block: layers of at most 16 output channels (tiny
// layers, the 3-channel input gradient of a stem) on AVX-512 take one
// 16-lane vector a block rather than padding their weight, bias and row
// buffer to 64 channels.
__attribute__((target("arch=x86-64-v4"))) void forward_rows_v4_narrow(
    const float* in, const float* wt, const float* bias, const int64_t* offs, float* out,
    float* buffer, const Geometry& g, int64_t r0, int64_t r1) {
  forward_rows<Float16, 1, 6>(in, wt, bias, offs, out, buffer, g, r0, r1);
}
#endif

ForwardIsa forward_isa(int64_t k) {
  switch (cpu_isa()) {
#if CUSTOMCONV_CPU_ISA_BUILDS
    case CpuIsa::kX86_64_V4:
      return k <= 16 ? ForwardIsa{&forward_rows_v4_narrow, 16} : ForwardIsa{&forward_rows_v4, 64};
    case CpuIsa::kX86_64_V3: return {&forward_rows_v3, 16};
#endif
    default: return {&forward_rows_base, 8};
  }
}

bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return input.device().type() == at::kCPU && input.scalar_type() == at::kFloat &&
         s.in.batched && s.groups == 1 && s.in.c >= 1 && s.in.c <= kMaxChannels;
}

// The forward of `input` with the weight already in blocks (wt: (kp / B, kh,
// kw, C, B), B = isa.block), the result in `format`.
at::Tensor forward_packed(const at::Tensor& input, const at::Tensor& wt, const ForwardIsa& isa,
                          const std::optional<at::Tensor>& bias, const Conv2dShape<int64_t>& s,
                          at::MemoryFormat format) {
  const bool nchw_out = format != at::MemoryFormat::ChannelsLast;
  at::Tensor out = nchw_out ? at::empty({s.in.n, s.k, s.oh, s.ow}, input.options())
                            : empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out;
  const Window2d& win = s.win;
  const int64_t b = isa.block, kp = (s.k + b - 1) / b * b;
  // The bias padded to whole blocks (a vector, not three ATen ops a call).
  std::vector<float> bp(static_cast<size_t>(kp), 0.f);
  if (bias.has_value() && bias->defined()) {
    const at::Tensor bc = bias->contiguous();
    std::copy(bc.const_data_ptr<float>(), bc.const_data_ptr<float>() + s.k, bp.begin());
  }
  const Geometry g{s.in.n, s.in.c, s.in.h, s.in.w, s.k, s.oh, s.ow,
                   input.stride(0), input.stride(1), input.stride(2), input.stride(3),
                   win, b, kp, nchw_out};
  std::vector<int64_t> offs(static_cast<size_t>(win.kw * s.in.c));
  for (int64_t j = 0; j < win.kw; ++j) {
    for (int64_t c = 0; c < s.in.c; ++c) offs[j * s.in.c + c] = j * win.dw * g.xw + c * g.xc;
  }
  const float* ip = input.const_data_ptr<float>();
  const float* wp = wt.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t rows = s.in.n * s.oh;
  const int64_t row_work = win.kh * win.kw * s.in.c * s.ow * kp;
  const auto run = [&](int64_t r0, int64_t r1) {
    std::vector<float> buffer(nchw_out ? static_cast<size_t>(s.ow * kp) : 0);
    isa.run(ip, wp, bp.data(), offs.data(), op, buffer.data(), g, r0, r1);
  };
  parallel_range_sized(rows, grain_for(row_work), rows * row_work, run);
  return out;
}

}  // namespace

std::optional<at::Tensor> few_channels_direct_conv2d_cpu(const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         const Conv2dShape<int64_t>& s) {
  if (!takes(input, s)) return std::nullopt;
  const ForwardIsa isa = forward_isa(s.k);
  return forward_packed(input, weight_blocks_cpu(weight, isa.block), isa, bias, s,
                        conv2d_output_format(input, weight));
}

std::optional<at::Tensor> few_channels_direct_conv2d_grad_input_cpu(const at::Tensor& grad_output,
                                                                    const at::Tensor& input,
                                                                    const at::Tensor& weight,
                                                                    const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  const bool full_padding = w.dh * (w.kh - 1) >= w.ph && w.dw * (w.kw - 1) >= w.pw;
  if (w.sh != 1 || w.sw != 1 || !full_padding || grad_output.dim() != 4) return std::nullopt;
  // The forward of grad_output (K channels, oh x ow) with the rotated weight:
  // stride 1, the full correlation's padding, C output channels.
  Conv2dShape<int64_t> t = s;
  t.in.c = s.k, t.in.h = s.oh, t.in.w = s.ow;
  t.k = s.in.c, t.oh = s.in.h, t.ow = s.in.w;
  t.win.ph = w.dh * (w.kh - 1) - w.ph, t.win.pw = w.dw * (w.kw - 1) - w.pw;
  if (!takes(grad_output, t)) return std::nullopt;
  const ForwardIsa isa = forward_isa(t.k);
  return forward_packed(grad_output, rotated_weight_blocks_cpu(weight, isa.block), isa,
                        std::nullopt, t, conv2d_output_format(input, weight));
}

}  // namespace customconv
