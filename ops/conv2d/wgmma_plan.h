// The Hopper forward's box of output positions (implicit_gemm_wgmma.cuh),
// host arithmetic only (no CUDA here); implicit_gemm.h's wgmma_fprop_plan
// decides where the kernel runs.
#pragma once

#include <cstdint>

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

}  // namespace customconv::implicit_gemm
