// A register-blocked plane correlation: square kernels of 3, 5 or 7 taps,
// stride 1 or 2, dilation 1, zero border. It reads the input straight from
// global memory (the L1 cache catches the overlap between neighbours) and keeps
// everything else in registers, so it spends few instructions per output.
// depthwise_conv2d and filter2d run their forward passes and stride-1 input
// gradients (the same correlation over the grad output with the taps rotated)
// through it where it takes the geometry; the tiled engine in
// plane_correlation.cuh takes the rest. At stride 1, float16 and bfloat16
// data go to the tensor-core kernel (tensor_core_correlation.cuh) first.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/common/async_copy.cuh"
#include "ops/correlation/correlation_geometry.h"
#include "ops/correlation/streamed_tile_correlation.h"
#include "ops/correlation/tensor_core_correlation.cuh"

namespace customconv {

constexpr int kBlockedThreads = 256;

// V consecutive elements, aligned as one vector load or store (4 elements: 8
// bytes of 16-bit data, 16 of float32; 8 elements of 16-bit data: 16 bytes).
template <typename T, int V>
struct alignas(V * sizeof(T)) Vec {
  T v[V];
};

// col_ok[c]: whether input column ix0 + c lies inside a row of w columns.
template <int N>
__device__ __forceinline__ void column_mask(int ix0, int w, bool (&col_ok)[N]) {
#pragma unroll
  for (int c = 0; c < N; ++c) col_ok[c] = ix0 + c >= 0 && ix0 + c < w;
}

// A thread of a blocked kernel: its column block, row block and plane, thread
// idx being numbered column block first, then row block, then plane.
struct BlockedThread {
  int cx, ry, plane;
};

__device__ __forceinline__ BlockedThread blocked_thread(int idx, int col_blocks, int row_blocks) {
  const int rest = idx / col_blocks;
  return {idx % col_blocks, rest % row_blocks, rest / row_blocks};
}

// quads[V * q + l] = element x + V * q + l of row iy of a plane of h rows of
// w elements at src, for q < kVecs, zero outside the plane. x and w are
// multiples of V and src is aligned to V elements, so each vector lies wholly
// inside or wholly outside the row and moves as one aligned load.
template <typename T, int V, int kVecs>
__device__ __forceinline__ void load_aligned_vectors(const T* __restrict__ src, int iy, int x,
                                                     int h, int w, T (&quads)[kVecs * V]) {
  const bool row_ok = iy >= 0 && iy < h;
#pragma unroll
  for (int q = 0; q < kVecs; ++q) {
    const int xq = x + V * q;
    Vec<T, V> v;
    if (row_ok && xq >= 0 && xq < w) {
      v = *reinterpret_cast<const Vec<T, V>*>(src + iy * w + xq);
    } else {
#pragma unroll
      for (int l = 0; l < V; ++l) v.v[l] = T(0);
    }
#pragma unroll
    for (int l = 0; l < V; ++l) quads[V * q + l] = v.v[l];
  }
}

// Elements per vector access of a thread of V columns on the vector path: V
// (one vector per row of outputs), except float32 threads of 8 columns, which
// move 16-byte vectors of 4.
template <typename T, int V>
constexpr int kVectorWidth = sizeof(T) == 4 && V == 8 ? 4 : V;

// The kCols = (V-1)*S+K input values of row iy (of a plane at src) that a
// thread whose V output columns start at x0 (input column ix0) needs, zero
// outside the plane, as acc_t; see the kernel below for kQuads.
template <typename T, typename acc_t, int K, int S, int V, bool kQuads>
__device__ __forceinline__ void load_blocked_row(const T* __restrict__ src, int iy, int x0, int ix0,
                                                 const BlockedCorrelation& g,
                                                 const bool (&col_ok)[(V - 1) * S + K],
                                                 acc_t (&vals)[(V - 1) * S + K]) {
  constexpr int kCols = (V - 1) * S + K;
  if constexpr (kQuads) {
    constexpr int L = kVectorWidth<T, V>;
    static_assert((K - 1) / 2 <= L, "the vectors start L columns left of the thread's first");
    constexpr int kFirst = L - (K - 1) / 2;  // position of column ix0 in the vectors
    // 3 vectors at stride 1 with L == V, 3 or 4 at stride 2, 4 for 8 float32 columns.
    constexpr int kVecs = (kFirst + kCols - 1) / L + 1;
    T quads[kVecs * L];
    load_aligned_vectors<T, L, kVecs>(src, iy, x0 * S - L, g.h, g.w, quads);
#pragma unroll
    for (int c = 0; c < kCols; ++c) vals[c] = static_cast<acc_t>(quads[kFirst + c]);
  } else {
    const bool row_ok = iy >= 0 && iy < g.h;
    const T* row = src + (row_ok ? iy : 0) * g.w + ix0;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      vals[c] = row_ok && col_ok[c] ? static_cast<acc_t>(row[c]) : acc_t(0);
    }
  }
}

// Writes a thread's R x V sums (plus bias[oc] when there is a bias, then
// g.act applied) to the output plane at dst, rows from y0 and columns from
// x0: one vector store per row on the vector path, else the columns inside
// the plane one at a time. Every forward kernel of this file, and the
// streamed-tile kernel, stores through here.
template <typename T, typename acc_t, int R, int V, bool kQuads>
__device__ __forceinline__ void store_blocked_outputs(const acc_t (&acc)[R][V],
                                                      const T* __restrict__ bias, int oc,
                                                      T* __restrict__ dst, int y0, int x0,
                                                      const BlockedCorrelation& g) {
  const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[oc]) : acc_t(0);
  acc_t out[R][V];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int v = 0; v < V; ++v) out[i][v] = acc[i][v] + b;
  }
  activate_sums(g.act, out);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int y = y0 + i;
    if (y >= g.oh) break;
    if constexpr (kQuads) {
      constexpr int L = kVectorWidth<T, V>;
#pragma unroll
      for (int q = 0; q < V / L; ++q) {
        // With L < V the plane's width is a multiple of L only.
        if (L < V && x0 + L * q >= g.ow) break;
        Vec<T, L> o;
#pragma unroll
        for (int l = 0; l < L; ++l) o.v[l] = static_cast<T>(out[i][L * q + l]);
        *reinterpret_cast<Vec<T, L>*>(dst + y * g.ow + x0 + L * q) = o;
      }
    } else {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (x0 + v < g.ow) dst[y * g.ow + x0 + v] = static_cast<T>(out[i][v]);
      }
    }
  }
}

// Whether the kernel below walks the tap rows outermost (float32 with 7 taps:
// 49 weights in registers would spill under the two-blocks-per-SM bound).
template <typename T, int K>
constexpr bool kBlockedTapRowsOuter = K == 7 && sizeof(T) == 4;

// One thread per block of R rows x V columns (4, or 8 for 16-bit data on the
// vector path) of one output plane; threads are numbered column block first,
// then row block, then plane, so neighbours share input rows. Each thread
// loads the (R-1)*S+K input rows it needs, one row of (V-1)*S+K values at a
// time, and adds it into every output row that uses it.
// kQuads ("same" padding (K-1)/2, widths and pointers aligned to V elements):
// a row's values are the aligned V-element vectors around the input columns
// of the thread's V outputs (three at stride 1, three or four at stride 2),
// read as vector loads (each lies wholly inside or wholly outside the row),
// and the V outputs are one vector store.
// kBlockedTapRowsOuter: the thread walks the K tap rows, holding one row of
// taps, and loads for each of its R output rows the input row that tap row
// meets (R*K row loads instead of (R-1)*S+K, and K registers of taps, not K*K).
template <typename T, int K, int S, int R, int V, bool kQuads>
__global__ void __launch_bounds__(kBlockedThreads, 2)
    blocked_correlation_kernel(const T* __restrict__ in, const T* __restrict__ weight,
                               const T* __restrict__ bias, T* __restrict__ out,
                               BlockedCorrelation g, int col_blocks, int row_blocks, int total) {
  using acc_t = at::opmath_type<T>;
  constexpr int kRows = (R - 1) * S + K;
  constexpr int kCols = (V - 1) * S + K;
  const int idx = blockIdx.x * kBlockedThreads + threadIdx.x;
  if (idx >= total) return;
  const auto [cx, ry, plane] = blocked_thread(idx, col_blocks, row_blocks);
  const int oc = plane % g.out_channels, n = plane / g.out_channels;
  const int y0 = ry * R, x0 = cx * V;
  const int iy0 = y0 * S - g.ph, ix0 = x0 * S - g.pw;

  bool col_ok[kCols];
  column_mask(ix0, g.w, col_ok);

  acc_t acc[R][V];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int v = 0; v < V; ++v) acc[i][v] = acc_t(0);
  }
  for (int j = 0; j < g.fan; ++j) {
    const int wrow = oc * g.fan + j;
    const T* src = in + (int64_t(n) * g.in_channels + wrow / g.div) * g.h * g.w;
    const T* wp = weight + int64_t(wrow) * K * K;
    if constexpr (kBlockedTapRowsOuter<T, K>) {
#pragma unroll 1
      for (int kr = 0; kr < K; ++kr) {
        acc_t taps[K];
#pragma unroll
        for (int kc = 0; kc < K; ++kc) {
          taps[kc] = static_cast<acc_t>(square_tap<K>(wp, kr, kc, g.flip));
        }
#pragma unroll
        for (int i = 0; i < R; ++i) {
          acc_t vals[kCols];
          load_blocked_row<T, acc_t, K, S, V, kQuads>(src, iy0 + i * S + kr, x0, ix0, g,
                                                      col_ok, vals);
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int kc = 0; kc < K; ++kc) acc[i][v] += taps[kc] * vals[v * S + kc];
          }
        }
      }
    } else {
      acc_t taps[K][K];
#pragma unroll
      for (int a = 0; a < K; ++a) {
#pragma unroll
        for (int b = 0; b < K; ++b) {
          taps[a][b] = static_cast<acc_t>(square_tap<K>(wp, a, b, g.flip));
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        acc_t vals[kCols];
        load_blocked_row<T, acc_t, K, S, V, kQuads>(src, iy0 + r, x0, ix0, g, col_ok, vals);
#pragma unroll
        for (int i = 0; i < R; ++i) {
          const int kr = r - i * S;  // the tap row that input row r is for output row i
          if (kr < 0 || kr >= K) continue;
#pragma unroll
          for (int v = 0; v < V; ++v) {
#pragma unroll
            for (int kc = 0; kc < K; ++kc) acc[i][v] += taps[kr][kc] * vals[v * S + kc];
          }
        }
      }
    }
  }
  store_blocked_outputs<T, acc_t, R, V, kQuads>(acc, bias, oc, out + int64_t(plane) * g.oh * g.ow,
                                                y0, x0, g);
}

// Taps of one plane as the shared-taps kernel below stages them: K rows of
// kTapStride floats (K rounded up to a multiple of 4, so a row is whole
// 16-byte vectors), rotated by 180 degrees for the input gradient.
template <int K>
constexpr int kTapStride = (K + 3) / 4 * 4;

// Reads one staged tap row from shared memory. The loads are volatile so the
// compiler reloads a row for each input row it meets instead of holding all
// K*K taps in registers (which spilled at 7 taps).
template <int K>
__device__ __forceinline__ void load_tap_row(const float* row, float (&taps)[kTapStride<K>]) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
#pragma unroll
  for (int q = 0; q < kTapStride<K> / 4; ++q) {
    asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(taps[4 * q]), "=f"(taps[4 * q + 1]), "=f"(taps[4 * q + 2]),
                   "=f"(taps[4 * q + 3])
                 : "r"(addr + 16 * q));
  }
}

// Adds input row r of a thread's window into each of its R output rows that
// row meets (output row i takes it with tap row r - i, read from the staged
// taps): vals[kOffset + c] is input column x0 - (K-1)/2 + c.
template <int K, int R, int V, int kOffset, int N>
__device__ __forceinline__ void accumulate_input_row(const float* taps, int r,
                                                     const float (&vals)[N], float (&acc)[R][V]) {
  static_assert(kOffset + V - 1 + K <= N, "the row holds every column the outputs read");
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int kr = r - i;  // the tap row that input row r is for output row i
    if (kr < 0 || kr >= K) continue;
    float tap_row[kTapStride<K>];
    load_tap_row<K>(taps + kr * kTapStride<K>, tap_row);
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
      for (int kc = 0; kc < K; ++kc) acc[i][v] += tap_row[kc] * vals[kOffset + v + kc];
    }
  }
}

// The R x V sums of a thread at stride 1 from its window of R + K - 1 input
// rows staged in shared memory (row pitch kPitch floats; `rows` points at
// the column 4 left of the thread's first output, so each row is whole
// 16-byte reads with no border tests) and taps staged as K rows of
// kTapStride<K> floats; the sums in the order of the kernels above.
template <int K, int R, int V, int kPitch>
__device__ __forceinline__ void correlate_shared_window(const float* rows, const float* taps,
                                                        float (&acc)[R][V]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int v = 0; v < V; ++v) acc[i][v] = 0.f;
  }
#pragma unroll
  for (int r = 0; r < R + K - 1; ++r) {
    float vals[V + 8];
#pragma unroll
    for (int q = 0; q < (V + 8) / 4; ++q) {
      const float4 t = *reinterpret_cast<const float4*>(rows + r * kPitch + 4 * q);
      vals[4 * q] = t.x, vals[4 * q + 1] = t.y, vals[4 * q + 2] = t.z, vals[4 * q + 3] = t.w;
    }
    accumulate_input_row<K, R, V, 4 - (K - 1) / 2>(taps, r, vals, acc);
  }
}

// The blocked correlation at stride 1 with one weight row per output plane
// (fan 1), taps in shared memory. Threads map to R x V output blocks as in
// blocked_correlation_kernel. The block first stages, as float, the taps of
// the planes its threads cover (numbered from the block's first plane); each
// thread then walks its R+K-1 input rows once, and for each tap row that row
// meets reads that row of taps from shared memory (a broadcast: the threads
// of a plane read the same address) into V*K multiply-adds. So a thread holds
// R*V sums, one input row and one tap row, where blocked_correlation_kernel
// holds all K*K taps (16-bit data) or reloads an input row per tap row and
// output row (float32 with 7 taps). kMinBlocks is the occupancy ptxas plans
// for (see kSharedTapsShape).
template <typename T, int K, int R, int V, bool kQuads, int kMinBlocks>
__global__ void __launch_bounds__(kBlockedThreads, kMinBlocks)
    blocked_shared_taps_kernel(const T* __restrict__ in, const T* __restrict__ weight,
                               const T* __restrict__ bias, T* __restrict__ out,
                               BlockedCorrelation g, int col_blocks, int row_blocks, int total) {
  static_assert(!std::is_same_v<T, double>, "taps are staged as float");
  constexpr int kRows = R + K - 1;
  constexpr int kCols = V - 1 + K;
  constexpr int kTapsPerPlane = K * kTapStride<K>;
  extern __shared__ float4 shared_taps_raw[];
  float* shared_taps = reinterpret_cast<float*>(shared_taps_raw);

  const int per_plane = col_blocks * row_blocks;
  const int first_idx = blockIdx.x * kBlockedThreads;
  const int first_plane = first_idx / per_plane;
  const int last_plane = (min(first_idx + kBlockedThreads, total) - 1) / per_plane;
  const int staged = (last_plane - first_plane + 1) * kTapsPerPlane;
  for (int e = threadIdx.x; e < staged; e += kBlockedThreads) {
    const int p = e / kTapsPerPlane, rest = e % kTapsPerPlane;
    const int a = rest / kTapStride<K>, b = rest % kTapStride<K>;
    float tap = 0.f;
    if (b < K) {
      const T* wp = weight + int64_t((first_plane + p) % g.out_channels) * K * K;
      tap = static_cast<float>(square_tap<K>(wp, a, b, g.flip));
    }
    shared_taps[e] = tap;
  }
  __syncthreads();

  const int idx = first_idx + threadIdx.x;
  if (idx >= total) return;
  const auto [cx, ry, plane] = blocked_thread(idx, col_blocks, row_blocks);
  const int oc = plane % g.out_channels, n = plane / g.out_channels;
  const int y0 = ry * R, x0 = cx * V;
  const int iy0 = y0 - g.ph, ix0 = x0 - g.pw;
  const float* taps_of_plane = shared_taps + (plane - first_plane) * kTapsPerPlane;
  const T* src = in + (int64_t(n) * g.in_channels + oc / g.div) * g.h * g.w;

  bool col_ok[kCols];
  column_mask(ix0, g.w, col_ok);

  float acc[R][V];
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int v = 0; v < V; ++v) acc[i][v] = 0.f;
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float vals[kCols];
    load_blocked_row<T, float, K, 1, V, kQuads>(src, iy0 + r, x0, ix0, g, col_ok, vals);
    accumulate_input_row<K, R, V, 0>(taps_of_plane, r, vals, acc);
  }
  store_blocked_outputs<T, float, R, V, kQuads>(acc, bias, oc, out + int64_t(plane) * g.oh * g.ow,
                                                y0, x0, g);
}

// The shared-taps kernel's shape for K taps of T on the path with V-element
// vectors (kQuads: the vector path; V is 4 off it): rows and columns per
// thread, or 0 rows where the kernel above stays, and the blocks per SM ptxas
// plans for (4 leaves 64 registers and spills a few bytes, still the fastest
// where chosen). Timed on an H100 against the kernel above and other shapes
// (see bench/NOTES.md): 7 taps in every dtype; 5 taps of float32 on the vector
// path and of 16-bit data with 8 columns. Float32 with 7 taps on the vector
// path takes 8 columns of two vectors: a tap row read from shared memory
// then feeds twice the multiply-adds.
struct SharedTapsShape {
  int rows, cols, min_blocks;
};
template <typename T, int K, int V, bool kQuads>
constexpr SharedTapsShape kSharedTapsShape =
    K == 7   ? (sizeof(T) == 4 ? (kQuads ? SharedTapsShape{4, 8, 3} : SharedTapsShape{4, 4, 4})
                : V == 8       ? SharedTapsShape{4, 8, 3}
                : kQuads       ? SharedTapsShape{8, 4, 3}
                               : SharedTapsShape{2, 4, 4})
    : K == 5 ? (sizeof(T) == 4 ? SharedTapsShape{kQuads ? 8 : 0, 4, 2}
                               : SharedTapsShape{V == 8 ? 4 : 0, 8, 3})
             : SharedTapsShape{0, V, 0};

// Planes one block of the shared-taps kernel may stage taps for: more (tiny
// planes, a few threads each) take the kernel above.
constexpr int kMaxSharedTapPlanes = 64;

// Launches the shared-taps kernel at stride 1 when kSharedTapsShape takes
// the case and a block covers at most kMaxSharedTapPlanes planes; false
// otherwise.
template <typename T, int K, int V, bool kQuads>
bool launch_shared_taps(const T* in, const T* weight, const T* bias, T* out,
                        const BlockedCorrelation& g, cudaStream_t stream) {
  constexpr SharedTapsShape shape = kSharedTapsShape<T, K, V, kQuads>;
  if constexpr (shape.rows == 0 || sizeof(T) * V > 16) {  // 8-element vectors: 16-bit data only
    return false;
  } else {
    constexpr int R = shape.rows, C = shape.cols;
    const int col_blocks = (g.ow + C - 1) / C;
    const int row_blocks = (g.oh + R - 1) / R;
    const int64_t per_plane = int64_t(col_blocks) * row_blocks;
    // 256 consecutive threads meet at most this many planes.
    const int64_t max_planes = (kBlockedThreads - 1) / per_plane + 2;
    if (g.fan != 1 || max_planes > kMaxSharedTapPlanes) return false;
    const int64_t total = g.planes * per_plane;
    const int64_t blocks = (total + kBlockedThreads - 1) / kBlockedThreads;
    const size_t shared = size_t(max_planes) * K * kTapStride<K> * sizeof(float);
    blocked_shared_taps_kernel<T, K, R, C, kQuads, shape.min_blocks>
        <<<blocks, kBlockedThreads, shared, stream>>>(in, weight, bias, out, g, col_blocks,
                                                      row_blocks, static_cast<int>(total));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  }
}

// Float32 7x7 correlation at stride 1 over a tile staged in shared memory.
// A block of kStagedTileCols x (256 / kStagedTileCols) threads owns a tile of
// one output plane: thread (lx, ly) computes R x V outputs (rows y0 .. y0 +
// R - 1, columns x0 .. x0 + V - 1 with y0 = tile row + R ly, x0 = tile column
// + V lx), the same sums in the same order as blocked_shared_taps_kernel. The
// block first copies the tile's whole input window (its rows and K - 1 more,
// its columns and 4 more on each side: whole 16-byte vectors, zeros outside
// the plane) into shared memory, all copies in flight at once (cp.async on
// compute capability 8.0 and newer), with the plane's taps; then every thread
// reads its input rows from there, 16-byte vectors without border tests. Each
// input element is fetched from L2 or memory once per tile (1.16 times in
// all with the halo of a 64 x 128 tile) instead of through per-thread loads
// that wait on memory while the multiply-adds stall.
// Needs "same" column padding (K-1)/2, w a multiple of 4, 16-byte aligned
// input and output, one weight row per plane (fan 1).
constexpr int kStagedTileCols = 16;  // threads along x: 128 columns of 8
constexpr int kStagedPitchPad = 4;   // floats past each staged row (fewer bank conflicts)

template <int K, int R, int V>
struct StagedTile {
  static constexpr int kThreadRows = kBlockedThreads / kStagedTileCols;
  static constexpr int kRows = kThreadRows * R, kCols = kStagedTileCols * V;  // outputs
  static constexpr int kWindowRows = kRows + K - 1, kWindowCols = kCols + 8;
  static constexpr int kPitch = kWindowCols + kStagedPitchPad;
  static constexpr int kTapFloats = K * kTapStride<K>;
  static constexpr size_t kSharedBytes = (kTapFloats + size_t(kWindowRows) * kPitch) * sizeof(float);
  static_assert(kTapFloats % 4 == 0 && kPitch % 4 == 0 && V % 4 == 0,
                "every staged row and every thread's first column start on 16 bytes");
};

template <int K, int R, int V, int kMinBlocks>
__global__ void __launch_bounds__(kBlockedThreads, kMinBlocks)
    staged_tile_correlation_kernel(const float* __restrict__ in, const float* __restrict__ weight,
                                   const float* __restrict__ bias, float* __restrict__ out,
                                   BlockedCorrelation g, int tiles_x, int tiles_y) {
  using Tile = StagedTile<K, R, V>;
  static_assert((K - 1) / 2 <= 4, "the window starts 4 columns left of the tile");
  extern __shared__ float4 staged_shared[];
  float* taps = reinterpret_cast<float*>(staged_shared);
  float* window = taps + Tile::kTapFloats;
  const int tx = blockIdx.x % tiles_x, rest = blockIdx.x / tiles_x;
  const int ty = rest % tiles_y, plane = rest / tiles_y;
  const int oc = plane % g.out_channels, n = plane / g.out_channels;
  const int tile_x0 = tx * Tile::kCols, tile_y0 = ty * Tile::kRows;
  const float* src = in + (int64_t(n) * g.in_channels + oc / g.div) * g.h * g.w;

  constexpr int kVectors = Tile::kWindowCols / 4;  // per window row
  for (int e = threadIdx.x; e < Tile::kWindowRows * kVectors; e += kBlockedThreads) {
    const int r = e / kVectors, c = e % kVectors;
    const int iy = tile_y0 - g.ph + r, ix = tile_x0 - 4 + 4 * c;
    const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;  // w % 4 == 0
    const float* from = inside ? src + int64_t(iy) * g.w + ix : src;
    float* to = window + r * Tile::kPitch + 4 * c;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    copy_async_16(static_cast<unsigned>(__cvta_generic_to_shared(to)), from, inside ? 16 : 0);
#else
    *reinterpret_cast<float4*>(to) =
        inside ? *reinterpret_cast<const float4*>(from) : make_float4(0.f, 0.f, 0.f, 0.f);
#endif
  }
  for (int e = threadIdx.x; e < Tile::kTapFloats; e += kBlockedThreads) {
    const int a = e / kTapStride<K>, b = e % kTapStride<K>;
    taps[e] = b < K ? square_tap<K>(weight + int64_t(oc) * K * K, a, b, g.flip) : 0.f;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  copy_async_wait_all();
#endif
  __syncthreads();

  const int lx = threadIdx.x % kStagedTileCols, ly = threadIdx.x / kStagedTileCols;
  const int x0 = tile_x0 + V * lx, y0 = tile_y0 + R * ly;
  if (x0 >= g.ow || y0 >= g.oh) return;
  float acc[R][V];
  const float* rows = window + R * ly * Tile::kPitch + V * lx;  // column x0 - 4
  correlate_shared_window<K, R, V, Tile::kPitch>(rows, taps, acc);
  store_blocked_outputs<float, float, R, V, true>(acc, bias, oc,
                                                  out + int64_t(plane) * g.oh * g.ow, y0, x0, g);
}

// Launches the staged-tile kernel for float32 with 7 taps on the vector path
// when the output plane holds at least one whole tile each way; false
// otherwise. Timed alone on an H100 against the shared-taps kernel: a 4096^2
// plane 0.0675 -> 0.0615 ms, 48 planes of 1024^2 0.174 -> 0.163, 24 of 512^2
// 0.028 -> 0.027; 112^2 planes (narrower than a tile) ran even, and planes
// far smaller than a tile waste most of its threads, so those keep it.
template <typename T, int K>
bool launch_staged_tile(const T* in, const T* weight, const T* bias, T* out,
                        const BlockedCorrelation& g, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float> || K != 7) {
    return false;
  } else {
    constexpr int R = 4, V = 8;
    using Tile = StagedTile<K, R, V>;
    if (g.fan != 1 || g.ow < Tile::kCols || g.oh < Tile::kRows) return false;
    const int64_t tiles_x = (g.ow + Tile::kCols - 1) / Tile::kCols;
    const int64_t tiles_y = (g.oh + Tile::kRows - 1) / Tile::kRows;
    const int64_t blocks = tiles_x * tiles_y * g.planes;
    if (blocks > std::numeric_limits<int>::max()) return false;
    static_assert(Tile::kSharedBytes <= 48 * 1024, "within the default shared-memory limit");
    staged_tile_correlation_kernel<K, R, V, 3><<<blocks, kBlockedThreads, Tile::kSharedBytes,
                                                 stream>>>(in, weight, bias, out, g,
                                                           static_cast<int>(tiles_x),
                                                           static_cast<int>(tiles_y));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return true;
  }
}

// Columns per thread of the vector path: 8 for 16-bit data (16-byte vectors)
// with 3 or 5 taps, 4 otherwise.
template <typename T, int K>
constexpr int kBlockedVectorCols = sizeof(T) == 2 && K <= 5 ? 8 : 4;

// Output rows per thread: 8 for float32 with 3 or 5 taps at stride 1 on the
// vector path (fewer input rows per output row; 4096x4096 5x5 on an H100 went
// from 67% to 73% of the copy rate; the scalar path would spill), 4 for the
// rest at stride 1, 2 at stride 2.
template <typename T, int K, int S, bool kQuads>
constexpr int kBlockedRows =
    S == 2 ? 2 : (std::is_same_v<T, float> && K <= 5 && kQuads ? 8 : 4);

template <typename T, int K, int S, int R, int V, bool kQuads>
void launch_blocked_variant(const T* in, const T* weight, const T* bias, T* out,
                            const BlockedCorrelation& g, cudaStream_t stream) {
  const int col_blocks = (g.ow + V - 1) / V;
  const int row_blocks = (g.oh + R - 1) / R;
  const int64_t total = int64_t(g.planes) * row_blocks * col_blocks;
  const int64_t blocks = (total + kBlockedThreads - 1) / kBlockedThreads;
  blocked_correlation_kernel<T, K, S, R, V, kQuads><<<blocks, kBlockedThreads, 0, stream>>>(
      in, weight, bias, out, g, col_blocks, row_blocks, static_cast<int>(total));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int K, int S>
void launch_blocked(const T* in, const T* weight, const T* bias, T* out,
                    const BlockedCorrelation& g, cudaStream_t stream) {
  constexpr int R = kBlockedRows<T, K, S, true>;
  constexpr int V = kBlockedVectorCols<T, K>;
  const auto aligned = [](const void* p, int v) {
    return reinterpret_cast<uintptr_t>(p) % (v * sizeof(T)) == 0;
  };
  const auto vectors_fit = [&](int v) {
    return g.pw == (K - 1) / 2 && g.w % v == 0 && g.ow % v == 0 && aligned(in, v) &&
           aligned(out, v);
  };
  const bool fit8 = sizeof(T) == 2 && vectors_fit(8), fit4 = vectors_fit(4);
  if constexpr (S == 1) {
    if (launch_tensor_core_correlation<T, K>(in, weight, bias, out, g, stream)) return;
    if constexpr (std::is_same_v<T, float> && K == 7) {
      if (fit4 && launch_streamed_tile_correlation(in, weight, bias, out, g, stream)) return;
    }
    if (fit4 && launch_staged_tile<T, K>(in, weight, bias, out, g, stream)) return;
    if (fit8 ? launch_shared_taps<T, K, 8, true>(in, weight, bias, out, g, stream)
             : fit4 ? launch_shared_taps<T, K, 4, true>(in, weight, bias, out, g, stream)
                    : launch_shared_taps<T, K, 4, false>(in, weight, bias, out, g, stream)) {
      return;
    }
  }
  if (V != 4 && fit8) {
    return launch_blocked_variant<T, K, S, R, V, true>(in, weight, bias, out, g, stream);
  }
  if (fit4) return launch_blocked_variant<T, K, S, R, 4, true>(in, weight, bias, out, g, stream);
  launch_blocked_variant<T, K, S, kBlockedRows<T, K, S, false>, 4, false>(in, weight, bias, out, g,
                                                                          stream);
}

// Whether the blocked kernel takes k x k taps at stride s on both axes and
// dilation 1, for data of `element_size` bytes. 7 taps of 16-bit data keep all
// 49 weights in registers; of float32, one tap row at a time
// (kBlockedTapRowsOuter); float64 with 7 taps takes the tiled engine.
inline bool blocked_takes(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                          int64_t element_size) {
  const bool taps_ok = kh == 3 || kh == 5 || (kh == 7 && element_size <= 4);
  return taps_ok && kh == kw && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1;
}

// Runs the blocked kernel when it takes the geometry (see blocked_takes; every
// index within int32); false otherwise, and the caller takes another route.
template <typename T>
bool launch_blocked_correlation(const T* in, const T* weight, const T* bias, T* out,
                                const BlockedCorrelation& g, int64_t in_numel, int64_t out_numel,
                                int k, int s, cudaStream_t stream) {
  constexpr int64_t kMax = int64_t{1} << 30;
  if (in_numel >= kMax || out_numel >= kMax) return false;
  if (g.ph < 0 || g.pw < 0 || g.ph >= (1 << 20) || g.pw >= (1 << 20)) return false;
#define CUSTOMCONV_BLOCKED_CASE(KK, SS)                                \
  if (k == KK && s == SS) {                                            \
    launch_blocked<T, KK, SS>(in, weight, bias, out, g, stream);       \
    return true;                                                       \
  }
  CUSTOMCONV_BLOCKED_CASE(3, 1)
  CUSTOMCONV_BLOCKED_CASE(5, 1)
  CUSTOMCONV_BLOCKED_CASE(3, 2)
  CUSTOMCONV_BLOCKED_CASE(5, 2)
  if constexpr (sizeof(T) <= 4) {  // float64 with 7 taps takes the tiled engine
    CUSTOMCONV_BLOCKED_CASE(7, 1)
    CUSTOMCONV_BLOCKED_CASE(7, 2)
  }
#undef CUSTOMCONV_BLOCKED_CASE
  return false;
}

}  // namespace customconv
