// The grouped forward on tensor cores for 8, 16 and 32 channels a group
// (grouped_mma.h): a block computes a rectangle of output positions of one
// image from the input rectangle under it (its halo), read into shared
// memory once, so that the 9 taps of a 3x3 window read each input value
// from shared memory rather than 9 times from L1 or L2.
#include "ops/conv2d/grouped_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/activation.h"
#include "ops/common/async_copy.cuh"
#include "ops/common/kernel_fit.h"
#include "ops/common/launch.h"
#include "ops/common/mma_sync.cuh"
#include "ops/common/pair_io.cuh"
#include "ops/conv2d/grouped_mma_gradients.cuh"

namespace customconv {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRowTiles = 2;                    // 16-position row tiles per warp
constexpr int kTile = 16 * kRowTiles * kWarps;  // output positions a block covers at most
constexpr int kTaps = 9;                        // 3x3 windows
constexpr int kMaxSharedBytes = 100 * 1024;
constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

// One call's geometry, channels_last: input (n, h, w, c), output (n, p, q,
// c) (as many output channels as input channels), weight (c, 3, 3, width).
// A block's output rectangle is th x tw positions (th * tw <= kTile), tiles_x
// of them across an output row; its halo is halo_h x halo_w input pixels.
struct Geometry {
  int h, w, c, p, q, sh, sw, ph, pw, dh, dw;
  int th, tw, tiles_x, halo_h, halo_w;
};

// Rows of 16 or 32 16-bit values in shared memory are padded by 8 so that
// an ldmatrix's eight rows fall in distinct banks; rows of 8 (16 bytes) are
// already.
constexpr int pitch_for(int values) { return values == 8 ? 8 : values + 8; }

// Shared memory, in 16-bit elements: the weight of the block's CB output
// channels, (tap, output channel, input channel of its group), then the
// halo, (pixel, CB input channels).
template <int CG, int CB>
struct Layout {
  static constexpr int kPitch = pitch_for(CB), kWeightPitch = pitch_for(CG);
  static constexpr int kWeight = kTaps * CB * kWeightPitch;
};

template <int CG, int CB>
int shared_bytes(const Geometry& g) {
  return 2 * (Layout<CG, CB>::kWeight + g.halo_h * g.halo_w * Layout<CG, CB>::kPitch);
}

// Block (tile, y, n): the output rectangle `tile` (row-major over the
// plane's tiles) of image n, for GPB neighbouring groups (CB = GPB * CG
// channels from y * CB on). The block brings the weight and the halo into
// shared memory with cp.async (zeros outside the input), then, per group,
// D (positions x CG output channels) = sum over taps and the group's input
// channels of A (a position's input pixel under the tap) times B (the
// tap's weight), in mma.sync m16n8k8 steps of 8 input channels. A row of
// the tile is a position (r / tw, r % tw) of the rectangle: ldmatrix takes
// each lane's row from its own halo pixel, so the taps only move the rows'
// addresses. Warp w owns row tiles 2w and 2w + 1 (rows past th * tw are
// left out; those past the plane are computed and not stored) and all CB / 8
// column tiles; lane l holds rows l / 4 and + 8 of a row tile and output
// channels 2 (l % 4), + 1 of each column tile, stored as pairs after the
// bias, the residual and the activation.
template <typename T, int CG, int GPB>
__global__ void __launch_bounds__(kThreads)
    grouped_mma_tiled_forward_kernel(const T* __restrict__ in, const T* __restrict__ wt,
                                     const T* __restrict__ bias, const T* __restrict__ residual,
                                     Activation act, T* __restrict__ out, Geometry g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr int CB = CG * GPB;
  using L = Layout<CG, CB>;
  constexpr int kVectors = CB / 8, kWeightVectors = CG / 8;
  constexpr int kColumnTiles = CB / 8, kGroupTiles = CG / 8;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* ws = reinterpret_cast<T*>(shared_raw);
  T* xs = ws + L::kWeight;

  const int channel0 = int(blockIdx.y) * CB, n = int(blockIdx.z);
  const int y0 = int(blockIdx.x) / g.tiles_x * g.th, x0 = int(blockIdx.x) % g.tiles_x * g.tw;
  const int iy0 = y0 * g.sh - g.ph, ix0 = x0 * g.sw - g.pw;  // the halo's top-left pixel

  for (int item = threadIdx.x; item < CB * kTaps * kWeightVectors; item += kThreads) {
    const int v = item % kWeightVectors, t = item / kWeightVectors % kTaps, k = item / (kWeightVectors * kTaps);
    copy_async_16(shared_address(ws + (t * CB + k) * L::kWeightPitch + v * 8),
                  wt + ((int64_t(channel0 + k) * kTaps + t) * CG + v * 8));
  }
  const int halo = g.halo_h * g.halo_w;
  for (int item = threadIdx.x; item < halo * kVectors; item += kThreads) {
    const int v = item % kVectors, pixel = item / kVectors;
    const int iy = iy0 + pixel / g.halo_w, ix = ix0 + pixel % g.halo_w;
    const bool inside = unsigned(iy) < unsigned(g.h) && unsigned(ix) < unsigned(g.w);
    const T* src = inside ? in + (((int64_t(n) * g.h + iy) * g.w + ix) * g.c + channel0 + v * 8) : in;
    copy_async_16_cached(shared_address(xs + pixel * L::kPitch + v * 8), src, inside ? 16 : 0);
  }
  copy_async_commit();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int count = g.th * g.tw;
  // This lane's A row in each row tile: the halo pixel of its position's
  // top-left tap (rows past the rectangle repeat its last position).
  int row_pixel[kRowTiles];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
    const int r = min((warp * kRowTiles + rt) * 16 + (lane & 15), count - 1);
    row_pixel[rt] = (r / g.tw) * g.sh * g.halo_w + (r % g.tw) * g.sw;
  }
  const int live = min(kRowTiles, max(0, (count - warp * kRowTiles * 16 + 15) / 16));  // row tiles with positions

  float acc[kRowTiles][kColumnTiles][4] = {};
  copy_async_wait_all();
  __syncthreads();
  for (int t = 0; t < kTaps; ++t) {
    const int shift = (t / 3) * g.dh * g.halo_w + (t % 3) * g.dw;
#pragma unroll
    for (int gg = 0; gg < GPB; ++gg) {
#pragma unroll
      for (int cs = 0; cs < kGroupTiles; ++cs) {
        const int c0 = gg * CG + cs * 8;
        // B: the group's kGroupTiles column tiles, rows (output channels) of 8 input channels.
        uint32_t b[kGroupTiles];
        load_matrices<kGroupTiles>(
            b, shared_address(ws + (t * CB + gg * CG + (lane & (8 * kGroupTiles - 1))) * L::kWeightPitch + cs * 8));
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt) {
          if (rt >= live) break;
          uint32_t a[2];
          load_matrix_x2(a, shared_address(xs + (row_pixel[rt] + shift) * L::kPitch + c0));
#pragma unroll
          for (int ct = 0; ct < kGroupTiles; ++ct) mma_16x8x8<T>(acc[rt][gg * kGroupTiles + ct], a, b[ct]);
        }
      }
    }
  }

  float bias_lo[kColumnTiles], bias_hi[kColumnTiles];
#pragma unroll
  for (int ct = 0; ct < kColumnTiles; ++ct) {
    const int ch = channel0 + ct * 8 + 2 * (lane & 3);
    bias_lo[ct] = bias != nullptr ? static_cast<float>(bias[ch]) : 0.f;
    bias_hi[ct] = bias != nullptr ? static_cast<float>(bias[ch + 1]) : 0.f;
  }
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = (warp * kRowTiles + rt) * 16 + (lane >> 2) + 8 * half;
      const int y = y0 + r / g.tw, x = x0 + r % g.tw;
      if (r >= count || y >= g.p || x >= g.q) continue;
      const int64_t o = ((int64_t(n) * g.p + y) * g.q + x) * g.c + channel0 + 2 * (lane & 3);
#pragma unroll
      for (int ct = 0; ct < kColumnTiles; ++ct) {
        store_epilogue(out + o + ct * 8, residual != nullptr ? residual + o + ct * 8 : nullptr, act,
                       acc[rt][ct][2 * half] + bias_lo[ct], acc[rt][ct][2 * half + 1] + bias_hi[ct]);
      }
    }
  }
#endif
}

template <typename T, int CG, int GPB>
const KernelFit& fit_on(int device) {
  static CachedKernelFit fit(reinterpret_cast<const void*>(&grouped_mma_tiled_forward_kernel<T, CG, GPB>),
                             KernelNeeds{80, kThreads, size_t(kMaxSharedBytes)});
  return fit.on(device);
}

}  // namespace

std::optional<at::Tensor> grouped_mma_tiled_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   const Conv2dShape<int64_t>& s, const ConvEpilogue* epilogue) {
  namespace gm = grouped_mma_gradients;
  if (!gm::takes(input, s) || s.in.n > 65535) return std::nullopt;
  const bool has_residual = epilogue != nullptr && epilogue->has_residual();
  // The residual is read where the output is written: channels_last, aligned like it.
  if (has_residual && (!epilogue->residual.is_contiguous(kChannelsLast) ||
                       reinterpret_cast<uintptr_t>(epilogue->residual.const_data_ptr()) % 4 != 0)) {
    return std::nullopt;
  }
  const int64_t cg = s.in.c / s.groups;
  const int gpb = gm::groups_per_block(cg, s.groups);
  const Window2d& win = s.win;
  // Stride 1 with groups of 8 or 16 channels that merge into 32-channel
  // blocks: elsewhere the other routes measured faster. On an H100 at N=32
  // in float16 with bias (`bench/bench.py`, us, this kernel against the
  // route before it): ResNeXt's 32 groups of 8 at 28x28 37.8 against 41.6,
  // of 16 at 14x14 24.3 against 28.1; RegNet's 13, 26 and 55 groups of 8
  // (one or two a block) 21.9, 13.1 and 12.4 against 19.6, 12.5 and 9.6 on
  // the kernel for groups of 8; at stride 2 the halos grow fourfold
  // (ResNeXt's 8 a group from 56x56 62.0 against 47, 16 a group 34.8
  // against 31.7), and with 32 channels a group each block reads the
  // group's whole weight (23 KB) for at most 128 positions (ResNeXt's 7x7
  // layer 23.7 against 15).
  if (win.sh != 1 || win.sw != 1 || cg > 16 || cg * gpb != 32) return std::nullopt;
  Geometry g{int(s.in.h), int(s.in.w), int(s.in.c), int(s.oh), int(s.ow), int(win.sh), int(win.sw),
             int(win.ph), int(win.pw), int(win.dh), int(win.dw), 0, 0, 0, 0, 0};
  if (s.oh == 0 || s.ow == 0) return std::nullopt;
  g.tw = int(std::min<int64_t>(s.ow, 16));
  g.th = int(std::min<int64_t>(s.oh, kTile / g.tw));
  g.tiles_x = int((s.ow + g.tw - 1) / g.tw);
  g.halo_h = (g.th - 1) * g.sh + 2 * g.dh + 1;
  g.halo_w = (g.tw - 1) * g.sw + 2 * g.dw + 1;
  const int64_t tiles = int64_t(g.tiles_x) * ((s.oh + g.th - 1) / g.th);
  const int device = input.get_device();
  const int bytes = gm::dispatch(input.scalar_type(), cg, gpb, [&](auto, auto width, auto per_block) {
    constexpr int CG = decltype(width)::value, GPB = decltype(per_block)::value;
    return shared_bytes<CG, CG * GPB>(g);
  });
  const bool fits = gm::dispatch(input.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    return bool(fit_on<decltype(tag), decltype(width)::value, decltype(per_block)::value>(device));
  });
  if (!fits || bytes > kMaxSharedBytes || tiles > 0x7fffffff) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor x = input.contiguous(kChannelsLast);
  const at::Tensor w = weight.contiguous(kChannelsLast);
  // 16-byte vectors of 8 channels.
  if (reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.const_data_ptr()) % 16 != 0) {
    return std::nullopt;
  }
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out.contiguous(format);
  const dim3 grid(unsigned(tiles), unsigned(s.groups / gpb), unsigned(s.in.n));
  const auto stream = at::cuda::getCurrentCUDAStream();
  gm::dispatch(x.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    using T = decltype(tag);
    constexpr int CG = decltype(width)::value, GPB = decltype(per_block)::value;
    grouped_mma_tiled_forward_kernel<T, CG, GPB><<<grid, kThreads, bytes, stream>>>(
        x.const_data_ptr<T>(), w.const_data_ptr<T>(), has_bias ? b.const_data_ptr<T>() : nullptr,
        has_residual ? epilogue->residual.const_data_ptr<T>() : nullptr,
        epilogue != nullptr ? epilogue->activation : Activation::kIdentity, out.mutable_data_ptr<T>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out.contiguous(format);
}

}  // namespace customconv
