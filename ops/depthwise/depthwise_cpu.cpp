#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/common/cpu_simd.h"
#include "ops/common/launch.h"
#include "ops/common/parallel_cpu.h"
#include "ops/depthwise/activation_cpu.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {
namespace {

template <Activation A>
__attribute__((always_inline)) inline void activate_loop(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = activate<float>(A, p[i]);
}

}  // namespace

CUSTOMCONV_CPU_CLONES
void activate_floats(Activation a, float* p, int64_t n) {
  switch (a) {
    case Activation::kIdentity: return;
    case Activation::kRelu: return activate_loop<Activation::kRelu>(p, n);
    case Activation::kRelu6: return activate_loop<Activation::kRelu6>(p, n);
    case Activation::kSilu: return activate_loop<Activation::kSilu>(p, n);
    case Activation::kHardswish: return activate_loop<Activation::kHardswish>(p, n);
    case Activation::kGelu: return activate_loop<Activation::kGelu>(p, n);
    case Activation::kSigmoid: return activate_loop<Activation::kSigmoid>(p, n);
  }
}

namespace {

// Geometry of one call in plain integers.
struct Dims {
  int64_t n, c, h, w, mult, oh, ow;
  int64_t k() const { return c * mult; }
};

// The output columns x whose input column x*stride + offset lies in [0, w).
struct XRange {
  int64_t lo, hi;
};
XRange valid_x(int64_t offset, int64_t stride, int64_t w, int64_t ow) {
  const int64_t lo = offset >= 0 ? 0 : (-offset - 1) / stride + 1;  // no overflow for any stride
  const int64_t hi = w - 1 - offset >= 0 ? std::min(ow, (w - 1 - offset) / stride + 1) : 0;
  return {lo, std::max(lo, hi)};
}

// Whether the float32 paths below may copy a plane zero-padded: their copy
// of rows x pitch floats, rows = (oh - 1) * sh + (kh - 1) * dh + 1 and pitch =
// (ow rounded up to 16 - 1) * sw + (kw - 1) * dw + 9, stays within a small
// multiple of the planes it is made from and read into (`in_plane`, `oh` x
// `ow`). Geometries with far larger padding, dilation or stride (where most
// taps fall outside the input) take the direct loops, which never form it.
bool padded_copy_fits(const Window2d& k, int64_t oh, int64_t ow, int64_t in_plane) {
  const double rows = double(oh - 1) * double(k.sh) + double(k.kh - 1) * double(k.dh) + 1;
  const double pitch =
      double((ow + 15) / 16 * 16 - 1) * double(k.sw) + double(k.kw - 1) * double(k.dw) + 9;
  return rows * pitch <= 4.0 * double(in_plane + (ow + 15) / 16 * 16 * oh) + double(1 << 16);
}

__attribute__((always_inline)) inline Float8 load8_strided(const float* p, int64_t stride) {
  Float8 v;
  for (int l = 0; l < 8; ++l) v[l] = p[l * stride];
  return v;
}
// The even-indexed of 16 consecutive floats.
__attribute__((always_inline)) inline Float8 load8_even(const float* p) {
  typedef int Int8 __attribute__((vector_size(32)));
  return __builtin_shuffle(load8(p), load8(p + 8), Int8{0, 2, 4, 6, 8, 10, 12, 14});
}

// Output row y of a correlation over a zero-padded plane P (row pitch pw_):
// 16 outputs per block, accumulated in two 8-wide vector registers. With K > 0
// (a K x K kernel, horizontal stride S of 1 or 2, dilation 1) every tap is
// unrolled; stride 2 reads 16 consecutive inputs and keeps the even ones.
template <int K, int S>
__attribute__((always_inline)) inline void padded_row_f32(const float* P, int64_t pitch,
                                                          const float* taps, const Window2d& k,
                                                          int64_t y, int64_t ow, float bias,
                                                          bool add, float* dst) {
  for (int64_t x = 0; x < ow; x += 16) {
    Float8 acc0 = bias - Float8{}, acc1 = acc0;
    if constexpr (K > 0) {
#pragma GCC unroll 8
      for (int i = 0; i < K; ++i) {
        const float* src = P + (y * k.sh + i * k.dh) * pitch + x * S;
#pragma GCC unroll 16
        for (int j = 0; j < K; ++j) {
          const float t = taps[i * K + j];
          if constexpr (S == 1) {
            acc0 += t * load8(src + j);
            acc1 += t * load8(src + j + 8);
          } else {
            acc0 += t * load8_even(src + j);
            acc1 += t * load8_even(src + j + 16);
          }
        }
      }
    } else {
      for (int64_t i = 0; i < k.kh; ++i) {
        const float* src = P + (y * k.sh + i * k.dh) * pitch + x * k.sw;
        for (int64_t j = 0; j < k.kw; ++j) {
          const float t = taps[i * k.kw + j];
          const float* s = src + j * k.dw;
          if (k.sw == 1) {
            acc0 += t * load8(s);
            acc1 += t * load8(s + 8);
          } else {
            acc0 += t * load8_strided(s, k.sw);
            acc1 += t * load8_strided(s + 8 * k.sw, k.sw);
          }
        }
      }
    }
    if (x + 16 <= ow) {
      if (add) {
        acc0 += load8(dst + x);
        acc1 += load8(dst + x + 8);
      }
      store8(dst + x, acc0);
      store8(dst + x + 8, acc1);
      continue;
    }
    float out[16];  // the last, partial block
    store8(out, acc0);
    store8(out + 8, acc1);
    for (int64_t e = 0; x + e < ow; ++e) dst[x + e] = add ? dst[x + e] + out[e] : out[e];
  }
}

// Output rows y and y + 1 at once for a fixed K x K kernel at stride S: four
// independent accumulators (two rows x two vectors) keep the FMA units busy
// where one row's two dependency chains would wait on FMA latency.
template <int K, int S>
__attribute__((always_inline)) inline void padded_rows2_f32(const float* P, int64_t pitch,
                                                            const float* taps, const Window2d& k,
                                                            int64_t y, int64_t ow, float bias,
                                                            bool add, float* dst) {
  for (int64_t x = 0; x < ow; x += 16) {
    Float8 a00 = bias - Float8{}, a01 = a00, a10 = a00, a11 = a00;
#pragma GCC unroll 16
    for (int i = 0; i < K; ++i) {
      const float* s0 = P + (y * k.sh + i * k.dh) * pitch + x * S;
      const float* s1 = s0 + k.sh * pitch;
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j) {
        const float t = taps[i * K + j];
        if constexpr (S == 1) {
          a00 += t * load8(s0 + j);
          a01 += t * load8(s0 + j + 8);
          a10 += t * load8(s1 + j);
          a11 += t * load8(s1 + j + 8);
        } else {
          a00 += t * load8_even(s0 + j);
          a01 += t * load8_even(s0 + j + 16);
          a10 += t * load8_even(s1 + j);
          a11 += t * load8_even(s1 + j + 16);
        }
      }
    }
    float* d0 = dst + y * ow + x;
    float* d1 = d0 + ow;
    if (x + 16 <= ow) {
      if (add) {
        a00 += load8(d0), a01 += load8(d0 + 8), a10 += load8(d1), a11 += load8(d1 + 8);
      }
      store8(d0, a00), store8(d0 + 8, a01), store8(d1, a10), store8(d1 + 8, a11);
      continue;
    }
    float out[2][16];  // the last, partial block
    store8(out[0], a00), store8(out[0] + 8, a01), store8(out[1], a10), store8(out[1] + 8, a11);
    for (int64_t e = 0; x + e < ow; ++e) {
      d0[e] = add ? d0[e] + out[0][e] : out[0][e];
      d1[e] = add ? d1[e] + out[1][e] : out[1][e];
    }
  }
}

// All output rows of a plane: two per pass for a fixed kernel (K > 0), then
// the odd one; one at a time for the general loop.
template <int K, int S>
__attribute__((always_inline)) inline void plane_rows_f32(const float* P, int64_t pitch,
                                                          const float* taps, const Window2d& k,
                                                          int64_t oh, int64_t ow, float bias,
                                                          bool add, float* dst) {
  int64_t y = 0;
  if constexpr (K > 0) {
    for (; y + 2 <= oh; y += 2) padded_rows2_f32<K, S>(P, pitch, taps, k, y, ow, bias, add, dst);
  }
  for (; y < oh; ++y) padded_row_f32<K, S>(P, pitch, taps, k, y, ow, bias, add, dst + y * ow);
}

// A whole float32 output plane (oh x ow) of the correlation of `plane` (h x w,
// spread out by (spread_y, spread_x): zeros between its samples, as the input
// gradient of a strided correlation reads its grad output) with `taps` under
// window k. The plane is first copied, zero-padded, into `scratch` so that
// every output, the edges included, runs the same vector loop; `add` adds to
// dst instead of overwriting it.
CUSTOMCONV_CPU_CLONES
void correlate_plane_f32(const float* plane, int64_t h, int64_t w, int64_t spread_y,
                         int64_t spread_x, const float* taps, const Window2d& k, int64_t oh,
                         int64_t ow, float bias, bool add, float* dst,
                         std::vector<float>& scratch) {
  const int64_t ow16 = (ow + 15) / 16 * 16;
  const int64_t rows = (oh - 1) * k.sh + (k.kh - 1) * k.dh + 1;
  // One more vector of slack: stride-2 blocks read 16 inputs for 8 outputs.
  const int64_t pitch = (ow16 - 1) * k.sw + (k.kw - 1) * k.dw + 1 + 8;
  scratch.resize(static_cast<size_t>(rows * pitch));
  float* P = scratch.data();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ty = r - k.ph, iy = ty >= 0 ? ty / spread_y : -1;
    float* prow = P + r * pitch;
    if (iy < 0 || iy >= h || iy * spread_y != ty) {
      std::fill(prow, prow + pitch, 0.f);
      continue;
    }
    if (spread_x > 1) {
      for (int64_t c = 0; c < pitch; ++c) {
        const int64_t tx = c - k.pw, ix = tx >= 0 ? tx / spread_x : -1;
        prow[c] = ix >= 0 && ix < w && ix * spread_x == tx ? plane[iy * w + ix] : 0.f;
      }
      continue;
    }
    const int64_t c0 = std::clamp<int64_t>(k.pw, 0, pitch);       // first column in the plane
    const int64_t c1 = std::clamp<int64_t>(k.pw + w, c0, pitch);  // one past its last
    std::fill(prow, prow + c0, 0.f);
    std::copy(plane + iy * w + (c0 - k.pw), plane + iy * w + (c1 - k.pw), prow + c0);
    std::fill(prow + c1, prow + pitch, 0.f);
  }
  // Square kernels of 3..13 taps at stride 1 and 3..7 at stride 2 (dilation 1
  // along x) run unrolled, two rows per pass; everything else the general loop.
  const int64_t kk = k.dw == 1 && k.kh == k.kw ? k.kw : 0;
  if (kk == 3 && k.sw == 1) return plane_rows_f32<3, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 5 && k.sw == 1) return plane_rows_f32<5, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 7 && k.sw == 1) return plane_rows_f32<7, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 9 && k.sw == 1) return plane_rows_f32<9, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 11 && k.sw == 1)
    return plane_rows_f32<11, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 13 && k.sw == 1)
    return plane_rows_f32<13, 1>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 3 && k.sw == 2) return plane_rows_f32<3, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 5 && k.sw == 2) return plane_rows_f32<5, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  if (kk == 7 && k.sw == 2) return plane_rows_f32<7, 2>(P, pitch, taps, k, oh, ow, bias, add, dst);
  plane_rows_f32<0, 0>(P, pitch, taps, k, oh, ow, bias, add, dst);
}

// Adds one image's contribution to the weight gradient of one float32 channel:
// for every tap, 16 lane sums (lanes[tap * 16 + l]) of grad_output times the
// input it met. The input plane is copied zero-padded (and zero past the last
// column or row any output reads, so the grad output's zero padding never
// meets a stray Inf) and the grad output to rows of a multiple of 16; then
// each tap is 16-wide vector products over whole rows.
CUSTOMCONV_CPU_CLONES
void weight_grad_plane_f32(const float* go, const float* plane, int64_t h, int64_t w,
                           const Window2d& k, int64_t oh, int64_t ow, float* lanes,
                           std::vector<float>& pad_in, std::vector<float>& pad_go) {
  const int64_t ow16 = (ow + 15) / 16 * 16;
  const int64_t rows = (oh - 1) * k.sh + (k.kh - 1) * k.dh + 1;
  const int64_t cols = (ow - 1) * k.sw + (k.kw - 1) * k.dw + 1;  // columns any output reads
  const int64_t pitch = (ow16 - 1) * k.sw + (k.kw - 1) * k.dw + 1 + 8;
  pad_in.assign(static_cast<size_t>(rows * pitch), 0.f);
  pad_go.assign(static_cast<size_t>(oh * ow16), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t iy = r - k.ph;
    if (iy < 0 || iy >= h) continue;
    const int64_t c0 = std::clamp<int64_t>(k.pw, 0, cols),
                  c1 = std::clamp<int64_t>(k.pw + w, c0, cols);
    std::copy(plane + iy * w + (c0 - k.pw), plane + iy * w + (c1 - k.pw),
              pad_in.data() + r * pitch + c0);
  }
  for (int64_t y = 0; y < oh; ++y)
    std::copy(go + y * ow, go + (y + 1) * ow, pad_go.data() + y * ow16);
  const float* P = pad_in.data();
  for (int64_t i = 0; i < k.kh; ++i) {
    for (int64_t j = 0; j < k.kw; ++j) {
      Float8 a0 = load8(lanes + (i * k.kw + j) * 16), a1 = load8(lanes + (i * k.kw + j) * 16 + 8);
      for (int64_t y = 0; y < oh; ++y) {
        const float* g = pad_go.data() + y * ow16;
        const float* p = P + (y * k.sh + i * k.dh) * pitch + j * k.dw;
        for (int64_t x = 0; x < ow16; x += 16) {
          if (k.sw == 1) {
            a0 += load8(g + x) * load8(p + x);
            a1 += load8(g + x + 8) * load8(p + x + 8);
          } else if (k.sw == 2) {
            a0 += load8(g + x) * load8_even(p + 2 * x);
            a1 += load8(g + x + 8) * load8_even(p + 2 * x + 16);
          } else {
            a0 += load8(g + x) * load8_strided(p + x * k.sw, k.sw);
            a1 += load8(g + x + 8) * load8_strided(p + (x + 8) * k.sw, k.sw);
          }
        }
      }
      store8(lanes + (i * k.kw + j) * 16, a0);
      store8(lanes + (i * k.kw + j) * 16 + 8, a1);
    }
  }
}

// ------------------------------------------------------------------ float32 forward
//
// The forward copies each input plane once into a zero-padded scratch plane and
// then computes blocks of R output rows x NV vectors of W lanes (W = 16 in the
// x86-64-v4 build, 8 otherwise) with R * NV independent accumulators: each tap
// is broadcast once per block and feeds R * NV FMAs whose other operand is a
// load straight from the scratch. The taps are read in a runtime loop (never
// hoisted into registers), so any kernel size, stride and dilation along the
// rows runs the same code. Strided rows are stored deinterleaved (see
// FwdLayout), so the inputs one output vector reads for one tap are always
// consecutive floats.

// The even- and odd-indexed floats of the 2W at p.
template <class V>
__attribute__((always_inline)) inline void load_deinterleaved(const float* p, V& even, V& odd) {
  const V a = loadv<V>(p), b = loadv<V>(p + kLanes<V>);
  if constexpr (kLanes<V> == 16) {
    typedef int Int16 __attribute__((vector_size(64)));
    even = __builtin_shuffle(a, b, Int16{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
    odd = __builtin_shuffle(a, b, Int16{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
  } else {
    typedef int Int8 __attribute__((vector_size(32)));
    even = __builtin_shuffle(a, b, Int8{0, 2, 4, 6, 8, 10, 12, 14});
    odd = __builtin_shuffle(a, b, Int8{1, 3, 5, 7, 9, 11, 13, 15});
  }
}

// Layout of the forward's scratch copy of one input plane: padded row r holds
// input row r - ph; its padded column c (input column c - pw) lies in phase
// c % sw at position c / sw, each phase u_pitch floats long, so a row is
// sw * u_pitch floats (at stride 1, one phase: the padded row itself). Output
// column x then reads, for tap column j, phase (j * dw) % sw at position
// x + (j * dw) / sw: consecutive outputs read consecutive floats.
struct FwdLayout {
  int64_t lanes;    // W
  int64_t ovec;     // vectors per output row: ceil(ow / W)
  int64_t u_pitch;  // floats per phase
  int64_t pitch;    // floats per scratch row
  int64_t rows;     // scratch rows: the padded rows any output reads
  int64_t nv;       // vectors per block along a row
  int64_t chunks;   // blocks per output row
  int64_t rblk;     // output rows per block
};

FwdLayout fwd_layout(int64_t lanes, int64_t acc, const Window2d& k, int64_t h, int64_t w,
                     int64_t oh, int64_t ow) {
  FwdLayout L{};
  L.lanes = lanes;
  L.ovec = (ow + lanes - 1) / lanes;
  const int64_t s = k.sw;
  // Reads reach position ovec * W - 1 + (kw - 1) * dw / sw of a phase; the copy
  // writes up to one vector past the last input it places (then zeroes it).
  L.u_pitch = std::max(L.ovec * lanes + (k.kw - 1) * k.dw / s + 1,
                       (k.pw + w + s - 1) / s + lanes + 1);
  L.pitch = s * L.u_pitch;
  L.rows = (oh - 1) * k.sh + (k.kh - 1) * k.dh + 1;
  (void)h;
  // Blocks along a row: at most 4 vectors; rows per block so that a block
  // holds about `acc` accumulators (at most 8 rows), the plane's rows split
  // into blocks of nearly equal height.
  L.chunks = (L.ovec + 3) / 4;
  L.nv = (L.ovec + L.chunks - 1) / L.chunks;
  const int64_t rmax = std::clamp<int64_t>(acc / L.nv, 1, 8);
  const int64_t nblk = (oh + rmax - 1) / rmax;
  L.rblk = (oh + nblk - 1) / nblk;
  return L;
}

// Places input plane `plane` (h x w) into the interior of scratch P laid out
// by L; everything else in P is zero before and after (the copy over-writes
// at most one vector past the interior of a row, then zeroes it again). Work:
// one row at a time, W floats per vector (2W read and split into the two
// phases at stride 2); rows whose vector reads would pass the plane's end,
// and strides above 2, go element by element.
template <class V>
__attribute__((always_inline)) inline void fwd_copy_plane(const float* plane, int64_t h, int64_t w,
                                                          const Window2d& k, const FwdLayout& L,
                                                          float* P) {
  constexpr int W = kLanes<V>;
  const int64_t s = k.sw;
  const int64_t r0 = k.ph, r1 = std::min(k.ph + h, L.rows);  // scratch rows holding input
  const int64_t nvec = (w + W - 1) / W;                       // stride 1: vectors per row
  const int64_t npair = ((w + 1) / 2 + W - 1) / W;            // stride 2: 2W-float reads
  const int64_t ne = (w + 1) / 2, no = w / 2;                 // even / odd input columns
  const int64_t ue = (k.pw % 2) * L.u_pitch + k.pw / 2;       // where the even ones start
  const int64_t uo = ((k.pw + 1) % 2) * L.u_pitch + (k.pw + 1) / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t iy = r - k.ph;
    const float* src = plane + iy * w;
    float* dst = P + r * L.pitch;
    if (s == 1 && iy * w + nvec * W <= h * w) {
      for (int64_t v = 0; v < nvec; ++v) storev(dst + k.pw + v * W, loadv<V>(src + v * W));
      storev(dst + k.pw + w, V{});
    } else if (s == 2 && iy * w + npair * 2 * W <= h * w) {
      for (int64_t v = 0; v < npair; ++v) {
        V even, odd;
        load_deinterleaved(src + 2 * v * W, even, odd);
        storev(dst + ue + v * W, even);
        storev(dst + uo + v * W, odd);
      }
      storev(dst + ue + ne, V{});
      storev(dst + uo + no, V{});
    } else {
      for (int64_t ix = 0; ix < w; ++ix) {
        const int64_t c = ix + k.pw;
        dst[(c % s) * L.u_pitch + c / s] = src[ix];
      }
    }
  }
}

// One block: output rows y .. y+R-1, columns x .. x + NV*W - 1 of an output
// plane (oh x ow) from scratch P. Vector lanes are consecutive output columns
// of one row; the R * NV accumulators are independent, so the FMAs of a tap
// overlap. A vector reaching past the row end is stored whole when the whole
// row is one block and the store stays inside the plane (the extra lanes land
// in later rows, which are stored afterwards), else lane by lane.
template <class V, int R, int NV>
__attribute__((always_inline)) inline void fwd_block(const float* P, const FwdLayout& L,
                                                     const int64_t* offs, const float* taps,
                                                     const Window2d& k, int64_t y, int64_t x,
                                                     float bias, int64_t oh, int64_t ow,
                                                     float* dst) {
  constexpr int W = kLanes<V>;
  V acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = bias - V{};
  const int64_t rs = k.sh * L.pitch;  // scratch floats between consecutive output rows
  const float* base = P + y * rs + x;
  for (int64_t i = 0; i < k.kh; ++i) {
    const float* row = base + i * k.dh * L.pitch;
    const float* t = taps + i * k.kw;
    for (int64_t j = 0; j < k.kw; ++j) {
      const float* src = row + offs[j];
      const V tv = t[j] - V{};
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[r][v] += tv * loadv<V>(src + r * rs + v * W);
    }
  }
  const bool one_block = L.chunks == 1;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* d = dst + (y + r) * ow + x;
    const bool spill = one_block && (y + r) * ow + x + NV * W <= oh * ow;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (spill || x + (v + 1) * W <= ow) {
        storev(d + v * W, acc[r][v]);
      } else {
        float buf[W];
        storev(buf, acc[r][v]);
        for (int64_t e = 0; x + v * W + e < ow; ++e) d[v * W + e] = buf[e];
      }
    }
  }
}

// Output planes [p0, p1) (p = image * K + output channel) of a float32
// forward. Work split: the caller's parallel_range hands each thread a range
// of whole planes; within a plane, blocks of rows x vectors as above. An input
// plane is copied once for all its consecutive output planes (channel
// multiplier > 1).
// Each block's rows get `act` right after the block is stored (identity: no
// call).
template <class V, int kAcc>
__attribute__((always_inline)) inline void forward_range_f32(const float* in, const float* wt,
                                                             const float* bias, float* out,
                                                             const Dims& d, const Window2d& k,
                                                             const int64_t* offs, float* P,
                                                             int64_t p0, int64_t p1,
                                                             Activation act) {
  const FwdLayout L = fwd_layout(kLanes<V>, kAcc, k, d.h, d.w, d.oh, d.ow);
  const float* copied = nullptr;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t oc = p % d.k(), n = p / d.k();
    const float* plane = in + (n * d.c + oc / d.mult) * d.h * d.w;
    if (plane != copied) fwd_copy_plane<V>(plane, d.h, d.w, k, L, P);
    copied = plane;
    const float* taps = wt + oc * k.kh * k.kw;
    const float b = bias ? bias[oc] : 0.f;
    float* dst = out + p * d.oh * d.ow;
    for (int64_t y = 0; y < d.oh; y += L.rblk) {
      const int64_t nr = std::min(L.rblk, d.oh - y);
      for (int64_t c = 0; c < L.chunks; ++c) {
        const int64_t x = c * L.nv * L.lanes;
        const int64_t nv = std::min(L.nv, L.ovec - c * L.nv);
        switch ((nr - 1) * 4 + nv - 1) {
#define CUSTOMCONV_FWD_BLOCK(R, NV)                                             \
  case (R - 1) * 4 + NV - 1:                                                    \
    fwd_block<V, R, NV>(P, L, offs, taps, k, y, x, b, d.oh, d.ow, dst); \
    break;
#define CUSTOMCONV_FWD_BLOCKS(R) \
  CUSTOMCONV_FWD_BLOCK(R, 1) CUSTOMCONV_FWD_BLOCK(R, 2) CUSTOMCONV_FWD_BLOCK(R, 3) CUSTOMCONV_FWD_BLOCK(R, 4)
          CUSTOMCONV_FWD_BLOCKS(1) CUSTOMCONV_FWD_BLOCKS(2) CUSTOMCONV_FWD_BLOCKS(3)
          CUSTOMCONV_FWD_BLOCKS(4) CUSTOMCONV_FWD_BLOCKS(5) CUSTOMCONV_FWD_BLOCKS(6)
          CUSTOMCONV_FWD_BLOCKS(7) CUSTOMCONV_FWD_BLOCKS(8)
#undef CUSTOMCONV_FWD_BLOCKS
#undef CUSTOMCONV_FWD_BLOCK
        }
        if (act != Activation::kIdentity) {
          // The block's outputs only (a block's whole-vector stores may run
          // into the rows after it, which their own blocks store later).
          const int64_t cols = std::min(nv * L.lanes, d.ow - x);
          for (int64_t r = 0; r < nr; ++r) activate_floats(act, dst + (y + r) * d.ow + x, cols);
        }
      }
    }
  }
}

// One build of forward_range_f32 per instruction set, picked at run time.
using ForwardRangeF32 = void (*)(const float*, const float*, const float*, float*, const Dims&,
                                 const Window2d&, const int64_t*, float*, int64_t, int64_t,
                                 Activation);
struct ForwardF32Isa {
  ForwardRangeF32 run;
  int64_t lanes, acc;
};

void forward_range_f32_base(const float* in, const float* wt, const float* bias, float* out,
                            const Dims& d, const Window2d& k, const int64_t* offs, float* P,
                            int64_t p0, int64_t p1, Activation act) {
  forward_range_f32<Float8, 6>(in, wt, bias, out, d, k, offs, P, p0, p1, act);
}
#if CUSTOMCONV_CPU_ISA_BUILDS
__attribute__((target("arch=x86-64-v3"))) void forward_range_f32_v3(
    const float* in, const float* wt, const float* bias, float* out, const Dims& d,
    const Window2d& k, const int64_t* offs, float* P, int64_t p0, int64_t p1, Activation act) {
  forward_range_f32<Float8, 10>(in, wt, bias, out, d, k, offs, P, p0, p1, act);
}
__attribute__((target("arch=x86-64-v4"))) void forward_range_f32_v4(
    const float* in, const float* wt, const float* bias, float* out, const Dims& d,
    const Window2d& k, const int64_t* offs, float* P, int64_t p0, int64_t p1, Activation act) {
  forward_range_f32<Float16, 12>(in, wt, bias, out, d, k, offs, P, p0, p1, act);
}
#endif

ForwardF32Isa forward_f32_isa() {
  switch (cpu_isa()) {
#if CUSTOMCONV_CPU_ISA_BUILDS
    case CpuIsa::kX86_64_V4: return ForwardF32Isa{&forward_range_f32_v4, 16, 12};
    case CpuIsa::kX86_64_V3: return ForwardF32Isa{&forward_range_f32_v3, 8, 10};
#endif
    default: return ForwardF32Isa{&forward_range_f32_base, 8, 6};
  }
}

void forward_f32(const float* in, const float* wt, const float* bias, float* out, const Dims& d,
                 const Window2d& k, Activation act) {
  const ForwardF32Isa isa = forward_f32_isa();
  const FwdLayout L = fwd_layout(isa.lanes, isa.acc, k, d.h, d.w, d.oh, d.ow);
  std::vector<int64_t> offs(static_cast<size_t>(k.kw));
  for (int64_t j = 0; j < k.kw; ++j) offs[j] = (j * k.dw) % k.sw * L.u_pitch + j * k.dw / k.sw;
  parallel_range(d.n * d.k(), grain_for(k.kh * k.kw * d.oh * d.ow), [&](int64_t b, int64_t e) {
    std::vector<float> scratch(static_cast<size_t>(L.rows * L.pitch + L.lanes), 0.f);
    isa.run(in, wt, bias, out, d, k, offs.data(), scratch.data(), b, e, act);
  });
}

// Work split: one task per output plane (image, output channel); each output
// row is accumulated in opmath precision tap by tap, the inner loop running
// along the row (unit stride in the output, vectorizable), and stored as
// act(sum + bias), rounded once.
template <typename T>
void forward_planes(const T* in, const T* wt, const T* bias, T* out, const Dims& d,
                    const Window2d& k, Activation act) {
  using acc_t = at::opmath_type<T>;
  if constexpr (std::is_same_v<T, float>) {
    if (padded_copy_fits(k, d.oh, d.ow, d.h * d.w)) {
      return forward_f32(in, wt, bias, out, d, k, act);
    }
  }
  parallel_range(d.n * d.k(), grain_for(k.kh * k.kw * d.oh * d.ow), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.ow));
    for (int64_t p = b; p < e; ++p) {
      const int64_t oc = p % d.k(), n = p / d.k();
      const T* plane = in + (n * d.c + oc / d.mult) * d.h * d.w;
      const T* taps = wt + oc * k.kh * k.kw;
      const acc_t b0 = bias ? static_cast<acc_t>(bias[oc]) : acc_t(0);
      for (int64_t y = 0; y < d.oh; ++y) {
        std::fill(acc.begin(), acc.end(), b0);
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t iy = y * k.sh - k.ph + i * k.dh;
          if (iy < 0 || iy >= d.h) continue;
          const T* row = plane + iy * d.w;
          for (int64_t j = 0; j < k.kw; ++j) {
            const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
            const int64_t off = j * k.dw - k.pw;
            const XRange r = valid_x(off, k.sw, d.w, d.ow);
            if (k.sw == 1) {
              for (int64_t x = r.lo; x < r.hi; ++x)
                acc[x] += tap * static_cast<acc_t>(row[x + off]);
            } else {
              for (int64_t x = r.lo; x < r.hi; ++x) {
                acc[x] += tap * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
        }
        T* dst = out + (p * d.oh + y) * d.ow;
        if (act == Activation::kIdentity) {
          for (int64_t x = 0; x < d.ow; ++x) dst[x] = static_cast<T>(acc[x]);
        } else {
          for (int64_t x = 0; x < d.ow; ++x) dst[x] = static_cast<T>(activate<acc_t>(act, acc[x]));
        }
      }
    }
  });
}

// Work split: one task per input plane (image, input channel); the task
// scatters the gradients of its m output channels into a private opmath
// accumulator plane, then writes the plane once (fixed order: deterministic).
template <typename T>
void grad_input_planes(const T* go, const T* wt, T* gi, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.mult * k.kh * k.kw * d.oh * d.ow;
  // The gradient is the grad output, spread out by the stride, correlated
  // with the rotated taps and padded by dilation*(k-1) - padding; the m
  // output channels add in order.
  const Window2d adj{k.kh, k.kw, 1, 1, (k.kh - 1) * k.dh - k.ph, (k.kw - 1) * k.dw - k.pw,
                     k.dh, k.dw};
  if constexpr (std::is_same_v<T, float>) {
    if (padded_copy_fits(adj, d.h, d.w, d.oh * d.ow)) {
      const int64_t taps = k.kh * k.kw;
      std::vector<float> rotated(static_cast<size_t>(d.k() * taps));
      for (int64_t oc = 0; oc < d.k(); ++oc)
        for (int64_t t = 0; t < taps; ++t) rotated[oc * taps + t] = wt[oc * taps + taps - 1 - t];
      parallel_range(d.n * d.c, grain_for(work), [&](int64_t b, int64_t e) {
        std::vector<float> scratch;
        for (int64_t p = b; p < e; ++p) {
          const int64_t c = p % d.c, n = p / d.c;
          for (int64_t m = 0; m < d.mult; ++m) {
            const int64_t oc = c * d.mult + m;
            const float* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
            correlate_plane_f32(gplane, d.oh, d.ow, k.sh, k.sw, rotated.data() + oc * taps, adj,
                                d.h, d.w, 0.f, m > 0, gi + p * d.h * d.w, scratch);
          }
        }
      });
      return;
    }
  }
  parallel_range(d.n * d.c, grain_for(work), [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(d.h * d.w));
    for (int64_t p = b; p < e; ++p) {
      const int64_t c = p % d.c, n = p / d.c;
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t m = 0; m < d.mult; ++m) {
        const int64_t oc = c * d.mult + m;
        const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
        const T* taps = wt + oc * k.kh * k.kw;
        for (int64_t y = 0; y < d.oh; ++y) {
          const T* grow = gplane + y * d.ow;
          for (int64_t i = 0; i < k.kh; ++i) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            if (iy < 0 || iy >= d.h) continue;
            acc_t* arow = acc.data() + iy * d.w;
            for (int64_t j = 0; j < k.kw; ++j) {
              const acc_t tap = static_cast<acc_t>(taps[i * k.kw + j]);
              const int64_t off = j * k.dw - k.pw;
              const XRange r = valid_x(off, k.sw, d.w, d.ow);
              for (int64_t x = r.lo; x < r.hi; ++x) {
                arow[x * k.sw + off] += tap * static_cast<acc_t>(grow[x]);
              }
            }
          }
        }
      }
      T* dst = gi + p * d.h * d.w;
      for (int64_t q = 0; q < d.h * d.w; ++q) dst[q] = static_cast<T>(acc[q]);
    }
  });
}

// Work split: one task per output channel; for each tap it sums
// grad_output * input over batch and space in a fixed order (deterministic).
template <typename T>
void grad_weight_channels(const T* go, const T* in, T* gw, const Dims& d, const Window2d& k) {
  using acc_t = at::opmath_type<T>;
  const int64_t work = d.n * k.kh * k.kw * d.oh * d.ow;
  if constexpr (std::is_same_v<T, float>) {
    if (padded_copy_fits(k, d.oh, d.ow, d.h * d.w)) {
      // Per channel: every image adds into 16 lanes per tap, which are then
      // summed in a fixed order (deterministic).
      const int64_t taps = k.kh * k.kw;
      parallel_range(d.k(), grain_for(work), [&](int64_t b, int64_t e) {
        std::vector<float> lanes(static_cast<size_t>(taps * 16)), pad_in, pad_go;
        for (int64_t oc = b; oc < e; ++oc) {
          const int64_t c = oc / d.mult;
          std::fill(lanes.begin(), lanes.end(), 0.f);
          for (int64_t n = 0; n < d.n; ++n) {
            weight_grad_plane_f32(go + (n * d.k() + oc) * d.oh * d.ow,
                                  in + (n * d.c + c) * d.h * d.w, d.h, d.w, k, d.oh, d.ow,
                                  lanes.data(), pad_in, pad_go);
          }
          for (int64_t t = 0; t < taps; ++t) {
            double sum = 0;
            for (int l = 0; l < 16; ++l) sum += lanes[t * 16 + l];
            gw[oc * taps + t] = static_cast<float>(sum);
          }
        }
      });
      return;
    }
  }
  parallel_range(d.k(), grain_for(work), [&](int64_t b, int64_t e) {
    for (int64_t oc = b; oc < e; ++oc) {
      const int64_t c = oc / d.mult;
      for (int64_t i = 0; i < k.kh; ++i) {
        for (int64_t j = 0; j < k.kw; ++j) {
          const int64_t off = j * k.dw - k.pw;
          const XRange r = valid_x(off, k.sw, d.w, d.ow);
          acc_t sum = 0;
          for (int64_t n = 0; n < d.n; ++n) {
            const T* gplane = go + (n * d.k() + oc) * d.oh * d.ow;
            const T* plane = in + (n * d.c + c) * d.h * d.w;
            for (int64_t y = 0; y < d.oh; ++y) {
              const int64_t iy = y * k.sh - k.ph + i * k.dh;
              if (iy < 0 || iy >= d.h) continue;
              const T* grow = gplane + y * d.ow;
              const T* row = plane + iy * d.w;
              for (int64_t x = r.lo; x < r.hi; ++x) {
                sum += static_cast<acc_t>(grow[x]) * static_cast<acc_t>(row[x * k.sw + off]);
              }
            }
          }
          gw[(oc * k.kh + i) * k.kw + j] = static_cast<T>(sum);
        }
      }
    }
  });
}

Dims dims_of(const at::Tensor& input, const at::Tensor& out_like, int64_t mult) {
  return {input.size(0), input.size(1),    input.size(2),   input.size(3),
          mult,          out_like.size(2), out_like.size(3)};
}

void forward_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                 const at::Tensor& output, const Window2d& win, int64_t mult, Activation act) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_cpu", [&] {
        forward_planes<scalar_t>(input.const_data_ptr<scalar_t>(),
                                 weight.const_data_ptr<scalar_t>(),
                                 bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                                 output.data_ptr<scalar_t>(), dims_of(input, output, mult), win,
                                 act);
      });
}

void grad_input_cpu(const at::Tensor& grad_output, const at::Tensor& weight,
                    const at::Tensor& grad_input, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad_output.scalar_type(), "depthwise_conv2d_grad_input_cpu", [&] {
        grad_input_planes<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), weight.const_data_ptr<scalar_t>(),
            grad_input.data_ptr<scalar_t>(), dims_of(grad_input, grad_output, mult), win);
      });
}

void grad_weight_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                     const at::Tensor& grad_weight, const Window2d& win, int64_t mult) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "depthwise_conv2d_grad_weight_cpu", [&] {
        grad_weight_channels<scalar_t>(
            grad_output.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
            grad_weight.data_ptr<scalar_t>(), dims_of(input, grad_output, mult), win);
      });
}

}  // namespace

DepthwiseKernels cpu_depthwise_kernels() {
  return {&forward_cpu, &grad_input_cpu, &grad_weight_cpu, nullptr,
          cpu_depthwise_channels_last_kernels(), /*fast_transcendental_activations=*/false};
}

}  // namespace customconv
