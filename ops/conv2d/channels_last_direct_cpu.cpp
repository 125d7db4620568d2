#include "ops/conv2d/channels_last_direct_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/common/cpu_simd.h"
#include "ops/common/launch.h"
#include "ops/common/parallel_cpu.h"
#include "ops/conv2d/weight_blocks_cpu.h"

namespace customconv {
namespace {

struct Geometry {
  int64_t n, c, h, w, k, p, q;  // input (n, h, w, c), output (n, p, q, k): channels_last
  Window2d win;
  int64_t block;  // output channels per weight block (B)
  int64_t kp;     // output channels padded to whole blocks
  // The positions in the order blocks take them, or null: (n, y, x) order.
  const int64_t* order;
  // conv2d_fused's epilogue, applied as a block is stored: the residual
  // (laid out like the output; null: none) added, then `act` (identity,
  // relu, relu6 or hardswish).
  const float* residual = nullptr;
  Activation act = Activation::kIdentity;
  // Positions per tile where every block of output channels runs over a tile
  // before the next tile starts (small weights; work items are then runs of
  // positions); 0: each item is one block of output channels over one run.
  int64_t tile = 0;
  // A pointwise layer (1x1, stride 1, unpadded, no order): position m reads
  // input row m, without dividing m into (n, y, x).
  bool flat = false;
  // Whole blocks of output channels stored past the caches (non-temporal
  // stores; AVX-512 build): outputs of at least kStreamedOutputBytes, whose
  // lines would otherwise be read from memory only to be overwritten.
  bool stream = false;
};

// An output position: the top-left input pixel of its window, its image, and
// its output channels (of the block being computed).
struct Origin {
  const float* img;
  int64_t iy, ix;
  float* out;
  const float* residual;  // the same output's residual, or null
};

// The epilogue of one stored vector: act(x + residual) for the activations
// that are arithmetic (activation.h's formulas; the others are not taken).
template <class V>
__attribute__((always_inline)) inline V epilogue(V x, Activation act) {
  const V zero{}, six = zero + 6.f;
  switch (act) {
    case Activation::kRelu: return x < zero ? zero : x;
    case Activation::kRelu6: return x < zero ? zero : (x > six ? six : x);
    case Activation::kHardswish: {
      const V t = x + 3.f;
      return x * (t < zero ? zero : (t > six ? six : t)) / 6.f;
    }
    default: return x;
  }
}

// P output positions x NV vectors of W output channels: P * NV accumulators,
// started from the bias. For each tap (i, j), each position's C input
// channels at that tap lie at one pointer (a row of zeros where the tap falls
// in the padding; a tap in the padding for all P is skipped); for each input
// channel c, the P values are each broadcast and multiplied by the tap's NV
// weight vectors of c, read from wt: (kh, kw, C, WS floats) with the block's
// channels first. Lanes past `valid` are not stored.
template <class V, int NV, int P, int WS>
__attribute__((always_inline)) inline void direct_block(const Geometry& g, const Origin* org,
                                                        const float* zeros, const float* wt,
                                                        const float* bias, int64_t valid) {
  constexpr int W = kLanes<V>;
  const Window2d& k = g.win;
  V acc[P][NV];
  // The residual is read only after the reduction: fetched now, its lines
  // arrive while the taps run instead of stalling the epilogue.
  for (int t = 0; t < P; ++t) {
    if (org[t].residual == nullptr) continue;
    for (int64_t e = 0; e < std::min<int64_t>(valid, NV * W); e += 16) __builtin_prefetch(org[t].residual + e);
  }
  for (int v = 0; v < NV; ++v) {
    const V b = loadv<V>(bias + v * W);
    for (int t = 0; t < P; ++t) acc[t][v] = b;
  }
  for (int64_t i = 0; i < k.kh; ++i) {
    for (int64_t j = 0; j < k.kw; ++j) {
      const float* src[P];
      bool any = false;
      for (int t = 0; t < P; ++t) {
        const int64_t iy = org[t].iy + i * k.dh, ix = org[t].ix + j * k.dw;
        const bool inside = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
        src[t] = inside ? org[t].img + (iy * g.w + ix) * g.c : zeros;
        any = any || inside;
      }
      if (!any) continue;
      const float* w = wt + (i * k.kw + j) * g.c * WS;
      for (int64_t c = 0; c < g.c; ++c) {
        V wv[NV];
        for (int v = 0; v < NV; ++v) wv[v] = loadv<V>(w + c * WS + v * W);
        for (int t = 0; t < P; ++t) {
          // (A vector times a scalar: GCC broadcasts the scalar from memory in one
          // instruction; V{} + x would add +0.0 first and broadcast a register.)
          const float b = src[t][c];
          for (int v = 0; v < NV; ++v) acc[t][v] += wv[v] * b;
        }
      }
    }
  }
  const bool fused = g.residual != nullptr || g.act != Activation::kIdentity;
  for (int t = 0; t < P; ++t) {
    float* d = org[t].out;
    if (fused) {
      // The residual read in place; only a last, partial block of channels
      // is copied first (a copy of variable length is a library call: per
      // position, it once took most of a 56x56 layer's time).
      const float* r = org[t].residual;
      if (r == nullptr) {
        for (int v = 0; v < NV; ++v) acc[t][v] = epilogue<V>(acc[t][v], g.act);
      } else if (valid >= NV * W) {
        for (int v = 0; v < NV; ++v) acc[t][v] = epilogue<V>(acc[t][v] + loadv<V>(r + v * W), g.act);
      } else {
        float res[NV * W] = {};
        std::memcpy(res, r, valid * sizeof(float));
        for (int v = 0; v < NV; ++v) acc[t][v] = epilogue<V>(acc[t][v] + loadv<V>(res + v * W), g.act);
      }
    }
    if constexpr (sizeof(V) == 64) {  // 64-byte aligned: see kStreamedOutputBytes
      if (g.stream && valid >= NV * W) {
        for (int v = 0; v < NV; ++v) {
          asm volatile("vmovntps %1, %0" : "=m"(*reinterpret_cast<V*>(d + v * W)) : "v"(acc[t][v]));
        }
        continue;
      }
    }
    store_lanes<V, NV>(d, acc[t], valid);
  }
}

// Entries [m0, m1) of the position order (g.order[e] = (n * p + y) * q + x;
// without one, e itself) for the block of output channels at k0: blocks of P
// positions, then one at a time. The output lines of the next block are
// prefetched for writing: without it, stores that miss the cache stalled the
// blocks once outputs outgrew it (1x1 C64->K256 at 56^2, N=4, one thread:
// 5.4 ms, 4.4 with it).
template <class V, int NV, int P, int WS>
__attribute__((always_inline)) inline void position_range(const Geometry& g, const float* in,
                                                          const float* zeros, const float* wt,
                                                          const float* bias, float* out,
                                                          int64_t k0, int64_t m0, int64_t m1) {
  const Window2d& k = g.win;
  const int64_t valid = std::min<int64_t>(NV * kLanes<V>, g.k - k0);
  const auto origin = [&](int64_t e) {
    if (g.flat) {
      return Origin{in + e * g.c, 0, 0, out + e * g.k + k0,
                    g.residual != nullptr ? g.residual + e * g.k + k0 : nullptr};
    }
    const int64_t m = g.order != nullptr ? g.order[e] : e;
    const int64_t x = m % g.q, r = m / g.q;
    return Origin{in + (r / g.p) * g.h * g.w * g.c, (r % g.p) * k.sh - k.ph, x * k.sw - k.pw,
                  out + m * g.k + k0, g.residual != nullptr ? g.residual + m * g.k + k0 : nullptr};
  };
  int64_t e = m0;
  for (; e + P <= m1; e += P) {
    Origin org[P];
    for (int t = 0; t < P; ++t) org[t] = origin(e + t);
    if (!g.stream && e + 2 * P <= m1) {  // the next block's output lines, for writing
      for (int t = 0; t < P; ++t) {
        const float* d = origin(e + P + t).out;
        for (int v = 0; v < NV * kLanes<V>; v += 16) __builtin_prefetch(d + v, 1, 3);
      }
    }
    direct_block<V, NV, P, WS>(g, org, zeros, wt, bias, valid);
  }
  for (; e < m1; ++e) {
    const Origin org = origin(e);
    direct_block<V, NV, 1, WS>(g, &org, zeros, wt, bias, valid);
  }
}

// The block of output channels kb (weight (kp / B, kh, kw, C, B)) over
// positions [m0, m1). (A function, not a lambda: a lambda would not inherit
// the instruction set of the forward_items build that calls it.)
template <class V, int NVMAX, int P>
__attribute__((always_inline)) inline void channel_block(const float* in, const float* wt,
                                                         const float* bias, const float* zeros,
                                                         float* out, const Geometry& g, int64_t kb,
                                                         int64_t m0, int64_t m1) {
  constexpr int W = kLanes<V>, B = NVMAX * W;
  const int64_t k0 = kb * B;
  const float* wb = wt + kb * (g.win.kh * g.win.kw * g.c * B);
  const int64_t vectors = (std::min<int64_t>(B, g.k - k0) + W - 1) / W;
  if (vectors >= NVMAX) {
    position_range<V, NVMAX, P, B>(g, in, zeros, wb, bias + k0, out, k0, m0, m1);
  } else if constexpr (NVMAX > 1) {
    switch (vectors) {
      case 1: position_range<V, 1, P, B>(g, in, zeros, wb, bias + k0, out, k0, m0, m1); break;
      case 2:
        if constexpr (NVMAX > 2) position_range<V, 2, P, B>(g, in, zeros, wb, bias + k0, out, k0, m0, m1);
        break;
      default:
        if constexpr (NVMAX > 3) position_range<V, 3, P, B>(g, in, zeros, wb, bias + k0, out, k0, m0, m1);
        break;
    }
  }
}

// Work items [i0, i1). Without g.tile: item = kb * chunks + pc, the block
// of output channels kb over the pc-th run of `chunk` positions. With it:
// item = pc, whose positions run a tile at a time through every block of
// output channels, so that each position's whole output row (and residual
// row) is written (and read) while it is in the cache.
template <class V, int NVMAX, int P>
__attribute__((always_inline)) inline void forward_items(const float* in, const float* wt,
                                                         const float* bias, const float* zeros,
                                                         float* out, const Geometry& g,
                                                         int64_t chunk, int64_t i0, int64_t i1) {
  constexpr int B = NVMAX * kLanes<V>;
  const int64_t positions = g.n * g.p * g.q;
  const int64_t chunks = (positions + chunk - 1) / chunk;
  const int64_t kblocks = g.kp / B;
  for (int64_t item = i0; item < i1; ++item) {
    if (g.tile > 0) {
      const int64_t m0 = item * chunk, m1 = std::min(positions, m0 + chunk);
      for (int64_t t0 = m0; t0 < m1; t0 += g.tile) {
        for (int64_t kb = 0; kb < kblocks; ++kb) {
          channel_block<V, NVMAX, P>(in, wt, bias, zeros, out, g, kb, t0, std::min(m1, t0 + g.tile));
        }
      }
    } else {
      const int64_t m0 = item % chunks * chunk;
      channel_block<V, NVMAX, P>(in, wt, bias, zeros, out, g, item / chunks, m0,
                                 std::min(positions, m0 + chunk));
    }
  }
  if (g.stream) asm volatile("sfence" ::: "memory");
}

// One build of forward_items per instruction set, picked at run time.
using ForwardItems = void (*)(const float*, const float*, const float*, const float*, float*,
                              const Geometry&, int64_t, int64_t, int64_t);
struct ForwardIsa {
  ForwardItems run;
  int64_t block;  // output channels per weight block
};

void forward_items_base(const float* in, const float* wt, const float* bias, const float* zeros,
                        float* out, const Geometry& g, int64_t chunk, int64_t i0, int64_t i1) {
  forward_items<Float8, 1, 4>(in, wt, bias, zeros, out, g, chunk, i0, i1);
}
#if CUSTOMCONV_CPU_ISA_BUILDS
__attribute__((target("arch=x86-64-v3"))) void forward_items_v3(
    const float* in, const float* wt, const float* bias, const float* zeros, float* out,
    const Geometry& g, int64_t chunk, int64_t i0, int64_t i1) {
  forward_items<Float8, 2, 6>(in, wt, bias, zeros, out, g, chunk, i0, i1);
}
__attribute__((target("arch=x86-64-v4"))) void forward_items_v4(
    const float* in, const float* wt, const float* bias, const float* zeros, float* out,
    const Geometry& g, int64_t chunk, int64_t i0, int64_t i1) {
  forward_items<Float16, 4, 6>(in, wt, bias, zeros, out, g, chunk, i0, i1);
}
// Layers of at most 16 output channels on AVX-512: one 16-lane vector a
// block, rather than a weight and bias padded to 64 channels.
__attribute__((target("arch=x86-64-v4"))) void forward_items_v4_narrow(
    const float* in, const float* wt, const float* bias, const float* zeros, float* out,
    const Geometry& g, int64_t chunk, int64_t i0, int64_t i1) {
  forward_items<Float16, 1, 6>(in, wt, bias, zeros, out, g, chunk, i0, i1);
}
#endif

ForwardIsa forward_isa(int64_t k) {
  switch (cpu_isa()) {
#if CUSTOMCONV_CPU_ISA_BUILDS
    case CpuIsa::kX86_64_V4:
      return k <= 16 ? ForwardIsa{&forward_items_v4_narrow, 16} : ForwardIsa{&forward_items_v4, 64};
    case CpuIsa::kX86_64_V3: return {&forward_items_v3, 16};
#endif
    default: return {&forward_items_base, 8};
  }
}

// The output positions grouped by the edges of the input their windows
// cross (none first, then top, bottom, left, right and their corners), each
// group in (n, y, x) order, so that a block of positions mostly shares the
// taps that fall in the padding and skips them; empty where no window
// crosses an edge.
std::vector<int64_t> position_order(const Conv2dShape<int64_t>& s) {
  const Window2d& k = s.win;
  const auto crossed = [](int64_t start, int64_t extent, int64_t size) {
    return (start < 0 ? 1 : 0) | (start + extent > size ? 2 : 0);
  };
  std::vector<std::vector<int64_t>> groups(16);  // one image's positions per group
  for (int64_t y = 0; y < s.oh; ++y) {
    const int rows = crossed(y * k.sh - k.ph, k.extent_h(), s.in.h);
    for (int64_t x = 0; x < s.ow; ++x) {
      groups[rows | crossed(x * k.sw - k.pw, k.extent_w(), s.in.w) << 2].push_back(y * s.ow + x);
    }
  }
  std::vector<int64_t> order;
  if (groups[0].size() == static_cast<size_t>(s.oh * s.ow)) return order;  // no edges
  order.reserve(static_cast<size_t>(s.in.n * s.oh * s.ow));
  for (const std::vector<int64_t>& group : groups) {
    for (int64_t n = 0; n < s.in.n; ++n) {
      for (const int64_t m : group) order.push_back(n * s.oh * s.ow + m);
    }
  }
  return order;
}

// Weights up to this size (every block's, in bytes) stay in a core's cache
// while a tile of kTilePositions positions runs through all their blocks.
constexpr int64_t kTiledWeightBytes = 512 << 10;
constexpr int64_t kTilePositions = 48;

// Outputs of at least this many bytes are stored past the caches (the
// AVX-512 build): a 2-core machine with 1 MiB of L2 a core and 32 MiB of L3,
// alternating the two stores within one process on 1x1 layers at 56x56:
// 64 -> 256 at N=4 and N=8 (12.8 and 25.7 MB) 1.11-1.12x faster, with a
// residual and ReLU 1.22-1.29x, 128 -> 512 at 28x28 1.14x; outputs under it
// unchanged; a whole fused ResNet-50 at N=8, 16 and 32 within +-2%, where
// the next layer then reads the output from memory rather than L3.
constexpr int64_t kStreamedOutputBytes = int64_t(8) << 20;

// channels_last_direct_cpu.h's conditions.
bool takes(const at::Tensor& input, const Conv2dShape<int64_t>& s) {
  const Window2d& w = s.win;
  if (input.device().type() != at::kCPU || input.scalar_type() != at::kFloat || !s.in.batched ||
      s.groups != 1 || s.in.c < 16) {
    return false;
  }
  return (w.kh != 1 || w.kw != 1) || input.is_contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace

std::optional<at::Tensor> channels_last_direct_conv2d_cpu(const at::Tensor& input_arg,
                                                          const at::Tensor& weight,
                                                          const std::optional<at::Tensor>& bias,
                                                          const Conv2dShape<int64_t>& s,
                                                          const ConvEpilogue* epilogue) {
  if (!takes(input_arg, s)) return std::nullopt;
  const at::MemoryFormat format = conv2d_output_format(input_arg, weight);
  const bool has_residual = epilogue != nullptr && epilogue->has_residual();
  if (epilogue != nullptr) {
    const Activation a = epilogue->activation;
    if (a != Activation::kIdentity && a != Activation::kRelu && a != Activation::kRelu6 &&
        a != Activation::kHardswish) {
      return std::nullopt;
    }
    // The residual is read where the output is written: channels_last.
    if (has_residual && (epilogue->residual.scalar_type() != at::kFloat ||
                         !epilogue->residual.is_contiguous(at::MemoryFormat::ChannelsLast))) {
      return std::nullopt;
    }
  }
  at::Tensor out = empty_channels_last(input_arg, s.in.n, s.k, s.oh, s.ow);
  if (out.numel() == 0) return out.contiguous(format);
  const at::Tensor input = input_arg.contiguous(at::MemoryFormat::ChannelsLast);
  const ForwardIsa isa = forward_isa(s.k);
  const Window2d& win = s.win;
  const int64_t b = isa.block, kp = (s.k + b - 1) / b * b;
  const at::Tensor wt = weight_blocks_cpu(weight, b);
  // The bias padded to whole blocks (a vector, not three ATen ops a call).
  std::vector<float> bp(static_cast<size_t>(kp), 0.f);
  if (bias.has_value() && bias->defined()) {
    const at::Tensor bc = bias->contiguous();
    std::copy(bc.const_data_ptr<float>(), bc.const_data_ptr<float>() + s.k, bp.begin());
  }
  const std::vector<int64_t> order = position_order(s);
  Geometry g{s.in.n, s.in.c, s.in.h, s.in.w, s.k, s.oh, s.ow, win, b, kp,
             order.empty() ? nullptr : order.data()};
  if (epilogue != nullptr) {
    g.residual = has_residual ? epilogue->residual.const_data_ptr<float>() : nullptr;
    g.act = epilogue->activation;
  }
  const std::vector<float> zeros(static_cast<size_t>(s.in.c), 0.f);
  const int64_t positions = s.in.n * s.oh * s.ow;
  const int64_t kblocks = kp / b;
  const int64_t threads = at::get_num_threads();
  const int64_t weight_bytes = wt.numel() * 4;
  if (kblocks > 1 && weight_bytes <= kTiledWeightBytes) g.tile = kTilePositions;
  g.flat = win.pointwise() && g.order == nullptr;
  // (Whole 16-float blocks of a row of 16k floats, from a 64-byte aligned
  // allocation: every streamed store is 64-byte aligned.)
  g.stream = b == 64 && s.k % 16 == 0 && out.numel() * 4 >= kStreamedOutputBytes &&
             reinterpret_cast<uintptr_t>(out.const_data_ptr()) % 64 == 0;
  // Runs of positions: about 4 items per thread, whole blocks of positions.
  const int64_t want_items = std::max<int64_t>(1, 4 * threads / (g.tile > 0 ? 1 : kblocks));
  int64_t chunk = (positions + want_items - 1) / want_items;
  chunk = (chunk + 11) / 12 * 12;
  const int64_t chunks = (positions + chunk - 1) / chunk;
  const float* ip = input.const_data_ptr<float>();
  const float* wp = wt.const_data_ptr<float>();
  const float* biasp = bp.data();
  float* op = out.mutable_data_ptr<float>();
  const int64_t work = positions * win.kh * win.kw * s.in.c * kp;
  parallel_range_sized(
      g.tile > 0 ? chunks : kblocks * chunks, 1, work,
      [&](int64_t i0, int64_t i1) { isa.run(ip, wp, biasp, zeros.data(), op, g, chunk, i0, i1); });
  return out.contiguous(format);
}

}  // namespace customconv
