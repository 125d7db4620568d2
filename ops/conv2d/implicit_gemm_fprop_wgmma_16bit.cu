// The float16 and bfloat16 Hopper forward of the implicit-GEMM engine on our
// own kernel (implicit_gemm_wgmma.cuh), and the strided input gradient by
// stride phases on it, built for sm_90a.

#include "ops/conv2d/implicit_gemm_wgmma_launch.cuh"

namespace customconv::implicit_gemm {

bool fprop_wgmma_f16(const ConvProblem& problem) { return fprop_wgmma<__half>(problem); }
bool fprop_wgmma_bf16(const ConvProblem& problem) { return fprop_wgmma<__nv_bfloat16>(problem); }
bool dgrad_phases_sm90_f16(const ConvProblem& problem) {
  return dgrad_phases_wgmma<__half>(problem);
}
bool dgrad_phases_sm90_bf16(const ConvProblem& problem) {
  return dgrad_phases_wgmma<__nv_bfloat16>(problem);
}

}  // namespace customconv::implicit_gemm
