// Float32 7x7 correlation at stride 1 with the input streamed through shared
// memory by the Tensor Memory Accelerator (compute capability 9.0 and newer).
//
// The register-blocked kernels spend about 49 multiply-adds per output, so a
// float32 7x7 filter has a compute floor of about 60% of its memory floor.
// Non-persistent blocks that each stage one tile and then compute it overlap
// the two only across blocks, and every block's first loads wait with nothing
// to compute. Here each block stays resident (one per SM) and walks tiles
// blockIdx.x, blockIdx.x + gridDim.x, ...: its last warp (the producer)
// copies the input windows of the coming tiles into a ring of kSlots shared
// buffers, one TMA instruction per window (the hardware zero-fills what lies
// outside the plane), while its first eight warps (the consumers) compute the
// current tile. Full and empty barriers (mbarrier) hand each slot back and
// forth, so loads stay in flight while the multiply-adds run.
#include "ops/correlation/streamed_tile_correlation.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/kernel_fit.h"
#include "ops/correlation/blocked_correlation.cuh"

namespace customconv {
namespace streamed_tile_detail {

constexpr int K = 7;                   // taps each way
constexpr int R = 4, V = 8;            // output rows and columns per consumer thread
constexpr int kConsumerWarps = 8;      // 16 x 16 threads over a tile
constexpr int kThreads = 32 * (kConsumerWarps + 1);
constexpr int kTileRows = 16 * R, kTileCols = 16 * V;  // 64 x 128 outputs
constexpr int kWindowRows = kTileRows + K - 1;
// The window starts 4 columns left of the tile (whole 16-byte vectors); a
// thread reads 16 columns from 4 left of its first output, so the last thread
// reaches column kTileCols + 8; 4 more make the row pitch 140 floats, which
// spreads the threads' 16-byte reads over the banks better than 136.
constexpr int kWindowCols = kTileCols + 12;
constexpr int kSlots = 5;  // windows in flight or in use per block
constexpr int kWindowBytes = kWindowRows * kWindowCols * 4;
constexpr int kTapFloats = K * kTapStride<K>;  // rows of 8, zero past the 7th
constexpr int round_up_128(int bytes) { return (bytes + 127) / 128 * 128; }
constexpr int kSlotBytes = round_up_128(kWindowBytes) + round_up_128(kTapFloats * 4);
// Slots, their full and empty barriers, and 128 bytes to align the first slot
// (TMA writes to 128-byte aligned shared addresses).
constexpr size_t kSharedBytes = size_t(kSlots) * kSlotBytes + 2 * kSlots * 8 + 128;
static_assert(kWindowCols <= 256 && kWindowRows <= 256, "a TMA box is at most 256 a side");
static_assert(kWindowCols * 4 % 16 == 0, "TMA boxes are whole 16-byte rows");

// The tile numbered t: tiles run along x, then down, then over the planes.
struct TileCoords {
  int x0, y0, plane;
};
__device__ __forceinline__ TileCoords tile_coords(int t, int tiles_x, int tiles_y) {
  const int rest = t / tiles_x;
  return {(t % tiles_x) * kTileCols, (rest % tiles_y) * kTileRows, rest / tiles_y};
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)),
               "r"(arrivals));
}

// Arrives on bar (release: this thread's earlier shared-memory accesses are
// ordered before the phase completes).
__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// Arrives on bar and adds `bytes` to the transfer the phase waits for.
__device__ __forceinline__ void barrier_arrive_expect(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
}

// Waits until the phase of bar with the given parity has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra.uni WAIT_%=;\n}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Copies the box at (x, y, z) of the tensor `map` describes to dst, completing
// its bytes on bar.
__device__ __forceinline__ void tma_load_box(void* dst, const CUtensorMap* map, uint64_t* bar,
                                             int x, int y, int z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(shared_address(bar)), "r"(x), "r"(y), "r"(z)
      : "memory");
}
#endif

// Threads: warps 0-7 consume, thread (lx, ly) = (i % 16, i / 16) computing
// the R x V outputs from row tile.y0 + R ly, column tile.x0 + V lx (the sums
// and their order of the other float32 7x7 kernels, so the outputs are bitwise
// theirs); warp 8 produces. Slot s of the ring holds the window of the
// block's tiles k with k % kSlots == s; full[s] completes when its window and
// taps have landed (32 producer arrivals and the TMA bytes), empty[s] when the
// eight consumer warps have read it.
__global__ void __launch_bounds__(kThreads, 1)
    streamed_tile_correlation_kernel(const __grid_constant__ CUtensorMap in_map,
                                     const float* __restrict__ weight,
                                     const float* __restrict__ bias, float* __restrict__ out,
                                     BlockedCorrelation g, int tiles_x, int tiles_y, int total) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ float4 streamed_shared_raw[];
  // Offsetting the array itself (not a cast integer) keeps the compiler
  // reading the slots with shared-memory loads rather than generic ones.
  unsigned char* slots = reinterpret_cast<unsigned char*>(streamed_shared_raw) +
                         ((128 - shared_address(streamed_shared_raw) % 128) % 128);
  uint64_t* full = reinterpret_cast<uint64_t*>(slots + kSlots * kSlotBytes);
  uint64_t* empty = full + kSlots;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      barrier_init(&full[s], 32);
      barrier_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == kConsumerWarps) {  // the producer
    int k = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x, ++k) {
      const int s = k % kSlots;
      // A fresh barrier counts as having completed the phase before its
      // first, so the first pass over the slots does not wait.
      barrier_wait(&empty[s], ((k / kSlots) & 1) ^ 1);
      const TileCoords tile = tile_coords(t, tiles_x, tiles_y);
      const int oc = tile.plane % g.out_channels, n = tile.plane / g.out_channels;
      unsigned char* slot = slots + s * kSlotBytes;
      float* taps = reinterpret_cast<float*>(slot + round_up_128(kWindowBytes));
      for (int e = lane; e < kTapFloats; e += 32) {
        const int a = e / kTapStride<K>, b = e % kTapStride<K>;
        taps[e] = b < K ? square_tap<K>(weight + int64_t(oc) * K * K, a, b, g.flip) : 0.f;
      }
      if (lane == 0) {
        barrier_arrive_expect(&full[s], kWindowBytes);
        tma_load_box(slot, &in_map, &full[s], tile.x0 - 4, tile.y0 - g.ph,
                     n * g.in_channels + oc / g.div);
      } else {
        barrier_arrive(&full[s]);
      }
    }
    return;
  }

  const int lx = threadIdx.x % 16, ly = threadIdx.x / 16;
  int k = 0;
  for (int t = blockIdx.x; t < total; t += gridDim.x, ++k) {
    const int s = k % kSlots;
    const TileCoords tile = tile_coords(t, tiles_x, tiles_y);
    const unsigned char* slot = slots + s * kSlotBytes;
    const float* rows = reinterpret_cast<const float*>(slot) + R * ly * kWindowCols + V * lx;
    const float* taps = reinterpret_cast<const float*>(slot + round_up_128(kWindowBytes));
    barrier_wait(&full[s], (k / kSlots) & 1);
    float acc[R][V];
    correlate_shared_window<K, R, V, kWindowCols>(rows, taps, acc);
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[s]);  // the slot is free for tile k + kSlots
    const int x0 = tile.x0 + V * lx, y0 = tile.y0 + R * ly;
    if (x0 < g.ow && y0 < g.oh) {
      store_blocked_outputs<float, float, R, V, true>(
          acc, bias, tile.plane % g.out_channels, out + int64_t(tile.plane) * g.oh * g.ow, y0, x0,
          g);
    }
  }
#endif
}

// Whether the kernel runs on `device` with its shared memory: compute
// capability 9.0 or newer, and a binary built for it (older builds compile the
// kernel empty).
const KernelFit& fit_on(int device) {
  static CachedKernelFit fit(reinterpret_cast<const void*>(&streamed_tile_correlation_kernel),
                             KernelNeeds{90, kThreads, kSharedBytes});
  return fit.on(device);
}

// cuTensorMapEncodeTiled from the driver the runtime uses (null where the
// driver lacks it), so the library does not link the driver library itself.
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace streamed_tile_detail

bool launch_streamed_tile_correlation(const float* in, const float* weight, const float* bias,
                                      float* out, const BlockedCorrelation& g,
                                      cudaStream_t stream) {
  using namespace streamed_tile_detail;
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (g.fan != 1 || g.pw != (K - 1) / 2 || g.w % 4 != 0 || g.ow % 4 != 0 || g.ow < kTileCols ||
      g.oh < kTileRows || g.h < 1 || g.ph < 0 || !aligned16(in) || !aligned16(out)) {
    return false;
  }
  const int64_t tiles_x = (g.ow + kTileCols - 1) / kTileCols;
  const int64_t tiles_y = (g.oh + kTileRows - 1) / kTileRows;
  const int64_t total = tiles_x * tiles_y * g.planes;
  if (total >= (int64_t{1} << 31)) return false;
  const KernelFit& fit = fit_on(c10::cuda::current_device());
  if (!fit) return false;
  const auto encode = encode_tiled();
  if (encode == nullptr) return false;
  // With fewer than three tiles per SM the blocks' first loads and last
  // multiply-adds do not overlap anything, and the staged-tile kernel (three
  // blocks per SM, each its own tile) was as fast or faster (H100 and H200:
  // 3 planes of 1000 x 1004, 384 tiles, 4-10% faster; 2048^2, 512 tiles, even).
  const int sms = fit.sms;
  if (total < 3 * int64_t(sms)) return false;

  // The input planes as a (planes, h, w) tensor for the TMA unit.
  const int64_t in_planes = int64_t(g.planes) / g.out_channels * g.in_channels;
  const cuuint64_t dims[3] = {cuuint64_t(g.w), cuuint64_t(g.h), cuuint64_t(in_planes)};
  const cuuint64_t strides[2] = {cuuint64_t(g.w) * 4, cuuint64_t(g.w) * g.h * 4};
  const cuuint32_t box[3] = {kWindowCols, kWindowRows, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, const_cast<float*>(in), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  const int blocks = static_cast<int>(std::min<int64_t>(total, sms));
  streamed_tile_correlation_kernel<<<blocks, kThreads, kSharedBytes, stream>>>(
      map, weight, bias, out, g, static_cast<int>(tiles_x), static_cast<int>(tiles_y),
      static_cast<int>(total));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace customconv
