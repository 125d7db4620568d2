// The bfloat16 instantiations of the implicit-GEMM forward (implicit_gemm_fprop.cuh).
#include "ops/conv2d/implicit_gemm_fprop.cuh"

namespace customconv::implicit_gemm {

bool fprop_bf16(const FpropProblem& problem) { return fprop<cutlass::bfloat16_t>(problem); }

}  // namespace customconv::implicit_gemm
