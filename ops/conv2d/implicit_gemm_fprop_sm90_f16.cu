// The float16 Hopper forward of the implicit-GEMM engine (CUTLASS 3, implicit_gemm_sm90.cuh), built for sm_90a.

#include "ops/conv2d/implicit_gemm_sm90.cuh"

namespace customconv::implicit_gemm {

bool fprop_sm90_f16(const ConvProblem& problem) { return fprop_sm90_16bit<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
