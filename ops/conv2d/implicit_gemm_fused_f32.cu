// The float32 (TF32) fused forward kernels of the implicit-GEMM engine (implicit_gemm_fused_kernels.cuh).
#include "ops/conv2d/implicit_gemm_fused_kernels.cuh"

namespace customconv::implicit_gemm {

bool fprop_fused_f32(const ConvProblem& problem) { return fprop_fused<float>(problem); }

}  // namespace customconv::implicit_gemm
