// A float32 GEMM in TF32 on Hopper's warpgroup MMA (CUTLASS 3, built for
// sm_90a): D (m x n) = A (m x k) * B (k x n), all three row-major with their
// own leading dimensions, one launch on the given stream, no workspace. The
// pointwise layers' input gradient in channels_last, grad_input's (N*H*W, C)
// rows = grad_output's (N*H*W, K) rows * the weight (K, C), is this product
// with B's rows contiguous (MN-major), which TF32 warpgroup MMA cannot read
// from shared memory: CUTLASS's collective loads that operand into registers
// instead. TF32 products take the operands' mantissas truncated to TF32's 10
// bits; sums are float32.
//
// batched_gemm_cuda.cpp runs it before cuBLAS where tf32_gemm_sm90_takes (at
// least 4096 rows, 128 columns and 64 reduction steps) on products above
// 2^26 multiply-adds (smaller ones take cuBLASLt first). H200, N=32,
// channels_last input gradients of ResNet-50's and MobileNetV2's 1x1 layers,
// device us, cuBLAS / this GEMM (cuDNN): 256 -> 128 at 56x56 62.4 / 47.4
// (48.8), 512 -> 128 at 28x28 31.8 / 21.9 (31.5), 256 -> 1024 at 14x14 26.7 /
// 16.2 (19.4), 1024 -> 256 at 14x14 23.8 / 18.4 (23.9), 256 -> 64 at 56x56
// 47.9 / 39.0 (48.2). Narrower outputs and the 7x7 planes stay with cuBLAS:
// 512 -> 2048 at 7x7 (1568 rows) 17.5 / 27.3, 64 -> 384 at 14x14 (64
// columns) 6.4 / 9.4, 96 -> 24 at 56x56 19.9 / 24.3.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace customconv {

bool tf32_gemm_sm90_takes(int64_t m, int64_t n, int64_t k);

// False, launching nothing, where the device is not sm_90, a pointer or a
// leading dimension is not a multiple of 16 bytes (TMA's unit), CUTLASS
// declines the problem or a size passes int.
bool tf32_gemm_sm90(const float* a, int64_t lda, const float* b, int64_t ldb, float* d, int64_t ldd,
                    int64_t m, int64_t n, int64_t k, int device, cudaStream_t stream);

}  // namespace customconv
