// Deterministic CUDA engine for the weight gradient of batched plane
// correlations (depthwise convolution, filter2d): for each weight plane wp,
//
//   gw[wp](i, j) = sum_t sum_{y,x} go_t(y, x) * in_t(y*sh - ph + i*dh, x*sw - pw + j*dw)
//
// over terms t, where go_t is grad-output plane t*go_term_stride + wp and in_t is
// input plane t*in_term_stride + wp/mult (read through a Loader that supplies
// the border). Stage 1 writes one fp32/fp64 partial sum per (weight plane,
// chunk of work, tap); stage 2 adds the chunks in order. No atomics: the
// result is bitwise reproducible.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/correlation/plane_correlation.cuh"

namespace customconv {

struct PlaneWeightGrad {
  int64_t weight_planes, terms;
  int64_t go_term_stride, in_term_stride, mult;
  int in_h, in_w, out_h, out_w;
  int kh, kw, sh, sw, ph, pw, dh, dw;
};

namespace plane_detail {

constexpr int kGradThreads = 256;
constexpr int kMaxGroupsPerThread = 4;  // tap quads a thread can own
constexpr int kTargetBlocks = 1024;     // stage-1 blocks aimed for (from shapes only)
constexpr int kMaxSamples = 1024;       // grad-output samples per work unit
constexpr int kGoPad = 4;               // grad-output tile row pitch: GX + kGoPad

// Block of 256 threads on weight plane blockIdx.x, chunk blockIdx.y of its
// work units (term, tile of GY x GX grad-output samples, GY*GX = `samples`). Per unit the block
// stages the grad-output tile and the input tile with halo in shared memory.
// Taps are taken in quads (i, j0..j0+3): with G quads, the threads form G
// teams of P = 256/G (each thread one quad, samples strided by P), or, when
// G > 256, each thread owns up to 4 quads and every sample. At the end the
// teams' sums are reduced in a fixed order.
template <typename T, typename Loader>
__global__ void __launch_bounds__(kGradThreads)
    weight_grad_partial_kernel(const T* __restrict__ go, const T* __restrict__ in,
                               at::opmath_type<T>* __restrict__ partial, PlaneWeightGrad g,
                               Loader load, int samples, int gx_shift, int tiles_x,
                               int64_t tiles_per_term, int rows, int cols, int pitch) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  acc_t* go_s = reinterpret_cast<acc_t*>(shared_raw);
  acc_t* in_s = go_s + (samples >> gx_shift) * ((1 << gx_shift) + kGoPad);
  int* row_src = reinterpret_cast<int*>(in_s + rows * pitch);
  int* col_src = row_src + rows;
  __shared__ acc_t team_sums[kGradThreads * 4];
  const int gx = 1 << gx_shift, gy = samples >> gx_shift;
  const int tid = threadIdx.x;
  const int kwq = (g.kw + 3) / 4;
  const int quads = g.kh * kwq;
  const int team = quads >= kGradThreads ? 1 : kGradThreads / quads;
  const int64_t wp = blockIdx.x;
  const int64_t chunks = gridDim.y, chunk = blockIdx.y;
  const int64_t units = g.terms * tiles_per_term;
  const int64_t u0 = units * chunk / chunks, u1 = units * (chunk + 1) / chunks;
  const int64_t out_plane = int64_t(g.out_h) * g.out_w, in_plane = int64_t(g.in_h) * g.in_w;
  const int in_h = g.in_h, in_w = g.in_w;

  acc_t acc[kMaxGroupsPerThread][4];
#pragma unroll
  for (int q = 0; q < kMaxGroupsPerThread; ++q)
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[q][r] = acc_t(0);

  for (int64_t u = u0; u < u1; ++u) {
    const int64_t t = u / tiles_per_term;
    const int tile = static_cast<int>(u - t * tiles_per_term);
    const int oy0 = (tile / tiles_x) * gy, ox0 = (tile % tiles_x) * gx;
    const int gy0 = oy0 * g.sh - g.ph, gx0 = ox0 * g.sw - g.pw;
    const T* gop = go + (t * g.go_term_stride + wp) * out_plane;
    const T* inp = in + (t * g.in_term_stride + wp / g.mult) * in_plane;
    __syncthreads();  // the previous unit's tiles are no longer read
    fill_box<4>(go_s, gy * (gx + kGoPad), tid, kGradThreads, gy, gx + kGoPad,
                [&](int, int row, int col) {
                  const int y = oy0 + row, x = ox0 + col;
                  return col < gx && y < g.out_h && x < g.out_w
                             ? static_cast<acc_t>(gop[int64_t(y) * g.out_w + x])
                             : acc_t(0);
                });
    fill_index_tables(row_src, col_src, rows, cols, pitch, gy0, gx0, in_h, in_w, load, tid,
                      kGradThreads);
    __syncthreads();
    fill_box<8>(in_s, rows * pitch, tid, kGradThreads, rows, pitch, [&](int, int row, int col) {
      const int rs = row_src[row], cs = col_src[col];
      return (rs | cs) >= 0 ? static_cast<acc_t>(inp[int64_t(rs) * in_w + cs]) : acc_t(0);
    });
    __syncthreads();
    const int vy = min(gy, g.out_h - oy0), vx = min(gx, g.out_w - ox0);
#pragma unroll
    for (int q = 0; q < kMaxGroupsPerThread; ++q) {
      const int quad = team == 1 ? tid + q * kGradThreads : (q == 0 ? tid / team : quads);
      if (quad >= quads) continue;
      const int lane = team == 1 ? 0 : tid % team;
      const int i = quad / kwq, j0 = (quad - i * kwq) * 4;
      const acc_t* in_q = in_s + i * g.dh * pitch + j0 * g.dw;
      for (int s = lane; s < samples; s += team) {
        const int sy = s >> gx_shift, sx = s & (gx - 1);
        if (sy >= vy || sx >= vx) continue;
        const acc_t gv = go_s[sy * (gx + kGoPad) + sx];
        const acc_t* v = in_q + sy * g.sh * pitch + sx * g.sw;
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[q][r] += gv * v[r * g.dw];
      }
    }
  }

  acc_t* dst = partial + (wp * chunks + chunk) * g.kh * g.kw;
  if (team == 1) {
#pragma unroll
    for (int q = 0; q < kMaxGroupsPerThread; ++q) {
      const int quad = tid + q * kGradThreads;
      if (quad >= quads) continue;
      const int i = quad / kwq, j0 = (quad - i * kwq) * 4;
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (j0 + r < g.kw) dst[i * g.kw + j0 + r] = acc[q][r];
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) team_sums[tid * 4 + r] = acc[0][r];
  __syncthreads();
  for (int e = tid; e < quads * 4; e += kGradThreads) {
    const int quad = e / 4, r = e % 4;
    const int i = quad / kwq, j = (quad - i * kwq) * 4 + r;
    if (j < g.kw) {
      acc_t sum = 0;
      for (int lane = 0; lane < team; ++lane) sum += team_sums[(quad * team + lane) * 4 + r];
      dst[i * g.kw + j] = sum;
    }
  }
}

// Sums each of the kTaps accumulators over the kGradThreads threads of the
// block in a fixed order (a shuffle tree per warp, then the warps in turn)
// and hands sum t to store(t, sum). Every thread of the block must call it.
template <int kTaps, typename Acc, typename Store>
__device__ inline void store_block_sums(const Acc (&acc)[kTaps], Store store) {
  __shared__ Acc warp_sums[kGradThreads / 32][kTaps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
    Acc v = acc[t];
    for (int step = 16; step > 0; step >>= 1) v += __shfl_down_sync(0xffffffffu, v, step);
    if (lane == 0) warp_sums[warp][t] = v;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < kTaps; t += kGradThreads) {
    Acc sum = 0;
    for (int w = 0; w < kGradThreads / 32; ++w) sum += warp_sums[w][t];
    store(t, sum);
  }
}

// The same partial sums for square kernels of kK = 3, 5 or 7 taps, stride kS
// and dilation 1: each thread owns all kK*kK taps and a strip of 4 samples
// along x per work unit (lanes walk down the rows, so the padded pitches keep
// shared memory free of bank conflicts), keeping one row of inputs in
// registers for all 4 samples; a fixed shuffle tree and a fixed pass over the
// warps then reduce the block's sums.
template <typename T, typename Loader, int kS, int kK>
__global__ void __launch_bounds__(kGradThreads)
    weight_grad_small_kernel(const T* __restrict__ go, const T* __restrict__ in,
                             at::opmath_type<T>* __restrict__ partial, PlaneWeightGrad g,
                             Loader load, int samples, int gx_shift, int tiles_x,
                             int64_t tiles_per_term, int rows, int cols, int pitch) {
  using acc_t = at::opmath_type<T>;
  constexpr int kTaps = kK * kK;
  constexpr int kSpan = 3 * kS + kK;  // inputs of one tap row under 4 samples
  extern __shared__ __align__(16) unsigned char shared_raw[];
  const int gx = 1 << gx_shift, gy = samples >> gx_shift, go_pitch = gx + kGoPad;
  acc_t* go_s = reinterpret_cast<acc_t*>(shared_raw);
  acc_t* in_s = go_s + gy * go_pitch;
  int* row_src = reinterpret_cast<int*>(in_s + rows * pitch);
  int* col_src = row_src + rows;
  const int tid = threadIdx.x;
  const int64_t wp = blockIdx.x;
  const int64_t chunks = gridDim.y, chunk = blockIdx.y;
  const int64_t units = g.terms * tiles_per_term;
  const int64_t u0 = units * chunk / chunks, u1 = units * (chunk + 1) / chunks;
  const int64_t out_plane = int64_t(g.out_h) * g.out_w, in_plane = int64_t(g.in_h) * g.in_w;
  const int in_h = g.in_h, in_w = g.in_w;

  acc_t acc[kTaps];
#pragma unroll
  for (int t = 0; t < kTaps; ++t) acc[t] = acc_t(0);

  for (int64_t u = u0; u < u1; ++u) {
    const int64_t t = u / tiles_per_term;
    const int tile = static_cast<int>(u - t * tiles_per_term);
    const int oy0 = (tile / tiles_x) * gy, ox0 = (tile % tiles_x) * gx;
    const int gy0 = oy0 * kS - g.ph, gx0 = ox0 * kS - g.pw;
    const int vy = min(gy, g.out_h - oy0), vx = min(gx, g.out_w - ox0);
    // Inputs that no valid sample reads stay zero, so the padding samples
    // (grad output zero) never meet a stray Inf.
    const int rows_read = (vy - 1) * kS + kK, cols_read = (vx - 1) * kS + kK;
    const T* gop = go + (t * g.go_term_stride + wp) * out_plane;
    const T* inp = in + (t * g.in_term_stride + wp / g.mult) * in_plane;
    __syncthreads();  // the previous unit's tiles are no longer read
    fill_box<4>(go_s, gy * go_pitch, tid, kGradThreads, gy, go_pitch, [&](int, int row, int col) {
      return row < vy && col < vx
                 ? static_cast<acc_t>(gop[int64_t(oy0 + row) * g.out_w + ox0 + col])
                 : acc_t(0);
    });
    fill_index_tables(row_src, col_src, rows_read, cols_read, pitch, gy0, gx0, in_h, in_w, load,
                      tid, kGradThreads);
    for (int r = rows_read + tid; r < rows; r += kGradThreads) row_src[r] = -1;
    __syncthreads();
    fill_box<8>(in_s, rows * pitch, tid, kGradThreads, rows, pitch, [&](int, int row, int col) {
      const int rs = row_src[row], cs = col_src[col];
      return (rs | cs) >= 0 ? static_cast<acc_t>(inp[int64_t(rs) * in_w + cs]) : acc_t(0);
    });
    __syncthreads();
    for (int q = tid; q < samples / 4; q += kGradThreads) {
      const int sy = q & (gy - 1), sx = (q / gy) * 4;
      if (sy >= vy || sx >= vx) continue;
      acc_t gv[4];
      load4(go_s + sy * go_pitch + sx, gv[0], gv[1], gv[2], gv[3]);
#pragma unroll
      for (int i = 0; i < kK; ++i) {
        const acc_t* row = in_s + (sy * kS + i) * pitch + sx * kS;
        acc_t b[kSpan];
#pragma unroll
        for (int e = 0; e < kSpan; ++e) b[e] = row[e];
#pragma unroll
        for (int j = 0; j < kK; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[i * kK + j] += gv[r] * b[r * kS + j];
      }
    }
  }

  acc_t* dst = partial + (wp * chunks + chunk) * kTaps;
  store_block_sums<kTaps>(acc, [&](int t, acc_t sum) { dst[t] = sum; });
}

// One thread per (weight plane, entry): adds the chunks' partial sums in
// order. A weight plane's partials hold `entries` sums per chunk: its taps,
// then (entries == taps + 1) its bias gradient, written to gb unless null.
template <typename T>
__global__ void weight_grad_finish_kernel(const at::opmath_type<T>* __restrict__ partial,
                                          T* __restrict__ gw, T* __restrict__ gb, int64_t total,
                                          int64_t taps, int64_t entries, int64_t chunks) {
  using acc_t = at::opmath_type<T>;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t wp = idx / entries, e = idx % entries;
    const acc_t* src = partial + wp * chunks * entries + e;
    acc_t sum = 0;
    for (int64_t c = 0; c < chunks; ++c) sum += src[c * entries];
    if (e < taps) {
      gw[wp * taps + e] = static_cast<T>(sum);
    } else if (gb != nullptr) {
      gb[wp] = static_cast<T>(sum);
    }
  }
}

// Stage 2 on `stream`: gw (and gb, when the partials carry a bias entry) =
// the `chunks` partial sums of each weight plane, added in order.
template <typename T>
void launch_weight_grad_finish(const at::opmath_type<T>* partial, T* gw, T* gb,
                               const PlaneWeightGrad& g, int64_t entries, int64_t chunks,
                               cudaStream_t stream) {
  const int64_t taps = int64_t(g.kh) * g.kw;
  const int64_t total = g.weight_planes * entries;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, int64_t{1} << 20);
  weight_grad_finish_kernel<T>
      <<<blocks, 256, 0, stream>>>(partial, gw, gb, total, taps, entries, chunks);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace plane_detail

// Plan of a weight-gradient launch; `ok` is false when the geometry does not
// fit the engine (shared memory, index range, more than 1024 tap quads).
struct WeightGradPlan {
  bool ok = false;
  int samples = 0, gx_shift = 0, tiles_x = 0, rows = 0, cols = 0, pitch = 0;
  int64_t tiles_per_term = 0, chunks = 0, shared_bytes = 0;
};

template <typename Acc>
WeightGradPlan plan_weight_grad(const PlaneWeightGrad& g) {
  using namespace plane_detail;
  WeightGradPlan p;
  constexpr int64_t lim = int64_t{1} << 30;
  const int64_t span_y = int64_t(g.out_h + kMaxSamples) * g.sh + int64_t(g.kh) * g.dh + g.ph;
  const int64_t span_x = int64_t(g.out_w + 64) * g.sw + int64_t(g.kw + 4) * g.dw + g.pw;
  if (g.in_h >= lim || g.in_w >= lim || span_y >= lim || span_x >= lim) return p;
  const int kwq = (g.kw + 3) / 4;
  if (int64_t(g.kh) * kwq > int64_t(kGradThreads) * kMaxGroupsPerThread) return p;
  const int gx = std::max(4, pow2_at_least(g.out_w, 64));
  p.gx_shift = 0;
  while ((1 << p.gx_shift) < gx) ++p.gx_shift;
  // The largest tile (at most kMaxSamples, at least one row) whose shared
  // memory fits.
  const int tall = pow2_at_least(g.out_h, kMaxSamples);
  for (p.samples = std::max(gx, std::min(kMaxSamples, gx * tall));; p.samples /= 2) {
    const int gy = p.samples >> p.gx_shift;
    p.rows = (gy - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    p.cols = (gx - 1) * g.sw + (4 * kwq - 1) * g.dw + 1;
    p.pitch = pitch_for(p.cols);
    p.shared_bytes = (int64_t(gy) * (gx + kGoPad) + int64_t(p.rows) * p.pitch) * sizeof(Acc) +
                     int64_t(p.rows + p.pitch) * sizeof(int);
    if (p.shared_bytes + kGradThreads * 4 * sizeof(Acc) <= kMaxSharedBytes) break;
    if (gy == 1) return p;
  }
  const int gy = p.samples >> p.gx_shift;
  p.tiles_x = static_cast<int>((g.out_w + gx - 1) / gx);
  p.tiles_per_term = p.tiles_x * ((g.out_h + gy - 1) / gy);
  if (p.tiles_per_term >= (int64_t{1} << 31) || g.weight_planes >= (int64_t{1} << 31)) return p;
  const int64_t units = g.terms * p.tiles_per_term;
  p.chunks = std::min<int64_t>(
      std::max<int64_t>(1, (kTargetBlocks + g.weight_planes - 1) / g.weight_planes),
      std::min<int64_t>(units, 65535));
  p.ok = units > 0;
  return p;
}

// Stage 1 and 2 on `stream`; `partial` holds weight_planes * chunks * kh * kw
// accumulators (opmath type).
template <typename T, typename Loader>
void launch_plane_weight_grad(const T* go, const T* in, at::opmath_type<T>* partial, T* gw,
                              const PlaneWeightGrad& g, const WeightGradPlan& p, Loader load,
                              cudaStream_t stream) {
  using namespace plane_detail;
  const dim3 grid(static_cast<unsigned>(g.weight_planes), static_cast<unsigned>(p.chunks));
  auto small = [&](auto s, auto k) {
    weight_grad_small_kernel<T, Loader, decltype(s)::value, decltype(k)::value>
        <<<grid, kGradThreads, p.shared_bytes, stream>>>(go, in, partial, g, load, p.samples,
                                                         p.gx_shift, p.tiles_x, p.tiles_per_term,
                                                         p.rows, p.cols, p.pitch);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using K3 = std::integral_constant<int, 3>;
  using K5 = std::integral_constant<int, 5>;
  using K7 = std::integral_constant<int, 7>;
  const bool square = g.kh == g.kw && g.dh == 1 && g.dw == 1 && g.sh == g.sw;
  int k = square ? g.kh : 0;
  const int s = square ? g.sh : 0;
  if constexpr (!std::is_same<T, double>::value) {
    if (s == 1 && k == 3)
      small(I1{}, K3{});
    else if (s == 1 && k == 5)
      small(I1{}, K5{});
    else if (s == 1 && k == 7)
      small(I1{}, K7{});
    else if (s == 2 && k == 3)
      small(I2{}, K3{});
    else if (s == 2 && k == 5)
      small(I2{}, K5{});
    else
      k = 0;
  } else {
    k = 0;
  }
  if (k == 0) {
    weight_grad_partial_kernel<T, Loader><<<grid, kGradThreads, p.shared_bytes, stream>>>(
        go, in, partial, g, load, p.samples, p.gx_shift, p.tiles_x, p.tiles_per_term, p.rows,
        p.cols, p.pitch);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  launch_weight_grad_finish<T>(partial, gw, nullptr, g, int64_t(g.kh) * g.kw, p.chunks, stream);
}

}  // namespace customconv
