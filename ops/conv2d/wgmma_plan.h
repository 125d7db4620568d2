// The Hopper forward's box of output positions (implicit_gemm_wgmma.cuh),
// host arithmetic only (no CUDA here); implicit_gemm.h's wgmma_fprop_plan
// decides where the kernel runs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "ops/common/fast_divide.h"
#include "ops/conv2d/phase_taps.h"

namespace customconv::implicit_gemm {

// The box of output positions per tile: bw x bh x bn (columns x rows x
// images), at most `rows` of them. Whole rows of the plane where one fits
// (bw = q), as many as divide the plane's height, then images: each TMA load
// then reads runs of q * stride_w pixels, which measured faster than squarer
// boxes with fewer empty rows once the input is not in L2 (H100, float16,
// 256 channels at 14x14, N=32: a 14x7x1 box 26.1 us against 29.7 for 2x2x32;
// in L2 21.5 against 23.0). Wider planes: bw and bh divisors of the plane's
// sides, fewest tiles, the widest box among those.
struct Box {
  int bw = 1, bh = 1, bn = 1, tw = 1, th = 1, tn = 1;
  int64_t tiles() const { return int64_t(tw) * th * tn; }
};
inline Box box_of(int n, int p, int q, int bw, int bh, int rows) {
  Box b;
  b.bw = bw, b.bh = bh, b.bn = rows / (bw * bh);
  if (b.bn > n) b.bn = n;
  if (b.bn > 256) b.bn = 256;
  b.tw = (q + bw - 1) / bw, b.th = (p + bh - 1) / bh, b.tn = (n + b.bn - 1) / b.bn;
  return b;
}
inline Box choose_box(int n, int p, int q, int stride_h, int stride_w, int rows) {
  if (q <= rows && q * stride_w <= 256) {
    int bh = 1;
    for (int d = 2; d <= p && d * q <= rows && d * stride_h <= 256; ++d) {
      if (p % d == 0) bh = d;
    }
    return box_of(n, p, q, q, bh, rows);
  }
  Box best;
  int64_t best_tiles = -1;
  for (int bw = 1; bw <= q && bw <= rows && bw * stride_w <= 256; ++bw) {
    if (q % bw != 0) continue;
    for (int bh = 1; bh <= p && bw * bh <= rows && bh * stride_h <= 256; ++bh) {
      if (p % bh != 0 && bh != p) continue;
      const Box b = box_of(n, p, q, bw, bh, rows);
      if (best_tiles < 0 || b.tiles() < best_tiles || (b.tiles() == best_tiles && bw > best.bw)) {
        best = b, best_tiles = b.tiles();
      }
    }
  }
  return best;
}

// The tail (implicit_gemm_wgmma.cuh): where a launch's tiles leave a last
// round over its `blocks` resident blocks that fills at most half of them,
// those last tiles run as two halves of their reduction each, on two blocks
// at once, so that the last round takes about half a tile's time (196 tiles
// of 36 steps on 132 multiprocessors: 54 steps a block instead of 72).
// Returns how many tiles are so split: 0 where nothing would gain, or a
// tile has fewer than kMinTailSteps steps to halve. The halves' meeting costs
// 1-2.5 us (a tile's float32 sums written and read back through the L2), so
// short reductions lose by it (H200, N=32, channels_last, us, rows of
// positions without / with the tail: 128 channels 3x3 at 28x28, 18 steps of
// 64 16-bit channels, 24.2 / 25.3; 36 steps of 32 float32 ones, 35.3 / 32.7;
// 256 channels 3x3 at 14x14, N=48, float32 (72 steps) 55.2 / 47.8, float16
// (36) 34.2 / 32.6; a 2x2 stride-2 window of 128 channels in float16 (8
// steps) 17.2 / 19.6).
constexpr int kMinTailSteps = 32;
inline int64_t tail_tiles(int64_t tiles, int64_t blocks, int64_t steps) {
  const int64_t last = blocks > 0 ? tiles % blocks : 0;
  return tiles > blocks && last > 0 && 2 * last <= blocks && steps >= kMinTailSteps ? last : 0;
}
// A launch's time in half tiles' time: two a round of tiles over the
// resident blocks, one for a last round run in halves (the tail).
inline int64_t half_rounds(int64_t tiles, int64_t blocks, int64_t steps) {
  const int64_t whole = 2 * (tiles / blocks);
  if (tiles % blocks == 0) return whole;
  return whole + (tail_tiles(tiles, blocks, steps) > 0 ? 1 : 2);
}
// Bytes of the halves' meeting places for `tail` tiles of `rows` positions
// x kN output channels: kJoinSlots 16-byte flag slots and rows / 64 parts of
// 128 threads x kN / 2 float32 sums per tile.
constexpr int kJoinSlots = 4;
inline int64_t tail_workspace_bytes(int64_t tail, int kN, int rows) {
  return tail * (kJoinSlots * 16 + (rows / 64) * int64_t(128) * (kN / 2) * 4);
}

// One sub-problem of a launch of the Hopper forward: its output positions
// (p x q per image; offset y0 + n * sn + oh * sh + ow * sw in the output, in
// elements), its window (r x s taps, padding) and where its taps start in the
// weight's columns (tap0: (K, taps * C) as the kernel reads it), and its boxes
// (tw x th x tn of the launch's box). A plain forward is one phase; the
// strided input gradient is one per stride phase (stride_phases below). Its
// tiles are tiles_begin .. the next phase's, output-channel tile fastest.
struct Phase {
  int tiles_begin = 0;
  int p = 0, q = 0, r = 0, s = 0, pad_h = 0, pad_w = 0, tap0 = 0;
  int tw = 1, th = 1, tn = 1;
  int y0 = 0, sn = 0, sh = 0, sw = 0;
  // Divisions by tw, th, s, q and p * q, set up with the tile counts
  // (implicit_gemm_wgmma_launch.cuh's set_tiles).
  FastDivide div_tw, div_th, div_s, div_q, div_plane;
};
constexpr int kMaxPhases = 4;

// The input gradient of a strided layer (groups 1, dilation 1, every window
// side at least its stride) as sh * sw stride-1 forwards of grad_output, one
// per stride phase (py, px) of the input: input row py + sh * a is reached
// through tap r from output row a + (py + pad_h - r) / sh, for the taps r
// congruent to py + pad_h modulo sh (a window of consecutive offsets, since
// r falls by sh where the offset grows by one). A phase's forward: p = its
// input rows, padding -(the first offset), taps by decreasing r, the weight
// transposed (C <-> K), written to the input positions of its phase. Phases
// by decreasing taps (the longest tiles first); `taps` lists, per slot of
// the phases' weight (the phases' taps in their order), the layer's tap
// r * kw + s it reads. Empty where a phase would have no taps or no rows.
struct StridePhases {
  std::vector<Phase> phases;
  std::vector<int> taps;
};
inline StridePhases stride_phases(int h, int w, int c, int kh, int kw, int pad_h, int pad_w,
                                  int stride_h, int stride_w) {
  StridePhases out;
  if (kh < stride_h || kw < stride_w || h < stride_h || w < stride_w ||
      stride_h * stride_w > kMaxPhases) {
    return out;
  }
  // The taps of one axis reaching phase p, by decreasing index (phase_taps.h),
  // and the first offset.
  const auto axis = [](int p, int k, int stride, int pad, std::vector<int>& taps) {
    const PhaseTaps t = phase_taps(p, k, stride, pad, 1);
    taps.assign(t.index.begin(), t.index.end());
    return int(t.first);
  };
  struct Entry {
    Phase f;
    std::vector<int> ty, tx;
  };
  std::vector<Entry> entries;
  for (int py = 0; py < stride_h; ++py) {
    for (int px = 0; px < stride_w; ++px) {
      Entry e;
      const int first_y = axis(py, kh, stride_h, pad_h, e.ty),
                first_x = axis(px, kw, stride_w, pad_w, e.tx);
      Phase& f = e.f;
      f.p = (h - py + stride_h - 1) / stride_h, f.q = (w - px + stride_w - 1) / stride_w;
      f.r = int(e.ty.size()), f.s = int(e.tx.size());
      f.pad_h = -first_y, f.pad_w = -first_x;
      f.y0 = (py * w + px) * c, f.sn = h * w * c, f.sh = stride_h * w * c, f.sw = stride_w * c;
      entries.push_back(e);
    }
  }
  for (size_t i = 1; i < entries.size(); ++i) {  // stable, by decreasing taps
    for (size_t j = i;
         j > 0 && entries[j].f.r * entries[j].f.s > entries[j - 1].f.r * entries[j - 1].f.s; --j) {
      std::swap(entries[j], entries[j - 1]);
    }
  }
  for (Entry& e : entries) {
    e.f.tap0 = int(out.taps.size());
    for (int ry : e.ty) {
      for (int rx : e.tx) out.taps.push_back(ry * kw + rx);
    }
    out.phases.push_back(e.f);
  }
  return out;
}

}  // namespace customconv::implicit_gemm
