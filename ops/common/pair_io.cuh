// Device helpers for kernels whose threads hold results as pairs of
// neighbouring channels of one output position (mma.sync's and wgmma's
// accumulator layouts): one 32-bit (16-bit types) or 64-bit (float) load or
// store per pair, and conv2d_fused's epilogue on a pair. T: float or a 16-bit
// type with float conversions (c10::Half, c10::BFloat16, __half,
// __nv_bfloat16).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/common/activation.h"

namespace customconv {

// Two results, converted and stored as one word.
template <typename T>
__device__ __forceinline__ void store_pair(T* dst, float lo, float hi) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(lo, hi);
  } else {
    const T pair[2] = {T(lo), T(hi)};
    uint32_t bits;
    memcpy(&bits, pair, sizeof(bits));
    *reinterpret_cast<uint32_t*>(dst) = bits;
  }
}

// The two values at src, as floats.
template <typename T>
__device__ __forceinline__ float2 load_pair(const T* src) {
  if constexpr (std::is_same_v<T, float>) {
    return __ldg(reinterpret_cast<const float2*>(src));
  } else {
    const uint32_t bits = __ldg(reinterpret_cast<const unsigned int*>(src));
    T pair[2];
    memcpy(pair, &bits, sizeof(bits));
    return make_float2(static_cast<float>(pair[0]), static_cast<float>(pair[1]));
  }
}

// conv2d_fused's epilogue on one output position's pair: the residual (same
// layout as the output; null for none) added, then the activation, in float32.
template <typename T>
__device__ __forceinline__ void store_epilogue(T* dst, const T* residual, Activation act, float lo, float hi) {
  if (residual != nullptr) {
    const float2 r = load_pair(residual);
    lo += r.x, hi += r.y;
  }
  store_pair(dst, activate(act, lo), activate(act, hi));
}

}  // namespace customconv
