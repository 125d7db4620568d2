// The forward convolution as an implicit GEMM on Hopper's warpgroup MMA
// (wgmma, sm_90a): our own kernel, behind implicit_gemm.h's fprop_sm90_*.
// No ATen here, so that the kernel also builds on its own.
//
// The GEMM: rows are output positions (N*P*Q), columns output channels (K),
// the reduction runs over (r, s, c) in steps of one tap x 128 bytes of
// channels (64 16-bit ones, or 32 float32 ones as TF32): the NHWC input,
// KRSC weight and NPQK output are read and written in place.
//
// A block of 256 threads (two warpgroups) computes 128 positions x kN output
// channels (kN 64 or 128); warpgroup g takes the positions 64g to 64g + 63,
// all kN channels, as wgmma m64 x kN instructions whose operands both sit in
// shared memory. kStages steps are staged (128-byte swizzled rows, wgmma.cuh),
// filled by cp.async: thread t copies 16-byte chunk t % 8 of rows t / 8 + 32i
// of both operand tiles, an input row being the step's tap of its position
// (zeros outside the image), a weight row the step's slice of its output
// channel. Each step waits for its stage (a block-wide barrier), issues its
// four instructions, starts the copies of the step kStages - 2 ahead into the
// stage that the step before last read, then waits for the previous step's
// instructions (one step's instructions stay in flight).
//
// Epilogue: the accumulators go through shared memory (float32), then thread
// t writes 8 consecutive output channels of a position at a time (16-byte
// stores), after adding the bias, the residual (same layout as the output)
// and the activation, in float32, rounding once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/common/activation.h"
#include "ops/common/async_copy.cuh"
#include "ops/conv2d/wgmma.cuh"

namespace customconv::implicit_gemm::wgmma_fprop {

// What the kernel reads; sizes int32 (the launcher checks that they fit).
struct Args {
  const void* x;         // (n, h, w, c)
  const void* weight;    // (k, r, s, c)
  void* y;               // (n, p, q, k)
  const void* bias;      // k, or null
  const void* residual;  // like y, or null
  float* partial;        // split > 1: (split, n, p, q, k) float32 partial sums, written instead of y
  int split;             // reduction slices (gridDim.z), each a whole number of steps
  int n, h, w, c, k, r, s, p, q;
  int pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  Activation activation;
};

constexpr int kRowBytes = 128;  // one reduction step of one row

// kM positions (64 or 128: one warpgroup per 64) x kN output channels per block.
template <typename T, int kM, int kN, int kStages>
struct Tile {
  static constexpr int kThreads = 2 * kM;
  static constexpr int kRowStep = kThreads / 8;  // rows apart of one thread's copies
  static constexpr int kRowsA = kM / kRowStep;   // 4
  static constexpr int kRowsB = kN / kRowStep;
  static constexpr int kStep = kRowBytes / int(sizeof(T));  // channels per reduction step
  static constexpr int kVec = 16 / int(sizeof(T));          // elements per 16-byte chunk
  static constexpr int kStageA = kM * kRowBytes;
  static constexpr int kStageBytes = kStageA + kN * kRowBytes;
  static constexpr int kEpilogueStride = kN + 8;  // floats per staged row (no bank conflicts)
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + alignment
  static_assert(kStages >= 3, "two stages ahead of the one being read");
  static_assert(kM * kEpilogueStride * 4 <= kStages * kStageBytes, "epilogue tile fits the stages");
  static constexpr int kRegs = kN / 2;  // accumulators per thread
};

template <typename T>
__device__ __forceinline__ void mma_step(float (&d)[32], uint64_t a, uint64_t b, int acc) {
  if constexpr (std::is_same_v<T, __half>) {
    wgmma::mma_m64n64k16_f16(d, a, b, acc);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    wgmma::mma_m64n64k16_bf16(d, a, b, acc);
  } else {
    wgmma::mma_m64n64k8_tf32(d, a, b, acc);
  }
}
template <typename T>
__device__ __forceinline__ void mma_step(float (&d)[64], uint64_t a, uint64_t b, int acc) {
  if constexpr (std::is_same_v<T, __half>) {
    wgmma::mma_m64n128k16_f16(d, a, b, acc);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    wgmma::mma_m64n128k16_bf16(d, a, b, acc);
  } else {
    wgmma::mma_m64n128k8_tf32(d, a, b, acc);
  }
}

// 8 elements (16 bytes) as float32, and back.
template <typename T>
__device__ __forceinline__ void load8(const T* src, float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(src));
    const float4 b = __ldg(reinterpret_cast<const float4*>(src) + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(src));
    const T* e = reinterpret_cast<const T*>(&u);
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
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = static_cast<T>(v[i]);
    *reinterpret_cast<uint4*>(dst) = u;
  }
}

// Requires: c a multiple of Tile::kStep, k of 8, 16-byte aligned tensors,
// grid (ceil(k / kN), ceil(n*p*q / kM)), Tile::kSmemBytes of dynamic shared memory.
template <typename T, int kM, int kN, int kStages, int kBlocksPerSm>
__global__ void __launch_bounds__(2 * kM, kBlocksPerSm) fprop_kernel(const Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = Tile<T, kM, kN, kStages>;
  constexpr int kThreads = Cfg::kThreads, kRowStep = Cfg::kRowStep;
  constexpr int kRowsA = Cfg::kRowsA, kRowsB = Cfg::kRowsB;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  float* staged = reinterpret_cast<float*>(smem_raw + (base - raw));

  const int tid = threadIdx.x;
  const int n0 = blockIdx.x * kN;
  const int m0 = blockIdx.y * kM;
  const int positions = a.n * a.p * a.q;
  const int chunk = tid & 7;
  const int row0 = tid >> 3;
  const uint32_t swizzled = uint32_t(row0 * kRowBytes + ((chunk ^ (row0 & 7)) << 4));

  const T* x = static_cast<const T*>(a.x);
  const T* wt = static_cast<const T*>(a.weight);
  // The input rows this thread copies: the image's offset and the window's
  // top-left corner (far outside for rows past the end, so every tap misses).
  int img[kRowsA], ih0[kRowsA], iw0[kRowsA];
#pragma unroll
  for (int i = 0; i < kRowsA; ++i) {
    const int m = m0 + row0 + kRowStep * i;
    img[i] = 0, ih0[i] = -(1 << 29), iw0[i] = 0;
    if (m < positions) {
      const int pq = a.p * a.q;
      const int nn = m / pq;
      const int rem = m - nn * pq;
      const int oh = rem / a.q;
      const int ow = rem - oh * a.q;
      img[i] = nn * a.h * a.w * a.c + chunk * Cfg::kVec;
      ih0[i] = oh * a.stride_h - a.pad_h;
      iw0[i] = ow * a.stride_w - a.pad_w;
    }
  }
  const int taps_c = a.r * a.s * a.c;
  int wrow[kRowsB];
#pragma unroll
  for (int i = 0; i < kRowsB; ++i) {
    const int ko = n0 + row0 + kRowStep * i;
    wrow[i] = ko < a.k ? ko * taps_c + chunk * Cfg::kVec : -1;
  }

  // This slice's steps [first, last); the next one to copy, its tap (lr, ls) and first channel lc.
  const int all_steps = taps_c / Cfg::kStep;
  const int first = int(int64_t(all_steps) * blockIdx.z / a.split);
  const int last = int(int64_t(all_steps) * (blockIdx.z + 1) / a.split);
  const int steps = last - first;
  int next = first, lc = (first * Cfg::kStep) % a.c;
  const int tap = (first * Cfg::kStep) / a.c;
  int lr = tap / a.s, ls = tap - lr * a.s;
  auto copy_step = [&]() {
    const uint32_t st = base + uint32_t(((next - first) % kStages) * Cfg::kStageBytes);
#pragma unroll
    for (int i = 0; i < kRowsA; ++i) {
      const int ih = ih0[i] + lr * a.dilation_h;
      const int iw = iw0[i] + ls * a.dilation_w;
      const bool in = unsigned(ih) < unsigned(a.h) && unsigned(iw) < unsigned(a.w);
      const T* src = in ? x + img[i] + (ih * a.w + iw) * a.c + lc : x;
      copy_async_16(st + swizzled + uint32_t(i * kRowStep * kRowBytes), src, in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < kRowsB; ++i) {
      const bool in = wrow[i] >= 0;
      const T* src = in ? wt + wrow[i] + next * Cfg::kStep : wt;
      copy_async_16(st + uint32_t(Cfg::kStageA) + swizzled + uint32_t(i * kRowStep * kRowBytes), src,
                    in ? 16 : 0);
    }
    ++next;
    lc += Cfg::kStep;
    if (lc == a.c) {
      lc = 0;
      if (++ls == a.s) ls = 0, ++lr;
    }
  };

  // kStages - 2 steps copied ahead, one step's instructions in flight.
#pragma unroll
  for (int i = 0; i < kStages - 2; ++i) {
    if (next < last) copy_step();
    copy_async_commit();
  }

  float acc[Cfg::kRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kRegs; ++i) acc[i] = 0.f;
  const int group = tid / 128;
  for (int step = 0; step < steps; ++step) {
    copy_async_wait<kStages - 3>();
    wgmma::fence_proxy_async();
    __syncthreads();
    const uint32_t st = base + uint32_t((step % kStages) * Cfg::kStageBytes);
    const uint32_t at = st + uint32_t(group * 64 * kRowBytes);
    const uint32_t bt = st + uint32_t(Cfg::kStageA);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      mma_step<T>(acc, wgmma::smem_desc(at + 32 * kk), wgmma::smem_desc(bt + 32 * kk), step > 0 || kk > 0);
    }
    wgmma::commit();
    // The stage step - 2 read: every thread waited for its instructions
    // before the barrier above.
    if (next < last) copy_step();
    copy_async_commit();
    wgmma::wait<1>();
    wgmma::fence_operands(acc);
  }
  wgmma::wait<0>();
  wgmma::fence_operands(acc);
  copy_async_wait_all();
  __syncthreads();  // every stage read: the epilogue's tile takes their place

  {
    const int warp = (tid & 127) >> 5, lane = tid & 31;
    const int row = group * 64 + warp * 16 + (lane >> 2);
    const int col = 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      *reinterpret_cast<float2*>(staged + row * Cfg::kEpilogueStride + 8 * j + col) =
          make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(staged + (row + 8) * Cfg::kEpilogueStride + 8 * j + col) =
          make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
  __syncthreads();
  T* y = static_cast<T*>(a.y);
  const T* bias = static_cast<const T*>(a.bias);
  const T* residual = static_cast<const T*>(a.residual);
  constexpr int kChunks = kN / 8;
#pragma unroll 2
  for (int idx = tid; idx < kM * kChunks; idx += kThreads) {
    const int row = idx / kChunks, ch = idx % kChunks;
    const int m = m0 + row, ko = n0 + 8 * ch;
    if (m >= positions || ko >= a.k) continue;
    float v[8];
    const float4 lo = *reinterpret_cast<const float4*>(staged + row * Cfg::kEpilogueStride + 8 * ch);
    const float4 hi = *reinterpret_cast<const float4*>(staged + row * Cfg::kEpilogueStride + 8 * ch + 4);
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    const int off = m * a.k + ko;
    if (a.split > 1) {
      float* dst = a.partial + int64_t(blockIdx.z) * positions * a.k + off;
      reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
      continue;
    }
    if (bias != nullptr) {
      float b[8];
      load8(bias + ko, b);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += b[i];
    }
    if (residual != nullptr) {
      float r[8];
      load8(residual + off, r);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] += r[i];
    }
    if (a.activation != Activation::kIdentity) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = activate(a.activation, v[i]);
    }
    store8(y + off, v);
  }
#endif
}

}  // namespace customconv::implicit_gemm::wgmma_fprop
