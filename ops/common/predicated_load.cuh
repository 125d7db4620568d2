// Loads of read-only global data under a predicate, as one predicated
// instruction: no branch around the load (the compiler turns
// `if (inside) v = __ldg(p);` into branches and convergence barriers, and
// where the predicate differs between a warp's lanes, into divergent paths
// run one after the other). The value is zero where the predicate is false,
// and then nothing is read.
#pragma once

#include <cstdint>

namespace customconv {

// The 8 bytes at p (8-byte aligned) where `pred`, else zeros.
__device__ __forceinline__ uint2 load_if(const void* p, bool pred) {
  uint2 v;
  asm("{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %3, 0;\n"
      "  mov.b32 %0, 0;\n"
      "  mov.b32 %1, 0;\n"
      "  @p ld.global.nc.v2.u32 {%0, %1}, [%2];\n"
      "}\n"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p), "r"(int(pred)));
  return v;
}

}  // namespace customconv
