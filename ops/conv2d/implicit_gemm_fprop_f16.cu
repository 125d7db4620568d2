// The float16 fprop kernels of the implicit-GEMM engine (implicit_gemm_kernels.cuh).
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::implicit_gemm {

bool fprop_f16(const ConvProblem& problem) { return fprop<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
