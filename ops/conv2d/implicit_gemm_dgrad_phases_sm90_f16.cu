// The float16 strided input gradient by stride phases on our Hopper forward kernel
// (implicit_gemm_wgmma.cuh), built for sm_90a.

#include "ops/conv2d/implicit_gemm_wgmma_launch.cuh"

namespace customconv::implicit_gemm {

bool dgrad_phases_sm90_f16(const ConvProblem& problem) {
  return dgrad_phases_wgmma<__half>(problem);
}

}  // namespace customconv::implicit_gemm
