// The grouped input gradient on tensor cores (grouped_mma.h): for each group
// and each input position, the sum over the window's taps of grad_output at
// the output position that tap reaches from there, times the tap's (K/g x
// C/g) weight. Input positions are taken a stride phase at a time, so that
// every position of a block reaches an output position through the same
// taps, and the taps that reach none are never visited (3 of every 4 at
// stride 2 with a 3x3 window).
#include "ops/conv2d/grouped_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "ops/common/async_copy.cuh"
#include "ops/common/kernel_fit.h"
#include "ops/common/launch.h"
#include "ops/common/mma_sync.cuh"
#include "ops/common/pair_io.cuh"
#include "ops/common/relayout_cuda.h"
#include "ops/conv2d/grouped_mma_gradients.cuh"

namespace customconv {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 2;                 // 16-position row tiles per warp
constexpr int kTile = 16 * kTileRows * kWarps;  // input positions per block
constexpr int kTaps = 9;                     // 3x3 windows
constexpr int kStages = 3;

// One call's geometry, channels_last: grad_input (n, h, w, c), grad_output
// (n, p, q, c) (as many output channels as input channels), weight (c, 3,
// 3, width).
struct Geometry {
  int n, h, w, c, p, q, sh, sw, ph, pw, dh, dw;
};

// Rows of 16 or 32 16-bit values in shared memory are padded by 8 so that
// an ldmatrix's eight rows fall in distinct banks; rows of 8 (16 bytes) are
// already.
constexpr int pitch_for(int values) { return values == 8 ? 8 : values + 8; }

// Shared memory of a stage (one tap), in 16-bit elements: grad_output at
// the block's positions through the tap, (position, output channel: CB of
// them, the block's groups'), then the tap's weight, (output channel, input
// channel of its group: CG).
template <int CG, int CB>
struct Stage {
  static constexpr int kPitch = pitch_for(CB), kWeightPitch = pitch_for(CG);
  static constexpr int kGrad = kTile * kPitch;
  static constexpr int kElements = kGrad + CB * kWeightPitch;
  static constexpr int kBytes = 2 * kElements;
};

template <int CG, int CB>
constexpr int kSharedBytes = kStages * Stage<CG, CB>::kBytes;

// Block (tile, y, phase): kTile input positions (n, a * sh + py, b * sw +
// px) of stride phase (py, px) = (phase / sw, phase % sw), flattened over
// (n, a, b), and GPB neighbouring groups (CB = GPB * CG channels from y * CB
// on, read as one run per position). Per group, D (positions x CG input
// channels) = sum over the phase's taps of A_t (positions x CG output
// channels: grad_output where tap t reaches from each position, zeros where
// that falls outside it) times W_t (the tap's weight, output x input
// channels). A tap reaches the output position ((iy + ph - i dh) / sh, (ix +
// pw - j dw) / sw), a whole one for every position of the phase or none.
// Each stage holds one tap's A_t and W_t, brought in with cp.async three
// stages deep; ldmatrix makes the fragments of mma.sync m16n8k8 steps over
// 8 output channels, each step multiplying its group's column tiles only.
// Warp w owns row tiles 2w and 2w + 1 (16 positions each) and all CB / 8
// column tiles; lane l holds positions l / 4 and + 8 of
// a row tile and input channels 2 (l % 4), + 1 of each column tile, stored
// as pairs.
template <typename T, int CG, int GPB>
__global__ void __launch_bounds__(kThreads)
    grouped_mma_grad_input_kernel(const T* __restrict__ gout, const T* __restrict__ wt, T* __restrict__ gin,
                                  Geometry g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr int CB = CG * GPB;
  using S = Stage<CG, CB>;
  constexpr int kVectors = CB / 8;        // 16-byte vectors of a position's channels
  constexpr int kWeightVectors = CG / 8;  // and of a weight row's
  constexpr int kColumnTiles = CB / 8;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  T* shared = reinterpret_cast<T*>(shared_raw);

  const int channel0 = int(blockIdx.y) * CB, py = int(blockIdx.z) / g.sw, px = int(blockIdx.z) % g.sw;
  const int rows = py < g.h ? (g.h - py + g.sh - 1) / g.sh : 0;
  const int cols = px < g.w ? (g.w - px + g.sw - 1) / g.sw : 0;
  const int plane = rows * cols, count = g.n * plane;
  const int first = int(blockIdx.x) * kTile;
  if (first >= count) return;

  // The phase's taps, those whose offset from (py, px) is a whole number of
  // strides, as the offsets (oy - a, ox - b) of the output position they
  // reach from input position (a sh + py, b sw + px).
  int tap_of[kTaps], tap_dy[kTaps], tap_dx[kTaps];
  int tap_count = 0;
#pragma unroll
  for (int t = 0; t < kTaps; ++t) {
    const int ry = py + g.ph - (t / 3) * g.dh, rx = px + g.pw - (t % 3) * g.dw;
    if (((ry % g.sh) + g.sh) % g.sh == 0 && ((rx % g.sw) + g.sw) % g.sw == 0) {
      tap_of[tap_count] = t, tap_dy[tap_count] = ry / g.sh, tap_dx[tap_count] = rx / g.sw;
      ++tap_count;
    }
  }

  // This thread's (position, vector) items of a stage: item i * kThreads +
  // threadIdx.x; each position's image and (a, b) found once.
  constexpr int kItems = kTile * kVectors / kThreads;
  static_assert(kItems * kThreads == kTile * kVectors, "whole items per thread");
  int item_image[kItems], item_a[kItems], item_b[kItems];
#pragma unroll
  for (int it = 0; it < kItems; ++it) {
    const int m = first + (it * kThreads + int(threadIdx.x)) / kVectors;
    const int r = m % plane;
    item_image[it] = m < count ? m / plane : -1;
    item_a[it] = r / cols, item_b[it] = r % cols;
  }

  const auto load = [&](int index, int stage) {
    T* as = shared + stage * S::kElements;
    T* ws = as + S::kGrad;
    const int t = tap_of[index], dy = tap_dy[index], dx = tap_dx[index];
#pragma unroll
    for (int it = 0; it < kItems; ++it) {
      const int item = it * kThreads + int(threadIdx.x);
      const int p = item / kVectors, v = item % kVectors;
      const int oy = item_a[it] + dy, ox = item_b[it] + dx;
      const bool inside = item_image[it] >= 0 && unsigned(oy) < unsigned(g.p) && unsigned(ox) < unsigned(g.q);
      const T* src =
          inside ? gout + ((int64_t(item_image[it] * g.p + oy) * g.q + ox) * g.c + channel0 + v * 8) : gout;
      copy_async_16_cached(shared_address(as + p * S::kPitch + v * 8), src, inside ? 16 : 0);
    }
    for (int item = threadIdx.x; item < CB * kWeightVectors; item += kThreads) {
      const int k = item / kWeightVectors, v = item % kWeightVectors;
      copy_async_16(shared_address(ws + k * S::kWeightPitch + v * 8),
                    wt + ((int64_t(channel0 + k) * kTaps + t) * CG + v * 8));
    }
  };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[kTileRows][kColumnTiles][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tap_count) load(s, s);
    copy_async_commit();
  }
  for (int index = 0; index < tap_count; ++index) {
    if (index + kStages - 1 < tap_count) load(index + kStages - 1, (index + kStages - 1) % kStages);
    copy_async_commit();
    copy_async_wait<kStages - 1>();
    __syncthreads();
    const T* as = shared + (index % kStages) * S::kElements;
    const T* ws = as + S::kGrad;
#pragma unroll
    for (int k0 = 0; k0 < CB; k0 += 8) {
      constexpr int kGroupTiles = CG / 8;
      const int tile0 = k0 / CG * kGroupTiles;  // the step's group's first column tile
      uint32_t b[kGroupTiles];
#pragma unroll
      for (int ct = 0; ct < kGroupTiles; ++ct) {
        b[ct] = load_matrix_x1_trans(shared_address(ws + (k0 + (lane & 7)) * S::kWeightPitch + ct * 8));
      }
#pragma unroll
      for (int rt = 0; rt < kTileRows; ++rt) {
        const int row = (warp * kTileRows + rt) * 16 + (lane & 15);
        uint32_t a[2];
        load_matrix_x2(a, shared_address(as + row * S::kPitch + k0));
#pragma unroll
        for (int ct = 0; ct < kGroupTiles; ++ct) mma_16x8x8<T>(acc[rt][tile0 + ct], a, b[ct]);
      }
    }
    __syncthreads();
  }
  copy_async_wait_all();

#pragma unroll
  for (int rt = 0; rt < kTileRows; ++rt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = first + (warp * kTileRows + rt) * 16 + (lane >> 2) + 8 * half;
      if (m >= count) continue;
      const int n = m / plane, r = m % plane;
      const int iy = (r / cols) * g.sh + py, ix = (r % cols) * g.sw + px;
      T* dst = gin + ((int64_t(n * g.h + iy) * g.w + ix) * g.c + channel0 + 2 * (lane & 3));
#pragma unroll
      for (int ct = 0; ct < kColumnTiles; ++ct) {
        store_pair(dst + ct * 8, acc[rt][ct][2 * half], acc[rt][ct][2 * half + 1]);
      }
    }
  }
#endif
}

template <typename T, int CG, int GPB>
const KernelFit& fit_on(int device) {
  static CachedKernelFit fit(reinterpret_cast<const void*>(&grouped_mma_grad_input_kernel<T, CG, GPB>),
                             KernelNeeds{80, kThreads, size_t(kSharedBytes<CG, CG * GPB>)});
  return fit.on(device);
}

}  // namespace

std::optional<at::Tensor> grouped_mma_conv2d_grad_input(const at::Tensor& grad_output,
                                                        const at::Tensor& input,
                                                        const at::Tensor& weight,
                                                        const Conv2dShape<int64_t>& s,
                                                        bool channels_last_result) {
  namespace gm = grouped_mma_gradients;
  if (grad_output.dim() != 4 || !gm::takes(input, s)) return std::nullopt;
  const int64_t cg = s.in.c / s.groups;
  const int gpb = gm::groups_per_block(cg, s.groups);
  // Groups of 8 channels a block takes one at a time (16-byte runs) under
  // 32 groups keep the other routes, which measured faster: on an H100 at
  // N=32 in float16, RegNet's 13 groups of 8 at 56x56 stride 2 took 56.5 us
  // here against 38.4 as a dense problem, and at 28x28 stride 1 34.2 against
  // 21.8 as the grouped forward of the rotated weight; its 55 groups took
  // 18.0 and 11.3 us here against 35.7 and 12.7.
  if (cg * gpb == 8 && s.groups < 32) return std::nullopt;
  const int device = input.get_device();
  const bool fits = gm::dispatch(input.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    return bool(fit_on<decltype(tag), decltype(width)::value, decltype(per_block)::value>(device));
  });
  if (!fits) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format =
      channels_last_result ? at::MemoryFormat::ChannelsLast : conv2d_output_format(input, weight);
  at::Tensor go, w;
  std::tie(go, w) = to_channels_last_together(grad_output, weight);  // NCHW by the transpose kernel
  // 16-byte vectors of 8 channels.
  if (reinterpret_cast<uintptr_t>(go.const_data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.const_data_ptr()) % 16 != 0) {
    return std::nullopt;
  }
  at::Tensor gi = empty_channels_last(input, s.in.n, s.in.c, s.in.h, s.in.w);
  if (gi.numel() == 0) return to_memory_format(gi, format);
  const Window2d& win = s.win;
  const Geometry g{int(s.in.n), int(s.in.h), int(s.in.w), int(s.in.c), int(s.oh), int(s.ow), int(win.sh),
                   int(win.sw), int(win.ph), int(win.pw), int(win.dh), int(win.dw)};
  // The largest phase's positions (phase (0, 0)).
  const int64_t largest = s.in.n * ((s.in.h + win.sh - 1) / win.sh) * ((s.in.w + win.sw - 1) / win.sw);
  const dim3 grid(unsigned((largest + kTile - 1) / kTile), unsigned(s.groups / gpb), unsigned(win.sh * win.sw));
  if ((largest + kTile - 1) / kTile > 0x7fffffff) return std::nullopt;
  const auto stream = at::cuda::getCurrentCUDAStream();
  gm::dispatch(go.scalar_type(), cg, gpb, [&](auto tag, auto width, auto per_block) {
    using T = decltype(tag);
    constexpr int CG = decltype(width)::value, GPB = decltype(per_block)::value;
    grouped_mma_grad_input_kernel<T, CG, GPB><<<grid, kThreads, kSharedBytes<CG, CG * GPB>, stream>>>(
        go.const_data_ptr<T>(), w.const_data_ptr<T>(), gi.mutable_data_ptr<T>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return to_memory_format(gi, format);
}

}  // namespace customconv
