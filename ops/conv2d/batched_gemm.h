// The GEMM that conv2d's im2col formulation runs on, one per device.
//
//   c[b] = a[b] · b[b]            (accumulate == false; c's old values are ignored)
//   c[b] = a[b] · b[b] + c[b]     (accumulate == true)
//
// for b in [0, B): a is (B, m, k), b is (B, k, n), c is (B, m, n). The operands
// are strided views: each matrix needs a unit stride along one of its two
// dimensions (c along n); the batch stride may be anything, 0 included (one
// weight shared by every image). Products accumulate in float32 for float16 and
// bfloat16 inputs, and c may be float32 while a and b are float16/bfloat16 (a
// float32 accumulator across calls). float32 GEMMs follow PyTorch's TF32 policy
// for convolutions (torch.backends.cudnn.allow_tf32), as F.conv2d does.
#pragma once

#include <ATen/core/Tensor.h>

namespace customconv {

using BatchedGemm = void (*)(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                             bool accumulate);

// How many GEMM output tiles (128 x 128) keep the device busy: conv2d splits
// the long reduction of the weight gradient until it has that many.
using GemmParallelism = int64_t (*)();

void batched_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                      bool accumulate);
inline int64_t gemm_parallelism_cpu() { return 1; }  // the CPU BLAS parallelises itself
#ifdef CUSTOMCONV_WITH_CUDA
void batched_gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                       bool accumulate);
int64_t gemm_parallelism_cuda();  // two tiles per SM of the current device
#endif

}  // namespace customconv
