// The forward convolution as an implicit GEMM on Hopper (sm_90a): warpgroup
// MMA (wgmma) fed by TMA loads, warp-specialized and persistent; our own
// kernel behind implicit_gemm.h's fprop_sm90_f32 (implicit_gemm_wgmma_launch.cuh).
// No ATen here.
//
// The GEMM: rows are output positions (N*P*Q), columns output channels (K),
// the reduction runs over (r, s, c) in steps of one tap x 128 bytes of
// channels (64 16-bit ones, or 32 float32 ones as TF32: the tensor maps
// load float32 as TF32). A block tile's rows are a box of output positions,
// bw columns x bh rows x bn images (at most kM of them; wgmma_plan.h picks
// the box that wastes fewest rows), so that for one tap the input it reads is a box of
// the NHWC input too: bw * stride_w columns x bh * stride_h rows x bn images
// x one step of channels, read every stride-th pixel, starting at the
// output box's corner times the stride, minus the padding, plus the tap times
// the dilation. One TMA load brings it into shared memory (zeros outside the
// image), 128-byte swizzled as the warpgroup MMA reads it (wgmma.cuh); a
// second brings the weight's kN output channels x the step's channels (a 2-D
// view (K, kh*kw*C)). Neither needs registers or address arithmetic per row.
// Where boxes would leave many rows empty (planes whose rows do not fill 128,
// such as 14x14 or 30x30) and that costs a round of tiles, a tile is instead
// kM consecutive output positions in (n, p, q) order, crossing rows and
// images (Args::im2col): TMA's im2col mode loads the kM window corners'
// pixels for a tap (the tap as the load's offsets), zeros outside the image.
//
// Block: kM / 64 consumer warpgroups (one to three) and one producer warp after them. The
// producer's lane 0 sets up the stage barriers (the consumers wait for that at a
// named barrier its warp only arrives at) and walks the block's tiles (t = blockIdx.x,
// then strided by the grid, output-channel tile fastest) and their steps:
// waits for a stage to be empty, announces its bytes on the stage's "full"
// barrier and issues the two loads, which complete that barrier. Consumer
// warpgroup g waits for "full", issues the step's four m64 x kN instructions
// on rows 64g to 64g + 63 (their descriptors' low words advanced from one
// computed per block), keeps one step in flight, and arrives on the
// previous step's "empty" barrier once that step's instructions are done. A
// tile's accumulators are stored with the bias, residual and activation in
// float32, or as float32 partial sums when the reduction is split: float32
// outputs straight from registers (pairs of output channels, whole 32-byte
// sectors), 16-bit ones through shared memory as runs of 8 channels
// (stage_tile, store_staged), since their pairs fill half a sector. Meanwhile the
// producer is already loading the next tile.
//
// The pingpong variant (kPingpong; 128 x 128 tiles, where the plan has more
// tiles than multiprocessors) gives each consumer warpgroup whole tiles in
// turn (consume_pingpong), so that one's epilogue runs beside the other's
// main loop. Its producer is a whole warpgroup, which hands its registers
// to the consumers (setmaxnreg: 40 a thread for it, 232 for them). Its
// float32 tiles are stored from registers; its 16-bit ones (no residual) go
// through shared memory and out by TMA stores (tile_to_smem).
//
// Where the last round of tiles over the resident blocks fills at most half
// of them (Args::tail, wgmma_plan.h's tail_tiles), those tiles run as two
// halves of their reduction, units of their own after the whole tiles, and
// the halves' consumer warpgroups meet through a flag and float32 sums in
// global memory (join_first and after), so that the second to finish stores
// the tile.
//
// A launch may hold up to kMaxPhases sub-problems (Phase, wgmma_plan.h) that
// share the input, the weight's tensor map and the box: each its own output
// extent, window, padding, first weight column and output addressing, its
// tiles a range of the launch's. The strided input gradient runs its stride
// phases so, each writing every stride-th input position (stride_phases).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "ops/common/activation.h"
#include "ops/common/fast_divide.h"
#include "ops/common/pair_io.cuh"
#include "ops/conv2d/wgmma.cuh"
#include "ops/conv2d/wgmma_plan.h"

namespace customconv::implicit_gemm::wgmma_fprop {

constexpr int kRowBytes = 128;  // one reduction step of one row (a 128-byte swizzle row)
// The named barrier the consumers wait at for the producer's barrier set-up
// (warpgroup_sync takes 1 to 3).
constexpr int kStartBarrier = 8;

// One k16 (k8 for TF32) instruction of an m64 x 128 tile (64 accumulators a
// thread), an m64 x 64 one (32), or in TF32 an m64 x 32 one (16).
template <typename T, int kRegs>
__device__ __forceinline__ void mma_step(float (&d)[kRegs], uint64_t a, uint64_t b, int acc) {
  static_assert(kRegs == 64 || kRegs == 32 || (kRegs == 16 && std::is_same_v<T, float>),
                "m64 x 128, m64 x 64, or m64 x 32 in TF32");
  if constexpr (kRegs == 16) {
    wgmma::mma_m64n32k8_tf32(d, a, b, acc);
  } else if constexpr (kRegs == 64) {
    if constexpr (std::is_same_v<T, __half>) {
      wgmma::mma_m64n128k16_f16(d, a, b, acc);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      wgmma::mma_m64n128k16_bf16(d, a, b, acc);
    } else {
      wgmma::mma_m64n128k8_tf32(d, a, b, acc);
    }
  } else {
    if constexpr (std::is_same_v<T, __half>) {
      wgmma::mma_m64n64k16_f16(d, a, b, acc);
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      wgmma::mma_m64n64k16_bf16(d, a, b, acc);
    } else {
      wgmma::mma_m64n64k8_tf32(d, a, b, acc);
    }
  }
}

struct Args {
  void* y;  // the output: phase f's (n, oh, ow, k) at f.y0 + n * f.sn + oh * f.sh + ow * f.sw + k
  const void* bias;      // k, or null
  const void* residual;  // like y, or null
  float* partial;        // split > 1: (split, n, p, q, k) float32 partial sums, written instead of y
  int split;             // reduction slices, each a whole number of steps (one phase only)
  int n, k, c;           // images, output channels, input channels (of a group)
  // Groups (1: none). With groups, a tile's kN output channels are one
  // group's and c its input channels: output-channel tile nt reads input
  // channels nt * c to nt * c + c - 1 of the input's c * groups, and the
  // weight is (K, taps * c).
  int groups;
  int stride_h, stride_w, dilation_h, dilation_w;
  int bw, bh, bn;        // the box of output positions of a tile (bw * bh * bn <= kM)
  // 1 (one phase): a tile's rows are kM consecutive output positions in
  // (n, p, q) order, from bw * (its box index), loaded by TMA's im2col mode
  // (bw = kM, bh = bn = 1; the phase's tw = tiles of positions, th = tn = 1).
  int im2col;
  int phases;  // 1 to kMaxPhases sub-problems (wgmma_plan.h), sharing the box and the tensor maps
  int tiles;   // of all phases, one slice
  Phase ph[kMaxPhases];
  Activation activation;
  // split 1: the last `tail` tiles run as two halves of their reduction
  // each (wgmma_plan.h's tail_tiles), units tiles - tail + 2j and + 1 for
  // tile tiles - tail + j; the halves meet in `join`
  // (tail_workspace_bytes), its flags marked with this launch's `tag`.
  int tail;
  void* join;
  unsigned long long tag;
  // The input's strides in elements along w, h and n where it is not packed
  // NHWC (ConvProblem::input_strides: a packed stem's overlapping view);
  // zeros where it is. The tensor map reads through them.
  int64_t xs[3];
  // Divisions by tiles, the output-channel tiles, c, bw and bh (set_tiles).
  FastDivide div_tiles, div_n_tiles, div_c, div_bw, div_bh;
};

// The launch's units of work: its tiles, times the slices, plus the tail's
// second halves.
__device__ __forceinline__ int units_of(const Args& a) { return a.tiles * a.split + a.tail; }

// Output position m of phase f, counted in (n, p, q) order (im2col tiles).
struct Position {
  int n, oh, ow;
};
__device__ __forceinline__ Position position_of(const Phase& f, int m) {
  Position x;
  x.n = f.div_plane.div(m);
  const int in_plane = m - x.n * (f.p * f.q);
  x.oh = f.div_q.div(in_plane), x.ow = in_plane - x.oh * f.q;
  return x;
}

// The phase of tile u (of one slice).
__device__ __forceinline__ Phase phase_of(const Args& a, int u) {
  Phase f = a.ph[0];
#pragma unroll
  for (int i = 1; i < kMaxPhases; ++i) {
    if (i < a.phases && u >= a.ph[i].tiles_begin) f = a.ph[i];
  }
  return f;
}

// Unit t of a launch (slice z's tile u, or half of a tail tile): its phase,
// output-channel tile nt, box corner (ow0, oh0, n0; im2col: ow0 the first
// position), reduction steps [first, last) of kStep channels, and for a
// tail tile's half its index in the tail (`join`, else -1).
struct TileAt {
  Phase f;
  int z, nt, ow0, oh0, n0, first, last, join;

  // The output offset of the tile's row `row` (-1: outside).
  __device__ __forceinline__ int offset(const Args& a, int row) const {
    int ow, oh, nn;
    if (a.im2col) {
      const Position x = position_of(f, ow0 + row);
      nn = x.n, oh = x.oh, ow = x.ow;
    } else {
      const int across = a.div_bw.div(row), down = a.div_bh.div(across);
      ow = ow0 + row - across * a.bw, oh = oh0 + across - down * a.bh, nn = n0 + down;
    }
    return row < a.bw * a.bh * a.bn && ow < f.q && oh < f.p && nn < a.n
               ? f.y0 + nn * f.sn + oh * f.sh + ow * f.sw
               : -1;
  }
};
// kProducer: the producer's copy, on the way to a block's first loads, its
// steps' division in 32 bits. The consumers keep it in 64: computed in 32
// bits there (or with one slice made a special case), ptxas serializes the
// consumers' warpgroup MMAs ("non wgmma instructions defining accumulator
// registers of a wgmma between start and end of the pipeline stage"), which
// cost 1-14 us a layer (H200, bench/NOTES.md).
template <int kStep, bool kProducer = false>
__device__ __forceinline__ TileAt tile_at(const Args& a, int t, int n_tiles) {
  TileAt x;
  const int whole = a.tiles - a.tail;  // (tail > 0: split 1)
  int u, half = -1;
  x.join = -1;
  if (a.tail > 0 && t >= whole) {
    x.z = 0, x.join = (t - whole) >> 1, half = (t - whole) & 1, u = whole + x.join;
  } else {
    x.z = a.div_tiles.div(t), u = t - x.z * a.tiles;
  }
  x.f = phase_of(a, u);
  const int v = u - x.f.tiles_begin, box = a.div_n_tiles.div(v);
  x.nt = v - box * n_tiles;
  const int across = x.f.div_tw.div(box), down = x.f.div_th.div(across);
  x.ow0 = (box - across * x.f.tw) * a.bw, x.oh0 = (across - down * x.f.th) * a.bh,
  x.n0 = down * a.bn;
  const int all_steps = x.f.r * x.f.s * (a.c / kStep);
  // (A tail tile's half as slice `half` of two.)
  const int slice = half >= 0 ? half : x.z, slices = half >= 0 ? 2 : a.split;
  if constexpr (kProducer) {
    x.first = all_steps * slice / slices, x.last = all_steps * (slice + 1) / slices;
  } else {
    x.first = int(int64_t(all_steps) * slice / slices);
    x.last = int(int64_t(all_steps) * (slice + 1) / slices);
  }
  return x;
}

template <typename T, int kM, int kN, int kStages, bool kPingpong = false>
struct Tile {
  static constexpr int kConsumers = 2 * kM;  // threads
  // The producer: one warp after them, or (pingpong) a whole warpgroup, which
  // hands its registers to the consumers.
  static constexpr int kThreads = kConsumers + (kPingpong ? 128 : 32);
  static constexpr int kStep = kRowBytes / int(sizeof(T));
  static constexpr int kStageA = kM * kRowBytes;
  static constexpr int kStageBytes = kStageA + kN * kRowBytes;
  // 16-bit outputs of the cooperative kernel are stored through shared
  // memory (stage_tile): each consumer warpgroup's 64 x kN float32
  // accumulators, rows padded by 32 bytes so that the pair writes are free of
  // bank conflicts. The 16-bit pingpong kernel stores its tiles by TMA
  // (tile_to_smem): a buffer of kM rows x kN 16-bit channels per warpgroup.
  static constexpr bool k16 = sizeof(T) == 2;
  static constexpr bool kStaged = k16 && !kPingpong;
  static constexpr bool kTmaStore = k16 && kPingpong;
  static constexpr int kTmaTileBytes = kM * kN * 2;
  static constexpr int kEpiPitch = kN + 8;  // floats
  static constexpr int kEpiBytes =
      kStaged ? (kM / 64) * 64 * kEpiPitch * 4 : kTmaStore ? 2 * kTmaTileBytes : 0;
  // Barriers: full and empty per stage, and (pingpong) the two warpgroups'
  // turns; then a word per consumer warpgroup (join_first).
  static constexpr int kBarrierBytes = 2 * 8 * kStages + (kPingpong ? 16 : 0) + 16;
  static constexpr int kSmemBytes = kStages * kStageBytes + kEpiBytes + kBarrierBytes + 1024;
  // Warps that release a stage: every consumer warp, or one warpgroup's (pingpong).
  static constexpr int kReleasers = kPingpong ? 4 : kConsumers / 32;
  static constexpr int kRegs = kN / 2;
  static_assert(!kPingpong || (kM == 128 && kN == 128), "pingpong: tiles of 128 x 128 (consume_pingpong)");
  static_assert(kN == 128 || kN == 64 || (kN == 32 && sizeof(T) == 4),
                "the instructions are m64 x 128, m64 x 64, or m64 x 32 in TF32 (wgmma.cuh)");
  static_assert(kM == 64 || kM == 128 || kM == 192, "one to three consumer warpgroups");
  // The tail's parts of a tile (join_part): a consumer warpgroup's 64 rows
  // each, or (pingpong) a warpgroup's two 64-row blocks.
  static constexpr int kParts = kPingpong ? 2 : kM / 64;
};

// Asks for a tensor map's 128 bytes (kept with the kernel's parameters in
// memory) ahead of the first load through it.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// kM pixels x one step of channels from the window corner (w, h) of image
// n on, plus the tap's offsets (off_w, off_h), in TMA's im2col traversal.
__device__ __forceinline__ void load_im2col(uint32_t dst, const CUtensorMap* map, int c, int w,
                                            int h, int n, uint16_t off_w, uint16_t off_h,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(off_w),
      "h"(off_h)
      : "memory");
}

// Calls fn(std::integral_constant<Activation, act>{}) for the run-time
// activation act.
template <typename Fn>
__device__ __forceinline__ void with_activation(Activation act, Fn&& fn) {
  using A = Activation;
  switch (act) {
    case A::kRelu:
      return fn(std::integral_constant<A, A::kRelu>{});
    case A::kRelu6:
      return fn(std::integral_constant<A, A::kRelu6>{});
    case A::kSilu:
      return fn(std::integral_constant<A, A::kSilu>{});
    case A::kHardswish:
      return fn(std::integral_constant<A, A::kHardswish>{});
    case A::kGelu:
      return fn(std::integral_constant<A, A::kGelu>{});
    case A::kSigmoid:
      return fn(std::integral_constant<A, A::kSigmoid>{});
    case A::kIdentity:
      break;
  }
  return fn(std::integral_constant<A, A::kIdentity>{});
}

// Calls fn(activation, residual, partial), each a std::integral_constant, for
// the epilogue variant of a launch: float32 partial sums where the reduction
// is split, else the activation with or without the residual.
template <typename Fn>
__device__ __forceinline__ void with_epilogue(const Args& a, Fn&& fn) {
  using A = Activation;
  if (a.split > 1) {
    return fn(std::integral_constant<A, A::kIdentity>{}, std::false_type{}, std::true_type{});
  }
  if (a.residual != nullptr) {
    return with_activation(a.activation,
                           [&](auto act) { fn(act, std::true_type{}, std::false_type{}); });
  }
  with_activation(a.activation, [&](auto act) { fn(act, std::false_type{}, std::false_type{}); });
}

// Stores a tile's accumulators (the bias already added: add_bias) from
// registers, pairs of output channels; a thread's two rows at offs (-1
// outside): as float32 partial sums of slice z (kPartial), or with the
// residual (kResidual) and the activation. One variant per call, chosen once
// per tile, each store predicated rather than branched around: a call after
// the L2 is evicted fetches the variant's code from memory, and with the
// activation's switch and every option inlined at each of a thread's 64
// elements the epilogue came to some 10 000 instructions (about 7 us of a 35
// us layer on an H100), with the bias and a branch per column pair 430 for
// the plain variant (bench/NOTES.md).
template <typename T, int kN, Activation kAct, bool kResidual, bool kPartial>
__device__ __forceinline__ void store_tile(const Args& a, const float (&acc)[kN / 2],
                                           const int (&offs)[2], int col0, int z, int positions) {
  const int cols_left = a.k - col0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (offs[h] < 0) continue;
    const int64_t row = offs[h] + col0;
    if constexpr (kPartial) {
      float* dst = a.partial + int64_t(z) * positions * a.k + row;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        if (8 * j < cols_left) {
          *reinterpret_cast<float2*>(dst + 8 * j) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      }
    } else {
      T* dst = static_cast<T*>(a.y) + row;
      const T* res = kResidual ? static_cast<const T*>(a.residual) + row : nullptr;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) {
        if (8 * j < cols_left) {
          float lo = acc[4 * j + 2 * h], hi = acc[4 * j + 2 * h + 1];
          if constexpr (kResidual) {
            const float2 r = load_pair(res + 8 * j);
            lo += r.x, hi += r.y;
          }
          store_pair(dst + 8 * j, activate(kAct, lo), activate(kAct, hi));
        }
      }
    }
  }
}

// The bias of the thread's kN / 4 output channels (pairs 8 apart from col0),
// zeros where there is none or the reduction is split (the split-K sum adds
// it); loaded as a tile starts, so that the main loop hides the loads, and
// added to the accumulators before store_tile's variants (float32 outputs:
// 0.2-2.5 us faster on ResNet-50's 3x3 layers on an H100; 16-bit ones, which
// add it in store_staged, measured 0.5 us slower so).
template <typename T, int kN>
__device__ __forceinline__ void load_bias(const Args& a, int col0, float2 (&b)[kN / 8]) {
  const T* bias = static_cast<const T*>(a.bias);
  const bool any = bias != nullptr && a.split == 1;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    b[j] = any && col0 + 8 * j < a.k ? load_pair(bias + col0 + 8 * j) : make_float2(0.f, 0.f);
  }
}
template <int kN>
__device__ __forceinline__ void add_bias(float (&acc)[kN / 2], const float2 (&b)[kN / 8]) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[4 * j + 2 * h] += b[j].x, acc[4 * j + 2 * h + 1] += b[j].y;
  }
}

// Asks the L2 for half a row of the residual, kN / 2 channels from column
// col of the output offset row_off (-1: outside, nothing asked).
template <typename T, int kN>
__device__ __forceinline__ void prefetch_residual(const Args& a, int row_off, int col) {
  constexpr int kPerLine = 128 / int(sizeof(T)), kLines = (kN / 2 + kPerLine - 1) / kPerLine;
  if (row_off < 0) return;
  const T* p = static_cast<const T*>(a.residual) + row_off + col;
#pragma unroll
  for (int i = 0; i < kLines; ++i) {
    if (col + i * kPerLine < a.k) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p + i * kPerLine));
  }
}

// Eight consecutive values of T as floats, and back (16-bit: one 16-byte
// access; float: two).
template <typename T>
__device__ __forceinline__ void load8(const T* src, float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(src));
    T e[8];
    memcpy(e, &bits, sizeof(bits));
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = static_cast<float>(e[i]);
  }
}
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    T e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = T(v[i]);
    uint4 bits;
    memcpy(&bits, e, sizeof(bits));
    *reinterpret_cast<uint4*>(dst) = bits;
  }
}

// A consumer warpgroup's 128 threads, synchronized among themselves (named
// barrier 1 + group).
__device__ __forceinline__ void warpgroup_sync(int group) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory");
}

// The tail's halves meet (Args::tail). Each consumer warpgroup that
// computed half of a tail tile's reduction takes a ticket from its slot's
// `arrive` flag (join_first): the first to arrive writes its float32
// accumulators to the slot's parts (join_put: thread t's registers 4j to 4j
// + 3 as float4 j * 128 + t, so that a warp writes whole lines) and marks
// the slot `ready` (join_publish), and is done with the tile; the second,
// whose partner is then certainly running, waits for `ready` (join_wait),
// adds the parts to its own accumulators (join_add) and stores the tile. With
// two halves the sum is the same whichever arrives first. The flags hold the
// launch's tag while in use and are cleared by the second, so that the next
// launch on the same memory (a CUDA graph replayed) starts clean.
// Slot s (kJoinSlots a tail tile: one a consumer warpgroup, or one a tile
// in the pingpong kernel): flags at join + 16 s; part p (a warpgroup's
// kRegs accumulators a thread for 64 rows) after the tail's slots.
__device__ __forceinline__ unsigned long long* join_flags(const Args& a, int slot) {
  return static_cast<unsigned long long*>(a.join) + 2 * slot;
}
template <int kRegs>
__device__ __forceinline__ float4* join_part(const Args& a, int part) {
  return reinterpret_cast<float4*>(static_cast<char*>(a.join) + int64_t(a.tail) * kJoinSlots * 16) +
         int64_t(part) * 128 * (kRegs / 4) + (threadIdx.x & 127);
}
__device__ __forceinline__ bool join_first(const Args& a, int slot, volatile int* word, int group) {
  if ((threadIdx.x & 127) == 0) *word = atomicExch(join_flags(a, slot), a.tag) != a.tag;
  warpgroup_sync(group);
  const bool first = *word != 0;
  warpgroup_sync(group);  // read by all before the next tile's ticket
  return first;
}
template <int kRegs>
__device__ __forceinline__ void join_put(const Args& a, int part, const float (&acc)[kRegs]) {
  float4* dst = join_part<kRegs>(a, part);
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j)
    __stcg(dst + 128 * j, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
}
__device__ __forceinline__ void join_publish(const Args& a, int slot, int group) {
  __threadfence();
  warpgroup_sync(group);
  if ((threadIdx.x & 127) == 0) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;\n" ::"l"(join_flags(a, slot) + 1), "l"(a.tag)
                 : "memory");
  }
}
__device__ __forceinline__ void join_wait(const Args& a, int slot, int group) {
  if ((threadIdx.x & 127) == 0) {
    unsigned long long* flags = join_flags(a, slot);
    for (;;) {
      unsigned long long v;
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(v) : "l"(flags + 1) : "memory");
      if (v == a.tag) break;
      __nanosleep(64);
    }
    // Nothing else of this launch touches the slot again.
    volatile unsigned long long* clear = flags;
    clear[0] = 0, clear[1] = 0;
  }
  warpgroup_sync(group);
}
template <int kRegs>
__device__ __forceinline__ void join_add(const Args& a, int part, float (&acc)[kRegs]) {
  const float4* src = join_part<kRegs>(a, part);
#pragma unroll
  for (int j = 0; j < kRegs / 4; ++j) {
    const float4 v = __ldcg(src + 128 * j);
    acc[4 * j] += v.x, acc[4 * j + 1] += v.y, acc[4 * j + 2] += v.z, acc[4 * j + 3] += v.w;
  }
}

// 16-bit outputs go through shared memory in two parts, so that the variant
// code each tile runs stays short (cold, it is fetched from memory: see
// store_tile). stage_tile, one for all variants: each thread of a consumer
// warpgroup writes its accumulator pairs to the staging rows `buf` (kN + 8
// floats apart), and thread t < 64 writes row t's output offset (`row_off`,
// -1: outside) into the row's padding. store_staged, per variant: thread t
// reads back channels 8 (t % (kN / 8)) to + 7 of rows t / (kN / 8) + 8i (kN
// = 128: 16 threads a row, 8 rows a pass) and stores them as one 16-byte
// (float: two) access, so that a warp writes two whole 256-byte rows of
// 16-bit output: as float32 partial sums of slice z (kPartial), or with the
// bias, the residual (kResidual) and the activation. On an H200, float16, 256
// channels at 56x56, N=32: 7% faster than pairs stored from registers, which
// write half of each 32-byte sector (bench/NOTES.md).
template <int kN>
__device__ __forceinline__ void stage_tile(const float (&acc)[kN / 2], float* buf, int group,
                                           int row_off) {
  constexpr int kPitch = kN + 8;
  const int t = threadIdx.x & 127, warp = t >> 5, lane = t & 31;
  warpgroup_sync(group);  // the previous tile's reads of buf are done
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + (lane >> 2) + 8 * h, col = 8 * j + 2 * (lane & 3);
      *reinterpret_cast<float2*>(buf + row * kPitch + col) =
          make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
  if (t < 64) buf[t * kPitch + kN] = __int_as_float(row_off);
  warpgroup_sync(group);
}

template <typename T, int kN, Activation kAct, bool kResidual, bool kPartial>
__device__ __forceinline__ void store_staged(const Args& a, const float* buf, int col_tile, int z,
                                             int positions) {
  constexpr int kPitch = kN + 8, kChunks = kN / 8, kRowsPerPass = 128 / kChunks;
  const int t = threadIdx.x & 127;
  const int chunk = t % kChunks, col = col_tile + 8 * chunk;
  if (col >= a.k) return;
  float b[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (!kPartial && a.bias != nullptr) load8(static_cast<const T*>(a.bias) + col, b);
#pragma unroll 2
  for (int i = 0; i < 64 / kRowsPerPass; ++i) {
    const float* src_row = buf + (t / kChunks + kRowsPerPass * i) * kPitch;
    const int o = __float_as_int(src_row[kN]);
    if (o < 0) continue;
    const float4* src = reinterpret_cast<const float4*>(src_row + 8 * chunk);
    const float4 lo = src[0], hi = src[1];
    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    if constexpr (kPartial) {
      store8(a.partial + int64_t(z) * positions * a.k + o + col, v);
    } else {
      if constexpr (kResidual) {
        float r[8];
        load8(static_cast<const T*>(a.residual) + o + col, r);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += r[e];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = activate(kAct, v[e] + b[e]);
      store8(static_cast<T*>(a.y) + o + col, v);
    }
  }
}

// TMA stores of the 16-bit pingpong kernel's tiles (consume_pingpong): a
// warpgroup writes its tile's rows, the bias and the activation applied in
// registers, to its buffer in shared memory as kN / 64 column blocks of kM
// rows x 128 bytes (64 channels), 128-byte swizzled as the output's map
// (make_output_map) reads them: 16-byte chunk c of row r at chunk c ^ (r %
// 8), so that a warp's pair writes (8 rows x 4 lanes) meet 32 different
// banks. One thread then stores each block with one TMA instruction, which
// returns at once: the copy engine writes whole lines while the warpgroup
// waits for its next turn, and its buffer is written again only once those
// stores have read it. (Pairs stored from registers write half of each
// 32-byte sector, and their stores cost the pingpong kernel more than the
// overlap saved: bench/NOTES.md.)
__device__ __forceinline__ void store_box_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void store_box_2d(const CUtensorMap* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most kLeft committed store groups are still reading shared memory.
template <int kLeft>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kLeft) : "memory");
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Makes this thread's shared-memory writes visible to the TMA unit.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A thread's part of the tile (rows row0 and row0 + 8 of the tile, pairs of
// channels 8 apart from col0 of the output) into the swizzled buffer
// `tile` with the activation; the bias is already in acc.
template <typename T, int kM, int kN, Activation kAct>
__device__ __forceinline__ void tile_to_smem(const float (&acc)[kN / 2], uint8_t* tile, int row0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    uint8_t* line = tile + row * kRowBytes + 4 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      const T pair[2] = {T(activate(kAct, acc[4 * j + 2 * h])), T(activate(kAct, acc[4 * j + 2 * h + 1]))};
      uint32_t bits;
      memcpy(&bits, pair, sizeof(bits));
      *reinterpret_cast<uint32_t*>(line + (j / 8) * (kM * kRowBytes) + (((j % 8) ^ (row & 7)) << 4)) =
          bits;
    }
  }
}

// The consumers of the pingpong kernel (fprop_tma_kernel<..., true>):
// the block's i-th tile belongs to warpgroup i % 2, which computes all of its
// 128 rows (two m64 x 128 instructions a 32-byte slice of the step, acc0 on
// rows 0-63 and acc1 on 64-127). The warpgroups take turns on the main loop:
// warpgroup g starts tile i's once the other has issued all of tile i - 1's
// (its "turn" barrier, one arrival a warp), so the stages are consumed in the
// order the producer fills them, and a warpgroup's wait on a stage's "full"
// barrier is never more than one phase ahead of it. Each warpgroup walks
// every tile of the block to count the other's steps (`it`, the stage ring's
// position). A tile's epilogue (float32: store_tile's variants, from
// registers, once per 64-row block; 16-bit: tile_to_smem into the
// warpgroup's buffer `epi` + group * kTmaTileBytes, then TMA stores of the
// output's map `ymap` by its first thread) runs while the other warpgroup's
// main loop does.
template <typename T, int kM, int kN, int kStages>
__device__ __forceinline__ void consume_pingpong(const Args& a, const CUtensorMap* ymap,
                                                 uint8_t* epi, int* join_words, uint32_t base,
                                                 uint32_t full, uint32_t empty) {
  using Cfg = Tile<T, kM, kN, kStages, true>;
  const int tid = threadIdx.x, group = tid / 128, lane = tid & 31, warp = (tid & 127) >> 5;
  const uint32_t my_turn = empty + 8u * kStages + 8u * group;
  const uint32_t next_turn = empty + 8u * kStages + 8u * (1 - group);
  const int n_tiles = (a.k + kN - 1) / kN;
  const int tiles = units_of(a);
  const uint32_t a_lo0 = wgmma::desc_lo(base),
                 a_lo1 = wgmma::desc_lo(base + uint32_t(64 * kRowBytes));
  const uint32_t b_lo = wgmma::desc_lo(base + uint32_t(Cfg::kStageA));
  int it = 0, turns = 0;  // the stage ring's position; this warpgroup's tiles so far
  float acc0[Cfg::kRegs], acc1[Cfg::kRegs];
  int i = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++i) {
    const TileAt ti = tile_at<Cfg::kStep>(a, t, n_tiles);
    if ((i & 1) != group) {  // the other warpgroup's tile
      it += ti.last - ti.first;
      continue;
    }
    // The thread's four rows' output offsets (two in each 64-row block; -1:
    // outside), computed now so that the phase and the box are not held in
    // registers through the main loop.
    int offs[4];
#pragma unroll
    for (int h = 0; h < 4; ++h)
      offs[h] = ti.offset(a, 64 * (h / 2) + warp * 16 + (lane >> 2) + 8 * (h % 2));
    const int positions = a.n * ti.f.p * ti.f.q;  // (split > 1: one phase, packed)
    const int z = ti.z, nt = ti.nt, first = ti.first, last = ti.last, join = ti.join;
    if (a.residual != nullptr && a.split == 1) {
      const int row_off = ti.offset(a, tid & 127);
      prefetch_residual<T, kN>(a, row_off, nt * kN);
      prefetch_residual<T, kN>(a, row_off, nt * kN + kN / 2);
    }
#pragma unroll
    for (int r = 0; r < Cfg::kRegs; ++r) acc0[r] = 0.f, acc1[r] = 0.f;
    // Warpgroup 0's first tile starts at once; every other tile waits for the
    // other warpgroup to have issued the previous tile's main loop.
    if (i > 0) wgmma::barrier_wait(my_turn, (group == 0 ? turns - 1 : turns) & 1);
    for (int step = first; step < last; ++step, ++it) {
      const int st = it % kStages;
      wgmma::barrier_wait(full + 8u * st, (it / kStages) & 1);
      const uint32_t at0 = a_lo0 + uint32_t(st * (Cfg::kStageBytes >> 4));
      const uint32_t at1 = a_lo1 + uint32_t(st * (Cfg::kStageBytes >> 4));
      const uint32_t bt = b_lo + uint32_t(st * (Cfg::kStageBytes >> 4));
      wgmma::fence_operands(acc0);
      wgmma::fence_operands(acc1);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        mma_step<T>(acc0, wgmma::desc_of(at0 + 2 * kk), wgmma::desc_of(bt + 2 * kk), 1);
        mma_step<T>(acc1, wgmma::desc_of(at1 + 2 * kk), wgmma::desc_of(bt + 2 * kk), 1);
      }
      wgmma::commit();
      wgmma::wait<1>();
      wgmma::fence_operands(acc0);
      wgmma::fence_operands(acc1);
      if (step > first && lane == 0)
        wgmma::barrier_arrive(empty + 8u * ((it + kStages - 1) % kStages));
    }
    // This tile's stages are all waited on: the other warpgroup's turn.
    if (lane == 0) wgmma::barrier_arrive(next_turn);
    ++turns;
    wgmma::wait<0>();
    wgmma::fence_operands(acc0);
    wgmma::fence_operands(acc1);
    if (last > first && lane == 0)
      wgmma::barrier_arrive(empty + 8u * ((it + kStages - 1) % kStages));
    if (join >= 0) {  // half of a tail tile: its rows 0-63 in part 2 join, 64-127 in the next
      const int slot = kJoinSlots * join, part = Cfg::kParts * join;
      if (join_first(a, slot, join_words + group, group)) {
        join_put<Cfg::kRegs>(a, part, acc0);
        join_put<Cfg::kRegs>(a, part + 1, acc1);
        join_publish(a, slot, group);
        continue;
      }
      join_wait(a, slot, group);
      join_add<Cfg::kRegs>(a, part, acc0);
      join_add<Cfg::kRegs>(a, part + 1, acc1);
    }
    float2 bias[kN / 8];
    load_bias<T, kN>(a, nt * kN + 2 * (lane & 3), bias);
    add_bias<kN>(acc0, bias);
    add_bias<kN>(acc1, bias);
    const int col0 = nt * kN + 2 * (lane & 3);
    if constexpr (Cfg::kTmaStore) {  // 16-bit: the warpgroup's tile by TMA stores
      uint8_t* tile = epi + group * Cfg::kTmaTileBytes;
      const bool issuer = (tid & 127) == 0;
      if (issuer) bulk_wait_read<0>();  // its previous tile's stores have read the buffer
      warpgroup_sync(group);
      const int row0 = warp * 16 + (lane >> 2);
      with_activation(a.activation, [&](auto act) {
        tile_to_smem<T, kM, kN, decltype(act)::value>(acc0, tile, row0);
        tile_to_smem<T, kM, kN, decltype(act)::value>(acc1, tile, row0 + 64);
      });
      fence_async_shared();
      warpgroup_sync(group);
      if (issuer) {
        const TileAt at = tile_at<Cfg::kStep>(a, t, n_tiles);
        const uint32_t src = base + uint32_t(kStages * Cfg::kStageBytes + group * Cfg::kTmaTileBytes);
#pragma unroll
        for (int b = 0; b < kN / 64; ++b) {
          const uint32_t block = src + uint32_t(b * kM * kRowBytes);
          if (a.im2col) {
            store_box_2d(ymap, block, nt * kN + 64 * b, at.ow0);
          } else {
            store_box_4d(ymap, block, nt * kN + 64 * b, at.ow0, at.oh0, at.n0);
          }
        }
        bulk_commit();
      }
    } else {
      // One copy of the variants' code for both 64-row blocks: the second's
      // accumulators are moved into the first's once it is stored.
#pragma unroll 1
      for (int b = 0; b < 2; ++b) {
        const int rows[2] = {b == 0 ? offs[0] : offs[2], b == 0 ? offs[1] : offs[3]};
        with_epilogue(a, [&](auto act, auto residual, auto partial) {
          store_tile<T, kN, decltype(act)::value, decltype(residual)::value,
                     decltype(partial)::value>(a, acc0, rows, col0, z, positions);
        });
        if (b == 0) {
#pragma unroll
          for (int r = 0; r < Cfg::kRegs; ++r) acc0[r] = acc1[r];
        }
      }
    }
  }
  // The last tile's stores are done before the block's shared memory goes.
  if constexpr (Cfg::kTmaStore) {
    if ((tid & 127) == 0) bulk_wait_all();
  }
}

// Requires: c a multiple of Tile::kStep, k of 8, the maps of make_maps below,
// Tile::kSmemBytes of dynamic shared memory, any number of blocks.
template <typename T, int kM, int kN, int kStages, bool kPingpong = false>
__global__ void __launch_bounds__(Tile<T, kM, kN, kStages, kPingpong>::kThreads, kN <= 64 ? 2 : 1)
    fprop_tma_kernel(const __grid_constant__ CUtensorMap xmap,
                     const __grid_constant__ CUtensorMap wmap,
                     const __grid_constant__ CUtensorMap ymap, const Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Tile<T, kM, kN, kStages, kPingpong>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t full = base + uint32_t(kStages * Cfg::kStageBytes + Cfg::kEpiBytes);
  const uint32_t empty = full + 8u * kStages;
  const int tid = threadIdx.x;
  // The producer's thread asks for its tensor maps and sets up the barriers;
  // its warp (warpgroup) then only arrives at the block's start barrier,
  // where the consumers wait, so that its first loads need not wait for every
  // consumer warp to have started.
  if (tid == Cfg::kConsumers) {
    prefetch_map(&xmap);
    prefetch_map(&wmap);
    for (int i = 0; i < kStages; ++i) {
      wgmma::barrier_init(full + 8u * i, 1);
      wgmma::barrier_init(empty + 8u * i, Cfg::kReleasers);
    }
    if constexpr (kPingpong) {
      wgmma::barrier_init(empty + 8u * kStages, 4);      // warpgroup 0's turn
      wgmma::barrier_init(empty + 8u * kStages + 8, 4);  // warpgroup 1's turn
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }

  const int n_tiles = (a.k + kN - 1) / kN;
  const int tiles = units_of(a);
  int* join_words = reinterpret_cast<int*>(smem_raw + (full - raw) + 16 * kStages + (kPingpong ? 16 : 0));

  if (tid >= Cfg::kConsumers) {  // the producer: one thread
    __syncwarp();
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kStartBarrier), "n"(Cfg::kThreads) : "memory");
    // (Pingpong: 40 registers a thread for the producer warpgroup, 232 for the consumers.)
    if constexpr (kPingpong) wgmma::release_registers<40>();
    if (tid != Cfg::kConsumers) return;
    const uint32_t bytes = uint32_t(a.bw * a.bh * a.bn * kRowBytes + kN * kRowBytes);
    int it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileAt ti = tile_at<Cfg::kStep, true>(a, t, n_tiles);
      const Phase& f = ti.f;
      const int nt = ti.nt, n0 = ti.n0, first = ti.first, last = ti.last;
      int w0 = ti.ow0 * a.stride_w - f.pad_w, h0 = ti.oh0 * a.stride_h - f.pad_h, img = n0;
      if (a.im2col) {  // the first position's window corner
        const Position x = position_of(f, ti.ow0);
        img = x.n, w0 = x.ow * a.stride_w - f.pad_w, h0 = x.oh * a.stride_h - f.pad_h;
      }
      const int c0 = first * Cfg::kStep;  // the first step's column of the (taps x c) reduction
      const int tap = a.div_c.div(c0);
      int lc = c0 - tap * a.c;
      int lr = f.div_s.div(tap), ls = tap - lr * f.s;
      const int w_col0 = f.tap0 * a.c;  // the phase's first weight column
      const int c_group = a.groups > 1 ? nt * a.c : 0;  // the tile's group's first input channel
      // Not unrolled: a call after the L2 is evicted fetches the code it runs
      // from memory, and at four steps a pass this loop was 16 KB of it.
#pragma unroll 1
      for (int step = first; step < last; ++step, ++it) {
        const int st = it % kStages;
        wgmma::barrier_wait(empty + 8u * st, ((it / kStages) & 1) ^ 1);
        const uint32_t bar = full + 8u * st;
        expect_bytes(bar, bytes);
        const uint32_t sa = base + uint32_t(st * Cfg::kStageBytes);
        if (a.im2col) {
          load_im2col(sa, &xmap, c_group + lc, w0, h0, img, uint16_t(ls * a.dilation_w),
                      uint16_t(lr * a.dilation_h), bar);
        } else {
          load_4d(sa, &xmap, c_group + lc, w0 + ls * a.dilation_w, h0 + lr * a.dilation_h, n0, bar);
        }
        load_2d(sa + uint32_t(Cfg::kStageA), &wmap, w_col0 + step * Cfg::kStep, nt * kN, bar);
        lc += Cfg::kStep;
        if (lc == a.c) {
          lc = 0;
          if (++ls == f.s) ls = 0, ++lr;
        }
      }
    }
    return;
  }
  asm volatile("bar.sync %0, %1;\n" ::"n"(kStartBarrier), "n"(Cfg::kThreads) : "memory");

  if constexpr (kPingpong) {
    wgmma::claim_registers<232>();
    consume_pingpong<T, kM, kN, kStages>(
        a, &ymap, smem_raw + (base - raw) + kStages * Cfg::kStageBytes, join_words, base, full, empty);
    return;
  }

  // Consumers.
  const int group = tid / 128, lane = tid & 31;
  const uint32_t a_lo = wgmma::desc_lo(base + uint32_t(group * 64 * kRowBytes));
  const uint32_t b_lo = wgmma::desc_lo(base + uint32_t(Cfg::kStageA));
  int it = 0;
  float acc[Cfg::kRegs];
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    const TileAt ti = tile_at<Cfg::kStep>(a, t, n_tiles);
    const Phase& f = ti.f;
    const int z = ti.z, nt = ti.nt, first = ti.first, last = ti.last, join = ti.join;
    const auto offset = [&](int row) { return ti.offset(a, row); };
    // The residual's rows of the tile, asked of the L2 now so that the
    // epilogue does not wait for memory.
    if (a.residual != nullptr && a.split == 1) {
      prefetch_residual<T, kN>(a, offset(group * 64 + (tid & 63)), nt * kN + (tid & 64 ? kN / 2 : 0));
    }
#pragma unroll
    for (int i = 0; i < Cfg::kRegs; ++i) acc[i] = 0.f;
    float2 bias[kN / 8];  // (16-bit: added by store_staged)
    if constexpr (!Cfg::kStaged) load_bias<T, kN>(a, nt * kN + 2 * (lane & 3), bias);
    for (int step = first; step < last; ++step, ++it) {
      const int st = it % kStages;
      wgmma::barrier_wait(full + 8u * st, (it / kStages) & 1);
      // The descriptors' low words (start address / 16 and the leading
      // offset) move with the stage and the 32-byte step; the high word is fixed.
      const uint32_t at = a_lo + uint32_t(st * (Cfg::kStageBytes >> 4));
      const uint32_t bt = b_lo + uint32_t(st * (Cfg::kStageBytes >> 4));
      wgmma::fence_operands(acc);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        mma_step<T>(acc, wgmma::desc_of(at + 2 * kk), wgmma::desc_of(bt + 2 * kk), 1);
      }
      wgmma::commit();
      wgmma::wait<1>();
      wgmma::fence_operands(acc);
      // The previous step's instructions are done: its stage may be refilled.
      if (step > first && lane == 0) wgmma::barrier_arrive(empty + 8u * ((it + kStages - 1) % kStages));
    }
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
    if (last > first && lane == 0) wgmma::barrier_arrive(empty + 8u * ((it + kStages - 1) % kStages));
    if (join >= 0) {  // half of a tail tile: the warpgroup's rows in its part
      const int slot = kJoinSlots * join + group, part = Cfg::kParts * join + group;
      if (join_first(a, slot, join_words + group, group)) {
        join_put<Cfg::kRegs>(a, part, acc);
        join_publish(a, slot, group);
        continue;
      }
      join_wait(a, slot, group);
      join_add<Cfg::kRegs>(a, part, acc);
    }
    if constexpr (!Cfg::kStaged) add_bias<kN>(acc, bias);

    const int positions = a.n * f.p * f.q;  // (split > 1: one phase, packed)
    // The variant's arguments are computed once, outside the variants.
#define CUSTOMCONV_VARIANT decltype(act)::value, decltype(residual)::value, decltype(partial)::value
    if constexpr (Cfg::kStaged) {
      float* buf = reinterpret_cast<float*>(smem_raw + (base - raw) + kStages * Cfg::kStageBytes) +
                   group * 64 * Cfg::kEpiPitch;
      stage_tile<kN>(acc, buf, group, offset(group * 64 + (tid & 63)));
      const int col0 = nt * kN;
      with_epilogue(a, [&](auto act, auto residual, auto partial) {
        store_staged<T, kN, CUSTOMCONV_VARIANT>(a, buf, col0, z, positions);
      });
    } else {
      const int warp = (tid & 127) >> 5;
      int offs[2];  // the thread's two rows' output offsets (-1: outside)
#pragma unroll
      for (int h = 0; h < 2; ++h) offs[h] = offset(group * 64 + warp * 16 + (lane >> 2) + 8 * h);
      const int col0 = nt * kN + 2 * (lane & 3);
      with_epilogue(a, [&](auto act, auto residual, auto partial) {
        store_tile<T, kN, CUSTOMCONV_VARIANT>(a, acc, offs, col0, z, positions);
      });
    }
#undef CUSTOMCONV_VARIANT
  }
#endif
}

// ---------------------------------------------------------------- host side

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

using EncodeIm2col = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                  const cuuint64_t*, const cuuint64_t*, const int*, const int*,
                                  cuuint32_t, cuuint32_t, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion,
                                  CUtensorMapFloatOOBfill);

// The driver's entry point `name` (null where the driver lacks it); the
// encoders below look theirs up once.
inline void* driver_entry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
// The driver's tensor-map encoders.
inline EncodeTiled encoder() {
  static const EncodeTiled fn =
      reinterpret_cast<EncodeTiled>(driver_entry("cuTensorMapEncodeTiled"));
  return fn;
}
inline EncodeIm2col im2col_encoder() {
  static const EncodeIm2col fn =
      reinterpret_cast<EncodeIm2col>(driver_entry("cuTensorMapEncodeIm2col"));
  return fn;
}

template <typename T>
constexpr CUtensorMapDataType map_type() {
  if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else return CU_TENSOR_MAP_DATA_TYPE_TFLOAT32;
}

// The input's map (a box of the tile's pixels for one step, read every
// stride-th pixel; with a.im2col, kM window corners in im2col traversal;
// through a.xs where set; c * a.groups channels) and the weight's (kN output
// channels x one step of its taps * c columns); false where the driver
// refuses them.
template <typename T, int kN>
bool make_maps(CUtensorMap* xmap, CUtensorMap* wmap, const void* x, const void* w, int n, int h, int wd, int c,
               int k, int taps, const Args& a) {
  const EncodeTiled encode = encoder();
  if (encode == nullptr) return false;
  constexpr int kStep = kRowBytes / int(sizeof(T));
  const cuuint64_t es = sizeof(T);
  const cuuint64_t xc = cuuint64_t(c) * (a.groups > 1 ? a.groups : 1);
  const cuuint64_t xdims[4] = {xc, cuuint64_t(wd), cuuint64_t(h), cuuint64_t(n)};
  const bool packed = a.xs[0] == 0;
  const cuuint64_t xstrides[3] = {packed ? xc * es : cuuint64_t(a.xs[0]) * es,
                                  packed ? cuuint64_t(wd) * xc * es : cuuint64_t(a.xs[1]) * es,
                                  packed ? cuuint64_t(h) * wd * xc * es : cuuint64_t(a.xs[2]) * es};
  const cuuint32_t xstep[4] = {1, cuuint32_t(a.stride_w), cuuint32_t(a.stride_h), 1};
  if (a.im2col) {
    // The window corners the output positions start from: -pad to the last
    // corner whose window ends inside the padded plane, (w, h) order.
    const EncodeIm2col encode_im2col = im2col_encoder();
    const Phase& f = a.ph[0];
    const int lower[2] = {-f.pad_w, -f.pad_h};
    const int upper[2] = {f.pad_w - (f.s - 1) * a.dilation_w, f.pad_h - (f.r - 1) * a.dilation_h};
    if (encode_im2col == nullptr ||
        encode_im2col(xmap, map_type<T>(), 4, const_cast<void*>(x), xdims, xstrides, lower, upper,
                      cuuint32_t(kStep), cuuint32_t(a.bw), xstep, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return false;
    }
  } else {
    const cuuint32_t xbox[4] = {cuuint32_t(kStep), cuuint32_t(a.bw * a.stride_w),
                                cuuint32_t(a.bh * a.stride_h), cuuint32_t(a.bn)};
    if (encode(xmap, map_type<T>(), 4, const_cast<void*>(x), xdims, xstrides, xbox, xstep,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      return false;
    }
  }
  const cuuint64_t wdims[2] = {cuuint64_t(taps) * c, cuuint64_t(k)};
  const cuuint64_t wstrides[1] = {cuuint64_t(taps) * c * es};
  const cuuint32_t wbox[2] = {cuuint32_t(kStep), cuuint32_t(kN)};
  const cuuint32_t wstep[2] = {1, 1};
  return encode(wmap, map_type<T>(), 2, const_cast<void*>(w), wdims, wstrides, wbox, wstep,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The output's map for the 16-bit pingpong kernel's TMA stores (one phase,
// packed NHWC output): 64 channels x a tile's box of positions (bw x bh x bn), or with
// a.im2col 64 channels x kM consecutive positions of the (n p q, k) matrix,
// 128-byte swizzled as tile_to_smem writes them; false where the driver
// refuses it.
template <typename T, int kM>
bool make_output_map(CUtensorMap* ymap, void* y, const Args& a) {
  const EncodeTiled encode = encoder();
  if (encode == nullptr) return false;
  const Phase& f = a.ph[0];
  const cuuint64_t es = sizeof(T);
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  if (a.im2col) {
    const cuuint64_t dims[2] = {cuuint64_t(a.k), cuuint64_t(a.n) * f.p * f.q};
    const cuuint64_t strides[1] = {a.k * es};
    const cuuint32_t box[2] = {64, cuuint32_t(kM)};
    return encode(ymap, map_type<T>(), 2, y, dims, strides, box, ones,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }
  const cuuint64_t dims[4] = {cuuint64_t(a.k), cuuint64_t(f.q), cuuint64_t(f.p), cuuint64_t(a.n)};
  const cuuint64_t strides[3] = {a.k * es, cuuint64_t(f.q) * a.k * es,
                                 cuuint64_t(f.p) * f.q * a.k * es};
  const cuuint32_t box[4] = {64, cuuint32_t(a.bw), cuuint32_t(a.bh), cuuint32_t(a.bn)};
  return encode(ymap, map_type<T>(), 4, y, dims, strides, box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace customconv::implicit_gemm::wgmma_fprop
