#include "ops/conv2d/grouped_mma.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/common/launch.h"

namespace customconv {
namespace {

constexpr int kGroupWidth = 8;  // input and output channels per group
constexpr int kWarps = 4;       // warps per block: one group each
constexpr int kTileRows = 16;   // output positions per mma tile
constexpr int kMaxTaps = int(kGroupedMmaMaxTaps);
constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

// One call's geometry, channels_last: input (n, h, w, c), output (n, p, q, k)
// with k == c, weight (k, r, s, 8); positions = n * p * q.
struct Geometry {
  int h, w, c, p, q, s, taps;
  int sh, sw, ph, pw, dh, dw;
  int positions, tiles, groups;
};

// An output position of a tile as one thread sees it: its image (offset to
// the thread's channels), the window's top-left input pixel, and whether
// the position exists (the last tile's rows past the end do not).
template <typename T>
struct Row {
  const T* img;
  int iy, ix;
  bool ok;
};

template <typename T>
__device__ __forceinline__ Row<T> row_at(const T* in, const Geometry& g, int m, int channel) {
  const int pq = g.p * g.q;
  const int n = m / pq, rem = m - n * pq, y = rem / g.q, x = rem - y * g.q;
  return {in + int64_t(n) * g.h * g.w * g.c + channel, y * g.sh - g.ph, x * g.sw - g.pw, m < g.positions};
}

// The element at tap (dy, dx) of a row's window, as raw bits (U: 32 bits,
// the thread's two 16-bit channels or one float), zero in the padding.
template <typename U, typename T>
__device__ __forceinline__ U tap_bits(const Row<T>& r, const Geometry& g, int dy, int dx) {
  const int iy = r.iy + dy, ix = r.ix + dx;
  if (!r.ok || unsigned(iy) >= unsigned(g.h) || unsigned(ix) >= unsigned(g.w)) return 0;
  return __ldg(reinterpret_cast<const U*>(r.img + (iy * g.w + ix) * g.c));
}

__device__ __forceinline__ uint32_t to_tf32(uint32_t bits) {
  uint32_t out;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(out) : "f"(__uint_as_float(bits)));
  return out;
}

// D = A * B + D on one 16 x 8 tile: A 16 x k (row-major fragments), B k x 8.
template <typename T>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, at::Half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (std::is_same_v<T, at::BFloat16>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  (void)d, (void)a, (void)b;
  __trap();  // the host launches this only on compute capability 8.0 and newer
#endif
}

// Two results of one output position, converted and stored as one 32-bit
// (16-bit types) or 64-bit (float) word.
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float lo, float hi) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
  } else {
    const T a(lo), b(hi);
    *reinterpret_cast<uint32_t*>(dst) = uint32_t(a.x) | (uint32_t(b.x) << 16);
  }
}

// Forward. Block (x, y): kWarps warps, warp w on group y * kWarps + w, all
// of them walking the same tiles of 16 consecutive output positions (tile =
// blockIdx.x, then strided by the grid), so that between them they read
// 4 * 16 bytes (16-bit) of each input pixel they touch while it is in the
// SM's L1: one warp alone reads half of each 32-byte sector, and on layers
// larger than L2 the other half came from memory a second time. A group's 8
// output channels are the tile's 8 columns. Lane l holds rows l / 4 and
// l / 4 + 8 of the tile and, in the accumulators, output channels
// 2 * (l % 4) and + 1 (mma.sync's fragment layout). The reduction runs over
// (tap, channel):
//   16-bit, m16n8k16: a step is two taps x 8 channels; the lane's A values
//     are its rows' channels 2 * (l % 4), + 1 at both taps (two 32-bit loads
//     a row), its B values the same channels of output channel l / 4;
//   float32, m16n8k8 TF32: a step is one tap x 8 channels; the lane's A
//     values are channels l % 4 and l % 4 + 4.
// The group's B fragments for every tap are loaded once into registers;
// taps in the padding read zeros. Accumulators start from the bias.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    grouped_mma_forward_kernel(const T* __restrict__ in, const T* __restrict__ wt, const T* __restrict__ bias,
                               T* __restrict__ out, Geometry g) {
  constexpr bool k16 = !std::is_same_v<T, float>;
  constexpr int kSteps = k16 ? (kMaxTaps + 1) / 2 : kMaxTaps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane & 3, row = lane >> 2;
  const int group = blockIdx.y * kWarps + warp;
  if (group >= g.groups) return;
  const int out_channel = group * kGroupWidth + 2 * quad;
  const int in_channel = group * kGroupWidth + (k16 ? 2 * quad : quad);

  uint32_t b[kSteps][2];
  int dy[kMaxTaps], dx[kMaxTaps];
  const T* w = wt + int64_t(group * kGroupWidth + row) * g.taps * kGroupWidth;
#pragma unroll
  for (int t = 0; t < kMaxTaps; ++t) {
    dy[t] = (t / g.s) * g.dh;
    dx[t] = (t % g.s) * g.dw;
  }
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    if constexpr (k16) {
      const int t0 = 2 * st, t1 = 2 * st + 1;
      const T* w0 = w + t0 * kGroupWidth + 2 * quad;
      b[st][0] = t0 < g.taps ? __ldg(reinterpret_cast<const uint32_t*>(w0)) : 0u;
      b[st][1] = t1 < g.taps ? __ldg(reinterpret_cast<const uint32_t*>(w0 + kGroupWidth)) : 0u;
    } else {
      const T* w0 = w + st * kGroupWidth + quad;
      b[st][0] = st < g.taps ? to_tf32(__float_as_uint(__ldg(w0))) : 0u;
      b[st][1] = st < g.taps ? to_tf32(__float_as_uint(__ldg(w0 + 4))) : 0u;
    }
  }
  const float bias0 = bias != nullptr ? static_cast<float>(bias[out_channel]) : 0.f;
  const float bias1 = bias != nullptr ? static_cast<float>(bias[out_channel + 1]) : 0.f;
  const int k = g.groups * kGroupWidth;

  for (int tile = blockIdx.x; tile < g.tiles; tile += gridDim.x) {
    const int m0 = tile * kTileRows + row, m1 = m0 + 8;
    const Row<T> r0 = row_at(in, g, m0, in_channel), r1 = row_at(in, g, m1, in_channel);
    float d[4] = {bias0, bias1, bias0, bias1};
#pragma unroll
    for (int st = 0; st < kSteps; ++st) {
      uint32_t a[4];
      if constexpr (k16) {
        const int t0 = 2 * st, t1 = 2 * st + 1;
        if (t0 >= g.taps) break;
        a[0] = tap_bits<uint32_t>(r0, g, dy[t0], dx[t0]);
        a[1] = tap_bits<uint32_t>(r1, g, dy[t0], dx[t0]);
        a[2] = t1 < g.taps ? tap_bits<uint32_t>(r0, g, dy[t1], dx[t1]) : 0u;
        a[3] = t1 < g.taps ? tap_bits<uint32_t>(r1, g, dy[t1], dx[t1]) : 0u;
      } else {
        if (st >= g.taps) break;
        const Row<T> s0{r0.img + 4, r0.iy, r0.ix, r0.ok}, s1{r1.img + 4, r1.iy, r1.ix, r1.ok};
        a[0] = to_tf32(tap_bits<uint32_t>(r0, g, dy[st], dx[st]));
        a[1] = to_tf32(tap_bits<uint32_t>(r1, g, dy[st], dx[st]));
        a[2] = to_tf32(tap_bits<uint32_t>(s0, g, dy[st], dx[st]));
        a[3] = to_tf32(tap_bits<uint32_t>(s1, g, dy[st], dx[st]));
      }
      mma<T>(d, a, b[st]);
    }
    if (m0 < g.positions) store_pair(out + int64_t(m0) * k + out_channel, d[0], d[1]);
    if (m1 < g.positions) store_pair(out + int64_t(m1) * k + out_channel, d[2], d[3]);
  }
}

bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  if (!input.is_cuda() || !s.in.batched || s.groups <= 1 || s.groups >= s.in.c) return false;
  if (s.in.c != kGroupWidth * s.groups || s.k != kGroupWidth * s.groups) return false;
  const auto dtype = input.scalar_type();
  if (dtype == at::kFloat) {
    if (!at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)) return false;
  } else if (dtype != at::kHalf && dtype != at::kBFloat16) {
    return false;
  }
  const Window2d& w = s.win;
  if (w.kh * w.kw > kGroupedMmaMaxTaps || s.groups > 65535 * int64_t{kWarps}) return false;
  constexpr int64_t kIntMax = (int64_t{1} << 31) - 1;
  for (int64_t v : {s.in.n * s.in.c * s.in.h * s.in.w, s.in.n * s.k * s.oh * s.ow, w.sh, w.sw, w.ph, w.pw,
                    w.dh * w.kh, w.dw * w.kw}) {
    if (v > kIntMax) return false;
  }
  return at::cuda::getDeviceProperties(input.get_device())->major >= 8;
}

}  // namespace

std::optional<at::Tensor> grouped_mma_conv2d(const at::Tensor& input, const at::Tensor& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const Conv2dShape<int64_t>& s) {
  if (!takes(input, s)) return std::nullopt;
  const c10::cuda::CUDAGuard guard(input.device());
  const at::MemoryFormat format = conv2d_output_format(input, weight);
  const at::Tensor x = input.contiguous(kChannelsLast);
  // Pairs of 16-bit channels are read as 32-bit words.
  if (reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 4 != 0) return std::nullopt;
  const at::Tensor w = weight.contiguous(kChannelsLast);
  if (reinterpret_cast<uintptr_t>(w.const_data_ptr()) % 4 != 0) return std::nullopt;
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  at::Tensor out = empty_channels_last(input, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out.contiguous(format);
  const Window2d& win = s.win;
  Geometry g{int(s.in.h), int(s.in.w), int(s.in.c), int(s.oh), int(s.ow), int(win.kw), int(win.kh * win.kw),
             int(win.sh), int(win.sw), int(win.ph), int(win.pw), int(win.dh), int(win.dw),
             int(s.in.n * s.oh * s.ow), 0, int(s.groups)};
  g.tiles = (g.positions + kTileRows - 1) / kTileRows;
  // About 8 blocks per SM in all, each warp walking several tiles.
  const int sms = at::cuda::getDeviceProperties(input.get_device())->multiProcessorCount;
  const int64_t rows = (s.groups + kWarps - 1) / kWarps;
  const int64_t per_row = (int64_t(sms) * 8 + rows - 1) / rows;
  const dim3 grid(unsigned(std::max<int64_t>(1, std::min<int64_t>(per_row, g.tiles))), unsigned(rows));
  const auto stream = at::cuda::getCurrentCUDAStream();
  const auto launch = [&](auto tag) {
    using T = decltype(tag);
    grouped_mma_forward_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        x.const_data_ptr<T>(), w.const_data_ptr<T>(), has_bias ? b.const_data_ptr<T>() : nullptr,
        out.mutable_data_ptr<T>(), g);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  switch (x.scalar_type()) {
    case at::kHalf: launch(at::Half{}); break;
    case at::kBFloat16: launch(at::BFloat16{}); break;
    default: launch(float{}); break;
  }
  return out.contiguous(format);
}

}  // namespace customconv
