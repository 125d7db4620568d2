// 8-float vectors for the CPU's hot loops, compiled for AVX2 and for the
// baseline side by side.
#pragma once

#include <cstdint>

namespace customconv {

// A function marked CUSTOMCONV_CPU_CLONES is compiled twice on x86-64 (x86-64-v3: AVX2 and
// FMA; and the baseline), the loader picking one for the machine at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CUSTOMCONV_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CUSTOMCONV_CPU_CLONES
#endif

// The helpers below are always inlined into their callers, so the vector
// calling convention GCC notes a change of (-Wpsabi, which CMakeLists.txt
// turns off: a pragma does not silence that note) never crosses a call.

// 8 floats as one value (GCC/Clang vector extension: one AVX register, or
// two SSE registers in the baseline build), loaded and stored unaligned.
typedef float Float8 __attribute__((vector_size(32)));
__attribute__((always_inline)) inline Float8 load8(const float* p) {
  Float8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
__attribute__((always_inline)) inline void store8(float* p, Float8 v) {
  __builtin_memcpy(p, &v, sizeof v);
}

}  // namespace customconv
