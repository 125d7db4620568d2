// Stride-1 plane correlation of float16 and bfloat16 data on tensor cores.
//
// One tap row of a correlation is a product with a banded Toeplitz matrix:
// for output columns x..x+7 and the 16 input columns c..c+15 their taps read,
//   out[y][x + n] += sum_k in[y + dy - ph][c + k] * B_dy[k][n],
//   B_dy[k][n] = w[dy][c + k - x - n + pw]   (zero off the kernel),
// which is two m16n8k8 mmas per 16 output rows (input columns c..c+7 with
// rows 0-7 of B_dy, c+8..c+15 with rows 8-15). The products of two 16-bit
// values are exact in float32 and the mma sums them in float32, as the
// contract asks (accumulate in float32). Where the register-blocked kernel
// spends about 3 warp instructions per output at 7 taps, this one spends
// about 0.15, so what is left is moving the data.
//
// Geometry taken: stride 1, dilation 1, zero border, one weight plane per
// output plane (fan 1), odd square kernels of at most 9 taps with "same"
// column padding pw = (K - 1) / 2 (any row padding), widths of a multiple of
// 8 elements on 16-byte aligned pointers, planes that fill at least half of
// the tiles they take (3 taps: at least 1024 wide; see the launcher), on
// devices and binaries of compute capability 8.0 or newer. The launcher says
// false otherwise and the caller goes on to the register-blocked kernels.
#pragma once

#include <c10/macros/Macros.h>  // IntegerDivider.cuh uses C10_HOST_DEVICE without including it
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/async_copy.cuh"
#include "ops/common/kernel_fit.h"
#include "ops/correlation/correlation_geometry.h"

namespace customconv {

// A tile covers 16 * kWarps output rows (16 per warp) and kGroups groups of
// 16 output columns of one plane. Shared-memory row of its staged input and
// of the output staging, in elements: the tile's columns plus 8 on the left
// and 8 on the right, plus 8 so that a row is an odd number of 16-byte units
// and the eight rows of an ldmatrix fall in distinct banks.
template <int kGroups>
constexpr int kTensorCorePitch = 16 * kGroups + 24;

namespace tensor_core_detail {

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// The four 8x8 matrices of a 16x16 A operand; lane l gives the address of
// row l % 16, columns 8 * (l / 16) onwards.
__device__ __forceinline__ void load_matrix_x4(uint32_t (&a)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}

// acc += A (16x8, row-major: rows l / 4 and + 8, columns 2 (l % 4) and + 1 in
// a0 and a1) * B (8x8, column-major), float32 sums.
template <typename T>
__device__ __forceinline__ void mma_16x8x8(float (&acc)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  if constexpr (std::is_same_v<T, c10::Half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(b));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5}, {%6}, {%0, %1, %2, %3};"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
        : "r"(a0), "r"(a1), "r"(b));
  }
}
#endif

}  // namespace tensor_core_detail

// A 16-bit value's bits.
template <typename T>
__device__ __forceinline__ uint32_t bits_of(T v) {
  return static_cast<uint32_t>(v.x);
}

// Two values rounded to T, packed as one 32-bit word (a in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float a, float b) {
  return bits_of(static_cast<T>(a)) | bits_of(static_cast<T>(b)) << 16;
}

// Where a tile of the tensor-core kernel lies: output rows y0 .. y0 + 16 kWarps
// - 1 and columns x0 .. x0 + 16 kGroups - 1 of output plane `plane` (weight
// row oc, input plane src_plane), and how many of its 2 kGroups + 1 column
// tiles (see the kernel) start inside the plane.
struct TensorCoreTile {
  int plane, oc, src_plane, y0, x0, tiles;
};

// The divisions that number the tiles (column tile first, then row tile,
// then plane), as multiply-and-shift dividers.
struct TensorCoreTiling {
  at::cuda::detail::IntDivider<unsigned> col_tiles, row_tiles, out_channels, div;
};

template <int K, int kWarps, int kGroups>
__device__ __forceinline__ TensorCoreTile tensor_core_tile(int t, const TensorCoreTiling& tiling,
                                                           const BlockedCorrelation& g) {
  constexpr int P = (K - 1) / 2;
  const auto by_col = tiling.col_tiles.divmod(t);
  const auto by_row = tiling.row_tiles.divmod(by_col.div);
  const int plane = by_row.div;
  const auto by_channel = tiling.out_channels.divmod(plane);
  const int n = by_channel.div, oc = by_channel.mod;
  const int x0 = by_col.mod * 16 * kGroups;
  return {plane,
          oc,
          n * g.in_channels + static_cast<int>(tiling.div.div(oc)),
          static_cast<int>(by_row.mod) * 16 * kWarps,
          x0,
          min(2 * kGroups + 1, (g.ow - x0 + 15 - P) / 8)};
}

// Starts copying (cp.async) the tile's 16 kWarps + K - 1 input rows from
// y0 - ph, columns x0 - 8 .. up to x0 + 16 kGroups + 7 (the windows of its
// column tiles inside the plane), zero outside the plane, to `buffer` (rows
// of kTensorCorePitch<kGroups>).
// w is a multiple of 8, so an 8-element chunk lies wholly inside or wholly
// outside a row.
template <typename T, int K, int kWarps, int kGroups>
__device__ __forceinline__ void stage_tensor_core_input(const T* __restrict__ in,
                                                        const TensorCoreTile& tile,
                                                        const BlockedCorrelation& g,
                                                        unsigned buffer) {
  constexpr int kRows = 16 * kWarps + K - 1;
  constexpr int kChunks = 2 * kGroups + 2;  // per row, at most
  constexpr int kThreads = 32 * kWarps;
  const T* src = in + int64_t(tile.src_plane) * g.h * g.w;
  const int chunks = tile.tiles + 1;
#pragma unroll
  for (int j = 0; j < (kRows * kChunks + kThreads - 1) / kThreads; ++j) {
    const int e = threadIdx.x + j * kThreads;
    const int r = e / kChunks, q = e % kChunks;
    if (r < kRows && q < chunks) {
      const int iy = tile.y0 - g.ph + r, ix = tile.x0 - 8 + 8 * q;
      const bool inside = unsigned(iy) < unsigned(g.h) && unsigned(ix) < unsigned(g.w);
      copy_async_16(buffer + 2 * (r * kTensorCorePitch<kGroups> + 8 * q),
                                        inside ? src + iy * g.w + ix : src, inside ? 16 : 0);
    }
  }
}

// A lane's B registers for weight row oc: tap row dy's rows
// k = 2 (l % 4) + {0, 1} and + 8, column l / 4: w[dy][k - l / 4], zero off
// the kernel (taps rotated by 180 degrees when g.flip).
template <typename T, int K>
__device__ __forceinline__ void load_tensor_core_taps(const T* __restrict__ weight, int oc,
                                                      const BlockedCorrelation& g, int lane,
                                                      uint2 (&b_regs)[K]) {
  const uint16_t* taps = reinterpret_cast<const uint16_t*>(weight) + int64_t(oc) * K * K;
#pragma unroll
  for (int dy = 0; dy < K; ++dy) {
    uint32_t words[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int dx = 2 * (lane & 3) + 8 * r + i - (lane >> 2);
        if (dx >= 0 && dx < K) word |= uint32_t(square_tap<K>(taps, dy, dx, g.flip)) << (16 * i);
      }
      words[r] = word;
    }
    b_regs[dy] = make_uint2(words[0], words[1]);
  }
}

// The mma loop of one warp over its 16 output rows. For each tap row dy the
// warp loads the 16-row, 8-column pieces of the staged input (row a_base +
// dy, input columns 8 j .. 8 j + 7 for piece j), two per ldmatrix, and column
// tile i takes pieces i and i + 1: piece i times rows 0-7 of B_dy and piece
// i + 1 times rows 8-15, one m16n8k8 mma each. Each piece is read
// once per tap row and feeds two column tiles straight from the registers
// ldmatrix wrote. kFull: all 2 kGroups + 1 column tiles start inside the
// plane; otherwise the first `tiles`.
template <typename T, int K, int kGroups, bool kFull>
__device__ __forceinline__ void correlate_pieces(float (&acc)[2 * kGroups + 1][4],
                                                 unsigned a_base, const uint2 (&b_regs)[K],
                                                 int tiles) {
  using namespace tensor_core_detail;
  constexpr int kTiles = 2 * kGroups + 1;
  constexpr int kPieces = kTiles + 1;  // 16 rows x 8 columns each: input columns 8 j ..
#pragma unroll
  for (int dy = 0; dy < K; ++dy) {
    const unsigned row = a_base + 2 * dy * kTensorCorePitch<kGroups>;
    uint32_t piece[kPieces][2];
#pragma unroll
    for (int j = 0; j < kPieces; j += 2) {
      if (kFull || j <= tiles) {
        uint32_t quad[4];
        load_matrix_x4(quad, row + 16 * j);
        piece[j][0] = quad[0];
        piece[j][1] = quad[1];
        piece[j + 1][0] = quad[2];
        piece[j + 1][1] = quad[3];
      }
    }
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      if (kFull || i < tiles) {
        mma_16x8x8<T>(acc[i], piece[i][0], piece[i][1], b_regs[dy].x);
        mma_16x8x8<T>(acc[i], piece[i + 1][0], piece[i + 1][1], b_regs[dy].y);
      }
    }
  }
}

// Persistent blocks of 32 * kWarps threads walk the tiles t = blockIdx.x,
// + gridDim.x, ... (numbered column tile first, then row tile, then plane),
// copying the next tile's input into the second of two shared buffers while
// they compute the current one. K taps, padding P = (K - 1) / 2 on the
// columns.
// Columns: a tile's outputs x0 .. x0 + 16 kGroups - 1 are covered by
// 2 kGroups + 1 column tiles of 8, column tile i at output columns
// x0 - 8 + P + 8 i .. + 7, whose taps read
// exactly the input columns x0 - 8 + 8 i .. + 15: a 16-wide window starting
// on a 16-byte boundary. So B_dy[k][n] = w[dy][k - n] is the same for every
// column tile, and each lane keeps its two registers of it per tap row.
// Rows: warp w owns output rows y0 + 16 w .. + 15. For each tap row dy it
// loads each 16x8 piece of staged input rows 16 w + dy .. + 15 once with
// ldmatrix; a window is two neighbouring pieces, so each piece serves two
// column tiles (correlate_pieces). Lane l then holds
// rows l / 4 and l / 4 + 8, columns 2 (l % 4) and + 1 of each column tile;
// the warp writes them to its own 16 rows of the (consumed) input buffer and
// reads them back as 16-byte pieces of the output rows (realigned by 8 - P
// columns) for whole-line stores. The sums start at the bias; g.act is
// applied to them in float32 before they are rounded to T for the staging.
template <typename T, int K, int kWarps, int kGroups, int kMinBlocks>
__global__ void __launch_bounds__(32 * kWarps, kMinBlocks)
    tensor_core_correlation_kernel(const T* __restrict__ in, const T* __restrict__ weight,
                                   const T* __restrict__ bias, T* __restrict__ out,
                                   BlockedCorrelation g, TensorCoreTiling tiling, int total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched: the launcher checks the binary's compute capability
#else
  using namespace tensor_core_detail;
  constexpr int kRows = 16 * kWarps + K - 1;
  constexpr int kBufferBytes = 2 * kRows * kTensorCorePitch<kGroups>;
  constexpr int P = (K - 1) / 2;
  constexpr int kTiles = 2 * kGroups + 1;
  extern __shared__ uint4 tensor_core_shared[];
  const unsigned shared_base = static_cast<unsigned>(__cvta_generic_to_shared(tensor_core_shared));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  int t = blockIdx.x;
  if (t >= total) return;
  TensorCoreTile tile = tensor_core_tile<K, kWarps, kGroups>(t, tiling, g);
  stage_tensor_core_input<T, K, kWarps, kGroups>(in, tile, g, shared_base);
  copy_async_commit();
  int taps_oc = -1;
  uint2 b_regs[K];
  for (int k = 0; t < total; ++k, t += gridDim.x) {
    const unsigned buffer = shared_base + (k & 1) * kBufferBytes;
    const int t_next = t + gridDim.x;
    TensorCoreTile next_tile{};
    if (t_next < total) {
      next_tile = tensor_core_tile<K, kWarps, kGroups>(t_next, tiling, g);
      stage_tensor_core_input<T, K, kWarps, kGroups>(in, next_tile, g,
                                                     shared_base + ((k + 1) & 1) * kBufferBytes);
    }
    copy_async_commit();
    if (tile.oc != taps_oc) {  // the same for the whole block
      load_tensor_core_taps<T, K>(weight, tile.oc, g, lane, b_regs);
      taps_oc = tile.oc;
    }
    copy_async_wait<1>();
    __syncthreads();

    const bool active = tile.y0 + 16 * warp < g.oh;
    const float b = bias != nullptr ? static_cast<float>(bias[tile.oc]) : 0.f;
    float acc[kTiles][4];
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = b;
    }
    if (active) {
      // Lane l addresses row l % 16, columns 8 (l / 16) onwards of a window.
      const unsigned a_base =
          buffer + 2 * ((16 * warp + (lane & 15)) * kTensorCorePitch<kGroups> + 8 * (lane >> 4));
      if (tile.tiles == kTiles) {
        correlate_pieces<T, K, kGroups, true>(acc, a_base, b_regs, kTiles);
      } else {
        correlate_pieces<T, K, kGroups, false>(acc, a_base, b_regs, tile.tiles);
      }
    }
    __syncthreads();  // every warp is done reading the buffer

    if (active) {
      activate_sums(g.act, acc);  // the epilogue: after the bias, before rounding to T
      // This warp's staging rows: column s holds output column x0 - 8 + P + s.
      uint16_t* stage = reinterpret_cast<uint16_t*>(tensor_core_shared) +
                        (k & 1) * (kBufferBytes / 2) + 16 * warp * kTensorCorePitch<kGroups>;
      uint32_t* stage_words = reinterpret_cast<uint32_t*>(stage);
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        if (i < tile.tiles) {
          const int word = 4 * i + (lane & 3);
          stage_words[(lane >> 2) * (kTensorCorePitch<kGroups> / 2) + word] =
              pack_pair<T>(acc[i][0], acc[i][1]);
          stage_words[((lane >> 2) + 8) * (kTensorCorePitch<kGroups> / 2) + word] =
              pack_pair<T>(acc[i][2], acc[i][3]);
        }
      }
      __syncwarp();
      // Output piece q of row m (columns x0 + 8 q .. + 7) is staged at columns
      // 8 q + 8 - P .. + 7: words 4 q + (8 - P) / 2 .., half a word further
      // when P is odd.
      T* dst = out + int64_t(tile.plane) * g.oh * g.ow;
      constexpr int kShift = 8 - P;
#pragma unroll
      for (int j = 0; j < kGroups; ++j) {  // 16 rows of 2 kGroups pieces
        const int it = lane + 32 * j;
        const int m = it / (2 * kGroups), q = it % (2 * kGroups);
        const int y = tile.y0 + 16 * warp + m, x = tile.x0 + 8 * q;
        if (y >= g.oh || x >= g.ow) continue;
        const uint4* piece =
            reinterpret_cast<const uint4*>(stage + m * kTensorCorePitch<kGroups> + 8 * q);
        const uint4 lo = piece[0], hi = piece[1];
        const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        uint32_t o[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          o[c] = kShift % 2 == 0 ? w[c + kShift / 2]
                                 : __funnelshift_r(w[c + kShift / 2], w[c + kShift / 2 + 1], 16);
        }
        *reinterpret_cast<uint4*>(dst + y * g.ow + x) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
    __syncthreads();  // the buffer is free for the tile after next
    tile = next_tile;
  }
  copy_async_wait_all();
#endif
}

// Warps per block of the tensor-core kernel.
constexpr int kTensorCoreWarps = 4;

// Blocks per SM ptxas plans the tensor-core kernel for: tiles of 128 columns
// run best with 2 (about 190 registers), of 64 columns with 5 (96 registers);
// timed on an H100 against 1 to 5 (bench/NOTES.md).
template <int kGroups>
constexpr int kTensorCoreMinBlocks = kGroups == 8 ? 2 : 5;

// Launches the tensor-core kernel with tiles of kGroups 16-column groups as
// persistent blocks (as many as fit on the device at once); false when the
// tiles are too many to number in int.
template <typename T, int K, int kGroups>
bool launch_tensor_core_variant(const T* in, const T* weight, const T* bias, T* out,
                                const BlockedCorrelation& g, int device, cudaStream_t stream) {
  constexpr int kWarps = kTensorCoreWarps;
  const TensorCoreTiling tiling{unsigned((g.ow + 16 * kGroups - 1) / (16 * kGroups)),
                                unsigned((g.oh + 16 * kWarps - 1) / (16 * kWarps)),
                                unsigned(g.out_channels), unsigned(g.div)};
  const int64_t total = int64_t(g.planes) * tiling.row_tiles.divisor * tiling.col_tiles.divisor;
  if (total >= (int64_t{1} << 31)) return false;
  const auto kernel = tensor_core_correlation_kernel<T, K, kWarps, kGroups,
                                                     kTensorCoreMinBlocks<kGroups>>;
  constexpr size_t kShared = size_t(2) * 2 * (16 * kWarps + K - 1) * kTensorCorePitch<kGroups>;
  static CachedKernelFit fit(reinterpret_cast<const void*>(kernel),
                             KernelNeeds{80, 32 * kWarps, kShared});
  const KernelFit& on_device = fit.on(device);
  if (!on_device) return false;
  const int blocks = static_cast<int>(std::min<int64_t>(total, on_device.resident_blocks()));
  kernel<<<blocks, 32 * kWarps, kShared, stream>>>(in, weight, bias, out, g, tiling,
                                                    static_cast<int>(total));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

// Runs the tensor-core kernel when it takes the geometry (see the top of this
// file) on the current device; false otherwise.
template <typename T, int K>
bool launch_tensor_core_correlation(const T* in, const T* weight, const T* bias, T* out,
                                    const BlockedCorrelation& g, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, c10::Half> && !std::is_same_v<T, c10::BFloat16>) {
    return false;
  } else {
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (K > 9 || K % 2 == 0 || g.fan != 1 || g.pw != (K - 1) / 2 || g.ph < 0 || g.w % 8 != 0 ||
        g.ow % 8 != 0 || !aligned16(in) || !aligned16(out)) {
      return false;
    }
    // Tiles of 128 columns, or of 64 where 128 would leave more columns empty
    // and for few tiles (finer work for the persistent blocks to share).
    const auto round_up = [](int64_t v, int64_t m) { return (v + m - 1) / m * m; };
    constexpr int64_t kTileRows = 16 * kTensorCoreWarps;
    const int64_t row_tiles = round_up(g.oh, kTileRows) / kTileRows;
    const int64_t wide_tiles = int64_t(g.planes) * row_tiles * (round_up(g.ow, 128) / 128);
    const bool narrow = round_up(g.ow, 128) != round_up(g.ow, 64) || wide_tiles < 4096;
    const int64_t tile_cols = narrow ? 64 : 128;
    // Where it pays (against the register-blocked kernels, on an H100 and an
    // H200): 3 taps only on planes 1024 or more wide (4096 wide: 5% / 10%
    // faster; 1024 wide: even / 12% faster; 112 wide: 4% / 8% slower); and
    // planes that fill at least half of the tiles they take: on the H100, 7
    // taps on N32 planes of 48 x 48 (56% full) ran 1.2x faster than the
    // register-blocked kernel, 40 x 40 (39%) 0.9x, 72 x 72 (32%) 0.8x,
    // 32 x 32 (25%) 0.65x; 16 x 16 ran 3 to 5 times slower.
    if (K == 3 && g.ow < 1024) return false;
    if (2 * int64_t(g.oh) * g.ow < row_tiles * kTileRows * round_up(g.ow, tile_cols)) return false;
    const int device = c10::cuda::current_device();
    return narrow ? launch_tensor_core_variant<T, K, 4>(in, weight, bias, out, g, device, stream)
                  : launch_tensor_core_variant<T, K, 8>(in, weight, bias, out, g, device, stream);
  }
}

}  // namespace customconv
