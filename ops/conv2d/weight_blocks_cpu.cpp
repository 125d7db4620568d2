#include "ops/conv2d/weight_blocks_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "ops/common/cpu_simd.h"
#include "ops/common/parallel_cpu.h"

namespace customconv {
namespace {

struct Packing {
  int64_t k, cols, block;  // K, columns (C*kh*kw) of the source rows, B
  int64_t c, taps;         // input channels, kh*kw
  bool taps_outer;         // source columns in (tap, c) order (channels_last), else (c, tap)
};

// The destination row (tap * C + c) of source column col.
inline int64_t dest_row(const Packing& p, int64_t col) {
  return p.taps_outer ? col : (col % p.taps) * p.c + col / p.taps;
}

// Items [i0, i1) of (block of 8 output channels, run of 8 source columns):
// src (K, cols) row-major, dst (kp / B, cols, B). Rows past K are zeros.
CUSTOMCONV_CPU_CLONES void pack_items(const float* src, float* dst, Packing p, int64_t i0,
                                      int64_t i1) {
  const int64_t col_runs = (p.cols + 7) / 8;
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t k0 = item / col_runs * 8, col0 = item % col_runs * 8;
    float* blk = dst + (k0 / p.block) * p.cols * p.block + k0 % p.block;
    if (col0 + 8 <= p.cols) {
      // Rows past K (the padding of the last block) are zero vectors: filled
      // element by element, the padding of 8 output channels to a 64-wide block
      // took 12% of a tiny 3x3 layer's forward.
      Float8 rows[8];
      for (int r = 0; r < 8; ++r)
        rows[r] = k0 + r < p.k ? load8(src + (k0 + r) * p.cols + col0) : Float8{};
      transpose_tile(rows);
      for (int r = 0; r < 8; ++r) store8(blk + dest_row(p, col0 + r) * p.block, rows[r]);
      continue;
    }
    for (int64_t col = col0; col < std::min(p.cols, col0 + 8); ++col) {
      float* d = blk + dest_row(p, col) * p.block;
      for (int64_t r = 0; r < 8; ++r) d[r] = k0 + r < p.k ? src[(k0 + r) * p.cols + col] : 0.f;
    }
  }
}

}  // namespace

at::Tensor weight_blocks_cpu(const at::Tensor& weight, int64_t block) {
  const int64_t k = weight.size(0), c = weight.size(1), taps = weight.size(2) * weight.size(3);
  const int64_t kp = (k + block - 1) / block * block;
  if (taps == 1 && k > 1 && weight.stride(0) == 1 && weight.stride(1) >= k) {
    // A transposed matrix (the weight of a pointwise layer's input gradient,
    // (C, K, 1, 1) as a view of (K, C, 1, 1)): a block's row for channel j is
    // a run of neighbouring elements of the source, copied as it is.
    at::Tensor out = at::zeros({kp / block, 1, 1, c, block}, weight.options().memory_format(at::MemoryFormat::Contiguous));
    const float* sp = weight.const_data_ptr<float>();
    float* dp = out.mutable_data_ptr<float>();
    const int64_t ld = weight.stride(1);
    parallel_range_sized(kp / block, 1, k * c, [&](int64_t b0, int64_t b1) {
      for (int64_t kb = b0; kb < b1; ++kb) {
        const int64_t n = std::min(block, k - kb * block);
        for (int64_t j = 0; j < c; ++j) {
          std::copy(sp + j * ld + kb * block, sp + j * ld + kb * block + n, dp + (kb * c + j) * block);
        }
      }
    });
    return out;
  }
  const bool taps_outer = !weight.is_contiguous() &&
                          weight.is_contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor src = taps_outer ? weight : weight.contiguous();
  const Packing p{k, c * taps, block, c, taps, taps_outer};
  at::Tensor out = at::empty({kp / block, weight.size(2), weight.size(3), c, block},
                             weight.options().memory_format(at::MemoryFormat::Contiguous));
  const float* sp = src.const_data_ptr<float>();
  float* dp = out.mutable_data_ptr<float>();
  const int64_t items = (kp / 8) * ((p.cols + 7) / 8);
  parallel_range(items, 512, [&](int64_t i0, int64_t i1) { pack_items(sp, dp, p, i0, i1); });
  return out;
}

at::Tensor rotated_weight_blocks_cpu(const at::Tensor& weight, int64_t block) {
  const int64_t k = weight.size(0), c = weight.size(1), kh = weight.size(2), kw = weight.size(3);
  const int64_t cp = (c + block - 1) / block * block;
  at::Tensor out = at::zeros({cp / block, kh, kw, k, block}, weight.options());
  const float* sp = weight.const_data_ptr<float>();
  float* dp = out.mutable_data_ptr<float>();
  const int64_t s0 = weight.stride(0), s1 = weight.stride(1), s2 = weight.stride(2);
  const int64_t s3 = weight.stride(3);
  for (int64_t ci = 0; ci < c; ++ci) {
    float* blk = dp + (ci / block) * kh * kw * k * block + ci % block;
    for (int64_t i = 0; i < kh; ++i) {
      for (int64_t j = 0; j < kw; ++j) {
        float* d = blk + ((kh - 1 - i) * kw + (kw - 1 - j)) * k * block;
        const float* src = sp + ci * s1 + i * s2 + j * s3;
        for (int64_t kk = 0; kk < k; ++kk) d[kk * block] = src[kk * s0];
      }
    }
  }
  return out;
}

}  // namespace customconv
