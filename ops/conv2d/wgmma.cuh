// Hopper's warpgroup matrix multiply (wgmma, sm_90a) as thin PTX wrappers:
// the shared-memory matrix descriptor, the fences and group waits, and the
// instructions the convolution kernels use. Included by translation units
// compiled for sm_90a only (the instructions do not exist elsewhere).
//
// All operands here are K-major tiles in shared memory with the 128-byte
// swizzle: rows of 128 bytes (64 16-bit or 32 float32 elements of the
// reduction), the 16-byte chunk j of row i stored at chunk j ^ (i % 8), the
// tile 1024-byte aligned, groups of 8 rows 1024 bytes apart. A warpgroup (four
// consecutive warps) issues each instruction together; its accumulators
// (64 x N, float32) are spread as mma.sync's: warp w holds rows 16w to
// 16w + 15, lane l rows l / 4 and l / 4 + 8, columns 8j + 2(l % 4) and + 1 in
// registers 4j, 4j + 1 (first row) and 4j + 2, 4j + 3 (second row).
#pragma once

#include <cstdint>

namespace customconv::wgmma {

// The descriptor of a K-major, 128-byte-swizzled tile as two words: the low
// one (start address / 16, leading-dimension offset 1, unused when swizzled)
// moves with the tile's shared address, by 2 per 32-byte step of a row, while
// the address stays below 256 KiB; the high one is fixed (stride between
// 8-row groups 1024 bytes, 128-byte swizzle). A main loop keeps the low word
// and adds its offsets to it.
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr) {
  return ((addr & 0x3FFFF) >> 4) | (1u << 16);
}
__device__ __forceinline__ uint64_t desc_of(uint32_t lo) {
  return uint64_t(lo) | (uint64_t((1024 >> 4) | (1u << 30)) << 32);
}

// Before a batch of instructions: the accumulator registers are settled.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the instructions issued so far into one group.
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most kPending groups are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses of the accumulators across the
// fences and waits above (the instructions write them asynchronously).
template <int kRegs>
__device__ __forceinline__ void fence_operands(float (&d)[kRegs]) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory barriers (mbarrier) for a producer/consumer pipeline: a
// barrier completes a phase when its count of arrivals is reached; waiters
// ask for the phase of a given parity (a fresh barrier is in phase 0, and a
// wait for parity 1 returns at once).
// Lowers (release) or raises (claim) the registers a thread of the executing
// warpgroup holds, so that a producer warpgroup's spare registers serve the
// consumers (setmaxnreg; every thread of the warpgroup executes it).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void barrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival once all of this thread's cp.async copies issued so far have
// landed (not counted ahead: the barrier's count includes it).
__device__ __forceinline__ void barrier_arrive_on_copies(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// The instructions: D (64 x 128, float32) += A (64 x K) * B (K x 128), A and
// B described by desc_of; `accumulate` 0 overwrites D. One macro writes the
// operand list once for the three element types.
#define CUSTOMCONV_WGMMA_M64N128(NAME, SHAPE_TYPES, TAIL)                                     \
  __device__ __forceinline__ void NAME(float (&d)[64], uint64_t a, uint64_t b, int accumulate) { \
    asm volatile(                                                                              \
        "{\n.reg .pred p;\n"                                                                   \
        "setp.ne.b32 p, %66, 0;\n"                                                             \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES " {"                                       \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "              \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "    \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "    \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"      \
        "}, %64, %65, p, " TAIL ";\n}\n"                                                   \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])\
        : "l"(a), "l"(b), "r"(accumulate));                                                  \
  }

// float16 and bfloat16: k16 per instruction, both operands K-major (no transposes).
CUSTOMCONV_WGMMA_M64N128(mma_m64n128k16_f16, "m64n128k16.f32.f16.f16", "1, 1, 0, 0")
CUSTOMCONV_WGMMA_M64N128(mma_m64n128k16_bf16, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0")
// float32 read as TF32: k8 per instruction (K-major only).
CUSTOMCONV_WGMMA_M64N128(mma_m64n128k8_tf32, "m64n128k8.f32.tf32.tf32", "1, 1")
#undef CUSTOMCONV_WGMMA_M64N128

// The same with B 64 columns wide: D (64 x 64, float32) in 32 registers.
#define CUSTOMCONV_WGMMA_M64N64(NAME, SHAPE_TYPES, TAIL)                                          \
  __device__ __forceinline__ void NAME(float(&d)[32], uint64_t a, uint64_t b, int accumulate) {   \
    asm volatile(                                                                                 \
        "{\n.reg .pred p;\n"                                                                      \
        "setp.ne.b32 p, %34, 0;\n"                                                                \
        "wgmma.mma_async.sync.aligned." SHAPE_TYPES                                               \
        " {"                                                                                      \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"          \
        "}, %32, %33, p, " TAIL ";\n}\n"                                                          \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),     \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),           \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),           \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])            \
        : "l"(a), "l"(b), "r"(accumulate));                                                       \
  }
CUSTOMCONV_WGMMA_M64N64(mma_m64n64k16_f16, "m64n64k16.f32.f16.f16", "1, 1, 0, 0")
CUSTOMCONV_WGMMA_M64N64(mma_m64n64k16_bf16, "m64n64k16.f32.bf16.bf16", "1, 1, 0, 0")
CUSTOMCONV_WGMMA_M64N64(mma_m64n64k8_tf32, "m64n64k8.f32.tf32.tf32", "1, 1")
#undef CUSTOMCONV_WGMMA_M64N64

// float32 (TF32) with B 32 columns wide: D (64 x 32, float32) in 16 registers
// (the grouped forward's tiles of one merged group of 32 channels).
__device__ __forceinline__ void mma_m64n32k8_tf32(float (&d)[16], uint64_t a, uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace customconv::wgmma
