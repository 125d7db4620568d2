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
// The library does not link cuBLAS: it calls the cuBLASLt that libtorch_cuda
// loaded (process_symbol.h); where none is found the route declines.
#include "ops/conv2d/pointwise_fused_lt.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>

#include "ops/common/launch.h"
#include "ops/common/process_symbol.h"

namespace customconv {
namespace {

constexpr auto kChannelsLast = at::MemoryFormat::ChannelsLast;

// cuBLASLt's entry points in the process, or ok = false.
struct LtApi {
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool ok = false;
};

const LtApi& lt_api() {
  static const LtApi api = [] {
    LtApi a;
    const auto get = [](auto& fn, const char* name) {
      constexpr const char* kSoname = "libcublasLt.so." CUSTOMCONV_SYMBOL_STR(CUBLAS_VER_MAJOR);
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(process_symbol(name, kSoname));
      return fn != nullptr;
    };
    a.ok = get(a.desc_create, "cublasLtMatmulDescCreate") &&
           get(a.desc_set, "cublasLtMatmulDescSetAttribute") &&
           get(a.desc_destroy, "cublasLtMatmulDescDestroy") &&
           get(a.layout_create, "cublasLtMatrixLayoutCreate") &&
           get(a.layout_destroy, "cublasLtMatrixLayoutDestroy") &&
           get(a.pref_create, "cublasLtMatmulPreferenceCreate") &&
           get(a.pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
           get(a.pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
           get(a.heuristic, "cublasLtMatmulAlgoGetHeuristic") && get(a.matmul, "cublasLtMatmul");
    return a;
  }();
  return api;
}

// A product's descriptors, destroyed with it.
struct LtProduct {
  const LtApi& api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  explicit LtProduct(const LtApi& api_) : api(api_) {}
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;
  ~LtProduct() {
    if (op != nullptr) api.desc_destroy(op);
    for (cublasLtMatrixLayout_t l : {a, b, d}) {
      if (l != nullptr) api.layout_destroy(l);
    }
  }
};

// The algorithm cuBLASLt's heuristic gave each problem (device, types,
// sizes, the weight's row stride, epilogue, residual), or none where it gave
// none; the heuristic costs the host tens of microseconds, a lookup less than
// one.
using ProblemKey = std::array<int64_t, 9>;
struct Chosen {
  bool found;
  cublasLtMatmulAlgo_t algo;
};
std::mutex& chosen_mutex() {
  static std::mutex m;
  return m;
}
std::map<ProblemKey, Chosen>& chosen_algos() {
  static std::map<ProblemKey, Chosen> m;
  return m;
}

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
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  const uint64_t workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  const ProblemKey key{int64_t(input.get_device()), int64_t(type), int64_t(compute), m, c, k, ldw,
                       int64_t(epi), int64_t(has_residual)};
  Chosen chosen{false, {}};
  bool known = false;
  {
    const std::lock_guard<std::mutex> lock(chosen_mutex());
    const auto it = chosen_algos().find(key);
    if (it != chosen_algos().end()) chosen = it->second, known = true;
  }
  if (!known) {
    cublasLtMatmulPreference_t pref = nullptr;
    TORCH_CUDABLAS_CHECK(api.pref_create(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // Algorithms for any operands aligned to 16 bytes (the heuristic would
    // otherwise assume 256), so that one serves every call of the problem.
    constexpr uint32_t kAlignment = 16;
    cublasStatus_t status = api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof(workspace_bytes));
    for (const auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (status == CUBLAS_STATUS_SUCCESS) status = api.pref_set(pref, attr, &kAlignment, sizeof(kAlignment));
    }
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = api.heuristic(handle, p.op, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
    }
    api.pref_destroy(pref);
    chosen = {status == CUBLAS_STATUS_SUCCESS && found > 0, result.algo};
    const std::lock_guard<std::mutex> lock(chosen_mutex());
    chosen_algos().emplace(key, chosen);
  }
  if (!chosen.found) return std::nullopt;

  at::Tensor out = empty_channels_last(input, s.in.n, k, s.oh, s.ow);
  const float alpha = 1.0f, beta = has_residual ? 1.0f : 0.0f;
  const void* c_ptr = has_residual ? epilogue.residual.const_data_ptr() : out.const_data_ptr();
  const cublasStatus_t status = api.matmul(handle, p.op, &alpha, weight.const_data_ptr(), p.a,
                                           input.const_data_ptr(), p.b, &beta, c_ptr, p.d,
                                           out.mutable_data_ptr(), p.d, &chosen.algo, workspace,
                                           workspace_bytes, at::cuda::getCurrentCUDAStream());
  // A configuration cuBLASLt turns down before launching anything goes to the
  // other routes; any other failure is an error.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return std::nullopt;
  TORCH_CUDABLAS_CHECK(status);
  return out;
}

}  // namespace customconv
