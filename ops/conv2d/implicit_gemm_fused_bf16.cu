// The bfloat16 fused forward kernels of the implicit-GEMM engine (implicit_gemm_fused_kernels.cuh).
#include "ops/conv2d/implicit_gemm_fused_kernels.cuh"

namespace customconv::implicit_gemm {

bool fprop_fused_bf16(const ConvProblem& problem) { return fprop_fused<cutlass::bfloat16_t>(problem); }

}  // namespace customconv::implicit_gemm
