// Hopper (sm_90a) candidates for the sweep, from the engine's Sm90Conv
// (ops/conv2d/implicit_gemm_sm90.cuh). The weight gradient's reduction over
// the images is split by running pr.split_k problems over equal runs of
// images, each writing its own float32 plane (CUTLASS 3 convolutions have no
// split-K).
#pragma once

#include "bench/tune/tile_sweep.h"
#include "ops/conv2d/implicit_gemm_sm90.cuh"

namespace customconv::tile_sweep {

using implicit_gemm::ConvOperator;
using implicit_gemm::ConvProblem;
using implicit_gemm::Sm90Conv;

template <int M, int N, int K>
bool hopper_fprop(const ConvProblem& pr) {
  if (pr.split_k != 1 || pr.groups != 1 || pr.bias != nullptr) return false;
  using E = cutlass::half_t;
  return Sm90Conv<ConvOperator::kFprop, E, E, M, N, K>::run(pr, pr.n, pr.input, pr.weight, pr.output);
}

template <int M, int N, int K>
bool hopper_wgrad(const ConvProblem& pr) {
  using E = cutlass::half_t;
  if (pr.split_k < 1 || pr.n % pr.split_k != 0) return false;
  const int n = pr.n / pr.split_k;
  const int64_t act = int64_t(n) * pr.h * pr.w * pr.c, grad = int64_t(n) * pr.p * pr.q * pr.k;
  const int64_t plane = int64_t(pr.k) * pr.r * pr.s * pr.c;
  for (int i = 0; i < pr.split_k; ++i) {
    if (!Sm90Conv<ConvOperator::kWgrad, E, float, M, N, K>::run(
            pr, n, static_cast<const E*>(pr.input) + i * act, static_cast<const E*>(pr.output) + i * grad,
            static_cast<float*>(pr.weight) + i * plane)) {
      return false;
    }
  }
  return true;
}

#define HOPPER_FPROP(M, N, K) \
  Candidate { "sm90 " #M "x" #N "x" #K, M, N, K, &hopper_fprop<M, N, K>, nullptr }
#define HOPPER_WGRAD(M, N, K) \
  Candidate { "sm90 " #M "x" #N "x" #K, M, N, K, &hopper_wgrad<M, N, K>, nullptr }

}  // namespace customconv::tile_sweep
