// The forward of float32 (TF32) groups of 32 channels on Hopper (sm_90a),
// each tile's input loaded once for all of its taps: behind
// implicit_gemm.h's fprop_sm90_f32 for merged groups (wgmma_fprop_plan),
// where halo_plan.h's halo_shape takes the layer. No ATen here.
//
// The input as planes: for stride (sh, sw), plane (u, v) holds the pixels
// (sh a + u - pad_h, sw b + v - pad_w), so that tap (r, s) reads plane
// (r % sh, s % sw) at (y + r / sh, x + s / sw) for output position (y, x).
// A tile's rows are output positions flattened with the plane's row pitch
// wp = q + (kw - 1) / sw (row i: x = i % wp, y = i / wp; the last
// (kw - 1) / sw positions of a row are not outputs and are dropped when
// stored), so that every tap reads the same rows of its plane shifted by
// one amount, (r / sh) wp + s / sw: the warpgroup MMA reads A from the
// plane's shared-memory copy at that offset, a whole number of 128-byte rows
// (the 128-byte swizzle is a function of the shared-memory address, as TMA
// wrote it: the descriptor's base offset stays 0; with it set to the start's
// phase, as for swizzles relative to the start, the results came out wrong
// on an H200).
// One TMA load per plane brings a tile's bh + (kh - 1) / sh rows of wp
// pixels x its group's 32 channels (zeros outside the image); a tile of whole
// small images stacks bn images' planes. Against the forward kernel
// (implicit_gemm_wgmma.cuh), which loads a box of pixels for every tap, a 3x3
// tile reads 1.3-2.6 times its positions' pixels instead of 9.
//
// Block: two consumer warpgroups (rows 0-63 and 64-127 of a 128-position
// tile, 32 output channels: one group) and one producer warp. The
// producer's lane 0 walks the block's tiles (t = blockIdx.x, then strided by
// the grid, group fastest) and, per tile, waits for a stage to be empty and
// loads its planes and the group's weight (taps x 32 x 32, one 2-D load a
// tap) into it. Each consumer warpgroup waits for the stage, issues the
// tile's taps x 4 m64 x 32 x 8 instructions, waits for them, frees the
// stage, and stores its 64 rows with the bias, residual and activation
// (store_tile).
#pragma once

#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cstdlib>

#include "ops/common/kernel_fit.h"
#include "ops/conv2d/halo_plan.h"
#include "ops/conv2d/implicit_gemm.h"
#include "ops/conv2d/implicit_gemm_wgmma.cuh"

namespace customconv::implicit_gemm::wgmma_halo {

using wgmma_fprop::Args;

constexpr int kCols = kHaloCols, kRowBytes = kHaloRowBytes, kTapBytes = kHaloTapBytes;
constexpr int kTaps = kHaloTaps;  // a fixed run of instructions a tile
constexpr int kConsumers = 2 * kHaloRows, kThreads = kConsumers + 32;

// The kernel's arguments: the launch's Args (output, bias, residual,
// activation, n, k, c = 32, groups: what store_tile reads) and halo_shape's
// tiles (halo_plan.h).
struct HaloArgs {
  Args a;
  int p, q;    // output plane
  int sh, sw;  // strides (planes: sh x sw)
  int pad_h, pad_w;
  int wp, hh;       // a plane's row pitch (pixels) and rows an image in a tile
  int bh, bn;       // output rows and images a tile
  int th;           // tiles down the plane
  int tiles;        // th x image tiles x groups
  int plane_bytes;  // a plane's shared memory (whole 1024 bytes)
  int stage_bytes;  // planes x plane_bytes + taps x kTapBytes
  FastDivide div_groups, div_th, div_wp, div_image;  // image: hh x wp
};

// Tile t's merged group, first output row and first image: tiles run group
// fastest, then down the plane's row boxes, then over the image tiles.
struct HaloTile {
  int g, y0, n0;
};
__device__ __forceinline__ HaloTile halo_tile_at(const HaloArgs& h, int t) {
  const int box = h.div_groups.div(t), img_tile = h.div_th.div(box);
  return {t - box * h.a.groups, (box - img_tile * h.th) * h.bh, img_tile * h.bn};
}

template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    fprop_halo_kernel(const __grid_constant__ CUtensorMap xmap,
                      const __grid_constant__ CUtensorMap wmap, const HaloArgs h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t full = base + uint32_t(kStages * h.stage_bytes);
  const uint32_t empty = full + 8u * kStages;
  const Args& a = h.a;
  const int tid = threadIdx.x;
  const int planes = h.sh * h.sw, taps = kTaps;
  if (tid == kConsumers) {
    wgmma_fprop::prefetch_map(&xmap);
    wgmma_fprop::prefetch_map(&wmap);
    for (int i = 0; i < kStages; ++i) {
      wgmma::barrier_init(full + 8u * i, 1);
      wgmma::barrier_init(empty + 8u * i, kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (tid >= kConsumers) {  // the producer: one thread
    if (tid != kConsumers) return;
    const uint32_t bytes = uint32_t(planes * h.bn * h.hh * h.wp * kRowBytes + taps * kTapBytes);
    int it = 0;
#pragma unroll 1
    for (int t = blockIdx.x; t < h.tiles; t += gridDim.x, ++it) {
      const auto [g, y0, n0] = halo_tile_at(h, t);
      const int st = it % kStages;
      wgmma::barrier_wait(empty + 8u * st, ((it / kStages) & 1) ^ 1);
      const uint32_t bar = full + 8u * st;
      wgmma_fprop::expect_bytes(bar, bytes);
      const uint32_t stage = base + uint32_t(st * h.stage_bytes);
#pragma unroll 1
      for (int u = 0; u < h.sh; ++u) {
        for (int v = 0; v < h.sw; ++v) {
          wgmma_fprop::load_4d(stage + uint32_t((u * h.sw + v) * h.plane_bytes), &xmap, g * kCols,
                               v - h.pad_w, h.sh * y0 + u - h.pad_h, n0, bar);
        }
      }
      const uint32_t wdst = stage + uint32_t(planes * h.plane_bytes);
#pragma unroll 1
      for (int tap = 0; tap < taps; ++tap) {
        wgmma_fprop::load_2d(wdst + uint32_t(tap * kTapBytes), &wmap, tap * kCols, g * kCols, bar);
      }
    }
    return;
  }

  // Consumers.
  const int group = tid / 128, warp = (tid & 127) >> 5, lane = tid & 31;
  // Each tap's plane and row shift, once.
  int tap_plane[kTaps], tap_shift[kTaps];
#pragma unroll
  for (int tap = 0; tap < kTaps; ++tap) {
    const int r = tap / 3, s = tap - r * 3;
    tap_plane[tap] = (r % h.sh) * h.sw + s % h.sw;
    tap_shift[tap] = (r / h.sh) * h.wp + s / h.sw;
  }
  float acc[16];
  int it = 0;
#pragma unroll 1
  for (int t = blockIdx.x; t < h.tiles; t += gridDim.x, ++it) {
    const auto [g, y0, n0] = halo_tile_at(h, t);
    const int col0 = g * kCols + 2 * (lane & 3);
    float2 bias[kCols / 8];
    wgmma_fprop::load_bias<float, kCols>(a, col0, bias);
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] = 0.f;
    const int st = it % kStages;
    wgmma::barrier_wait(full + 8u * st, (it / kStages) & 1);
    const uint32_t stage = base + uint32_t(st * h.stage_bytes);
    const uint32_t wsrc = stage + uint32_t(planes * h.plane_bytes);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int tap = 0; tap < kTaps; ++tap) {
      const uint32_t at = stage + uint32_t(tap_plane[tap] * h.plane_bytes) +
                          uint32_t((group * 64 + tap_shift[tap]) * kRowBytes);
      const uint32_t bt = wsrc + uint32_t(tap * kTapBytes);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma::mma_m64n32k8_tf32(acc, wgmma::desc_of(wgmma::desc_lo(at + 32 * kk)),
                                 wgmma::desc_of(wgmma::desc_lo(bt + 32 * kk)), 1);
      }
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
    if (lane == 0) wgmma::barrier_arrive(empty + 8u * st);

    // The thread's two rows' output offsets (-1: not an output).
    int offs[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = group * 64 + warp * 16 + (lane >> 2) + 8 * e;
      const int img = h.div_image.div(i), rem = i - img * h.hh * h.wp;
      const int y = h.div_wp.div(rem), x = rem - y * h.wp;
      const int n = n0 + img, oy = y0 + y;
      offs[e] = img < h.bn && y < h.bh && x < h.q && oy < h.p && n < a.n
                    ? ((n * h.p + oy) * h.q + x) * a.k
                    : -1;
    }
    wgmma_fprop::add_bias<kCols>(acc, bias);
    wgmma_fprop::with_epilogue(a, [&](auto act, auto residual, auto partial) {
      wgmma_fprop::store_tile<float, kCols, decltype(act)::value, decltype(residual)::value,
                              decltype(partial)::value>(a, acc, offs, col0, 0, 0);
    });
  }
#endif
}

// ---------------------------------------------------------------- host side

// The planes' map (a tile's hh rows x wp pixels of one plane x 32 channels
// x bn images, every sh-th row and sw-th pixel) and the weight's ((K, taps
// x 32): 32 output channels x one tap); false where the driver refuses them.
inline bool make_halo_maps(CUtensorMap* xmap, CUtensorMap* wmap, const ConvProblem& pr,
                           const HaloArgs& h) {
  const wgmma_fprop::EncodeTiled encode = wgmma_fprop::encoder();
  if (encode == nullptr) return false;
  const cuuint64_t es = 4, c = cuuint64_t(pr.c);
  const cuuint64_t xdims[4] = {c, cuuint64_t(pr.w), cuuint64_t(pr.h), cuuint64_t(pr.n)};
  const cuuint64_t xstrides[3] = {c * es, cuuint64_t(pr.w) * c * es,
                                  cuuint64_t(pr.h) * pr.w * c * es};
  const cuuint32_t xbox[4] = {cuuint32_t(kCols), cuuint32_t(h.wp * h.sw), cuuint32_t(h.hh * h.sh),
                              cuuint32_t(h.bn)};
  const cuuint32_t xstep[4] = {1, cuuint32_t(h.sw), cuuint32_t(h.sh), 1};
  if (encode(xmap, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 4, pr.input, xdims, xstrides, xbox, xstep,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    return false;
  }
  const int taps = pr.r * pr.s;
  const cuuint64_t wdims[2] = {cuuint64_t(taps) * kCols, cuuint64_t(pr.k)};
  const cuuint64_t wstrides[1] = {cuuint64_t(taps) * kCols * es};
  const cuuint32_t wbox[2] = {cuuint32_t(kCols), cuuint32_t(kCols)};
  const cuuint32_t wstep[2] = {1, 1};
  return encode(wmap, CU_TENSOR_MAP_DATA_TYPE_TFLOAT32, 2, pr.weight, wdims, wstrides, wbox, wstep,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace customconv::implicit_gemm::wgmma_halo

namespace customconv::implicit_gemm {

// Launches the halo kernel on `pr` (float32 merged groups, split_k 1, packed
// NHWC input) where halo_shape takes it; false (nothing launched) otherwise,
// where the device cannot run it or the driver refuses the tensor maps.
inline bool fprop_halo_f32(const ConvProblem& pr) {
  using namespace wgmma_halo;
  const HaloShape plan = halo_shape(pr);
  if (!plan.take || pr.split_k != 1 || pr.input_strides[0] != 0) return false;
  HaloArgs h{};
  h.p = pr.p, h.q = pr.q, h.sh = pr.stride_h, h.sw = pr.stride_w, h.pad_h = pr.pad_h,
  h.pad_w = pr.pad_w;
  h.wp = plan.wp, h.hh = plan.hh, h.bh = plan.bh, h.bn = plan.bn, h.th = plan.th,
  h.tiles = plan.tiles;
  h.plane_bytes = plan.plane_bytes, h.stage_bytes = plan.stage_bytes;
  h.div_groups = FastDivide::of(pr.groups), h.div_th = FastDivide::of(h.th);
  h.div_wp = FastDivide::of(h.wp), h.div_image = FastDivide::of(h.hh * h.wp);
  Args& a = h.a;
  a.y = pr.output, a.bias = pr.bias, a.residual = pr.residual, a.activation = pr.activation;
  a.split = 1, a.n = pr.n, a.k = pr.k, a.c = kCols, a.groups = pr.groups;
  const auto kernel = plan.stages == 3 ? &fprop_halo_kernel<3> : &fprop_halo_kernel<2>;
  static CachedKernelFit fit3(reinterpret_cast<const void*>(&fprop_halo_kernel<3>),
                              KernelNeeds{90, kThreads, kHaloSmemLimit});
  static CachedKernelFit fit2(reinterpret_cast<const void*>(&fprop_halo_kernel<2>),
                              KernelNeeds{90, kThreads, kHaloSmemLimit});
  const KernelFit& fit = (plan.stages == 3 ? fit3 : fit2).on(pr.device);
  if (!fit) return false;
  CUtensorMap xmap, wmap;
  if (!make_halo_maps(&xmap, &wmap, pr, h)) return false;
  // Two blocks a multiprocessor where two fit in its 228 KiB.
  const int per_sm = 2 * (plan.smem + 1024) <= 228 * 1024 ? 2 : 1;
  const unsigned blocks = unsigned(std::min<int64_t>(h.tiles, int64_t(fit.sms) * per_sm));
  kernel<<<blocks, kThreads, plan.smem, static_cast<cudaStream_t>(pr.stream)>>>(xmap, wmap, h);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return true;
}

}  // namespace customconv::implicit_gemm
