// The Hopper forward's plan, host arithmetic only (no CUDA here): which of our
// warpgroup-MMA kernels runs a problem (implicit_gemm_wgmma.cuh,
// implicit_gemm_wgmma_tma.cuh), its block tile and its reduction slices.
// Measured on an H100 over ResNet-50's 3x3 layers at N=32 (float16, one
// kernel alone in a loop, us; cuDNN's channels_last kernels in brackets):
//   C=K=64 at 56x56: 128 x 64 cp.async tiles, 2 blocks per SM     31 (27)
//   C=K=128 at 28x28: 64 x 128 cp.async tiles, 3 per SM           25 (21)
//   C=K=256 at 14x14: TMA 128 x 128, 98 tiles                     22 (21)
//   C=K=512 at 7x7: TMA 128 x 128 split in two                    18 (20)
// TMA loads win where a tap's reduction is 4 or more steps long (C of 256 in
// 16-bit); on shorter ones each tile's fixed costs dominate and several
// cp.async blocks per multiprocessor hide them better.
#pragma once

#include <cstdint>

namespace customconv::implicit_gemm {

// The box of output positions per tile (bw x bh x bn, at most `rows`) that
// leaves fewest rows of the tiles empty: bw the width or a divisor of it, bh
// likewise, bn the images that fill the rest; the widest of those.
struct Box {
  int bw = 1, bh = 1, bn = 1, tw = 1, th = 1, tn = 1;
  int64_t tiles() const { return int64_t(tw) * th * tn; }
};
inline Box choose_box(int n, int p, int q, int stride_h, int stride_w, int rows) {
  Box best;
  int64_t best_tiles = -1;
  auto consider = [&](int bw, int bh) {
    if (bw * bh > rows || bw * stride_w > 256 || bh * stride_h > 256) return;
    Box b;
    b.bw = bw, b.bh = bh, b.bn = rows / (bw * bh);
    if (b.bn > n) b.bn = n;
    if (b.bn > 256) b.bn = 256;
    b.tw = (q + bw - 1) / bw, b.th = (p + bh - 1) / bh, b.tn = (n + b.bn - 1) / b.bn;
    // Fewest tiles; among as few, the widest box (longer runs of pixels per load).
    if (best_tiles < 0 || b.tiles() < best_tiles || (b.tiles() == best_tiles && bw > best.bw)) {
      best = b, best_tiles = b.tiles();
    }
  };
  for (int bw = 1; bw <= q && bw <= rows; ++bw) {
    if (q % bw != 0 && bw != q) continue;
    for (int bh = 1; bh <= p && bw * bh <= rows; ++bh) {
      if (p % bh != 0 && bh != p) continue;
      consider(bw, bh);
    }
  }
  // Rows of a wide plane, in pieces of at most `rows`.
  if (best_tiles < 0) consider(rows, 1);
  return best;
}


}  // namespace customconv::implicit_gemm
