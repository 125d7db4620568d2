// depthwise_conv2d's three passes on channels_last float32 data on the CPU
// (channel multiplier 1), without changing the layout: a position's channels
// are contiguous, so every tap is a multiply-add of channel vectors, with the
// taps transposed to (kh*kw, C) so that a tap's weights are contiguous too.
// The output rows (forward) or input rows (input gradient) are spread over
// ATen's threads; the weight gradient's reduction is split into a fixed
// number of chunks of rows, summed in order (the result does not depend on
// the thread count). The forward applies the fused op's activation to each
// block of positions as soon as it is stored (activation_cpu.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/common/cpu_simd.h"
#include "ops/common/launch.h"
#include "ops/common/parallel_cpu.h"
#include "ops/depthwise/activation_cpu.h"
#include "ops/depthwise/depthwise.h"

namespace customconv {
namespace {

struct Dims {
  int64_t n, c, h, w, oh, ow;  // input (n, h, w, c), output (n, oh, ow, c)
};

constexpr int kBlock = 4;  // positions per block

// The taps of weight (C, 1, kh, kw) as (kh*kw, C), float32, contiguous.
at::Tensor taps_by_channel(const at::Tensor& weight) {
  return weight.reshape({weight.size(0), weight.size(2) * weight.size(3)}).t().contiguous();
}

// ---------------------------------------------------------------- forward

// The forward's blocks hold 16 channels of a position in one Float16: one
// AVX-512 register in the x86-64-v4 build of forward_rows, two AVX registers
// in the x86-64-v3 build, four SSE registers in the baseline one.

// The accumulators of a forward block, P positions x channels [c, c + 16),
// start at the bias (or zero), and are stored to positions x0..x0+P-1 of orow.
template <int P>
__attribute__((always_inline)) inline void start_block(Float16 (&acc)[P], const float* bias, int64_t c) {
  const Float16 b = bias != nullptr ? loadv<Float16>(bias + c) : Float16{};
  for (int t = 0; t < P; ++t) acc[t] = b;
}

// The empty asm statements here and below keep one pointer stepped by the
// channel stride: without them GCC precomputes every multiple of the (run
// time) stride, runs out of registers, and reloads the offsets from the stack
// on every load and store (measured: about half the forward's time).
#define CUSTOMCONV_KEEP_IN_REGISTER(p) asm("" : "+r"(p))

template <int P>
__attribute__((always_inline)) inline void store_block(const Float16 (&acc)[P], float* orow, const Dims& d,
                                                       int64_t x0, int64_t c) {
  float* dst = orow + x0 * d.c + c;
#pragma GCC unroll 8
  for (int t = 0; t < P; ++t) {
    storev<Float16>(dst, acc[t]);
    dst += d.c;
    CUSTOMCONV_KEEP_IN_REGISTER(dst);
  }
}

// Output positions x0..x0+P-1 of row y of one image, channels [c, c + 16):
// P vector accumulators over the taps.
template <int P>
__attribute__((always_inline)) inline void forward_block(const float* img, const float* taps,
                                                         const float* bias, float* orow,
                                                         const Dims& d, const Window2d& k,
                                                         int64_t y, int64_t x0, int64_t c) {
  Float16 acc[P];
  start_block<P>(acc, bias, c);
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    if (iy < 0 || iy >= d.h) continue;
    const float* row = img + iy * d.w * d.c + c;
    for (int64_t j = 0; j < k.kw; ++j) {
      const Float16 w = loadv<Float16>(taps + (i * k.kw + j) * d.c + c);
      for (int t = 0; t < P; ++t) {
        const int64_t ix = (x0 + t) * k.sw - k.pw + j * k.dw;
        if (ix < 0 || ix >= d.w) continue;
        acc[t] += loadv<Float16>(row + ix * d.c) * w;
      }
    }
  }
  store_block<P>(acc, orow, d, x0, c);
}

// forward_block for positions whose every tap lies inside the row (no
// column checks): consecutive positions sw columns apart.
template <int P>
__attribute__((always_inline)) inline void forward_block_inside(const float* img, const float* taps,
                                                                const float* bias, float* orow,
                                                                const Dims& d, const Window2d& k,
                                                                int64_t y, int64_t x0, int64_t c) {
  Float16 acc[P];
  start_block<P>(acc, bias, c);
  const int64_t step = k.sw * d.c;
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    if (iy < 0 || iy >= d.h) continue;
    const float* src = img + (iy * d.w + x0 * k.sw - k.pw) * d.c + c;
    const float* tap = taps + i * k.kw * d.c + c;
    for (int64_t j = 0; j < k.kw; ++j, src += k.dw * d.c, tap += d.c) {
      const Float16 w = loadv<Float16>(tap);
      const float* p = src;
#pragma GCC unroll 8
      for (int t = 0; t < P; ++t) {
        acc[t] += loadv<Float16>(p) * w;
        p += step;
        CUSTOMCONV_KEEP_IN_REGISTER(p);
      }
    }
  }
  store_block<P>(acc, orow, d, x0, c);
}

// The positions [lo, hi) of a row of `out` positions whose taps all lie in
// [0, size): position x reads x * stride + offset + tap * dilation for taps
// 0..taps-1.
struct Inside {
  int64_t lo, hi;
};
Inside inside(int64_t offset, int64_t stride, int64_t taps, int64_t dilation, int64_t size,
              int64_t out) {
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t last = size - 1 - offset - (taps - 1) * dilation;  // x * stride <= last
  const int64_t hi = last >= 0 ? std::min(out, last / stride + 1) : 0;
  return {std::min(lo, out), std::max(std::min(lo, out), hi)};
}

// The epilogue of positions [x0, x1) of an output row, channels [0, c16),
// just stored: `act` in place (identity: nothing).
__attribute__((always_inline)) inline void activate_positions(Activation act, float* orow,
                                                              const Dims& d, int64_t c16,
                                                              int64_t x0, int64_t x1) {
  if (act == Activation::kIdentity || c16 == 0) return;
  if (c16 == d.c) return activate_floats(act, orow + x0 * d.c, (x1 - x0) * d.c);
  for (int64_t x = x0; x < x1; ++x) activate_floats(act, orow + x * d.c, c16);
}

// forward_block_inside for column stride S (1 or 2), no dilation and a
// KW-wide window: each window row's S (P - 1) + KW input vectors are loaded
// once and feed all its P x KW multiply-adds (the generic block loads one
// input per multiply-add, which makes the loads, not the multiply-adds, its
// limit).
constexpr int kReuseBlock = 8;  // positions per block

template <int P, int KW, int S = 1>
__attribute__((always_inline)) inline void forward_block_reuse(const float* img, const float* taps,
                                                               const float* bias, float* orow,
                                                               const Dims& d, const Window2d& k,
                                                               int64_t y, int64_t x0, int64_t c) {
  constexpr int kInputs = S * (P - 1) + KW;
  Float16 acc[P];
  start_block<P>(acc, bias, c);
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    if (iy < 0 || iy >= d.h) continue;
    const float* src = img + (iy * d.w + x0 * S - k.pw) * d.c + c;
    const float* tap = taps + i * KW * d.c + c;
    Float16 xin[kInputs];
#pragma GCC unroll 24
    for (int q = 0; q < kInputs; ++q) {
      xin[q] = loadv<Float16>(src);
      src += d.c;
      CUSTOMCONV_KEEP_IN_REGISTER(src);
    }
#pragma GCC unroll 8
    for (int j = 0; j < KW; ++j) {
      const Float16 w = loadv<Float16>(tap);
      tap += d.c;
      CUSTOMCONV_KEEP_IN_REGISTER(tap);
#pragma GCC unroll 8
      for (int t = 0; t < P; ++t) acc[t] += xin[S * t + j] * w;
    }
  }
  store_block<P>(acc, orow, d, x0, c);
}

// JC taps of one window row for the P positions of a block: the P + JC - 1
// input vectors from src (column stride `stride`) loaded once, then the JC
// taps' weights from tap (stride `tap_stride`).
template <int P, int JC>
__attribute__((always_inline)) inline void tap_chunk(Float16 (&acc)[P], const float* src, int64_t stride,
                                                     const float* tap, int64_t tap_stride) {
  Float16 xin[P + JC - 1];
#pragma GCC unroll 16
  for (int q = 0; q < P + JC - 1; ++q) {
    xin[q] = loadv<Float16>(src);
    src += stride;
    CUSTOMCONV_KEEP_IN_REGISTER(src);
  }
#pragma GCC unroll 8
  for (int j = 0; j < JC; ++j) {
    const Float16 w = loadv<Float16>(tap);
    tap += tap_stride;
    CUSTOMCONV_KEEP_IN_REGISTER(tap);
#pragma GCC unroll 8
    for (int t = 0; t < P; ++t) acc[t] += xin[t + j] * w;
  }
}

// Windows wider than kTapChunk at stride 1 and dilation 1 that the reuse
// blocks above do not cover (RepLKNet's 31x31, 9 to 21 wide): the positions
// whose every tap lies inside the row in blocks of kReuseBlock, each window
// row's taps in chunks of kTapChunk, then 4, then single ones, each chunk's
// inputs loaded once (a whole row of a wide window would not fit in the
// registers). Where fewer than half a row's positions are inside (a plane
// narrower than about twice its window), a whole output row and 16 channels
// at a time instead. Each window row's input row is
// copied once into a zero-padded row (16 channels a column, the padding
// columns zero), so that every position, the row's edges included, runs the
// taps without column checks, in chunks of kTapChunk taps, then 4, then
// single ones, each chunk's inputs loaded once. The row's sums live in
// `sums` (ow x 16 floats) between window rows. A plane narrower than its
// window (31x31 over 28x28) has no position whose every tap lies inside the
// row: the blocks with column checks ran it all, one load per multiply-add.
constexpr int kTapChunk = 8;

// A window row's kw taps for a block: chunks of kTapChunk, then one of 4,
// then single taps.
template <int P>
__attribute__((always_inline)) inline void window_row_chunks(Float16 (&acc)[P], const float* src,
                                                             int64_t stride, const float* tap,
                                                             int64_t tap_stride, int64_t kw) {
  int64_t j = 0;
  for (; j + kTapChunk <= kw; j += kTapChunk) {
    tap_chunk<P, kTapChunk>(acc, src + j * stride, stride, tap + j * tap_stride, tap_stride);
  }
  if (j + 4 <= kw) {
    tap_chunk<P, 4>(acc, src + j * stride, stride, tap + j * tap_stride, tap_stride);
    j += 4;
  }
  for (; j < kw; ++j) tap_chunk<P, 1>(acc, src + j * stride, stride, tap + j * tap_stride, tap_stride);
}

template <int P>
__attribute__((always_inline)) inline void padded_block(float* sums, const float* padded,
                                                        const float* tap, int64_t tap_stride,
                                                        int64_t kw) {
  Float16 acc[P];
  for (int t = 0; t < P; ++t) acc[t] = loadv<Float16>(sums + t * 16);
  window_row_chunks<P>(acc, padded, 16, tap, tap_stride, kw);
  for (int t = 0; t < P; ++t) storev<Float16>(sums + t * 16, acc[t]);
}

// forward_block_reuse for the positions whose every tap lies inside the row
// under a wide window: each window row in chunks of taps, as padded_block,
// read in place.
template <int P>
__attribute__((always_inline)) inline void forward_block_chunks(const float* img, const float* taps,
                                                                const float* bias, float* orow,
                                                                const Dims& d, const Window2d& k,
                                                                int64_t y, int64_t x0, int64_t c) {
  Float16 acc[P];
  start_block<P>(acc, bias, c);
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    if (iy < 0 || iy >= d.h) continue;
    window_row_chunks<P>(acc, img + (iy * d.w + x0 - k.pw) * d.c + c, d.c, taps + i * k.kw * d.c + c,
                         d.c, k.kw);
  }
  store_block<P>(acc, orow, d, x0, c);
}

// Output row y of one image (img, orow), channels [0, c16), through the
// padded rows; `sums` holds ow x 16 floats, `padded` (ow + kw - 1) x 16.
__attribute__((always_inline)) inline void forward_row_padded(const float* img, const float* taps,
                                                              const float* bias, float* orow,
                                                              const Dims& d, const Window2d& k,
                                                              int64_t y, int64_t c16, float* sums,
                                                              float* padded) {
  const int64_t cols = d.ow + k.kw - 1;  // padded column q holds input column q - pw
  for (int64_t c = 0; c < c16; c += 16) {
    const Float16 b = bias != nullptr ? loadv<Float16>(bias + c) : Float16{};
    for (int64_t x = 0; x < d.ow; ++x) storev<Float16>(sums + x * 16, b);
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t iy = y * k.sh - k.ph + i * k.dh;
      if (iy < 0 || iy >= d.h) continue;
      const float* row = img + iy * d.w * d.c + c;
      for (int64_t q = 0; q < cols; ++q) {
        const int64_t ix = q - k.pw;
        storev<Float16>(padded + q * 16, ix >= 0 && ix < d.w ? loadv<Float16>(row + ix * d.c) : Float16{});
      }
      const float* tap = taps + i * k.kw * d.c + c;
      int64_t x = 0;
      for (; x + kReuseBlock <= d.ow; x += kReuseBlock) {
        padded_block<kReuseBlock>(sums + x * 16, padded + x * 16, tap, d.c, k.kw);
      }
      for (; x + kBlock <= d.ow; x += kBlock) padded_block<kBlock>(sums + x * 16, padded + x * 16, tap, d.c, k.kw);
      for (; x < d.ow; ++x) padded_block<1>(sums + x * 16, padded + x * 16, tap, d.c, k.kw);
    }
    for (int64_t x = 0; x < d.ow; ++x) storev<Float16>(orow + x * d.c + c, loadv<Float16>(sums + x * 16));
  }
}

// Blocks of kReuseBlock positions from x while they lie in [x, hi), every
// 16-channel group of each (KW = 0: any width, forward_block_chunks; S the
// column stride, 1 or 2);
// returns the first position left.
template <int KW, int S = 1>
__attribute__((always_inline)) inline int64_t forward_reuse_blocks(const float* img, const float* taps,
                                                                   const float* bias, float* orow,
                                                                   const Dims& d, const Window2d& k,
                                                                   int64_t y, int64_t x, int64_t hi,
                                                                   int64_t c16, Activation act) {
  for (; x + kReuseBlock <= hi; x += kReuseBlock) {
    for (int64_t c = 0; c < c16; c += 16) {
      if constexpr (KW == 0) {
        forward_block_chunks<kReuseBlock>(img, taps, bias, orow, d, k, y, x, c);
      } else {
        forward_block_reuse<kReuseBlock, KW, S>(img, taps, bias, orow, d, k, y, x, c);
      }
    }
    activate_positions(act, orow, d, c16, x, x + kReuseBlock);
  }
  return x;
}

// Positions [x, end) of an output row with column checks (the row's edges):
// blocks of kBlock positions, then one block of the 1 to 3 left; returns end.
template <int P>
__attribute__((always_inline)) inline void forward_checked_block(const float* img, const float* taps,
                                                                 const float* bias, float* orow,
                                                                 const Dims& d, const Window2d& k,
                                                                 int64_t y, int64_t x, int64_t c16,
                                                                 Activation act) {
  for (int64_t c = 0; c < c16; c += 16) forward_block<P>(img, taps, bias, orow, d, k, y, x, c);
  activate_positions(act, orow, d, c16, x, x + P);
}
__attribute__((always_inline)) inline int64_t forward_checked(const float* img, const float* taps,
                                                              const float* bias, float* orow,
                                                              const Dims& d, const Window2d& k,
                                                              int64_t y, int64_t x, int64_t end,
                                                              int64_t c16, Activation act) {
  for (; x + kBlock <= end; x += kBlock) {
    forward_checked_block<kBlock>(img, taps, bias, orow, d, k, y, x, c16, act);
  }
  static_assert(kBlock == 4, "the remainder below is 1 to 3 positions");
  switch (end - x) {
    case 3: forward_checked_block<3>(img, taps, bias, orow, d, k, y, x, c16, act); break;
    case 2: forward_checked_block<2>(img, taps, bias, orow, d, k, y, x, c16, act); break;
    case 1: forward_checked_block<1>(img, taps, bias, orow, d, k, y, x, c16, act); break;
    default: break;
  }
  return end;
}

// The channels past the last multiple of 16 of output row y, one at a time.
__attribute__((always_inline)) inline void forward_channel_tail(const float* img, const float* taps,
                                                                const float* bias, float* orow,
                                                                const Dims& d, const Window2d& k,
                                                                int64_t y, int64_t c16, Activation act) {
  for (int64_t x = 0; x < d.ow && c16 < d.c; ++x) {
    for (int64_t c = c16; c < d.c; ++c) {
      float acc = bias != nullptr ? bias[c] : 0.f;
      for (int64_t i = 0; i < k.kh; ++i) {
        const int64_t iy = y * k.sh - k.ph + i * k.dh;
        if (iy < 0 || iy >= d.h) continue;
        for (int64_t j = 0; j < k.kw; ++j) {
          const int64_t ix = x * k.sw - k.pw + j * k.dw;
          if (ix >= 0 && ix < d.w) acc += img[(iy * d.w + ix) * d.c + c] * taps[(i * k.kw + j) * d.c + c];
        }
      }
      orow[x * d.c + c] = act == Activation::kIdentity ? acc : activate<float>(act, acc);
    }
  }
}

// Output rows [r0, r1) (r = n * oh + y): blocks of kBlock positions x 16
// channels where every tap lies inside the row (kReuseBlock positions for
// stride-1 3, 5, 7 and 13-wide windows; other stride-1 windows wider than
// kTapChunk take forward_row_padded for whole rows), blocks with column checks at the
// row's edges (small planes under wide windows are mostly edge: 6 of 14
// positions under a 7-wide window), then the channels past the last multiple
// of 16 one at a time. Each block of
// positions gets `act` once all its channels are stored.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CUSTOMCONV_FORWARD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CUSTOMCONV_FORWARD_CLONES
#endif
CUSTOMCONV_FORWARD_CLONES void forward_rows(const float* in, const float* taps, const float* bias,
                                        float* out, Dims d, Window2d k, int64_t r0, int64_t r1,
                                        Activation act) {
  const int64_t c16 = d.c / 16 * 16;
  const bool wide = k.sw == 1 && k.dw == 1 && k.kw > kTapChunk && k.kw != 13 && c16 > 0;
  const Inside inner = inside(-k.pw, k.sw, k.kw, k.dw, d.w, d.ow);
  const bool padded_rows = wide && 2 * std::max<int64_t>(0, inner.hi - inner.lo) < d.ow;
  std::vector<float> sums, padded;
  if (padded_rows) sums.resize(d.ow * 16), padded.resize((d.ow + k.kw - 1) * 16);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t y = r % d.oh;
    const float* img = in + (r / d.oh) * d.h * d.w * d.c;
    float* orow = out + r * d.ow * d.c;
    if (padded_rows) {
      forward_row_padded(img, taps, bias, orow, d, k, y, c16, sums.data(), padded.data());
      activate_positions(act, orow, d, c16, 0, d.ow);
      forward_channel_tail(img, taps, bias, orow, d, k, y, c16, act);
      continue;
    }
    const Inside in_row = inside(-k.pw, k.sw, k.kw, k.dw, d.w, d.ow);
    int64_t x = forward_checked(img, taps, bias, orow, d, k, y, 0, in_row.lo, c16, act);
    if (k.sw == 2 && k.dw == 1 && (k.kw == 3 || k.kw == 5)) {
      x = k.kw == 3 ? forward_reuse_blocks<3, 2>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act)
                    : forward_reuse_blocks<5, 2>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act);
    } else if (k.sw == 1 && k.dw == 1) {
      switch (k.kw) {
        case 3: x = forward_reuse_blocks<3>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act); break;
        case 5: x = forward_reuse_blocks<5>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act); break;
        case 7: x = forward_reuse_blocks<7>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act); break;
        case 13: x = forward_reuse_blocks<13>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act); break;
        default:
          if (wide) x = forward_reuse_blocks<0>(img, taps, bias, orow, d, k, y, x, in_row.hi, c16, act);
          break;
      }
    }
    for (; x + kBlock <= in_row.hi; x += kBlock) {
      for (int64_t c = 0; c < c16; c += 16) {
        forward_block_inside<kBlock>(img, taps, bias, orow, d, k, y, x, c);
      }
      activate_positions(act, orow, d, c16, x, x + kBlock);
    }
    forward_checked(img, taps, bias, orow, d, k, y, x, d.ow, c16, act);
    forward_channel_tail(img, taps, bias, orow, d, k, y, c16, act);
  }
}

// ---------------------------------------------------------------- input gradient

// The output coordinate that tap offset `off` (= input coordinate + padding
// - tap * dilation) maps to, or -1 where the stride does not divide it or it
// falls outside [0, size).
__attribute__((always_inline)) inline int64_t source(int64_t off, int64_t stride, int64_t size) {
  if (off < 0 || off % stride != 0 || off / stride >= size) return -1;
  return off / stride;
}

// Input positions x0..x0+P-1 of row y of one image's gradient, channels
// [c, c + 16): the grad_output positions each tap maps them to, looked up in
// `cols` (kw x w: the grad_output column of tap j at input column x, or -1).
template <int P>
__attribute__((always_inline)) inline void grad_input_block(const float* gimg, const float* taps,
                                                            const int64_t* cols, float* grow,
                                                            const Dims& d, const Window2d& k,
                                                            int64_t y, int64_t x0, int64_t c) {
  Float8 acc[P][2];
  for (int t = 0; t < P; ++t) acc[t][0] = Float8{}, acc[t][1] = Float8{};
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t oy = source(y + k.ph - i * k.dh, k.sh, d.oh);
    if (oy < 0) continue;
    const float* row = gimg + oy * d.ow * d.c + c;
    for (int64_t j = 0; j < k.kw; ++j) {
      const float* tap = taps + (i * k.kw + j) * d.c + c;
      const int64_t* col = cols + j * d.w + x0;
      const Float8 w0 = load8(tap), w1 = load8(tap + 8);
      for (int t = 0; t < P; ++t) {
        if (col[t] < 0) continue;
        const float* src = row + col[t] * d.c;
        acc[t][0] += load8(src) * w0;
        acc[t][1] += load8(src + 8) * w1;
      }
    }
  }
  for (int t = 0; t < P; ++t) {
    store8(grow + (x0 + t) * d.c + c, acc[t][0]);
    store8(grow + (x0 + t) * d.c + c + 8, acc[t][1]);
  }
}

// Input-gradient rows [r0, r1) (r = n * h + y), in the forward's order.
CUSTOMCONV_CPU_CLONES void grad_input_rows(const float* go, const float* taps, const int64_t* cols,
                                           float* gi, Dims d, Window2d k, int64_t r0, int64_t r1) {
  const int64_t c16 = d.c / 16 * 16;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t y = r % d.h;
    const float* gimg = go + (r / d.h) * d.oh * d.ow * d.c;
    float* grow = gi + r * d.w * d.c;
    int64_t x = 0;
    for (; x + kBlock <= d.w; x += kBlock) {
      for (int64_t c = 0; c < c16; c += 16) grad_input_block<kBlock>(gimg, taps, cols, grow, d, k, y, x, c);
    }
    for (; x < d.w; ++x) {
      for (int64_t c = 0; c < c16; c += 16) grad_input_block<1>(gimg, taps, cols, grow, d, k, y, x, c);
    }
    for (x = 0; x < d.w && c16 < d.c; ++x) {
      for (int64_t c = c16; c < d.c; ++c) {
        float acc = 0.f;
        for (int64_t i = 0; i < k.kh; ++i) {
          const int64_t oy = source(y + k.ph - i * k.dh, k.sh, d.oh);
          if (oy < 0) continue;
          for (int64_t j = 0; j < k.kw; ++j) {
            const int64_t ox = cols[j * d.w + x];
            if (ox >= 0) acc += gimg[(oy * d.ow + ox) * d.c + c] * taps[(i * k.kw + j) * d.c + c];
          }
        }
        grow[x * d.c + c] = acc;
      }
    }
  }
}

// ---------------------------------------------------------------- weight gradient

// part (kh*kw, C) += the products of grad_output rows [r0, r1) (r = n * oh + y)
// with the input at each tap: per row and tap, the valid output columns run
// through two vector accumulators per 16 channels. With bias_part, also
// bias_part (C) += the rows' grad_output.
CUSTOMCONV_CPU_CLONES void grad_weight_rows(const float* go, const float* in, float* part,
                                            float* bias_part, Dims d, Window2d k, int64_t r0,
                                            int64_t r1) {
  const int64_t c16 = d.c / 16 * 16;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t y = r % d.oh;
    const float* img = in + (r / d.oh) * d.h * d.w * d.c;
    const float* grow = go + r * d.ow * d.c;
    if (bias_part != nullptr) {  // the bias gradient: grad_output summed over the row
      for (int64_t c = 0; c < c16; c += 16) {
        Float8 a0 = load8(bias_part + c), a1 = load8(bias_part + c + 8);
        for (int64_t x = 0; x < d.ow; ++x) {
          a0 += load8(grow + x * d.c + c);
          a1 += load8(grow + x * d.c + c + 8);
        }
        store8(bias_part + c, a0);
        store8(bias_part + c + 8, a1);
      }
      for (int64_t c = c16; c < d.c; ++c) {
        float a = bias_part[c];
        for (int64_t x = 0; x < d.ow; ++x) a += grow[x * d.c + c];
        bias_part[c] = a;
      }
    }
    for (int64_t i = 0; i < k.kh; ++i) {
      const int64_t iy = y * k.sh - k.ph + i * k.dh;
      if (iy < 0 || iy >= d.h) continue;
      const float* row = img + iy * d.w * d.c;
      for (int64_t j = 0; j < k.kw; ++j) {
        // The output columns x whose input column x * sw - pw + j * dw is in [0, w).
        const int64_t off = j * k.dw - k.pw;
        const int64_t lo = off >= 0 ? 0 : (-off + k.sw - 1) / k.sw;
        const int64_t hi = std::min(d.ow, d.w - 1 - off >= 0 ? (d.w - 1 - off) / k.sw + 1 : 0);
        float* p = part + (i * k.kw + j) * d.c;
        for (int64_t c = 0; c < c16; c += 16) {
          Float8 a0 = load8(p + c), a1 = load8(p + c + 8);
          for (int64_t x = lo; x < hi; ++x) {
            const float* g = grow + x * d.c + c;
            const float* s = row + (x * k.sw + off) * d.c + c;
            a0 += load8(g) * load8(s);
            a1 += load8(g + 8) * load8(s + 8);
          }
          store8(p + c, a0);
          store8(p + c + 8, a1);
        }
        for (int64_t c = c16; c < d.c; ++c) {
          float a = p[c];
          for (int64_t x = lo; x < hi; ++x) a += grow[x * d.c + c] * row[(x * k.sw + off) * d.c + c];
          p[c] = a;
        }
      }
    }
  }
}

Dims dims(const at::Tensor& input, int64_t oh, int64_t ow) {
  return {input.size(0), input.size(1), input.size(2), input.size(3), oh, ow};
}

bool takes(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.dim() == 4 &&
         t.is_contiguous(at::MemoryFormat::ChannelsLast);
}

bool forward_cl_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                    const at::Tensor& output, const Window2d& win, Activation act) {
  if (!takes(input) || !takes(output)) return false;
  const Dims d = dims(input, output.size(2), output.size(3));
  const at::Tensor taps = taps_by_channel(weight);
  const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
  const float* in = input.const_data_ptr<float>();
  const float* tp = taps.const_data_ptr<float>();
  const float* bp = b.defined() ? b.const_data_ptr<float>() : nullptr;
  float* out = output.mutable_data_ptr<float>();
  parallel_range(d.n * d.oh, grain_for(win.kh * win.kw * d.ow * d.c), [&](int64_t r0, int64_t r1) {
    forward_rows(in, tp, bp, out, d, win, r0, r1, act);
  });
  return true;
}

bool grad_input_cl_cpu(const at::Tensor& grad_output, const at::Tensor& weight,
                       const at::Tensor& grad_input, const Window2d& win) {
  if (!takes(grad_output) || !takes(grad_input)) return false;
  const Dims d = dims(grad_input, grad_output.size(2), grad_output.size(3));
  const at::Tensor taps = taps_by_channel(weight);
  const float* go = grad_output.const_data_ptr<float>();
  const float* tp = taps.const_data_ptr<float>();
  float* gi = grad_input.mutable_data_ptr<float>();
  // The grad_output column of each tap at each input column (the same for every row).
  std::vector<int64_t> cols(win.kw * d.w);
  for (int64_t j = 0; j < win.kw; ++j) {
    for (int64_t x = 0; x < d.w; ++x) cols[j * d.w + x] = source(x + win.pw - j * win.dw, win.sw, d.ow);
  }
  parallel_range(d.n * d.h, grain_for(win.kh * win.kw * d.w * d.c), [&](int64_t r0, int64_t r1) {
    grad_input_rows(go, tp, cols.data(), gi, d, win, r0, r1);
  });
  return true;
}

bool grad_weight_cl_cpu(const at::Tensor& grad_output, const at::Tensor& input,
                        const at::Tensor& grad_weight, const at::Tensor& grad_bias,
                        const Window2d& win) {
  if (!takes(grad_output) || !takes(input)) return false;
  const Dims d = dims(input, grad_output.size(2), grad_output.size(3));
  const int64_t taps = win.kh * win.kw, rows = d.n * d.oh;
  const bool with_bias = grad_bias.defined();
  // A fixed number of chunks of rows, whatever the thread count; each sums
  // its rows into its own plane: (kh*kw, C), then the bias's C. The planes
  // are added in order.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, rows / 4));
  const int64_t per_chunk = (rows + chunks - 1) / chunks;
  const int64_t plane = (taps + (with_bias ? 1 : 0)) * d.c;
  std::vector<float> part(chunks * plane, 0.f);
  const float* go = grad_output.const_data_ptr<float>();
  const float* in = input.const_data_ptr<float>();
  parallel_range(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      const int64_t r0 = ch * per_chunk, r1 = std::min(rows, r0 + per_chunk);
      float* p = part.data() + ch * plane;
      if (r0 < r1) grad_weight_rows(go, in, p, with_bias ? p + taps * d.c : nullptr, d, win, r0, r1);
    }
  });
  for (int64_t ch = 1; ch < chunks; ++ch) {
    const float* p = part.data() + ch * plane;
    for (int64_t i = 0; i < plane; ++i) part[i] += p[i];
  }
  // (kh*kw, C) into grad_weight (C, 1, kh, kw); the bias's C into grad_bias.
  float* gw = grad_weight.mutable_data_ptr<float>();
  for (int64_t c = 0; c < d.c; ++c) {
    for (int64_t t = 0; t < taps; ++t) gw[c * taps + t] = part[t * d.c + c];
  }
  if (with_bias) std::copy(part.begin() + taps * d.c, part.begin() + plane, grad_bias.mutable_data_ptr<float>());
  return true;
}

}  // namespace

DepthwiseChannelsLastKernels cpu_depthwise_channels_last_kernels() {
  return {&forward_cl_cpu, &grad_input_cl_cpu, &grad_weight_cl_cpu};
}

}  // namespace customconv
