// The float32 (TF32) dgrad kernels of the implicit-GEMM engine (implicit_gemm_kernels.cuh).
#include "ops/conv2d/implicit_gemm_kernels.cuh"

namespace customconv::implicit_gemm {

bool dgrad_f32(const ConvProblem& problem) { return dgrad<float>(problem); }

}  // namespace customconv::implicit_gemm
