// The float32 (TF32) Hopper forward, and the strided input gradient by stride phases on it, of the
// implicit-GEMM engine (implicit_gemm_wgmma.cuh), built for sm_90a.

#include "ops/conv2d/implicit_gemm_wgmma_launch.cuh"

namespace customconv::implicit_gemm {

bool fprop_sm90_f32(const ConvProblem& problem) { return fprop_wgmma<float>(problem); }
bool dgrad_phases_sm90_f32(const ConvProblem& problem) {
  return dgrad_phases_wgmma<float>(problem);
}

}  // namespace customconv::implicit_gemm
