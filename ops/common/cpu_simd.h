// 8- and 16-float vectors for the CPU's hot loops, compiled for AVX-512,
// AVX2 and the baseline side by side.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

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

// 16 floats as one value: one AVX-512 register in an x86-64-v4 build.
typedef float Float16 __attribute__((vector_size(64)));

// Lanes of a float vector type, and its unaligned load and store.
template <class V>
constexpr int kLanes = static_cast<int>(sizeof(V) / sizeof(float));
template <class V>
__attribute__((always_inline)) inline V loadv(const float* p) {
  V v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
__attribute__((always_inline)) inline void storev(float* p, V v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// NV vectors stored to p, or only their first `valid` lanes where fewer than
// NV * lanes remain (the last block of a channel count that fills no whole
// block).
template <class V, int NV>
__attribute__((always_inline)) inline void store_lanes(float* p, const V (&acc)[NV], int64_t valid) {
  constexpr int W = kLanes<V>;
  if (valid >= NV * W) {
    for (int v = 0; v < NV; ++v) storev(p + v * W, acc[v]);
  } else {
    float lanes[NV * W];
    for (int v = 0; v < NV; ++v) storev(lanes + v * W, acc[v]);
    __builtin_memcpy(p, lanes, valid * sizeof(float));
  }
}

// A W x W tile transposed in registers: rows[r][c] <-> rows[c][r]. At each
// level d (W/2, ..., 1) every 2d x 2d block swaps its top-right and
// bottom-left d x d blocks; all levels together transpose the tile.
template <class V, class Index, int D>
__attribute__((always_inline)) inline void transpose_level(V* rows) {
  constexpr int W = kLanes<V>;
  Index keep{}, swap{};  // a pair's new first and second rows
  for (int c = 0; c < W; ++c) {
    keep[c] = (c & D) == 0 ? c : W + c - D;
    swap[c] = (c & D) == 0 ? c + D : W + c;
  }
  for (int r = 0; r < W; ++r) {
    if ((r & D) != 0) continue;
    const V a = rows[r], b = rows[r + D];
    rows[r] = __builtin_shuffle(a, b, keep);
    rows[r + D] = __builtin_shuffle(a, b, swap);
  }
}
template <class V>
__attribute__((always_inline)) inline void transpose_tile(V* rows) {
  if constexpr (kLanes<V> == 16) {
    typedef int Int16 __attribute__((vector_size(64)));
    transpose_level<V, Int16, 8>(rows);
    transpose_level<V, Int16, 4>(rows);
    transpose_level<V, Int16, 2>(rows);
    transpose_level<V, Int16, 1>(rows);
  } else {
    typedef int Int8 __attribute__((vector_size(32)));
    transpose_level<V, Int8, 4>(rows);
    transpose_level<V, Int8, 2>(rows);
    transpose_level<V, Int8, 1>(rows);
  }
}

// Kernels with one build per instruction set (functions marked
// target("arch=x86-64-v4") and target("arch=x86-64-v3") next to a baseline
// one) pick theirs with cpu_isa(), once per process: the widest the CPU
// supports, or a narrower one named by the environment variable
// CUSTOMCONV_CPU_ISA ("x86-64-v3" or "baseline"; the tests run every build).
enum class CpuIsa { kBaseline, kX86_64_V3, kX86_64_V4 };
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CUSTOMCONV_CPU_ISA_BUILDS 1
#else
#define CUSTOMCONV_CPU_ISA_BUILDS 0
#endif
inline CpuIsa cpu_isa() {
#if CUSTOMCONV_CPU_ISA_BUILDS
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    const char* named = std::getenv("CUSTOMCONV_CPU_ISA");
    const std::string cap = named != nullptr ? named : "";
    if (cap.empty() || cap == "x86-64-v4") {
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
          __builtin_cpu_supports("avx512cd"))
        return CpuIsa::kX86_64_V4;
    }
    if (cap != "baseline") {
      if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
          __builtin_cpu_supports("bmi2"))
        return CpuIsa::kX86_64_V3;
    }
    return CpuIsa::kBaseline;
  }();
  return isa;
#else
  return CpuIsa::kBaseline;
#endif
}

}  // namespace customconv
