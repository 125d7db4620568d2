// The split-K forward's last step, shared by the forward kernels that split
// their reduction into float32 partial outputs (implicit_gemm_kernels.cuh,
// implicit_gemm_wgmma.cuh): no CUTLASS here.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/common/activation.h"
#include "ops/conv2d/implicit_gemm.h"

namespace customconv::implicit_gemm {

// The split-K forward's last step:
//   out[i] = round(activation(sum over s of part[s][i] + bias[i % K] + residual[i])),
// the slices added in order, every term in float32, rounded once (bias and
// residual optional: null; the activation uniform over the grid). Each thread
// computes 4 consecutive outputs of one position (K is a multiple of 4), a
// grid-stride loop over the (N*P*Q*K) / 4 groups.
template <typename Element>
__global__ void sum_slices(const float4* __restrict__ part, const Element* __restrict__ bias,
                           const Element* __restrict__ residual, Element* __restrict__ out,
                           int64_t groups, int64_t k4, int slices, Activation activation) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < groups;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 acc = part[i];
    for (int s = 1; s < slices; ++s) {
      const float4 v = part[s * groups + i];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    Element* o = out + 4 * i;
    const int64_t k = 4 * (i % k4);
    float y[4] = {acc.x, acc.y, acc.z, acc.w};
    if (bias) {
      for (int j = 0; j < 4; ++j) y[j] += float(bias[k + j]);
    }
    if (residual) {
      for (int j = 0; j < 4; ++j) y[j] += float(residual[4 * i + j]);
    }
    if (activation != Activation::kIdentity) {
      for (int j = 0; j < 4; ++j) y[j] = activate<float>(activation, y[j]);
    }
    o[0] = Element(y[0]), o[1] = Element(y[1]), o[2] = Element(y[2]), o[3] = Element(y[3]);
  }
}

// pr.split_k float32 partial outputs in pr.workspace ((split_k, N, P, Q, K))
// summed into pr.output, with pr's bias, residual and activation.
template <typename Element>
void launch_sum_slices(const ConvProblem& pr) {
  const int64_t groups = int64_t(pr.n) * pr.p * pr.q * pr.k / 4;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((groups + threads - 1) / threads, 65535);
  sum_slices<Element><<<blocks, threads, 0, static_cast<cudaStream_t>(pr.stream)>>>(
      static_cast<const float4*>(pr.workspace), static_cast<const Element*>(pr.bias),
      static_cast<const Element*>(pr.residual), static_cast<Element*>(pr.output), groups, pr.k / 4,
      pr.split_k, pr.activation);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace customconv::implicit_gemm
