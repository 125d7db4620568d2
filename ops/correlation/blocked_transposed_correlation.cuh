// A register-blocked transposed correlation at stride 2: the input gradient of
// a stride-2 correlation with square kernels of 3, 5 or 7 taps, dilation 1 and
// the zero border. Each input-gradient element gathers only the grad-output
// samples that reach it (about k*k/4 of them) instead of correlating a
// zero-stuffed grad output with all k*k taps: split by the parity of its row
// and column, the result is four small stride-1 correlations, which a thread
// computes side by side for a block of rows and columns. Everything but the
// grad-output rows stays in registers; no atomics.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>

#include <cstdint>

#include "ops/correlation/blocked_correlation.cuh"

namespace customconv {

// Input-gradient plane `plane` (image n = plane / channels, channel c) sums
// `fan` grad-output planes: for j < fan, grad-output channel c * fan + j of
// image n with weight row c * fan + j. h, w: the input gradient's plane;
// oh, ow: the grad output's; ph, pw: the forward padding.
struct BlockedTransposed {
  int planes, channels, go_channels, fan;
  int h, w, oh, ow, ph, pw;
};

namespace transposed_detail {

// Input-gradient element (y, x) gathers grad output (oy, ox) through tap
// (y + ph - 2 oy, x + pw - 2 ox). A thread's R rows start at y0 with y0 + ph
// even, so row r meets grad-output row oy0 + (r - i) / 2 through tap row i
// whenever r - i is even (oy0 = (y0 + ph) / 2). Its 2V columns start at x0
// with x0 + pw - kPc even, so column c meets grad-output column
// ox0 + (kPc + c - j) / 2 through tap column j whenever kPc + c - j is even.
// The grad-output values a column block needs are kGoCols consecutive ones,
// e = (kPc + c - j) / 2 + (K - 1) / 2 being the one for (c, j).
template <int K, int V>
constexpr int kGoCols = V + (K + 1) / 2;

// Row oy of a grad-output plane, columns ox0 - (K-1)/2 + e for e < kGoCols,
// zero outside the plane. kVectors: "same" padding, aligned widths and
// pointers; the values are picked from the three aligned V-element vectors
// around column V * cx (off: the offset of e = 0 from V * cx, in -V..0).
template <typename T, typename acc_t, int K, int V, bool kVectors, int kOff>
__device__ __forceinline__ void load_go_row(const T* __restrict__ src, int oy, int ox_first, int cx,
                                            const BlockedTransposed& g,
                                            acc_t (&vals)[kGoCols<K, V>]) {
  constexpr int kCols = kGoCols<K, V>;
  if constexpr (kVectors) {
    static_assert(kOff >= -V && kOff <= 0 && V + kOff + kCols <= 3 * V, "three vectors suffice");
    T quads[3 * V];
    load_aligned_vectors<T, V, 3>(src, oy, V * (cx - 1), g.oh, g.ow, quads);
#pragma unroll
    for (int e = 0; e < kCols; ++e) vals[e] = static_cast<acc_t>(quads[V + kOff + e]);
  } else {
    const bool row_ok = oy >= 0 && oy < g.oh;
    const T* row = src + (row_ok ? oy : 0) * g.ow;
#pragma unroll
    for (int e = 0; e < kCols; ++e) {
      const int ox = ox_first + e;
      vals[e] = row_ok && ox >= 0 && ox < g.ow ? static_cast<acc_t>(row[ox]) : acc_t(0);
    }
  }
}

// One thread per block of R rows x 2V columns of one input-gradient plane;
// threads are numbered column block first, then row block, then plane, so
// neighbours share grad-output rows. The thread walks the (R + K - 1) / 2
// grad-output rows its rows meet, loading each once (kGoCols values), and adds
// it into every row and column it reaches, with the tap that links them.
// kVectors ("same" padding, the input-gradient width a multiple of 2V, the
// grad-output width of V, aligned pointers): grad-output rows come as aligned
// vectors and the 2V results go out as vector stores.
template <typename T, int K, int R, int V, bool kVectors>
__global__ void __launch_bounds__(kBlockedThreads, 2)
    blocked_transposed_kernel(const T* __restrict__ go, const T* __restrict__ weight,
                              T* __restrict__ gi, BlockedTransposed g, int col_blocks,
                              int row_blocks, int total) {
  using acc_t = at::opmath_type<T>;
  constexpr int kHalf = (K - 1) / 2;
  constexpr int kGoRows = (R + K - 1) / 2;
  constexpr int kCols = kGoCols<K, V>;
  // With "same" padding pw = kHalf the column parity is fixed by K; otherwise
  // the thread's first column moves left by pw's parity.
  constexpr int kPc = kVectors ? kHalf & 1 : 0;
  constexpr int kOff = (kHalf - kPc) / 2 - kHalf;  // vector path: e = 0 at column V*cx + kOff
  const int idx = blockIdx.x * kBlockedThreads + threadIdx.x;
  if (idx >= total) return;
  const auto [cx, ry, plane] = blocked_thread(idx, col_blocks, row_blocks);
  const int c = plane % g.channels, n = plane / g.channels;
  const int y0 = ry * R - (g.ph & 1);
  const int x0 = cx * 2 * V - (kVectors ? 0 : g.pw & 1);
  const int oy0 = (y0 + g.ph) / 2;
  const int ox_first = (x0 + g.pw - kPc) / 2 - kHalf;

  acc_t acc[R][2 * V];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int x = 0; x < 2 * V; ++x) acc[r][x] = acc_t(0);
  }
  for (int f = 0; f < g.fan; ++f) {
    const int wrow = c * g.fan + f;
    const T* src = go + (int64_t(n) * g.go_channels + wrow) * g.oh * g.ow;
    const T* wp = weight + int64_t(wrow) * K * K;
    acc_t taps[K][K];
#pragma unroll
    for (int a = 0; a < K; ++a) {
#pragma unroll
      for (int b = 0; b < K; ++b) taps[a][b] = static_cast<acc_t>(wp[a * K + b]);
    }
#pragma unroll
    for (int q = 0; q < kGoRows; ++q) {
      acc_t vals[kCols];
      load_go_row<T, acc_t, K, V, kVectors, kOff>(src, oy0 - kHalf + q, ox_first, cx, g, vals);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = r + 2 * kHalf - 2 * q;  // the tap row linking row r and this grad-output row
        if (i < 0 || i >= K) continue;
#pragma unroll
        for (int x = 0; x < 2 * V; ++x) {
#pragma unroll
          for (int j = (kPc + x) & 1; j < K; j += 2) {
            acc[r][x] += taps[i][j] * vals[(kPc + x - j) / 2 + kHalf];
          }
        }
      }
    }
  }
  T* dst = gi + int64_t(plane) * g.h * g.w;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int y = y0 + r;
    if (y < 0 || y >= g.h) continue;
    if constexpr (kVectors) {
      if (x0 >= g.w) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        Vec<T, V> o;
#pragma unroll
        for (int l = 0; l < V; ++l) o.v[l] = static_cast<T>(acc[r][half * V + l]);
        *reinterpret_cast<Vec<T, V>*>(dst + y * g.w + x0 + half * V) = o;
      }
    } else {
#pragma unroll
      for (int x = 0; x < 2 * V; ++x) {
        if (x0 + x >= 0 && x0 + x < g.w) dst[y * g.w + x0 + x] = static_cast<T>(acc[r][x]);
      }
    }
  }
}

template <typename T, int K, int R, int V, bool kVectors>
void launch_transposed_variant(const T* go, const T* weight, T* gi, const BlockedTransposed& g,
                               cudaStream_t stream) {
  // The first row block (and column block, off the vector path) may start one
  // before the plane, to put the parity right.
  const int col_blocks = (g.w + (kVectors ? 0 : g.pw & 1) + 2 * V - 1) / (2 * V);
  const int row_blocks = (g.h + (g.ph & 1) + R - 1) / R;
  const int64_t total = int64_t(g.planes) * row_blocks * col_blocks;
  const int64_t blocks = (total + kBlockedThreads - 1) / kBlockedThreads;
  blocked_transposed_kernel<T, K, R, V, kVectors><<<blocks, kBlockedThreads, 0, stream>>>(
      go, weight, gi, g, col_blocks, row_blocks, static_cast<int>(total));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int K>
void launch_transposed(const T* go, const T* weight, T* gi, const BlockedTransposed& g,
                       cudaStream_t stream) {
  constexpr int R = K == 7 || sizeof(T) == 8 ? 2 : 4;  // 4 rows would spill there
  constexpr int V = 4;
  const auto aligned = [](const void* p, int v) {
    return reinterpret_cast<uintptr_t>(p) % (v * sizeof(T)) == 0;
  };
  if (g.pw == (K - 1) / 2 && g.w % (2 * V) == 0 && g.ow % V == 0 && aligned(gi, 2 * V) &&
      aligned(go, V)) {
    return launch_transposed_variant<T, K, R, V, true>(go, weight, gi, g, stream);
  }
  launch_transposed_variant<T, K, R, V, false>(go, weight, gi, g, stream);
}

}  // namespace transposed_detail

// Runs the stride-2 transposed kernel when it takes the geometry (k x k taps
// of 3, 5 or 7 (not 7 in float64), every index within int32, padding
// 0 <= p < 2^20); false otherwise, and the caller takes another route.
template <typename T>
bool launch_blocked_transposed(const T* go, const T* weight, T* gi, const BlockedTransposed& g,
                               int64_t go_numel, int64_t gi_numel, int k, cudaStream_t stream) {
  using namespace transposed_detail;
  constexpr int64_t kMax = int64_t{1} << 30;
  if (go_numel >= kMax || gi_numel >= kMax) return false;
  if (g.ph < 0 || g.pw < 0 || g.ph >= (1 << 20) || g.pw >= (1 << 20)) return false;
  if (k == 3) {
    launch_transposed<T, 3>(go, weight, gi, g, stream);
    return true;
  }
  if (k == 5) {
    launch_transposed<T, 5>(go, weight, gi, g, stream);
    return true;
  }
  if constexpr (sizeof(T) <= 4) {
    if (k == 7) {
      launch_transposed<T, 7>(go, weight, gi, g, stream);
      return true;
    }
  }
  return false;
}

}  // namespace customconv
