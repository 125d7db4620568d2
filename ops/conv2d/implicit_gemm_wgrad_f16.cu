// The float16 wgrad kernels of the implicit-GEMM engine (implicit_gemm_kernels.cuh).
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::implicit_gemm {

bool wgrad_f16(const ConvProblem& problem) { return wgrad<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
