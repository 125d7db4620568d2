// Division of a non-negative int below 2^31 by a divisor fixed before a
// kernel launch, as one multiply-high, an add and a shift: the divisor's
// constants are set up on the host (FastDivide::of), so that a kernel's
// index arithmetic does not run the ~20 dependent instructions (and a
// reciprocal) that a division by a run-time value compiles to. The Hopper
// forward (implicit_gemm_wgmma.cuh) spent 1.1 us of every block's start,
// before its first load, in eleven such divisions and a 64-bit one
// (bench/NOTES.md). No CUDA needed on the host side.
//
// The method is Granlund and Montgomery's round-up multiplier: with l =
// ceil(log2 d) and m = floor(2^(32 + l) / d) + 1 - 2^32 (which fits 32
// bits), x / d = (umulhi(x, m) + x) >> l for every 0 <= x < 2^32; the add
// cannot overflow 32 bits for x < 2^31, since umulhi(x, m) < x.
#pragma once

#include <cstdint>

#include "ops/common/host_device.h"

namespace customconv {

struct FastDivide {
  int divisor = 1;
  uint32_t mul = 1;  // (d = 1: (umulhi(x, 1) + x) >> 0 = x)
  uint32_t shift = 0;

  // d >= 1; a smaller d (an empty extent's, where nothing is divided)
  // gives the division by 1 rather than a host fault.
  static FastDivide of(int d) {
    FastDivide f;
    if (d < 1) d = 1;
    f.divisor = d;
    uint32_t l = 0;
    while ((uint64_t(1) << l) < uint64_t(d)) ++l;
    f.shift = l;
    f.mul = uint32_t((uint64_t(1) << (32 + l)) / uint64_t(d) + 1 - (uint64_t(1) << 32));
    return f;
  }

  // x / divisor, for 0 <= x < 2^31.
  CUSTOMCONV_HOST_DEVICE int div(int x) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(uint32_t(x), mul);
#else
    const uint32_t hi = uint32_t((uint64_t(uint32_t(x)) * mul) >> 32);
#endif
    return int((hi + uint32_t(x)) >> shift);
  }
};

}  // namespace customconv
