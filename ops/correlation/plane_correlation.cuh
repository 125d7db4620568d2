// Shared-memory tiled CUDA engine for batches of independent 2-D correlations
// of planes (depthwise convolution and its input gradient, filter2d). Each
// output plane p sums `fan` correlations:
//
//   out[p](y, x) = sum_r sum_{i,j} taps_r(i, j) * in_r(y*sh - ph + i*dh, x*sw - pw + j*dw)
//
// where in_r is input plane  p*in_mul/in_div + r*in_fan_stride (read through a
// Loader that supplies the border), and taps_r is weight plane
// (p*w_mul) % w_mod + r*w_fan_stride, rotated by 180 degrees when `flip` is set.
// The kernels store act(out[p](y, x) + bias[p % bias_mod]): `act` is identity
// (the default) except for the forward of a fused depthwise layer.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/correlation/correlation_geometry.h"
#include "ops/correlation/large_kernel_correlation.h"

namespace customconv {

struct PlaneCorrelation {
  int64_t out_planes;
  int64_t fan;  // input planes summed into each output plane
  int64_t in_mul, in_div, in_fan_stride;
  int64_t w_mul, w_mod, w_fan_stride;
  int64_t bias_mod;  // output plane p adds bias[p % bias_mod]
  int in_h, in_w, out_h, out_w;
  int kh, kw, sh, sw, ph, pw, dh, dw;
  bool flip;
  Activation act = Activation::kIdentity;  // applied to sum + bias as it is stored
};

// A Loader maps the coordinates of the tile being staged to plane indices:
// row(y, h) and col(x, w) give the row and column read for padded coordinate
// y or x of a plane of h x w samples, or -1 for a zero. The engines tabulate
// both once per tile.

// Zero outside the plane (convolution padding).
struct ZeroBorder {
  __device__ int row(int y, int h) const { return static_cast<unsigned>(y) < unsigned(h) ? y : -1; }
  __device__ int col(int x, int w) const { return static_cast<unsigned>(x) < unsigned(w) ? x : -1; }
};

namespace plane_detail {

constexpr int kThreads = 256;
constexpr int kMaxSharedBytes = 48 * 1024;
// Static shared memory of the correlation kernel: its per-slot plane tables.
constexpr int kTableBytes = kThreads * (sizeof(void*) + sizeof(int64_t));

// a / b and a % b for non-negative operands, in 32 bits when they fit.
__device__ inline int64_t div_nonneg(int64_t a, int64_t b) {
  return (a | b) < (int64_t{1} << 31) ? int64_t(uint32_t(a) / uint32_t(b)) : a / b;
}
__device__ inline int64_t mod_nonneg(int64_t a, int64_t b) {
  return (a | b) < (int64_t{1} << 31) ? int64_t(uint32_t(a) % uint32_t(b)) : a % b;
}

// Fills the row and column tables of a tile whose top-left padded coordinate
// is (y0, x0): rows[r] for r < n_rows, cols[c] for c < n_pitch (-1 past
// n_cols).
template <typename Loader>
__device__ inline void fill_index_tables(int* rows, int* cols, int n_rows, int n_cols, int n_pitch,
                                         int y0, int x0, int h, int w, const Loader& load, int tid,
                                         int nthreads) {
  for (int r = tid; r < n_rows; r += nthreads) rows[r] = load.row(y0 + r, h);
  for (int c = tid; c < n_pitch; c += nthreads) cols[c] = c < n_cols ? load.col(x0 + c, w) : -1;
}

// Shared-memory row pitch: at least `cols`, and 1 (mod 4) so that the 4
// row-groups of a warp (8 threads x 4 columns each) fall on distinct banks.
__host__ __device__ inline int pitch_for(int cols) { return cols + ((1 - cols) & 3); }

// Row pitch of the fixed-stride paths (stride s = 1 or 2), which read a
// thread's inputs as aligned 4-element vectors (see load_span): a multiple of
// 4 with room for the vectors of the last taps (they reach s + 3 columns past
// `cols`), and 4 (mod 8) so that the two row-groups in one 8-lane phase of a
// narrow tile (4 threads across) fall on different banks.
__host__ __device__ inline int vector_pitch_for(int cols, int s) {
  const int p = (cols + s + 3 + 3) & ~3;
  return p % 8 == 4 ? p : p + 4;
}

struct Geometry {
  int tx, ty, tz;  // block threads: along x (4 outputs each), along y (kRows each), planes
  int rows, cols, pitch, kwp;
  int64_t shared_bytes;
};

inline int pow2_at_least(int64_t v, int cap) {
  int p = 1;
  while (p < v && p < cap) p <<= 1;
  return p;
}

// stride: 1 or 2 for the fixed-stride paths (vector rows), 0 otherwise.
template <typename Acc>
inline bool plan(const PlaneCorrelation& g, int k_rows, int stride, Geometry& geo) {
  geo.tx = pow2_at_least((g.out_w + 3) / 4, 8);
  geo.ty = pow2_at_least((g.out_h + k_rows - 1) / k_rows, kThreads / geo.tx);
  geo.tz = kThreads / (geo.tx * geo.ty);
  geo.kwp = (g.kw + 3) & ~3;
  for (;;) {
    geo.rows = (geo.ty * k_rows - 1) * g.sh + (g.kh - 1) * g.dh + 1;
    geo.cols = (geo.tx * 4 - 1) * g.sw + (g.kw - 1) * g.dw + 1;
    geo.pitch = stride > 0 ? vector_pitch_for(geo.cols, stride) : pitch_for(geo.cols);
    geo.shared_bytes =
        int64_t(geo.tz) * (int64_t(g.kh) * geo.kwp + int64_t(geo.rows) * geo.pitch) * sizeof(Acc) +
        int64_t(geo.rows + geo.pitch) * sizeof(int);
    if (geo.shared_bytes + kTableBytes <= kMaxSharedBytes) return true;
    if (geo.tz > 1) {
      geo.tz /= 2;
    } else if (geo.ty > 1) {
      geo.ty /= 2;
    } else if (geo.tx > 1) {
      geo.tx /= 2;
    } else {
      return false;
    }
  }
}

// Every coordinate the engine forms fits in an int with room to spare.
inline bool fits_int(const PlaneCorrelation& g) {
  constexpr int64_t lim = int64_t{1} << 30;
  const int64_t span_y = int64_t(g.out_h + 64) * g.sh + int64_t(g.kh) * g.dh + std::abs(g.ph);
  const int64_t span_x = int64_t(g.out_w + 64) * g.sw + int64_t(g.kw + 4) * g.dw + std::abs(g.pw);
  return g.in_h < lim && g.in_w < lim && span_y < lim && span_x < lim;
}

// dst[e] = value_of(e) for e = tid, tid + nthreads, ... < count, with U
// independent loads in flight per thread (the values are read before any is
// stored), so staging a tile costs about one memory latency, not U.
template <int U, typename Acc, typename F>
__device__ inline void fill_shared(Acc* dst, int count, int tid, int nthreads, F value_of) {
  for (int e0 = tid; e0 < count; e0 += U * nthreads) {
    Acc v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = e0 + u * nthreads;
      v[u] = e < count ? value_of(e) : Acc(0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = e0 + u * nthreads;
      if (e < count) dst[e] = v[u];
    }
  }
}

// The elements t = tid, tid + n, tid + 2n, ... of a box of planes x rows x
// pitch, walked as (z, row, col) without a division per element.
struct BoxWalk {
  int z, row, col;
  int dz, drow, dcol, rows, pitch;
  __device__ BoxWalk(int tid, int n, int rows_, int pitch_) : rows(rows_), pitch(pitch_) {
    const int plane = rows * pitch;
    z = tid / plane;
    row = (tid - z * plane) / pitch;
    col = tid - z * plane - row * pitch;
    dz = n / plane;
    drow = (n - dz * plane) / pitch;
    dcol = n - dz * plane - drow * pitch;
  }
  __device__ void next() {
    col += dcol;
    if (col >= pitch) col -= pitch, ++row;
    row += drow;
    if (row >= rows) row -= rows, ++z;
    z += dz;
  }
};

// dst[t] = value_at(z, row, col) over a box of `count` elements (see
// BoxWalk), U loads in flight per thread.
template <int U, typename Acc, typename F>
__device__ inline void fill_box(Acc* dst, int count, int tid, int nthreads, int rows, int pitch,
                                F value_at) {
  BoxWalk at(tid, nthreads, rows, pitch);
  for (int t0 = tid; t0 < count; t0 += U * nthreads) {
    Acc v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      v[u] = t0 + u * nthreads < count ? value_at(at.z, at.row, at.col) : Acc(0);
      at.next();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * nthreads;
      if (t < count) dst[t] = v[u];
    }
  }
}

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

template <typename Acc>
__device__ inline void load4(const Acc* p, Acc& a, Acc& b, Acc& c, Acc& d) {
  if constexpr (std::is_same<Acc, float>::value) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    a = v.x, b = v.y, c = v.z, d = v.w;
  } else {
    a = p[0], b = p[1], c = p[2], d = p[3];
  }
}

// b[q] = p[q] for q < N. float32 is read as ceil(N/4) aligned float4 (p must
// be 16-byte aligned, and p[0 .. 4*ceil(N/4)) inside the tile): a warp's
// scalar loads of 4-column blocks hit each bank four times (eight at stride
// 2), its vector loads once (twice).
template <int N, typename Acc>
__device__ inline void load_span(const Acc* p, Acc (&b)[N]) {
  if constexpr (std::is_same<Acc, float>::value) {
#pragma unroll
    for (int q = 0; q < N; q += 4) {
      const float4 v = *reinterpret_cast<const float4*>(p + q);
      b[q] = v.x;
      if (q + 1 < N) b[q + 1] = v.y;
      if (q + 2 < N) b[q + 2] = v.z;
      if (q + 3 < N) b[q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < N; ++q) b[q] = p[q];
  }
}

// Adds kTaps (1 to 4) consecutive taps of every tap row that input row `ir`
// of the thread's patch meets: srow points at the row's first input under
// the first tap, taps at that tap's column of tap row 0. kAllRows: every one
// of the kRows output rows meets the row (no tests).
template <int kTaps, int kRows, int kS, bool kAllRows, typename Acc>
__device__ __forceinline__ void add_taps(Acc (&acc)[kRows][4], const Acc* srow, const Acc* taps,
                                         int kwp, int ir, int kh) {
  Acc b[3 * kS + 4];  // the inputs under 4 taps of 4 outputs
  load_span(srow, b);
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    const int i = ir - rr * kS;
    if (!kAllRows && (i < 0 || i >= kh)) continue;
    Acc w[4];
    load4(taps + i * kwp, w[0], w[1], w[2], w[3]);
#pragma unroll
    for (int t = 0; t < kTaps; ++t) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[rr][r] += w[t] * b[r * kS + t];
    }
  }
}

// Adds all taps of input row `ir`: quads of taps, then the last 1 to 3 (their
// own code, so that no padded zero tap meets an input beside the window,
// which may be Inf).
template <int kRows, int kS, bool kAllRows, typename Acc>
__device__ __forceinline__ void add_row(Acc (&acc)[kRows][4], const Acc* srow, const Acc* taps,
                                        int kwp, int ir, int kh, int kw) {
  int jc = 0;
#pragma unroll
  for (; jc + 4 <= kw; jc += 4)
    add_taps<4, kRows, kS, kAllRows>(acc, srow + jc, taps + jc, kwp, ir, kh);
  switch (kw - jc) {
    case 1: add_taps<1, kRows, kS, kAllRows>(acc, srow + jc, taps + jc, kwp, ir, kh); break;
    case 2: add_taps<2, kRows, kS, kAllRows>(acc, srow + jc, taps + jc, kwp, ir, kh); break;
    case 3: add_taps<3, kRows, kS, kAllRows>(acc, srow + jc, taps + jc, kwp, ir, kh); break;
    default: break;
  }
}

// Block of tx*ty*tz threads (one dimension; thread t is (t % tx, t / tx % ty,
// t / (tx*ty))): grid x walks the output tiles of (tx*4) x (ty*kRows)
// samples, grid y (striding) walks groups of tz output planes. The block stages
// each plane's taps and input tile (with halo, border resolved by the Loader)
// in shared memory; thread (x, y, z) then computes a 4-wide, kRows-tall patch
// of plane z. With a compile-time stride kS (dilation 1), a thread keeps a row
// of inputs in registers for 4 taps x 4 outputs and reuses it for every output
// row that reads it; kK > 0 fixes the (square) kernel size so that all tap
// loops unroll. kS == 0 is the general case (any stride and dilation).
template <typename T, typename Loader, int kRows, int kS, int kK>
__global__ void __launch_bounds__(kThreads)
    plane_correlation_kernel(const T* __restrict__ in, const T* __restrict__ weight,
                             const T* __restrict__ bias, T* __restrict__ out, PlaneCorrelation g,
                             Loader load, int bx, int by, int bz, int tiles_x, int rows, int cols,
                             int pitch) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  acc_t* shared = reinterpret_cast<acc_t*>(shared_raw);
  const int tid = threadIdx.x;
  const int thread_x = tid % bx, thread_y = tid / bx % by, thread_z = tid / (bx * by);
  const int nthreads = bx * by * bz;
  const int kwp = (g.kw + 3) & ~3;
  const int tap_count = g.kh * kwp;
  const int tile_count = rows * pitch;
  acc_t* tiles = shared + bz * tap_count;
  const acc_t* my_taps = shared + thread_z * tap_count;
  const acc_t* my_tile = tiles + thread_z * tile_count;
  const int ox0 = (blockIdx.x % tiles_x) * bx * 4, oy0 = (blockIdx.x / tiles_x) * by * kRows;
  const int gx0 = ox0 * g.sw - g.pw, gy0 = oy0 * g.sh - g.ph;
  const int tx4 = thread_x * 4, tyr = thread_y * kRows;
  const int64_t in_plane_size = int64_t(g.in_h) * g.in_w;

  const int in_w = g.in_w;
  __shared__ const T* in_planes[kThreads];  // the input plane of each slot (null: none)
  __shared__ int64_t weight_planes[kThreads];
  int* row_src = reinterpret_cast<int*>(tiles + bz * tile_count);
  int* col_src = row_src + rows;
  fill_index_tables(row_src, col_src, rows, cols, pitch, gy0, gx0, g.in_h, g.in_w, load, tid,
                    nthreads);

  for (int64_t base = int64_t(blockIdx.y) * bz; base < g.out_planes;
       base += int64_t(gridDim.y) * bz) {
    acc_t acc[kRows][4];
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[rr][r] = acc_t(0);

    for (int64_t f = 0; f < g.fan; ++f) {
      __syncthreads();  // the previous tiles and plane tables are no longer read
      if (tid < bz) {
        const int64_t p = base + tid;
        const bool live = p < g.out_planes;
        in_planes[tid] =
            live ? in + (div_nonneg(p * g.in_mul, g.in_div) + f * g.in_fan_stride) * in_plane_size
                 : nullptr;
        weight_planes[tid] = live ? mod_nonneg(p * g.w_mul, g.w_mod) + f * g.w_fan_stride : -1;
      }
      __syncthreads();
      fill_shared<4>(shared, bz * tap_count, tid, nthreads, [&](int t) {
        const int z = t / tap_count, k = t - z * tap_count, i = k / kwp, j = k - i * kwp;
        const int64_t wp = weight_planes[z];
        acc_t v = 0;
        if (wp >= 0 && j < g.kw) {
          const int si = g.flip ? g.kh - 1 - i : i, sj = g.flip ? g.kw - 1 - j : j;
          v = static_cast<acc_t>(weight[(wp * g.kh + si) * g.kw + sj]);
        }
        return v;
      });
      // Columns past `cols` are never read by a valid output: zero (their
      // table entries are -1), so no stray Inf can meet a padded tap.
      const T* plane0 = in_planes[0];
      fill_box<8>(tiles, bz * tile_count, tid, nthreads, rows, pitch, [&](int z, int row, int col) {
        const T* plane = bz == 1 ? plane0 : in_planes[z];
        const int rs = row_src[row], cs = col_src[col];
        return plane != nullptr && (rs | cs) >= 0
                   ? static_cast<acc_t>(plane[int64_t(rs) * in_w + cs])
                   : acc_t(0);
      });
      __syncthreads();

      if constexpr (kS > 0) {
        const int kh = kK > 0 ? kK : g.kh, kw = kK > 0 ? kK : g.kw;
        // Input row ir of the patch meets tap row ir - rr*kS of output row
        // rr; rows that meet all kRows output rows run without tests.
#pragma unroll
        for (int ir = 0; ir < (kRows - 1) * kS + kh; ++ir) {
          const acc_t* srow = my_tile + (tyr * kS + ir) * pitch + tx4 * kS;
          if (ir >= (kRows - 1) * kS && ir < kh) {
            add_row<kRows, kS, true>(acc, srow, my_taps, kwp, ir, kh, kw);
          } else {
            add_row<kRows, kS, false>(acc, srow, my_taps, kwp, ir, kh, kw);
          }
        }
      } else {
#pragma unroll
        for (int rr = 0; rr < kRows; ++rr) {
          for (int i = 0; i < g.kh; ++i) {
            const acc_t* srow = my_tile + ((tyr + rr) * g.sh + i * g.dh) * pitch + tx4 * g.sw;
            for (int j = 0; j < g.kw; ++j) {
              const acc_t w = my_taps[i * kwp + j];
              const acc_t* s = srow + j * g.dw;
#pragma unroll
              for (int r = 0; r < 4; ++r) acc[rr][r] += w * s[r * g.sw];
            }
          }
        }
      }
    }

    const int64_t p = base + thread_z;
    if (p < g.out_planes) {
      const acc_t b = bias ? static_cast<acc_t>(bias[p % g.bias_mod]) : acc_t(0);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[rr][r] += b;
      activate_sums(g.act, acc);
      T* op = out + p * int64_t(g.out_h) * g.out_w;
      // Rows start 4-aligned when the width is a multiple of 4 (out is
      // allocated aligned), so 4 outputs go out as one store.
      const bool vector_store = g.out_w % 4 == 0;
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        const int y = oy0 + tyr + rr;
        if (y >= g.out_h) break;
        const int x = ox0 + tx4;
        T* dst = op + int64_t(y) * g.out_w + x;
        if (vector_store && x + 4 <= g.out_w) {
          Pack4<T> v;
#pragma unroll
          for (int r = 0; r < 4; ++r) v.v[r] = static_cast<T>(acc[rr][r]);
          *reinterpret_cast<Pack4<T>*>(dst) = v;
        } else {
#pragma unroll
          for (int r = 0; r < 4; ++r)
            if (x + r < g.out_w) dst[r] = static_cast<T>(acc[rr][r]);
        }
      }
    }
  }
}

}  // namespace plane_detail

// Runs the engine on `stream`; returns false (launching nothing) when the
// geometry does not fit it (shared memory, index range), so the caller can
// use a direct kernel instead. bias may be null.
namespace plane_detail {

template <typename T, typename Loader, int kRows, int kS, int kK>
void launch_variant(const T* in, const T* weight, const T* bias, T* out, const PlaneCorrelation& g,
                    Loader load, const Geometry& geo, int tiles_x, dim3 grid, cudaStream_t stream) {
  plane_correlation_kernel<T, Loader, kRows, kS, kK>
      <<<grid, geo.tx * geo.ty * geo.tz, geo.shared_bytes, stream>>>(
          in, weight, bias, out, g, load, geo.tx, geo.ty, geo.tz, tiles_x, geo.rows, geo.cols,
          geo.pitch);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace plane_detail

// Runs the engine on `stream`; returns false (launching nothing) when the
// geometry does not fit it (shared memory, index range), so the caller can
// use a direct kernel instead. bias may be null. kSpecialize compiles the
// fixed kernel sizes 3, 5, 7 and stride 2 (16-bit and float32 data). With the
// zero border, tall kernels at stride 1 take large_kernel_correlation.cu.
template <typename T, bool kSpecialize = true, typename Loader>
bool launch_plane_correlation(const T* in, const T* weight, const T* bias, T* out,
                              const PlaneCorrelation& g, Loader load, cudaStream_t stream) {
  using namespace plane_detail;
  using acc_t = at::opmath_type<T>;
  if (g.out_planes == 0 || g.out_h == 0 || g.out_w == 0) return true;
  if (!fits_int(g)) return false;
  // Tall kernels at stride 1 with a zero border stream down columns instead.
  if constexpr (std::is_same<Loader, ZeroBorder>::value && !std::is_same<T, double>::value) {
    if (launch_large_kernel_correlation<T>(in, weight, bias, out, g, stream)) return true;
  }
  const bool dil1 = g.dh == 1 && g.dw == 1;
  const int stride = dil1 && g.sh == g.sw && (g.sh == 1 || g.sh == 2) ? g.sh : 0;
  constexpr bool kFixed = kSpecialize && !std::is_same<T, double>::value;
  const int k_rows = stride == 1 ? 4 : stride == 2 ? 2 : 1;
  Geometry geo{};
  if (!plan<acc_t>(g, k_rows, stride, geo)) return false;
  const int64_t tiles_x = (g.out_w + geo.tx * 4 - 1) / (geo.tx * 4);
  const int64_t tiles_y = (g.out_h + geo.ty * k_rows - 1) / (geo.ty * k_rows);
  if (tiles_x * tiles_y >= (int64_t{1} << 31)) return false;
  const int64_t groups = (g.out_planes + geo.tz - 1) / geo.tz;
  const dim3 grid(static_cast<unsigned>(tiles_x * tiles_y),
                  static_cast<unsigned>(std::min<int64_t>(groups, 65535)));
  const int tx = static_cast<int>(tiles_x);
  const int k = g.kh == g.kw ? g.kh : 0;
  if (stride == 1) {
    if constexpr (kFixed) {
      if (k == 3)
        return launch_variant<T, Loader, 4, 1, 3>(in, weight, bias, out, g, load, geo, tx, grid,
                                                  stream),
               true;
      if (k == 5)
        return launch_variant<T, Loader, 4, 1, 5>(in, weight, bias, out, g, load, geo, tx, grid,
                                                  stream),
               true;
      if (k == 7)
        return launch_variant<T, Loader, 4, 1, 7>(in, weight, bias, out, g, load, geo, tx, grid,
                                                  stream),
               true;
    }
    launch_variant<T, Loader, 4, 1, 0>(in, weight, bias, out, g, load, geo, tx, grid, stream);
    return true;
  }
  if (stride == 2) {
    if constexpr (kFixed) {
      if (k == 3)
        return launch_variant<T, Loader, 2, 2, 3>(in, weight, bias, out, g, load, geo, tx, grid,
                                                  stream),
               true;
      if (k == 5)
        return launch_variant<T, Loader, 2, 2, 5>(in, weight, bias, out, g, load, geo, tx, grid,
                                                  stream),
               true;
      launch_variant<T, Loader, 2, 2, 0>(in, weight, bias, out, g, load, geo, tx, grid, stream);
    } else {
      launch_variant<T, Loader, 2, 0, 0>(in, weight, bias, out, g, load, geo, tx, grid, stream);
    }
    return true;
  }
  launch_variant<T, Loader, 1, 0, 0>(in, weight, bias, out, g, load, geo, tx, grid, stream);
  return true;
}

}  // namespace customconv
