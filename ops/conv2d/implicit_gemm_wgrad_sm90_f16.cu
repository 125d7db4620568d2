// The float16 Hopper wgrad kernel of the implicit-GEMM engine (implicit_gemm_sm90.cuh), built for sm_90a.

#include "ops/conv2d/implicit_gemm_sm90.cuh"

namespace customconv::implicit_gemm {

bool wgrad_sm90_f16(const ConvProblem& problem) { return wgrad_sm90<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
