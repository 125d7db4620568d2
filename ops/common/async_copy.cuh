// cp.async (compute capability 8.0 and newer): 16-byte copies from global to
// shared memory that need no registers and are all in flight at once. The
// callers compile these only for 8.0 and newer and fall back (or refuse) on
// older devices.
#pragma once

#include <cstdint>

namespace customconv {

// The shared-memory address (as cp.async and ldmatrix take it) of p.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
// 16 bytes from global src (16-byte aligned) to shared address dst.
__device__ __forceinline__ void copy_async_16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}

// The first `bytes` (0 or 16) of the 16 at src, zeros for the rest.
__device__ __forceinline__ void copy_async_16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

// The same through L1 (cp.async.ca), for data that other copies of the
// same block read again soon (overlapping windows).
__device__ __forceinline__ void copy_async_16_cached(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}

// Closes this thread's copies issued so far into one group.
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;"); }

// Waits until at most `kPending` of this thread's groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending));
}

// Waits for all of this thread's copies.
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}
#endif

}  // namespace customconv
