// Column-streaming correlation for tall kernels; see large_kernel_correlation.h.
//
// A warp computes 32 neighbouring output columns (a lane each) of kRows
// output rows of one plane. For each tap column c it holds the KH taps of
// that column in registers and streams down the input column under its lane,
// one sample at a time: window row j meets tap row j - r of output row r, so
// each sample read from shared memory feeds up to min(KH, kRows) multiply-adds
// into different accumulators. Per tap column a lane reads kRows + KH - 1
// samples and KH / 4 broadcast tap vectors for kRows * KH multiply-adds, with
// no tests: the staged window holds zeros outside the plane.
#include "ops/correlation/large_kernel_correlation.h"

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <type_traits>

#include "ops/common/kernel_fit.h"
#include "ops/correlation/plane_correlation.cuh"

namespace customconv {
namespace large_kernel_detail {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
// Output rows per warp: 28 divides the plane sizes of ImageNet networks
// (7 * 2^k), so few rows are computed and thrown away.
// (14 rows, or 20, or two tap columns per iteration were not faster on an
// H100; neither were 5 or 7 tap rows against blocked_correlation.cuh.)
constexpr int kRows = 28;
constexpr int kMinTapRows = 9, kMaxTapRows = 31;
// Shared memory of a block at most (past 48 KiB the kernel's limit is raised).
constexpr int kMaxSharedBytes = 100 * 1024;

// A block is wx * wy * wz warps: wx along x, wy along y, wz planes; its
// output tile is 32*wx columns by kRows*wy rows of wz planes.
struct Tile {
  int wx, wy, wz;
  int tiles_x;
  int cols;   // staged columns per plane: 32*wx + kw - 1
  int prow;   // column pitch of a staged plane: the kRows*wy + kh - 1 rows, odd
  int kp;     // pitch of a staged tap column: kh rounded up to a multiple of 4
  int shared_bytes;
};

bool plan(const PlaneCorrelation& g, Tile& t) {
  using plane_detail::pow2_at_least;
  t.wx = pow2_at_least((g.out_w + 31) / 32, kWarps);
  t.wy = pow2_at_least((g.out_h + kRows - 1) / kRows, kWarps / t.wx);
  t.wz = kWarps / (t.wx * t.wy);
  t.kp = (g.kh + 3) & ~3;
  for (;;) {
    t.cols = 32 * t.wx + g.kw - 1;
    t.prow = (kRows * t.wy + g.kh - 1) | 1;
    const int64_t bytes =
        int64_t(t.wz) * (int64_t(g.kw) * t.kp + int64_t(t.cols) * t.prow) * sizeof(float);
    if (bytes <= kMaxSharedBytes) {
      t.shared_bytes = static_cast<int>(bytes);
      t.tiles_x = (g.out_w + 32 * t.wx - 1) / (32 * t.wx);
      return true;
    }
    if (t.wz > 1) {
      t.wz /= 2;
    } else if (t.wy > 1) {
      t.wy /= 2;
    } else if (t.wx > 1) {
      t.wx /= 2;
    } else {
      return false;
    }
  }
}

// Stages the input window of a block's wz planes, zero outside the planes:
// the box (slot, row, column) of wz x tile_rows x cols samples from input
// sample (gy0, gx0) on, read row-major (coalesced) and stored column-major
// (sample (row, col) of slot z at z*tile_count + col*prow + row). float32
// moves by cp.async, each thread issuing all its copies before waiting (a
// zero-size source fills zeros); 16-bit data goes through registers, U loads
// in flight per thread, converted to float32.
template <typename T>
__device__ __forceinline__ void stage_window(float* tiles, const T* const* in_planes,
                                             const PlaneCorrelation& g, const Tile& t, int gy0,
                                             int gx0, int tile_rows, int tile_count, int tid,
                                             int nthreads) {
  const int count = t.wz * tile_rows * t.cols;
  plane_detail::BoxWalk at(tid, nthreads, tile_rows, t.cols);
  const auto source = [&](int e) -> const T* {  // null: a zero
    const T* plane = e < count ? in_planes[at.z] : nullptr;
    const int iy = gy0 + at.row, ix = gx0 + at.col;
    return plane != nullptr && static_cast<unsigned>(iy) < unsigned(g.in_h) &&
                   static_cast<unsigned>(ix) < unsigned(g.in_w)
               ? plane + int64_t(iy) * g.in_w + ix
               : nullptr;
  };
  if constexpr (std::is_same<T, float>::value) {
    for (int e = tid; e < count; e += nthreads, at.next()) {
      const float* src = source(e);
      const unsigned dst = static_cast<unsigned>(
          __cvta_generic_to_shared(tiles + at.z * tile_count + at.col * t.prow + at.row));
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
                   "l"(src != nullptr ? src : in_planes[0]), "r"(src != nullptr ? 4 : 0));
    }
    asm volatile("cp.async.wait_all;\n" ::);
  } else {
    constexpr int U = 8;
    for (int e0 = tid; e0 < count; e0 += U * nthreads) {
      float v[U];
      int dst[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const T* src = source(e0 + u * nthreads);
        v[u] = src != nullptr ? static_cast<float>(*src) : 0.f;
        dst[u] = at.z * tile_count + at.col * t.prow + at.row;
        at.next();
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (e0 + u * nthreads < count) tiles[dst[u]] = v[u];
    }
  }
}

// Adds the taps of ncols tap columns to a lane's kRows accumulators: for tap
// column c, the KH taps at tap_col + c*kp (broadcast vector loads) and the
// kRows + KH - 1 window samples down the lane's staged column col + c*prow.
// kSkipTop / kSkipBottom leave out the first / last (KH-1)/2 window rows (zero
// rows outside the plane).
template <int KH, bool kSkipTop, bool kSkipBottom>
__device__ __forceinline__ void add_tap_columns(float (&acc)[kRows], const float* tap_col,
                                                const float* col, int ncols, int kp, int prow) {
  constexpr int kWindow = kRows + KH - 1, kHalo = (KH - 1) / 2;
  constexpr int kFirst = kSkipTop ? kHalo : 0, kLast = kSkipBottom ? kWindow - kHalo : kWindow;
#pragma unroll 1
  for (int c = 0; c < ncols; ++c, tap_col += kp, col += prow) {
    float w[(KH + 3) & ~3];
#pragma unroll
    for (int i = 0; i < KH; i += 4) {
      const float4 q = *reinterpret_cast<const float4*>(tap_col + i);
      w[i] = q.x, w[i + 1] = q.y, w[i + 2] = q.z, w[i + 3] = q.w;
    }
#pragma unroll
    for (int j = kFirst; j < kLast; ++j) {
      const float v = col[j];
      // Window row j meets tap row i of output row j - i.
#pragma unroll
      for (int i = (j - kRows + 1 > 0 ? j - kRows + 1 : 0); i <= (j < KH - 1 ? j : KH - 1); ++i)
        acc[j - i] += w[i] * v;
    }
  }
}

// Block of 32*wx*wy*wz threads: grid x walks the output tiles, grid y
// (striding) groups of wz planes; warp w is (w % wx, w / wx % wy,
// w / (wx*wy)), lane l computes column 32*(w % wx) + l of the tile, rows
// kRows*(w / wx % wy) + [0, kRows). For each of the fan input planes the block
// stages the wz planes' taps (transposed: tap column c holds its kh taps,
// rotated when g.flip) and the input window of the tile, zero outside the
// plane, column-major (sample (row, col) at col*prow + row: a warp reads 32
// consecutive words, a lane walks its column at immediate offsets), then
// every lane streams down its columns.
template <typename T, int KH>
__global__ void __launch_bounds__(kThreads, 4)
    large_kernel_correlation_kernel(const T* __restrict__ in, const T* __restrict__ weight,
                                    const T* __restrict__ bias, T* __restrict__ out,
                                    PlaneCorrelation g, Tile t) {
  using acc_t = float;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  __shared__ const T* in_planes[kWarps];  // each slot's input plane (null: none)
  __shared__ int64_t weight_planes[kWarps];
  acc_t* taps = reinterpret_cast<acc_t*>(shared_raw);
  const int tap_count = g.kw * t.kp;
  const int tile_rows = kRows * t.wy + KH - 1;
  const int tile_count = t.cols * t.prow;
  acc_t* tiles = taps + t.wz * tap_count;
  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid / 32, lane = tid % 32;
  const int wxi = warp % t.wx, wyi = warp / t.wx % t.wy, wzi = warp / (t.wx * t.wy);
  const int ox0 = (blockIdx.x % t.tiles_x) * 32 * t.wx;
  const int oy0 = (blockIdx.x / t.tiles_x) * kRows * t.wy;
  const int gx0 = ox0 - g.pw, gy0 = oy0 - g.ph;  // input sample of staged (0, 0)
  const int y0 = oy0 + wyi * kRows, x = ox0 + wxi * 32 + lane;
  // Window rows j < kHalo lie above the plane for the top warps of "same"
  // padding, rows j >= kWindow - kHalo below it for the bottom ones: all zeros,
  // so they are skipped (bit 0: the top rows, bit 1: the bottom ones).
  constexpr int kHalo = (KH - 1) / 2;
  const int skip = (y0 - g.ph + kHalo <= 0 ? 1 : 0) |
                   (y0 - g.ph + kRows + KH - 1 - kHalo >= g.in_h ? 2 : 0);
  const int64_t in_plane_size = int64_t(g.in_h) * g.in_w;

  for (int64_t base = int64_t(blockIdx.y) * t.wz; base < g.out_planes;
       base += int64_t(gridDim.y) * t.wz) {
    acc_t acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = acc_t(0);

    for (int64_t f = 0; f < g.fan; ++f) {
      __syncthreads();  // the previous planes' tiles and tables are no longer read
      if (tid < t.wz) {
        const int64_t p = base + tid;
        const bool live = p < g.out_planes;
        in_planes[tid] = live ? in + (plane_detail::div_nonneg(p * g.in_mul, g.in_div) +
                                      f * g.in_fan_stride) *
                                         in_plane_size
                              : nullptr;
        weight_planes[tid] =
            live ? plane_detail::mod_nonneg(p * g.w_mul, g.w_mod) + f * g.w_fan_stride : -1;
      }
      __syncthreads();
      {  // taps: box (slot, tap column, tap row) in the layout of `taps`
        plane_detail::BoxWalk at(tid, nthreads, g.kw, t.kp);
        for (int e = tid; e < t.wz * tap_count; e += nthreads, at.next()) {
          const int64_t wp = weight_planes[at.z];
          acc_t v = 0;
          if (wp >= 0 && at.col < g.kh) {
            const int si = g.flip ? g.kh - 1 - at.col : at.col;
            const int sj = g.flip ? g.kw - 1 - at.row : at.row;
            v = static_cast<acc_t>(weight[(wp * g.kh + si) * g.kw + sj]);
          }
          taps[e] = v;
        }
      }
      stage_window<T>(tiles, in_planes, g, t, gy0, gx0, tile_rows, tile_count, tid, nthreads);
      __syncthreads();

      const acc_t* tap_col = taps + wzi * tap_count;
      const acc_t* col = tiles + wzi * tile_count + (wxi * 32 + lane) * t.prow + wyi * kRows;
      switch (skip) {
        case 0: add_tap_columns<KH, false, false>(acc, tap_col, col, g.kw, t.kp, t.prow); break;
        case 1: add_tap_columns<KH, true, false>(acc, tap_col, col, g.kw, t.kp, t.prow); break;
        case 2: add_tap_columns<KH, false, true>(acc, tap_col, col, g.kw, t.kp, t.prow); break;
        default: add_tap_columns<KH, true, true>(acc, tap_col, col, g.kw, t.kp, t.prow); break;
      }
    }

    const int64_t p = base + wzi;
    if (p < g.out_planes && x < g.out_w) {
      const acc_t b = bias ? static_cast<acc_t>(bias[p % g.bias_mod]) : acc_t(0);
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r] += b;
      activate_sums(g.act, acc);  // the epilogue (identity: skipped)
      T* dst = out + p * int64_t(g.out_h) * g.out_w + x;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (y0 + r < g.out_h) dst[int64_t(y0 + r) * g.out_w] = static_cast<T>(acc[r]);
      }
    }
  }
}

// Launches the kernel; false, launching nothing, when its shared memory is
// beyond the default 48 KiB and the device cannot give a block kMaxSharedBytes
// (the kernel's limit is raised to that once per device, for every plan).
template <typename T, int KH>
bool launch(const T* in, const T* weight, const T* bias, T* out, const PlaneCorrelation& g,
            const Tile& t, dim3 grid, cudaStream_t stream) {
  const auto kernel = large_kernel_correlation_kernel<T, KH>;
  const int threads = 32 * t.wx * t.wy * t.wz;
  if (t.shared_bytes > 48 * 1024) {
    static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                               KernelNeeds{0, 1, size_t(kMaxSharedBytes)});
    if (!fit.on(c10::cuda::current_device())) return false;
  }
  kernel<<<grid, threads, t.shared_bytes, stream>>>(in, weight, bias, out, g, t);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// Launches the instantiation for KH == kh among the odd KH >= K.
template <typename T, int K = kMinTapRows>
bool launch_for(int kh, const T* in, const T* weight, const T* bias, T* out,
                const PlaneCorrelation& g, const Tile& t, dim3 grid, cudaStream_t stream) {
  if constexpr (K > kMaxTapRows) {
    return false;
  } else {
    if (kh == K) return launch<T, K>(in, weight, bias, out, g, t, grid, stream);
    return launch_for<T, K + 2>(kh, in, weight, bias, out, g, t, grid, stream);
  }
}

// Whether the kernel takes the window (any data but float64).
bool takes_window(const PlaneCorrelation& g) {
  return g.kh >= kMinTapRows && g.kh <= kMaxTapRows && g.kh % 2 == 1 && g.kw >= 1 &&
         g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.ph >= 0 && g.pw >= 0;
}

}  // namespace large_kernel_detail

template <typename T>
bool launch_large_kernel_correlation(const T* in, const T* weight, const T* bias, T* out,
                                     const PlaneCorrelation& g, cudaStream_t stream) {
  using namespace large_kernel_detail;
  if (!takes_window(g)) return false;
  if (g.out_planes == 0 || g.out_h == 0 || g.out_w == 0) return true;
  if (!plane_detail::fits_int(g)) return false;
  // A warp computes kRows rows: planes that would leave more than a quarter of
  // them unused (14x14, 7x7, 30 rows) are faster in the tiled engine.
  const int64_t computed_rows = (int64_t(g.out_h) + kRows - 1) / kRows * kRows;
  if (4 * int64_t(g.out_h) < 3 * computed_rows) return false;
  Tile t{};
  if (!plan(g, t)) return false;
  const int64_t tiles_y = (g.out_h + kRows * t.wy - 1) / (kRows * t.wy);
  if (int64_t(t.tiles_x) * tiles_y >= (int64_t{1} << 31)) return false;
  const int64_t groups = (g.out_planes + t.wz - 1) / t.wz;
  const dim3 grid(static_cast<unsigned>(t.tiles_x * tiles_y),
                  static_cast<unsigned>(std::min<int64_t>(groups, 65535)));
  return launch_for<T>(g.kh, in, weight, bias, out, g, t, grid, stream);
}

template bool launch_large_kernel_correlation<float>(const float*, const float*, const float*,
                                                     float*, const PlaneCorrelation&,
                                                     cudaStream_t);
template bool launch_large_kernel_correlation<at::Half>(const at::Half*, const at::Half*,
                                                        const at::Half*, at::Half*,
                                                        const PlaneCorrelation&, cudaStream_t);
template bool launch_large_kernel_correlation<at::BFloat16>(const at::BFloat16*,
                                                            const at::BFloat16*,
                                                            const at::BFloat16*, at::BFloat16*,
                                                            const PlaneCorrelation&, cudaStream_t);

}  // namespace customconv
