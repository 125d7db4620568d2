// pointwise_fused_lt_cuda (pointwise_fused_lt.h): one cublasLtMatmul on the
// tensors in place, on the current stream, with PyTorch's cuBLASLt handle and
// workspace.
//
// cuBLASLt is column-major, the tensors row-major: a channels_last (N, K, H,
// W) result is the column-major (K, NHW) matrix D with ld K, so cuBLASLt
// computes D = op(A) · B with A the weight's memory read as the (C, K) matrix
// (ld = the weight's row stride) transposed, and B the input's memory as the
// (C, NHW) matrix (ld C). Its bias vector has one entry per row of D: the
// output channels'.
//
// Where the process has no cuBLASLt (cublaslt.h) the route declines.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "ops/common/launch.h"
#include "ops/conv2d/cublaslt.h"
#include "ops/conv2d/pointwise_fused_lt.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

}  // namespace

std::optional<at::Tensor> pointwise_fused_lt_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  const Conv2dShape<int64_t>& s,
                                                  const ConvEpilogue& epilogue) {
  const at::ScalarType dtype = input.scalar_type();
  if (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat) return std::nullopt;
  if (!s.in.batched || s.groups != 1 || !s.win.pointwise()) return std::nullopt;
  if (epilogue.activation != Activation::kIdentity && epilogue.activation != Activation::kRelu) {
    return std::nullopt;
  }
  const int64_t m = s.in.n * s.in.h * s.in.w, c = s.in.c, k = s.k;
  if (m == 0 || c == 0 || k == 0) return std::nullopt;
  if (!input.is_contiguous(kChannelsLast) || conv2d_output_format(input, weight) != kChannelsLast) {
    return std::nullopt;
  }
  const bool has_residual = epilogue.has_residual();
  if (has_residual && !epilogue.residual.is_contiguous(kChannelsLast)) return std::nullopt;
  // (Every layout of a 1x1 weight has a unit channel stride, unless it is a
  // strided view.)
  if (weight.stride(1) != 1 && c != 1) return std::nullopt;
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const int64_t bytes = int64_t(input.element_size()), ldw = weight.stride(0);
  if ((c * bytes) % 16 != 0 || (k * bytes) % 16 != 0 || (ldw * bytes) % 16 != 0 ||
      !aligned16(input) || !aligned16(weight) || (has_bias && !aligned16(b)) ||
      (has_residual && !aligned16(epilogue.residual))) {
    return std::nullopt;
  }
  const LtApi& api = lt_api();
  if (!api.ok) return std::nullopt;

  const c10::cuda::CUDAGuard guard(input.device());
  const cudaDataType_t type = dtype == at::kHalf      ? CUDA_R_16F
                              : dtype == at::kBFloat16 ? CUDA_R_16BF
                                                       : CUDA_R_32F;
  const cublasComputeType_t compute =
      dtype == at::kFloat && at::globalContext().allowTF32CuDNN(at::Float32Op::CONV)
          ? CUBLAS_COMPUTE_32F_FAST_TF32
          : CUBLAS_COMPUTE_32F;
  const bool relu = epilogue.activation == Activation::kRelu;
  const cublasLtEpilogue_t epi = has_bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                          : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);

  LtProduct p(api);
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  TORCH_CUDABLAS_CHECK(api.desc_create(&p.op, compute, CUDA_R_32F));
  TORCH_CUDABLAS_CHECK(api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  TORCH_CUDABLAS_CHECK(api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  TORCH_CUDABLAS_CHECK(api.desc_set(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (has_bias) {
    const void* bias_ptr = b.const_data_ptr();
    TORCH_CUDABLAS_CHECK(
        api.desc_set(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }
  TORCH_CUDABLAS_CHECK(api.layout_create(&p.a, type, uint64_t(c), uint64_t(k), ldw));
  TORCH_CUDABLAS_CHECK(api.layout_create(&p.b, type, uint64_t(c), uint64_t(m), c));
  TORCH_CUDABLAS_CHECK(api.layout_create(&p.d, type, uint64_t(k), uint64_t(m), k));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  const LtProblemKey key{
      int64_t(input.get_device()), int64_t(type), int64_t(compute), m, c, k, ldw, int64_t(epi),
      int64_t(has_residual)};
  // (Every operand is aligned to 16 bytes: checked above.)
  const std::optional<cublasLtMatmulAlgo_t> algo = lt_algorithm(key, handle, p, 16);
  if (!algo) return std::nullopt;

  at::Tensor out = empty_channels_last(input, s.in.n, k, s.oh, s.ow);
  const float alpha = 1.0f, beta = has_residual ? 1.0f : 0.0f;
  const void* c_ptr = has_residual ? epilogue.residual.const_data_ptr() : out.const_data_ptr();
  const cublasStatus_t status = api.matmul(
      handle, p.op, &alpha, weight.const_data_ptr(), p.a, input.const_data_ptr(), p.b, &beta, c_ptr,
      p.d, out.mutable_data_ptr(), p.d, &*algo, at::cuda::getCUDABlasLtWorkspace(),
      at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream());
  // A configuration cuBLASLt turns down before launching anything goes to the
  // other routes; any other failure is an error.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return std::nullopt;
  TORCH_CUDABLAS_CHECK(status);
  return out;
}

}  // namespace customconv
