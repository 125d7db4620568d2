// Warp-level tensor-core instructions (compute capability 8.0 and newer):
// mma.sync on one 16 x 8 tile and the ldmatrix loads that feed it from
// shared memory. The callers launch their kernels only on 8.0 and newer;
// older device code traps.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

namespace customconv {

// float32 bits rounded to TF32 (to nearest, ties away), as bits.
__device__ __forceinline__ uint32_t to_tf32(uint32_t bits) {
  uint32_t out;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(out) : "f"(__uint_as_float(bits)));
  return out;
}

// float32 bits rounded to TF32 for mma_16x8<float>: half of TF32's last
// unit added to the magnitude, the 13 bits below it left for the instruction
// to drop (to nearest, ties away, in one integer add). Infinities stay
// infinite; a NaN whose payload lies only in those 13 bits reads as one.
__device__ __forceinline__ uint32_t tf32_operand(float v) { return __float_as_uint(v) + 0x1000u; }

// D = A * B + D on one 16 x 8 tile in float32: A 16 x k (row-major
// fragments), B k x 8 (column-major), k = 16 for float16 and bfloat16, 8 for
// float32 as TF32. Lane l holds rows l / 4 and l / 4 + 8 of D, columns
// 2 * (l % 4) and + 1 (d[0], d[1] and d[2], d[3]).
template <typename T>
__device__ __forceinline__ void mma_16x8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, c10::Half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
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
  __trap();
#endif
}

// D = A * B + D on one 16 x 8 tile with a reduction of 8 (float16 or
// bfloat16 in, float32 sums): A's fragment is rows l / 4 and + 8 at columns
// 2 * (l % 4), + 1; B's is rows 2 * (l % 4), + 1 at column l / 4.
template <typename T>
__device__ __forceinline__ void mma_16x8x8(float (&d)[4], const uint32_t (&a)[2], uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, c10::Half>) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b));
  } else {
    static_assert(std::is_same_v<T, c10::BFloat16>, "float16 or bfloat16");
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b));
  }
#else
  (void)d, (void)a, (void)b;
  __trap();
#endif
}

// Two 8 x 8 matrices of 16-bit values from shared memory, as stored: lane l
// (l < 16) gives the address of row l % 8 of matrix l / 8 and receives, of
// each, the values at row l / 4, columns 2 * (l % 4) and + 1. For a 16 x 8
// matrix stored row-major (rows 0-7, then 8-15), mma_16x8x8's A fragment.
__device__ __forceinline__ void load_matrix_x2(uint32_t (&a)[2], unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(a[0]), "=r"(a[1]) : "r"(addr));
#else
  (void)a, (void)addr;
  __trap();
#endif
}

// One, two or four (N) 8 x 8 matrices of 16-bit values from shared memory,
// as stored (load_matrix_x2's layout, lanes 8 j to 8 j + 7 giving the rows
// of matrix j): for matrices whose rows are mma_16x8x8's B columns (the
// reduction along each row), one B fragment each.
template <int N>
__device__ __forceinline__ void load_matrices(uint32_t (&m)[N], unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(N == 1 || N == 2 || N == 4, "1, 2 or 4 matrices");
  if constexpr (N == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(m[0]) : "r"(addr));
  } else if constexpr (N == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(m[0]), "=r"(m[1]) : "r"(addr));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(m[0]), "=r"(m[1]), "=r"(m[2]), "=r"(m[3])
                 : "r"(addr));
  }
#else
  (void)m, (void)addr;
  __trap();
#endif
}

// One 8 x 8 matrix of 16-bit values, transposed (lanes 0-7 give the rows'
// addresses): for an 8 x 8 matrix stored k-major, mma_16x8x8's B fragment.
__device__ __forceinline__ uint32_t load_matrix_x1_trans(unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t b;
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(b) : "r"(addr));
  return b;
#else
  (void)addr;
  __trap();
  return 0;
#endif
}

// Four (x4) or two (x2) 8 x 8 matrices of 16-bit values from shared memory,
// transposed: lane l gives the address of row l % 8 of matrix l / 8 (eight
// contiguous values), and receives, of each matrix, the values at rows
// 2 * (l % 4), + 1 of column l / 4. For a matrix stored k-major (rows along
// the reduction), that is mma_16x8's A fragment (x4: rows 0-7 and 8-15 at
// k 0-7, then at k 8-15) or its B fragment (x2: k 0-7, then 8-15).
__device__ __forceinline__ void load_matrix_x4_trans(uint32_t (&a)[4], unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
#else
  (void)a, (void)addr;
  __trap();
#endif
}

__device__ __forceinline__ void load_matrix_x2_trans(uint32_t (&b)[2], unsigned addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(addr));
#else
  (void)b, (void)addr;
  __trap();
#endif
}

}  // namespace customconv
