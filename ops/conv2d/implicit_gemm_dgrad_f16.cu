// The float16 dgrad kernels of the implicit-GEMM engine (implicit_gemm_kernels.cuh).
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::implicit_gemm {

bool dgrad_f16(const ConvProblem& problem) { return dgrad<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
