// cuBLASLt as conv2d's GEMMs call it (batched_gemm_cuda.cpp, the pointwise
// GEMMs; pointwise_fused_lt_cuda.cpp, the fused pointwise layers): its entry
// points in the process, a product's descriptors, and the algorithm its
// heuristic picked for each problem, kept. The heuristic costs the host tens
// of microseconds; with the algorithm kept, a call costs a few descriptors,
// a map lookup and one launch.
//
// The library does not link cuBLASLt: it calls the one libtorch_cuda loaded
// (process_symbol.h); where none is found, lt_api().ok is false and the
// callers take their other routes.
#pragma once

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <optional>

namespace customconv {

struct LtApi {
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool ok = false;
};

// cuBLASLt's entry points in the process (found once), or ok = false.
const LtApi& lt_api();

// A product's descriptors, destroyed with it; c null: C's layout is D's.
struct LtProduct {
  const LtApi& api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  explicit LtProduct(const LtApi& api_) : api(api_) {}
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;
  ~LtProduct();
};

// What decides a product's algorithm: the device, the types, the shapes,
// strides and operand alignments, the epilogue; each caller lays out its own.
using LtProblemKey = std::array<int64_t, 20>;

// The algorithm for the product `p` (its descriptors set) under `key`: kept
// from an earlier call, or cuBLASLt's heuristic's first pick for operands
// aligned to `alignment` bytes (kept either way); nullopt where the
// heuristic has none.
std::optional<cublasLtMatmulAlgo_t> lt_algorithm(const LtProblemKey& key, cublasLtHandle_t handle,
                                                 const LtProduct& p, uint32_t alignment);

}  // namespace customconv
