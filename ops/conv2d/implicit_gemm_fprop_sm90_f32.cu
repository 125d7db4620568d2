// The float32 (TF32) Hopper forwards (implicit_gemm_wgmma.cuh, and for groups of 32 channels
// implicit_gemm_wgmma_halo.cuh), and the strided input gradient by stride phases, of the
// implicit-GEMM engine, built for sm_90a.

#include "ops/conv2d/implicit_gemm_wgmma_halo.cuh"
#include "ops/conv2d/implicit_gemm_wgmma_launch.cuh"

namespace customconv::implicit_gemm {

bool fprop_sm90_f32(const ConvProblem& problem) {
  // Groups of 32 channels: the kernel that loads a tile's input once for its 9 taps, where it takes them.
  if (problem.groups > 1 && fprop_halo_f32(problem)) return true;
  return fprop_wgmma<float>(problem);
}
bool dgrad_phases_sm90_f32(const ConvProblem& problem) {
  return dgrad_phases_wgmma<float>(problem);
}

}  // namespace customconv::implicit_gemm
