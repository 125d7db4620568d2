#include "ops/conv2d/grouped_direct_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/common/cpu_simd.h"
#include "ops/common/launch.h"
#include "ops/common/parallel_cpu.h"

namespace customconv {
namespace {

constexpr int kBlock = 4;  // output positions per block
// Weights up to this size stay cached while a row of positions runs through
// every output channel; larger ones (ResNeXt's 14x14 and 7x7 stages: 0.3 and
// 1.2 MB) run each lane block over a whole image instead.
constexpr int64_t kCachedWeightBytes = 256 << 10;

struct Geometry {
  int64_t n, h, w, c, k, p, q;  // input (n, h, w, c), output (n, p, q, k)
  int64_t cg, kg;               // channels per group: input, output
  Window2d win;
};

// The multiply-adds of a pass over every output position (its work for
// parallel_range_sized).
int64_t pass_work(const Geometry& g) { return g.n * g.p * g.q * g.win.kh * g.win.kw * g.cg * g.k; }

// The input value of each of the 8 lanes of a lane block (8 output channels
// from a multiple of 8) at one position and one channel c of its group: src
// points at that channel of the block's first group. (Where all 8 lanes hold
// one value, the kernels multiply by it as a scalar instead: V{} + x adds
// +0.0, which GCC keeps, and costs two more instructions per broadcast.) KG: the output channels
// per group where that is 1, 2 or 4 (8 / KG groups share the block, each value
// repeated KG times); 8 for any multiple of 8 (one group: one value).
template <int KG>
__attribute__((always_inline)) inline Float8 lane_values(const float* src, int64_t cg) {
  if constexpr (KG >= 8) {
    return Float8{} + src[0];
  } else if constexpr (KG == 4) {
    const float a = src[0], b = src[cg];
    return Float8{a, a, a, a, b, b, b, b};
  } else if constexpr (KG == 2) {
    const float a = src[0], b = src[cg], c = src[2 * cg], d = src[3 * cg];
    return Float8{a, a, b, b, c, c, d, d};
  } else {
    return Float8{src[0],      src[cg],     src[2 * cg], src[3 * cg],
                  src[4 * cg], src[5 * cg], src[6 * cg], src[7 * cg]};
  }
}

// The reduction of one tap shared by the forward and the strided input
// gradient: for each of the n reduced channels r (a group's channels on the
// other side), acc[t][l] += lane_values<L>(src[t] + r, n) * w[l * wstride +
// 8 r .. + 8], for every position t whose src[t] is set (null: the tap falls
// outside) and lane block l; each broadcast value feeds LB multiply-adds.
template <int L, int P, int LB>
__attribute__((always_inline)) inline void accumulate_lanes(Float8 (&acc)[P][LB],
                                                            const float* const (&src)[P],
                                                            const float* w, int64_t wstride,
                                                            int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    Float8 wv[LB];
    for (int l = 0; l < LB; ++l) wv[l] = load8(w + l * wstride + r * 8);
    for (int t = 0; t < P; ++t) {
      if (src[t] == nullptr) continue;
      if constexpr (L >= 8) {  // one value: a scalar, broadcast from memory in one instruction
        const float v = src[t][r];
        for (int l = 0; l < LB; ++l) acc[t][l] += wv[l] * v;
      } else {
        const Float8 v = lane_values<L>(src[t] + r, n);
        for (int l = 0; l < LB; ++l) acc[t][l] += v * wv[l];
      }
    }
  }
}

// Output positions x0..x0+P-1 of row y of one image, output channels
// [8 kb, 8 (kb + LB)): P x LB vector accumulators over the taps and the
// group's input channels, the weight read as wt (K/8, kh, kw, cg, 8). LB = 2
// (two lane blocks of one group sharing each broadcast input value) needs 16
// or more output channels per group.
template <int KG, int P, int LB>
__attribute__((always_inline)) inline void block(const float* img, const float* wt,
                                                 const float* bias, float* orow, const Geometry& g,
                                                 int64_t y, int64_t x0, int64_t kb) {
  const Window2d& k = g.win;
  const int64_t k0 = kb * 8;
  const float* first = img + (k0 / g.kg) * g.cg;  // the block's first group's channels
  Float8 acc[P][LB];
  for (int l = 0; l < LB; ++l) {
    const Float8 b = bias != nullptr ? load8(bias + k0 + 8 * l) : Float8{};
    for (int t = 0; t < P; ++t) acc[t][l] = b;
  }
  const int64_t wstride = k.kh * k.kw * g.cg * 8;  // between lane blocks
  const float* wblock = wt + kb * wstride;
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t iy = y * k.sh - k.ph + i * k.dh;
    if (iy < 0 || iy >= g.h) continue;
    const float* row = first + iy * g.w * g.c;
    for (int64_t j = 0; j < k.kw; ++j) {
      const float* src[P];
      for (int t = 0; t < P; ++t) {
        const int64_t ix = (x0 + t) * k.sw - k.pw + j * k.dw;
        src[t] = ix >= 0 && ix < g.w ? row + ix * g.c : nullptr;
      }
      const float* w = wblock + (i * k.kw + j) * g.cg * 8;
      if constexpr (KG == 4) {
        if (g.cg == 4) {  // the block's two groups' 8 input channels in one load
          for (int t = 0; t < P; ++t) {
            if (src[t] == nullptr) continue;
            const Float8 v = load8(src[t]);
            typedef int Int8 __attribute__((vector_size(32)));
            acc[t][0] += __builtin_shuffle(v, Int8{0, 0, 0, 0, 4, 4, 4, 4}) * load8(w);
            acc[t][0] += __builtin_shuffle(v, Int8{1, 1, 1, 1, 5, 5, 5, 5}) * load8(w + 8);
            acc[t][0] += __builtin_shuffle(v, Int8{2, 2, 2, 2, 6, 6, 6, 6}) * load8(w + 16);
            acc[t][0] += __builtin_shuffle(v, Int8{3, 3, 3, 3, 7, 7, 7, 7}) * load8(w + 24);
          }
          continue;
        }
      }
      accumulate_lanes<KG>(acc, src, w, wstride, g.cg);
    }
  }
  for (int t = 0; t < P; ++t) {
    for (int l = 0; l < LB; ++l) store8(orow + (x0 + t) * g.k + k0 + 8 * l, acc[t][l]);
  }
}

template <int KG, int P>
__attribute__((always_inline)) inline void position_blocks(const float* img, const float* wt,
                                                           const float* bias, float* orow,
                                                           const Geometry& g, int64_t y,
                                                           int64_t x) {
  const int64_t blocks = g.k / 8;
  if constexpr (KG >= 8) {
    if (g.kg % 16 == 0) {  // pairs of lane blocks, each pair inside one group
      for (int64_t kb = 0; kb < blocks; kb += 2) block<KG, P, 2>(img, wt, bias, orow, g, y, x, kb);
      return;
    }
  }
  for (int64_t kb = 0; kb < blocks; ++kb) block<KG, P, 1>(img, wt, bias, orow, g, y, x, kb);
}

// The positions of a row's next block with `left` positions to go: blocks
// of kBlock, the row ending in blocks of 3 rather than of 2 or 1 (7 as 4 + 3,
// 14 as 4 + 4 + 3 + 3), whose few sums leave the multiply-add units waiting on
// their latency (on ResNeXt's 7x7 stage the blocks of 1 and 2 took a third of
// the time).
inline int block_positions(int64_t left) {
  return left >= 2 * kBlock || left == kBlock ? kBlock : left >= 3 ? 3 : int(left);
}

// A row's positions in blocks of block_positions().
template <int KG>
__attribute__((always_inline)) inline void row_blocks(const float* img, const float* wt,
                                                      const float* bias, float* orow,
                                                      const Geometry& g, int64_t y) {
  for (int64_t x = 0; x < g.q;) {
    const int b = block_positions(g.q - x);
    switch (b) {
      case kBlock: position_blocks<KG, kBlock>(img, wt, bias, orow, g, y, x); break;
      case 3: position_blocks<KG, 3>(img, wt, bias, orow, g, y, x); break;
      case 2: position_blocks<KG, 2>(img, wt, bias, orow, g, y, x); break;
      default: position_blocks<KG, 1>(img, wt, bias, orow, g, y, x); break;
    }
    x += b;
  }
}

// Output rows [r0, r1) (r = n * p + y).
CUSTOMCONV_CPU_CLONES void forward_rows(const float* in, const float* wt, const float* bias,
                                        float* out, Geometry g, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* img = in + (r / g.p) * g.h * g.w * g.c;
    float* orow = out + r * g.q * g.k;
    const int64_t y = r % g.p;
    switch (g.kg) {
      case 1: row_blocks<1>(img, wt, bias, orow, g, y); break;
      case 2: row_blocks<2>(img, wt, bias, orow, g, y); break;
      case 4: row_blocks<4>(img, wt, bias, orow, g, y); break;
      default: row_blocks<8>(img, wt, bias, orow, g, y); break;
    }
  }
}

// Lane blocks [kb0, kb1) of image n, every output position, LB lane blocks
// of one group at a time: their weights stay in the L1 cache while they sweep
// the image (for weights too large to stay cached across positions). With 32
// or more output channels a group (ResNeXt's 14x14 and 7x7 stages), 4 lane
// blocks x 2 positions, each broadcast feeding 4 multiply-adds (the 7x7
// layer 0.73 -> 0.67 ms at N=4 against 2 x 4).
template <int KG, int LB>
__attribute__((always_inline)) inline void image_blocks(const float* img, const float* wt,
                                                        const float* bias, float* oimg,
                                                        const Geometry& g, int64_t kb0,
                                                        int64_t kb1) {
  for (int64_t kb = kb0; kb < kb1; kb += LB) {
    for (int64_t y = 0; y < g.p; ++y) {
      float* orow = oimg + y * g.q * g.k;
      if constexpr (LB == 4) {  // 2 positions x 4 lane blocks: 8 accumulators
        int64_t x = 0;
        for (; x + 2 <= g.q; x += 2) block<KG, 2, LB>(img, wt, bias, orow, g, y, x, kb);
        if (x < g.q) block<KG, 1, LB>(img, wt, bias, orow, g, y, x, kb);
        continue;
      }
      for (int64_t x = 0; x < g.q;) {
        const int b = block_positions(g.q - x);
        switch (b) {
          case kBlock: block<KG, kBlock, LB>(img, wt, bias, orow, g, y, x, kb); break;
          case 3: block<KG, 3, LB>(img, wt, bias, orow, g, y, x, kb); break;
          case 2: block<KG, 2, LB>(img, wt, bias, orow, g, y, x, kb); break;
          default: block<KG, 1, LB>(img, wt, bias, orow, g, y, x, kb); break;
        }
        x += b;
      }
    }
  }
}

// Work items [i0, i1) of (image, chunk of kChunk lane blocks).
constexpr int64_t kChunk = 8;
CUSTOMCONV_CPU_CLONES void forward_images(const float* in, const float* wt, const float* bias,
                                          float* out, Geometry g, int64_t i0, int64_t i1) {
  const int64_t chunks = (g.k / 8 + kChunk - 1) / kChunk;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / chunks, kb0 = item % chunks * kChunk;
    const int64_t kb1 = std::min(g.k / 8, kb0 + kChunk);
    const float* img = in + n * g.h * g.w * g.c;
    float* oimg = out + n * g.p * g.q * g.k;
    switch (g.kg) {
      case 1: image_blocks<1, 1>(img, wt, bias, oimg, g, kb0, kb1); break;
      case 2: image_blocks<2, 1>(img, wt, bias, oimg, g, kb0, kb1); break;
      case 4: image_blocks<4, 1>(img, wt, bias, oimg, g, kb0, kb1); break;
      default:
        if (g.kg % 16 == 0) {
          if (g.kg % 32 == 0) {
            image_blocks<8, 4>(img, wt, bias, oimg, g, kb0, kb1);
          } else {
            image_blocks<8, 2>(img, wt, bias, oimg, g, kb0, kb1);
          }
        } else {
          image_blocks<8, 1>(img, wt, bias, oimg, g, kb0, kb1);
        }
        break;
    }
  }
}

#if CUSTOMCONV_CPU_ISA_BUILDS
// The forward of groups of a multiple of 16 output channels on the AVX-512
// build (ResNeXt's 14x14 and 7x7 stages), 16 output channels of one group a
// vector: a block is kWidePositions output positions of one image (taken in
// (y, x) order across rows, so that 7- and 14-wide rows fill whole blocks) x
// LB vectors, LB = 2 where the group has a multiple of 32 output channels.
// Each input value is broadcast once for LB multiply-adds of 16 lanes; the
// weight is read as (K/16, kh, kw, cg, 16). Work items are (image, chunk of
// kChunk vectors' channels), each vector's weights swept over the image.
constexpr int kWidePositions = 6;

template <int LB>
__attribute__((always_inline)) inline void wide_block(const float* img, const float* wt,
                                                      const float* bias, const float* zeros,
                                                      float* oimg, const Geometry& g, int64_t m0,
                                                      int count, int64_t k0) {
  constexpr int P = kWidePositions;
  const Window2d& k = g.win;
  const float* first = img + (k0 / g.kg) * g.cg;  // the group's first input channel
  Float16 acc[P][LB];
  for (int l = 0; l < LB; ++l) {
    const Float16 b = bias != nullptr ? loadv<Float16>(bias + k0 + 16 * l) : Float16{};
    for (int t = 0; t < P; ++t) acc[t][l] = b;
  }
  int64_t oy[P], ox[P];
  for (int t = 0; t < P; ++t) {
    const int64_t m = m0 + std::min(t, count - 1);
    oy[t] = m / g.q * k.sh - k.ph, ox[t] = m % g.q * k.sw - k.pw;
  }
  const int64_t wstride = k.kh * k.kw * g.cg * 16;  // between vectors
  const float* wblock = wt + (k0 / 16) * wstride;
  for (int64_t i = 0; i < k.kh; ++i) {
    for (int64_t j = 0; j < k.kw; ++j) {
      // (A tap outside the input, or a position past `count`, reads zeros:
      // no branch in the reduction; a tap outside for every position is skipped.)
      const float* src[P];
      bool any = false;
      for (int t = 0; t < P; ++t) {
        const int64_t iy = oy[t] + i * k.dh, ix = ox[t] + j * k.dw;
        const bool inside = t < count && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        src[t] = inside ? first + (iy * g.w + ix) * g.c : zeros;
        any = any || inside;
      }
      if (!any) continue;
      const float* w = wblock + (i * k.kw + j) * g.cg * 16;
      for (int64_t r = 0; r < g.cg; ++r) {
        Float16 wv[LB];
        for (int l = 0; l < LB; ++l) wv[l] = loadv<Float16>(w + l * wstride + r * 16);
        for (int t = 0; t < P; ++t) {
          const float v = src[t][r];  // a scalar: one broadcast from memory
          for (int l = 0; l < LB; ++l) acc[t][l] += wv[l] * v;
        }
      }
    }
  }
  for (int t = 0; t < count; ++t) {
    for (int l = 0; l < LB; ++l) storev(oimg + (m0 + t) * g.k + k0 + 16 * l, acc[t][l]);
  }
}

__attribute__((target("arch=x86-64-v4"))) void wide_forward_images(const float* in, const float* wt,
                                                                   const float* bias, const float* zeros,
                                                                   float* out, Geometry g, int64_t i0,
                                                                   int64_t i1) {
  const int64_t vectors = g.k / 16, chunks = (vectors + kChunk - 1) / kChunk;
  const int64_t positions = g.p * g.q;
  const bool pairs = g.kg % 32 == 0;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / chunks, v0 = item % chunks * kChunk;
    const int64_t v1 = std::min(vectors, v0 + kChunk);
    const float* img = in + n * g.h * g.w * g.c;
    float* oimg = out + n * positions * g.k;
    for (int64_t v = v0; v < v1; v += pairs ? 2 : 1) {
      for (int64_t m = 0; m < positions; m += kWidePositions) {
        const int count = int(std::min<int64_t>(kWidePositions, positions - m));
        if (pairs) {
          wide_block<2>(img, wt, bias, zeros, oimg, g, m, count, v * 16);
        } else {
          wide_block<1>(img, wt, bias, zeros, oimg, g, m, count, v * 16);
        }
      }
    }
  }
}
#endif

// ------------------------------------------------- input channels as the lanes

// Groups of 8 input channels and a multiple of 8 output channels (ResNeXt-50's
// 28x28 stage, every grouped layer of RegNet), where the kernels above
// broadcast each input value to feed a single vector multiply-add. Here the
// group's 8 input channels at a tap are one vector, multiplied by 8 weight
// vectors (one per output channel of a block of 8, the input channels as the
// lanes) into 8 accumulators whose lanes are input channels. After the taps
// the 8 x 8 tile is transposed in registers and its rows added: the block's
// 8 outputs as one vector. No broadcasts: 9 loads per 8 multiply-adds, and 8
// independent sums. (With 16 or 32 input channels per group the same scheme
// measured no faster than the broadcasting kernel, whose two lane blocks
// share each broadcast there: it is bound by its weight loads.)
//
// Thread mapping: rows of output positions (n, y) over ATen's threads; a row
// runs group by group, each group's output blocks one at a time over the
// row's positions, the block's weights (w8: (groups, kg/8, kh, kw, 8, 8),
// 2.3 KB for a 3x3 window) staying in L1. (Items of an image's whole plane
// per group measured up to 1.7x slower on a stride-2 layer from 56x56: each
// load of a group's 8 channels takes a cache line of its own there.)
CUSTOMCONV_CPU_CLONES void forward_channel_lanes(const float* in, const float* w8, const float* bias,
                                                 float* out, Geometry g, int64_t r0, int64_t r1) {
  const Window2d& k = g.win;
  const int64_t groups = g.c / 8, taps = k.kh * k.kw, kblocks = g.kg / 8;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t y = r % g.p;
    const float* img = in + (r / g.p) * g.h * g.w * g.c;
    float* orow = out + r * g.q * g.k;
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const float* wk = w8 + (gi * kblocks + kb) * taps * 64;
        const int64_t k0 = gi * g.kg + kb * 8;
        const Float8 b = bias != nullptr ? load8(bias + k0) : Float8{};
        for (int64_t x = 0; x < g.q; ++x) {
          Float8 acc[8] = {};
          for (int64_t i = 0; i < k.kh; ++i) {
            const int64_t iy = y * k.sh - k.ph + i * k.dh;
            if (iy < 0 || iy >= g.h) continue;
            for (int64_t j = 0; j < k.kw; ++j) {
              const int64_t ix = x * k.sw - k.pw + j * k.dw;
              if (ix < 0 || ix >= g.w) continue;
              const Float8 v = load8(img + (iy * g.w + ix) * g.c + gi * 8);
              const float* wt = wk + (i * k.kw + j) * 64;
              for (int kk = 0; kk < 8; ++kk) acc[kk] += v * load8(wt + kk * 8);
            }
          }
          transpose_tile<Float8>(acc);  // acc[c][kk]: input channel c's part of output kk
          Float8 sum = b + acc[0];
          for (int c = 1; c < 8; ++c) sum += acc[c];
          store8(orow + x * g.k + k0, sum);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- weight gradient


// The weight gradient of lane blocks kb..kb+LB-1 (output channels
// [8 kb, 8 (kb + LB)), one group's when LB = 2) at tap (i, j) for input
// channels [c0, c0 + CB) of each lane's group, summed over every output
// position in order: LB x CB vector accumulators, grad_output's 8 LB channels
// loaded once per position, each input value broadcast once for LB
// multiply-adds. Written to gw (K, kh, kw, cg).
template <int KG, int CB, int LB>
__attribute__((always_inline)) inline void weight_item(const float* go, const float* in, float* gw,
                                                       const Geometry& g, int64_t kb, int64_t i,
                                                       int64_t j, int64_t c0) {
  const Window2d& k = g.win;
  const int64_t k0 = kb * 8;
  const float* first = in + (k0 / g.kg) * g.cg + c0;
  Float8 acc[LB][CB];
  for (int l = 0; l < LB; ++l) {
    for (int cc = 0; cc < CB; ++cc) acc[l][cc] = Float8{};
  }
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t y = 0; y < g.p; ++y) {
      const int64_t iy = y * k.sh - k.ph + i * k.dh;
      if (iy < 0 || iy >= g.h) continue;
      const float* grow = go + ((n * g.p + y) * g.q) * g.k + k0;
      const float* xrow = first + ((n * g.h + iy) * g.w) * g.c;
      // The output columns x whose input column x * sw - pw + j * dw is in [0, w).
      const int64_t off = j * k.dw - k.pw;
      const int64_t lo = off >= 0 ? 0 : (-off + k.sw - 1) / k.sw;
      const int64_t hi = std::min(g.q, g.w - 1 - off >= 0 ? (g.w - 1 - off) / k.sw + 1 : 0);
      for (int64_t x = lo; x < hi; ++x) {
        Float8 gv[LB];
        for (int l = 0; l < LB; ++l) gv[l] = load8(grow + x * g.k + 8 * l);
        const float* src = xrow + (x * k.sw + off) * g.c;
        if constexpr (KG == 4 && CB == 4 && LB == 1) {
          if (g.cg == 4) {  // the block's two groups' 8 input channels in one load
            typedef int Int8 __attribute__((vector_size(32)));
            const Float8 v = load8(src);
            acc[0][0] += gv[0] * __builtin_shuffle(v, Int8{0, 0, 0, 0, 4, 4, 4, 4});
            acc[0][1] += gv[0] * __builtin_shuffle(v, Int8{1, 1, 1, 1, 5, 5, 5, 5});
            acc[0][2] += gv[0] * __builtin_shuffle(v, Int8{2, 2, 2, 2, 6, 6, 6, 6});
            acc[0][3] += gv[0] * __builtin_shuffle(v, Int8{3, 3, 3, 3, 7, 7, 7, 7});
            continue;
          }
        }
        for (int cc = 0; cc < CB; ++cc) {
          if constexpr (KG >= 8) {  // one value: a scalar, as in accumulate_lanes
            const float v = src[cc];
            for (int l = 0; l < LB; ++l) acc[l][cc] += gv[l] * v;
          } else {
            const Float8 v = lane_values<KG>(src + cc, g.cg);
            for (int l = 0; l < LB; ++l) acc[l][cc] += gv[l] * v;
          }
        }
      }
    }
  }
  // gw (K, kh, kw, cg): lane l's channel k0 + l.
  const int64_t lane_stride = k.kh * k.kw * g.cg;
  for (int l = 0; l < LB; ++l) {
    float* dst = gw + (((k0 + 8 * l) * k.kh + i) * k.kw + j) * g.cg + c0;
    for (int cc = 0; cc < CB; ++cc) {
      for (int lane = 0; lane < 8; ++lane) dst[lane * lane_stride + cc] = acc[l][cc][lane];
    }
  }
}

// Input channels per item: 8 with one lane block, 4 with two (their 2 x 4
// accumulators, two grad_output vectors and a broadcast fit the 16 AVX
// registers, and each broadcast feeds two multiply-adds).
template <int LB>
constexpr int64_t kChannelBlock = LB == 1 ? 8 : 4;

template <int KG, int LB>
__attribute__((always_inline)) inline void weight_item_any(const float* go, const float* in,
                                                           float* gw, const Geometry& g,
                                                           int64_t kb, int64_t i, int64_t j,
                                                           int64_t c0) {
  const int64_t cb = std::min<int64_t>(kChannelBlock<LB>, g.cg - c0);
  if constexpr (kChannelBlock<LB> == 8) {
    if (cb == 8) return weight_item<KG, 8, LB>(go, in, gw, g, kb, i, j, c0);
  }
  if (cb == 4) return weight_item<KG, 4, LB>(go, in, gw, g, kb, i, j, c0);
  for (int64_t c = c0; c < c0 + cb; ++c) weight_item<KG, 1, LB>(go, in, gw, g, kb, i, j, c);
}

// Lane blocks taken LB at a time by the weight gradient's items: 2 where a
// group has 16 or more output channels (a multiple of 16).
int64_t weight_lane_blocks(const Geometry& g) { return g.kg % 16 == 0 ? 2 : 1; }

// The weight gradient's items: (LB lane blocks, tap, block of input channels).
int64_t weight_item_count(const Geometry& g) {
  const int64_t lb = weight_lane_blocks(g), cblock = lb == 2 ? kChannelBlock<2> : kChannelBlock<1>;
  return (g.k / 8 / lb) * g.win.kh * g.win.kw * ((g.cg + cblock - 1) / cblock);
}

// Items [t0, t1) of (LB lane blocks, tap, block of kChannelBlock<LB> input
// channels), lane blocks outermost; each sums over every position on its own,
// so the result does not depend on how the items are spread over threads.
template <int LB>
__attribute__((always_inline)) inline void weight_items_with(const float* go, const float* in,
                                                             float* gw, const Geometry& g,
                                                             int64_t t0, int64_t t1) {
  const int64_t taps = g.win.kh * g.win.kw;
  const int64_t cblocks = (g.cg + kChannelBlock<LB> - 1) / kChannelBlock<LB>;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t kb = t / (taps * cblocks) * LB, tap = t / cblocks % taps;
    const int64_t i = tap / g.win.kw, j = tap % g.win.kw, c0 = t % cblocks * kChannelBlock<LB>;
    if constexpr (LB == 2) {
      weight_item_any<8, 2>(go, in, gw, g, kb, i, j, c0);
    } else {
      switch (g.kg) {
        case 1: weight_item_any<1, 1>(go, in, gw, g, kb, i, j, c0); break;
        case 2: weight_item_any<2, 1>(go, in, gw, g, kb, i, j, c0); break;
        case 4: weight_item_any<4, 1>(go, in, gw, g, kb, i, j, c0); break;
        default: weight_item_any<8, 1>(go, in, gw, g, kb, i, j, c0); break;
      }
    }
  }
}

CUSTOMCONV_CPU_CLONES void weight_items(const float* go, const float* in, float* gw, Geometry g,
                                        int64_t t0, int64_t t1) {
  if (weight_lane_blocks(g) == 2) {
    weight_items_with<2>(go, in, gw, g, t0, t1);
  } else {
    weight_items_with<1>(go, in, gw, g, t0, t1);
  }
}

#if CUSTOMCONV_CPU_ISA_BUILDS
// The weight gradient of groups of a multiple of 16 output channels on the
// AVX-512 build (ResNeXt's 14x14 and 7x7 stages: 16 and 32 a group): an item
// is LB vectors of 16 output channels of one group, a tap, and up to CB of
// the group's input channels, summed over every output position in order.
// Per position: LB loads of grad_output, and CB input values each broadcast
// once for LB multiply-adds of 16 lanes (the 8-lane items above: 2 loads and
// 4 broadcasts for 8 multiply-adds of 8 lanes). LB = 2 and CB = 8 where a
// group has a multiple of 32 output channels, else LB = 1 and CB = 16: 16
// accumulators with the grad_output vectors within the 32 registers.
struct WideWeightBlocks {
  int64_t lb, cb;
};
WideWeightBlocks wide_weight_blocks(const Geometry& g) {
  return g.kg % 32 == 0 ? WideWeightBlocks{2, 8} : WideWeightBlocks{1, 16};
}
int64_t wide_weight_item_count(const Geometry& g) {
  const WideWeightBlocks b = wide_weight_blocks(g);
  return g.k / (16 * b.lb) * g.win.kh * g.win.kw * ((g.cg + b.cb - 1) / b.cb);
}

// Output channels [k0, k0 + 16 LB) of one group at tap (i, j), input channels
// [c0, c0 + CB) of the group, over output rows [r0, r1) (r = n * p + y): the
// sums continue from acc_mem ([LB][CS] vectors, CS >= CB: the item's
// accumulators between chunks of rows), zeros where `first`.
template <int LB, int CB, int CS>
__attribute__((always_inline)) inline void wide_weight_rows(const float* __restrict__ go,
                                                            const float* __restrict__ in,
                                                            float* __restrict__ acc_mem, const Geometry& g,
                                                            int64_t k0, int64_t i, int64_t j, int64_t c0,
                                                            int64_t r0, int64_t r1, bool first_rows) {
  const Window2d& k = g.win;
  const float* first = in + (k0 / g.kg) * g.cg + c0;
  Float16 acc[LB][CB];
  for (int l = 0; l < LB; ++l) {
    for (int cc = 0; cc < CB; ++cc) {
      acc[l][cc] = first_rows ? Float16{} : loadv<Float16>(acc_mem + (l * CS + cc) * 16);
    }
  }
  const int64_t off = j * k.dw - k.pw;
  // The output columns x whose input column x * sw + off is in [0, w).
  const int64_t lo = off >= 0 ? 0 : (-off + k.sw - 1) / k.sw;
  const int64_t hi = std::min(g.q, g.w - 1 - off >= 0 ? (g.w - 1 - off) / k.sw + 1 : 0);
  // The rows whose tap row iy = y * sh - ph + i * dh lies in [0, h).
  const int64_t yoff = i * k.dh - k.ph;
  const int64_t ylo = yoff >= 0 ? 0 : (-yoff + k.sh - 1) / k.sh;
  const int64_t yhi = std::min(g.p, g.h - 1 - yoff >= 0 ? (g.h - 1 - yoff) / k.sh + 1 : 0);
  for (int64_t n = r0 / g.p; n * g.p < r1; ++n) {
    const int64_t y0 = std::max(ylo, r0 - n * g.p), y1 = std::min(yhi, r1 - n * g.p);
    for (int64_t y = y0; y < y1; ++y) {
      const float* grow = go + (n * g.p + y) * g.q * g.k + k0;
      const float* xrow = first + ((n * g.h + y * k.sh + yoff) * g.w) * g.c;
      for (int64_t x = lo; x < hi; ++x) {
        Float16 gv[LB];
        for (int l = 0; l < LB; ++l) gv[l] = loadv<Float16>(grow + x * g.k + 16 * l);
        const float* src = xrow + (x * k.sw + off) * g.c;
        for (int cc = 0; cc < CB; ++cc) {
          const float v = src[cc];  // a scalar: one broadcast from memory
          for (int l = 0; l < LB; ++l) acc[l][cc] += gv[l] * v;
        }
      }
    }
  }
  for (int l = 0; l < LB; ++l) {
    for (int cc = 0; cc < CB; ++cc) storev(acc_mem + (l * CS + cc) * 16, acc[l][cc]);
  }
}

// Output rows a chunk of the weight gradient takes: about 64 KB of
// grad_output, which stays in the core's cache while the thread's items run
// over it, and at least 512 positions, over which an item's accumulators
// are loaded and stored once (with 7x7 planes, chunks of 64 KB made ResNeXt's
// grouped weight gradient 0.56 -> 0.73 ms).
int64_t wide_weight_chunk_rows(const Geometry& g) {
  const int64_t by_bytes = (int64_t(64) << 10) / std::max<int64_t>(g.q * g.k * 4, 1);
  const int64_t by_positions = (512 + g.q - 1) / std::max<int64_t>(g.q, 1);
  return std::max<int64_t>({1, by_bytes, by_positions});
}

// Item t's sums (acc: [LB][CB] vectors) written to gw (K, kh, kw, cg).
template <int LB, int CB>
__attribute__((always_inline)) inline void store_wide_item(float* gw, const Geometry& g, int64_t t,
                                                           const float* acc) {
  const int64_t taps = g.win.kh * g.win.kw, cblocks = (g.cg + CB - 1) / CB;
  const int64_t k0 = t / (taps * cblocks) * 16 * LB, tap = t / cblocks % taps;
  const int64_t c0 = t % cblocks * CB, cb = std::min<int64_t>(CB, g.cg - c0);
  const int64_t lane_stride = taps * g.cg;
  for (int l = 0; l < LB; ++l) {
    float* dst = gw + ((k0 + 16 * l) * taps + tap) * g.cg + c0;
    for (int64_t cc = 0; cc < cb; ++cc) {
      for (int lane = 0; lane < 16; ++lane) dst[lane * lane_stride + cc] = acc[(l * CB + cc) * 16 + lane];
    }
  }
}

// Item t over output rows [r0, r1), its sums continuing from acc ([LB][CB]
// vectors); a last, partial block of input channels runs 4 at a time, then
// the 1 to 3 left together: each pass streams grad_output once, and an RGB
// stem's 3 channels keep 3 LB accumulators' chains in flight (one at a time,
// each pass's LB multiply-add chains waited on the FMA latency: ResNet's 7x7
// stem at N=4 on 2 cores took 10.4 ms against oneDNN's 5.9).
template <int LB, int CB>
__attribute__((always_inline)) inline void wide_item_rows(const float* go, const float* in, float* acc,
                                                          const Geometry& g, int64_t t, int64_t r0,
                                                          int64_t r1) {
  const int64_t taps = g.win.kh * g.win.kw, cblocks = (g.cg + CB - 1) / CB;
  const int64_t k0 = t / (taps * cblocks) * 16 * LB, tap = t / cblocks % taps;
  const int64_t i = tap / g.win.kw, j = tap % g.win.kw, c0 = t % cblocks * CB;
  const int64_t cb = std::min<int64_t>(CB, g.cg - c0);
  if (cb == CB) {
    wide_weight_rows<LB, CB, CB>(go, in, acc, g, k0, i, j, c0, r0, r1, r0 == 0);
    return;
  }
  int64_t c = 0;
  for (; c + 4 <= cb; c += 4) wide_weight_rows<LB, 4, CB>(go, in, acc + c * 16, g, k0, i, j, c0 + c, r0, r1, r0 == 0);
  switch (cb - c) {
    case 3: wide_weight_rows<LB, 3, CB>(go, in, acc + c * 16, g, k0, i, j, c0 + c, r0, r1, r0 == 0); break;
    case 2: wide_weight_rows<LB, 2, CB>(go, in, acc + c * 16, g, k0, i, j, c0 + c, r0, r1, r0 == 0); break;
    case 1: wide_weight_rows<LB, 1, CB>(go, in, acc + c * 16, g, k0, i, j, c0 + c, r0, r1, r0 == 0); break;
    default: break;
  }
}

// Items [t0, t1) of (LB vectors of output channels, tap, block of CB input
// channels), output channels outermost. Every item's sum runs over the output
// rows in order (the same result with any thread count). Where the rows make
// more than one chunk, the items run a chunk at a time, their accumulators
// kept in `scratch` between chunks; otherwise each item runs whole.
template <int LB, int CB>
__attribute__((always_inline)) inline void wide_weight_items_with(const float* go, const float* in,
                                                                  float* gw, const Geometry& g,
                                                                  int64_t t0, int64_t t1, float* scratch) {
  const int64_t rows = g.n * g.p, chunk = wide_weight_chunk_rows(g);
  constexpr int64_t kItemFloats = LB * CB * 16;
  if (rows <= chunk) {
    float acc[kItemFloats];
    for (int64_t t = t0; t < t1; ++t) {
      wide_item_rows<LB, CB>(go, in, acc, g, t, 0, rows);
      store_wide_item<LB, CB>(gw, g, t, acc);
    }
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    for (int64_t t = t0; t < t1; ++t) {
      wide_item_rows<LB, CB>(go, in, scratch + (t - t0) * kItemFloats, g, t, r0, std::min(rows, r0 + chunk));
    }
  }
  for (int64_t t = t0; t < t1; ++t) store_wide_item<LB, CB>(gw, g, t, scratch + (t - t0) * kItemFloats);
}

__attribute__((target("arch=x86-64-v4"))) void wide_weight_items(const float* go, const float* in,
                                                                 float* gw, Geometry g, int64_t t0,
                                                                 int64_t t1, float* scratch) {
  if (wide_weight_blocks(g).lb == 2) {
    wide_weight_items_with<2, 8>(go, in, gw, g, t0, t1, scratch);
  } else {
    wide_weight_items_with<1, 16>(go, in, gw, g, t0, t1, scratch);
  }
}

// wide_weight_items over ATen's threads, each range with its own scratch
// where the rows make more than one chunk.
void run_wide_weight_items(const float* go, const float* in, float* gw, const Geometry& g) {
  const int64_t item_floats = wide_weight_blocks(g).lb * wide_weight_blocks(g).cb * 16;
  const bool chunked = g.n * g.p > wide_weight_chunk_rows(g);
  parallel_range_sized(wide_weight_item_count(g), 1, pass_work(g), [&](int64_t t0, int64_t t1) {
    std::unique_ptr<float[]> scratch(chunked ? new float[static_cast<size_t>((t1 - t0) * item_floats)] : nullptr);
    wide_weight_items(go, in, gw, g, t0, t1, scratch.get());
  });
}
#endif

// Groups of 8 output channels with a multiple of 8 input channels and rows of
// 3 taps (ResNeXt's 28x28 stage, RegNet): the weight gradient with input
// channels as the lanes. An item is 4 output channels x a row of 3 taps x 8
// input channels of one group: per output position, the 3 taps' input
// vectors are loaded once and each grad_output value broadcast once for 3
// multiply-adds (the items above broadcast one input value per
// multiply-add: with 8 output channels a group there is no second lane block
// to share it). 12 accumulators (2 output channels an item, 6, measured
// slower: each item streams the group's input from L2 again), summed over
// every position in order (the result does not depend on the thread count),
// stored as whole vectors: gw (K, kh, kw, cg) holds a tap's input channels
// contiguously.
constexpr int kLanesKPerItem = 4;

CUSTOMCONV_CPU_CLONES void weight_items_channel_lanes(const float* go, const float* in, float* gw,
                                                      Geometry g, int64_t t0, int64_t t1) {
  constexpr int KB = kLanesKPerItem, KW = 3;
  const Window2d& k = g.win;
  const int64_t cblocks = g.cg / 8, kpairs = 8 / KB;
  for (int64_t t = t0; t < t1; ++t) {
    // t = ((group * cblocks + cb) * kh + i) * kpairs + kp
    const int64_t kp = t % kpairs, i = t / kpairs % k.kh, cb = t / (kpairs * k.kh) % cblocks;
    const int64_t gi = t / (kpairs * k.kh * cblocks);
    const int64_t k0 = gi * 8 + kp * KB;
    const float* xbase = in + gi * g.cg + cb * 8;
    Float8 acc[KW][KB];
    for (int j = 0; j < KW; ++j) {
      for (int kk = 0; kk < KB; ++kk) acc[j][kk] = Float8{};
    }
    for (int64_t n = 0; n < g.n; ++n) {
      for (int64_t y = 0; y < g.p; ++y) {
        const int64_t iy = y * k.sh - k.ph + i * k.dh;
        if (iy < 0 || iy >= g.h) continue;
        const float* grow = go + ((n * g.p + y) * g.q) * g.k + k0;
        const float* xrow = xbase + ((n * g.h + iy) * g.w) * g.c;
        for (int64_t x = 0; x < g.q; ++x) {
          Float8 xv[KW];
          for (int j = 0; j < KW; ++j) {
            const int64_t ix = x * k.sw - k.pw + j * k.dw;
            xv[j] = ix >= 0 && ix < g.w ? load8(xrow + ix * g.c) : Float8{};
          }
          for (int kk = 0; kk < KB; ++kk) {
            const float b = grow[x * g.k + kk];  // (a scalar: one broadcast from memory)
            for (int j = 0; j < KW; ++j) acc[j][kk] += xv[j] * b;
          }
        }
      }
    }
    for (int kk = 0; kk < KB; ++kk) {
      for (int j = 0; j < KW; ++j) store8(gw + (((k0 + kk) * k.kh + i) * KW + j) * g.cg + cb * 8, acc[j][kk]);
    }
  }
}

// The float32 data of a 4-dim tensor (N, C, H, W) laid out channels_last:
// its own where it is, else a copy in `buffer`.
const float* channels_last_data(const at::Tensor& t, std::vector<float>& buffer) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast)) return t.const_data_ptr<float>();
  const int64_t n = t.size(0), c = t.size(1), h = t.size(2), w = t.size(3);
  const int64_t sn = t.stride(0), sc = t.stride(1), sh = t.stride(2), sw = t.stride(3);
  buffer.resize(static_cast<size_t>(n * c * h * w));
  const float* src = t.const_data_ptr<float>();
  float* dst = buffer.data();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x, dst += c) {
        const float* p = src + i * sn + y * sh + x * sw;
        for (int64_t cc = 0; cc < c; ++cc) dst[cc] = p[cc * sc];
      }
    }
  }
  return buffer.data();
}

// weight_items_channel_lanes over every item, spread over ATen's threads
// unless the work is small.
void run_channel_lanes_items(const float* go, const float* in, float* gw, const Geometry& g,
                             int64_t groups) {
  const int64_t items = groups * (g.cg / 8) * g.win.kh * (8 / kLanesKPerItem);
  parallel_range_sized(items, 1, pass_work(g), [&](int64_t t0, int64_t t1) {
    weight_items_channel_lanes(go, in, gw, g, t0, t1);
  });
}

// The weight gradient of a small pointwise layer, gw (K, C) = the sum over
// images of grad_output (K, L) times the input (C, L) transposed, both
// channels_last (rows of channels: an outer product a position, vectorized
// over C) or NCHW (planes of positions: a dot product a channel pair,
// vectorized over positions). gw starts zeroed.
CUSTOMCONV_CPU_CLONES void small_pointwise_weight(const float* go, const float* x, float* gw,
                                                  int64_t n, int64_t c, int64_t k, int64_t l,
                                                  bool channels_last) {
  if (channels_last) {
    for (int64_t m = 0; m < n * l; ++m) {
      const float* xr = x + m * c;
      for (int64_t kk = 0; kk < k; ++kk) {
        const float g = go[m * k + kk];
        float* __restrict__ row = gw + kk * c;
        for (int64_t cc = 0; cc < c; ++cc) row[cc] += g * xr[cc];
      }
    }
    return;
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t cc = 0; cc < c; ++cc) {
      Float8 acc{};
      float tail = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const float* gp = go + (i * k + kk) * l;
        const float* xp = x + (i * c + cc) * l;
        int64_t m = 0;
        for (; m + 8 <= l; m += 8) acc += load8(gp + m) * load8(xp + m);
        for (; m < l; ++m) tail += gp[m] * xp[m];
      }
      float sum = tail;
      for (int e = 0; e < 8; ++e) sum += acc[e];
      gw[kk * c + cc] = sum;
    }
  }
}

// ---------------------------------------------------------------- input gradient

// Input positions x0..x0+P-1 of row y of one image's gradient, input channels
// [8 cb, 8 (cb + LB)) (lane blocks of input channels, lanes mapped to groups
// as lane_values<CG> does with the roles of input and output channels
// swapped; LB = 2 lies in one group, which needs 16 or more input channels
// per group): per tap, the grad_output position each input position maps to
// (cols: kw x w, the grad_output column or -1), its group's output channels
// broadcast (or gathered per lane), each broadcast feeding LB multiply-adds,
// times the weight read as wd (C/8, kh, kw, kg, 8).
template <int CG, int P, int LB>
__attribute__((always_inline)) inline void grad_input_block(const float* gimg, const float* wd,
                                                            const int64_t* cols, float* grow,
                                                            const Geometry& g, int64_t y,
                                                            int64_t x0, int64_t cb) {
  const Window2d& k = g.win;
  const int64_t c0 = cb * 8;
  const float* first = gimg + (c0 / g.cg) * g.kg;  // the block's first group's output channels
  Float8 acc[P][LB];
  for (int t = 0; t < P; ++t) {
    for (int l = 0; l < LB; ++l) acc[t][l] = Float8{};
  }
  const int64_t wstride = k.kh * k.kw * g.kg * 8;  // between lane blocks
  const float* wblock = wd + cb * wstride;
  for (int64_t i = 0; i < k.kh; ++i) {
    const int64_t ty = y + k.ph - i * k.dh;
    if (ty < 0 || ty % k.sh != 0 || ty / k.sh >= g.p) continue;
    const float* row = first + (ty / k.sh) * g.q * g.k;
    for (int64_t j = 0; j < k.kw; ++j) {
      const float* src[P];
      for (int t = 0; t < P; ++t) {
        const int64_t ox = cols[j * g.w + x0 + t];
        src[t] = ox >= 0 ? row + ox * g.k : nullptr;
      }
      const float* w = wblock + (i * k.kw + j) * g.kg * 8;
      accumulate_lanes<CG>(acc, src, w, wstride, g.kg);
    }
  }
  for (int t = 0; t < P; ++t) {
    for (int l = 0; l < LB; ++l) store8(grow + (x0 + t) * g.c + c0 + 8 * l, acc[t][l]);
  }
}

template <int CG, int LB>
__attribute__((always_inline)) inline void grad_input_row_with(const float* gimg, const float* wd,
                                                               const int64_t* cols, float* grow,
                                                               const Geometry& g, int64_t y) {
  for (int64_t x = 0; x < g.w;) {
    const int b = block_positions(g.w - x);
    for (int64_t cb = 0; cb < g.c / 8; cb += LB) {
      switch (b) {
        case kBlock: grad_input_block<CG, kBlock, LB>(gimg, wd, cols, grow, g, y, x, cb); break;
        case 3: grad_input_block<CG, 3, LB>(gimg, wd, cols, grow, g, y, x, cb); break;
        case 2: grad_input_block<CG, 2, LB>(gimg, wd, cols, grow, g, y, x, cb); break;
        default: grad_input_block<CG, 1, LB>(gimg, wd, cols, grow, g, y, x, cb); break;
      }
    }
    x += b;
  }
}

template <int CG>
__attribute__((always_inline)) inline void grad_input_row(const float* gimg, const float* wd,
                                                          const int64_t* cols, float* grow,
                                                          const Geometry& g, int64_t y) {
  if constexpr (CG >= 8) {
    if (g.cg % 16 == 0) {  // pairs of lane blocks, each pair inside one group
      grad_input_row_with<CG, 2>(gimg, wd, cols, grow, g, y);
      return;
    }
  }
  grad_input_row_with<CG, 1>(gimg, wd, cols, grow, g, y);
}

// Input-gradient rows [r0, r1) (r = n * h + y).
CUSTOMCONV_CPU_CLONES void grad_input_rows(const float* go, const float* wd, const int64_t* cols,
                                           float* gi, Geometry g, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* gimg = go + (r / g.h) * g.p * g.q * g.k;
    float* grow = gi + r * g.w * g.c;
    const int64_t y = r % g.h;
    switch (g.cg) {
      case 1: grad_input_row<1>(gimg, wd, cols, grow, g, y); break;
      case 2: grad_input_row<2>(gimg, wd, cols, grow, g, y); break;
      case 4: grad_input_row<4>(gimg, wd, cols, grow, g, y); break;
      default: grad_input_row<8>(gimg, wd, cols, grow, g, y); break;
    }
  }
}

// The conditions the passes share; the geometry, or nullopt. The vector
// lanes are output channels (forward, weight gradient) or, with
// `input_lanes`, input channels (input gradient): their count a multiple of
// 8, and per group 1, 2, 4 or a multiple of 8; the other side's channels per
// group (the reduction) at most 64.
std::optional<Geometry> takes(const at::Tensor& input, const Conv2dShape<int64_t>& s,
                              bool input_lanes = false) {
  if (input.device().type() != at::kCPU || input.scalar_type() != at::kFloat || !s.in.batched ||
      s.groups <= 1 || s.groups >= s.in.c) {
    return std::nullopt;
  }
  const int64_t kg = s.k / s.groups, cg = s.in.c / s.groups;
  const int64_t lanes = input_lanes ? s.in.c : s.k, lanes_g = input_lanes ? cg : kg;
  const int64_t reduced_g = input_lanes ? kg : cg;
  const bool lanes_fit = lanes_g == 1 || lanes_g == 2 || lanes_g == 4 || lanes_g % 8 == 0;
  if (!lanes_fit || lanes % 8 != 0 || kg == 0 || reduced_g > 64) return std::nullopt;
  if (s.in.n * s.oh * s.ow == 0 || s.in.h * s.in.w == 0) return std::nullopt;
  return Geometry{s.in.n, s.in.h, s.in.w, s.in.c, s.k, s.oh, s.ow, cg, kg, s.win};
}

}  // namespace

std::optional<at::Tensor> grouped_direct_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                                const at::Tensor& input,
                                                                const at::Tensor& weight,
                                                                const Conv2dShape<int64_t>& s) {
  const auto geo = takes(input, s);
  if (!geo || grad_output.dim() != 4) return std::nullopt;
  const Geometry& g = *geo;
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor go = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  const Window2d& win = s.win;
  // (K, kh, kw, cg) in memory: the (K, cg, kh, kw) gradient stored channels_last.
  at::Tensor gw = at::empty({s.k, win.kh, win.kw, g.cg}, input.options());
  const float* gp = go.const_data_ptr<float>();
  const float* ip = x.const_data_ptr<float>();
  float* wp = gw.mutable_data_ptr<float>();
  if (g.kg == 8 && g.cg % 8 == 0 && win.kw == 3) {
    run_channel_lanes_items(gp, ip, wp, g, s.groups);
    return gw.permute({0, 3, 1, 2}).contiguous(conv2d_output_format(input, weight));
  }
#if CUSTOMCONV_CPU_ISA_BUILDS
  if (g.kg % 16 == 0 && cpu_isa() == CpuIsa::kX86_64_V4) {
    run_wide_weight_items(gp, ip, wp, g);
    return gw.permute({0, 3, 1, 2}).contiguous(conv2d_output_format(input, weight));
  }
#endif
  const int64_t items = weight_item_count(g);
  parallel_range_sized(items, 1, pass_work(g),
                       [&](int64_t t0, int64_t t1) { weight_items(gp, ip, wp, g, t0, t1); });
  return gw.permute({0, 3, 1, 2}).contiguous(conv2d_output_format(input, weight));
}

bool direct_conv2d_grad_weight_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
#if CUSTOMCONV_CPU_ISA_BUILDS
  return input.device().type() == at::kCPU && input.scalar_type() == at::kFloat && s.in.batched &&
         s.groups == 1 && s.k % 16 == 0 && cpu_isa() == CpuIsa::kX86_64_V4 && s.in.n * s.oh * s.ow > 0 &&
         s.in.h * s.in.w > 0;
#else
  (void)input, (void)s;
  return false;
#endif
}

std::optional<at::Tensor> direct_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                         const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const Conv2dShape<int64_t>& s) {
#if CUSTOMCONV_CPU_ISA_BUILDS
  // One group of all the channels.
  if (!direct_conv2d_grad_weight_takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  const Geometry g{s.in.n, s.in.h, s.in.w, s.in.c, s.k, s.oh, s.ow, s.in.c, s.k, s.win};
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor go = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor gw = at::empty({s.k, s.win.kh, s.win.kw, s.in.c}, input.options());
  const float* gp = go.const_data_ptr<float>();
  const float* ip = x.const_data_ptr<float>();
  float* wp = gw.mutable_data_ptr<float>();
  run_wide_weight_items(gp, ip, wp, g);
  return gw.permute({0, 3, 1, 2}).contiguous(conv2d_output_format(input, weight));
#else
  (void)grad_output, (void)input, (void)weight, (void)s;
  return std::nullopt;
#endif
}

// eight_channel_direct_conv2d_grad_weight_cpu takes layers up to this many
// multiply-adds: on a 2-core machine its items ran 1.1-1.3x slower than the
// column route at 14M (8 -> 8 channels at 56x56, N=8), faster at 0.6M
// (1x8x32x32: 103 us against 138).
constexpr int64_t kSmallWeightWork = int64_t(1) << 21;
// Pointwise weight gradients up to this many multiply-adds take
// small_pointwise_weight on the calling thread (measured on a 2-core machine,
// 8 -> 8 at 8x8, N=1: NCHW 6.3-7.6 us against 7.9-12.5 by the column route's GEMM;
// F.conv2d's 10-11).
constexpr int64_t kSmallPointwiseWork = int64_t(1) << 16;

std::optional<at::Tensor> eight_channel_direct_conv2d_grad_weight_cpu(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    const Conv2dShape<int64_t>& s) {
  const Window2d& win = s.win;
  if (input.device().type() != at::kCPU || input.scalar_type() != at::kFloat || !s.in.batched ||
      s.groups != 1 || s.k != 8 || s.in.c % 8 != 0 || s.in.c > 64 || win.kw != 3 ||
      grad_output.dim() != 4 || s.in.n * s.oh * s.ow == 0 || s.in.h * s.in.w == 0) {
    return std::nullopt;
  }
  if (s.in.n * s.oh * s.ow * s.k * s.in.c * win.kh * win.kw > kSmallWeightWork) return std::nullopt;
  const Geometry g{s.in.n, s.in.h, s.in.w, s.in.c, s.k, s.oh, s.ow, s.in.c, s.k, win};
  // The operands channels_last and the result in F.conv2d's format, each
  // relaid by a loop here rather than an ATen copy (about 1.5 us of host time
  // each, a third of this pass on a 1x8x8x8 layer).
  std::vector<float> x_buf, go_buf, gw_buf;
  const float* x = channels_last_data(input, x_buf);
  const float* go = channels_last_data(grad_output, go_buf);
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  at::Tensor gw = at::empty({s.k, s.in.c, win.kh, win.kw}, input.options().memory_format(format));
  if (format == at::MemoryFormat::ChannelsLast) {  // (K, kh, kw, C) in memory, as the items write
    run_channel_lanes_items(go, x, gw.mutable_data_ptr<float>(), g, 1);
    return gw;
  }
  gw_buf.resize(static_cast<size_t>(gw.numel()));
  run_channel_lanes_items(go, x, gw_buf.data(), g, 1);
  const int64_t taps = win.kh * win.kw;
  float* out = gw.mutable_data_ptr<float>();
  for (int64_t k = 0; k < s.k; ++k) {
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t c = 0; c < s.in.c; ++c)
        out[(k * s.in.c + c) * taps + t] = gw_buf[(k * taps + t) * s.in.c + c];
    }
  }
  return gw;
}

bool small_pointwise_grad_weight_takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  return input.device().type() == at::kCPU && input.scalar_type() == at::kFloat && s.in.batched &&
         s.groups == 1 && s.win.pointwise() && s.in.c > 0 && s.k > 0 &&
         s.in.n * s.oh * s.ow * s.k * s.in.c <= kSmallPointwiseWork;
}

std::optional<at::Tensor> small_pointwise_conv2d_grad_weight_cpu(const at::Tensor& grad_output,
                                                                 const at::Tensor& input,
                                                                 const at::Tensor& weight,
                                                                 const Conv2dShape<int64_t>& s) {
  if (!small_pointwise_grad_weight_takes(input, s) || grad_output.dim() != 4) return std::nullopt;
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const bool cl = format == at::MemoryFormat::ChannelsLast;
  // Positions innermost (NCHW) or channels innermost (channels_last): each a
  // copy only where the tensor is laid out otherwise.
  const at::Tensor x = input.contiguous(format), go = grad_output.contiguous(format);
  at::Tensor gw = at::zeros({s.k, s.in.c, 1, 1}, input.options().memory_format(format));
  const int64_t n = s.in.n, c = s.in.c, k = s.k, l = s.oh * s.ow;
  if (n * l == 0) return gw;
  small_pointwise_weight(go.const_data_ptr<float>(), x.const_data_ptr<float>(),
                         gw.mutable_data_ptr<float>(), n, c, k, l, cl);
  return gw;
}

std::optional<at::Tensor> grouped_direct_conv2d_grad_input_cpu(const at::Tensor& grad_output,
                                                               const at::Tensor& input,
                                                               const at::Tensor& weight,
                                                               const Conv2dShape<int64_t>& s) {
  const auto geo = takes(input, s, /*input_lanes=*/true);  // input channels as the lanes
  if (!geo || grad_output.dim() != 4) return std::nullopt;
  const Geometry& g = *geo;
  const int64_t kg = g.kg, cg = g.cg;
  const Window2d& win = s.win;
  const at::Tensor go = grad_output.contiguous(at::MemoryFormat::ChannelsLast);
  // (K, cg, kh, kw) as (C/8, kh, kw, kg, 8): lane l of input block cb takes
  // output channel kk of its group, group (8 cb + l) / cg, input channel (8 cb + l) % cg.
  const at::Tensor wd = weight.reshape({s.groups, kg, cg, win.kh, win.kw})
                            .permute({0, 2, 3, 4, 1})  // (groups, cg, kh, kw, kg)
                            .reshape({s.in.c / 8, 8, win.kh, win.kw, kg})
                            .permute({0, 2, 3, 4, 1})
                            .contiguous();
  // The grad_output column of each tap at each input column (every row the same).
  std::vector<int64_t> cols(win.kw * g.w);
  for (int64_t j = 0; j < win.kw; ++j) {
    for (int64_t x = 0; x < g.w; ++x) {
      const int64_t tx = x + win.pw - j * win.dw;
      cols[j * g.w + x] = tx >= 0 && tx % win.sw == 0 && tx / win.sw < g.q ? tx / win.sw : -1;
    }
  }
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  const float* gp = go.const_data_ptr<float>();
  const float* wp = wd.const_data_ptr<float>();
  float* op = gi.mutable_data_ptr<float>();
  parallel_range_sized(
      g.n * g.h, grain_for(win.kh * win.kw * kg * g.w * g.c), pass_work(g),
      [&](int64_t r0, int64_t r1) { grad_input_rows(gp, wp, cols.data(), op, g, r0, r1); });
  return gi.contiguous(conv2d_output_format(input, weight));
}

std::optional<at::Tensor> grouped_direct_conv2d_cpu(const at::Tensor& input,
                                                    const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias,
                                                    const Conv2dShape<int64_t>& s) {
  const auto geo = takes(input, s);
  if (!geo) return std::nullopt;
  const Geometry& g = *geo;
  const int64_t cg = g.cg;
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor x = input.contiguous(at::MemoryFormat::ChannelsLast);
  const Window2d& win = s.win;
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
#if CUSTOMCONV_CPU_ISA_BUILDS
  if (g.kg % 16 == 0 && cpu_isa() == CpuIsa::kX86_64_V4) {
    // (K, cg, kh, kw) as (K/16, kh, kw, cg, 16).
    const at::Tensor w16 =
        weight.reshape({s.k / 16, 16, cg, win.kh, win.kw}).permute({0, 3, 4, 2, 1}).contiguous();
    const float* ip = x.const_data_ptr<float>();
    const float* wp = w16.const_data_ptr<float>();
    const float* bp = has_bias ? b.const_data_ptr<float>() : nullptr;
    float* op = out.mutable_data_ptr<float>();
    const std::vector<float> zeros(static_cast<size_t>(cg), 0.f);
    const int64_t chunks = (s.k / 16 + kChunk - 1) / kChunk;
    parallel_range_sized(g.n * chunks, 1, pass_work(g), [&](int64_t i0, int64_t i1) {
      wide_forward_images(ip, wp, bp, zeros.data(), op, g, i0, i1);
    });
    return out.contiguous(format);
  }
#endif
  // (K, cg, kh, kw) as (K/8, kh, kw, cg, 8): a lane block's weights per tap and channel.
  const at::Tensor wt =
      weight.reshape({s.k / 8, 8, cg, win.kh, win.kw}).permute({0, 3, 4, 2, 1}).contiguous();
  const float* ip = x.const_data_ptr<float>();
  const float* wp = wt.const_data_ptr<float>();
  const float* bp = has_bias ? b.const_data_ptr<float>() : nullptr;
  float* op = out.mutable_data_ptr<float>();
  if (cg == 8 && g.kg % 8 == 0) {
    // (K, 8, kh, kw) as (groups, kg/8, kh, kw, 8, 8): per block of 8 output
    // channels and tap, one weight vector per output channel.
    const at::Tensor w8 = weight.reshape({s.groups, g.kg / 8, 8, 8, win.kh, win.kw})
                              .permute({0, 1, 4, 5, 2, 3})
                              .contiguous();
    const float* w8p = w8.const_data_ptr<float>();
    parallel_range_sized(
        g.n * g.p, grain_for(win.kh * win.kw * cg * g.q * g.k), pass_work(g),
        [&](int64_t r0, int64_t r1) { forward_channel_lanes(ip, w8p, bp, op, g, r0, r1); });
  } else if (wt.numel() * 4 <= kCachedWeightBytes) {  // rows of positions, all channels each
    parallel_range_sized(g.n * g.p, grain_for(win.kh * win.kw * cg * g.q * g.k), pass_work(g),
                         [&](int64_t r0, int64_t r1) { forward_rows(ip, wp, bp, op, g, r0, r1); });
  } else {  // (image, chunk of channels): a lane block's weights over a whole image
    const int64_t chunks = (g.k / 8 + kChunk - 1) / kChunk;
    parallel_range_sized(g.n * chunks, 1, pass_work(g), [&](int64_t i0, int64_t i1) {
      forward_images(ip, wp, bp, op, g, i0, i1);
    });
  }
  return out.contiguous(format);
}

}  // namespace customconv
