// The Hopper forward's box of output positions (implicit_gemm_wgmma.cuh),
// host arithmetic only (no CUDA here); implicit_gemm.h's wgmma_fprop_plan
// decides where the kernel runs.
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
