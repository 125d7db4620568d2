// cuBLASLt's entry points, descriptors and kept algorithms (cublaslt.h).
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Exceptions.h>

#include <map>
#include <mutex>
#include <type_traits>

#include "ops/common/process_symbol.h"
#include "ops/conv2d/cublaslt.h"

namespace customconv {

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
           get(a.layout_set, "cublasLtMatrixLayoutSetAttribute") &&
           get(a.layout_destroy, "cublasLtMatrixLayoutDestroy") &&
           get(a.pref_create, "cublasLtMatmulPreferenceCreate") &&
           get(a.pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
           get(a.pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
           get(a.heuristic, "cublasLtMatmulAlgoGetHeuristic") && get(a.matmul, "cublasLtMatmul");
    return a;
  }();
  return api;
}

LtProduct::~LtProduct() {
  if (op != nullptr) api.desc_destroy(op);
  for (cublasLtMatrixLayout_t l : {a, b, c, d}) {
    if (l != nullptr) api.layout_destroy(l);
  }
}

namespace {

struct Chosen {
  bool found;
  cublasLtMatmulAlgo_t algo;
};

std::mutex& chosen_mutex() {
  static std::mutex m;
  return m;
}

std::map<LtProblemKey, Chosen>& chosen_algos() {
  static std::map<LtProblemKey, Chosen> m;
  return m;
}

}  // namespace

std::optional<cublasLtMatmulAlgo_t> lt_algorithm(const LtProblemKey& key, cublasLtHandle_t handle,
                                                 const LtProduct& p, uint32_t alignment) {
  {
    const std::lock_guard<std::mutex> lock(chosen_mutex());
    const auto it = chosen_algos().find(key);
    if (it != chosen_algos().end()) {
      if (!it->second.found) return std::nullopt;
      return it->second.algo;
    }
  }
  const LtApi& api = p.api;
  const uint64_t workspace_bytes = at::cuda::getCUDABlasLtWorkspaceSize();
  cublasLtMatmulPreference_t pref = nullptr;
  TORCH_CUDABLAS_CHECK(api.pref_create(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // Algorithms for operands aligned to `alignment` bytes (the heuristic would
  // otherwise assume 256), so that one serves every call of the problem.
  cublasStatus_t status = api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                       &workspace_bytes, sizeof(workspace_bytes));
  for (const auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS)
      status = api.pref_set(pref, attr, &alignment, sizeof(alignment));
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = api.heuristic(handle, p.op, p.a, p.b, p.c != nullptr ? p.c : p.d, p.d, pref, 1,
                           &result, &found);
  }
  api.pref_destroy(pref);
  const Chosen chosen{status == CUBLAS_STATUS_SUCCESS && found > 0, result.algo};
  {
    const std::lock_guard<std::mutex> lock(chosen_mutex());
    chosen_algos().emplace(key, chosen);
  }
  if (!chosen.found) return std::nullopt;
  return chosen.algo;
}

}  // namespace customconv
