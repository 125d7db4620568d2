// The float16 instantiations of the implicit-GEMM forward (implicit_gemm_fprop.cuh).
#include "ops/conv2d/implicit_gemm_fprop.cuh"

namespace customconv::implicit_gemm {

bool fprop_f16(const FpropProblem& problem) { return fprop<cutlass::half_t>(problem); }

}  // namespace customconv::implicit_gemm
