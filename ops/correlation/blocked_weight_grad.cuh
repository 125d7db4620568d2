// A register-blocked weight gradient for square kernels of 3, 5 or 7 taps at
// stride 1 or 2, dilation 1 and the zero border: the weight-gradient counterpart of
// blocked_correlation.cuh. It reads the grad output and the input straight
// from global memory (vectors where widths and pointers allow), keeps every
// accumulator in registers, and writes the same per-(weight plane, chunk, tap)
// partial sums as the tiled engine in plane_weight_grad.cuh, whose finishing
// kernel adds the chunks in order. No atomics: bitwise reproducible.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/correlation/blocked_correlation.cuh"
#include "ops/correlation/plane_weight_grad.cuh"

namespace customconv {

// How the blocked weight gradient cuts a weight plane's work: items of one
// column block (V columns) by one strip of `strip` grad-output rows of one
// term, `items` per weight plane, split into `chunks` ranges (one block each).
struct BlockedWeightGradPlan {
  bool ok = false;
  int strip = 0, strips = 0, col_blocks = 0, cols = 0, items = 0;
  int64_t chunks = 0;
};

namespace plane_detail {

// Adds one item's contribution (columns x0.., grad-output rows ys..ys+se-1 of
// one term) to acc. The thread walks the input rows the strip meets, loading
// each once, and keeps in registers the grad-output rows that an input row can
// still meet: input row (ys + m) * S - ph + p (0 <= p < S) meets grad-output
// row ys + m - a through tap row p + a * S. Grad-output rows outside the
// strip, and columns past the plane (kFull false), are skipped rather than
// multiplied by zero, so an Inf in the input they would meet does not turn
// the sum into NaN. bsum gathers the item's grad-output values (the bias
// gradient's share).
template <typename T, int K, int S, int V, bool kVectors, bool kFull, typename Acc>
__device__ __forceinline__ void add_blocked_item(const T* __restrict__ gop,
                                                 const T* __restrict__ inp,
                                                 const BlockedCorrelation& g, int ys, int se,
                                                 int x0, int vr, Acc (&acc)[K * K], Acc& bsum) {
  constexpr int kCols = (V - 1) * S + K;
  constexpr int kWin = (K - 1) / S + 1;  // grad-output rows one input row meets
  bool col_ok[kCols];
  const int ix0 = x0 * S - g.pw;
  column_mask(ix0, g.w, col_ok);
  Acc win[kWin][V];
#pragma unroll
  for (int a = 0; a < kWin; ++a) {
#pragma unroll
    for (int r = 0; r < V; ++r) win[a][r] = Acc(0);
  }
  const int steps = (se - 1) * S + K;  // input rows the strip meets
#pragma unroll 1
  for (int m = 0; m * S < steps; ++m) {
#pragma unroll
    for (int a = kWin - 1; a > 0; --a) {
#pragma unroll
      for (int r = 0; r < V; ++r) win[a][r] = win[a - 1][r];
    }
    if (m < se) {
      const T* row = gop + int64_t(ys + m) * g.ow + x0;
      if constexpr (kVectors) {
        const Vec<T, V> v = *reinterpret_cast<const Vec<T, V>*>(row);
#pragma unroll
        for (int r = 0; r < V; ++r) win[0][r] = static_cast<Acc>(v.v[r]);
      } else {
#pragma unroll
        for (int r = 0; r < V; ++r) win[0][r] = kFull || r < vr ? static_cast<Acc>(row[r]) : Acc(0);
      }
#pragma unroll
      for (int r = 0; r < V; ++r) bsum += win[0][r];
    }
#pragma unroll
    for (int p = 0; p < S; ++p) {
      if (m * S + p >= steps) break;
      Acc vals[kCols];
      load_blocked_row<T, Acc, K, S, V, kVectors>(inp, (ys + m) * S - g.ph + p, x0, ix0, g, col_ok,
                                                  vals);
#pragma unroll
      for (int a = 0; a < kWin; ++a) {
        const int i = p + a * S;
        if (i >= K || static_cast<unsigned>(m - a) >= static_cast<unsigned>(se)) continue;
#pragma unroll
        for (int r = 0; r < V; ++r) {
          if (!kFull && r >= vr) continue;
#pragma unroll
          for (int j = 0; j < K; ++j) acc[i * K + j] += win[a][r] * vals[r * S + j];
        }
      }
    }
  }
}

// Block of kBlockedThreads threads on weight plane blockIdx.x and chunk
// blockIdx.y of its items; item u (column block fastest, then strip, then
// term) goes to thread u mod kBlockedThreads of the chunk's block, so a warp
// reads neighbouring columns of a row. Each thread sums all K*K taps over its
// items in registers, and the sum of the grad output it meets (the bias
// gradient); store_block_sums then reduces the block in a fixed order, into
// the partial sums (K*K + 1 per chunk), or straight into gw and gb when a
// weight plane has one chunk. gb may be null: no bias gradient.
template <typename T, int K, int S, int V, bool kVectors>
__global__ void __launch_bounds__(kBlockedThreads)
    blocked_weight_grad_kernel(const T* __restrict__ go, const T* __restrict__ in,
                               at::opmath_type<T>* __restrict__ partial, T* __restrict__ gw,
                               T* __restrict__ gb, PlaneWeightGrad pw, BlockedCorrelation g,
                               BlockedWeightGradPlan p) {
  using acc_t = at::opmath_type<T>;
  static_assert(kBlockedThreads == kGradThreads, "store_block_sums spans kGradThreads threads");
  const int64_t wp = blockIdx.x;
  const int64_t chunks = gridDim.y, chunk = blockIdx.y;
  const int u0 = static_cast<int>(p.items * chunk / chunks);
  const int u1 = static_cast<int>(p.items * (chunk + 1) / chunks);
  const int64_t out_plane = int64_t(g.oh) * g.ow, in_plane = int64_t(g.h) * g.w;
  acc_t acc[K * K];
#pragma unroll
  for (int t = 0; t < K * K; ++t) acc[t] = acc_t(0);
  acc_t bsum = 0;
  for (int u = u0 + threadIdx.x; u < u1; u += kBlockedThreads) {
    const int cb = u % p.col_blocks, rest = u / p.col_blocks;
    const int s = rest % p.strips, t = rest / p.strips;
    const int ys = s * p.strip, se = min(p.strip, g.oh - ys);
    const int x0 = cb * V, vr = min(V, g.ow - x0);
    const T* gop = go + (t * pw.go_term_stride + wp) * out_plane;
    const T* inp = in + (t * pw.in_term_stride + wp / pw.mult) * in_plane;
    if (kVectors || vr == V) {
      add_blocked_item<T, K, S, V, kVectors, true>(gop, inp, g, ys, se, x0, vr, acc, bsum);
    } else {
      add_blocked_item<T, K, S, V, kVectors, false>(gop, inp, g, ys, se, x0, vr, acc, bsum);
    }
  }
  constexpr int kEntries = K * K + 1;
  acc_t sums[kEntries];
#pragma unroll
  for (int t = 0; t < K * K; ++t) sums[t] = acc[t];
  sums[K * K] = bsum;
  if (chunks == 1) {
    store_block_sums<kEntries>(sums, [&](int t, acc_t sum) {
      if (t < K * K) {
        gw[wp * K * K + t] = static_cast<T>(sum);
      } else if (gb != nullptr) {
        gb[wp] = static_cast<T>(sum);
      }
    });
  } else {
    acc_t* dst = partial + (wp * chunks + chunk) * kEntries;
    store_block_sums<kEntries>(sums, [&](int t, acc_t sum) { dst[t] = sum; });
  }
}

template <typename T, int K, int S, int V, bool kVectors>
void launch_blocked_weight_grad_variant(const T* go, const T* in, at::opmath_type<T>* partial,
                                        T* gw, T* gb, const PlaneWeightGrad& pw,
                                        const BlockedCorrelation& g, const BlockedWeightGradPlan& p,
                                        cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(pw.weight_planes), static_cast<unsigned>(p.chunks));
  blocked_weight_grad_kernel<T, K, S, V, kVectors>
      <<<grid, kBlockedThreads, 0, stream>>>(go, in, partial, gw, gb, pw, g, p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace plane_detail

// Whether the blocked weight gradient takes the geometry: the taps, strides
// and dilations the blocked forward takes (blocked_takes), and every index of
// a term within int32.
inline bool blocked_weight_grad_takes(const PlaneWeightGrad& g, int64_t element_size) {
  return blocked_takes(g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, element_size) && g.ph >= 0 &&
         g.pw >= 0 && g.ph < (1 << 20) && g.pw < (1 << 20) &&
         int64_t(g.in_h) * g.in_w < (int64_t{1} << 30) &&
         int64_t(g.out_h) * g.out_w < (int64_t{1} << 30) && g.weight_planes < (int64_t{1} << 31);
}

// Strips of 16 grad-output rows (a whole plane of up to 24 rows is one strip)
// and columns in blocks of `cols`; about kTargetBlocks blocks in all, each
// thread with at least one item.
inline BlockedWeightGradPlan plan_blocked_weight_grad(const PlaneWeightGrad& g, int cols) {
  using namespace plane_detail;
  BlockedWeightGradPlan p;
  p.cols = cols;
  p.strip = g.out_h <= 24 ? std::max(1, g.out_h) : 16;
  p.strips = (g.out_h + p.strip - 1) / p.strip;
  p.col_blocks = (g.out_w + cols - 1) / cols;
  const int64_t items = g.terms * p.strips * p.col_blocks;
  if (items <= 0 || items >= (int64_t{1} << 31) / 2) return p;
  p.items = static_cast<int>(items);
  const int64_t want = (kTargetBlocks + g.weight_planes - 1) / g.weight_planes;
  p.chunks = std::clamp<int64_t>(std::min(want, items / kBlockedThreads), 1, 65535);
  p.ok = true;
  return p;
}

// Whether rows of `v` columns can move as vectors: "same" padding, widths of
// a multiple of v and pointers aligned to v elements.
template <typename T>
bool blocked_weight_grad_vectors(const PlaneWeightGrad& g, const T* go, const T* in, int v) {
  const auto aligned = [&](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % (v * sizeof(T)) == 0;
  };
  return g.pw == (g.kw - 1) / 2 && g.in_w % v == 0 && g.out_w % v == 0 && aligned(go) &&
         aligned(in);
}

// Columns per thread: 8 for 16-bit data with 3 or 5 taps when rows take
// 16-byte vectors, otherwise 4.
template <typename T>
int blocked_weight_grad_cols(const PlaneWeightGrad& g, const T* go, const T* in) {
  return sizeof(T) == 2 && g.kw <= 5 && blocked_weight_grad_vectors(g, go, in, 8) ? 8 : 4;
}

// Stage 1 (the blocked kernel) and stage 2 (the chunks added in order) on
// `stream`, writing gw and, when gb is not null, the bias gradient gb (the
// grad output summed per weight plane). `partial` holds
// blocked_weight_grad_partials(pw, p) accumulators and may be null when that
// is 0: with one chunk, stage 1 writes gw and gb itself and stage 2 is
// skipped. p comes from plan_blocked_weight_grad(g, blocked_weight_grad_cols(g, go, in)).
inline int64_t blocked_weight_grad_partials(const PlaneWeightGrad& g,
                                            const BlockedWeightGradPlan& p) {
  return p.chunks > 1 ? g.weight_planes * p.chunks * (int64_t(g.kh) * g.kw + 1) : 0;
}

template <typename T>
void launch_blocked_weight_grad(const T* go, const T* in, at::opmath_type<T>* partial, T* gw, T* gb,
                                const PlaneWeightGrad& pw, const BlockedWeightGradPlan& p,
                                cudaStream_t stream) {
  using namespace plane_detail;
  const BlockedCorrelation g{0,       0,        0,        1,     1,     pw.in_h,
                             pw.in_w, pw.out_h, pw.out_w, pw.ph, pw.pw, false};
  const bool vectors = blocked_weight_grad_vectors(pw, go, in, p.cols);
  const auto run = [&](auto k, auto s) {
    constexpr int K = decltype(k)::value, S = decltype(s)::value;
    if constexpr (sizeof(T) == 2 && K <= 5) {
      if (p.cols == 8) {
        return launch_blocked_weight_grad_variant<T, K, S, 8, true>(go, in, partial, gw, gb, pw, g,
                                                                    p, stream);
      }
    }
    if (vectors) {
      return launch_blocked_weight_grad_variant<T, K, S, 4, true>(go, in, partial, gw, gb, pw, g, p,
                                                                  stream);
    }
    launch_blocked_weight_grad_variant<T, K, S, 4, false>(go, in, partial, gw, gb, pw, g, p,
                                                          stream);
  };
  const auto run_k = [&](auto s) {
    if (pw.kh == 3) {
      run(std::integral_constant<int, 3>{}, s);
    } else if (pw.kh == 5) {
      run(std::integral_constant<int, 5>{}, s);
    } else if constexpr (sizeof(T) <= 4) {
      run(std::integral_constant<int, 7>{}, s);
    }
  };
  if (pw.sh == 1) {
    run_k(std::integral_constant<int, 1>{});
  } else {
    run_k(std::integral_constant<int, 2>{});
  }
  if (p.chunks > 1) {
    launch_weight_grad_finish<T>(partial, gw, gb, pw, int64_t(pw.kh) * pw.kw + 1, p.chunks, stream);
  }
}

}  // namespace customconv
